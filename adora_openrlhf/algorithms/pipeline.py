"""The advantage path of one training step, shared by every backend.

    kept rewards [G, n] (+ optional pool statistics from the adaptive sampler)
      -> optional ADORA length shaping of the rewards
      -> group advantages (estimator registry)
      -> ADORA weights per group, A_i <- w_g * A_i
      -> advantages [G, n] and the metrics to log

With ADORA off and no pool statistics this is exactly the plain estimator (GRPO's group_norm as computed
by OpenRLHF 0.11).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from adora_openrlhf.algorithms.adora import AdoraResult, adora_weights, apply_group_weights, length_shaped_rewards
from adora_openrlhf.algorithms.advantages import GroupStats, PoolStats, compute_group_advantages

if TYPE_CHECKING:  # the algorithm core does not import the config at run time (config imports the registries)
    from adora_openrlhf.config import AdoraConfig, AdvantageConfig


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
