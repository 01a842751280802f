"""Adaptive multi-round sampling (Reinforce-Ada) with adaGRPO-style escalation of sampling parameters.

Engine-agnostic: the controller only sees a callable ``generate(requests) -> responses`` where each
:class:`GenerationRequest` names a prompt, a count and :class:`SamplingParams`, and each returned
:class:`ScoredResponse` carries a reward, a positive/negative label, a length and an opaque payload that
the backend uses later (token ids, log-probs, an OpenRLHF ``Experience`` ...).

One training step over G prompts (:meth:`AdaptiveSampler.sample`):

1. every prompt is active with an empty pool;
2. each round r generates ``samples_per_round`` responses (capped by the per-prompt budget) for the active
   prompts only, with the default parameters in round 0 and ``escalation[min(r-1, len-1)]`` applied on top
   from round 1 on (only once ``step >= trigger_after_step``);
3. after each round the exit rule (registry :data:`EXIT_RULES`) retires prompts whose pools carry a
   learning signal; a prompt never retires before its pool holds ``n_keep`` responses;
4. stop when no prompt is active, after ``max_rounds`` or when every active prompt has used its budget;
5. down-sample each pool to ``n_keep`` with the rule's selection (kept in generation order); prompts that
   never retired keep what they have (or are dropped with ``drop_unfinished``);
6. pool statistics (count, mean, std of every reward generated for the prompt this step, or over all steps
   with ``pool_scope="history"``) are returned for the estimator's baseline.

Exit rules with n = n_keep, P/N = positives/negatives in the pool:
- ``balance``: retire when P >= floor(n/2) and N >= n - floor(n/2); keep min(floor(n/2), P) positives,
  fill with negatives, top up from positives when negatives run short.
- ``pos``: retire when P >= 1; keep positives first (up to n), then negatives.
Within a class the kept responses are drawn uniformly at random (seeded by ``seed`` and the step).

With ``enabled=False`` the sampler does exactly one round of ``n_keep`` responses with the default
parameters and keeps them all: plain GRPO sampling.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from adora_openrlhf.algorithms.advantages import PoolStats
from adora_openrlhf.config_checks import check_choice, check_field_types, check_number, option, require
from adora_openrlhf.registry import Registry

# Config: the rollout's sampling parameters and the sampler's settings (sections rollout and sampling)

SAMPLING_PARAM_NAMES = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def check_sampling_values(values: Mapping[str, Any], section: str) -> None:
    """Range checks of the sampling parameters present in ``values``, errors named ``section.NAME`` (``rollout``,
    or an escalation entry ``sampling.escalation[i]``, which gives only the parameters it changes)."""
    ranges: dict[str, dict[str, Any]] = {
        "temperature": {"gt": 0},
        "top_p": {"gt": 0, "le": 1},
        "top_k": {"integer": True, "ge": 1, "also": (-1,)},
        "min_p": {"ge": 0, "lt": 1},
        "repetition_penalty": {"gt": 0},
        "max_new_tokens": {"integer": True, "ge": 1},
    }
    for name, value in values.items():
        check_number(value, f"{section}.{name}", **ranges[name])


@dataclass(frozen=True)
class SamplingParams:
    """Decoding parameters for one generation request (the subset shared by vLLM and transformers)."""

    temperature: float = option(1.0, "softmax temperature; > 0 (greedy decoding is not used for RL rollouts)")
    top_p: float = option(1.0, "nucleus sampling mass in (0, 1]")
    top_k: int = option(-1, "keep the k most likely tokens; -1 disables (vLLM convention)")
    min_p: float = option(0.0, "drop tokens below min_p * p(max token); 0 disables")
    repetition_penalty: float = option(1.0, ">1 penalises tokens already generated; 1 disables")
    max_new_tokens: int = option(512, 'generation limit per response; a response that hits it is "truncated"')

    def __post_init__(self) -> None:
        check_field_types(self, "rollout")
        check_sampling_values(dataclasses.asdict(self), "rollout")

    def override(self, changes: Mapping[str, Any]) -> SamplingParams:
        """Return a copy with ``changes`` applied; unknown parameter names are an error."""
        valid = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - valid)
        require(not unknown, "sampling.escalation", f"unknown sampling parameter(s) {unknown}; valid: {sorted(valid)}")
        return dataclasses.replace(self, **dict(changes))


POOL_SCOPES = ("step", "history")


@dataclass
class AdaptiveSamplingConfig:
    """Adaptive multi-round sampling (see ``algorithms/sampling.py``).

    When ``enabled`` is False the sampler does one round of ``n_keep`` responses per prompt and keeps them
    all, which is plain GRPO sampling.
    """

    enabled: bool = option(False, "False = one round of n_keep responses per prompt (plain GRPO)")
    exit_rule: str = option(
        "balance", 'when a prompt retires: one of algorithms.sampling.EXIT_RULES ("balance", "pos")'
    )
    positive_threshold: float | None = option(
        None,
        "a response is positive when reward > this; None = adora.correct_threshold (the run's one "
        "correctness threshold, RunConfig.positive_threshold); set it only where the exit rule should count "
        "positives at another reward (Reinforce-Ada: 0.7 for 0/1 rewards)",
    )
    n_keep: int = option(4, "responses kept per prompt for training (the group size n)")
    samples_per_round: int = option(8, "responses generated per round for each still-active prompt")
    max_rounds: int = option(4, "rounds per training step at most")
    max_responses_per_prompt: int | None = option(
        None, "hard cap on the pool per prompt per step; None = max_rounds*samples_per_round"
    )
    pool_scope: str = option("step", 'baseline pool: "step" (this step\'s responses) or "history" (every step so far)')
    drop_unfinished: bool = option(False, "drop prompts that never retired instead of keeping what they have")
    escalation: list[dict[str, Any]] = option(
        factory=list, help="round r>=1 uses escalation[min(r-1, len-1)] over the defaults"
    )
    trigger_after_step: int = option(0, "escalation is used only from this training step on (adaGRPO's K)")

    def __post_init__(self) -> None:
        check_field_types(self, "sampling")
        EXIT_RULES.check(self.exit_rule)
        check_number(self.positive_threshold, "sampling.positive_threshold", also=(None,))
        check_number(self.n_keep, "sampling.n_keep", integer=True, ge=1)
        check_number(self.samples_per_round, "sampling.samples_per_round", integer=True, ge=1)
        check_number(self.max_rounds, "sampling.max_rounds", integer=True, ge=1)
        check_number(
            self.max_responses_per_prompt, "sampling.max_responses_per_prompt", integer=True, ge=1, also=(None,)
        )
        check_choice(self.pool_scope, POOL_SCOPES, "sampling.pool_scope", "pool scope")
        check_number(self.trigger_after_step, "sampling.trigger_after_step", integer=True, ge=0)
        require(
            isinstance(self.escalation, list) and all(isinstance(e, Mapping) for e in self.escalation),
            "sampling.escalation",
            "must be a list of mappings such as [{'temperature': 1.2}, {'temperature': 1.4, 'top_p': 1.0}]",
        )
        for i, changes in enumerate(self.escalation):
            unknown = sorted(set(changes) - set(SAMPLING_PARAM_NAMES))
            require(
                not unknown,
                f"sampling.escalation[{i}]",
                f"unknown sampling parameter(s) {unknown}; valid: {list(SAMPLING_PARAM_NAMES)}",
            )
            # the rollout ranges, now rather than at first use
            check_sampling_values(changes, f"sampling.escalation[{i}]")
        if self.enabled:
            budget = self.response_budget
            require(
                budget >= self.n_keep,
                "sampling.max_responses_per_prompt",
                f"the per-prompt budget ({budget} responses) is smaller than n_keep={self.n_keep}; raise "
                "max_rounds, samples_per_round or max_responses_per_prompt, or lower n_keep",
            )

    @property
    def response_budget(self) -> int:
        """Most responses one prompt may receive in one step."""
        full = self.max_rounds * self.samples_per_round
        return full if self.max_responses_per_prompt is None else min(full, self.max_responses_per_prompt)


@dataclass(frozen=True)
class GenerationRequest:
    """Ask the engine for ``num_samples`` responses to prompt ``prompt_index`` with ``params``."""

    prompt_index: int
    num_samples: int
    params: SamplingParams
    round: int


@dataclass
class ScoredResponse:
    """One generated and scored response."""

    reward: float  # scalar reward used by the estimator
    positive: bool  # the exit rule's label (usually reward > positive_threshold, or the task's 0/1 score)
    length: int = 0  # response tokens
    truncated: bool = False  # hit the generation limit
    payload: Any = None  # backend data carried through untouched
    round: int = -1  # filled in by the sampler


GenerateFn = Callable[[Sequence[GenerationRequest]], Sequence[Sequence[ScoredResponse]]]


# ---------------------------------------------------------------------------------------------------------
# Exit rules
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExitRule:
    """When a prompt retires, and which pool members are kept for training."""

    is_done: Callable[[int, int, int], bool]  # (num_pos, num_neg, n) -> retired
    select: Callable[[list[int], list[int], int, random.Random], list[int]]  # (pos idx, neg idx, n, rng) -> kept idx


EXIT_RULES: Registry[ExitRule] = Registry("exit rule", "sampling.exit_rule")


def register_exit_rule(name: str, rule: ExitRule) -> ExitRule:
    """Register ``rule`` as exit rule ``name``."""
    return EXIT_RULES.add(name, rule)


def _draw(indices: list[int], k: int, rng: random.Random) -> list[int]:
    return indices if k >= len(indices) else rng.sample(indices, k)


def _balance_done(num_pos: int, num_neg: int, n: int) -> bool:
    half = n // 2
    return num_pos >= half and num_neg >= n - half


def _balance_select(pos: list[int], neg: list[int], n: int, rng: random.Random) -> list[int]:
    take_pos = min(n // 2, len(pos))
    take_neg = min(n - take_pos, len(neg))
    take_pos = min(n - take_neg, len(pos))  # top up from positives when negatives run short
    return _draw(pos, take_pos, rng) + _draw(neg, take_neg, rng)


def _pos_done(num_pos: int, num_neg: int, n: int) -> bool:
    return num_pos >= 1


def _pos_select(pos: list[int], neg: list[int], n: int, rng: random.Random) -> list[int]:
    take_pos = min(n, len(pos))
    return _draw(pos, take_pos, rng) + _draw(neg, min(n - take_pos, len(neg)), rng)


register_exit_rule("balance", ExitRule(is_done=_balance_done, select=_balance_select))
register_exit_rule("pos", ExitRule(is_done=_pos_done, select=_pos_select))


# ---------------------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------------------


@dataclass
class PromptGroup:
    """What one prompt ends the step with."""

    prompt_index: int
    kept: list[ScoredResponse]  # n_keep responses in generation order (fewer only if the pool was smaller)
    pool_rewards: list[float]  # every reward generated for this prompt this step
    retired_round: int | None  # round in which the exit rule held; None = never retired (fallback)
    pool_positives: int = 0  # positive responses among every response generated for this prompt this step


@dataclass
class SamplingResult:
    groups: list[PromptGroup]  # one per prompt that is kept, in prompt order
    dropped: list[int]  # prompt indices dropped by drop_unfinished
    pool_stats: PoolStats  # baseline statistics aligned with ``groups``
    metrics: dict[str, float]

    def kept_rewards(self) -> torch.Tensor:
        """[G, n_keep] rewards of the kept responses."""
        return torch.tensor([[r.reward for r in g.kept] for g in self.groups], dtype=torch.float32)


def kept_group_metrics(groups: Sequence[PromptGroup], pool_stats: PoolStats) -> dict[str, float]:
    """Metrics of the groups a step trains on: groups whose kept rewards are all equal, groups whose pool has no
    spread (zero signal), and the mean of every pool reward."""
    pooled = sum(len(g.pool_rewards) for g in groups)
    return {
        "sampling/uniform_kept_groups": float(sum(1 for g in groups if len({r.reward for r in g.kept}) <= 1)),
        "sampling/zero_signal_groups": float(int((pool_stats.std == 0).sum())) if groups else 0.0,
        "sampling/pool_mean_reward": float(sum(sum(g.pool_rewards) for g in groups) / max(pooled, 1)),
    }


def escalated_params(cfg: AdaptiveSamplingConfig, base: SamplingParams, round_index: int, step: int) -> SamplingParams:
    """Sampling parameters for ``round_index``: defaults in round 0 or before ``trigger_after_step``,
    otherwise ``escalation[min(round_index - 1, len - 1)]`` applied over the defaults."""
    if round_index == 0 or not cfg.escalation or step < cfg.trigger_after_step:
        return base
    return base.override(cfg.escalation[min(round_index - 1, len(cfg.escalation) - 1)])


# ---------------------------------------------------------------------------------------------------------
# Controller
# ---------------------------------------------------------------------------------------------------------


@dataclass
class _RewardHistory:
    count: int = 0
    total: float = 0.0
    total_sq: float = 0.0


class AdaptiveSampler:
    """Per-step controller of multi-round sampling. Holds only the cross-step reward history (for
    ``pool_scope="history"``), which :meth:`state_dict` / :meth:`load_state_dict` checkpoint."""

    def __init__(self, cfg: AdaptiveSamplingConfig, base_params: SamplingParams, seed: int = 0):
        self.cfg = cfg
        self.base_params = base_params
        self.seed = seed
        self.rule = EXIT_RULES.get(cfg.exit_rule)
        self._history: dict[Hashable, _RewardHistory] = {}

    # -- schedule -------------------------------------------------------------------------------------
    @property
    def rounds_allowed(self) -> int:
        return self.cfg.max_rounds if self.cfg.enabled else 1

    def _budget(self) -> int:
        return self.cfg.response_budget if self.cfg.enabled else self.cfg.n_keep

    # -- one step -------------------------------------------------------------------------------------
    def sample(
        self,
        num_prompts: int,
        generate: GenerateFn,
        step: int = 0,
        prompt_keys: Sequence[Hashable] | None = None,
        group_sizes: Sequence[int] | None = None,
    ) -> SamplingResult:
        """Run the rounds for ``num_prompts`` prompts and return kept groups, pool statistics and metrics.

        ``prompt_keys`` identify prompts across steps (needed for ``pool_scope="history"``; defaults to the
        index within the batch). ``group_sizes`` gives each prompt its own group size n_p (a rollout allocator's
        counts, ``algorithms/allocation.py``) in place of ``n_keep``: plain sampling generates n_p responses, adaptive
        sampling retires and down-samples with n = n_p (at most the per-prompt budget).
        """
        sizes = self._group_sizes(num_prompts, prompt_keys, group_sizes)
        rng = random.Random(f"{self.seed}:{step}")
        pools, retired_round, retired_per_round, rounds_used = self._rounds(num_prompts, generate, step, sizes)
        groups, dropped = [], []
        for p in range(num_prompts):
            if retired_round[p] is None and self.cfg.enabled and self.cfg.drop_unfinished:
                dropped.append(p)
                continue
            kept = self._down_sample(pools[p], sizes[p], rng)
            groups.append(
                PromptGroup(p, kept, [r.reward for r in pools[p]], retired_round[p], sum(r.positive for r in pools[p]))
            )

        keys = list(prompt_keys) if prompt_keys is not None else list(range(num_prompts))
        pool_stats = self._pool_stats(groups, keys)
        metrics = self._metrics(pools, groups, dropped, retired_per_round, rounds_used, pool_stats)
        return SamplingResult(groups=groups, dropped=dropped, pool_stats=pool_stats, metrics=metrics)

    def _group_sizes(
        self, num_prompts: int, prompt_keys: Sequence[Hashable] | None, group_sizes: Sequence[int] | None
    ) -> list[int]:
        """Each prompt's group size n_p (``n_keep``, or the allocator's count; at most the budget when adaptive);
        ValueError for arguments that do not fit ``num_prompts``."""
        if num_prompts < 1:
            raise ValueError(f"num_prompts: need at least one prompt, got {num_prompts}")
        if prompt_keys is not None and len(prompt_keys) != num_prompts:
            raise ValueError(f"prompt_keys: got {len(prompt_keys)} keys for {num_prompts} prompts")
        if group_sizes is not None and (len(group_sizes) != num_prompts or any(int(k) < 1 for k in group_sizes)):
            raise ValueError(f"group_sizes: need one size >= 1 per prompt ({num_prompts}), got {list(group_sizes)}")
        sizes = [self.cfg.n_keep] * num_prompts if group_sizes is None else [int(k) for k in group_sizes]
        return [min(k, self._budget()) for k in sizes] if self.cfg.enabled else sizes

    def _rounds(
        self, num_prompts: int, generate: GenerateFn, step: int, sizes: Sequence[int]
    ) -> tuple[list[list[ScoredResponse]], list[int | None], list[int], int]:
        """Sample round after round until every prompt is retired by the exit rule or the budget is spent (one round
        without adaptive sampling): (each prompt's pool, the round that retired it or None, prompts retired per
        round, rounds used)."""
        cfg, budget = self.cfg, self._budget()
        pools: list[list[ScoredResponse]] = [[] for _ in range(num_prompts)]
        retired_round: list[int | None] = [None] * num_prompts
        active = list(range(num_prompts))
        retired_per_round: list[int] = []
        rounds_used = 0
        for round_index in range(self.rounds_allowed):
            params = escalated_params(cfg, self.base_params, round_index, step) if cfg.enabled else self.base_params
            requests = []
            for p in active:
                count = min(cfg.samples_per_round, budget - len(pools[p])) if cfg.enabled else sizes[p]
                if count > 0:
                    requests.append(
                        GenerationRequest(prompt_index=p, num_samples=count, params=params, round=round_index)
                    )
            if not requests:
                break
            self._add_responses(pools, requests, generate(requests), round_index)
            rounds_used = round_index + 1
            still_active = []
            for p in active:
                num_pos = sum(r.positive for r in pools[p])
                if len(pools[p]) >= sizes[p] and self.rule.is_done(num_pos, len(pools[p]) - num_pos, sizes[p]):
                    retired_round[p] = round_index
                else:
                    still_active.append(p)
            retired_per_round.append(len(active) - len(still_active))
            active = still_active
            if not active or not cfg.enabled:
                break
        return pools, retired_round, retired_per_round, rounds_used

    @staticmethod
    def _add_responses(
        pools: list[list[ScoredResponse]],
        requests: Sequence[GenerationRequest],
        outputs: Sequence[Sequence[ScoredResponse]],
        round_index: int,
    ) -> None:
        """Append a round's responses to their prompts' pools; ValueError when ``generate`` broke its contract."""
        if len(outputs) != len(requests):
            raise ValueError(f"generate: returned {len(outputs)} response lists for {len(requests)} requests")
        for req, responses in zip(requests, outputs, strict=True):
            if len(responses) != req.num_samples:
                raise ValueError(
                    f"generate: prompt {req.prompt_index} asked for {req.num_samples} responses, got {len(responses)}"
                )
            for resp in responses:
                resp.round = round_index
            pools[req.prompt_index].extend(responses)

    def _down_sample(self, pool: list[ScoredResponse], n: int, rng: random.Random) -> list[ScoredResponse]:
        if len(pool) <= n:
            return list(pool)
        pos = [i for i, r in enumerate(pool) if r.positive]
        neg = [i for i, r in enumerate(pool) if not r.positive]
        kept = sorted(self.rule.select(pos, neg, n, rng))
        return [pool[i] for i in kept]

    def _pool_stats(self, groups: list[PromptGroup], keys: list[Hashable]) -> PoolStats:
        """Baseline statistics: this step's pools, or (``pool_scope="history"``) every reward so far."""
        if not (self.cfg.enabled and self.cfg.pool_scope == "history"):
            return PoolStats.from_rewards([g.pool_rewards for g in groups])
        counts, means, stds = [], [], []
        for g in groups:
            h = self._history.setdefault(keys[g.prompt_index], _RewardHistory())
            h.count += len(g.pool_rewards)
            h.total += math.fsum(g.pool_rewards)
            h.total_sq += math.fsum(r * r for r in g.pool_rewards)
            mean = h.total / h.count
            var = max(h.total_sq - h.count * mean * mean, 0.0) / (h.count - 1) if h.count > 1 else 0.0
            counts.append(h.count)
            means.append(mean)
            stds.append(math.sqrt(var))
        return PoolStats(
            count=torch.tensor(counts, dtype=torch.long),
            mean=torch.tensor(means, dtype=torch.float32),
            std=torch.tensor(stds, dtype=torch.float32),
        )

    def _metrics(self, pools, groups, dropped, retired_per_round, rounds_used, pool_stats) -> dict[str, float]:
        first_round = [r.reward for pool in pools for r in pool if r.round == 0]
        unfinished = sum(1 for g in groups if g.retired_round is None) + len(dropped)
        metrics: dict[str, float] = {
            "sampling/responses_generated": float(sum(len(p) for p in pools)),
            "sampling/tokens_generated": float(sum(r.length for p in pools for r in p)),  # every response, kept or not
            "sampling/rounds_used": float(rounds_used),
            "sampling/unfinished_prompts": float(unfinished if self.cfg.enabled else 0),
            "sampling/dropped_prompts": float(len(dropped)),
            "sampling/first_round_mean_reward": sum(first_round) / len(first_round) if first_round else 0.0,
            **kept_group_metrics(groups, pool_stats),
        }
        for r in range(self.rounds_allowed):
            metrics[f"sampling/retired_round_{r}"] = float(retired_per_round[r]) if r < len(retired_per_round) else 0.0
        return metrics

    # -- checkpointing ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        # plain JSON data
        return {"history": {repr(k): [k, h.count, h.total, h.total_sq] for k, h in self._history.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._history = {k: _RewardHistory(c, t, s) for k, c, t, s in state.get("history", {}).values()}
