"""One RL step of the local backend, top to bottom (:func:`rl_step`), and the pieces it is made of.

1. sample: the next ``prompts_per_step`` prompts of the seeded data order, or those a rollout allocator picks
   among its candidates with its own count each (``algorithms/allocation.py``), through :class:`AdaptiveSampler`
   (:func:`sample_at`), or through DAPO dynamic filtering (:func:`filtered_sample`);
2. advantages: :func:`compute_ragged_step_advantages` on the kept responses (:func:`group_batch`,
   :func:`step_advantages`): the estimator's group advantages (pool statistics when adaptive sampling is
   on), then ADORA's weights; for the token estimators ``gae`` and ``reinforce``, :func:`token_update`: per-token
   advantages with each response's ADORA weight, the critic's values and update (``gae``, ``critic.py``);
3. update: :func:`policy_update` on the kept responses, packed in micro-batches of similar lengths, with the
   step's learning rates (:func:`scheduled_lrs`);
4. metrics: the sampler's, the advantage pipeline's, the update's, :func:`rollout_metrics` and the step's timers.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from adora_openrlhf.algorithms.allocation import RolloutAllocator
from adora_openrlhf.algorithms.dynamic_filtering import filter_and_refill
from adora_openrlhf.algorithms.lr_schedules import lr_factor
from adora_openrlhf.algorithms.pipeline import GroupBatch, compute_ragged_step_advantages, response_weights
from adora_openrlhf.algorithms.policy_loss import PolicyLossConfig
from adora_openrlhf.algorithms.sampling import AdaptiveSampler, PromptGroup, SamplingResult
from adora_openrlhf.algorithms.token_advantages import CRITIC_ESTIMATORS, TokenParams, compute_token_advantages
from adora_openrlhf.backends.local.critic import Critic, critic_update, critic_values
from adora_openrlhf.backends.local.update import PackedBatch, pack, policy_update
from adora_openrlhf.config import ConfigError, RunConfig
from adora_openrlhf.engine.rollout import RolloutEngine
from adora_openrlhf.rows import batch_indices, row_key
from adora_openrlhf.tasks.behaviours import style_fractions

logger = logging.getLogger(__name__)


@dataclass
class StepModels:
    """What an RL step updates and reads: the policy, its optimiser, the KL reference (or None), the tokenizer
    (its pad id) and the training rows' extra model inputs (vision rows; None for text)."""

    model: Any
    optimizer: torch.optim.Optimizer
    ref_model: Any
    tokenizer: Any
    train_extras: Any
    weight_bound: float = math.inf  # the largest |weight| an update may leave (:func:`weight_bound`)
    critic: Critic | None = None  # advantage.estimator gae: the value model and its optimiser


WEIGHT_GROWTH = 100.0  # an update may leave weights up to this many times the largest at the start of RL ...
WEIGHT_FLOOR = 1e3  # ... and never less than this: RL moves weights by small steps, a blow-up by orders of magnitude


def largest_weight(model) -> float:
    """max |w| over the trained weights (NaN or inf when one is not finite); one device sync."""
    trained = [p.detach().abs().max() for p in model.parameters() if p.requires_grad and p.numel()]
    return float(torch.stack(trained).max()) if trained else 0.0


def weight_bound(model) -> float:
    """The bound the RL steps keep the trained weights within: max(WEIGHT_FLOOR, WEIGHT_GROWTH x their largest |w| now)."""
    return max(WEIGHT_FLOOR, WEIGHT_GROWTH * largest_weight(model))


class PolicyDiverged(FloatingPointError):
    """The policy's loss, gradient, weights or token probabilities stopped being finite at RL step ``step`` (1-based)."""

    def __init__(self, step: int, what: str, lr: float) -> None:
        super().__init__(f"the policy diverged at step {step} ({what}); lower train.lr (now {lr:g})")
        self.step = step


def check_finite_policy(model, update: dict[str, float], step: int, lr: float, bound: float = math.inf) -> None:
    """:class:`PolicyDiverged` when the update's loss or gradient norm is not finite, or a weight after it is not
    finite or larger in magnitude than ``bound`` (finite weights grown by orders of magnitude are a divergence too:
    they decode nothing a reward counts)."""
    for key, what in (("train/loss", "the policy loss"), ("train/grad_norm", "the gradient norm")):
        if not math.isfinite(update[key]):
            raise PolicyDiverged(step, f"{what} is {update[key]}", lr)
    problem = weights_problem(model, bound)
    if problem is not None:
        raise PolicyDiverged(step, f"{problem}, after the update", lr)


def weights_problem(model, bound: float = math.inf) -> str | None:
    """Why the trained weights are not fit to keep (not finite, or larger in magnitude than ``bound``), or None."""
    largest = largest_weight(model)
    if not math.isfinite(largest):
        return "weights are not finite"
    if largest > bound:
        return f"the largest weight is {largest:.3g}, above the bound {bound:.3g}"
    return None


@dataclass
class StepSampling:
    """How a step picks its prompts: the sampler (rounds, exit rules, pool statistics) and the rollout allocator
    (``algorithms/allocation.py``: which prompts of the data order, how many responses each; None = the next
    ``prompts_per_step`` prompts, ``n_keep`` each)."""

    sampler: AdaptiveSampler
    allocator: RolloutAllocator | None = None


def rl_step(
    cfg: RunConfig,
    step: int,
    position: int,
    sampling: StepSampling,
    engine: RolloutEngine,
    train_rows,
    models: StepModels,
) -> tuple[dict[str, float], int]:
    """RL step ``step`` (0-based) from data position ``position``: (its metrics, the next data position)."""
    step_start = time.perf_counter()
    engine.reset_timers()
    try:
        result, consumed = sample_step(cfg, step, position, sampling, engine, train_rows)
    except RuntimeError as err:  # torch.multinomial on nan / inf probabilities: the weights blew up
        if "probability tensor contains" not in str(err):
            raise
        raise PolicyDiverged(step + 1, "non-finite token probabilities while sampling", cfg.train.lr) from None
    sampling_seconds = time.perf_counter() - step_start
    metrics: dict[str, float] = {**result.metrics, **(sampling.allocator.pop_metrics() if sampling.allocator else {})}
    advantage_seconds = train_seconds = 0.0
    if result.groups:
        t0 = time.perf_counter()
        if cfg.advantage.token_level:  # gae / reinforce: per-token advantages, and the critic's update for gae
            update, advantage_seconds = token_update(cfg, step, result.groups, models)
        else:
            advantages, advantage_metrics = step_advantages(cfg, result)
            advantage_seconds = time.perf_counter() - t0
            update = {**advantage_metrics, **update_policy(cfg, step, result.groups, advantages, models)}
        train_seconds = time.perf_counter() - t0 - advantage_seconds
        metrics.update({**rollout_metrics(result.groups, train_rows), **update})
    metrics.update(
        {
            "time/generate_s": engine.generate_seconds,
            "time/score_s": engine.score_seconds,
            # responses not graded by the step's deadline (grading.deadline_s)
            "reward/grader_late": float(engine.grader.late),
            "time/train_s": train_seconds,
            "time/advantage_s": advantage_seconds,  # estimator + ADORA weights
            "time/sampler_overhead_s": sampling_seconds
            - engine.generate_seconds
            - engine.score_seconds,  # rounds, exit rules, down-sampling
            "time/step_s": time.perf_counter() - step_start,
        }
    )
    return metrics, position + consumed


def sample_step(cfg: RunConfig, step: int, position: int, sampling: StepSampling, engine: RolloutEngine, train_rows):
    """The step's sampler result and the number of prompts it consumed (dynamic filtering and allocation may
    examine more than they sample)."""
    if not cfg.dynamic_filtering.enabled:
        return sample_at(cfg, sampling, engine, train_rows, position, cfg.prompts_per_step, step)
    result, consumed = filtered_sample(cfg, sampling, engine, train_rows, position, step)
    if not result.groups:
        logger.info(
            "step %d: dynamic filtering kept no group of %d prompts (%d refills); no policy update this step",
            step + 1,
            consumed,
            cfg.dynamic_filtering.max_refills,
        )
    return result, consumed


def step_advantages(cfg: RunConfig, result: SamplingResult) -> tuple[torch.Tensor, dict[str, float]]:
    """The advantage of every kept response (flat, in the groups' order) and the advantage pipeline's metrics:
    :func:`compute_ragged_step_advantages` (an allocator's groups may differ in size)."""
    sizes = [len(g.kept) for g in result.groups]
    out = compute_ragged_step_advantages(group_batch(result.groups), sizes, cfg.advantage, cfg.adora, result.pool_stats)
    return out.advantages, out.metrics


def update_policy(
    cfg: RunConfig, step: int, groups: list[PromptGroup], advantages: torch.Tensor, models: StepModels
) -> dict[str, float]:
    """The PPO-clip update on the kept responses of ``groups`` with their ``advantages`` (one per kept response, in
    the groups' order); the update's metrics."""
    packed, order = pack_kept(groups, models)
    return _policy_step(cfg, step, packed, advantages.reshape(-1)[order], models)


def pack_kept(groups: list[PromptGroup], models: StepModels) -> tuple[PackedBatch, list[int]]:
    """The kept responses of ``groups`` packed for the update, and ``order``: packed row k is kept response
    ``order[k]`` (in the groups' order). Micro-batches hold responses of similar lengths (less padding; the step's
    gradient is a sum over sequences)."""
    samples = [r.payload for g in groups for r in g.kept]
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].prompt_ids) + len(samples[i].response_ids))
    samples = [samples[i] for i in order]
    extras = models.train_extras
    packed = pack(
        [s.prompt_ids for s in samples],
        [s.response_ids for s in samples],
        models.tokenizer.pad_token_id,
        [extras[s.row_index] for s in samples] if extras is not None else None,
    )
    return packed, order


def _policy_step(
    cfg: RunConfig, step: int, packed: PackedBatch, advantages: torch.Tensor, models: StepModels
) -> dict[str, float]:
    """:func:`policy_update` with the step's learning rates, then the finiteness check."""
    update = policy_update(
        models.model,
        models.optimizer,
        packed,
        advantages,
        cfg.train,
        cfg.rollout.max_new_tokens,
        ref_model=models.ref_model,
        use_lora_reference=cfg.train.kl_coef > 0 and cfg.model.lora_rank > 0,
        lrs=scheduled_lrs(cfg.train, step, cfg.steps),
    )
    check_finite_policy(models.model, update, step + 1, cfg.train.lr, models.weight_bound)
    return update


def token_update(
    cfg: RunConfig, step: int, groups: list[PromptGroup], models: StepModels
) -> tuple[dict[str, float], float]:
    """A step of a token estimator (``algorithms/token_advantages.py``): each response's ADORA weight (its group's,
    :func:`response_weights`), the critic's values (``gae``), per-token advantages and returns, the policy update on
    the advantages, then (``gae``) the critic's update on the returns, never weighted. The pool statistics of the
    sampler are not the baseline here (they drive its exit rules and are logged with its metrics).
    Returns (metrics, seconds spent on the advantages)."""
    t0 = time.perf_counter()
    packed, order = pack_kept(groups, models)
    weights, _, metrics = response_weights(group_batch(groups), [len(g.kept) for g in groups], cfg.adora)
    rewards = torch.tensor([r.reward for g in groups for r in g.kept], dtype=torch.float32)[order]
    critic_used = cfg.advantage.estimator in CRITIC_ESTIMATORS
    values = critic_values(models.critic, packed, cfg.train.micro_batch_size) if critic_used else None
    out = compute_token_advantages(
        cfg.advantage.estimator,
        rewards,
        packed.action_mask,
        values=values,
        weights=weights[order],
        params=TokenParams(cfg.advantage.gamma, cfg.advantage.lambd),
    )
    mask = packed.action_mask.bool()
    tokens = out.advantages[mask]
    metrics.update(
        {
            "advantage/mean_abs": float(tokens.abs().mean()) if tokens.numel() else 0.0,
            "advantage/mean": float(tokens.mean()) if tokens.numel() else 0.0,
            "advantage/std": float(tokens.std()) if tokens.numel() > 1 else 0.0,
            "advantage/returns_mean": float(out.returns[mask].mean()) if tokens.numel() else 0.0,
        }
    )
    seconds = time.perf_counter() - t0
    metrics.update(_policy_step(cfg, step, packed, out.advantages, models))
    if critic_used:
        metrics.update(
            critic_update(models.critic, packed, out.returns, values, cfg.critic, cfg.train.micro_batch_size)
        )
    return metrics, seconds


def rollout_metrics(groups, rows) -> dict[str, float]:
    """Reward, accuracy, format and length statistics of the kept responses, the share of groups whose kept
    responses are all correct, all wrong or mixed (the task's correctness), and the share of each behaviour
    the task's response probe recognises (K&K: thorough / shortcut)."""
    kept = [r for g in groups for r in g.kept]
    correct_counts = [(sum(r.payload.correct for r in g.kept), len(g.kept)) for g in groups if g.kept]
    n_groups = max(len(correct_counts), 1)
    n = max(len(kept), 1)
    lengths = [r.length for r in kept]
    mean = sum(lengths) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in lengths) / n)
    return {
        "reward/mean": sum(r.reward for r in kept) / n,
        "reward/accuracy": sum(r.payload.correct for r in kept) / n,
        "reward/format": sum(r.payload.info.get("format_ok", 0.0) for r in kept) / n,
        "groups/all_correct_fraction": sum(c == k for c, k in correct_counts) / n_groups,
        "groups/all_wrong_fraction": sum(c == 0 for c, _ in correct_counts) / n_groups,
        "groups/mixed_fraction": sum(0 < c < k for c, k in correct_counts) / n_groups,
        "response/length_mean": mean,
        "response/length_std": std,
        "response/length_std_over_mean": std / mean if mean > 0 else 0.0,
        "response/length_max": float(max(lengths, default=0)),
        "response/truncated_fraction": sum(r.truncated for r in kept) / n,
        **style_fractions(
            [rows[r.payload.row_index].source for r in kept], [r.payload.text for r in kept], "response/"
        ),
    }


def scheduled_lrs(train: PolicyLossConfig, step: int, steps: int) -> list[float]:
    """The learning rate of each PPO epoch's optimiser step of RL step ``step`` (0-based) of ``steps``: optimiser
    step ``k = step * ppo_epochs + epoch`` of ``steps * ppo_epochs`` under ``train.lr_scheduler``. A function of
    the step alone, so a resumed run continues the schedule without saved scheduler state."""
    epochs = train.ppo_epochs
    return [
        train.lr
        * lr_factor(
            train.lr_scheduler, step * epochs + epoch, steps * epochs, train.lr_warmup_ratio, train.min_lr_ratio
        )
        for epoch in range(epochs)
    ]


def group_batch(groups: list[PromptGroup]) -> GroupBatch:
    """The kept responses of ``groups``, one group after another, as the advantage pipeline's flat [N] tensors
    (:func:`compute_ragged_step_advantages` takes the group sizes beside them). ``correct`` is left to the
    pipeline (reward > adora.correct_threshold, the correctness rule in ``algorithms/adora.py``), as on the openrlhf backend, rather than
    taken from the task's own flag: the two agree on the shipped rewards, and a changed threshold takes effect."""
    return GroupBatch(
        rewards=torch.tensor([r.reward for x in groups for r in x.kept], dtype=torch.float32),
        lengths=torch.tensor([r.length for x in groups for r in x.kept], dtype=torch.float32),
        truncated=torch.tensor([r.truncated for x in groups for r in x.kept], dtype=torch.bool),
    )


def sample_at(
    cfg: RunConfig, sampling: StepSampling, engine: RolloutEngine, train_rows, position: int, count: int, step: int
):
    """(The sampler's result, prompts consumed) for ``count`` prompts of the seeded data order from ``position`` on
    (RL draws from the first ``data.rl_prompts`` rows). Without an allocator: the next ``count`` prompts, ``n_keep``
    responses each. With one: its candidates from ``position`` on, the ones it allocates responses to sampled (each
    with its own group size), and the store told what every sampled group showed."""
    num_rows = rl_row_count(cfg, train_rows)
    allocator = sampling.allocator
    if allocator is None:
        rows = batch_indices(position, count, num_rows, cfg.seed)
        return sampling.sampler.sample(
            count, engine.generate_fn(rows), step=step, prompt_keys=[row_key(train_rows[i]) for i in rows]
        ), count
    examined = allocator.cfg.candidate_count(count)
    candidates = batch_indices(position, examined, num_rows, cfg.seed)
    keys = [row_key(train_rows[i]) for i in candidates]
    allocation = allocator.choose(keys, count, cfg.sampling.n_keep, step, position)
    chosen = [i for i, k in enumerate(allocation.counts) if k > 0]
    rows, chosen_keys = [candidates[i] for i in chosen], [keys[i] for i in chosen]
    result = sampling.sampler.sample(
        len(rows),
        engine.generate_fn(rows),
        step=step,
        prompt_keys=chosen_keys,
        group_sizes=[allocation.counts[i] for i in chosen],
    )
    allocator.observe(chosen_keys, result)
    return result, examined


def rl_row_count(cfg: RunConfig, train_rows) -> int:
    """The training rows RL draws its prompts from: the first ``data.rl_prompts``, or all."""
    if cfg.data.rl_prompts is None:
        return len(train_rows)
    if cfg.data.rl_prompts > len(train_rows):
        raise ConfigError(
            f"data.rl_prompts: {cfg.data.rl_prompts} is more than the {len(train_rows)} training rows; lower it or add rows"
        )
    return cfg.data.rl_prompts


def filtered_sample(
    cfg: RunConfig, sampling: StepSampling, engine: RolloutEngine, train_rows, position: int, step: int
):
    """One step's groups through DAPO dynamic filtering (``algorithms/dynamic_filtering.py``): batches of new prompts
    of the data order from ``position`` on, each sampled by the (plain, one-round) sampler; groups outside
    ``dynamic_filtering.score_range`` of mean correctness are dropped and refilled. Returns (result, prompts consumed)."""
    drawn = 0

    def sample_batch(count: int):
        nonlocal drawn
        result, consumed = sample_at(cfg, sampling, engine, train_rows, position + drawn, count, step)
        drawn += consumed
        return result

    low, high = cfg.dynamic_filtering.score_range
    filtered = filter_and_refill(
        sample_batch,
        cfg.prompts_per_step,
        lambda response: float(response.payload.correct),
        low,
        high,
        cfg.dynamic_filtering.max_refills,
    )
    return filtered.result, drawn
