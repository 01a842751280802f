"""Token-level policy loss: PPO clipped surrogate, k3 KL to a reference, and loss aggregation modes.

All functions are pure torch on ``[B, T]`` tensors where ``mask`` is 1 on response tokens (the actions) and
0 on padding. ``log_probs`` are the current policy's per-token log-probabilities, ``old_log_probs`` those of
the policy that generated the rollout, ``advantages`` the per-token advantages (the group advantage
broadcast to every response token).

PPO clip (per token t, ratio ``rho_t = exp(log_probs_t - old_log_probs_t)``)::

    L_t = -min(rho_t * A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) * A_t)

k3 KL estimator of KL(policy || reference) (Schulman's unbiased, non-negative estimator)::

    r_t = ref_log_probs_t - log_probs_t
    KL_t = exp(r_t) - r_t - 1

Aggregation of a per-token quantity ``x`` (registry :data:`LOSS_AGGREGATIONS`):

- ``token_mean`` (DAPO):              sum_{b,t} m x / sum_{b,t} m
- ``seq_mean_token_mean`` (GRPO):     mean_b ( sum_t m x / sum_t m )
- ``seq_mean_token_sum_norm`` (Dr. GRPO): mean_b ( sum_t m x ) / T_norm, with T_norm = the generation
  limit (``max_new_tokens``) or, when not given, the padded length T
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from adora_openrlhf.algorithms.lr_schedules import LR_SCHEDULES
from adora_openrlhf.config_checks import check_field_types, check_number, option
from adora_openrlhf.registry import Registry

# Config (section train)


@dataclass
class PolicyLossConfig:
    """Token-level PPO-clip objective with optional KL to a frozen reference."""

    lr: float = option(1e-5, "AdamW learning rate")
    lr_scheduler: str = option(
        "constant",
        "learning-rate schedule over the run's optimiser steps: constant | constant_with_warmup | linear | cosine | "
        "cosine_with_min_lr (OpenRLHF's names and formulas, algorithms/lr_schedules.py)",
    )
    lr_warmup_ratio: float = option(
        0.0, "warm-up share of the optimiser steps (ceil(ratio * steps)); ignored by constant"
    )
    min_lr_ratio: float = option(0.1, "cosine_with_min_lr: the floor, as a fraction of lr")
    weight_decay: float = option(0.0, "AdamW weight decay")
    clip_eps_low: float = option(0.2, "ratio clipped to [1 - clip_eps_low, 1 + clip_eps_high]")
    clip_eps_high: float = option(0.2, "DAPO's clip-higher uses e.g. 0.28")
    kl_coef: float = option(0.0, "> 0 adds kl_coef * KL(policy || reference) (k3 estimator) per token")
    max_grad_norm: float = option(1.0, "gradient clipping")
    ppo_epochs: int = option(1, "passes over each rollout batch")
    micro_batch_size: int = option(8, "responses per forward/backward")
    loss_agg: str = option(
        "token_mean", '"token_mean" (DAPO) | "seq_mean_token_mean" (GRPO paper) | "seq_mean_token_sum_norm" (Dr. GRPO)'
    )

    def __post_init__(self) -> None:
        check_field_types(self, "train")
        check_number(self.lr, "train.lr", gt=0)
        check_number(self.lr_warmup_ratio, "train.lr_warmup_ratio", ge=0, lt=1)
        check_number(self.min_lr_ratio, "train.min_lr_ratio", ge=0, le=1)
        check_number(self.weight_decay, "train.weight_decay", ge=0)
        check_number(self.clip_eps_low, "train.clip_eps_low", gt=0, lt=1)  # 1 - clip_eps_low must stay a positive ratio
        check_number(self.clip_eps_high, "train.clip_eps_high", gt=0)
        check_number(self.kl_coef, "train.kl_coef", ge=0)
        check_number(self.max_grad_norm, "train.max_grad_norm", gt=0)  # 0 would freeze every gradient, < 0 flip it
        check_number(self.ppo_epochs, "train.ppo_epochs", integer=True, ge=1)
        check_number(self.micro_batch_size, "train.micro_batch_size", integer=True, ge=1)
        LOSS_AGGREGATIONS.check(self.loss_agg)
        LR_SCHEDULES.check(self.lr_scheduler)


Aggregator = Callable[[torch.Tensor, torch.Tensor, int | None], torch.Tensor]
LOSS_AGGREGATIONS: Registry[Aggregator] = Registry("loss aggregation", "train.loss_agg")


def register_aggregation(name: str) -> Callable[[Aggregator], Aggregator]:
    """Register an aggregation ``fn(values [B, T], mask [B, T], norm_length) -> scalar``."""
    return LOSS_AGGREGATIONS.register(name)


@register_aggregation("token_mean")
def token_mean(values: torch.Tensor, mask: torch.Tensor, norm_length: int | None = None) -> torch.Tensor:
    """sum(m * x) / sum(m) over the whole batch (every token weighs the same)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


@register_aggregation("seq_mean_token_mean")
def seq_mean_token_mean(values: torch.Tensor, mask: torch.Tensor, norm_length: int | None = None) -> torch.Tensor:
    """Mean over sequences of each sequence's token mean (every sequence weighs the same)."""
    mask = mask.to(values.dtype)
    per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return per_seq.mean()


@register_aggregation("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(values: torch.Tensor, mask: torch.Tensor, norm_length: int | None = None) -> torch.Tensor:
    """Mean over sequences of each sequence's token sum divided by a constant length (Dr. GRPO)."""
    mask = mask.to(values.dtype)
    length = float(norm_length if norm_length is not None else values.shape[-1])
    return ((values * mask).sum(-1) / length).mean()


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str, norm_length: int | None = None) -> torch.Tensor:
    """Reduce per-token ``values`` [B, T] to a scalar with aggregation ``mode``."""
    aggregation = LOSS_AGGREGATIONS.get(mode)
    if values.shape != mask.shape:
        raise ValueError(f"mask: shape {tuple(mask.shape)} does not match values {tuple(values.shape)}")
    return aggregation(values, mask, norm_length)


def ppo_clip_token_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps_low: float,
    clip_eps_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO clipped loss ``-min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A)``.

    Returns ``(loss [B, T], ratio [B, T], clipped [B, T] bool)`` where ``clipped`` marks tokens whose
    clipped term was the active (smaller) one, i.e. tokens that carry no gradient.
    """
    ratio = torch.exp(log_probs - old_log_probs)
    unclipped = ratio * advantages
    clipped_ratio = ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high)
    clipped = clipped_ratio * advantages
    loss = -torch.minimum(unclipped, clipped)
    return loss, ratio, clipped < unclipped


def k3_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference): ``exp(r) - r - 1`` with ``r = ref - policy``; >= 0."""
    log_ratio = ref_log_probs - log_probs
    return torch.exp(log_ratio) - log_ratio - 1.0


@dataclass(frozen=True)
class PolicyLossOutput:
    loss: torch.Tensor  # scalar to backpropagate
    pg_loss: torch.Tensor  # scalar, the aggregated PPO term
    kl: torch.Tensor  # scalar, aggregated k3 KL (0 when no reference)
    clip_fraction: torch.Tensor  # scalar, fraction of response tokens whose clipped term was active
    ratio_mean: torch.Tensor  # scalar, mean ratio over response tokens


def policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    loss_agg: str = "token_mean",
    kl_coef: float = 0.0,
    ref_log_probs: torch.Tensor | None = None,
    norm_length: int | None = None,
) -> PolicyLossOutput:
    """``agg(L_ppo) + kl_coef * agg(KL_k3)``, both aggregated with ``loss_agg`` over the response ``mask``.

    ``advantages`` may be [B] (one value per sequence, broadcast to its tokens) or [B, T].
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(log_probs)
    for name, t in (("old_log_probs", old_log_probs), ("advantages", advantages), ("mask", mask)):
        if t.shape != log_probs.shape:
            raise ValueError(f"{name}: shape {tuple(t.shape)} does not match log_probs {tuple(log_probs.shape)}")
    if kl_coef > 0 and ref_log_probs is None:
        raise ValueError("ref_log_probs: kl_coef > 0 needs the reference model's log-probabilities")
    token_loss, ratio, clipped = ppo_clip_token_loss(log_probs, old_log_probs, advantages, clip_eps_low, clip_eps_high)
    pg = aggregate(token_loss, mask, loss_agg, norm_length)
    if ref_log_probs is not None:
        kl = aggregate(k3_kl(log_probs, ref_log_probs), mask, loss_agg, norm_length)
    else:
        kl = torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)
    total = pg + kl_coef * kl if kl_coef > 0 else pg
    m = mask.to(log_probs.dtype)
    denom = m.sum().clamp(min=1.0)
    return PolicyLossOutput(
        loss=total,
        pg_loss=pg.detach(),
        kl=kl.detach(),
        clip_fraction=((clipped.to(m.dtype) * m).sum() / denom).detach(),
        ratio_mean=((ratio.detach() * m).sum() / denom),
    )
