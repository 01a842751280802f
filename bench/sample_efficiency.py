"""Sample efficiency: GRPO, ADORA (attenuate, amplify), adaptive sampling (pos, balance, balance + ADORA), DAPO
dynamic filtering and adaGRPO escalation on one local recipe (default ``kk-testbed``), over several seeds.

``python -m bench.sample_efficiency [--recipe kk-testbed] [--seeds 0 1 2 3 4] [--variants ...] [--workers 2]
[--target-margin 0.05] [--set KEY=VALUE ...] [--quick] [--report-only] [--fresh] [--merge RESULTS_JSON] [--out DIR]``;
``--report-only --merge RESULTS_JSON --seeds`` (no seed) rebuilds the report of an earlier results.json's runs with this
version's analysis.

Every variant uses the recipe's hyper-parameters (chosen for GRPO) and changes only the method
(``bench/common.py`` VARIANTS); every variant of a seed starts RL from that seed's warm start, with the same data
order. The table's columns, the records and the paired analysis are described in bench/README.md ("Sample
efficiency"); the paired tests are ``bench/paired_analysis.py``'s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

from adora_openrlhf.testbed_files import warm_start_dir
from bench import plots
from bench.budget import with_tokens
from bench.common import (
    FROM_WARM_START,
    GROUP_VARIANTS,
    VARIANTS,
    RunSpec,
    first_step_reaching,
    load_run,
    markdown_table,
    run_pool,
    run_training,
    trapezoid_auc,
    write_json,
)
from bench.sample_efficiency_report import HEADER, REFERENCE, paired_report, plot, subset_rows, summarise

# curves() series a record keeps besides acc_curve
SERIES = (
    "acc_vs_responses",
    "acc_vs_tokens",
    "zero_signal",
    "length",
)
# settings two invocations must share for --merge to pool their records
MERGE_KEYS = (
    "recipe",
    "steps",
    "eval_every",
    "num_eval",
    "prompts_per_step",
    "n_keep",
    "lr",
    "temperature",
    "max_new_tokens",
    "overrides",
    "variants",
    "target_margin",
    "quick",
)
TAS_WINDOW = 20  # tas_fraction_first20: mean ADORA TAS fraction over the first this many RL steps
# --quick (smoke run)
QUICK = {
    "steps": 10,
    "eval_every": 5,
    "data.num_eval": 50,
    "warmup.steps": 40,
    "warmup.mix_steps": 10,
}


def curves(metrics: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per-run series from ``metrics.jsonl`` records: held-out greedy accuracy vs step, vs cumulative generated
    responses and vs cumulative generated tokens (``sampling/tokens_generated``; empty when a step lacks it), and
    per RL step the zero-signal fraction, mean length, length std/mean and TAS fraction."""
    steps = [m for m in metrics if "sampling/responses_generated" in m]
    cumulative = dict(
        zip([m["step"] for m in steps], accumulate(m["sampling/responses_generated"] for m in steps), strict=True)
    )
    tokens_logged = all("sampling/tokens_generated" in m for m in steps)
    tokens = dict(
        zip([m["step"] for m in steps], accumulate(m.get("sampling/tokens_generated", 0.0) for m in steps), strict=True)
    )
    evals = [(m["step"], m["eval/greedy_accuracy"]) for m in metrics if "eval/greedy_accuracy" in m]
    prefix = "eval/greedy_accuracy/"  # per subset of the held-out set (K&K: ppl_2, ppl_3, ...)
    subsets = [
        {k[len(prefix) :]: v for k, v in m.items() if k.startswith(prefix)}
        for m in metrics
        if "eval/greedy_accuracy" in m
    ]

    def per_step(key: str) -> list[tuple[int, float]]:
        return [(m["step"], m[key]) for m in steps if key in m]

    return {
        "acc_vs_step": evals,
        "acc_vs_responses": [(cumulative.get(s, 0.0), acc) for s, acc in evals],
        "acc_vs_tokens": [(tokens.get(s, 0.0), acc) for s, acc in evals] if tokens_logged else [],
        "zero_signal": per_step("advantage/zero_signal_fraction"),
        "length": per_step("response/length_mean"),
        "length_std_over_mean": per_step("response/length_std_over_mean"),
        "tas_fraction": per_step("adora/tas_fraction"),
        "total_responses": sum(m["sampling/responses_generated"] for m in steps),
        "subsets_step0": subsets[0] if subsets else {},
        "subsets_final": subsets[-1] if subsets else {},
        "majority_accuracy": next(
            (m["eval/majority_accuracy"] for m in metrics if "eval/majority_accuracy" in m), None
        ),
    }


def choose_target(acc_step0: Sequence[float], margin: float) -> float:
    """Target accuracy that no run meets at step 0: max over runs of the step-0 accuracy + ``margin`` (> 0)."""
    if margin <= 0:
        raise ValueError(f"--target-margin: must be > 0 so that no run meets the target at step 0, got {margin}")
    return max(acc_step0) + margin


def _mean(series: Sequence[tuple[Any, float]]) -> float | None:
    return sum(v for _, v in series) / len(series) if series else None


def run_record(run: dict[str, Any], target: float, adora_on: bool) -> dict[str, Any]:
    """The results.json record of one (variant, seed) run."""
    c = curves(run["metrics"])
    acc = c["acc_vs_step"]
    tas = [(s, v) for s, v in c["tas_fraction"] if s <= TAS_WINDOW]
    return {
        "variant": run["variant"],
        "seed": run["seed"],
        "acc_step0": acc[0][1] if acc else None,
        "acc_final": acc[-1][1] if acc else None,
        # held-out accuracy of the most frequent training answer per subset
        "majority_accuracy": c["majority_accuracy"],
        "acc_step0_by_subset": c["subsets_step0"],  # held-out accuracy per subset (K&K: ppl_N, N people)
        "acc_final_by_subset": c["subsets_final"],
        "auc": trapezoid_auc(acc),
        "acc_curve": [list(p) for p in acc],
        "target": target,
        "steps_to_target": first_step_reaching(acc, target),
        "responses_to_target": first_step_reaching(c["acc_vs_responses"], target),
        "responses": c["total_responses"],
        "zero_signal": _mean(c["zero_signal"]),
        "length_mean": _mean(c["length"]),
        "length_first_step": c["length"][0][1] if c["length"] else None,
        "length_final_step": c["length"][-1][1] if c["length"] else None,
        "length_std_over_mean_step0": c["length_std_over_mean"][0][1] if c["length_std_over_mean"] else None,
        "tas_fraction_first20": _mean(tas) if adora_on else None,
        # a resumed run's summary times only its last invocation: left out of the wall-time column
        "wall_s": run["summary"]["wall_time_s"] if run["summary"].get("resumed_from_step") is None else None,
        "resumed_from_step": run["summary"].get("resumed_from_step"),
        # per-step series for the plot, so that a later invocation can merge this record (--merge)
        "series": {k: [list(p) for p in c[k]] for k in SERIES},
    }


def retarget(record: dict[str, Any], target: float) -> dict[str, Any]:
    """``record`` with the target and the steps / responses needed to reach it recomputed from its curves."""
    return {
        **record,
        "target": target,
        "steps_to_target": first_step_reaching([tuple(p) for p in record["acc_curve"]], target),
        "responses_to_target": first_step_reaching([tuple(p) for p in record["series"]["acc_vs_responses"]], target),
    }


def earlier_records(path: Path, settings: dict[str, Any], seeds_now: Sequence[int]) -> list[dict[str, Any]]:
    """``--merge``: the records of an earlier ``results.json`` for the seeds not run now. Its settings must
    equal this invocation's on every key of MERGE_KEYS."""
    if not path.is_file():
        raise ValueError(f"--merge: {path} is not a file; pass the results.json of an earlier run of this benchmark")
    earlier = json.loads(path.read_text())
    for key in MERGE_KEYS:
        mine, theirs = json.loads(json.dumps(settings.get(key), default=str)), earlier.get("settings", {}).get(key)
        if mine != theirs:
            raise ValueError(
                f"--merge: {path} was written with {key}={theirs!r} but this run has {mine!r}; merge only results of the same settings"
            )
    return [rec for rec in earlier["runs"] if rec["seed"] not in seeds_now]


def _parse_set(items: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs. The VALUE of a config field is parsed by the field's type, as the training flags are
    (``adora.enabled=false``, ``train.lr=1e-4``, ``warmup.mix={"thorough": 1.0}``; a bad value is an error naming the
    field); any other key's VALUE is read as JSON when it parses, else as a string, and left to the config to refuse."""
    from adora_openrlhf.cli_args import LEAF_TYPES, parse_value

    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set: expected KEY=VALUE such as train.lr=1e-4, got {item!r}")
        if key in LEAF_TYPES:
            try:
                out[key] = parse_value(key, LEAF_TYPES[key], raw)
            except ValueError as err:  # "--adora.enabled: cannot parse ..." -> "--set adora.enabled: ..."
                raise ValueError(f"--set {str(err)[2:]}") from None
            continue
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def base_overrides(recipe: str, quick: bool, flags: dict[str, Any], sets: dict[str, Any]) -> dict[str, Any]:
    """Overrides shared by the warm start and every variant: checkpoints only at the end, greedy-only held-out
    evaluation, then --quick's settings (warm-up phases never longer than the recipe's own), the flags, --set."""
    from adora_openrlhf.recipes import build_run_config

    base: dict[str, Any] = {"save_every": 0, "eval_samples": 0}
    if quick:
        warmup = build_run_config(recipe).warmup
        base.update(
            {
                **QUICK,
                "warmup.steps": min(QUICK["warmup.steps"], warmup.steps),
                "warmup.mix_steps": min(QUICK["warmup.mix_steps"], warmup.mix_steps),
            }
        )
    return {**base, **flags, **sets}


def _adora_on(recipe: str, overrides: dict[str, Any]) -> bool:
    from adora_openrlhf.recipes import build_run_config

    return build_run_config(recipe, overrides).adora.enabled


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sample_efficiency", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--recipe", default="kk-testbed", help="local-backend recipe whose hyper-parameters every variant uses"
    )
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="*",
        default=[0, 1, 2, 3, 4],
        help="seeds to run (none with --report-only --merge: rebuild the report of the merged file's runs alone)",
    )
    parser.add_argument("--variants", nargs="+", default=GROUP_VARIANTS, choices=list(VARIANTS))
    parser.add_argument("--steps", type=int, help="RL steps per run (default: the recipe's)")
    parser.add_argument("--eval-every", type=int, help="held-out evaluation every k RL steps (default: the recipe's)")
    parser.add_argument("--num-eval", type=int, help="held-out puzzles (default: the recipe's)")
    parser.add_argument(
        "--target-margin", type=float, default=0.05, help="target = max step-0 accuracy over runs + this"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=(
            "extra dotted override for the warm start and every run, e.g. --set warmup.steps=100 (repeatable); "
            """a mapping replaces the recipe's whole mapping, e.g. --set 'warmup.mix={"thorough": 1.0}'"""
        ),
    )
    parser.add_argument("--workers", type=int, default=2, help="runs in parallel (one torch thread each)")
    parser.add_argument("--quick", action="store_true", help=f"a small smoke run: {QUICK} (flags and --set win)")
    parser.add_argument("--out", default="bench/results/sample_efficiency")
    parser.add_argument(
        "--merge",
        metavar="RESULTS_JSON",
        help="pool the records of an earlier results.json of the same settings for the seeds not run now (e.g. seeds 0-2 run before, 3-4 now)",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="rebuild table, plot and results.json from the runs already in --out"
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="recompute every run; by default a run directory holding the same config is reused when finished and resumed from its checkpoint when interrupted",
    )
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except ValueError as err:  # ConfigError is a ValueError: one line naming the field and the fix
        print(f"error: {err}", file=sys.stderr)
        return 2


def _runs(
    args: argparse.Namespace, base: dict[str, Any], variants: dict[str, dict[str, Any]], out: Path
) -> list[dict[str, Any]]:
    """Every (seed, variant) run: read back with ``--report-only``; otherwise each seed's warm-up, then the runs from it."""
    if args.report_only:
        return [load_run(v, seed, out / "runs" / f"{v}_seed{seed}") for seed in args.seeds for v in variants]
    inits = run_pool(_warm, [(args.recipe, seed, base, out) for seed in args.seeds], args.workers)
    specs = [
        RunSpec(
            v,
            seed,
            args.recipe,
            {**base, **o, "model.path": init, **FROM_WARM_START},
            str(out / "runs" / f"{v}_seed{seed}"),
            reuse=not args.fresh,
        )
        for seed, init in zip(args.seeds, inits, strict=True)
        for v, o in variants.items()
    ]
    return run_pool(run_training, specs, args.workers)


def _settings(args: argparse.Namespace, cfg: Any, base: dict[str, Any], variants: dict[str, Any]) -> dict[str, Any]:
    """The settings record of an invocation (results.json, table.md; compared by ``--merge``)."""
    return {
        "recipe": args.recipe,
        "seeds": sorted(args.seeds),
        "steps": cfg.steps,
        "eval_every": cfg.eval_every,
        "num_eval": cfg.data.num_eval,
        "prompts_per_step": cfg.prompts_per_step,
        "n_keep": cfg.sampling.n_keep,
        "lr": cfg.train.lr,
        "temperature": cfg.rollout.temperature,
        "max_new_tokens": cfg.rollout.max_new_tokens,
        "overrides": base,
        "variants": variants,
        "quick": args.quick,
        "target_margin": args.target_margin,
    }


def _run(args: argparse.Namespace) -> int:
    from adora_openrlhf.recipes import build_run_config

    flags = {"steps": args.steps, "eval_every": args.eval_every, "data.num_eval": args.num_eval}
    base = base_overrides(
        args.recipe, args.quick, {k: v for k, v in flags.items() if v is not None}, _parse_set(args.set)
    )
    cfg = build_run_config(args.recipe, base)  # a bad recipe or override fails here, before any run
    if cfg.backend != "local":
        raise ValueError(
            f"--recipe: {args.recipe!r} runs on the {cfg.backend} backend; the benchmark needs a local recipe (kk-testbed, kk-tiny)"
        )
    choose_target([0.0], args.target_margin)  # validates the margin up front
    if not args.seeds and not (args.report_only and args.merge):
        raise ValueError(
            "--seeds: give at least one seed; no seed is allowed only with --report-only --merge RESULTS_JSON (the report of that file's runs)"
        )
    variants = {v: VARIANTS[v] for v in args.variants}
    adora_on = {v: _adora_on(args.recipe, {**base, **o}) for v, o in variants.items()}  # validates every variant too
    out = Path(args.out)
    settings = _settings(args, cfg, base, variants)
    merged = earlier_records(Path(args.merge), settings, args.seeds) if args.merge else []  # checked before any run
    started = time.perf_counter()
    runs = _runs(args, base, variants, out)
    step0 = [c["acc_vs_step"][0][1] for c in (curves(r["metrics"]) for r in runs) if c["acc_vs_step"]] + [
        r["acc_step0"] for r in merged
    ]
    if not step0:
        raise ValueError(f"{out / 'runs'}: the runs hold no held-out evaluation (eval/greedy_accuracy)")
    target = choose_target(step0, args.target_margin)
    records = [run_record(r, target, adora_on[r["variant"]]) for r in runs] + [retarget(r, target) for r in merged]
    records = [with_tokens(r) for r in records]
    records.sort(key=lambda r: (r["seed"], list(variants).index(r["variant"])))
    rows, stats = summarise(records)
    table = markdown_table(HEADER, rows)
    seeds = sorted({r["seed"] for r in records})
    settings.update(
        seeds=seeds,
        merged_from=({"path": args.merge, "seeds": sorted({r["seed"] for r in merged})} if merged else None),
        target_accuracy=target,
        ci="95%, Student t over seeds: mean ± t(0.975, n-1) * sd / sqrt(n)",
        workers=args.workers,
        total_wall_s=round(time.perf_counter() - started),  # this invocation's runs only
    )
    if args.report_only and (out / "results.json").exists():
        settings["total_wall_s"] = (
            json.loads((out / "results.json").read_text()).get("settings", {}).get("total_wall_s")
        )
    intro = (
        f"{args.recipe}, seeds {seeds}, {cfg.steps} RL steps of {cfg.prompts_per_step} prompts x {cfg.sampling.n_keep} kept responses, "
        f"{cfg.data.num_eval} held-out puzzles (greedy). Mean ± 95% CI half-width over seeds (Student t). "
        f"Target = max step-0 accuracy {max(step0):.3f} + {args.target_margin} = {target:.3f}; steps and responses to target over the runs that reached it."
    )
    majority = [r["majority_accuracy"] for r in records if r.get("majority_accuracy") is not None]
    if majority:
        intro += f" Majority-answer baseline (eval/majority_accuracy): {min(majority):.3f} to {max(majority):.3f} over seeds."
    subset_header, subset_body = subset_rows(records)
    if subset_body:
        table += "\n\nHeld-out accuracy per subset, mean over seeds:\n\n" + markdown_table(subset_header, subset_body)
    payload: dict[str, Any] = {"settings": settings, "summary": stats}
    if REFERENCE in variants and len(variants) > 1:
        paired, sections = paired_report(records, cfg.data.num_eval)
        table += "\n\n" + sections["markdown"]
        payload.update(paired=paired, power=sections["power"])
    (out / "table.md").write_text(f"settings: {json.dumps(settings, default=str)}\n\n{intro}\n\n{table}\n")
    write_json(out / "results.json", {**payload, "runs": records})
    plot(records, list(variants), out / "curves.png", f"{args.recipe}: mean over seeds {seeds} with 95% CI")
    bench = plots.benchmark_for(out, args.recipe, target, list(variants))  # the docs' target where registered
    written = [out / "table.md", out / "results.json", out / "curves.png"]
    written += plots.draw_runs(bench, plots.sample_efficiency_runs({"runs": records}), out)
    print(f"\n{intro}\n\n{table}\n\nwrote {', '.join(map(str, written))} in {settings['total_wall_s']} s")
    return 0


def _warm(item: tuple[str, int, dict, Path]) -> str:
    recipe, seed, base, out = item
    return warm_start_dir(recipe, seed, base, out)


if __name__ == "__main__":
    raise SystemExit(main())
