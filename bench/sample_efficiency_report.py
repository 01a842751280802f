"""The tables and plot of ``python -m bench.sample_efficiency``: per-variant means with 95% intervals, the subset
rows, the accuracy plot against generated tokens, and the paired report against :data:`REFERENCE` (per seed,
paired t and exact sign-flip tests with Holm over the variants, the seeds a test would need)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    band,
    fmt_mean_ci,
    markdown_table,
    mean_ci,
)
from bench.paired_analysis import differences_by_step, eval_noise_bound, paired_records, paired_table, power_rows

REFERENCE = "GRPO"  # the variant every other is compared with, seed by seed


def _ratio(value: float | None, reference: float | None) -> str:
    usable = reference and value is not None and not math.isnan(value) and not math.isnan(reference)
    return f" ({value / reference:.2f}x)" if usable else ""


def summarise(records: Sequence[dict[str, Any]]) -> tuple[list[list[str]], dict[str, Any]]:
    """Table rows (variants in first-seen order) and per-variant statistics: {metric: {mean, ci95, n}} with the
    95% Student-t interval over seeds; steps/responses to target only over the runs that reached it."""
    by_variant: dict[str, list[dict]] = {}
    for rec in records:
        by_variant.setdefault(rec["variant"], []).append(rec)
    grpo = by_variant.get("GRPO", [])
    ref_responses = mean_ci(r["responses"] for r in grpo)[0] if grpo else None
    ref_tokens = mean_ci(r.get("tokens") for r in grpo)[0] if grpo else None
    ref_wall = mean_ci(r["wall_s"] for r in grpo)[0] if grpo else None
    keys = (
        "majority_accuracy",
        "acc_step0",
        "acc_final",
        "gain",
        "auc",
        "steps_to_target",
        "responses_to_target",
        "responses",
        "tokens",
        "zero_signal",
        "length_mean",
        "length_first_step",
        "length_final_step",
        "length_std_over_mean_step0",
        "tas_fraction_first20",
        "wall_s",
    )
    rows, stats = [], {}
    for variant, group in by_variant.items():
        group = [{**r, "gain": r["acc_final"] - r["acc_step0"]} for r in group]
        values = {k: [r[k] for r in group if r.get(k) is not None] for k in keys}
        stats[variant] = {
            k: dict(zip(("mean", "ci95"), mean_ci(v) if v else (None, None), strict=True), n=len(v))
            for k, v in values.items()
        }
        stats[variant]["reached_target"] = f"{len(values['steps_to_target'])}/{len(group)}"
        responses, tokens, wall = (
            stats[variant]["responses"]["mean"],
            stats[variant]["tokens"]["mean"],
            stats[variant]["wall_s"]["mean"],
        )
        rows.append(
            [
                variant,
                str(len(group)),
                fmt_mean_ci(values["acc_step0"]),
                fmt_mean_ci(values["acc_final"]),
                fmt_mean_ci(values["gain"]),
                fmt_mean_ci(values["auc"]),
                stats[variant]["reached_target"],
                fmt_mean_ci(values["steps_to_target"], 1),
                fmt_mean_ci(values["responses_to_target"], 0),
                fmt_mean_ci(values["responses"], 0) + _ratio(responses, ref_responses),
                fmt_mean_ci(values["tokens"], 0) + _ratio(tokens, ref_tokens),
                fmt_mean_ci(values["zero_signal"]),
                fmt_mean_ci(values["length_mean"], 1),
                fmt_mean_ci(values["tas_fraction_first20"]),
                fmt_mean_ci(values["wall_s"], 0) + _ratio(wall, ref_wall),
            ]
        )
    return rows, stats


def subset_rows(records: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-subset table: per variant and held-out subset (K&K: number of people), the mean
    accuracy at step 0 and at the last step over seeds, ``step0 -> final``; empty without subsets."""
    names = sorted({k for r in records for k in (r.get("acc_final_by_subset") or {})})
    by_variant: dict[str, list[dict]] = {}
    for rec in records:
        by_variant.setdefault(rec["variant"], []).append(rec)
    rows = []
    for variant, group in by_variant.items():
        cells = []
        for name in names:
            before = [r["acc_step0_by_subset"][name] for r in group if name in (r.get("acc_step0_by_subset") or {})]
            after = [r["acc_final_by_subset"][name] for r in group if name in (r.get("acc_final_by_subset") or {})]
            cells.append(f"{mean_ci(before)[0]:.3f} -> {mean_ci(after)[0]:.3f}" if before and after else "n/a")
        rows.append([variant, *cells])
    return (["variant", *[f"acc {name} (step 0 -> final)" for name in names]] if names else []), (rows if names else [])


HEADER = [
    "variant",
    "seeds",
    "acc step 0",
    "acc final",
    "gain",
    "AUC",
    "reached target",
    "steps to target",
    "responses to target",
    "responses (vs GRPO)",
    "tokens (vs GRPO)",
    "zero-signal frac",
    "resp. length",
    "TAS frac (first 20)",
    "wall s (vs GRPO)",
]


def plot(records: Sequence[dict[str, Any]], variants: Sequence[str], path: Path, title: str) -> None:
    """Accuracy vs steps and vs generated responses, zero-signal fraction and mean length per step: the mean
    over seeds with a 95% CI band, one colour per variant. A panel drawn from fewer runs than the table (merged
    records written before records kept per-step series) names the seeds it shows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    panels = [
        ("acc_vs_step", "RL step", "held-out greedy accuracy"),
        ("acc_vs_responses", "responses generated (mean over seeds)", "held-out greedy accuracy"),
        ("zero_signal", "RL step", "zero-signal group fraction"),
        ("length", "RL step", "mean response length (tokens)"),
    ]
    palette = plt.get_cmap("tab10").colors
    per_run = [(r["variant"], r["seed"], {"acc_vs_step": r["acc_curve"], **r["series"]}) for r in records]
    for ax, (key, xlabel, ylabel) in zip(axes.flat, panels, strict=True):
        for i, variant in enumerate(variants):
            series = [c[key] for v, _, c in per_run if v == variant and c[key]]
            if not series:
                continue
            xs, ys, hs = band(series)
            colour = palette[i % len(palette)]
            ax.plot(xs, ys, label=variant, color=colour, marker="o" if key.startswith("acc") else None, markersize=3)
            ax.fill_between(
                xs,
                [y - h for y, h in zip(ys, hs, strict=True)],
                [y + h for y, h in zip(ys, hs, strict=True)],
                color=colour,
                alpha=0.15,
                linewidth=0,
            )
        shown = sorted({seed for _, seed, c in per_run if c[key]})
        if len(shown) < len({seed for _, seed, _ in per_run}):
            ax.set_title(f"seeds {shown} (the others' records keep no per-step {key})", fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


POWER_METRICS = ("acc_final", "auc", "tokens_to_ref_final")  # the metrics the power table plans for


def paired_report(records: Sequence[dict[str, Any]], num_eval: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The paired records (``bench/paired_analysis.py``) against REFERENCE and the table.md sections built on
    them: the paired table, the accuracy difference per evaluation step, where each run's token count comes
    from, and the seeds a test would need."""
    paired = paired_records(records, REFERENCE)
    p_ref = mean_ci(r["acc_final"] for r in records if r["variant"] == REFERENCE)[0]
    bound = eval_noise_bound(p_ref, num_eval)
    power = power_rows(paired, POWER_METRICS)
    measured = [r["sd_diff"] ** 2 for r in power if r["metric"] == "acc_final"]
    sources: dict[str, dict[str, int]] = {}
    for r in records:
        counts = sources.setdefault(r["variant"], {})
        counts[str(r.get("tokens_source"))] = counts.get(str(r.get("tokens_source")), 0) + 1
    step_header, step_rows = differences_by_step(records, REFERENCE)
    power_table = markdown_table(
        ["variant", "metric", "n", "mean diff", "sd of diff", "alpha", "seeds for 80% power"],
        [
            [
                r["variant"],
                r["metric"] + (" (log ratio)" if r["metric"].endswith("_to_ref_final") else ""),
                str(r["n"]),
                f"{r['mean_diff']:+.4f}",
                f"{r['sd_diff']:.4f}",
                f"{r['alpha']:.4f}",
                str(r["seeds_needed"] if r["seeds_needed"] is not None else "none"),
            ]
            for r in power
        ],
    )
    sources_table = markdown_table(
        ["variant", "token count of the runs"],
        [[v, ", ".join(f"{k}: {n}" for k, n in sorted(c.items()))] for v, c in sources.items()],
    )
    markdown = "\n\n".join(
        [
            f"Paired comparison with {REFERENCE} (per seed: variant - {REFERENCE}; same warm start, data order and held-out puzzles). "
            "Mean difference with its 95% paired-t interval; cost metrics (responses / tokens to reach the reference's final accuracy "
            "of the same seed, at the first evaluation reaching it) as the geometric-mean ratio variant / reference. p: two-sided paired t; "
            "sign-flip: exact permutation over the 2^n sign vectors; Holm over the variants of each metric.",
            paired_table(paired),
            f"Held-out accuracy difference to {REFERENCE} by evaluation step (mean ± 95% CI half-width over seeds):",
            markdown_table(step_header, step_rows),
            "Generated tokens per run: `logged` (sampling/tokens_generated); runs recorded before that count carry a curve computed once "
            "from their kept responses' lengths, `kept lengths` (every response kept: exact) or `estimate` (responses x the kept mean length; "
            "bench/budget.py):",
            sources_table,
            "Seeds a two-sided paired t test at 0.05 / (number of variants) would need for 80% power if the measured mean difference and "
            "sd were the true ones:",
            power_table,
            f"The finite held-out set adds at most 2p(1-p)/N = {bound:.5f} (p = {p_ref:.3f}, N = {num_eval}) to the variance of a final-accuracy "
            f"difference (independent errors; two policies scored on the same puzzles share many, which lowers it); the measured variances "
            f"are {min(measured, default=float('nan')):.5f} to {max(measured, default=float('nan')):.5f}. The records keep aggregate accuracies "
            "only, so the part of the spread a larger held-out set would remove cannot be told from the run-to-run part here.",
        ]
    )
    payload = {"alpha": "0.05 / variants (two-sided)", "power": 0.8, "eval_var_bound_acc_final": bound, "rows": power}
    return paired, {"markdown": markdown, "power": payload}
