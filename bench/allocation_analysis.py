"""The rollout allocation benchmark's analysis (``bench/allocation.py`` runs it): what is compared, and how.

:data:`VARIANTS` are the methods (each a set of overrides of the recipe), :data:`REFERENCE` (GRPO) the run each is
paired with per unit (:func:`unit_label`: a seed and the fingerprint of its warm start). A run is its curve of
held-out greedy accuracy against cumulative generated tokens (every response generated, kept or not;
``sampling/tokens_generated``), evaluated every ``eval_every`` steps. Paired per unit against GRPO
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

Tests: the exact sign-flip test (primary) and the paired t test beside it, each Holm-adjusted over the variants of
the metric (``bench/paired_stats.py``); a difference is **established** only where both adjusted p-values are below
0.05. The Holm family is the variants run on at least :data:`CONFIRMATORY_SEEDS` paired seeds; a variant on fewer
is a pilot, shown with its raw p-values, never established and not diluting the family.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench.budget import censored_log_ratio, cost_to_reach
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
            cost_to_reach(rec["curve"], target),
            cost_to_reach(ref["curve"], target),
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
    ``fraction`` x ``ref``'s total generated tokens: cost_to_reach(curve, target) <= fraction * tokens_total(ref),
    reached."""
    tokens, reached = cost_to_reach(rec["curve"], ref["acc_final"] if target is None else target)
    return reached and tokens <= fraction * ref["tokens_total"] + 1e-9


def unit_label(rec: Mapping[str, Any]) -> int | str:
    """A record's paired unit: its seed, and where known the warm start it began from (``warm_start``, a fingerprint
    of the weights: a warm start made on another machine can differ): ``"<seed>/<fingerprint>"``, or the seed alone
    for a record without a fingerprint."""
    ws = rec.get("warm_start")
    return rec["seed"] if ws is None else f"{rec['seed']}/{ws}"


def one_record_per_run(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``records`` with each (variant, unit) once, so that no unit enters a test twice: of a run repeated exactly from
    the same warm start the record measured with its fingerprint stands, not one whose fingerprint was inferred
    (``warm_start_inferred``: the records made before fingerprints, whose GRPO run a fingerprinted warm start
    repeats exactly). The cost of the benchmark counts every record."""
    out: dict[tuple[str, int | str], dict[str, Any]] = {}
    for r in records:
        key = (r["variant"], unit_label(r))
        if key not in out or out[key].get("warm_start_inferred"):
            out[key] = dict(r)
    return list(out.values())


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
    T_i the run's tokens to the reference's final accuracy (``budget.cost_to_reach``), R_i the reference's total
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
        tokens, reached = cost_to_reach(rec["curve"], ref["acc_final"])
        base = ref["tokens_total"] if reading == "total" else cost_to_reach(ref["curve"], ref["acc_final"])[0]
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
    leaves open (``undetermined``: d = 0 in the mean and the tests, in no win/tie/loss; ``budget.censored_log_ratio``),
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
