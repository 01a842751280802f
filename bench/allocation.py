"""Rollout allocation benchmark: does a method reach GRPO's held-out accuracy for fewer generated tokens?

``python -m bench.allocation [--recipe kk-revisit] [--seeds 0 1 2] [--variants ...] [--workers 2] [--report-only]
[--out bench/results/allocation]``

This module runs the benchmark; what it compares and how is ``bench/allocation_analysis.py``, the table and plot
``bench/allocation_report.py``. Per seed the recipe's supervised warm-up runs once (``bench/common.py``
``testbed_files.warm_start_dir``); every variant of the seed starts RL from it, with the same data order and the same held-out
puzzles, and changes only the method (:data:`VARIANTS`). Finished runs are read back, interrupted ones resumed
(``run_training`` with ``reuse``), so the benchmark can be run in pieces; ``--report-only`` analyses the finished runs
only. Each finished run becomes one record (:func:`run_record`).

Records accumulate (bench/README.md, "Rollout allocation"): stored records are read back (:func:`stored_records`)
instead of run again; each carries its warm start's fingerprint (:func:`warm_start_fingerprint`), and runs pair only
with a GRPO run of the same seed and warm start (records made before fingerprints: ``warm_start_inferred``).

Writes ``results.json`` (per-run records, ``paired`` records and ``goal`` records), ``table.md``, and ``accuracy.png`` and
``target.png`` as ``python -m bench.plots`` draws them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Mapping, Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

from adora_openrlhf.testbed_files import warm_start_dir
from bench import plots
from bench.allocation_analysis import (
    MATCHED_REFERENCES,
    REFERENCE,
    TRUNCATED_REFERENCES,
    VARIANTS,
    goal_records,
    matched_comparisons,
    one_record_per_run,
    paired_metric_records,
    truncated_references,
)
from bench.allocation_report import report
from bench.common import (
    FROM_WARM_START,
    RunSpec,
    load_run,
    run_pool,
    run_training,
    setting_differences,
    write_json,
)


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


def _settings_key(overrides: Mapping[str, Any]) -> str:
    return json.dumps(overrides, sort_keys=True, default=str)


def recipe_config(recipe: str) -> dict[str, Any]:
    """The recipe's resolved config as the trainer writes it (``format_config``), less ``output_dir``: the settings
    every run of the benchmark shares before its variant's overrides."""
    from adora_openrlhf.cli_args import format_config
    from adora_openrlhf.recipes import build_run_config

    return {k: v for k, v in json.loads(format_config(build_run_config(recipe, {}))).items() if k != "output_dir"}


def stored_records(path: Path, recipe: str) -> list[dict[str, Any]]:
    """The per-run records of an earlier ``results.json`` that today's benchmark would reproduce: same recipe with
    the same resolved settings (``recipe_config``, :func:`bench.common.setting_differences`), and each record's
    variant still defined with the overrides it ran with (others are left out, and named). A change of the code
    that changes what a run computes is not seen here, as with a reused run folder."""
    from adora_openrlhf.cli_args import format_config
    from adora_openrlhf.config import RunConfig

    if not path.exists():
        return []
    saved = json.loads(path.read_text())
    settings = saved.get("settings", {})
    if settings.get("recipe") != recipe:
        print(f"{path}: records of recipe {settings.get('recipe')!r}, not {recipe!r}; not reused")
        return []
    if "recipe_config" in settings:
        defaults = json.loads(format_config(RunConfig()))
        changed = setting_differences(settings["recipe_config"], recipe_config(recipe), defaults)
        if changed:
            print(f"{path}: recipe {recipe} has changed since its records ({'; '.join(changed)}); not reused")
            return []
    ran_with = settings.get("variants", {})
    kept, dropped = [], set()
    for rec in saved.get("records", []):
        v = rec["variant"]
        if v in VARIANTS and v in ran_with and _settings_key(ran_with[v]) == _settings_key(VARIANTS[v]):
            kept.append(rec)
        else:
            dropped.add(v)
    if dropped:
        print(f"{path}: records of {sorted(dropped)} ran with other settings than today's variants; not reused")
    return kept


def run_key(rec: Mapping[str, Any]) -> tuple[str, int, str | None]:
    """(variant, seed, warm-start fingerprint): the run a record is of."""
    return rec["variant"], rec["seed"], rec.get("warm_start")


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
    stored_runs = {run_key(r) for r in stored}

    def run_dir(v: str, s: int) -> Path:
        return out / "runs" / f"{v}_seed{s}"

    if not args.report_only:  # a run with its record stored and no folder of its own is not run again
        have = {(v, s) for v, s, _ in stored_runs}
        todo = [(v, s) for v in variants for s in args.seeds if (v, s) not in have or run_dir(v, s).exists()]
        seeds = list(dict.fromkeys(s for _, s in todo))
        inits = dict(zip(seeds, run_pool(_warm, [(args.recipe, s, out) for s in seeds], args.workers), strict=True))
        for s in seeds:  # runs here pair with a GRPO run of this warm start, not with one stored from another
            refs = dict.fromkeys(
                [REFERENCE, *(ref for v, t in todo if t == s for ref in MATCHED_REFERENCES.get(v, ()))]
            )
            fingerprint = warm_start_fingerprint(inits[s])
            for ref in dict.fromkeys(TRUNCATED_REFERENCES.get(r, (r,))[0] for r in refs):  # a cut: its variant's run
                if (ref, s, fingerprint) not in stored_runs and (ref, s) not in todo:
                    todo.insert(0, (ref, s))
        specs = [
            RunSpec(v, s, args.recipe, {**VARIANTS[v], "model.path": inits[s], "report_to": "none", **FROM_WARM_START},
                    str(run_dir(v, s)), reuse=True)
            for v, s in todo
        ]  # fmt: skip
        run_pool(run_training, specs, args.workers)
    found = [_record_of(run_dir(v, s), v, s) for v, s in finished_runs(out / "runs")]
    ran_here = {run_key(r) for r in found}  # a run folder's record replaces the stored record of its run
    records = sorted(
        [*(r for r in stored if run_key(r) not in ran_here), *found],
        key=lambda r: (list(VARIANTS).index(r["variant"]), r["seed"], str(r.get("warm_start"))),
    )
    units = one_record_per_run(records)  # the analysis counts each run once; the cost counts every record
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
    plots.draw_runs(
        plots.benchmark_for(out, args.recipe, 0.80, list(settings["variants"])),
        plots.allocation_runs({"records": records}),
        out,
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
