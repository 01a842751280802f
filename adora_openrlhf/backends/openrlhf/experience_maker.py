"""Our advantage path inside OpenRLHF: :class:`AdoraExperienceMaker`, a subclass of ``RemoteExperienceMaker``.

OpenRLHF's ``compute_advantages_and_returns`` turns each sample's scalar reward into a group-baseline
reward (rloo / reinforce_baseline / dr_grpo / group_norm over ``n_samples_per_prompt`` responses), then adds
the per-token KL penalty (``compute_reward``), accumulates returns (gamma = 1) and uses them as the
token-level advantages. This subclass replaces only the group step with the package's core,
:func:`adora_openrlhf.algorithms.pipeline.compute_step_advantages`:

    rewards [G, n] (after OpenRLHF's length penalties), lengths, correct, truncated, pool statistics
      -> estimator (pool statistics when the adaptive sampler produced them) -> ADORA weights -> A [G, n]

and then hands ``A`` to the same OpenRLHF helpers (``compute_reward``, ``get_cumulative_returns``, and the
batch whitening OpenRLHF applies to ``reinforce_baseline``). With ADORA off and no pool statistics the
advantages are exactly OpenRLHF's own (tested).

The token estimators (``gae``: PPO with OpenRLHF's critic; ``reinforce``: REINFORCE++) have no group baseline; their
steps are OpenRLHF's own, in its order (``compute_reward``, then ``get_advantages_and_returns`` with the critic's
values or ``get_cumulative_returns``, then the batch whitening over every response token of the rollout), and
ADORA's weight of each response (``pipeline.response_weights``: its group's class, from rewards and lengths as for
the group estimators) lands where ALGORITHMS.md section 6 puts it (:meth:`AdoraExperienceMaker.token_step`):

- ``gae``: ``A_t <- w_i * A_t`` right after GAE and **before** the whitening. OpenRLHF's own method does both inside
  one call, so this class runs the same helpers itself with the weight in between; the whitening (one affine map of
  the whole batch) keeps the weights' relative effect. The critic's targets (``returns = A_t + V_t``, computed by
  GAE from the unweighted advantages) are never weighted;
- ``reinforce``: ``A_t <- w_i * A_t`` **after** the whitening (the weight multiplies the normalised advantage); the
  returns are the unweighted discounted returns.

With ADORA off every weight is 1 and the tensors are exactly OpenRLHF's (tested). The sampler's pool statistics,
when present, are only logged (the baseline is the critic or the batch). ``flash_reinforce`` is left entirely to
OpenRLHF.

Length penalties (DAPO overlong, stop-properly) are OpenRLHF's ``apply_length_penalties``. When the adaptive
sampler ran, the samples generator has already applied them to every pooled response before the pool
statistics were taken (marked by ``adora/length_penalized``), so they are not applied twice and the pool
baseline centres the penalised rewards. Without the sampler they are applied here, as OpenRLHF does.

Correctness signal: a response is correct for ADORA when its raw reward (the reward source's ``rewards``
before length penalties, ``adora/raw_reward``) exceeds ``adora.correct_threshold``; the sampler's positive
class reads the same raw reward against ``sampling.positive_threshold``. OpenRLHF's ``scores`` are not used
(a source without scores gets its rewards copied there, which would silently change their meaning).

Sample layout (as OpenRLHF's): ``rollout_samples`` hold the n responses of a prompt next to each other (with a
rollout allocator, each group has its own size, carried by every sample as ``adora/group_size``);
``split_rollout_samples`` records each sample's position in ``Experience.index``; micro-batches may be
re-ordered (dynamic batching), so grouping always goes through that index.

Per-sample ``Experience.info`` entries added (logged by OpenRLHF as sample means, prefix ``adora/``):
``adora/weight`` (the ADORA weight applied to the sample's group), ``adora/tas``, ``adora/tds`` (group
class indicators), ``adora/zero_signal`` (the group's advantages are all 0), and every step metric of the
core (zero-signal fraction, mean |A|, TAS/TDS fractions ...) repeated on each sample so that its mean is
the step value, and ``adora/engine_logprob_gap``: the mean over response tokens of
|log p_engine - log p_trainer|, the rollout log-probabilities vLLM returned (present with
``--algo.advantage.is_correction_level``) against the trainer's own for the same tokens, which is about 0 (bf16
rounding) when the engines hold the trainer's weights and grows when a weight sync is missed. The samples
generator puts the pool statistics (``adora/pool_count``, ``adora/pool_mean``,
``adora/pool_std``) and the sampler's step metrics (``sampling/...``) on the same dict.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from openrlhf.models.utils import compute_reward
from openrlhf.trainer.ppo_utils.experience import Experience
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.length_penalty import apply_length_penalties

from adora_openrlhf.algorithms.adora import TAS, TDS
from adora_openrlhf.algorithms.advantages import ADVANTAGE_ESTIMATORS, PoolStats
from adora_openrlhf.algorithms.pipeline import (
    GroupBatch,
    RaggedAdvantageOutput,
    compute_ragged_step_advantages,
    response_weights,
)
from adora_openrlhf.algorithms.token_advantages import TOKEN_ESTIMATORS
from adora_openrlhf.config import AdvantageConfig, RunConfig

logger = logging.getLogger(__name__)

POOL_COUNT, POOL_MEAN, POOL_STD = "adora/pool_count", "adora/pool_mean", "adora/pool_std"
RAW_REWARD = "adora/raw_reward"  # the reward source's reward before OpenRLHF's length penalties
ENGINE_LOGPROB_GAP = "adora/engine_logprob_gap"  # |log p_engine - log p_trainer| per response token, batch mean
LENGTH_PENALIZED = "adora/length_penalized"  # present: the samples generator already applied the length penalties
GROUP_SIZE = "adora/group_size"  # responses of the sample's group, when a rollout allocator gave groups their own sizes


@dataclass(frozen=True)
class FlatRollout:
    """Per-sample tensors of one rollout batch in prompt order (position = ``Experience.index``)."""

    rewards: torch.Tensor  # [N] float
    raw_rewards: torch.Tensor  # [N] float, before length penalties (the correctness signal)
    lengths: torch.Tensor  # [N] response tokens
    truncated: torch.Tensor  # [N] bool
    scores: torch.Tensor | None  # [N] float, None when any sample has no score
    pool: PoolStats | None  # per sample (every sample of a group carries its group's values), None if absent
    group_sizes: torch.Tensor | None  # [N] size of each sample's group (a rollout allocator's counts), None if absent
    order: torch.Tensor  # [N] long: position of each concatenated sample
    split_sizes: list[int]  # samples per experience, to split back


def _cat(experiences: Sequence[Experience], getter) -> torch.Tensor | None:
    values = [getter(e) for e in experiences]
    if any(v is None for v in values):
        return None
    return torch.cat([torch.as_tensor(v).reshape(-1) for v in values])


def flatten_rollout(experiences: Sequence[Experience]) -> FlatRollout:
    """Gather rewards, lengths, truncation, scores and pool statistics of every sample in prompt order."""
    sizes = [len(e.index) for e in experiences]
    order = torch.tensor(list(itertools.chain.from_iterable(e.index for e in experiences)), dtype=torch.long)
    if sorted(order.tolist()) != list(range(len(order))):
        raise ValueError(
            "Experience.index: the samples' positions must be a permutation of 0..N-1 (set by split_rollout_samples)"
        )

    def ordered(flat: torch.Tensor | None) -> torch.Tensor | None:
        if flat is None:
            return None
        out = torch.empty_like(flat)
        out[order] = flat
        return out

    rewards = ordered(_cat(experiences, lambda e: e.rewards))
    if rewards is None:
        raise ValueError("Experience.rewards: every sample needs a reward before advantages are computed")
    raw_rewards = ordered(_cat(experiences, lambda e: e.info.get(RAW_REWARD)))
    lengths = ordered(_cat(experiences, lambda e: e.response_length))
    truncated = ordered(_cat(experiences, lambda e: e.truncated))
    scores = ordered(_cat(experiences, lambda e: e.scores))
    pool_parts = [ordered(_cat(experiences, lambda e, k=k: e.info.get(k))) for k in (POOL_COUNT, POOL_MEAN, POOL_STD)]
    pool = None
    if all(p is not None for p in pool_parts):
        pool = PoolStats(count=pool_parts[0].long(), mean=pool_parts[1].float(), std=pool_parts[2].float())
    group_sizes = ordered(_cat(experiences, lambda e: e.info.get(GROUP_SIZE)))
    return FlatRollout(
        rewards=rewards,
        raw_rewards=raw_rewards.float() if raw_rewards is not None else rewards,
        lengths=lengths if lengths is not None else torch.zeros_like(rewards),
        truncated=truncated.bool() if truncated is not None else torch.zeros_like(rewards, dtype=torch.bool),
        scores=scores,
        pool=pool,
        group_sizes=group_sizes.long() if group_sizes is not None else None,
        order=order,
        split_sizes=sizes,
    )


def group_layout(flat: FlatRollout, n: int) -> list[int]:
    """The sizes of the rollout's groups in prompt order: n each, or each group's own size when the samples carry
    ``adora/group_size`` (a rollout allocator ran); every sample of a group must carry the same size."""
    total = flat.rewards.numel()
    if flat.group_sizes is None:
        if n < 1 or total % n:
            raise ValueError(f"rollout.n_samples_per_prompt: {total} samples do not form groups of {n}")
        return [n] * (total // n)
    sizes, start, per_sample = [], 0, flat.group_sizes.tolist()
    while start < total:
        size = per_sample[start]
        if size < 1 or start + size > total or any(x != size for x in per_sample[start : start + size]):
            raise ValueError(
                f"Experience.info[{GROUP_SIZE!r}]: the samples from position {start} on do not form a group of {size}"
            )
        sizes.append(size)
        start += size
    return sizes


def group_batch(flat: FlatRollout, cfg: RunConfig) -> GroupBatch:
    """The rollout's rewards, lengths, correctness (raw reward > ``adora.correct_threshold``) and truncation, flat [N]."""
    return GroupBatch(
        rewards=flat.rewards,
        lengths=flat.lengths.float(),
        correct=flat.raw_rewards > cfg.adora.correct_threshold,
        truncated=flat.truncated,
    )


def group_advantages(flat: FlatRollout, sizes: list[int], cfg: RunConfig, estimator: str) -> RaggedAdvantageOutput:
    """The core's advantages (flat [N], prompt order) for a flattened rollout whose groups have ``sizes``."""
    batch = group_batch(flat, cfg)
    pool = None
    if flat.pool is not None:
        first = torch.tensor([0, *sizes[:-1]], dtype=torch.long).cumsum(0)
        pool = PoolStats(count=flat.pool.count[first], mean=flat.pool.mean[first], std=flat.pool.std[first])
    advantage_cfg = AdvantageConfig(estimator=estimator, eps=cfg.advantage.eps)
    return compute_ragged_step_advantages(batch, sizes, advantage_cfg, cfg.adora, pool)


def per_sample_info(out: RaggedAdvantageOutput, sizes: list[int]) -> dict[str, torch.Tensor]:
    """Per-sample logging tensors [N] in prompt order: group weight, class indicators, step metrics."""
    return group_info(out.weights, out.group_class, out.zero_signal, out.metrics, sizes)


def group_info(
    weights: torch.Tensor,
    group_class: torch.Tensor,
    zero_signal: torch.Tensor,
    metrics: dict[str, float],
    sizes: list[int],
) -> dict[str, torch.Tensor]:
    """Per-sample logging tensors [N] in prompt order from per-group [G] weights, classes and zero-signal flags."""
    repeats = torch.tensor(sizes, dtype=torch.long)
    per_group = {
        "adora/weight": weights.float(),
        "adora/tas": (group_class == TAS).float(),
        "adora/tds": (group_class == TDS).float(),
        "adora/zero_signal": zero_signal.float(),
    }
    info = {key: value.repeat_interleave(repeats) for key, value in per_group.items()}
    for key, value in metrics.items():
        info.setdefault(key, torch.full((sum(sizes),), float(value)))
    return info


def group_reward_std(rewards: torch.Tensor, sizes: list[int]) -> torch.Tensor | None:
    """Each sample's group reward std (unbiased, OpenRLHF's ``group_reward_std``); None when every group has one sample."""
    if all(size == 1 for size in sizes):
        return None
    stds = [part.std() if part.numel() > 1 else part.new_zeros(()) for part in rewards.split(sizes)]
    return torch.stack(stds).repeat_interleave(torch.tensor(sizes, dtype=torch.long))


class AdoraExperienceMaker(RemoteExperienceMaker):
    """``RemoteExperienceMaker`` whose group-advantage step is the package's core (estimator + ADORA)."""

    def __init__(self, *args, run_config: RunConfig, **kwargs):
        super().__init__(*args, **kwargs)
        self.run_config = run_config

    def uses_core(self) -> bool:
        """Whether the configured OpenRLHF estimator is one of the core's group estimators (or the stand-in flag of a
        registered estimator OpenRLHF does not know, ``field_flags.STAND_IN_ESTIMATOR``: the run config names it)."""
        return self.args.algo.advantage.estimator in ADVANTAGE_ESTIMATORS

    def uses_token_estimator(self) -> bool:
        """Whether the configured OpenRLHF estimator is a token estimator with ADORA's weights (``gae``, ``reinforce``)."""
        return self.args.algo.advantage.estimator in TOKEN_ESTIMATORS

    @torch.no_grad()
    def compute_advantages_and_returns(self, experiences: list[Experience]) -> list[Experience]:
        if self.uses_token_estimator():
            self.prepare_rewards(experiences)
            self.token_step(experiences)
        elif self.uses_core():
            self.prepare_rewards(experiences)
            self.group_step(experiences)
        else:
            return super().compute_advantages_and_returns(experiences)
        gap = engine_logprob_gap(experiences)
        if gap is not None:
            for experience in experiences:
                experience.info[ENGINE_LOGPROB_GAP] = torch.full((len(experience.index),), gap)
        return experiences

    def prepare_rewards(self, experiences: list[Experience]) -> None:
        """Rewards in float32 or wider, the raw reward kept (``adora/raw_reward``), OpenRLHF's length penalties applied
        unless the samples generator already did (``adora/length_penalized``)."""
        for experience in experiences:
            experience.rewards = experience.rewards.to(torch.promote_types(experience.rewards.dtype, torch.float32))
            experience.info.setdefault(RAW_REWARD, experience.rewards.clone())
        penalized = [LENGTH_PENALIZED in e.info for e in experiences]
        if any(penalized) and not all(penalized):
            raise ValueError(
                f"Experience.info[{LENGTH_PENALIZED!r}]: only some samples of the rollout carry the generator's length penalties"
            )
        if not any(penalized):
            apply_length_penalties(experiences, self.args)  # DAPO overlong / stop-properly penalties, as OpenRLHF

    def group_step(self, experiences: list[Experience]) -> None:
        """The core's group estimator and ADORA's weights, then OpenRLHF's token rewards, returns and (for
        ``reinforce_baseline``) batch whitening."""
        args = self.args
        flat = flatten_rollout(experiences)
        sizes = group_layout(flat, args.rollout.n_samples_per_prompt)
        # ours, also behind a stand-in flag
        out = group_advantages(flat, sizes, self.run_config, self.run_config.advantage.estimator)

        # back to the concatenation order of the micro-batches
        scalar = out.advantages[flat.order].split(flat.split_sizes)
        group_std = group_reward_std(flat.rewards, sizes)
        info = per_sample_info(out, sizes)
        if group_std is not None:
            info["group_reward_std"] = group_std
        info_split = {key: value[flat.order].split(flat.split_sizes) for key, value in info.items()}

        if args.algo.advantage.gamma != 1.0:  # group estimators use undiscounted returns, as in OpenRLHF
            logger.warning(  # once: the namespace keeps 1.0 from here on
                "algo.advantage.gamma=%s is set to 1.0: the group estimator %r uses undiscounted returns (as OpenRLHF does)",
                args.algo.advantage.gamma,
                args.algo.advantage.estimator,
            )
            args.algo.advantage.gamma = 1.0
        for i, (experience, advantage) in enumerate(zip(experiences, scalar, strict=True)):
            for key, parts in info_split.items():
                experience.info[key] = parts[i]
            token_reward = compute_reward(
                advantage,
                self.kl_ctl.value,
                experience.kl,
                action_mask=experience.action_mask,
                reward_clip_range=args.reward.clip_range,
            )
            experience.returns = self.get_cumulative_returns(
                token_reward, experience.action_mask, args.algo.advantage.gamma
            )
            experience.advantages = experience.returns.clone()
            experience.info["return"] = token_reward.sum(dim=-1)
            experience.kl = None

        if args.algo.advantage.estimator == "reinforce_baseline":
            whiten_advantages(experiences, std_norm=not args.algo.advantage.no_std_norm)

    def token_step(self, experiences: list[Experience]) -> None:
        """``gae`` / ``reinforce`` with ADORA's weight of each response (module docstring): OpenRLHF's own steps
        (``compute_reward``, GAE on the critic's values or the discounted returns, batch whitening), the weight
        applied after GAE and before the whitening (``gae``) or after the whitening (``reinforce``); the returns
        (the critic's targets) unweighted."""
        args, adv = self.args, self.args.algo.advantage
        flat = flatten_rollout(experiences)
        sizes = group_layout(flat, args.rollout.n_samples_per_prompt)
        weights, result, metrics = response_weights(group_batch(flat, self.run_config), sizes, self.run_config.adora)
        uniform = torch.stack([part.max() == part.min() for part in flat.rewards.split(sizes)])
        info = group_info(result.weights, result.group_class, uniform, metrics, sizes)
        group_std = group_reward_std(flat.rewards, sizes)
        if group_std is not None:
            info["group_reward_std"] = group_std
        info_split = {key: value[flat.order].split(flat.split_sizes) for key, value in info.items()}
        weight_split = weights[flat.order].split(flat.split_sizes)  # each sample's weight, micro-batch by micro-batch

        gae = adv.estimator == "gae"
        for i, (experience, weight) in enumerate(zip(experiences, weight_split, strict=True)):
            for key, parts in info_split.items():
                experience.info[key] = parts[i]
            token_reward = compute_reward(
                experience.rewards,
                self.kl_ctl.value,
                experience.kl,
                action_mask=experience.action_mask,
                reward_clip_range=args.reward.clip_range,
            )
            if gae:
                if experience.values is None:
                    raise ValueError(
                        "Experience.values: advantage.estimator gae needs the critic's values (OpenRLHF creates its "
                        "critic group for --algo.advantage.estimator gae)"
                    )
                advantages, experience.returns = self.get_advantages_and_returns(
                    experience.values, token_reward, experience.action_mask, adv.gamma, adv.lambd
                )
                experience.advantages = advantages * weight.to(advantages.dtype).unsqueeze(-1)  # before whitening
            else:
                experience.returns = self.get_cumulative_returns(token_reward, experience.action_mask, adv.gamma)
                experience.advantages = experience.returns.clone()
            experience.info["return"] = token_reward.sum(dim=-1)
            experience.kl = None

        whiten_advantages(experiences, std_norm=not adv.no_std_norm)  # OpenRLHF's, over the whole rollout
        if not gae:  # reinforce: the weight multiplies the normalised advantage
            for experience, weight in zip(experiences, weight_split, strict=True):
                experience.advantages = experience.advantages * weight.to(experience.advantages.dtype).unsqueeze(-1)


def engine_logprob_gap(experiences: Sequence[Experience]) -> float | None:
    """Mean over every response token of the batch of |rollout log-prob (vLLM) - action log-prob (trainer)|, or None
    when the engines returned no log-probabilities."""
    total, count = 0.0, 0.0
    for e in experiences:
        if e.rollout_log_probs is None or e.action_log_probs is None:
            return None
        mask = e.action_mask.float()
        total += float(((e.rollout_log_probs.float() - e.action_log_probs.float()).abs() * mask).sum())
        count += float(mask.sum())
    return total / count if count else None


def whiten_advantages(experiences: Sequence[Experience], std_norm: bool = True) -> None:
    """OpenRLHF's batch normalisation of token advantages for ``reinforce_baseline``:
    A <- (A - mean) / sqrt(max(var, 1e-8)) with mean and (biased) var over every response token of the batch."""
    advantages = torch.cat([e.advantages.flatten() for e in experiences]).float()
    masks = torch.cat([e.action_mask.flatten() for e in experiences])
    count = masks.sum()
    mean = (advantages * masks).sum() / count
    rstd = (((advantages - mean).pow(2) * masks).sum() / count).clamp(min=1e-8).rsqrt() if std_norm else 1
    for e in experiences:
        e.advantages = (e.advantages - mean) * rstd
