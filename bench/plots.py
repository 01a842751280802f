"""Plots and the claims table of the method benchmarks, drawn from their committed records.

``python -m bench.plots [--results bench/results] [--claims]``

Per benchmark (:data:`BENCHMARKS`), beside its records in ``bench/results/NAME/`` (and by the allocation and
sample-efficiency benchmarks themselves at the end of a run, :func:`draw_runs`):

- ``accuracy.png``: held-out greedy accuracy against cumulative generated tokens, each seed a faint line, the mean
  over seeds at each evaluation in bold, one colour per method;
- ``target.png``: tokens to the benchmark's stated target accuracy per method, the geometric mean over
  the seeds that reach it with its 95% t interval (on the logs), and how many seeds never reach it; a method that
  reaches it on no seed is drawn as "not reached".

``--tables`` prints each benchmark's table (:func:`summary_markdown`), ``--claims`` the claims table of
``docs/results.md`` (:func:`claims_markdown`), every number read from the records: the stored paired per-seed
statistics (exact sign-flip and paired t, Holm over the variants; ``bench/paired_stats.py``); the removed cluster and
TRL testbeds' rows are stored as computed (``claims.md`` beside their records).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.budget import cost_to_reach, token_curve
from bench.paired_stats import paired_t

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Run:
    """One run: method, seed (a unit label), and its curve [(x, held-out accuracy)] at each evaluation."""

    method: str
    seed: str
    curve: list[tuple[float, float]]


@dataclass(frozen=True)
class Benchmark:
    """A benchmark's records folder, how to read its runs, its target and the methods each plot panel shows."""

    name: str
    title: str
    target: float
    panels: tuple[tuple[str, ...], ...]


def allocation_runs(data: dict[str, Any]) -> list[Run]:
    return [
        Run(r["variant"], f"{r['seed']}/{r.get('warm_start', '')}", [(float(x), float(y)) for x, y in r["curve"]])
        for r in data["records"]
    ]


def _curve_runs(data: dict[str, Any]) -> list[Run]:
    """Records that store their curve, [cumulative generated tokens, accuracy] at each evaluation, by method."""
    return [Run(r["method"], str(r["seed"]), [(float(x), float(y)) for x, y in r["curve"]]) for r in data["records"]]


def sample_efficiency_runs(data: dict[str, Any]) -> list[Run]:
    runs = []
    for r in data["runs"]:
        curve = token_curve(r)
        if curve:
            runs.append(Run(r["variant"], str(r["seed"]), [(float(x), float(y)) for x, y in curve]))
    return runs


READERS = {
    "allocation": allocation_runs,
    "allocation_kk_testbed": allocation_runs,
    "sample_efficiency": sample_efficiency_runs,
    "geo_testbed": sample_efficiency_runs,
    "ppo_kk_testbed": _curve_runs,
}

BENCHMARKS = (
    Benchmark(
        "sample_efficiency",
        "kk-testbed: the methods",
        0.80,
        (
            (
                "GRPO",
                "GRPO+ADORA",
                "GRPO+ADORA-amp",
                "Ada-pos",
                "Ada-balance",
                "Ada-balance+ADORA",
                "DAPO-filter",
                "adaGRPO",
            ),
        ),
    ),
    Benchmark(
        "allocation_kk_testbed",
        "kk-testbed: the allocators",
        0.80,
        (("GRPO", "Knapsack-0.5", "Skip", "Difficulty"),),
    ),
    Benchmark(
        "allocation",
        "kk-revisit",
        0.80,
        (
            (
                "GRPO",
                "GRPO+ADORA",
                "Ada-balance",
                "DAPO-filter",
                "Skip",
                "Difficulty",
                "Knapsack-0.5",
                "GRPO-n4",
                "Knapsack-0.5+DAPO",
            ),
            (
                "GRPO",
                "GRPO-cosine",
                "GRPO-40-cosine",
                "Knapsack-0.5-cosine",
                "Knapsack-0.5-info-cosine",
                "GRPO-lr5e-5",
                "Knapsack-0.5-lr5e-5",
            ),
        ),
    ),
    Benchmark("geo_testbed", "geo-testbed", 0.60, (("GRPO", "GRPO+ADORA", "GRPO+ADORA-amp", "Ada-balance"),)),
    Benchmark("ppo_kk_testbed", "kk-testbed: PPO with a critic", 0.80, (("GRPO", "PPO", "PPO+ADORA"),)),
)


def load_runs(bench: Benchmark, results: Path = RESULTS) -> list[Run]:
    """The runs of ``bench`` from ``results/NAME/results.json``."""
    data = json.loads((results / bench.name / "results.json").read_text())
    return READERS[bench.name](data)


def mean_curve(curves: Sequence[Sequence[tuple[float, float]]]) -> list[tuple[float, float]]:
    """The mean over runs at each evaluation index (x and accuracy both averaged), over the runs that have it."""
    out = []
    for k in range(max((len(c) for c in curves), default=0)):
        points = [c[k] for c in curves if len(c) > k]
        out.append((statistics.fmean(p[0] for p in points), statistics.fmean(p[1] for p in points)))
    return out


def cost_to_target(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """x at the first evaluation at or above ``target`` (``budget.cost_to_reach``), None where no evaluation is."""
    cost = cost_to_reach(curve, target)
    return cost[0] if cost is not None and cost[1] else None


@dataclass(frozen=True)
class TargetBar:
    """Cost to the target of one method: geometric mean over the reaching seeds, its 95% interval, counts."""

    method: str
    reached: int
    seeds: int
    mean: float | None
    low: float | None
    high: float | None


def target_bars(runs: Sequence[Run], methods: Sequence[str], target: float) -> list[TargetBar]:
    """Per method, the cost to ``target`` over its runs: geometric mean and 95% t interval of the reaching runs' costs
    (a cost of 0, a run already at the target at the start, counts as 1 on the log scale); None where none reaches it."""
    bars = []
    for method in methods:
        costs = [cost_to_target(r.curve, target) for r in runs if r.method == method]
        reached = [max(c, 1.0) for c in costs if c is not None]
        mean = low = high = None
        if reached:
            stat = paired_t([math.log(c) for c in reached])
            mean = math.exp(stat.mean)
            if stat.ci_low is not None:
                low, high = math.exp(stat.ci_low), math.exp(stat.ci_high)
        bars.append(TargetBar(method, len(reached), len(costs), mean, low, high))
    return bars


TOKENS_LABEL, TOKENS_SCALE = "generated tokens (millions)", 1e6


def plot_accuracy(bench: Benchmark, runs: Sequence[Run], path: Path) -> None:
    """``accuracy.png``: each run faint, the mean over seeds bold, one colour per method, one panel per method group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label, scale = TOKENS_LABEL, TOKENS_SCALE
    methods = list(dict.fromkeys(m for panel in bench.panels for m in panel))
    colours = dict(zip(methods, plt.get_cmap("tab20" if len(methods) > 10 else "tab10").colors, strict=False))
    fig, axes = plt.subplots(1, len(bench.panels), figsize=(7.5 * len(bench.panels), 5), squeeze=False, sharey=True)
    for ax, panel in zip(axes[0], bench.panels, strict=True):
        for method in panel:
            curves = [r.curve for r in runs if r.method == method]
            if not curves:
                continue
            for c in curves:
                ax.plot([x / scale for x, _ in c], [y for _, y in c], color=colours[method], alpha=0.18, linewidth=0.8)
            mean = mean_curve(curves)
            ax.plot(
                [x / scale for x, _ in mean],
                [y for _, y in mean],
                color=colours[method],
                linewidth=2.4,
                marker="o",
                markersize=3,
                label=f"{method} ({len(curves)})",
            )
        ax.axhline(bench.target, color="black", linestyle=":", linewidth=0.8)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[0][0].set_ylabel("held-out greedy accuracy")
    fig.suptitle(f"{bench.title}: accuracy, each run faint, mean over seeds bold (runs per method)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_target(bench: Benchmark, runs: Sequence[Run], path: Path) -> None:
    """``target.png``: horizontal bars of the cost to the target per method with 95% intervals; not-reached counts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label, scale = TOKENS_LABEL, TOKENS_SCALE
    methods = list(dict.fromkeys(m for panel in bench.panels for m in panel if any(r.method == m for r in runs)))
    bars = target_bars(runs, methods, bench.target)
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(bars) + 1.4))
    top = max((b.high or b.mean or 0.0) for b in bars) / scale or 1.0
    for i, bar in enumerate(bars):
        y = len(bars) - 1 - i
        if bar.mean is None:
            ax.text(0.01 * top, y, f"not reached (0 of {bar.seeds} runs)", va="center", fontsize=8, color="tab:red")
            continue
        err = None
        if bar.low is not None:
            err = [[(bar.mean - bar.low) / scale], [(bar.high - bar.mean) / scale]]
        ax.barh(y, bar.mean / scale, xerr=err, color="tab:blue", alpha=0.7, capsize=3)
        missing = bar.seeds - bar.reached
        note = f"{bar.reached} of {bar.seeds}" + (f"; not reached: {missing}" if missing else "")
        ax.text((bar.high or bar.mean) / scale + 0.02 * top, y, note, va="center", fontsize=7)
    ax.set_yticks(range(len(bars)), [b.method for b in reversed(bars)], fontsize=8)
    ax.set_xlim(0, top * 1.45)
    ax.set_xlabel(f"{label} to held-out accuracy {bench.target:.2f}")
    ax.set_title(
        f"{bench.title}: tokens to {bench.target:.2f}, geometric mean of the runs that reach it, 95% interval",
        fontsize=9,
    )
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def draw(bench: Benchmark, results: Path = RESULTS) -> list[Path]:
    """Both plots of ``bench`` beside its records; the paths written."""
    return draw_runs(bench, load_runs(bench, results), results / bench.name)


def draw_runs(bench: Benchmark, runs: Sequence[Run], folder: Path) -> list[Path]:
    """``accuracy.png`` and ``target.png`` of ``runs`` in ``folder`` (a benchmark's own run draws them this way)."""
    plot_accuracy(bench, runs, folder / "accuracy.png")
    plot_target(bench, runs, folder / "target.png")
    return [folder / "accuracy.png", folder / "target.png"]


def benchmark_for(folder: Path, title: str, target: float, methods: Sequence[str]) -> Benchmark:
    """The registered benchmark named like ``folder`` (its target and panels), else one panel of ``methods``."""
    known = next((b for b in BENCHMARKS if b.name == folder.name), None)
    return known or Benchmark(folder.name, title, target, (tuple(methods),))


def summary_markdown(bench: Benchmark, runs: Sequence[Run]) -> str:
    """A benchmark's table: per method, its runs, final accuracy (mean, range), budget spent (mean), and the runs
    that reach the target with the geometric mean of their cost (:func:`target_bars`)."""
    scale = TOKENS_SCALE
    methods = list(dict.fromkeys(m for panel in bench.panels for m in panel if any(r.method == m for r in runs)))
    bars = {b.method: b for b in target_bars(runs, methods, bench.target)}
    lines = [
        f"| method | runs | final accuracy: mean (range) | M tokens generated | reached {bench.target:.2f} | M tokens to {bench.target:.2f} |",
        "|---|---|---|---|---|---|",
    ]
    for method in methods:
        mine = [r for r in runs if r.method == method]
        finals = [r.curve[-1][1] for r in mine]
        spent = statistics.fmean(r.curve[-1][0] for r in mine) / scale
        bar = bars[method]
        cost = "not reached" if bar.mean is None else f"{bar.mean / scale:.3g}"
        lines.append(
            f"| {method} | {len(mine)} | {statistics.fmean(finals):.3f} ({min(finals):.3f}-{max(finals):.3f}) | "
            f"{spent:.3g} | {bar.reached} of {bar.seeds} | {cost} |"
        )
    return "\n".join(lines)


# --- the claims table ----------------------------------------------------------------------------------------------

ALLOCATION_COMMAND = "`python -m bench.allocation --seeds 0 1 2 3 4 5 6 7 8 9 --variants {v}`"
CLAIMS = (
    # (regime, records folder, methods, how the rows are read)
    ("kk-testbed", "sample_efficiency", BENCHMARKS[0].panels[0][1:], "stored"),
    ("kk-testbed", "allocation_kk_testbed", ("Knapsack-0.5", "Skip", "Difficulty"), "allocation"),
    (
        "kk-revisit",
        "allocation",
        tuple(m for panel in BENCHMARKS[2].panels for m in panel if m != "GRPO"),
        "allocation",
    ),
    ("geo-testbed", "geo_testbed", ("GRPO+ADORA", "GRPO+ADORA-amp", "Ada-balance"), "stored"),
    # the removed cluster and TRL testbeds (last version: commit 2e752da): their rows as that commit computed them
    ("cluster testbed", "cluster_testbed", (), "frozen"),
    ("TRL testbed", "trl_testbed", (), "frozen"),
)
COMMANDS = {
    "sample_efficiency": "`python -m bench.sample_efficiency --seeds 0 1 2 3 4 5 6 7 8 9`",
    "allocation_kk_testbed": "`python -m bench.allocation --recipe kk-testbed --seeds 0 1 2 3 4 --variants {v}`",
    "allocation": ALLOCATION_COMMAND,
    "geo_testbed": "`python -m bench.sample_efficiency --recipe geo-testbed --seeds 0 1 2 3 4`",
}


def _ratio(record: dict[str, Any] | None) -> str:
    if record is None or record.get("ratio") is None:
        return "-"
    interval = (
        f" [{record['ratio_low']:.2f}, {record['ratio_high']:.2f}]" if record.get("ratio_low") is not None else ""
    )
    return f"{record['ratio']:.2f}x{interval}"


def _diff(mean: float, low: float | None, high: float | None) -> str:
    return f"{mean:+.3f}" + (f" [{low:+.3f}, {high:+.3f}]" if low is not None else "")


def _verdict(p_sf: float | None, p_t: float | None, pilot: bool, holm: bool = True) -> str:
    if p_sf is None or p_t is None:
        return "-"
    word = "established" if (p_sf < 0.05 and p_t < 0.05 and not pilot) else "not established"
    return f"{word} (sign-flip {p_sf:.3f}, t {p_t:.3f}{', Holm' if holm else ''})"


def _stored_rows(regime: str, folder: str, methods: Sequence[str], data: dict[str, Any]) -> list[list[str]]:
    """sample_efficiency / geo_testbed records: paired ``acc_final`` and ``tokens_to_ref_final``, tokens from runs."""
    paired = {(p["variant"], p["metric"]): p for p in data["paired"]}
    tokens = {(r["variant"], r["seed"]): r.get("tokens") for r in data["runs"]}
    seeds = data["settings"]["seeds"]
    rows = []
    for method in methods:
        acc, cost = paired[(method, "acc_final")], paired[(method, "tokens_to_ref_final")]
        logs = [math.log(tokens[(method, s)] / tokens[("GRPO", s)]) for s in seeds]
        ratio = math.exp(statistics.fmean(logs))
        undetermined = f", {cost['undetermined']} undetermined" if cost.get("undetermined") else ""
        missing = f", not reached on {cost['not_reached']}{undetermined}" if cost.get("not_reached") else ""
        cost_text = f"{cost['ratio']:.2f}x [{cost['ratio_ci_low']:.2f}, {cost['ratio_ci_high']:.2f}]{missing}"
        cost_text += f"; {_verdict(cost['p_sign_flip_holm'], cost['p_holm'], False)}"
        rows.append(
            [
                method,
                regime,
                str(len(seeds)),
                f"{ratio:.2f}x",
                _diff(acc["mean_diff"], acc["ci_low"], acc["ci_high"]),
                f"GRPO's final: {cost_text}",
                _verdict(acc["p_sign_flip_holm"], acc["p_holm"], False),
                COMMANDS[folder],
                f"[{folder}](../bench/results/{folder}/table.md)",
            ]
        )
    return rows


def _allocation_rows(regime: str, folder: str, methods: Sequence[str], data: dict[str, Any]) -> list[list[str]]:
    """bench.allocation records: paired ``tokens_total``, ``acc_final`` and ``tokens_to_0.80`` against GRPO."""
    paired = {(p["variant"], p["metric"]): p for p in data["paired"] if p.get("reference") in (None, "GRPO")}
    rows = []
    for method in methods:
        acc, cost, total = (paired[(method, m)] for m in ("acc_final", "tokens_to_0.80", "tokens_total"))
        pilot = bool(acc.get("pilot"))
        undetermined = len(cost.get("undetermined") or [])
        note = f", {undetermined} undetermined" if undetermined else ""
        verdict = _verdict(acc["p_sign_flip_holm"], acc["p_value_holm"], pilot, holm=not pilot)
        if pilot:
            verdict = f"pilot (raw sign-flip {acc['p_sign_flip']:.3f}, t {acc['p_value']:.3f})"
        rows.append(
            [
                method,
                regime,
                str(acc["n"]),
                f"{total['ratio']:.2f}x",
                _diff(acc["mean_diff"], acc["ci_low"], acc["ci_high"]),
                f"0.80: {_ratio(cost)}{note}; {_verdict(cost['p_sign_flip_holm'], cost['p_value_holm'], pilot, not pilot) if not pilot else 'pilot'}",
                verdict,
                COMMANDS[folder].format(v=method),
                f"[{folder}](../bench/results/{folder}/table.md)",
            ]
        )
    return rows


CLAIMS_HEADER = (
    "method",
    "regime",
    "seeds",
    "generated tokens vs GRPO",
    "final accuracy - GRPO's [95% CI]",
    "tokens to target vs GRPO [95% CI]",
    "verdict (final accuracy)",
    "command",
    "records",
)


def claims_rows(results: Path = RESULTS) -> list[list[str]]:
    """The claims table's rows, in :data:`CLAIMS` order."""
    readers = {"stored": _stored_rows, "allocation": _allocation_rows}
    rows = []
    for regime, folder, methods, how in CLAIMS:
        if how == "frozen":  # rows stored as markdown beside the records (claims.md)
            text = (results / folder / "claims.md").read_text()
            rows.extend(line.strip("| ").split(" | ") for line in text.splitlines() if line.startswith("|"))
            continue
        data = json.loads((results / folder / "results.json").read_text())
        rows.extend(readers[how](regime, folder, methods, data))
    return rows


def claims_markdown(results: Path = RESULTS) -> str:
    """The claims table as markdown (header, separator, one line per row)."""
    lines = ["| " + " | ".join(CLAIMS_HEADER) + " |", "|" + "---|" * len(CLAIMS_HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in claims_rows(results)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="the folder holding the benchmarks' records")
    parser.add_argument("--claims", action="store_true", help="print the claims table instead of drawing the plots")
    parser.add_argument("--tables", action="store_true", help="print each benchmark's table instead of drawing")
    parser.add_argument("--only", nargs="*", default=None, help="draw these benchmarks only (folder names)")
    args = parser.parse_args(argv)
    if args.claims:
        print(claims_markdown(args.results))
        return 0
    if args.tables:
        for bench in BENCHMARKS:
            print(f"{bench.name}\n{summary_markdown(bench, load_runs(bench, args.results))}\n")
        return 0
    for bench in BENCHMARKS:
        if args.only is None or bench.name in args.only:
            for path in draw(bench, args.results):
                print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
