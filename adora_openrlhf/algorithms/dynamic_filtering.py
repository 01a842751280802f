"""DAPO dynamic filtering ("dynamic sampling"), the simple alternative to adaptive multi-round sampling.

Rule (OpenRLHF 0.11.2 ``--algo.dynamic_filtering_enable``, ``samples_generator._generate_vllm``): a prompt's group
of responses is kept iff ``low < mean(s) < high``, where ``s`` are the responses' scores (the task's 0/1
correctness) and ``(low, high)`` is ``dynamic_filtering.score_range`` (default ``(0, 1)``: all-wrong and
all-correct groups, whose group-normalised advantages are all 0, are dropped).

Refill loop of one step (:func:`filter_and_refill`): sample ``num_prompts`` new prompts; keep the groups that
pass; draw and sample as many new prompts as were dropped; repeat until ``num_prompts`` groups are kept or
``max_refills`` refills were made (OpenRLHF refills until its data runs out; the cap keeps a step finite once most
prompts are solved). The step then trains on the kept groups, possibly fewer than ``num_prompts``, possibly none.

Engine-agnostic: the loop only sees ``sample_batch(count) -> SamplingResult`` (draw ``count`` prompts from the
data stream and sample them, e.g. with :class:`AdaptiveSampler` in its plain one-round mode) and
``score_of(response) -> float``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from adora_openrlhf.algorithms.advantages import PoolStats
from adora_openrlhf.algorithms.sampling import PromptGroup, SamplingResult, ScoredResponse, kept_group_metrics
from adora_openrlhf.config_checks import check_field_types, check_number, option, require

# Config (section dynamic_filtering)


@dataclass
class DynamicFilteringConfig:
    """DAPO dynamic filtering (see ``algorithms/dynamic_filtering.py``), OpenRLHF's ``--algo.dynamic_filtering_enable``.

    A prompt's group of ``n_keep`` responses is kept when ``low < mean(scores) < high`` (scores: the task's 0/1
    correctness); other groups are dropped and as many new prompts are drawn from the data and sampled in their
    place, at most ``max_refills`` times per step. An alternative to adaptive sampling (``sampling.enabled``).
    """

    enabled: bool = option(
        False,
        "drop groups whose mean correctness is outside score_range and refill them with new prompts (DAPO dynamic sampling)",
    )
    score_range: list[float] = option(
        factory=lambda: [0.0, 1.0],
        help="[low, high]: a group is kept when low < mean correctness < high ([0, 1]: drop all-wrong and all-correct groups); "
        "OpenRLHF's --algo.dynamic_filtering_range",
    )
    max_refills: int = option(
        4,
        "refill rounds per step at most, each sampling as many new prompts as were dropped; after them the step "
        "trains on the groups it has (fewer than prompts_per_step, none = no update)",
    )

    def __post_init__(self) -> None:
        if isinstance(self.score_range, tuple):  # OpenRLHF's namespace holds (low, high)
            self.score_range = list(self.score_range)
        check_field_types(self, "dynamic_filtering")
        require(
            isinstance(self.score_range, list) and len(self.score_range) == 2,
            "dynamic_filtering.score_range",
            f"must be two numbers [low, high] such as [0, 1], got {self.score_range!r}",
        )
        for i, value in enumerate(self.score_range):
            check_number(value, f"dynamic_filtering.score_range[{i}]")
        low, high = self.score_range
        require(
            low < high,
            "dynamic_filtering.score_range",
            f"low must be below high (a group is kept when low < mean < high), got {self.score_range!r}",
        )
        require(
            low < 1 and high > 0,
            "dynamic_filtering.score_range",
            f"no group could ever be kept: a mean correctness lies in [0, 1], so low must be < 1 and high > 0, got {self.score_range!r}",
        )
        check_number(self.max_refills, "dynamic_filtering.max_refills", integer=True, ge=0)


# sampler metrics that count work over every prompt sampled this step: summed over the batches
_SUMMED = (
    "sampling/responses_generated",
    "sampling/tokens_generated",
    "sampling/unfinished_prompts",
    "sampling/dropped_prompts",
)


def classify_group(scores: Sequence[float], low: float, high: float) -> str:
    """``"keep"`` iff ``low < mean(scores) < high``; else ``"high"`` (mean >= high) or ``"low"`` (mean <= low).
    An empty group is an error."""
    if len(scores) == 0:
        raise ValueError("keeps_group: a group needs at least one score")
    mean = math.fsum(scores) / len(scores)
    return "keep" if low < mean < high else "high" if mean >= high else "low"


def keeps_group(scores: Sequence[float], low: float, high: float) -> bool:
    """True iff ``low < mean(scores) < high`` (the group carries a learning signal). An empty group is an error."""
    return classify_group(scores, low, high) == "keep"


@dataclass
class FilteredBatch:
    """What one step's refill loop ends with."""

    result: SamplingResult  # the kept groups (prompt indices 0..K-1 in keep order), their pool stats, merged metrics
    stream_indices: list[int]  # per kept group: its prompt's position among the prompts consumed this step
    prompts_consumed: int  # prompts drawn from the data stream this step (the data position advances by this)
    refills: int  # refill rounds made (<= max_refills)


def filter_and_refill(
    sample_batch: Callable[[int], SamplingResult],
    num_prompts: int,
    score_of: Callable[[ScoredResponse], float],
    low: float = 0.0,
    high: float = 1.0,
    max_refills: int = 4,
) -> FilteredBatch:
    """Sample ``num_prompts`` prompts, drop the groups outside ``(low, high)`` and refill them (module docstring).

    Each call ``sample_batch(count)`` must draw ``count`` new prompts, in data order after the previous call's, and
    return one group per prompt (prompt indices ``0..count-1``) or fewer when the sampler itself drops some (those
    count as consumed and dropped). At most ``num_prompts`` groups are kept, in the order they were sampled.
    """
    if num_prompts < 1:
        raise ValueError(f"num_prompts: need at least one prompt, got {num_prompts}")
    if max_refills < 0:
        raise ValueError(f"max_refills: must be >= 0, got {max_refills}")
    kept: list[PromptGroup] = []
    stream_indices: list[int] = []
    stats: list[tuple[int, float, float]] = []  # (count, mean, std) per kept group
    batch_metrics: list[dict[str, float]] = []
    consumed = refills = dropped_low = dropped_high = 0
    while True:
        count = num_prompts - len(kept)  # the first batch, then exactly the dropped count
        batch = sample_batch(count)
        indices = [g.prompt_index for g in batch.groups]
        if any(not 0 <= i < count for i in indices) or indices != sorted(set(indices)):
            raise ValueError(
                f"sample_batch: asked for {count} prompts, got groups of prompt indices {indices} (want increasing, in 0..{count - 1})"
            )
        batch_metrics.append(batch.metrics)
        for i, group in enumerate(batch.groups):
            side = classify_group([float(score_of(r)) for r in group.kept], low, high)
            if side == "keep":  # at most `count` groups per batch: never more than num_prompts kept
                kept.append(dataclasses.replace(group, prompt_index=len(kept)))
                stream_indices.append(consumed + group.prompt_index)
                stats.append(
                    (int(batch.pool_stats.count[i]), float(batch.pool_stats.mean[i]), float(batch.pool_stats.std[i]))
                )
            elif side == "high":
                dropped_high += 1
            else:
                dropped_low += 1
        consumed += count
        if len(kept) >= num_prompts or refills >= max_refills:
            break
        refills += 1

    counts = {"consumed": consumed, "refills": refills, "dropped_low": dropped_low, "dropped_high": dropped_high}
    return _filtered_batch(kept, stream_indices, stats, batch_metrics, num_prompts, counts)


def _filtered_batch(
    kept: list[PromptGroup],
    stream_indices: list[int],
    stats: list[tuple[int, float, float]],
    batch_metrics: list[dict[str, float]],
    num_prompts: int,
    counts: dict[str, int],
) -> FilteredBatch:
    """The step's result from its kept groups, their pool statistics and the filter's counts."""
    pool_stats = PoolStats(
        count=torch.tensor([s[0] for s in stats], dtype=torch.long),
        mean=torch.tensor([s[1] for s in stats], dtype=torch.float32),
        std=torch.tensor([s[2] for s in stats], dtype=torch.float32),
    )
    consumed, refills = counts["consumed"], counts["refills"]
    metrics = _merge_metrics(batch_metrics, kept, pool_stats)
    metrics.update(
        {
            "filter/prompts_consumed": float(consumed),
            "filter/kept_groups": float(len(kept)),
            "filter/pass_rate": len(kept) / consumed,
            "filter/refills": float(refills),
            "filter/short_groups": float(num_prompts - len(kept)),
            "filter/dropped_low": float(counts["dropped_low"]),  # mean score <= low (with (0, 1): every response wrong)
            # mean score >= high (with (0, 1): every response correct)
            "filter/dropped_high": float(counts["dropped_high"]),
        }
    )
    result = SamplingResult(groups=kept, dropped=[], pool_stats=pool_stats, metrics=metrics)
    return FilteredBatch(result=result, stream_indices=stream_indices, prompts_consumed=consumed, refills=refills)


def _merge_metrics(
    batch_metrics: list[dict[str, float]], kept: list[PromptGroup], pool_stats: PoolStats
) -> dict[str, float]:
    """The sampler's metrics over every batch of the step: counts of work summed (responses generated, ...), rounds
    used at most, the first-round mean reward over every response generated, and the kept-group ones (uniform and
    zero-signal groups, pool mean reward) recomputed on the kept groups."""
    merged: dict[str, float] = {}
    generated = [m.get("sampling/responses_generated", 0.0) for m in batch_metrics]
    for key in dict.fromkeys(k for m in batch_metrics for k in m):
        values = [m.get(key, 0.0) for m in batch_metrics]
        if key in _SUMMED or key.startswith("sampling/retired_round_"):
            merged[key] = float(sum(values))
        elif key == "sampling/rounds_used":
            merged[key] = float(max(values))
        # responses-weighted (plain sampling: every response is round 0)
        elif key == "sampling/first_round_mean_reward":
            merged[key] = (
                sum(v * w for v, w in zip(values, generated, strict=True)) / sum(generated)
                if sum(generated) > 0
                else 0.0
            )
        else:  # any other key: the value of the step's first batch (its original prompts)
            merged[key] = float(values[0])
    merged.update(kept_group_metrics(kept, pool_stats))  # recomputed on the kept groups
    return merged
