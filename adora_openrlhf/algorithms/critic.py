"""The critic's objective for ``advantage.estimator gae``: a clipped value loss, as OpenRLHF 0.11.2's ``ValueLoss``.

Per response token t, with V_t the critic's current value, V_t^old the value it gave when the step's advantages were
computed, and R_t the GAE return (``token_advantages.gae_advantages_and_returns``; never weighted by ADORA)::

    V_t^clip = V_t^old + clip(V_t - V_t^old, -value_clip, value_clip)
    L_t      = max((V_t^clip - R_t)^2, (V_t - R_t)^2)         (value_clip None: L_t = (V_t - R_t)^2)
    loss     = 0.5 * sum_t m_t L_t / sum_t m_t                 (token mean over the response tokens)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from adora_openrlhf.config_checks import check_field_types, check_number, option

# Config (section critic)


@dataclass
class CriticConfig:
    """The value model trained beside the policy when ``advantage.estimator`` is ``gae`` (local backend): the
    policy's architecture with a scalar value head, its own AdamW optimiser, trained on each step's GAE returns."""

    lr: float = option(1e-5, "critic AdamW learning rate (OpenRLHF's --critic.adam.lr: 9e-6)")
    weight_decay: float = option(0.0, "critic AdamW weight decay")
    max_grad_norm: float = option(1.0, "critic gradient clipping (global norm)")
    value_clip: float | None = option(
        0.5,
        "values move at most this far from the step's old values inside the loss (OpenRLHF's "
        "--critic.value_clip, default 0.5); None = unclipped squared error",
    )
    epochs: int = option(1, "critic passes over each step's responses")
    warm_start: bool = option(
        True,
        "initialise the critic's transformer from the policy after the warm-up (value head random, "
        "std 1/(hidden+1) as OpenRLHF's); false = the policy's architecture at random init",
    )

    def __post_init__(self) -> None:
        check_field_types(self, "critic")
        check_number(self.lr, "critic.lr", gt=0)
        check_number(self.weight_decay, "critic.weight_decay", ge=0)
        check_number(self.max_grad_norm, "critic.max_grad_norm", gt=0)
        check_number(self.value_clip, "critic.value_clip", gt=0, also=(None,))
        check_number(self.epochs, "critic.epochs", integer=True, ge=1)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    value_clip: float | None = 0.5,
) -> torch.Tensor:
    """The clipped value loss of the module docstring (a scalar); all inputs ``[B, T]``."""
    if value_clip is not None:
        clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
        per_token = torch.max((clipped - returns) ** 2, (values - returns) ** 2)
    else:
        per_token = (values - returns) ** 2
    maskf = mask.to(per_token.dtype)
    return 0.5 * (per_token * maskf).sum() / maskf.sum().clamp(min=1.0)
