"""Rollout allocation benchmark: does a method reach GRPO's held-out accuracy for fewer generated tokens?

``python -m bench.allocation [--recipe kk-revisit] [--seeds 0 1 2] [--variants ...] [--workers 2] [--report-only]
[--out bench/results/allocation]``

Per seed the recipe's supervised warm-up runs once (``bench/common.py`` :func:`warm_start_dir`); every variant of the
seed starts RL from it, with the same data order and the same held-out puzzles, and changes only the method
(:data:`VARIANTS`). Finished runs are read back, interrupted ones resumed (``run_training`` with ``reuse``), so
the benchmark can be run in pieces; ``--report-only`` analyses the finished runs only.

A run is its curve of held-out greedy accuracy against cumulative generated tokens (every response generated,
kept or not; ``sampling/tokens_generated``), evaluated every ``eval_every`` steps. Paired per seed against GRPO
(:func:`paired_metric_records`):

- ``tokens_to_<target>``: tokens generated until the first evaluation at or above the target, as
  d = ln(cost(variant) / cost(GRPO)); targets are GRPO's final accuracy of the seed (``ref_final``), GRPO's plateau
  of the seed (``ref_plateau``: the mean of its last :data:`PLATEAU_EVALS` evaluations, steadier than one evaluation)
  and fixed accuracies. A run that never reaches a target is **censored at its whole budget** (its cost is at least
  that much), counted in ``censored`` and never dropped: with the variant censored the log ratio is a lower bound,
  with GRPO censored an upper bound. Where the bound leaves the sign open (the variant censored below GRPO's cost,
  GRPO censored above the variant's, or both censored) the seed is **undetermined**: it enters the tests as d = 0
  (no evidence either way, as in Gehan's scoring of censored pairs) and is counted apart, never as a win or loss;
- ``acc_at_<f>``: accuracy at f = 25 / 50 / 100 % of GRPO's total tokens of the seed, linearly interpolated along
  the run's curve (a run that stopped before that budget keeps its last accuracy), as a difference;
- ``acc_at_50pct_vs_ref_final``: accuracy at 50 % of GRPO's tokens minus GRPO's final accuracy (the goal's
  question as a difference: >= 0 where half the tokens buy GRPO's final accuracy);
- ``acc_final`` (difference) and ``tokens_total`` (log ratio).

The goal itself, GRPO's final accuracy of the seed reached at an evaluation within :data:`GOAL_FRACTION` of GRPO's
tokens, is counted per variant (:func:`goal_records`: reached on k of n seeds, which seeds), and so is the same
question for GRPO's plateau. It is also tested, in two readings (:data:`GOAL_READINGS`): the tokens to GRPO's final
accuracy over GRPO's total tokens (the goal as worded: a GRPO at its final accuracy early meets it by itself, so
GRPO's own curve gets the same test) and over GRPO's own tokens to that accuracy (a saving at equal accuracy); each
per seed as a log ratio less ln(GOAL_FRACTION), sign-flip and t with Holm, "met" where below the fraction, both
established, and no loss of accuracy at equal budget established.

A variant that changes GRPO's training settings besides the allocation is also paired with GRPO under those
settings (:data:`MATCHED_REFERENCES`, :func:`matched_comparisons`, Holm over the variants of each reference); a
constant-rate reference also stands as its own runs cut after step 40 (:data:`TRUNCATED_REFERENCES`,
:func:`truncated_record`): the equal-budget control of the half-budget variants, without a run of its own.

Records accumulate: ``results.json`` keeps every finished run's record, and a later invocation (another machine, a
fresh checkout without the run folders) reads them back (:func:`stored_records`) instead of running them again, as
long as the recipe and the variant's settings are the ones stored; ``--variants`` and ``--seeds`` choose what to
run, and the report covers every record of the recipe. The local backend is deterministic on one machine (one torch
thread), but a warm start made on another machine can differ: each new record carries the
fingerprint of its warm start's weights (``warm_start``, :func:`warm_start_fingerprint`), runs pair only with a GRPO
run of the same seed and warm start (:func:`paired_runs`; records from before fingerprints pair by seed, and join
the fingerprint whose GRPO run repeats theirs exactly, :func:`merge_repeated_units`, so a unit is counted once), and a
variant run on a new warm start brings a GRPO run on it. A unit whose variants still disagree at step 0 is named in
the table (:func:`warm_start_mismatches`).

Tests: the exact sign-flip test (primary) and the paired t test beside it, each Holm-adjusted over the variants of
the metric (``bench/paired_stats.py``); a difference is **established** only where both adjusted p-values are below
0.05. The Holm family is the variants run on at least :data:`CONFIRMATORY_SEEDS` paired seeds; a variant on fewer
is a pilot, shown with its raw p-values, never established and not diluting the family.

Writes ``results.json`` (per-run records, ``paired`` records and ``goal`` records), ``table.md`` (with the runs'
cost in core-hours, :func:`benchmark_cost`) and ``curves.png`` (accuracy against tokens, each seed a thin line, the
mean over seeds in bold).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

from bench.common import (
    FROM_WARM_START,
    RunSpec,
    load_run,
    markdown_table,
    mean_ci,
    run_pool,
    run_training,
    setting_differences,
    warm_start_dir,
    write_json,
)
from bench.paired_stats import holm, paired_t, sign_flip_p, wins_ties_losses

REFERENCE = "GRPO"
_ADORA = {"adora.enabled": True, "adora.mode": "attenuate", "adora.edge_policy": "llm"}
_KNAPSACK_HALF = {"allocation.method": "knapsack", "allocation.candidates": 2, "allocation.budget": 0.5}
_COSINE = {"train.lr_scheduler": "cosine"}
_DAPO = {"dynamic_filtering.enabled": True}
VARIANTS: dict[str, dict[str, Any]] = {
    "GRPO": {},
    # allocators (algorithms/allocation.py): each spends the step's responses where its store predicts a signal
    "Knapsack-0.5": _KNAPSACK_HALF,
    # the same knapsack for GRPO's whole token budget: twice the steps, evaluated on GRPO's token grid (every 10 of
    # its half-sized steps = every 5 of GRPO's); accuracy at equal budget, GRPO's final accuracy reached or not in it
    "Knapsack-0.5-long": {**_KNAPSACK_HALF, "steps": 160, "eval_every": 10, "save_every": 40},
    # GRPO with half the responses per prompt: what the knapsack's budget alone buys, without choosing
    "GRPO-n4": {"sampling.n_keep": 4},
    "Skip": {"allocation.method": "skip"},
    "Difficulty": {"allocation.method": "difficulty", "allocation.candidates": 2},
    "DAPO-filter": _DAPO,
    "GRPO+ADORA": _ADORA,
    "Ada-balance": {
        "sampling.enabled": True,
        "sampling.samples_per_round": 8,
        "sampling.max_rounds": 2,
        "sampling.exit_rule": "balance",
    },
    # the learning rate decayed to 0 over the run (cosine) instead of constant: does the knapsack's plateau gap come
    # from the noisier gradient of half the responses per step (then a decaying learning rate narrows it)?
    "GRPO-cosine": _COSINE,
    "Knapsack-0.5-cosine": {**_KNAPSACK_HALF, **_COSINE},
    # the knapsack maximising Knapsack RL's value (signal probability x p (1 - p)^2) instead of the expected number of
    # groups with signal: its budget moves from nearly solved prompts to those still being learned
    "Knapsack-0.5-info-cosine": {**_KNAPSACK_HALF, "allocation.value": "information", **_COSINE},
    "Knapsack-0.5+ADORA": {**_KNAPSACK_HALF, **_ADORA},
    # the best allocator with the best of the other methods on this regime: the knapsack's half budget, its groups
    # with no signal dropped and refilled as DAPO does (DAPO filtering alone reached 0.80 at GRPO's cost and ended
    # above GRPO; Ada-balance, the other one above GRPO, got there for 1.6x the tokens)
    "Knapsack-0.5+DAPO": {**_KNAPSACK_HALF, **_DAPO},
    # the schedule alone at the knapsack's budget: GRPO for half the steps (half its tokens), the learning rate
    # decayed to 0 by step 40; what a cosine knapsack saves beyond stopping early with a decayed rate
    "GRPO-40-cosine": {**_COSINE, "steps": 40},
    # a third of the recipe's learning rate: GRPO's jump comes at steps 20-35 instead of 10 and its plateau stays flat
    # (no drift to stop before), so its final accuracy is reached late; at a constant rate its first 40 steps are
    # also GRPO-40 at this rate (the same updates), the equal-budget control
    "GRPO-lr5e-5": {"train.lr": 5e-5},
    "Knapsack-0.5-lr5e-5": {**_KNAPSACK_HALF, "train.lr": 5e-5},
}
# A variant that changes GRPO's training settings besides the allocation is also paired with GRPO under the same
# settings: what allocation saves at that learning-rate schedule, apart from what the schedule itself buys. The
# cosine knapsacks have two such references: GRPO-cosine (GRPO's budget) and GRPO-40-cosine (the knapsacks' budget,
# so that accuracy at 100% of its tokens is accuracy at equal budget).
_COSINE_REFERENCES = ("GRPO-cosine", "GRPO-40-cosine")
# A constant-rate reference also stands as its own run stopped at half its steps (:data:`TRUNCATED_REFERENCES`): about
# the budget of the knapsack and of GRPO-n4, so accuracy at 100% of its tokens is accuracy at equal budget, for free.
MATCHED_REFERENCES: dict[str, tuple[str, ...]] = {
    "Knapsack-0.5": ("GRPO-first-40",),
    "GRPO-n4": ("GRPO-first-40",),
    "Knapsack-0.5-cosine": _COSINE_REFERENCES,
    "Knapsack-0.5-info-cosine": _COSINE_REFERENCES,
    "Knapsack-0.5-lr5e-5": ("GRPO-lr5e-5", "GRPO-lr5e-5-first-40"),
}
# name -> (variant, last step): that variant's runs cut after the step (:func:`truncated_record`), a reference without a
# run of its own. Exact only where a run's first steps do not depend on its length: a constant learning rate without
# warm-up (kk-revisit's), the same data order; Knapsack-0.5-long's first 80 steps repeat Knapsack-0.5's evaluations
# exactly. A variant with a learning-rate schedule is refused (:func:`truncated_references`).
TRUNCATED_REFERENCES: dict[str, tuple[str, int]] = {
    "GRPO-first-40": (REFERENCE, 40),
    "GRPO-lr5e-5-first-40": ("GRPO-lr5e-5", 40),
}
FIXED_TARGETS = (0.75, 0.8)  # absolute accuracy targets besides GRPO's final accuracy of the seed
BUDGET_FRACTIONS = (0.25, 0.5, 1.0)
PLATEAU_EVALS = 4  # GRPO's plateau of a seed: the mean of its last 4 evaluations (kk-revisit: its last 20 steps)
GOAL_FRACTION = 0.5  # the goal: GRPO's final accuracy of the seed within this fraction of GRPO's generated tokens
ESTABLISHED = 0.05
CONFIRMATORY_SEEDS = 10  # a variant on fewer paired seeds is a pilot: outside the Holm family, never established


def run_record(run: Mapping[str, Any]) -> dict[str, Any]:
    """The results.json record of one finished run: its accuracy-vs-tokens curve and what it cost."""
    steps = [m for m in run["metrics"] if "sampling/responses_generated" in m]
    tokens = dict(
        zip([m["step"] for m in steps], accumulate(m["sampling/tokens_generated"] for m in steps), strict=True)
    )
    responses = dict(
        zip([m["step"] for m in steps], accumulate(m["sampling/responses_generated"] for m in steps), strict=True)
    )
    evals = [m for m in run["metrics"] if "eval/greedy_accuracy" in m]
    half = len(steps) // 2
    second = [m["advantage/zero_signal_fraction"] for m in steps[half:] if "advantage/zero_signal_fraction" in m]
    return {
        "variant": run["variant"],
        "seed": run["seed"],
        # (cumulative tokens, accuracy)
        "curve": [[tokens.get(m["step"], 0.0), m["eval/greedy_accuracy"]] for m in evals],
        "steps": [m["step"] for m in evals],
        "responses_curve": [responses.get(m["step"], 0.0) for m in evals],
        "acc_step0": evals[0]["eval/greedy_accuracy"],
        "acc_final": evals[-1]["eval/greedy_accuracy"],
        "tokens_total": sum(m["sampling/tokens_generated"] for m in steps),
        "responses_total": sum(m["sampling/responses_generated"] for m in steps),
        "zero_signal_second_half": sum(second) / len(second) if second else None,  # trained groups with no signal
        "eval_s": sum(m.get("time/eval_s", 0.0) for m in evals),
        "train_s": sum(m.get("time/step_s", 0.0) for m in steps),
    }


def truncated_record(rec: Mapping[str, Any], last_step: int, name: str) -> dict[str, Any]:
    """``rec`` as if its run had stopped after step ``last_step``, named ``name``: its evaluations at steps
    <= last_step, ``acc_final`` the accuracy at last_step, ``tokens_total`` and ``responses_total`` the cumulative
    counts there (the curve's last point); what the cut cannot know (``zero_signal_second_half``, times) is None.
    ``truncated_from`` names the run's variant. The run must have an evaluation at last_step."""
    keep = [i for i, step in enumerate(rec["steps"]) if step <= last_step]
    if not keep or rec["steps"][keep[-1]] != last_step:
        raise ValueError(
            f"{rec['variant']} seed {rec['seed']}: no evaluation at step {last_step} to cut at "
            f"(evaluated at steps {rec['steps']}); choose a step its eval_every divides"
        )
    curve = [list(rec["curve"][i]) for i in keep]
    return {
        **rec,
        "variant": name,
        "truncated_from": rec["variant"],
        "curve": curve,
        "steps": [rec["steps"][i] for i in keep],
        "responses_curve": [rec["responses_curve"][i] for i in keep],
        "acc_final": curve[-1][1],
        "tokens_total": curve[-1][0],
        "responses_total": rec["responses_curve"][keep[-1]],
        "zero_signal_second_half": None,
        "eval_s": None,
        "train_s": None,
    }


def truncated_references(records: Sequence[Mapping[str, Any]], recipe_train: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The records of every :data:`TRUNCATED_REFERENCES` entry, cut from its variant's records
    (:func:`truncated_record`; a record without an evaluation at the step is named and left out, one whose run
    stopped by then is not cut: a control equal to the run adds nothing). A cut is a stopped
    run only at a constant learning rate without warm-up: a variant whose schedule (its own ``train.lr_scheduler`` /
    ``train.lr_warmup_ratio``, else the recipe's ``recipe_train``) is another raises."""
    out = []
    for name, (variant, last_step) in TRUNCATED_REFERENCES.items():
        schedule = VARIANTS[variant].get("train.lr_scheduler", recipe_train["lr_scheduler"])
        warmup = VARIANTS[variant].get("train.lr_warmup_ratio", recipe_train.get("lr_warmup_ratio", 0.0))
        if schedule != "constant" or warmup:
            raise ValueError(
                f"TRUNCATED_REFERENCES[{name!r}]: {variant} runs a {schedule!r} learning rate with warm-up ratio "
                f"{warmup}, so its first {last_step} steps are not a {last_step}-step run; cut only variants at a "
                "constant rate without warm-up"
            )
        for rec in (r for r in records if r["variant"] == variant):
            if rec["steps"][-1] <= last_step:  # the run stopped there: a cut would be the run itself, not a control
                continue
            if last_step in rec["steps"]:
                out.append(truncated_record(rec, last_step, name))
            else:  # a record evaluated on another grid: no cut, said so (its matched variants lose that seed's pair)
                print(f"{name}: {variant} seed {unit_label(rec)} has no evaluation at step {last_step}; not cut")
    return out


def tokens_to_reach(curve: Sequence[Sequence[float]], target: float) -> tuple[float, bool]:
    """(tokens at the first evaluation with accuracy >= target, True), or (the run's whole budget, False): censored."""
    for tokens, acc in curve:
        if acc >= target - 1e-9:
            return tokens, True
    return curve[-1][0], False


def accuracy_at(curve: Sequence[Sequence[float]], budget: float) -> float:
    """Accuracy at ``budget`` tokens, linearly interpolated between evaluations; past the curve's end its last value."""
    for (x0, y0), (x1, y1) in zip(curve, curve[1:], strict=False):
        if x0 <= budget <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (budget - x0) / (x1 - x0)
    return curve[-1][1] if budget >= curve[-1][0] else curve[0][1]


def plateau(curve: Sequence[Sequence[float]], evals: int = PLATEAU_EVALS) -> float:
    """The mean accuracy of a curve's last ``evals`` evaluations: (1/k) sum_{j > m-k} acc_j (all of them if fewer)."""
    tail = curve[-evals:]
    return sum(acc for _, acc in tail) / len(tail)


def censored_log_ratio(d: float, variant_censored: bool, reference_censored: bool) -> float | None:
    """The log ratio d = ln(cost(variant) / cost(GRPO)) where censoring leaves its sign known, else None.

    Variant censored: the true d >= d, so its sign is known (a loss) only if d >= 0; GRPO censored: the true
    d <= d, known (a win) only if d <= 0; both censored: unknown. The known value stays the bound (conservative
    in size)."""
    if variant_censored and reference_censored:
        return None
    if variant_censored:
        return d if d >= 0 else None
    if reference_censored:
        return d if d <= 0 else None
    return d


def _metric_pairs(rec: Mapping[str, Any], ref: Mapping[str, Any]) -> dict[str, tuple[float, bool, bool]]:
    """Per metric (d, variant censored, reference censored) of one seed; d as in the module docstring."""
    out: dict[str, tuple[float, bool, bool]] = {}
    targets = {
        "ref_final": ref["acc_final"],
        "ref_plateau": plateau(ref["curve"]),
        **{f"{t:.2f}": t for t in FIXED_TARGETS},
    }
    for name, target in targets.items():
        (mine, reached), (theirs, ref_reached) = (
            tokens_to_reach(rec["curve"], target),
            tokens_to_reach(ref["curve"], target),
        )
        if mine > 0 and theirs > 0:
            out[f"tokens_to_{name}"] = (math.log(mine / theirs), not reached, not ref_reached)
    for fraction in BUDGET_FRACTIONS:
        budget = fraction * ref["tokens_total"]
        out[f"acc_at_{round(fraction * 100)}pct"] = (
            accuracy_at(rec["curve"], budget) - accuracy_at(ref["curve"], budget),
            False,
            False,
        )
    at_goal = accuracy_at(rec["curve"], GOAL_FRACTION * ref["tokens_total"])
    out[f"acc_at_{round(GOAL_FRACTION * 100)}pct_vs_ref_final"] = (at_goal - ref["acc_final"], False, False)
    out["acc_final"] = (rec["acc_final"] - ref["acc_final"], False, False)
    out["tokens_total"] = (math.log(rec["tokens_total"] / ref["tokens_total"]), False, False)
    return out


def reaches_goal(
    rec: Mapping[str, Any], ref: Mapping[str, Any], fraction: float = GOAL_FRACTION, target: float | None = None
) -> bool:
    """Whether ``rec`` reaches ``target`` (default ``ref``'s final accuracy) at an evaluation with at most
    ``fraction`` x ``ref``'s total generated tokens: tokens_to_reach(curve, target) <= fraction * tokens_total(ref),
    reached."""
    tokens, reached = tokens_to_reach(rec["curve"], ref["acc_final"] if target is None else target)
    return reached and tokens <= fraction * ref["tokens_total"] + 1e-9


def unit_label(rec: Mapping[str, Any]) -> int | str:
    """A record's paired unit: its seed, and where known the warm start it began from (``warm_start``, a fingerprint
    of the weights: a warm start made on another machine can differ). Legacy records without a
    fingerprint are their seed alone; others ``"<seed>/<fingerprint>"``."""
    ws = rec.get("warm_start")
    return rec["seed"] if ws is None else f"{rec['seed']}/{ws}"


def repeated_units(records: Sequence[Mapping[str, Any]], reference: str = REFERENCE) -> dict[int, str]:
    """{seed: fingerprint} for the seeds whose record without a fingerprint (made before fingerprints) has its
    reference run repeated exactly, every evaluation and the token count, by a reference run from a fingerprinted
    warm start: the local backend is deterministic on one machine, so both began from that warm start."""
    legacy = {r["seed"]: r for r in records if r["variant"] == reference and r.get("warm_start") is None}
    out: dict[int, str] = {}
    for r in records:
        old = legacy.get(r["seed"])
        if r["variant"] != reference or r.get("warm_start") is None or old is None or r["seed"] in out:
            continue
        if r["curve"] == old["curve"] and r["tokens_total"] == old["tokens_total"]:
            out[r["seed"]] = r["warm_start"]
    return out


def merge_repeated_units(records: Sequence[Mapping[str, Any]], reference: str = REFERENCE) -> list[dict[str, Any]]:
    """``records`` with each seed of :func:`repeated_units` counted once: its records without a fingerprint take the
    fingerprint of the warm start they share (``warm_start_inferred``), and a record of a variant that also ran
    from that fingerprint (the reference's repeated run) is left out, so no unit enters a test twice."""
    same = repeated_units(records, reference)
    have = {(r["variant"], r["seed"], r.get("warm_start")) for r in records}
    out = []
    for r in records:
        if r.get("warm_start") is None and r["seed"] in same:
            if (r["variant"], r["seed"], same[r["seed"]]) in have:
                continue
            r = {**r, "warm_start": same[r["seed"]], "warm_start_inferred": True}
        out.append(dict(r))
    return out


def paired_runs(
    records: Sequence[Mapping[str, Any]], reference: str = REFERENCE
) -> dict[str, dict[int | str, tuple[Mapping[str, Any], Mapping[str, Any]]]]:
    """Per variant (the reference included), {unit: (its run, the reference's run)} over the units
    (:func:`unit_label`: same seed, same warm start) both ran, in seed order."""
    refs = {unit_label(r): r for r in records if r["variant"] == reference}
    out: dict[str, dict[int | str, tuple[Mapping[str, Any], Mapping[str, Any]]]] = {}
    for r in sorted(records, key=lambda r: (r["seed"], str(r.get("warm_start")))):
        if unit_label(r) in refs:
            out.setdefault(r["variant"], {})[unit_label(r)] = (r, refs[unit_label(r)])
    return {v: out[v] for v in dict.fromkeys(r["variant"] for r in records) if v in out}


# R_i of the goal's test (:func:`_goal_test`): the reference's total tokens (the goal as worded), or its tokens to the target
GOAL_READINGS = ("total", "reach")


def goal_records(
    records: Sequence[Mapping[str, Any]],
    reference: str = REFERENCE,
    paired: Sequence[Mapping[str, Any]] = (),
    min_seeds: int = CONFIRMATORY_SEEDS,
) -> list[dict[str, Any]]:
    """Per variant: on how many of the seeds it ran beside the reference it reaches the reference's final accuracy
    within :data:`GOAL_FRACTION` of the reference's tokens (:func:`reaches_goal`), and on which; the same for the
    reference's plateau (:func:`plateau`) as the target. The reference's own row reads its own curve: how often GRPO
    itself was at its final accuracy by then (that target is one evaluation, so a plateau reached early can meet it or
    miss it by evaluation noise alone).

    Beside the count, the goal as a test in two readings (:func:`_goal_test`, keys ``goal_<reading>_*``): the run's
    tokens to the reference's final accuracy over the reference's total tokens (``total``: the goal as worded, which a
    reference already at its final accuracy early meets by itself) or over the reference's own tokens to that accuracy
    (``reach``: a saving at equal accuracy), tested against GOAL_FRACTION with Holm over the variants on at least
    ``min_seeds`` seeds; ``goal_<reading>_met`` where the geometric-mean ratio is below the fraction, both
    Holm-adjusted p-values are below 0.05, and no loss of accuracy at equal budget is established (``acc_at_100pct``
    of ``paired``, ``loss_at_equal_budget``). The reference's own row gets the ``total`` test (how far its own curve
    meets the goal as worded) outside the family and without a verdict."""
    loss_at_equal_budget = {
        r["variant"] for r in paired if r["metric"] == "acc_at_100pct" and r["established"] and r["mean_diff"] < 0
    }
    out = []
    for variant, units in paired_runs(records, reference).items():
        reached = [u for u, (rec, ref) in units.items() if reaches_goal(rec, ref)]
        on_plateau = [u for u, (rec, ref) in units.items() if reaches_goal(rec, ref, target=plateau(ref["curve"]))]
        out.append({"variant": variant, "fraction": GOAL_FRACTION, "n": len(units), "reached": len(reached),
                    "seeds_reached": reached, "reached_plateau": len(on_plateau),
                    "seeds_reached_plateau": on_plateau,
                    "goal_total": _goal_test(units.values(), "total"),
                    "loss_at_equal_budget": variant in loss_at_equal_budget})  # fmt: skip
        if variant != reference:
            out[-1]["goal_reach"] = _goal_test(units.values(), "reach")
    rows = [g for g in out if g["variant"] != reference]
    for reading in GOAL_READINGS:  # the family and "established" as for every paired metric
        tests = _holm_over_confirmatory([g[f"goal_{reading}"] for g in rows], min_seeds)
        for g, test in zip(rows, tests, strict=True):
            test["met"] = test["established"] and test["ratio"] < GOAL_FRACTION and not g["loss_at_equal_budget"]
    for g in out:
        for reading in GOAL_READINGS:
            g.update({f"goal_{reading}_{k}": v for k, v in g.pop(f"goal_{reading}", {}).items()})
    return out


def _goal_test(pairs: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]], reading: str) -> dict[str, Any]:
    """The goal as a test over (run, reference run) pairs of seeds: per seed g_i = ln(T_i / R_i) - ln(GOAL_FRACTION),
    T_i the run's tokens to the reference's final accuracy (:func:`tokens_to_reach`), R_i the reference's total
    tokens (``reading`` "total") or its tokens to its own final accuracy ("reach"). A run that never gets there has
    T_i at least its budget, so its g_i is a lower bound, kept where it is >= 0 (the goal missed either way) and else
    counted as g_i = 0 (``undetermined``). ``ratio`` = exp(mean g + ln GOAL_FRACTION), the geometric mean of
    T_i / R_i, with its 95% interval, and the sign-flip and t p-values of mean g = 0 (Holm, ``pilot`` and
    ``established`` are added by :func:`goal_records` through :func:`_holm_over_confirmatory`)."""
    if reading not in GOAL_READINGS:
        raise ValueError(f"reading: one of {GOAL_READINGS}, got {reading!r}")
    shift = math.log(GOAL_FRACTION)
    known = []
    for rec, ref in pairs:
        tokens, reached = tokens_to_reach(rec["curve"], ref["acc_final"])
        base = ref["tokens_total"] if reading == "total" else tokens_to_reach(ref["curve"], ref["acc_final"])[0]
        known.append(censored_log_ratio(math.log(max(tokens, 1.0) / max(base, 1.0)) - shift, not reached, False))
    diffs = [0.0 if d is None else d for d in known]
    test = paired_t(diffs)

    def ratio(x: float | None) -> float | None:
        return None if x is None else math.exp(x + shift)

    return {"n": test.n, "ratio": ratio(test.mean), "ratio_low": ratio(test.ci_low), "ratio_high": ratio(test.ci_high),
            "undetermined": sum(d is None for d in known), "p_sign_flip": sign_flip_p(diffs) if diffs else None,
            "p_value": test.p_value}  # fmt: skip


def paired_metric_records(
    records: Sequence[Mapping[str, Any]], reference: str = REFERENCE, min_seeds: int = CONFIRMATORY_SEEDS
) -> list[dict[str, Any]]:
    """One record per (metric, variant) over the seeds both ran: n, mean difference with its 95% paired-t interval
    (and the ratio exp(mean) for ``tokens_*``), wins/ties/losses, censored seeds, the seeds whose sign censoring
    leaves open (``undetermined``: d = 0 in the mean and the tests, in no win/tie/loss; :func:`censored_log_ratio`),
    the sign-flip and t p-values, both Holm-adjusted over the variants of the metric run on at least ``min_seeds``
    seeds, and ``established`` (both adjusted p < 0.05); a variant on fewer seeds is a ``pilot``
    (:func:`_holm_over_confirmatory`)."""
    per_variant = {
        v: {unit: _metric_pairs(rec, ref) for unit, (rec, ref) in units.items()}
        for v, units in paired_runs(records, reference).items()
        if v != reference
    }
    metrics = list(dict.fromkeys(m for seeds in per_variant.values() for pairs in seeds.values() for m in pairs))
    out: list[dict[str, Any]] = []
    for metric in metrics:
        block = []
        for variant, seeds in per_variant.items():
            values = {s: pairs[metric] for s, pairs in seeds.items() if metric in pairs}
            log_scale = metric.startswith("tokens_")
            known = {s: censored_log_ratio(*v) if log_scale else v[0] for s, v in values.items()}
            diffs = [0.0 if d is None else d for d in known.values()]  # an undetermined seed: no evidence either way
            test = paired_t(diffs)
            wins, ties, losses = wins_ties_losses([d for d in known.values() if d is not None],
                                                  "lower" if log_scale else "higher")  # fmt: skip
            rec = {
                "metric": metric,
                "variant": variant,
                "scale": "log_ratio" if log_scale else "difference",
                "n": test.n,
                "mean_diff": test.mean,
                "ci_low": test.ci_low,
                "ci_high": test.ci_high,
                "wins": wins,
                "ties": ties,
                "losses": losses,
                "censored_variant": sum(c for _, c, _ in values.values()),
                "censored_reference": sum(c for _, _, c in values.values()),
                "undetermined": [s for s, d in known.items() if d is None],
                "p_value": test.p_value,
                "p_sign_flip": sign_flip_p(diffs) if diffs else None,
                "per_seed": {str(s): d for s, (d, _, _) in values.items()},  # as measured: a censored seed's bound
            }
            if log_scale:
                rec.update(
                    {
                        k: math.exp(rec[src]) if rec[src] is not None else None
                        for k, src in (("ratio", "mean_diff"), ("ratio_low", "ci_low"), ("ratio_high", "ci_high"))
                    }
                )
            block.append(rec)
        out.extend(_holm_over_confirmatory(block, min_seeds))
    return out


def _holm_over_confirmatory(block: list[dict[str, Any]], min_seeds: int) -> list[dict[str, Any]]:
    """Holm over the variants of one metric run on at least ``min_seeds`` seeds (the confirmatory family); a variant
    on fewer seeds is a pilot: raw p-values only, no Holm, never established, and not in the family."""
    family = [r for r in block if r["n"] >= min_seeds]
    for rec in block:
        rec["pilot"] = rec["n"] < min_seeds
        rec["p_value_holm"] = rec["p_sign_flip_holm"] = None
    for key in ("p_value", "p_sign_flip"):
        for rec, adjusted in zip(family, holm([r[key] for r in family]), strict=True):
            rec[f"{key}_holm"] = adjusted
    for rec in block:
        both = (rec["p_value_holm"], rec["p_sign_flip_holm"])
        rec["established"] = all(p is not None and p < ESTABLISHED for p in both)
    return block


def matched_comparisons(
    records: Sequence[Mapping[str, Any]], min_seeds: int = CONFIRMATORY_SEEDS
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Per matched reference (:data:`MATCHED_REFERENCES`) with runs of its own and of a variant matched to it: the
    paired records (:func:`paired_metric_records`, Holm over these variants) and the goal (:func:`goal_records`) of
    its variants against it, exactly as against GRPO."""
    out = {}
    for ref in dict.fromkeys(ref for refs in MATCHED_REFERENCES.values() for ref in refs):
        mine = [r for r in records if r["variant"] == ref or ref in MATCHED_REFERENCES.get(r["variant"], ())]
        if len({r["variant"] for r in mine}) > 1 and any(r["variant"] == ref for r in mine):
            paired_mine = paired_metric_records(mine, ref, min_seeds)
            out[ref] = {"paired": paired_mine, "goal": goal_records(mine, ref, paired_mine, min_seeds)}
    return out


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


def warm_start_mismatches(records: Sequence[Mapping[str, Any]]) -> list[int | str]:
    """The units (:func:`unit_label`) whose variants differ in step-0 accuracy: not one warm start after all."""
    first: dict[int | str, set[float]] = {}
    for r in records:
        first.setdefault(unit_label(r), set()).add(round(r["acc_step0"], 6))
    return sorted((u for u, accs in first.items() if len(accs) > 1), key=str)


def _warm_start_warning(records: Sequence[Mapping[str, Any]]) -> list[str]:
    seeds = warm_start_mismatches(records)
    if not seeds:
        return []
    return [f"**Warning**: step-0 accuracy differs across the variants of seeds {seeds}: not one warm start.", ""]


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
        *_warm_start_warning(records),
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


def plot(records: Sequence[Mapping[str, Any]], path: Path) -> None:
    """Accuracy against generated tokens: each seed a thin line, the mean over seeds (at each evaluation) in bold,
    labelled with its number of runs (a pilot's mean is over other seeds than a ten-seed variant's); past ten
    variants the colours repeat with another line style."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = list(dict.fromkeys(r["variant"] for r in records))
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for i, v in enumerate(variants):
        color, style = f"C{i % 10}", ("-", "--", ":")[i // 10 % 3]
        mine = [r for r in records if r["variant"] == v]
        for r in mine:
            ax.plot(
                [x for x, _ in r["curve"]],
                [y for _, y in r["curve"]],
                color=color,
                linestyle=style,
                linewidth=0.6,
                alpha=0.35,
            )
        length = min(len(r["curve"]) for r in mine)
        xs = [sum(r["curve"][k][0] for r in mine) / len(mine) for k in range(length)]
        ys = [sum(r["curve"][k][1] for r in mine) / len(mine) for k in range(length)]
        ax.plot(xs, ys, color=color, linestyle=style, linewidth=2.2, label=f"{v} ({len(mine)} runs)")
    ax.set_xlabel("generated tokens")
    ax.set_ylabel("held-out greedy accuracy")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _settings_key(overrides: Mapping[str, Any]) -> str:
    return json.dumps(overrides, sort_keys=True, default=str)


def recipe_config(recipe: str) -> dict[str, Any]:
    """The recipe's resolved config as the trainer writes it (``format_config``), less ``output_dir``: the settings
    every run of the benchmark shares before its variant's overrides."""
    from adora_openrlhf.cli_args import format_config
    from adora_openrlhf.recipes import build_run_config

    return {k: v for k, v in json.loads(format_config(build_run_config(recipe, {}))).items() if k != "output_dir"}


def stored_records(path: Path, recipe: str) -> dict[tuple[str, int, str | None], dict[str, Any]]:
    """The per-run records of an earlier ``results.json`` that today's benchmark would reproduce: same recipe with
    the same resolved settings (``recipe_config``, :func:`bench.common.setting_differences`), and each record's
    variant still defined with the overrides it ran with (others are left out, and named); keyed by (variant, seed,
    warm-start fingerprint). A change of the code
    that changes what a run computes is not seen here, as with a reused run folder."""
    from adora_openrlhf.cli_args import format_config
    from adora_openrlhf.config import RunConfig

    if not path.exists():
        return {}
    saved = json.loads(path.read_text())
    settings = saved.get("settings", {})
    if settings.get("recipe") != recipe:
        print(f"{path}: records of recipe {settings.get('recipe')!r}, not {recipe!r}; not reused")
        return {}
    if "recipe_config" in settings:
        defaults = json.loads(format_config(RunConfig()))
        changed = setting_differences(settings["recipe_config"], recipe_config(recipe), defaults)
        if changed:
            print(f"{path}: recipe {recipe} has changed since its records ({'; '.join(changed)}); not reused")
            return {}
    ran_with = settings.get("variants", {})
    kept, dropped = {}, set()
    for rec in saved.get("records", []):
        v = rec["variant"]
        if v in VARIANTS and v in ran_with and _settings_key(ran_with[v]) == _settings_key(VARIANTS[v]):
            kept[(v, rec["seed"], rec.get("warm_start"))] = rec
        else:
            dropped.add(v)
    if dropped:
        print(f"{path}: records of {sorted(dropped)} ran with other settings than today's variants; not reused")
    return kept


def warm_start_fingerprint(model_dir: str | Path) -> str | None:
    """The first 12 hex digits of sha256 over a saved model's weight files (sorted by name): which warm start a run
    began from. None where the folder holds no weights."""
    files = sorted(Path(model_dir).glob("*.safetensors")) + sorted(Path(model_dir).glob("*.bin"))
    if not files:
        return None
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.read_bytes())
    return digest.hexdigest()[:12]


def _record_of(run_dir: Path, variant: str, seed: int) -> dict[str, Any]:
    """A finished run folder's record, with the fingerprint of the warm start its config names (``model.path``)."""
    record = run_record(load_run(variant, seed, run_dir))
    model = json.loads((run_dir / "config.json").read_text()).get("model", {}).get("path")
    record["warm_start"] = warm_start_fingerprint(model) if isinstance(model, str) else None
    return record


def finished_runs(runs: Path) -> list[tuple[str, int]]:
    """(variant, seed) of every finished run folder ``<variant>_seed<seed>`` (with summary.json) of a known variant."""
    found = []
    for folder in sorted(runs.glob("*_seed*")) if runs.is_dir() else []:
        variant, _, seed = folder.name.rpartition("_seed")
        if variant in VARIANTS and seed.isdigit() and (folder / "summary.json").exists():
            found.append((variant, int(seed)))
    return found


def _warm(args: tuple[str, int, Path]) -> str:
    recipe, seed, out = args
    return warm_start_dir(recipe, seed, {}, out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.allocation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="kk-revisit", help="local-backend recipe every variant uses")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--variants",
        nargs="+",
        default=list(VARIANTS),
        help=f"from {list(VARIANTS)}; GRPO is always included (run unless its record is stored)",
    )
    parser.add_argument("--workers", type=int, default=2, help="runs side by side, one torch thread each")
    parser.add_argument(
        "--report-only", action="store_true", help="analyse the records under --out (results.json, run folders) only"
    )
    parser.add_argument("--out", default="bench/results/allocation")
    args = parser.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; choose from {list(VARIANTS)}")
    variants = [REFERENCE] + [v for v in args.variants if v != REFERENCE]
    out, started = Path(args.out), time.time()
    stored = stored_records(out / "results.json", args.recipe)

    def run_dir(v: str, s: int) -> Path:
        return out / "runs" / f"{v}_seed{s}"

    if not args.report_only:  # a run with its record stored and no folder of its own is not run again
        have = {(v, s) for v, s, _ in stored}
        todo = [(v, s) for v in variants for s in args.seeds if (v, s) not in have or run_dir(v, s).exists()]
        seeds = list(dict.fromkeys(s for _, s in todo))
        inits = dict(zip(seeds, run_pool(_warm, [(args.recipe, s, out) for s in seeds], args.workers), strict=True))
        for s in seeds:  # runs here pair with a GRPO run of this warm start, not with one stored from another
            refs = dict.fromkeys(
                [REFERENCE, *(ref for v, t in todo if t == s for ref in MATCHED_REFERENCES.get(v, ()))]
            )
            fingerprint = warm_start_fingerprint(inits[s])
            for ref in dict.fromkeys(TRUNCATED_REFERENCES.get(r, (r,))[0] for r in refs):  # a cut: its variant's run
                if (ref, s, fingerprint) not in stored and (ref, s) not in todo:
                    todo.insert(0, (ref, s))
        specs = [
            RunSpec(v, s, args.recipe, {**VARIANTS[v], "model.path": inits[s], "report_to": "none", **FROM_WARM_START},
                    str(run_dir(v, s)), reuse=True)
            for v, s in todo
        ]  # fmt: skip
        run_pool(run_training, specs, args.workers)
    found = [_record_of(run_dir(v, s), v, s) for v, s in finished_runs(out / "runs")]
    by_run = {**stored, **{(r["variant"], r["seed"], r["warm_start"]): r for r in found}}
    records = [by_run[k] for k in sorted(by_run, key=lambda k: (list(VARIANTS).index(k[0]), k[1], str(k[2])))]
    units = merge_repeated_units(records)  # the analysis counts each warm start once; the cost counts every run
    paired = paired_metric_records(units)
    settings = {
        "recipe": args.recipe,
        "seeds": sorted({r["seed"] for r in records}),
        "variants": {v: VARIANTS[v] for v in dict.fromkeys(r["variant"] for r in records)},
        "recipe_config": recipe_config(args.recipe),
        "wall_s_this_invocation": time.time() - started,
    }
    cuts = truncated_references(units, settings["recipe_config"]["train"])
    goal, matched = goal_records(units, REFERENCE, paired), matched_comparisons([*units, *cuts])
    write_json(out / "results.json",
               {"settings": settings, "records": records, "paired": paired, "goal": goal, "matched": matched})  # fmt: skip
    text = report(units, paired, goal, settings, matched, runs=records)
    (out / "table.md").write_text(text + "\n")
    plot(units, out / "curves.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
