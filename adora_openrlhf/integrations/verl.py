"""ADORA as verl advantage estimators (verl 0.9.1 ``register_adv_est``), on top of verl's GRPO estimator.

verl calls a registered estimator from ``ray_trainer.compute_advantage`` as
``fn(token_level_rewards=..., response_mask=..., config=AlgoConfig, index=uid array)``. :func:`adora_grpo_advantage`
has that signature (plus verl's GRPO ``epsilon`` and ``norm_adv_by_std_in_grpo``) and computes, per group of
responses sharing a ``uid``:

    r_i = sum_t token_level_rewards[i, t],   L_i = sum_t response_mask[i, t]
    A_i = (r_i - mean(r)) / (std(r) + epsilon)      (norm_adv_by_std_in_grpo; else A_i = r_i - mean(r): Dr. GRPO)
    A_i <- w_g * A_i                                 (ADORA's weight of the group: algorithms/adora.py)
    advantages[i, t] = A_i * response_mask[i, t]     (returned twice: advantages and returns, as verl's GRPO)

through the core's :func:`compute_step_advantages`: with ADORA off this is verl's GRPO (unbiased std, epsilon
1e-6) except two conventions of the core: a group whose scores are all equal gets 0 exactly, and a group of one
response gets 0 (verl gives it ``r / (1 + epsilon)``). Groups of different sizes are computed size by size.
A response counts as truncated when ``L_i >= adora.truncation_length`` (set it to the rollout's
``response_length``, or 3900 of 4096 as the ADORA reference does); ``norm_adv_by_std_in_grpo`` is read from verl's
``AlgoConfig`` when it is given.

Registration (verl is imported only here): :func:`register_adora_estimators` registers named estimators, each with
its own :class:`AdoraConfig`; by default ``adora_grpo`` (length rule, attenuate, the verl-based LLM reference's
edge cases), ``adora_grpo_amplify`` and ``adora_grpo_difficulty``. verl computes advantages in its trainer, a Ray
actor: register there with Ray's worker setup hook, e.g. on verl's command line::

    algorithm.adv_estimator=adora_grpo \\
    +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=adora_openrlhf.integrations.verl.setup_hook \\
    +ray_kwargs.ray_init.runtime_env.env_vars.ADORA_VERL_ESTIMATORS='{"adora_grpo": {"correct_threshold": 1.0}}'

:func:`setup_hook` registers the defaults, each updated with the fields given for its name in the JSON of
``ADORA_VERL_ESTIMATORS`` (a new name starts from ``adora_grpo``'s settings).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from adora_openrlhf.algorithms.pipeline import GroupBatch, compute_step_advantages
from adora_openrlhf.config import AdoraConfig, AdvantageConfig
from adora_openrlhf.errors import ConfigError

VERL_GRPO_EPSILON = 1e-6  # verl's compute_grpo_outcome_advantage default
ENV_VAR = "ADORA_VERL_ESTIMATORS"

# name -> ADORA settings registered by default (the verl-based LLM reference: length rule, edge_policy "llm")
DEFAULT_ESTIMATORS: dict[str, dict[str, Any]] = {
    "adora_grpo": {"enabled": True, "rule": "length", "mode": "attenuate", "edge_policy": "llm"},
    "adora_grpo_amplify": {"enabled": True, "rule": "length", "mode": "amplify", "edge_policy": "llm"},
    "adora_grpo_difficulty": {"enabled": True, "rule": "difficulty", "mode": "attenuate"},
}


def _groups(index: Sequence[Any]) -> list[list[int]]:
    """Row numbers of each group (rows sharing an index value), groups in order of first appearance."""
    groups: dict[Any, list[int]] = {}
    for row, key in enumerate(index):
        groups.setdefault(key.item() if hasattr(key, "item") else key, []).append(row)
    return list(groups.values())


def adora_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    epsilon: float = VERL_GRPO_EPSILON,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    *,
    adora: AdoraConfig,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's GRPO outcome advantage with ADORA's group weights (module docstring); ``(advantages, returns)``, both
    ``[batch, response_length]``."""
    if token_level_rewards.shape != response_mask.shape or token_level_rewards.dim() != 2:
        shapes = f"{tuple(token_level_rewards.shape)} and {tuple(response_mask.shape)}"
        raise ValueError(f"token_level_rewards: must have response_mask's shape [batch, length], got {shapes}")
    if len(index) != token_level_rewards.shape[0]:
        raise ValueError(f"index: {len(index)} group ids for {token_level_rewards.shape[0]} responses")
    if config is not None and hasattr(config, "get"):
        norm_adv_by_std_in_grpo = config.get("norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo)
    advantage_cfg = AdvantageConfig(estimator="group_norm" if norm_adv_by_std_in_grpo else "dr_grpo", eps=epsilon)
    scores = token_level_rewards.detach().sum(-1).float().cpu()
    lengths = response_mask.detach().sum(-1).float().cpu()
    by_size: dict[int, list[list[int]]] = {}
    for group in _groups(index):
        by_size.setdefault(len(group), []).append(group)
    advantages = torch.zeros_like(scores)
    with torch.no_grad():
        for size, groups in by_size.items():
            rows = torch.tensor([row for group in groups for row in group])
            batch = GroupBatch(rewards=scores[rows].view(-1, size), lengths=lengths[rows].view(-1, size))
            advantages[rows] = compute_step_advantages(batch, advantage_cfg, adora).advantages.reshape(-1)
    token_advantages = advantages.to(device=response_mask.device, dtype=torch.float32).unsqueeze(-1) * response_mask
    return token_advantages, token_advantages


def make_estimator(adora: AdoraConfig) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """An estimator with verl's signature bound to ``adora``'s settings."""

    def estimator(
        token_level_rewards,
        response_mask,
        index=None,
        epsilon=VERL_GRPO_EPSILON,
        norm_adv_by_std_in_grpo=True,
        config=None,
        **kwargs,
    ):
        if index is None:
            raise ValueError(
                "index: ADORA's estimators group responses by uid; verl passes data.non_tensor_batch['uid'] as index"
            )
        return adora_grpo_advantage(
            token_level_rewards, response_mask, index, epsilon, norm_adv_by_std_in_grpo, config, adora=adora, **kwargs
        )

    estimator.adora = adora  # type: ignore[attr-defined]
    return estimator


def adora_config(fields: Mapping[str, Any], name: str = "adora_grpo") -> AdoraConfig:
    """An :class:`AdoraConfig` from ``fields`` (its field names); an unknown field is a ConfigError naming ``name``."""
    known = {f.name for f in dataclasses.fields(AdoraConfig)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ConfigError(f"{ENV_VAR}[{name!r}]: unknown ADORA field(s) {unknown}; valid: {sorted(known)}")
    return AdoraConfig(**dict(fields))


def register_adora_estimators(
    estimators: Mapping[str, AdoraConfig | Mapping[str, Any]] | None = None,
) -> dict[str, Callable[..., Any]]:
    """Register each ``name -> ADORA settings`` with verl's ``register_adv_est`` (default :data:`DEFAULT_ESTIMATORS`);
    returns the registered functions. Registering a name again replaces the earlier settings."""
    try:
        from verl.trainer.ppo import core_algos
    except ImportError as err:
        raise ImportError(
            "adora_openrlhf.integrations.verl: verl is not installed (pip install verl==0.9.1; see docs/integrations.md)"
        ) from err
    registered = {}
    for name, settings in (estimators if estimators is not None else DEFAULT_ESTIMATORS).items():
        cfg = settings if isinstance(settings, AdoraConfig) else adora_config(settings, name)
        fn = make_estimator(cfg)
        core_algos.ADV_ESTIMATOR_REGISTRY.pop(name, None)  # verl refuses a second function under one name
        core_algos.register_adv_est(name)(fn)
        registered[name] = fn
    return registered


def estimators_from_env(environ: Mapping[str, str] | None = None) -> dict[str, AdoraConfig]:
    """The defaults, each updated with the fields ``ADORA_VERL_ESTIMATORS`` (JSON: name -> fields) gives for it."""
    text = (environ if environ is not None else os.environ).get(ENV_VAR, "").strip()
    try:
        given = json.loads(text) if text else {}
    except json.JSONDecodeError as err:
        raise ConfigError(
            f'{ENV_VAR}: not valid JSON ({err.msg}); write e.g. \'{{"adora_grpo": {{"correct_threshold": 1.0}}}}\''
        ) from None
    if not isinstance(given, dict) or not all(isinstance(v, dict) for v in given.values()):
        raise ConfigError(
            f'{ENV_VAR}: must map estimator names to ADORA fields, e.g. \'{{"adora_grpo": {{"correct_threshold": 1.0}}}}\''
        )
    names = {**DEFAULT_ESTIMATORS, **{k: {} for k in given if k not in DEFAULT_ESTIMATORS}}
    return {
        name: adora_config(
            {**DEFAULT_ESTIMATORS.get(name, DEFAULT_ESTIMATORS["adora_grpo"]), **given.get(name, {})}, name
        )
        for name in names
    }


def setup_hook() -> None:
    """Ray's ``worker_process_setup_hook``: register ADORA's estimators in every Ray worker (verl's trainer actor)."""
    register_adora_estimators(estimators_from_env())
