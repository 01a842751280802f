"""Generation budget of a run: held-out accuracy against the responses and tokens generated so far, and the cost
of reaching an accuracy.

A run's token curve is [(cumulative generated tokens at evaluation e, accuracy at e), ...] from the first of:

- ``logged``: ``sampling/tokens_generated`` of every RL step (the response tokens of every generated response,
  kept or not), summed up to each evaluation step;
- ``kept lengths``: a run that kept every response it generated (``responses`` = RL steps x ``kept_per_step``,
  as plain GRPO and ADORA sampling do) generated sum over steps of kept_per_step x ``response/length_mean``
  tokens, exactly;
- ``estimate``: for a run that generated responses it did not keep (adaptive sampling, DAPO refills) and
  logged no token count (records written before the count existed), the tokens of the evaluation interval
  (e_{k-1}, e_k] are estimated as (responses generated in the interval) x (mean over its steps of the kept
  responses' mean length); the length of the responses that were not kept is unknown, so this is an estimate
  whose error :func:`estimate_error` measures on runs that logged both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.common import first_step_reaching

REACH_TOLERANCE = 1e-9  # accuracies are multiples of 1 / num_eval: a run at the threshold reaches it

SOURCES = ("logged", "kept lengths", "estimate")


Curve = Sequence[Sequence[float]]  # [(x, y), ...] as results.json stores it


def tokens_from_lengths(acc_curve: Curve, responses_curve: Curve, length: Curve) -> list[list[float]] | None:
    """[(tokens, accuracy)] per evaluation from the evaluation steps ``acc_curve`` [(step, acc)], the cumulative
    responses at them ``responses_curve`` [(responses, acc)] and the per-step kept mean length ``length``
    [(step, mean length)]: tokens(e_k) = tokens(e_{k-1}) + (R(e_k) - R(e_{k-1})) x mean{length(s) : e_{k-1} < s <=
    e_k}. None when an interval with responses has no length record (a merged record without per-step series)."""
    if len(acc_curve) != len(responses_curve):
        raise ValueError(
            f"tokens_from_lengths: {len(acc_curve)} evaluation steps but {len(responses_curve)} response counts"
        )
    if not acc_curve:
        return []
    if responses_curve[0][0] != 0:
        return None  # the first evaluation comes after some generation: its token count is unknown
    out = [[0.0, acc_curve[0][1]]]
    for (prev_step, _), (step, acc), (prev_r, _), (r, _) in zip(
        acc_curve, acc_curve[1:], responses_curve, responses_curve[1:], strict=False
    ):
        lengths = [v for s, v in length if prev_step < s <= step]
        if r > prev_r and not lengths:
            return None
        mean_length = sum(lengths) / len(lengths) if lengths else 0.0
        out.append([out[-1][0] + (r - prev_r) * mean_length, acc])
    return out


def token_curve(record: Mapping[str, Any], kept_per_step: int) -> tuple[list[list[float]] | None, str | None]:
    """(curve, source) of a results.json record: its logged ``series.acc_vs_tokens`` when present, else the
    curve from kept lengths, exact (``kept lengths``) when the run kept every response it generated and an
    ``estimate`` otherwise; (None, None) when the record holds neither."""
    series = record.get("series") or {}
    if series.get("acc_vs_tokens"):
        return [list(p) for p in series["acc_vs_tokens"]], "logged"
    if not series.get("acc_vs_responses") or not series.get("length"):
        return None, None
    curve = tokens_from_lengths(record["acc_curve"], series["acc_vs_responses"], series["length"])
    if curve is None:
        return None, None
    rl_steps = len(series.get("length") or [])
    every_response_kept = record.get("responses") is not None and record["responses"] == rl_steps * kept_per_step
    return curve, "kept lengths" if every_response_kept else "estimate"


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


def estimate_error(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """For the runs that logged their tokens, per variant: how far the kept-length estimate is from the count,
    {"runs": k, "mean_ratio": mean of estimate / logged total, "min_ratio", "max_ratio"}; variants whose runs
    logged nothing are left out."""
    ratios: dict[str, list[float]] = {}
    for rec in records:
        series = rec.get("series") or {}
        if not series.get("acc_vs_tokens"):
            continue
        estimate = tokens_from_lengths(
            rec["acc_curve"], series.get("acc_vs_responses") or [], series.get("length") or []
        )
        logged = series["acc_vs_tokens"][-1][0]
        if estimate is None or not logged:
            continue
        ratios.setdefault(rec["variant"], []).append(estimate[-1][0] / logged)
    return {
        v: {"runs": len(r), "mean_ratio": sum(r) / len(r), "min_ratio": min(r), "max_ratio": max(r)}
        for v, r in ratios.items()
    }


def plot_against_reference(
    records: Sequence[Mapping[str, Any]],
    variants: Sequence[str],
    reference: str,
    kept_per_step: int,
    path: Any,
    title: str,
) -> None:
    """One panel per variant other than ``reference``: held-out accuracy against cumulative generated tokens, the
    variant and the reference, each the mean over seeds at every evaluation (x: mean tokens) with a 95% CI band
    of the accuracy (:func:`bench.common.band`). Runs without a token curve are left out of the panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from bench.common import band

    others = [v for v in variants if v != reference]
    cols = min(4, max(1, len(others)))
    rows = max(1, -(-len(others) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False, sharey=True)
    curves = {
        v: [c for r in records if r["variant"] == v for c in [token_curve(r, kept_per_step)[0]] if c] for v in variants
    }
    for ax, variant in zip(axes.flat, others, strict=False):
        for name, colour in ((reference, "tab:gray"), (variant, "tab:blue")):
            if not curves[name]:
                continue
            xs, ys, hs = band([[tuple(p) for p in c] for c in curves[name]])
            ax.plot(xs, ys, marker="o", markersize=3, color=colour, label=f"{name} ({len(curves[name])} seeds)")
            low, high = [y - h for y, h in zip(ys, hs, strict=True)], [y + h for y, h in zip(ys, hs, strict=True)]
            ax.fill_between(xs, low, high, color=colour, alpha=0.2, linewidth=0)
        ax.set_title(f"{variant} vs {reference}", fontsize=10)
        ax.set_xlabel("generated tokens (mean over seeds)")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1e3:.0f}k"))  # 700000 -> 700k: labels stay apart
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    for ax in axes[:, 0]:
        ax.set_ylabel("held-out greedy accuracy")
    for ax in list(axes.flat)[len(others) :]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def with_tokens(record: Mapping[str, Any], kept_per_step: int) -> dict[str, Any]:
    """``record`` with ``tokens`` (generated tokens up to the last evaluation, None without a token curve) and
    ``tokens_source`` (one of SOURCES, or None) from :func:`token_curve`."""
    curve, source = token_curve(record, kept_per_step)
    return {**record, "tokens": curve[-1][0] if curve else None, "tokens_source": source}
