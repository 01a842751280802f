"""ADORA: classify each prompt group as advantageous or not and reweight its advantages.

Every group g of responses gets one class:

- TAS (temporarily advantageous sample): its advantages are amplified in ``amplify`` mode;
- TDS (temporarily disadvantageous sample): its advantages are attenuated in ``attenuate`` mode;
- neutral: keeps weight 1 in both modes (the length rule's groups with no correct response).

Weights:  attenuate: w = lambda_att for TDS, 1 otherwise;   amplify: w = lambda_amp for TAS, 1 otherwise.
Then A_i <- w_g * A_i for every response of the group. Weights are positive, so signs never change.

Rules (registry :data:`GROUP_RULES`):

``length`` (the reference implementation): correct_i = r_i > correct_threshold; counted incorrect
responses are the incorrect ones that were not truncated (when ``drop_truncated_negatives``; a response is
truncated when the engine says so or, with ``truncation_length`` set, when L_i >= truncation_length).
max_pos = max length of correct responses, mean_neg = mean length of counted incorrect responses.
With both present: max_pos > mean_neg -> TAS, otherwise TDS. The two reference codes differ on the edge
groups; ``edge_policy`` (registry :data:`EDGE_POLICIES`) picks one:

    group                                   ``vlm`` (OpenRLHF VLM code)   ``llm`` (verl LLM code)
    no correct response                     neutral (weight 1)            TDS (max_pos = -inf)
    correct, no counted incorrect response  TDS (mean_neg = +inf)         TAS (mean_neg = -inf)

``difficulty``: p = fraction of correct responses; TAS when 0 < p <= tau, TDS otherwise.

Optional ``length_shaping`` (reference LLM code, off by default) shifts rewards before normalisation:
in TAS groups each correct response gets r += s * beta * (2u - 1), u = (L - min) / max(max - min, 1e-6)
over the group's correct responses (as the reference: u = 0 when they all have one length, so the shift is
-beta in hard groups and +beta in easy ones), s = +1 in hard groups (#correct < n*p), s = -1 in easy groups
(#correct >= n*(1-p)), no shift otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from adora_openrlhf.config_checks import check_choice, check_field_types, check_number, option
from adora_openrlhf.registry import Registry

# Config (section adora)

ADORA_MODES = ("attenuate", "amplify")


@dataclass
class AdoraConfig:
    """ADORA advantage reweighting (see ``algorithms/adora.py``).

    Every prompt group is classed as temporarily advantageous (TAS), disadvantageous (TDS) or neutral (the
    length rule's groups with no correct response under ``edge_policy="vlm"``). ``attenuate`` multiplies TDS advantages by
    ``lambda_att``; ``amplify`` multiplies TAS advantages by ``lambda_amp``. Neutral groups keep weight 1.
    """

    enabled: bool = option(False, "off = plain estimator output, untouched")
    rule: str = option(
        "length", 'group classification rule: one of algorithms.adora.GROUP_RULES ("length", "difficulty")'
    )
    mode: str = option(
        "attenuate", '"attenuate" (TDS *= lambda_att; the reference code) or "amplify" (TAS *= lambda_amp)'
    )
    lambda_att: float = option(0.1, "attenuation factor for TDS groups, in (0, 1]")
    lambda_amp: float = option(2.0, "amplification factor for TAS groups, >= 1 (paper constant unverified; tune it)")
    tau: float = option(0.5, "difficulty rule: TAS when 0 < group accuracy <= tau")
    correct_threshold: float = option(0.5, "a response is correct when reward > this (1.0 for the Logic-RL K&K reward)")
    drop_truncated_negatives: bool = option(True, "length rule: incorrect responses that hit the limit are not counted")
    edge_policy: str = option(
        "vlm",
        "length rule edge groups, one of algorithms.adora.EDGE_POLICIES: 'vlm' (no correct -> weight 1, "
        "correct but no counted incorrect -> TDS) or 'llm' (no correct -> TDS, correct but no counted incorrect -> TAS)",
    )
    truncation_length: int | None = option(
        None,
        "length rule: a response of at least this many tokens counts as truncated (the LLM reference: 3900 of 4096); None = only the engine's flag",
    )
    length_shaping: bool = option(False, "reference LLM option: shift correct rewards by length before normalising")
    shaping_beta: float = option(0.5, "length shaping magnitude: shift = +-beta * (2u - 1)")
    shaping_p: float = option(0.5, "length shaping: hard group if #correct < n*p, easy if #correct >= n*(1-p)")

    def __post_init__(self) -> None:
        check_field_types(self, "adora")
        EDGE_POLICIES.check(self.edge_policy)
        if self.truncation_length is not None:
            check_number(self.truncation_length, "adora.truncation_length", integer=True, ge=1)
        GROUP_RULES.check(self.rule)
        check_choice(self.mode, ADORA_MODES, "adora.mode", "mode")
        check_number(self.lambda_att, "adora.lambda_att", gt=0, le=1)  # weights only scale, never flip
        check_number(self.lambda_amp, "adora.lambda_amp", ge=1)
        check_number(self.tau, "adora.tau", gt=0, le=1)
        check_number(self.correct_threshold, "adora.correct_threshold")
        check_number(self.shaping_beta, "adora.shaping_beta", ge=0)
        check_number(self.shaping_p, "adora.shaping_p", gt=0, le=1)


TAS, TDS, NEUTRAL = 1, -1, 0

# name -> fn(correct [G,n] bool, lengths [G,n] float, counted_negative [G,n] bool, valid [G,n] bool, cfg) -> class [G] long
GroupRule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, "AdoraConfig"], torch.Tensor]
GROUP_RULES: Registry[GroupRule] = Registry("ADORA rule", "adora.rule")


def register_rule(name: str) -> Callable[[GroupRule], GroupRule]:
    """Register a group classification rule returning TAS (1), TDS (-1) or NEUTRAL (0) per group."""
    return GROUP_RULES.register(name)


# name -> fn(has_correct [G] bool, has_counted_negative [G] bool, common-case class [G] long) -> class [G] long
EdgePolicy = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
EDGE_POLICIES: Registry[EdgePolicy] = Registry("edge policy", "adora.edge_policy")
# OpenRLHF-based VLM reference: no correct -> neutral; correct without counted incorrect -> TDS
EDGE_POLICIES.add(
    "vlm", lambda has_pos, has_neg, common: torch.where(has_pos, torch.where(has_neg, common, TDS), NEUTRAL)
)
# verl-based LLM reference: no correct -> TDS; correct without counted incorrect -> TAS
EDGE_POLICIES.add("llm", lambda has_pos, has_neg, common: torch.where(has_pos, torch.where(has_neg, common, TAS), TDS))


@register_rule("length")
def length_rule(correct, lengths, counted_negative, valid, cfg) -> torch.Tensor:
    """TAS when max length of correct responses > mean length of counted incorrect ones; edge groups by
    ``cfg.edge_policy``."""
    neg_inf = torch.full_like(lengths, float("-inf"))
    max_pos = torch.where(correct & valid, lengths, neg_inf).max(-1).values
    neg = (counted_negative & valid).to(lengths.dtype)
    neg_count = neg.sum(-1)
    mean_neg = (lengths * neg).sum(-1) / neg_count.clamp(min=1)
    common = torch.where(max_pos > mean_neg, TAS, TDS)
    return EDGE_POLICIES.get(cfg.edge_policy)((correct & valid).any(-1), neg_count > 0, common).long()


@register_rule("difficulty")
def difficulty_rule(correct, lengths, counted_negative, valid, cfg) -> torch.Tensor:
    """TAS when the group accuracy p satisfies 0 < p <= tau (hard but solvable), TDS otherwise."""
    n = valid.sum(-1).clamp(min=1).to(torch.float64)
    p = (correct & valid).sum(-1).to(torch.float64) / n
    return torch.where((p > 0) & (p <= cfg.tau), TAS, TDS).long()


@dataclass(frozen=True)
class AdoraResult:
    """Per-group ADORA output."""

    weights: torch.Tensor  # [G] float, > 0
    group_class: torch.Tensor  # [G] long: 1 TAS, -1 TDS, 0 neutral
    num_correct: torch.Tensor  # [G] long

    def metrics(self, prefix: str = "adora/") -> dict[str, float]:
        """Scalars to log: TAS/TDS/neutral fractions, fraction of groups left at weight 1, mean weight."""
        g = max(self.weights.numel(), 1)
        return {
            f"{prefix}tas_fraction": float((self.group_class == TAS).sum()) / g,
            f"{prefix}tds_fraction": float((self.group_class == TDS).sum()) / g,
            f"{prefix}neutral_fraction": float((self.group_class == NEUTRAL).sum()) / g,
            f"{prefix}weight_one_fraction": float((self.weights == 1).sum()) / g,
            f"{prefix}mean_weight": float(self.weights.float().mean()) if self.weights.numel() else 1.0,
            f"{prefix}mean_correct_per_group": float(self.num_correct.float().mean())
            if self.num_correct.numel()
            else 0.0,
        }


def _validate(rewards: torch.Tensor, lengths: torch.Tensor, **optional: torch.Tensor | None) -> None:
    if rewards.dim() != 2:
        raise ValueError(f"rewards: expected shape [num_prompts, n], got {tuple(rewards.shape)}")
    if rewards.shape[1] == 0:
        raise ValueError("rewards: a group is empty (n = 0)")
    if lengths.shape != rewards.shape:
        raise ValueError(f"lengths: shape {tuple(lengths.shape)} does not match rewards {tuple(rewards.shape)}")
    for name, t in optional.items():
        if t is not None and t.shape != rewards.shape:
            raise ValueError(f"{name}: shape {tuple(t.shape)} does not match rewards {tuple(rewards.shape)}")


def classify_groups(
    rewards: torch.Tensor,
    lengths: torch.Tensor,
    cfg: AdoraConfig,
    correct: torch.Tensor | None = None,
    truncated: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(group class [G] long, number of correct responses [G] long) under ``cfg.rule``.

    rewards, lengths, correct, truncated, valid: [G, n]; ``correct`` defaults to rewards > correct_threshold,
    ``truncated`` to all False, ``valid`` (mask for ragged groups) to all True.
    """
    _validate(rewards, lengths, correct=correct, truncated=truncated, valid=valid)
    rule = GROUP_RULES.get(cfg.rule)
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
    correct = (rewards > cfg.correct_threshold) if correct is None else correct.bool()
    truncated = torch.zeros_like(correct) if truncated is None else truncated.bool()
    if cfg.truncation_length is not None:
        truncated = truncated | (lengths >= cfg.truncation_length)
    counted_negative = ~correct & (~truncated if cfg.drop_truncated_negatives else torch.ones_like(correct))
    classes = rule(correct, lengths.to(torch.float64), counted_negative, valid, cfg)
    return classes, (correct & valid).sum(-1)


def adora_weights(
    rewards: torch.Tensor,
    lengths: torch.Tensor,
    cfg: AdoraConfig,
    correct: torch.Tensor | None = None,
    truncated: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
) -> AdoraResult:
    """Per-group weights: attenuate -> lambda_att on TDS groups; amplify -> lambda_amp on TAS groups.

    With ``cfg.enabled`` False every weight is 1 (classes are still computed for logging).
    """
    classes, num_correct = classify_groups(rewards, lengths, cfg, correct=correct, truncated=truncated, valid=valid)
    weights = torch.ones(classes.shape, dtype=torch.float32)
    if cfg.enabled:
        if cfg.mode == "attenuate":
            weights = torch.where(classes == TDS, torch.tensor(cfg.lambda_att, dtype=torch.float32), weights)
        else:
            weights = torch.where(classes == TAS, torch.tensor(cfg.lambda_amp, dtype=torch.float32), weights)
    return AdoraResult(weights=weights, group_class=classes, num_correct=num_correct)


def apply_group_weights(advantages: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """A_i <- w_g * A_i for advantages [G, n] and weights [G] (all > 0)."""
    if advantages.dim() != 2 or weights.shape != advantages.shape[:1]:
        raise ValueError(
            f"apply_group_weights: expected advantages [G, n] and weights [G], got {tuple(advantages.shape)} and {tuple(weights.shape)}"
        )
    if bool((weights <= 0).any()):
        raise ValueError("weights: ADORA weights must be > 0 so that advantages keep their sign")
    return advantages * weights.to(advantages.dtype).unsqueeze(-1)


def length_shaped_rewards(
    rewards: torch.Tensor,
    lengths: torch.Tensor,
    cfg: AdoraConfig,
    correct: torch.Tensor | None = None,
    truncated: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rewards after the optional length shaping of the reference LLM code (see module docstring)."""
    _validate(rewards, lengths, correct=correct, truncated=truncated)
    length_cfg = cfg if cfg.rule == "length" else _with_rule(cfg, "length")
    classes, num_correct = classify_groups(rewards, lengths, length_cfg, correct=correct, truncated=truncated)
    correct = (rewards > cfg.correct_threshold) if correct is None else correct.bool()
    n = rewards.shape[1]
    lengths_f = lengths.to(rewards.dtype if torch.is_floating_point(rewards) else torch.float32)
    inf = torch.full_like(lengths_f, float("inf"))
    lo = torch.where(correct, lengths_f, inf).min(-1, keepdim=True).values
    hi = torch.where(correct, lengths_f, -inf).max(-1, keepdim=True).values
    span = hi - lo
    u = (lengths_f - lo) / span.clamp(min=1e-6)  # the reference's clamp: 0 when the correct lengths are equal
    hard = num_correct.to(torch.float64) < n * cfg.shaping_p
    easy = num_correct.to(torch.float64) >= n * (1 - cfg.shaping_p)
    sign = torch.where(hard, 1.0, torch.where(easy, -1.0, 0.0)).to(lengths_f.dtype)
    sign = torch.where(classes == TAS, sign, torch.zeros_like(sign))
    shift = sign.unsqueeze(-1) * cfg.shaping_beta * (2 * u - 1)
    return rewards + torch.where(correct, shift, torch.zeros_like(shift)).to(rewards.dtype)


def _with_rule(cfg: AdoraConfig, rule: str) -> AdoraConfig:
    import dataclasses

    return dataclasses.replace(cfg, rule=rule)
