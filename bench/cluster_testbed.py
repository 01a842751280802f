"""``python -m bench.cluster_testbed``: the kk-testbed learned by both backends from the same warm starts.

Per seed: the kk-testbed warm-up runs once (:func:`bench.common.warm_start_dir`, as in the sample-efficiency
benchmark), the testbed's puzzles (1200 for training, 200 held out, exactly the rows the local backend generates
for that seed) are written as JSONL, and then each variant's RL phase runs twice from that warm start:

- ``local``: the embedded backend (``kk-testbed`` with ``warmup.steps 0``);
- ``openrlhf``: ``python -m adora_openrlhf.train --backend openrlhf --recipe kk-testbed-openrlhf`` in a
  subprocess: OpenRLHF's ``train(args)`` with Ray, a vLLM engine and a DeepSpeed actor, on the CPU when the
  machine has no GPU (gloo weight sync, DeepSpeed's CPU accelerator).

Both evaluate the 200 held-out puzzles greedily before the first step and every 10 steps. Each record holds
``backend``, ``variant``, ``seed``, ``acc_step0``, ``acc_final``, ``wall_s`` (the RL run, warm start excluded;
for openrlhf the whole launch: Ray, engine and DeepSpeed start-up included), ``startup_s`` (openrlhf: launch to
the first step's end minus that step's time), ``step_s`` (mean seconds per RL step), ``responses`` (generated
over the run, all sampling rounds) and the accuracy curve. Results go to ``bench/results/cluster_testbed/``
(``results.json``, ``table.md``; the records of earlier invocations are kept, a run made again replaces its
record); run folders stay under ``--out``. A finished run (its ``record.json``) is reused when the benchmark is
run again with the same settings.

``--replicates VARIANT:SEED:RL_SEED ...`` runs the variant again from the warm start and rows of ``SEED`` with
``RL_SEED`` as the run's seed (data order, sampling, the trainer's randomness), on each backend: the spread of
final accuracy that RL's own randomness gives from one warm start, to judge a difference between the backends
on one seed. Replicate records carry ``rl_seed`` and are tabled apart (the local backend then reads the rows from
the same JSONL files as the openrlhf backend).

``--modes sync async`` runs each openrlhf run of the plan in OpenRLHF's synchronous loop and then in its asynchronous
one (``--train.async_enable``: the next batch generated while this one trains); records carry ``mode``, and an
asynchronous record ``staleness_mean`` (how many optimiser steps old its batches were, on average). Every openrlhf
record also carries its step profile (:func:`step_profile`: median step, generation and update seconds, the largest
gradient norm), and ``table.md`` sets each seed's runs of the modes side by side (:func:`mode_table`).
``--is-correction token`` adds OpenRLHF's importance-sampling correction (``--algo.advantage.is_correction_level``)
to the openrlhf runs; their records carry ``is_correction``.

``--prepare-only`` writes the warm starts and the JSONL files and stops: the inputs of a manual
``--recipe kk-testbed-openrlhf`` run. ``--report-only`` rewrites ``table.md`` from ``results.json`` and stops.

``--regime kk-revisit`` compares the backends on the allocation benchmark's regime instead (``bench/allocation.py``:
80 steps on the first 128 training puzzles, 1000 held out, evaluated every 5 steps), with its variants (e.g.
``Knapsack-0.5``): the openrlhf run starts from that benchmark's warm start of the seed and trains on the same 128
puzzles (OpenRLHF's dataloader passes over them ``train.num_episodes`` times); the local record is that benchmark's
own run of the variant and seed (made there when missing). Records carry ``regime``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.cluster_testbed_report import (
    table,
)
from bench.common import (
    FROM_WARM_START,
    VARIANTS,
    RunSpec,
    read_records,
    run_training,
    save_records,
    saved_run_match,
    warm_start_dir,
    write_records,
)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "cluster_testbed"
LOCAL_RECIPE, CLUSTER_RECIPE = "kk-testbed", "kk-testbed-openrlhf"
REVISIT = "kk-revisit"  # the allocation benchmark's regime (--regime kk-revisit)
ALLOCATION_RESULTS = REPO / "bench" / "results" / "allocation"
ACCURACY_KEY = "eval_default_pass1"  # OpenRLHF's evaluation: the 0/1 scores' mean (rows carry no datasource)


def prepare(seed: int, out: Path) -> dict[str, str]:
    """The warm start and the testbed's rows of ``seed`` as JSONL: ``{"model", "train", "test"}`` paths."""
    from adora_openrlhf.recipes import build_run_config
    from adora_openrlhf.rows import load_run_rows
    from adora_openrlhf.testbed_files import write_rows_jsonl

    model = warm_start_dir(LOCAL_RECIPE, seed, {}, out)
    data = out / f"data_seed{seed}"
    if not (data / "test.jsonl").exists():
        train, held = load_run_rows(build_run_config(LOCAL_RECIPE, {"seed": seed}).data, seed)
        write_rows_jsonl(train, data / "train.jsonl")
        write_rows_jsonl(held, data / "test.jsonl")
    return {"model": model, "train": str(data / "train.jsonl"), "test": str(data / "test.jsonl")}


def prepare_revisit(seed: int, out: Path) -> dict[str, str]:
    """kk-revisit's inputs of ``seed`` for the openrlhf backend: the allocation benchmark's warm start (the local
    runs' own), the first ``data.rl_prompts`` training puzzles (those the local backend's RL draws from) and the
    held-out puzzles as JSONL."""
    from adora_openrlhf.recipes import build_run_config
    from adora_openrlhf.rows import load_run_rows
    from adora_openrlhf.testbed_files import write_rows_jsonl

    model = warm_start_dir(REVISIT, seed, {}, ALLOCATION_RESULTS)
    data = out / f"data_{REVISIT}_seed{seed}"
    if not (data / "test.jsonl").exists():
        cfg = build_run_config(REVISIT, {"seed": seed})
        train, held = load_run_rows(cfg.data, seed)
        write_rows_jsonl(train[: cfg.data.rl_prompts], data / "train.jsonl")
        write_rows_jsonl(held, data / "test.jsonl")
    return {"model": model, "train": str(data / "train.jsonl"), "test": str(data / "test.jsonl")}


def revisit_flags(variant: str) -> list[str]:
    """The openrlhf command's flags for kk-revisit: its steps, evaluation and checkpoint cadence, the variant's
    settings (``bench.allocation.VARIANTS``), and enough passes over the 128 puzzles for every step (an allocator
    draws ``allocation.candidates`` x ``prompts_per_step`` of them per step)."""
    from adora_openrlhf.recipes import build_run_config
    from bench.allocation import VARIANTS as ALLOCATION_VARIANTS

    revisit = build_run_config(REVISIT, {})
    cluster = build_run_config(CLUSTER_RECIPE, {**ALLOCATION_VARIANTS[variant], "steps": revisit.steps})
    drawn = revisit.steps * cluster.allocation.candidate_count(cluster.prompts_per_step)
    episodes = -(-drawn // revisit.data.rl_prompts)
    extra = {"openrlhf": {**cluster.extra["openrlhf"], "train.num_episodes": episodes}}
    schedule = {"steps": revisit.steps, "eval_every": revisit.eval_every, "save_every": revisit.save_every}
    return cli_flags({**schedule, **ALLOCATION_VARIANTS[variant], "extra": extra})


def local_revisit_record(variant: str, seed: int) -> dict[str, Any]:
    """The allocation benchmark's local run of ``variant`` and ``seed`` (made there when missing) as a record."""
    from bench.allocation import VARIANTS as ALLOCATION_VARIANTS

    model = warm_start_dir(REVISIT, seed, {}, ALLOCATION_RESULTS)
    overrides = {**ALLOCATION_VARIANTS[variant], "model.path": model, "report_to": "none", **FROM_WARM_START}
    run_dir = ALLOCATION_RESULTS / "runs" / f"{variant}_seed{seed}"
    spec = RunSpec(variant, seed, REVISIT, overrides, str(run_dir), reuse=True)
    if (run_dir / "config.json").exists() and not saved_run_match(spec)[1]:  # never replace the other benchmark's run
        raise SystemExit(f"{run_dir} holds a run of other settings; remake it with python -m bench.allocation")
    run = run_training(spec)
    steps = [r for r in run["metrics"] if "reward/mean" in r]
    curve = [(r["step"], r["eval/greedy_accuracy"]) for r in run["metrics"] if "eval/greedy_accuracy" in r]
    times = [r["time/step_s"] for r in steps if "time/step_s" in r]
    return {
        "backend": "local",
        "regime": REVISIT,
        "variant": variant,
        "seed": seed,
        "acc_step0": curve[0][1],
        "acc_final": curve[-1][1],
        "wall_s": round(run["summary"].get("wall_time_s", 0.0), 1),
        "step_s": sum(times) / len(times) if times else None,
        "responses": int(sum(r.get("sampling/responses_generated", 0) for r in steps)),
        "curve": curve,
    }


def cli_flags(overrides: dict[str, Any]) -> list[str]:
    """A variant's dotted overrides as command-line flags (JSON for lists and mappings)."""
    flags = []
    for name, value in overrides.items():
        flags += [f"--{name}", json.dumps(value) if isinstance(value, (list, dict, bool)) else str(value)]
    return flags


def reuse(run_dir: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    """A finished run's record when it was made with these settings."""
    path = run_dir / "record.json"
    if path.exists():
        record = json.loads(path.read_text())
        if record.get("settings") == settings:
            return record
    return None


def run_name(variant: str, seed: int, rl_seed: int | None) -> str:
    """A run's folder name: ``VARIANT_seedSEED``, with ``_rlRL_SEED`` for a replicate."""
    return f"{variant}_seed{seed}" + ("" if rl_seed is None else f"_rl{rl_seed}")


def openrlhf_run_dir(
    out: Path,
    variant: str,
    seed: int,
    rl_seed: int | None = None,
    regime: str | None = None,
    mode: str = "sync",
    is_correction: str = "off",
) -> Path:
    """An openrlhf run's folder: :func:`run_name` with ``_REGIME``, ``_async`` and ``_is-LEVEL`` as they apply."""
    suffix = (f"_{regime}" if regime else "") + ("_async" if mode == "async" else "")
    suffix += f"_is-{is_correction}" if is_correction != "off" else ""
    return out / "openrlhf" / (run_name(variant, seed, rl_seed) + suffix)


def step_profile(steps: list[dict[str, Any]]) -> dict[str, float | None]:
    """What the synchronous/asynchronous table compares, from an openrlhf run's per-step metrics: the medians over
    the steps of the step time (``timing/step_total``), vLLM generation (``timing/generation``) and the DeepSpeed
    update (``timing/ppo_train``), in seconds, and the largest actor gradient norm (``actor_grad_norm``)."""
    import statistics

    def median(key: str) -> float | None:
        values = [r[key] for r in steps if key in r]
        return round(statistics.median(values), 3) if values else None

    norms = [r["actor_grad_norm"] for r in steps if "actor_grad_norm" in r]
    return {
        "step_s_median": median("timing/step_total"),
        "generation_s": median("timing/generation"),
        "update_s": median("timing/ppo_train"),
        "grad_norm_max": round(max(norms), 4) if norms else None,
    }


def with_step_profile(record: dict[str, Any], out: Path) -> dict[str, Any]:
    """An openrlhf ``record`` with its :func:`step_profile` read from its run folder under ``out`` when it lacks one
    (records made before the profile was recorded) and the folder's metrics are there; otherwise as it is."""
    if record.get("backend") != "openrlhf" or "step_s_median" in record:
        return record
    run_dir = openrlhf_run_dir(
        out,
        record["variant"],
        record["seed"],
        record.get("rl_seed"),
        record.get("regime"),
        record.get("mode", "sync"),
        record.get("is_correction", "off"),
    )
    metrics_path = run_dir / "run" / "metrics.jsonl"
    if not metrics_path.exists():
        return record
    from adora_openrlhf.rundir.metrics import read_metrics

    return {**record, **step_profile([r for r in read_metrics(metrics_path) if not r.get("eval")])}


def with_rl_seed(record: dict[str, Any], rl_seed: int | None) -> dict[str, Any]:
    """``record`` with ``rl_seed`` set when the run is a replicate (main runs carry none)."""
    return record if rl_seed is None else {**record, "rl_seed": rl_seed}


def run_openrlhf(
    variant: str,
    seed: int,
    inputs: dict[str, str],
    out: Path,
    rl_seed: int | None = None,
    regime: str | None = None,
    mode: str = "sync",
    is_correction: str = "off",
) -> dict[str, Any]:
    """One ``--backend openrlhf`` run of the variant from the seed's warm start (run seed ``rl_seed`` for a
    replicate, else ``seed``; ``regime`` kk-revisit: :func:`revisit_flags`; ``mode`` async: OpenRLHF's asynchronous
    loop, ``--train.async_enable``; ``is_correction`` token or seq: ``--algo.advantage.is_correction_level``); its
    record."""
    run_dir = openrlhf_run_dir(out, variant, seed, rl_seed, regime, mode, is_correction)
    settings = with_rl_seed(
        {"backend": "openrlhf", "variant": variant, "seed": seed, "inputs": inputs, "recipe": CLUSTER_RECIPE}, rl_seed
    )
    variant_flags = cli_flags(VARIANTS[variant]) if regime is None else revisit_flags(variant)
    if regime is not None:
        settings["regime"] = regime
    if mode == "async":
        settings["mode"] = mode
        variant_flags = [*variant_flags, "--train.async_enable"]
    if is_correction != "off":
        settings["is_correction"] = is_correction
        variant_flags = [*variant_flags, "--algo.advantage.is_correction_level", is_correction]
    if (found := reuse(run_dir, settings)) is not None:
        return found
    command = [
        sys.executable, "-m", "adora_openrlhf.train", "--backend", "openrlhf", "--recipe", CLUSTER_RECIPE,
        "--model", inputs["model"], "--data.train_path", inputs["train"], "--data.eval_path", inputs["test"],
        "--seed", str(seed if rl_seed is None else rl_seed), "--output_dir", str(run_dir / "run"), "--overwrite",
        *variant_flags,
    ]  # fmt: skip
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    log_path = run_dir.parent / f"{run_dir.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.time()
    with open(log_path, "w") as log:
        done = subprocess.run(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.time() - start
    if done.returncode != 0:
        raise SystemExit(f"openrlhf run {variant} seed {seed} failed (status {done.returncode}); see {log_path}")
    from adora_openrlhf.rundir.metrics import read_metrics

    metrics = read_metrics(run_dir / "run" / "metrics.jsonl")
    steps = [r for r in metrics if not r.get("eval")]
    curve = [(r["step"], r[ACCURACY_KEY]) for r in metrics if r.get("eval")]
    step_s = [r["timing/step_total"] for r in steps]
    record = {
        "backend": "openrlhf",
        **({"regime": regime} if regime else {}),
        **({"mode": mode} if mode == "async" else {}),  # a record without one ran the synchronous loop
        **({"is_correction": is_correction} if is_correction != "off" else {}),  # none: no IS correction
        "variant": variant,
        "seed": seed,
        "acc_step0": curve[0][1],
        "acc_final": curve[-1][1],
        "wall_s": round(wall, 1),
        "step_s": sum(step_s) / len(step_s),
        "responses": int(sum(r.get("sampling/responses_generated", r.get("rollout/num_samples", 0)) for r in steps)),
        "curve": curve,
        **step_profile(steps),
        "settings": settings,
    }
    if mode == "async":  # how many optimiser steps old the trained-on batches were
        record["staleness_mean"] = sum(r["async/staleness_mean"] for r in steps) / len(steps)
    record = with_rl_seed(record, rl_seed)
    (run_dir / "record.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def run_local(variant: str, seed: int, inputs: dict[str, str], out: Path, rl_seed: int | None = None) -> dict[str, Any]:
    """The local backend's run of the variant from the same warm start (bench.common.run_training); its record.
    A replicate (``rl_seed``) reads the seed's rows from the JSONL files and runs with seed ``rl_seed``."""
    overrides = {**FROM_WARM_START, **VARIANTS[variant], "model.path": inputs["model"]}
    if rl_seed is not None:
        overrides.update({"data.train_path": inputs["train"], "data.eval_path": inputs["test"]})
    start = time.time()
    run_dir = out / "local" / run_name(variant, seed, rl_seed)
    run = run_training(
        RunSpec(variant, seed if rl_seed is None else rl_seed, LOCAL_RECIPE, overrides, str(run_dir), reuse=True)
    )
    steps = [r for r in run["metrics"] if "eval/greedy_accuracy" not in r or "reward/mean" in r]
    curve = [(r["step"], r["eval/greedy_accuracy"]) for r in run["metrics"] if "eval/greedy_accuracy" in r]
    times = [r["time/step_s"] for r in steps if "time/step_s" in r]
    record = {
        "backend": "local",
        "variant": variant,
        "seed": seed,
        "acc_step0": curve[0][1],
        "acc_final": curve[-1][1],
        "wall_s": round(run["summary"].get("wall_time_s", time.time() - start), 1),
        "step_s": sum(times) / len(times) if times else None,
        "responses": int(sum(r.get("sampling/responses_generated", 0) for r in steps)),
        "curve": curve,
    }
    return with_rl_seed(record, rl_seed)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster_testbed", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="*",
        default=[0, 1, 2],
        help="warm-start seeds of the main runs (none: only --extra and --replicates)",
    )
    parser.add_argument(
        "--variants",
        nargs="*",
        default=["GRPO", "GRPO+ADORA"],
        help=f"of bench.common.VARIANTS {sorted(VARIANTS)} (with --regime {REVISIT}: of bench.allocation.VARIANTS)",
    )
    parser.add_argument(
        "--extra",
        nargs="*",
        default=["Ada-balance:0"],
        help="more openrlhf runs as VARIANT:SEED (default: Ada-balance on seed 0)",
    )
    parser.add_argument("--backends", nargs="+", default=["local", "openrlhf"], choices=["local", "openrlhf"])
    parser.add_argument(
        "--out", type=Path, default=REPO / "runs" / "cluster_testbed", help="warm starts, data and run folders"
    )
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--replicates",
        nargs="*",
        default=[],
        help="runs again from a seed's warm start and rows with another run seed, as VARIANT:SEED:RL_SEED",
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["sync"],
        choices=["sync", "async"],
        help="openrlhf runs in OpenRLHF's synchronous loop, its asynchronous one (--train.async_enable), or both "
        "side by side (each seed and variant in both modes, one after the other)",
    )
    parser.add_argument(
        "--is-correction",
        choices=["off", "token", "seq"],
        default="off",
        help="openrlhf runs with OpenRLHF's importance-sampling correction at this level "
        "(--algo.advantage.is_correction_level): the loss reweights each token by the trainer's over the engine's "
        "probability, which differ when a batch was generated by an older policy (asynchronous training)",
    )
    parser.add_argument("--prepare-only", action="store_true", help="write the warm starts and JSONL files, then stop")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite table.md from --results' results.json and stop (an openrlhf record without a step profile gets "
        "one from its run folder's metrics under --out)",
    )
    parser.add_argument(
        "--regime",
        choices=["kk-testbed", REVISIT],
        default="kk-testbed",
        help=f"{REVISIT}: the allocation benchmark's regime and variants, --seeds x --variants on both backends",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.report_only:
        return report_only(args.results, args.out)
    if args.regime == REVISIT:
        return main_revisit(args, parser)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; choose from {sorted(VARIANTS)}")
    extra = [(v, int(s)) for v, s in (item.split(":") for item in args.extra)]
    replicates = [parse_replicate(item, parser) for item in args.replicates]
    if args.prepare_only:
        print(
            json.dumps(
                {seed: prepare(seed, args.out) for seed in sorted({*args.seeds, *(s for _, s in extra)})}, indent=2
            )
        )
        return 0
    inputs: dict[int, dict[str, str]] = {}  # prepared when a seed's first run comes
    plan = [(backend, v, s, None) for s in args.seeds for v in args.variants for backend in ("openrlhf", "local")]
    plan += [("openrlhf", v, s, None) for v, s in extra] + [("local", v, s, None) for v, s in extra]
    plan += [(backend, v, s, r) for v, s, r in replicates for backend in ("openrlhf", "local")]
    records = read_records(args.results)  # earlier runs are kept
    for backend, variant, seed, rl_seed in plan:
        if backend not in args.backends:
            continue
        if seed not in inputs:
            inputs[seed] = prepare(seed, args.out)
        for mode in args.modes if backend == "openrlhf" else ["sync"]:
            print(f"[cluster_testbed] {backend} {run_name(variant, seed, rl_seed)} {mode}", file=sys.stderr, flush=True)
            if backend == "local":
                record = run_local(variant, seed, inputs[seed], args.out, rl_seed)
            else:
                record = run_openrlhf(
                    variant, seed, inputs[seed], args.out, rl_seed, mode=mode, is_correction=args.is_correction
                )
            key = ("backend", "regime", "mode", "is_correction", "variant", "seed", "rl_seed")
            records = save_records(args.results, records, record, key, table)
    print(table(records))
    return 0


def report_only(results: Path, out: Path) -> int:
    """``--report-only``: the records of ``results`` (each completed by :func:`with_step_profile`) written back with
    their table; nothing runs."""
    records = [with_step_profile(r, out) for r in read_records(results)]
    if not records:
        raise SystemExit(f"--report-only: no records in {results / 'results.json'}; run the benchmark first")
    print(write_records(results, records, table))
    return 0


def main_revisit(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``--regime kk-revisit``: each seed x variant (of ``bench.allocation.VARIANTS``) on the chosen backends."""
    from bench.allocation import VARIANTS as ALLOCATION_VARIANTS

    unknown = [v for v in args.variants if v not in ALLOCATION_VARIANTS]
    if unknown:
        parser.error(
            f"--variants: {unknown} are not variants of bench.allocation; choose from {list(ALLOCATION_VARIANTS)}"
        )
    records = read_records(args.results)
    key = ("backend", "regime", "variant", "seed", "rl_seed")
    for seed in args.seeds:
        for variant in args.variants:
            for backend in args.backends:
                print(f"[cluster_testbed] {REVISIT} {backend} {variant} seed {seed}", file=sys.stderr, flush=True)
                if backend == "local":
                    record = local_revisit_record(variant, seed)
                else:
                    record = run_openrlhf(variant, seed, prepare_revisit(seed, args.out), args.out, regime=REVISIT)
                records = save_records(args.results, records, record, key, table)
    print(table(records))
    return 0


def parse_replicate(item: str, parser: argparse.ArgumentParser) -> tuple[str, int, int]:
    """``VARIANT:SEED:RL_SEED`` -> (variant, seed, rl_seed); a malformed item stops with the option named."""
    parts = item.split(":")
    if len(parts) != 3 or parts[0] not in VARIANTS or not all(p.isdigit() for p in parts[1:]):
        parser.error(
            f"--replicates {item!r}: expected VARIANT:SEED:RL_SEED with a variant of {sorted(VARIANTS)} and two seeds"
        )
    if parts[1] == parts[2]:
        parser.error(f"--replicates {item!r}: RL_SEED equal to SEED is the main run; choose another run seed")
    return parts[0], int(parts[1]), int(parts[2])


if __name__ == "__main__":
    sys.exit(main())
