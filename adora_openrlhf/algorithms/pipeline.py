"""The advantage path of one training step, shared by every backend.

    kept rewards [G, n] (+ optional pool statistics from the adaptive sampler)
      -> optional ADORA length shaping of the rewards
      -> group advantages (estimator registry)
      -> ADORA weights per group, A_i <- w_g * A_i
      -> advantages [G, n] and the metrics to log

Groups of several sizes (a rollout allocator's counts) go through :func:`compute_ragged_step_advantages`.

With ADORA off and no pool statistics this is exactly the plain estimator (GRPO's group_norm as computed
by OpenRLHF 0.11).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from adora_openrlhf.algorithms.adora import (
    AdoraConfig,
    AdoraResult,
    adora_weights,
    apply_group_weights,
    length_shaped_rewards,
)
from adora_openrlhf.algorithms.advantages import AdvantageConfig, GroupStats, PoolStats, compute_group_advantages


@dataclass(frozen=True)
class GroupBatch:
    """Kept responses of G prompt groups, n each. All tensors are [G, n]."""

    rewards: torch.Tensor  # float rewards
    lengths: torch.Tensor  # response lengths in tokens
    correct: torch.Tensor | None = None  # bool; None -> rewards > adora.correct_threshold
    truncated: torch.Tensor | None = None  # bool; None -> nothing truncated


@dataclass(frozen=True)
class AdvantageOutput:
    advantages: torch.Tensor  # [G, n] scalar advantage per response (broadcast to tokens by the backend)
    group_stats: GroupStats
    adora: AdoraResult
    metrics: dict[str, float]


def compute_step_advantages(
    batch: GroupBatch, advantage_cfg: AdvantageConfig, adora_cfg: AdoraConfig, pool_stats: PoolStats | None = None
) -> AdvantageOutput:
    """Advantages for one step: estimator (with pool statistics when given) then ADORA weights.

    Length shaping, when enabled, changes the kept rewards before the estimator; pool statistics, when
    given, still describe the unshaped pool.
    """
    rewards = batch.rewards.to(torch.promote_types(batch.rewards.dtype, torch.float32))
    if adora_cfg.enabled and adora_cfg.length_shaping:
        rewards = length_shaped_rewards(
            rewards, batch.lengths, adora_cfg, correct=batch.correct, truncated=batch.truncated
        )
    advantages, group_stats = compute_group_advantages(rewards, advantage_cfg.estimator, advantage_cfg.eps, pool_stats)
    assert isinstance(advantages, torch.Tensor)
    adora = adora_weights(batch.rewards, batch.lengths, adora_cfg, correct=batch.correct, truncated=batch.truncated)
    if adora_cfg.enabled:
        advantages = apply_group_weights(advantages, adora.weights)
    metrics = {
        "advantage/zero_signal_fraction": group_stats.zero_signal_fraction,
        "advantage/mean_abs": float(advantages.abs().mean()) if advantages.numel() else 0.0,
        **adora.metrics(),
    }
    return AdvantageOutput(advantages=advantages, group_stats=group_stats, adora=adora, metrics=metrics)


@dataclass(frozen=True)
class RaggedAdvantageOutput:
    """:func:`compute_ragged_step_advantages`' result: groups of several sizes, one after another."""

    advantages: torch.Tensor  # [N] scalar advantage per response, groups in order
    weights: torch.Tensor  # [G] ADORA weight of each group
    group_class: torch.Tensor  # [G] long: 1 TAS, -1 TDS, 0 neutral
    zero_signal: torch.Tensor  # [G] bool: every advantage of the group is exactly 0
    metrics: dict[str, float]


def compute_ragged_step_advantages(
    batch: GroupBatch,
    sizes: Sequence[int],
    advantage_cfg: AdvantageConfig,
    adora_cfg: AdoraConfig,
    pool_stats: PoolStats | None = None,
) -> RaggedAdvantageOutput:
    """:func:`compute_step_advantages` for groups of several sizes (a rollout allocator's counts).

    ``batch`` holds flat [N] tensors, group g being the next ``sizes[g]`` entries; ``pool_stats`` is per group [G].
    Each group's advantages depend on its own responses and pool only, so groups of one size go through
    :func:`compute_step_advantages` together, and the result equals computing each group alone. Each metric is the
    mean over the sizes weighted by their number of groups (``advantage/mean_abs`` by their number of responses);
    with one size this is exactly :func:`compute_step_advantages`."""
    sizes = [int(s) for s in sizes]
    total = batch.rewards.numel()
    if any(s < 1 for s in sizes) or sum(sizes) != total:
        raise ValueError(f"group sizes: {sizes} must be >= 1 each and sum to the {total} responses")
    starts = torch.tensor([0, *sizes], dtype=torch.long).cumsum(0)[:-1]
    by_size: dict[int, list[int]] = {}
    for g, size in enumerate(sizes):
        by_size.setdefault(size, []).append(g)
    advantages = torch.zeros(total, dtype=torch.promote_types(batch.rewards.dtype, torch.float32))
    weights, group_class = torch.ones(len(sizes)), torch.zeros(len(sizes), dtype=torch.long)
    zero_signal = torch.zeros(len(sizes), dtype=torch.bool)
    metrics: dict[str, float] = {}
    for size, groups in by_size.items():
        idx = torch.tensor(groups, dtype=torch.long)
        cols = (starts[idx].unsqueeze(1) + torch.arange(size)).reshape(-1)
        shape = (len(groups), size)
        part = GroupBatch(
            *(_rows(t, cols, shape) for t in (batch.rewards, batch.lengths, batch.correct, batch.truncated))
        )
        pool = None
        if pool_stats is not None:
            pool = PoolStats(count=pool_stats.count[idx], mean=pool_stats.mean[idx], std=pool_stats.std[idx])
        out = compute_step_advantages(part, advantage_cfg, adora_cfg, pool)
        advantages[cols] = out.advantages.reshape(-1).to(advantages.dtype)
        weights[idx] = out.adora.weights.float()
        group_class[idx] = out.adora.group_class.long()
        zero_signal[idx] = out.group_stats.zero_signal
        for name, value in out.metrics.items():
            weight = len(groups) * size / total if name == "advantage/mean_abs" else len(groups) / len(sizes)
            metrics[name] = metrics.get(name, 0.0) + weight * value
    return RaggedAdvantageOutput(advantages, weights, group_class, zero_signal, metrics)


def _rows(flat: torch.Tensor | None, cols: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor | None:
    """The entries ``cols`` of a flat tensor as a [G, n] block (None stays None)."""
    return None if flat is None else flat.reshape(-1)[cols].reshape(shape)


def response_weights(
    batch: GroupBatch, sizes: Sequence[int], adora_cfg: AdoraConfig
) -> tuple[torch.Tensor, AdoraResult, dict[str, float]]:
    """ADORA's weight of every response, for the token estimators (``gae``, ``reinforce``) whose baseline is a
    critic or the batch, not the group: (weights [N] (each response its group's), the per-group result, metrics).

    ``batch`` holds flat [N] tensors, group g being the next ``sizes[g]`` entries. The groups are classed by
    :func:`adora_weights` from their rewards and lengths exactly as for the group estimators (the class does not
    depend on the estimator); with ADORA off every weight is 1 and the classes are still logged.
    ``advantage/zero_signal_fraction`` counts the groups whose kept rewards are all equal (they still get a
    signal from the critic or the batch).
    """
    sizes = [int(s) for s in sizes]
    total = batch.rewards.numel()
    if any(s < 1 for s in sizes) or sum(sizes) != total:
        raise ValueError(f"group sizes: {sizes} must be >= 1 each and sum to the {total} responses")
    width = max(sizes, default=1)
    valid = torch.arange(width).unsqueeze(0) < torch.tensor(sizes, dtype=torch.long).unsqueeze(1)
    blocks = []
    for flat in (batch.rewards, batch.lengths, batch.correct, batch.truncated):
        if flat is None:
            blocks.append(None)
            continue
        block = torch.zeros((len(sizes), width), dtype=flat.dtype)
        block[valid] = flat.reshape(-1)
        blocks.append(block)
    rewards, lengths, correct, truncated = blocks
    result = adora_weights(rewards, lengths, adora_cfg, correct=correct, truncated=truncated, valid=valid)
    weights = result.weights.repeat_interleave(torch.tensor(sizes, dtype=torch.long))
    big = torch.finfo(torch.float32).max
    hi = torch.where(valid, rewards.float(), torch.full_like(rewards.float(), -big)).max(-1).values
    lo = torch.where(valid, rewards.float(), torch.full_like(rewards.float(), big)).min(-1).values
    uniform = float((hi == lo).float().mean()) if sizes else 0.0
    return weights, result, {"advantage/zero_signal_fraction": uniform, **result.metrics()}
