"""Token-level advantage estimators with a batch baseline: PPO's ``gae`` (a critic) and REINFORCE++'s ``reinforce``.

Unlike the group estimators of ``advantages.py`` the baseline is not the prompt's group but a critic (``gae``) or
the whole batch (``reinforce``), and advantages differ from token to token. Registry :data:`TOKEN_ESTIMATORS`;
:func:`compute_token_advantages` runs one. Every tensor is ``[B, T]`` with ``mask`` 1 on response tokens (the
actions), 0 on prompt positions and padding; ``rewards`` are ``[B]``. The formulas are OpenRLHF 0.11.2's
(``RemoteExperienceMaker.compute_advantages_and_returns``, ``get_advantages_and_returns``,
``get_cumulative_returns``, ``openrlhf.models.utils.compute_reward``):

Token rewards (:func:`token_rewards`): the scalar reward on the last response token, minus an optional per-token
KL penalty::

    r_t = r * [t = last response token] - kl_coef * KL_t

``gae`` (values V_t of the critic, masked to 0 outside the response; V_{T} = 0 after the last token)::

    delta_t = r_t + gamma * V_{t+1} - V_t
    A_t     = delta_t + gamma * lambd * A_{t+1}          (generalised advantage estimation)
    R_t     = A_t + V_t                                  (the critic's value targets, "returns")

``reinforce`` (REINFORCE++)::

    G_t = r_t + gamma * G_{t+1}                          (discounted cumulative return; also the returns)
    A_t = G_t

Batch whitening (:func:`whiten`), over the valid tokens of the whole batch, as OpenRLHF does after either::

    mu = sum_t m_t A_t / sum_t m_t,   var = sum_t m_t (A_t - mu)^2 / sum_t m_t   (biased, as OpenRLHF)
    A_t <- (A_t - mu) / sqrt(max(var, 1e-8))

A batch whose advantages are all equal gives 0 (never NaN: the variance is clamped). Padding tokens get 0 (OpenRLHF
leaves ``-mu / std`` there, which its masked loss never reads).

ADORA's weight w_i of response i (its group's weight, ``algorithms/adora.py``; 1 without ADORA) lands where
ALGORITHMS.md section 6 puts it:

- ``gae``: ``A_t <- w_i * A_t`` right after GAE, **before** the batch whitening. Whitening is one affine map over
  the whole batch, so a group damped 10x before it stays damped 10x relative to the others after it: the weights
  keep their relative effect, and the batch still has mean 0 and variance 1;
- ``reinforce``: ``A_t <- w_i * A_t`` **after** the batch normalisation (the weight multiplies the normalised
  advantage).

The returns R_t (the critic's targets) are never weighted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from adora_openrlhf.registry import Registry

WHITEN_MIN_VAR = 1e-8  # OpenRLHF's clamp of the batch variance


@dataclass(frozen=True)
class TokenAdvantages:
    """A token estimator's output, both ``[B, T]`` and 0 outside the response mask."""

    advantages: torch.Tensor  # the policy's per-token advantages (ADORA's weights applied)
    returns: torch.Tensor  # value targets of the critic (gae) or discounted returns (reinforce); never weighted


@dataclass(frozen=True)
class TokenParams:
    """Settings of a token estimator: discount ``gamma``, GAE's ``lambd``, and whether the whitening divides by
    the batch std (``std_norm``; OpenRLHF's ``--algo.advantage.no_std_norm`` turns it off)."""

    gamma: float = 1.0
    lambd: float = 1.0
    std_norm: bool = True


# name -> fn(token rewards [B, T], mask [B, T], values [B, T] or None, weights [B], params) -> TokenAdvantages
TokenEstimator = Callable[
    [torch.Tensor, torch.Tensor, "torch.Tensor | None", torch.Tensor, TokenParams], TokenAdvantages
]
TOKEN_ESTIMATORS: Registry[TokenEstimator] = Registry("token-level advantage estimator", "advantage.estimator")

# the estimators that need a critic's values
CRITIC_ESTIMATORS = ("gae",)


def register_token_estimator(name: str) -> Callable[[TokenEstimator], TokenEstimator]:
    """Register a token-level estimator (its ADORA weights are applied by the estimator itself)."""
    return TOKEN_ESTIMATORS.register(name)


def token_rewards(
    rewards: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None, kl_coef: float = 0.0
) -> torch.Tensor:
    """``[B, T]``: reward ``r_i`` on the last response token of row i, minus ``kl_coef * kl`` on every token (OpenRLHF's
    ``compute_reward`` without its reward clip); 0 outside the mask."""
    maskf = mask.to(torch.promote_types(rewards.dtype, torch.float32))
    last = mask.shape[1] - 1 - mask.long().fliplr().argmax(dim=1, keepdim=True)
    out = torch.zeros_like(maskf).scatter_(1, last, rewards.to(maskf.dtype).unsqueeze(1))
    out = out * (mask.sum(-1, keepdim=True) > 0)  # a row without response tokens gets no reward
    if kl is not None and kl_coef > 0:
        out = out - kl_coef * kl.to(maskf.dtype)
    return out * maskf


def gae_advantages_and_returns(
    values: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, gamma: float, lambd: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, R) of generalised advantage estimation (module docstring), each ``[B, T]``, 0 outside ``mask``."""
    maskf = mask.to(rewards.dtype)
    values, rewards = values.to(rewards.dtype) * maskf, rewards * maskf
    last = torch.zeros_like(rewards[:, 0])
    reversed_advantages = []
    for t in reversed(range(rewards.shape[1])):
        next_values = values[:, t + 1] if t < rewards.shape[1] - 1 else 0.0
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        last = delta + gamma * lambd * last
        reversed_advantages.append(last)
    advantages = torch.stack(reversed_advantages[::-1], dim=1)
    return advantages * maskf, (advantages + values) * maskf


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = r_t + gamma * G_{t+1}`` over each row, ``[B, T]``, 0 outside ``mask``."""
    maskf = mask.to(rewards.dtype)
    rewards = rewards * maskf
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns * maskf


def whiten(advantages: torch.Tensor, mask: torch.Tensor, std_norm: bool = True) -> torch.Tensor:
    """Batch whitening over the valid tokens (module docstring), in float32 or wider as OpenRLHF; 0 outside ``mask``."""
    adv = advantages.to(torch.promote_types(advantages.dtype, torch.float32))
    maskf = mask.to(adv.dtype)
    count = maskf.sum()
    if count == 0:
        return torch.zeros_like(adv)
    mean = (adv * maskf).sum() / count
    out = adv - mean
    if std_norm:
        var = ((adv - mean).pow(2) * maskf).sum() / count
        out = out * var.clamp(min=WHITEN_MIN_VAR).rsqrt()
    return out * maskf


def _per_token(weights: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return weights.to(like.dtype).unsqueeze(-1)


@register_token_estimator("gae")
def gae(rewards, mask, values, weights, params: TokenParams) -> TokenAdvantages:
    """PPO: GAE, then A_t <- w_i * A_t, then batch whitening; returns R_t = A_t + V_t unweighted."""
    if values is None:
        raise ValueError("values: the gae estimator needs the critic's values [B, T]")
    advantages, returns = gae_advantages_and_returns(values, rewards, mask, params.gamma, params.lambd)
    weighted = advantages * _per_token(weights, advantages)
    return TokenAdvantages(whiten(weighted, mask, params.std_norm), returns)


@register_token_estimator("reinforce")
def reinforce(rewards, mask, values, weights, params: TokenParams) -> TokenAdvantages:
    """REINFORCE++: discounted returns, batch whitening, then A_t <- w_i * A_t; returns G_t unweighted."""
    returns = discounted_returns(rewards, mask, params.gamma)
    normalised = whiten(returns, mask, params.std_norm)
    return TokenAdvantages(normalised * _per_token(weights, normalised), returns)


def compute_token_advantages(
    estimator: str,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    params: TokenParams | None = None,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> TokenAdvantages:
    """Advantages and returns of token estimator ``estimator`` (registry :data:`TOKEN_ESTIMATORS`).

    Args:
        rewards: ``[B]`` scalar reward per response (placed on its last response token).
        mask: ``[B, T]`` 1 on response tokens.
        values: ``[B, T]`` critic values (``gae``; ignored by ``reinforce``).
        weights: ``[B]`` ADORA weight of each response (its group's weight), > 0; None = all 1.
        params: gamma, lambd, std_norm (:class:`TokenParams`).
        kl, kl_coef: optional per-token KL ``[B, T]`` subtracted from the token rewards, times ``kl_coef``.
    """
    estimate = TOKEN_ESTIMATORS.get(estimator)
    if rewards.dim() != 1 or mask.dim() != 2 or mask.shape[0] != rewards.shape[0]:
        raise ValueError(
            f"compute_token_advantages: expected rewards [B] and mask [B, T], got {tuple(rewards.shape)} and {tuple(mask.shape)}"
        )
    for name, t in (("values", values), ("kl", kl)):
        if t is not None and t.shape != mask.shape:
            raise ValueError(f"{name}: shape {tuple(t.shape)} does not match mask {tuple(mask.shape)}")
    weights = torch.ones(rewards.shape[0]) if weights is None else weights
    if weights.shape != rewards.shape:
        raise ValueError(f"weights: expected [B] = {tuple(rewards.shape)}, got {tuple(weights.shape)}")
    if bool((weights <= 0).any()):
        raise ValueError("weights: ADORA weights must be > 0 so that advantages keep their sign")
    per_token = token_rewards(rewards, mask, kl, kl_coef)
    return estimate(per_token, mask, values, weights, params or TokenParams())


def token_estimator_problem(
    estimator: str, n_keep: int, adora_enabled: bool, sampling_enabled: bool, length_shaping: bool
) -> tuple[str, str] | None:
    """(field, message) of the first setting a run with token estimator ``estimator`` cannot take, or None:
    with n = 1 (``sampling.n_keep``) there is no group, so ADORA (which classes groups) and the adaptive sampler
    (which keeps n per prompt) are refused; ADORA's length shaping shifts rewards before a group normalisation
    that these estimators do not have. Not a token estimator: None."""
    if estimator not in TOKEN_ESTIMATORS:
        return None
    if n_keep < 2 and adora_enabled:
        return (
            "adora.enabled",
            f"advantage.estimator {estimator!r} with sampling.n_keep 1 has no group for ADORA to class; raise "
            "--sampling.n_keep to 2 or more, or --adora.enabled false",
        )
    if n_keep < 2 and sampling_enabled:
        return (
            "sampling.enabled",
            f"advantage.estimator {estimator!r} with sampling.n_keep 1 keeps one response per prompt, so the adaptive "
            "sampler has no group to balance; raise --sampling.n_keep to 2 or more, or --sampling.enabled false",
        )
    if adora_enabled and length_shaping:
        return (
            "adora.length_shaping",
            f"shifts rewards before a group normalisation, which advantage.estimator {estimator!r} does not have; "
            "drop --adora.length_shaping or use a group estimator",
        )
    return None
