"""The rollout allocation benchmark's report: ``table.md`` (the means per variant, the runs' cost in core-hours
(:func:`benchmark_cost`), the goal, the paired records against GRPO and against each matched reference), from the
analysis of ``bench/allocation_analysis.py``; its plots are ``bench/plots.py``'s."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from bench.allocation_analysis import (
    CONFIRMATORY_SEEDS,
    GOAL_FRACTION,
    PLATEAU_EVALS,
    REFERENCE,
    TRUNCATED_REFERENCES,
    VARIANTS,
    unit_label,
)
from bench.common import markdown_table, mean_ci


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def _effect(rec: Mapping[str, Any]) -> str:
    if rec["scale"] == "log_ratio":
        return f"{_fmt(rec.get('ratio'), '.2f')}x [{_fmt(rec.get('ratio_low'), '.2f')}, {_fmt(rec.get('ratio_high'), '.2f')}]"
    return f"{_fmt(rec['mean_diff'], '+.3f')} [{_fmt(rec['ci_low'], '+.3f')}, {_fmt(rec['ci_high'], '+.3f')}]"


def _wtl(rec: Mapping[str, Any]) -> str:
    undetermined = rec.get("undetermined") or []
    extra = f" (+{len(undetermined)} undetermined)" if undetermined else ""
    return f"{rec['wins']}/{rec['ties']}/{rec['losses']}{extra}"


def _goal_table(goal: Sequence[Mapping[str, Any]], reference: str = REFERENCE) -> str:
    def seeds(key: str, g: Mapping[str, Any]) -> str:
        return " ".join(map(str, g[key])) or "none"

    label = {reference: f"{reference} (its own curve)"}
    return markdown_table(
        ["variant", "final: reached", "seeds", "plateau: reached", "seeds"],
        [[label.get(g["variant"], g["variant"]), f"{g['reached']} of {g['n']}", seeds("seeds_reached", g),
          f"{g['reached_plateau']} of {g['n']}", seeds("seeds_reached_plateau", g)] for g in goal],
    )  # fmt: skip


def _goal_test_table(goal: Sequence[Mapping[str, Any]], reference: str = REFERENCE) -> str:
    """The goal's two readings (:func:`goal_records`) per variant: ratio [95% CI], sign-flip and t p (Holm), met."""

    def cells(g: Mapping[str, Any], reading: str) -> list[str]:
        k = f"goal_{reading}_"
        if k + "ratio" not in g:
            return ["", "", "", ""]
        undetermined = f" (+{g[k + 'undetermined']} undetermined)" if g[k + "undetermined"] else ""
        ratio = (
            f"{_fmt(g[k + 'ratio'], '.2f')}x [{_fmt(g[k + 'ratio_low'], '.2f')}, {_fmt(g[k + 'ratio_high'], '.2f')}]"
        )
        sf, t = (f"{_fmt(g[k + p], '.4f')} ({_fmt(g.get(k + p + '_holm'), '.4f')})" for p in ("p_sign_flip", "p_value"))
        if g["variant"] == reference:
            met = ""
        elif g[k + "met"]:
            met = "yes"
        elif g[k + "pilot"]:
            met = "pilot"
        else:
            met = "no (loss at equal budget)" if g["loss_at_equal_budget"] else "no"
        return [ratio + undetermined, sf, t, met]

    label = {reference: f"{reference} (its own curve)"}
    return markdown_table(
        ["variant", f"tokens to final / {reference}'s total", "p sign-flip (Holm)", "p t (Holm)", "met",
         f"tokens to final / {reference}'s tokens to it", "p sign-flip (Holm)", "p t (Holm)", "met"],
        [[label.get(g["variant"], g["variant"]), *cells(g, "total"), *cells(g, "reach")] for g in goal],
    )  # fmt: skip


def benchmark_cost(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What the benchmark's runs cost, per variant and in all (last row, variant ``"all"``): ``runs``, and
    ``core_h`` = sum over runs of (``eval_s`` + ``train_s``) / 3600, the held-out evaluations and RL steps each run
    timed on its one torch thread; ``timed`` counts the runs that carry both times (a cut, or a record made before
    the times were logged, carries none and adds nothing). Warm-ups are not records and not counted."""
    rows = []
    for v in [*dict.fromkeys(r["variant"] for r in records), "all"]:
        mine = [r for r in records if v in ("all", r["variant"])]
        timed = [r for r in mine if r.get("eval_s") is not None and r.get("train_s") is not None]
        core_s = sum(r["eval_s"] + r["train_s"] for r in timed)
        rows.append({"variant": v, "runs": len(mine), "timed": len(timed), "core_h": core_s / 3600})
    return rows


def _cost_table(records: Sequence[Mapping[str, Any]], lanes: int = 2) -> list[str]:
    rows = benchmark_cost(records)
    total = rows[-1]
    cells = [
        [
            r["variant"],
            str(r["runs"]),
            f"{r['core_h']:.1f}",
            f"{60 * r['core_h'] / r['timed']:.0f}" if r["timed"] else "n/a",
        ]
        for r in rows
    ]
    return [
        f"The benchmark's cost: {total['core_h']:.1f} core-hours of held-out evaluation and RL steps over "
        f"{total['runs']} runs ({total['core_h'] / lanes:.1f} h with {lanes} runs at a time; warm-ups, one per seed "
        "and machine, are not counted; a run that was paused or shared its core with more work than its lane counts "
        "at its measured time):",
        "",
        markdown_table(["variant", "runs", "core-hours", "per run, min"], cells),
        "",
    ]


def _paired_table(paired: Sequence[Mapping[str, Any]], reference: str = REFERENCE) -> str:
    header = ["metric", "variant", "n", "effect [95% CI]", "wins/ties/losses", f"censored (variant/{reference})",
              "p sign-flip", "Holm", "p t", "Holm", "established"]  # fmt: skip
    rows = [
        [r["metric"], r["variant"], str(r["n"]), _effect(r), _wtl(r), f"{r['censored_variant']}/{r['censored_reference']}",
         _fmt(r["p_sign_flip"], ".4f"), _fmt(r["p_sign_flip_holm"], ".4f"), _fmt(r["p_value"], ".4f"), _fmt(r["p_value_holm"], ".4f"),
         "pilot" if r.get("pilot") else "yes" if r["established"] else "no"]
        for r in paired
    ]  # fmt: skip
    return markdown_table(header, rows)


def _matched_sections(matched: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]]) -> list[str]:
    lines = []
    for ref, block in matched.items():
        variants = ", ".join(dict.fromkeys(r["variant"] for r in block["paired"]))
        if ref in TRUNCATED_REFERENCES:
            source, last_step = TRUNCATED_REFERENCES[ref]
            what = f"{source}'s runs up to step {last_step}"
        else:
            what = "GRPO with " + ", ".join(f"{k}={v}" for k, v in VARIANTS.get(ref, {}).items())
        lines += ["", f"## Against {ref} ({what}): {variants} paired with it", "",
                  _goal_table(block["goal"], ref), "", _goal_test_table(block["goal"], ref), "",
                  _paired_table(block["paired"], ref)]  # fmt: skip
    return lines


def report(
    records: Sequence[Mapping[str, Any]],
    paired: Sequence[Mapping[str, Any]],
    goal: Sequence[Mapping[str, Any]],
    settings: Mapping[str, Any],
    matched: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]] | None = None,
    runs: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """table.md: per variant the means over seeds, the cost of ``runs`` (every run made; default ``records``), the
    goal, every paired record against GRPO, then the same against each matched reference
    (:func:`matched_comparisons`)."""
    variants = list(dict.fromkeys(r["variant"] for r in records))
    rows = []
    for v in variants:
        mine = [r for r in records if r["variant"] == v]

        def cell(key: str, spec: str = ".3f", runs=mine) -> str:
            m, h = mean_ci(r[key] for r in runs)
            return "n/a" if math.isnan(m) else f"{format(m, spec)} ± {format(h, spec)}"

        rows.append(
            [v, " ".join(str(unit_label(r)) for r in sorted(mine, key=lambda r: r["seed"])), cell("acc_step0"), cell("acc_final"), cell("tokens_total", ".0f"),
             cell("responses_total", ".0f"), cell("zero_signal_second_half", ".2f"), cell("eval_s", ".0f"), cell("train_s", ".0f")]
        )  # fmt: skip
    header = [
        "variant",
        "seeds",
        "step-0 accuracy",
        "final accuracy",
        "tokens generated",
        "responses",
        "zero-signal groups, 2nd half",
        "eval s",
        "RL step s",
    ]
    lines = [
        f"# Rollout allocation: recipe {settings['recipe']}, seeds {settings['seeds']}",
        "",
        "Means over each variant's own runs ± 95% interval (Student t); a unit `seed/fingerprint` names the weights of "
        "its warm start (a plain seed: records made before fingerprints; a seed whose GRPO run a fingerprinted warm "
        "start repeats exactly is counted once, under that fingerprint), and warm starts made on different machines "
        "differ, so variants run on other units are compared by the paired tables, not by these means. "
        "`tokens_to_X` is a ratio to GRPO (< 1: fewer tokens); a run that never "
        "reaches X counts at its whole budget (censored); a seed whose sign censoring leaves open is undetermined "
        f"(d = 0 in the mean and tests). `ref_plateau` is the mean of GRPO's last {PLATEAU_EVALS} evaluations of the "
        "seed. `acc_at_N` compares accuracy at N% of GRPO's tokens. "
        f"Established = sign-flip and t both below 0.05 after Holm over the variants run on at least "
        f"{CONFIRMATORY_SEEDS} seeds; a variant on fewer seeds is a pilot (raw p-values, no Holm).",
        "",
        markdown_table(header, rows),
        "",
        *_cost_table(records if runs is None else runs),
        f"The goal, GRPO's final accuracy of the seed reached within {GOAL_FRACTION}x GRPO's tokens (at an evaluation), "
        "and the same for GRPO's plateau, counted per seed:",
        "",
        _goal_table(goal),
        "",
        "The goal as a test, in two readings: a variant's tokens to GRPO's final accuracy of the seed over GRPO's total "
        "tokens (the goal as worded; GRPO's own row shows how far GRPO's curve meets it by itself), and over GRPO's own "
        f"tokens to that accuracy (a saving at equal accuracy). Geometric means over seeds; tested against {GOAL_FRACTION} "
        f"(log ratio less ln {GOAL_FRACTION}), Holm over the variants on at least {CONFIRMATORY_SEEDS} seeds. Met = "
        f"below {GOAL_FRACTION}x, both adjusted p below 0.05, and no established loss of accuracy at 100% of GRPO's "
        "tokens:",
        "",
        _goal_test_table(goal),
        "",
        _paired_table(paired),
        *_matched_sections(matched or {}),
    ]
    return "\n".join(lines)
