"""Generation budget of a run: held-out accuracy against the responses and tokens generated so far, and the cost
of reaching an accuracy.

A run's token curve is its record's ``series.acc_vs_tokens``, [(cumulative generated tokens at evaluation e,
accuracy at e), ...]: ``sampling/tokens_generated`` of every RL step (the response tokens of every generated
response, kept or not) summed up to each evaluation (``tokens_source`` ``logged``). The kk-testbed records written
before that count existed (seeds 0-4) carry a curve computed once from the kept responses' mean lengths:
``kept lengths`` where the run kept every response it generated (exact), ``estimate`` where it did not (adaptive
sampling, DAPO refills: responses generated x the kept responses' mean length; bench/results/sample_efficiency/NOTES.md
says how close that came on the runs that logged both).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.common import first_step_reaching

REACH_TOLERANCE = 1e-9  # accuracies are multiples of 1 / num_eval: a run at the threshold reaches it

Curve = Sequence[Sequence[float]]  # [(x, y), ...] as results.json stores it


def token_curve(record: Mapping[str, Any]) -> list[list[float]] | None:
    """The record's ``series.acc_vs_tokens`` (module docstring), or None when it holds none."""
    curve = (record.get("series") or {}).get("acc_vs_tokens")
    return [list(p) for p in curve] if curve else None


def cost_to_reach(curve: Curve | None, threshold: float) -> tuple[float, bool] | None:
    """(budget (x of ``curve`` [(responses or tokens, accuracy)]) at the first evaluation whose accuracy is at least
    ``threshold`` (up to REACH_TOLERANCE), True), or (the curve's whole budget, False) when no evaluation reaches it:
    a censored cost, at least that much; None without a curve."""
    if not curve:
        return None
    reached = first_step_reaching([tuple(p) for p in curve], threshold - REACH_TOLERANCE)
    return (float(reached), True) if reached is not None else (float(curve[-1][0]), False)


def censored_log_ratio(d: float, variant_censored: bool, reference_censored: bool) -> float | None:
    """The log ratio d = ln(cost(variant) / cost(reference)) where censoring leaves its sign known, else None.

    Variant censored (it never reached the target: its cost is at least its whole budget): the true d >= d, so its
    sign is known (a loss) only if d >= 0; reference censored: the true d <= d, known (a win) only if d <= 0; both
    censored: unknown. The known value stays the bound (conservative in size)."""
    if variant_censored and reference_censored:
        return None
    if variant_censored:
        return d if d >= 0 else None
    if reference_censored:
        return d if d <= 0 else None
    return d


def with_tokens(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` with ``tokens`` (the generated tokens of the whole run, or None without a token curve) and
    ``tokens_source`` (``logged`` unless the record names its source; None without a curve)."""
    curve = token_curve(record)
    source = (record.get("tokens_source") or "logged") if curve else None
    return {**record, "tokens": curve[-1][0] if curve else None, "tokens_source": source}
