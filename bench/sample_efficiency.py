"""Sample efficiency on kk-tiny: GRPO vs GRPO+ADORA vs adaptive sampling (pos, balance) vs both.

``python -m bench.sample_efficiency [--quick] [--seeds 0 1 2] [--steps 60] [--workers 2] [--out DIR]``

Same seeds, same data order and the same warmed-up initial policy for every variant of a seed. Reports,
per variant (mean ± sd over seeds): held-out greedy accuracy at step 0 and at the end, steps and responses
needed to reach the target (GRPO's mean final accuracy), total responses generated (and the ratio to
GRPO), zero-signal group fraction and response length; writes ``results.json``, ``table.md`` and
``curves.png`` (accuracy vs step, accuracy vs responses, zero-signal fraction and length per step).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from itertools import accumulate
from pathlib import Path
from typing import Any, Sequence

from adora_openrlhf.log_setup import setup_logging
from bench.common import (
    VARIANTS,
    RunSpec,
    load_run,
    first_step_reaching,
    fmt_mean_sd,
    markdown_table,
    mean_sd,
    run_pool,
    run_training,
    warm_start_dir,
    write_json,
)

logger = logging.getLogger(__name__)
RECIPE = "kk-tiny"


def curves(metrics: Sequence[dict[str, Any]]) -> dict[str, list]:
    """Per-run series: eval accuracy vs step and vs cumulative responses, per-step zero-signal and length."""
    steps = [m for m in metrics if "sampling/responses_generated" in m]
    cumulative = dict(zip([m["step"] for m in steps], accumulate(m["sampling/responses_generated"] for m in steps)))
    evals = [(m["step"], m["eval/greedy_accuracy"]) for m in metrics if "eval/greedy_accuracy" in m]
    return {
        "acc_vs_step": evals,
        "acc_vs_responses": [(cumulative.get(s, 0.0), acc) for s, acc in evals],
        "zero_signal": [(m["step"], m.get("advantage/zero_signal_fraction", 0.0)) for m in steps],
        "length": [(m["step"], m.get("response/length_mean", 0.0)) for m in steps],
        "total_responses": sum(m["sampling/responses_generated"] for m in steps),
    }


def summarise(runs: list[dict[str, Any]]) -> tuple[list[list[str]], dict[str, Any]]:
    by_variant: dict[str, list[dict]] = {}
    for run in runs:
        by_variant.setdefault(run["variant"], []).append({**run, **curves(run["metrics"])})
    target = mean_sd(r["acc_vs_step"][-1][1] for r in by_variant["GRPO"])[0]
    grpo_responses = mean_sd(r["total_responses"] for r in by_variant["GRPO"])[0]
    rows, stats = [], {"target_accuracy": target}
    for variant, group in by_variant.items():
        start = [r["acc_vs_step"][0][1] for r in group]
        final = [r["acc_vs_step"][-1][1] for r in group]
        steps_to = [first_step_reaching(r["acc_vs_step"], target) for r in group]
        resp_to = [first_step_reaching(r["acc_vs_responses"], target) for r in group]
        reached = [s for s in steps_to if s is not None]
        responses = [r["total_responses"] for r in group]
        zero = [mean_sd(v for _, v in r["zero_signal"])[0] for r in group]
        length = [mean_sd(v for _, v in r["length"])[0] for r in group]
        wall = [r["summary"]["wall_time_s"] for r in group]
        rows.append([
            variant,
            fmt_mean_sd(start),
            fmt_mean_sd(final),
            fmt_mean_sd([f - s0 for f, s0 in zip(final, start)]),
            f"{len(reached)}/{len(group)}: " + (fmt_mean_sd(reached, 1) if reached else "-"),
            fmt_mean_sd([x for x in resp_to if x is not None], 0) if any(x is not None for x in resp_to) else "-",
            f"{mean_sd(responses)[0]:.0f} ({mean_sd(responses)[0] / grpo_responses:.2f}x)",
            fmt_mean_sd(zero),
            fmt_mean_sd(length, 1),
            f"{mean_sd(wall)[0]:.0f} ({mean_sd(wall)[0] / mean_sd(r['summary']['wall_time_s'] for r in by_variant['GRPO'])[0]:.2f}x)",
        ])
        stats[variant] = {"start": start, "final": final, "steps_to_target": steps_to, "responses_to_target": resp_to,
                          "responses": responses, "zero_signal": zero, "length": length, "wall_s": wall}
    return rows, stats


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    panels = [("acc_vs_step", "step", "held-out accuracy"), ("acc_vs_responses", "responses generated", "held-out accuracy"),
              ("zero_signal", "step", "zero-signal group fraction"), ("length", "step", "response length (tokens)")]
    colours = dict(zip(VARIANTS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, (key, xlabel, ylabel) in zip(axes.flat, panels):
        for variant in VARIANTS:
            series = [curves(r["metrics"])[key] for r in runs if r["variant"] == variant]
            if not series:
                continue
            length = min(len(s) for s in series)
            xs = [sum(s[i][0] for s in series) / len(series) for i in range(length)]
            ys = [sum(s[i][1] for s in series) / len(series) for i in range(length)]
            ax.plot(xs, ys, label=variant, color=colours[variant])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0, 0].legend()
    fig.suptitle(f"{RECIPE}: mean over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sample_efficiency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60, help="RL steps per run")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--num-eval", type=int, default=200, help="held-out puzzles")
    parser.add_argument("--workers", type=int, default=2, help="runs in parallel (one torch thread each)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--quick", action="store_true", help="a small check: 20 RL steps, 100 held-out puzzles")
    parser.add_argument("--out", default="bench/results/sample_efficiency")
    parser.add_argument("--report-only", action="store_true", help="rebuild table and plot from the runs already in --out")
    args = parser.parse_args(argv)
    setup_logging()
    if "GRPO" not in args.variants:
        parser.error("--variants must include GRPO (its final accuracy is the target)")
    steps, num_eval = (20, 100) if args.quick else (args.steps, args.num_eval)
    base = {"steps": steps, "eval_every": max(1, min(args.eval_every, steps)), "save_every": 0, "eval_samples": 0, "data.num_eval": num_eval}
    out = Path(args.out)
    started = time.perf_counter()
    if args.report_only:
        runs = [load_run(variant, seed, out / "runs" / f"{variant}_seed{seed}") for seed in args.seeds for variant in args.variants]
    else:
        inits = run_pool(_warm, [(seed, base, out) for seed in args.seeds], args.workers)
        specs = [
            RunSpec(variant, seed, RECIPE, {**base, **VARIANTS[variant], "model.path": init, "warmup.steps": 0}, str(out / "runs" / f"{variant}_seed{seed}"))
            for seed, init in zip(args.seeds, inits)
            for variant in args.variants
        ]
        runs = run_pool(run_training, specs, args.workers)
    rows, stats = summarise(runs)
    header = ["variant", "acc step 0", "acc final", "gain (final - step 0)", "reached target: steps", "responses to target", "responses (vs GRPO)",
              "zero-signal frac", "resp. length", "wall s (vs GRPO)"]
    table = markdown_table(header, rows)
    settings = {"recipe": RECIPE, "seeds": args.seeds, **base, "workers": args.workers, "total_wall_s": round(time.perf_counter() - started)}
    if args.report_only:
        previous = json.loads((out / "results.json").read_text())["settings"] if (out / "results.json").exists() else {}
        settings = {**settings, "total_wall_s": previous.get("total_wall_s")}
    (out / "table.md").write_text(f"settings: {settings}\n\ntarget = GRPO mean final accuracy = {stats['target_accuracy']:.3f}\n\n{table}\n")
    write_json(out / "results.json", {"settings": settings, "stats": stats, "runs": [{k: v for k, v in r.items() if k != "metrics"} for r in runs]})
    plot(runs, out / "curves.png")
    print(f"\n{RECIPE}, seeds {args.seeds}, {steps} RL steps; target = GRPO final accuracy {stats['target_accuracy']:.3f}\n")
    print(table)
    logger.info(f"wrote {out / 'table.md'}, {out / 'results.json'}, {out / 'curves.png'} in {settings['total_wall_s']} s")
    return 0


def _warm(item: tuple[int, dict, Path]) -> str:
    seed, base, out = item
    return warm_start_dir(RECIPE, seed, base, out)


if __name__ == "__main__":
    raise SystemExit(main())
