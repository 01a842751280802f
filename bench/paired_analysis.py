"""Paired comparison of every variant with a reference (GRPO) over the seeds both ran, metric by metric.

All variants of a seed start from one warm start, see the same data order and are evaluated on the same
held-out puzzles, so the seed-to-seed spread of the warm starts cancels in the per-seed difference
d_s = metric(variant, s) - metric(reference, s). Per (variant, metric) record (:func:`paired_records`): the d_s,
their mean with the 95% paired-t interval, wins / ties / losses, the paired-t p-value and the exact sign-flip
p-value (``bench/paired_stats.py``), and both Holm-adjusted over the variants of the metric.

Metrics (:func:`paired_metrics`):

- ``acc_final``: held-out greedy accuracy at the last evaluation; ``auc``: area under accuracy vs step over the
  step range; ``acc_final_<subset>``: final accuracy on one held-out subset (K&K: ``ppl_N``, N people);
  differences of accuracies, higher is better;
- ``responses_to_ref_final``, ``tokens_to_ref_final``: responses / tokens generated up to the first evaluation at
  which the run's accuracy reaches the reference's final accuracy of the same seed (``bench/budget.py``). Analysed
  as d_s = ln(cost(variant) / cost(reference)), lower is better; ``ratio`` = exp(mean d) is the geometric-mean
  ratio, with exp of the interval ends. The reference reaches it by construction; a variant that never does is
  counted at its whole budget (``not_reached``), not dropped: a censored cost, so d_s is a bound whose sign is
  known only when it is a loss (d_s >= 0, kept at the bound); otherwise the seed is ``undetermined`` and counts as
  d_s = 0 in the mean and the tests and in no win, tie or loss (``budget.censored_log_ratio``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.budget import Curve, censored_log_ratio, cost_to_reach, token_curve
from bench.common import markdown_table, mean_ci
from bench.paired_stats import holm, paired_t, seeds_for_power, sign_flip_p, wins_ties_losses

Record = Mapping[str, Any]


@dataclass(frozen=True)
class PairedMetric:
    """How to read one metric off a run record: a value (``difference`` scale), or for a cost (``log_ratio`` scale)
    the run's accuracy curve against the budget, whose cost to the reference's final accuracy is compared."""

    description: str
    better: str  # "higher" or "lower"
    scale: str  # "difference": d = v - r; "log_ratio": d = ln(v / r)
    value: Callable[[Record], float | None] | None = None  # a run's value (difference scale)
    curve: Callable[[Record], Curve | None] | None = None  # a run's accuracy against its budget (cost metrics)


def _subset(name: str) -> Callable[[Record], float | None]:
    return lambda rec: (rec.get("acc_final_by_subset") or {}).get(name)


def _responses_curve(rec: Record) -> Curve | None:
    return (rec.get("series") or {}).get("acc_vs_responses")


def paired_metrics(subsets: Sequence[str] = ()) -> dict[str, PairedMetric]:
    """The metrics compared, in table order; one ``acc_final_<subset>`` per held-out subset name."""
    metrics = {
        "acc_final": PairedMetric("final held-out accuracy", "higher", "difference", lambda rec: rec.get("acc_final")),
        "auc": PairedMetric("area under accuracy vs step / steps", "higher", "difference", lambda rec: rec.get("auc")),
    }
    for name in subsets:
        metrics[f"acc_final_{name}"] = PairedMetric(
            f"final held-out accuracy on {name}", "higher", "difference", _subset(name)
        )
    metrics["responses_to_ref_final"] = PairedMetric(
        "responses to reach the reference's final accuracy", "lower", "log_ratio", curve=_responses_curve
    )
    metrics["tokens_to_ref_final"] = PairedMetric(
        "generated tokens to reach the reference's final accuracy", "lower", "log_ratio", curve=token_curve
    )
    return metrics


def _pair(metric: PairedMetric, rec: Record, ref: Record) -> tuple[float | None, str | None]:
    """(d, None) for one seed; (d, "censored"): the variant never reached the reference's final accuracy and d is the
    bound at its whole budget, a known loss; (0.0, "undetermined"): censoring leaves the sign open; (None,
    "undefined"): a value or curve is missing, or a cost is 0 (reached at the start)."""
    if metric.curve is None:
        v, r = metric.value(rec), metric.value(ref)
        return (None, "undefined") if v is None or r is None else (v - r, None)
    mine, theirs = (cost_to_reach(metric.curve(run), ref["acc_final"]) for run in (rec, ref))
    if mine is None or theirs is None or mine[0] <= 0 or theirs[0] <= 0:
        return None, "undefined"
    d = censored_log_ratio(math.log(mine[0] / theirs[0]), not mine[1], not theirs[1])
    if d is None:
        return 0.0, "undetermined"
    return d, None if mine[1] else "censored"


def paired_records(records: Sequence[Record], reference: str = "GRPO", level: float = 0.95) -> list[dict[str, Any]]:
    """One record per (variant, metric), variants in first-seen order, for every variant but ``reference``,
    over the seeds where both ran: {variant, metric, description, better, scale, n, mean_diff, ci_low, ci_high,
    sd_diff, t, wins, ties, losses, not_reached, undetermined, undefined, p_value, p_sign_flip, p_holm,
    p_sign_flip_holm, per_seed} (+ ratio, ratio_ci_low, ratio_ci_high on the log-ratio scale). ``n`` counts the seeds
    in the tests; ``not_reached`` the seeds whose variant run never reached the threshold (cost metrics: counted at
    its whole budget), ``undetermined`` those of them whose sign that leaves open (d = 0 in the tests, in no
    win/tie/loss), ``undefined`` the seeds left out (a missing value, or a cost of 0); ``per_seed`` the d of each
    seed in the tests."""
    runs = {(r["variant"], r["seed"]): r for r in records}
    variants = [v for v in dict.fromkeys(r["variant"] for r in records) if v != reference]
    subsets = sorted({k for r in records for k in (r.get("acc_final_by_subset") or {})})
    out: list[dict[str, Any]] = []
    for name, metric in paired_metrics(subsets).items():
        block = []
        for variant in variants:
            seeds = sorted(s for v, s in runs if v == variant and (reference, s) in runs)
            outcomes = {s: _pair(metric, runs[(variant, s)], runs[(reference, s)]) for s in seeds}
            pairs = {s: d for s, (d, why) in outcomes.items() if why != "undefined"}
            diffs = list(pairs.values())
            test = paired_t(diffs, level)
            decided = [d for d, why in outcomes.values() if why in (None, "censored")]
            wins, ties, losses = wins_ties_losses(decided, metric.better)
            rec: dict[str, Any] = {
                "variant": variant,
                "metric": name,
                "description": metric.description,
                "better": metric.better,
                "scale": metric.scale,
                "n": test.n,
                "mean_diff": test.mean,
                "ci_low": test.ci_low,
                "ci_high": test.ci_high,
                "sd_diff": test.sd,
                "t": test.t,
                "wins": wins,
                "ties": ties,
                "losses": losses,
                "not_reached": sum(1 for _, why in outcomes.values() if why in ("censored", "undetermined")),
                "undetermined": sum(1 for _, why in outcomes.values() if why == "undetermined"),
                "undefined": sum(1 for _, why in outcomes.values() if why == "undefined"),
                "p_value": test.p_value,
                "p_sign_flip": sign_flip_p(diffs) if diffs else None,
                "per_seed": {str(s): d for s, d in pairs.items()},
            }
            if metric.scale == "log_ratio":
                for key, source in (("ratio", "mean_diff"), ("ratio_ci_low", "ci_low"), ("ratio_ci_high", "ci_high")):
                    rec[key] = math.exp(rec[source]) if rec[source] is not None else None
            block.append(rec)
        for key in ("p_value", "p_sign_flip"):
            for rec, adjusted in zip(block, holm([r[key] for r in block]), strict=True):
                rec[key.replace("p_value", "p") + "_holm"] = adjusted
        out.extend(block)
    return out


def _num(x: float | None, digits: int = 3, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def _effect(rec: Record) -> str:
    """``+0.034 [+0.015, +0.053]`` on the difference scale; ``0.82x [0.70, 0.95]`` for cost ratios."""
    if rec["scale"] == "log_ratio":
        return f"{_num(rec.get('ratio'), 2)}x [{_num(rec.get('ratio_ci_low'), 2)}, {_num(rec.get('ratio_ci_high'), 2)}]"
    return f"{_num(rec['mean_diff'], 3, True)} [{_num(rec['ci_low'], 3, True)}, {_num(rec['ci_high'], 3, True)}]"


PAIRED_HEADER = [
    "metric",
    "variant",
    "n",
    "mean diff [95% CI]",
    "wins/ties/losses",
    "not reached (at its budget; undetermined)",
    "p (t)",
    "p Holm",
    "p sign-flip",
    "p sign-flip Holm",
]


def paired_table(paired: Sequence[Record]) -> str:
    """Markdown table of :func:`paired_records`, one row per (metric, variant)."""
    rows = [
        [
            r["metric"],
            r["variant"],
            str(r["n"]),
            _effect(r),
            f"{r['wins']}/{r['ties']}/{r['losses']}",
            f"{r['not_reached']}" + (f" ({r['undetermined']} undetermined)" if r.get("undetermined") else ""),
            _num(r["p_value"], 4),
            _num(r["p_holm"], 4),
            _num(r["p_sign_flip"], 4),
            _num(r["p_sign_flip_holm"], 4),
        ]
        for r in paired
    ]
    return markdown_table(PAIRED_HEADER, rows)


def differences_by_step(records: Sequence[Record], reference: str = "GRPO") -> tuple[list[str], list[list[str]]]:
    """Header and rows: per variant, the mean paired accuracy difference to ``reference`` at each evaluation
    step with its 95% interval half-width (Student t over seeds), steps present in every run."""
    runs = {(r["variant"], r["seed"]): r for r in records}
    steps = sorted(set.intersection(*[{int(s) for s, _ in r["acc_curve"]} for r in records])) if records else []
    rows = []
    for variant in [v for v in dict.fromkeys(r["variant"] for r in records) if v != reference]:
        seeds = sorted(s for v, s in runs if v == variant and (reference, s) in runs)
        mine = {seed: {int(s): a for s, a in runs[(variant, seed)]["acc_curve"]} for seed in seeds}
        theirs = {seed: {int(s): a for s, a in runs[(reference, seed)]["acc_curve"]} for seed in seeds}
        cells = []
        for step in steps:
            m, h = mean_ci(mine[seed][step] - theirs[seed][step] for seed in seeds)
            cells.append(f"{m:+.3f} ± {h:.3f}")
        rows.append([variant, *cells])
    return ["variant", *[f"step {s}" for s in steps]], rows


def power_rows(
    paired: Sequence[Record], metrics: Sequence[str], alpha: float = 0.05, power: float = 0.8
) -> list[dict[str, Any]]:
    """For each (variant, metric in ``metrics``) record with a spread: the seeds a two-sided paired t test at
    alpha / m (Bonferroni over the m variants, the bound Holm's first step uses) needs for ``power`` when the true
    mean difference is the measured one and the per-seed sd the measured one. {variant, metric, n, mean_diff,
    sd_diff, alpha, seeds_needed} (None: no finite number, e.g. mean 0)."""
    family = {m: sum(1 for r in paired if r["metric"] == m) for m in metrics}
    out = []
    for r in paired:
        if r["metric"] not in metrics or not r.get("sd_diff") or r["mean_diff"] is None:
            continue
        level = alpha / family[r["metric"]]
        out.append(
            {
                "variant": r["variant"],
                "metric": r["metric"],
                "n": r["n"],
                "mean_diff": r["mean_diff"],
                "sd_diff": r["sd_diff"],
                "alpha": level,
                "power": power,
                "seeds_needed": seeds_for_power(r["mean_diff"], r["sd_diff"], level, power),
            }
        )
    return out


def eval_noise_bound(accuracy: float, num_eval: int) -> float:
    """Upper bound on the variance that the finite held-out set adds to a paired accuracy difference:
    2 p (1 - p) / N, the variance of the difference of two independent binomial proportions at p over N puzzles.
    Two policies evaluated on the same puzzles err on many of the same ones, which lowers the true value."""
    if num_eval <= 0:
        raise ValueError(f"num_eval: must be > 0, got {num_eval}")
    return 2 * accuracy * (1 - accuracy) / num_eval
