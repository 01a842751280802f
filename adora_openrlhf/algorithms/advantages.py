"""Group advantage estimators (critic-free baselines), as a registry of small pure functions.

Input: rewards of shape [G, n] (G prompt groups of n responses), or a list of 1-D tensors for ragged
groups. Output: one scalar advantage per response (same shape) and per-group statistics. The token-level
advantage is that scalar broadcast to every response token (:func:`broadcast_to_tokens`).

Formulas (r = the group's rewards; with external pool statistics the mean/std/sum come from the pool):

- ``group_norm`` (GRPO):            A_i = (r_i - mean(r)) / (std(r) + eps), std unbiased (torch default)
- ``dr_grpo``, ``reinforce_baseline``: A_i = r_i - mean(r)
- ``rloo``:                          A_i = r_i - mean_{j != i} r_j = r_i - (sum(r) - r_i) / (m - 1)

Conventions that keep every output finite:
- a group whose rewards are all equal ("signal collapse") gives A_i = 0 exactly (group_norm would
  otherwise divide rounding noise by eps); such groups are flagged in ``GroupStats.zero_signal``;
- a group (or pool) of size 1 has no baseline: its std is taken as 0 and rloo gives A = 0.

For dense input with no pool statistics, ``group_norm`` performs exactly OpenRLHF 0.11's computation
``(r - r.mean(-1)) / (r.std(-1) + 1e-9)`` for every group that is not uniform, so plain GRPO matches it
bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from adora_openrlhf.algorithms.token_advantages import TOKEN_ESTIMATORS
from adora_openrlhf.config_checks import check_field_types, check_number, choice_problem, option, require
from adora_openrlhf.errors import ConfigError
from adora_openrlhf.registry import Registry

# Config (section advantage)


@dataclass
class AdvantageConfig:
    """Group baseline / advantage estimator (see ``algorithms/advantages.py`` for the formulas)."""

    estimator: str = option(
        "group_norm",
        "a group estimator (algorithms.advantages.ADVANTAGE_ESTIMATORS: group_norm, dr_grpo, rloo, "
        "reinforce_baseline) or a token estimator (algorithms.token_advantages.TOKEN_ESTIMATORS: gae = PPO with a "
        "critic, reinforce = REINFORCE++)",
    )
    eps: float = option(1e-9, "added to the group std by group_norm (OpenRLHF 0.11 uses 1e-9)")
    gamma: float = option(
        1.0,
        "gae and reinforce: discount of the per-token rewards, in [0, 1] (OpenRLHF's --algo.advantage.gamma, "
        "default 1); group estimators use undiscounted rewards (1 only)",
    )
    lambd: float = option(
        1.0,
        "gae: GAE's lambda, in [0, 1] (OpenRLHF 0.11.2's --algo.advantage.lambd, default 1; 0.95 is the "
        "PPO papers' usual value); other estimators: 1 only",
    )

    def __post_init__(self) -> None:
        check_field_types(self, "advantage")
        if self.estimator not in TOKEN_ESTIMATORS and self.estimator not in ADVANTAGE_ESTIMATORS:
            names = sorted([*ADVANTAGE_ESTIMATORS.names(), *TOKEN_ESTIMATORS.names()])
            raise ConfigError.about("advantage.estimator", choice_problem("advantage estimator", self.estimator, names))
        check_number(self.eps, "advantage.eps", ge=0)
        check_number(self.gamma, "advantage.gamma", ge=0, le=1)
        check_number(self.lambd, "advantage.lambd", ge=0, le=1)
        require(
            self.gamma == 1.0 or self.estimator in TOKEN_ESTIMATORS,
            "advantage.gamma",
            f"the group estimator {self.estimator!r} uses undiscounted rewards; leave gamma at 1 or use "
            f"--advantage.estimator gae or reinforce",
        )
        require(
            self.lambd == 1.0 or self.estimator == "gae",
            "advantage.lambd",
            f"GAE's lambda applies to advantage.estimator gae only (got {self.estimator!r}); leave it at 1",
        )

    @property
    def token_level(self) -> bool:
        """True for a token estimator (``gae``, ``reinforce``): its baseline is a critic or the batch, not the group."""
        return self.estimator in TOKEN_ESTIMATORS


RewardsLike = torch.Tensor | Sequence[torch.Tensor]


@dataclass(frozen=True)
class PoolStats:
    """Reward statistics of a larger pool per group (adaptive sampling): the baseline comes from here.

    count[g] responses in the pool of group g, their mean[g] and unbiased std[g] (0 when count is 1).
    """

    count: torch.Tensor  # [G] long
    mean: torch.Tensor  # [G] float
    std: torch.Tensor  # [G] float

    def __post_init__(self) -> None:
        shapes = {tuple(self.count.shape), tuple(self.mean.shape), tuple(self.std.shape)}
        if len(shapes) != 1 or self.count.dim() != 1:
            raise ValueError(f"PoolStats: count, mean and std must be 1-D of one length, got shapes {sorted(shapes)}")
        if bool((self.count < 1).any()):
            raise ValueError("PoolStats.count: every pool must hold at least one reward")

    @staticmethod
    def from_rewards(pools: Sequence[Sequence[float]]) -> PoolStats:
        """Statistics of explicit per-group reward lists."""
        if len(pools) == 0:
            empty = torch.zeros(0)
            return PoolStats(count=empty.long(), mean=empty, std=empty)
        if any(len(p) == 0 for p in pools):
            raise ValueError("PoolStats.from_rewards: a pool is empty; every group needs at least one reward")
        tensors = [torch.as_tensor(list(p), dtype=torch.float64) for p in pools]
        mean = torch.stack([t.mean() for t in tensors])
        std = torch.stack([t.std() if t.numel() > 1 else t.new_zeros(()) for t in tensors])
        count = torch.tensor([t.numel() for t in tensors], dtype=torch.long)
        return PoolStats(count=count, mean=mean.float(), std=std.float())


@dataclass(frozen=True)
class GroupStats:
    """Per-group diagnostics returned with the advantages."""

    mean: torch.Tensor  # [G] baseline mean used (pool mean when pool statistics were given)
    std: torch.Tensor  # [G] std used (pool std when given); 0 for groups of one
    zero_signal: torch.Tensor  # [G] bool: every advantage in the group is exactly 0

    @property
    def zero_signal_fraction(self) -> float:
        return float(self.zero_signal.float().mean()) if self.zero_signal.numel() else 0.0


# name -> fn(rewards [G, n], mask [G, n] bool, stats: _Moments, eps) -> advantages [G, n]
Estimator = Callable[[torch.Tensor, torch.Tensor, "_Moments", float], torch.Tensor]
ADVANTAGE_ESTIMATORS: Registry[Estimator] = Registry("advantage estimator", "advantage.estimator")


def register_estimator(*names: str) -> Callable[[Estimator], Estimator]:
    """Register an estimator function under one or more names."""
    return ADVANTAGE_ESTIMATORS.register(*names)


@dataclass(frozen=True)
class _Moments:
    count: torch.Tensor  # [G, 1] float
    mean: torch.Tensor  # [G, 1]
    std: torch.Tensor  # [G, 1]


@register_estimator("group_norm")
def group_norm(rewards: torch.Tensor, mask: torch.Tensor, m: _Moments, eps: float) -> torch.Tensor:
    """A_i = (r_i - mean) / (std + eps)."""
    return (rewards - m.mean) / (m.std + eps)


@register_estimator("dr_grpo", "reinforce_baseline")
def mean_baseline(rewards: torch.Tensor, mask: torch.Tensor, m: _Moments, eps: float) -> torch.Tensor:
    """A_i = r_i - mean."""
    return rewards - m.mean


@register_estimator("rloo")
def rloo(rewards: torch.Tensor, mask: torch.Tensor, m: _Moments, eps: float) -> torch.Tensor:
    """A_i = r_i - (sum - r_i) / (count - 1); 0 where count is 1."""
    total = m.mean * m.count
    others = (m.count - 1).clamp(min=1)
    adv = rewards - (total - rewards) / others
    return torch.where(m.count > 1, adv, torch.zeros_like(adv))


def _as_padded(rewards: RewardsLike) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Dense [G, n] tensor (mask None) or padded [G, n_max] tensor plus validity mask for ragged input."""
    if isinstance(rewards, torch.Tensor):
        if rewards.dim() != 2:
            raise ValueError(f"rewards: expected shape [num_prompts, n], got {tuple(rewards.shape)}")
        if rewards.shape[1] == 0:
            raise ValueError("rewards: a group is empty (n = 0); every prompt needs at least one response")
        return rewards, None
    groups = [torch.as_tensor(g) for g in rewards]
    for i, g in enumerate(groups):
        if g.dim() != 1 or g.numel() == 0:
            raise ValueError(
                f"rewards[{i}]: each ragged group must be a non-empty 1-D tensor, got shape {tuple(g.shape)}"
            )
    if not groups:
        return torch.zeros(0, 1), torch.zeros(0, 1, dtype=torch.bool)
    width = max(g.numel() for g in groups)
    dtype = torch.promote_types(groups[0].dtype, torch.float32)
    padded = torch.zeros(len(groups), width, dtype=dtype)
    mask = torch.zeros(len(groups), width, dtype=torch.bool)
    for i, g in enumerate(groups):
        padded[i, : g.numel()] = g.to(dtype)
        mask[i, : g.numel()] = True
    return padded, mask


def _group_moments(rewards: torch.Tensor, mask: torch.Tensor | None) -> _Moments:
    """Mean and unbiased std over each row (masked when ragged); std 0 for single-element groups."""
    if mask is None:
        n = rewards.shape[1]
        mean = rewards.mean(-1, keepdim=True)
        std = rewards.std(-1, keepdim=True) if n > 1 else torch.zeros_like(mean)
        count = torch.full_like(mean, float(n))
        return _Moments(count=count, mean=mean, std=std)
    maskf = mask.to(rewards.dtype)
    count = maskf.sum(-1, keepdim=True)
    mean = (rewards * maskf).sum(-1, keepdim=True) / count.clamp(min=1)
    var = (((rewards - mean) * maskf) ** 2).sum(-1, keepdim=True) / (count - 1).clamp(min=1)
    std = torch.where(count > 1, var.sqrt(), torch.zeros_like(var))
    return _Moments(count=count, mean=mean, std=std)


def _uniform_rows(rewards: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return rewards.max(-1).values == rewards.min(-1).values
    big = torch.finfo(rewards.dtype).max
    hi = torch.where(mask, rewards, torch.full_like(rewards, -big)).max(-1).values
    lo = torch.where(mask, rewards, torch.full_like(rewards, big)).min(-1).values
    return hi == lo


def compute_group_advantages(
    rewards: RewardsLike, estimator: str = "group_norm", eps: float = 1e-9, pool_stats: PoolStats | None = None
) -> tuple[torch.Tensor | list[torch.Tensor], GroupStats]:
    """Advantages per response and per-group statistics.

    Args:
        rewards: [G, n] tensor, or a list of G non-empty 1-D tensors (ragged groups).
        estimator: a name in :data:`ADVANTAGE_ESTIMATORS`.
        eps: group_norm's std offset.
        pool_stats: optional statistics of a larger pool per group (adaptive sampling). When given, the
            baseline mean, the std of group_norm and rloo's leave-one-out sum come from the pool, which
            must contain the group's own rewards.

    Returns:
        (advantages, stats): advantages with the input's layout (tensor or list), and :class:`GroupStats`.
        A group gets all-zero advantages when its rewards and (if given) its pool are uniform.
    """
    estimate = ADVANTAGE_ESTIMATORS.get(estimator)  # an unknown name: one error naming advantage.estimator
    padded, mask = _as_padded(rewards)
    if not torch.is_floating_point(padded):
        padded = padded.float()
    num_groups = padded.shape[0]
    if pool_stats is None:
        moments = _group_moments(padded, mask)
        uniform = _uniform_rows(padded, mask)
    else:
        if pool_stats.count.shape[0] != num_groups:
            raise ValueError(
                f"pool_stats: has {pool_stats.count.shape[0]} groups but rewards have {num_groups}; pass one pool per prompt group"
            )
        sizes = mask.sum(-1) if mask is not None else torch.full((num_groups,), padded.shape[1])
        if bool((pool_stats.count < sizes).any()):
            raise ValueError(
                "pool_stats.count: a pool is smaller than its group; the pool must contain the group's own responses"
            )
        moments = _Moments(
            count=pool_stats.count.to(padded.dtype).unsqueeze(-1),
            mean=pool_stats.mean.to(padded.dtype).unsqueeze(-1),
            std=pool_stats.std.to(padded.dtype).unsqueeze(-1),
        )
        # Uniform only if the kept rewards equal the pool mean and the pool has no spread.
        uniform = _uniform_rows(padded, mask) & (moments.std.squeeze(-1) == 0)
    full_mask = mask if mask is not None else torch.ones_like(padded, dtype=torch.bool)
    adv = estimate(padded, full_mask, moments, eps)
    adv = torch.where(uniform.unsqueeze(-1), torch.zeros_like(adv), adv)
    adv = torch.where(full_mask, adv, torch.zeros_like(adv))
    zero_signal = ((adv == 0) | ~full_mask).all(-1)
    stats = GroupStats(mean=moments.mean.squeeze(-1), std=moments.std.squeeze(-1), zero_signal=zero_signal)
    if mask is None:
        return adv, stats
    return [adv[i, : int(mask[i].sum())] for i in range(num_groups)], stats


def broadcast_to_tokens(advantages: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """Token-level advantages: A_i on every response token of sample i, 0 on padding.

    advantages: [B]; action_mask: [B, T] (1 for response tokens). Returns [B, T].
    """
    if advantages.dim() != 1 or action_mask.dim() != 2 or advantages.shape[0] != action_mask.shape[0]:
        raise ValueError(
            f"broadcast_to_tokens: expected advantages [B] and action_mask [B, T], got {tuple(advantages.shape)} and {tuple(action_mask.shape)}"
        )
    return advantages.unsqueeze(-1) * action_mask.to(advantages.dtype)
