"""Shared pieces of the benchmarks: variants, warm starts, parallel runs, tables.

Every variant of one seed starts from the same warmed-up policy: the supervised warm-up runs once per seed
(:func:`warm_start_dir`), and each RL run loads that checkpoint with ``warmup.steps = 0``. Runs go to a
process pool (one torch thread per process: on a 2-core machine two tiny-model runs side by side finish
sooner than one run on two threads).
"""

from __future__ import annotations

import json
import os
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

VARIANTS: dict[str, dict[str, Any]] = {
    "GRPO": {},
    "GRPO+ADORA": {"adora.enabled": True},
    "Ada-pos": {"sampling.enabled": True, "sampling.exit_rule": "pos", "sampling.samples_per_round": 8, "sampling.max_rounds": 2},
    "Ada-balance": {"sampling.enabled": True, "sampling.exit_rule": "balance", "sampling.samples_per_round": 8, "sampling.max_rounds": 2},
    "Ada-balance+ADORA": {
        "sampling.enabled": True, "sampling.exit_rule": "balance", "sampling.samples_per_round": 8, "sampling.max_rounds": 2,
        "adora.enabled": True,
    },
}


@dataclass(frozen=True)
class RunSpec:
    variant: str
    seed: int
    recipe: str
    overrides: Mapping[str, Any]
    output_dir: str


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def warm_start_dir(recipe: str, seed: int, overrides: Mapping[str, Any], out: Path) -> str:
    """Run the recipe's supervised warm-up once for ``seed`` and save the policy (HF format) under ``out``."""
    from adora_openrlhf.backends.local.trainer import warm_start
    from adora_openrlhf.recipes import build_run_config

    target = out / f"warm_start_seed{seed}"
    if not (target / "config.json").exists():
        cfg = build_run_config(recipe, {**overrides, "seed": seed, "output_dir": str(target)})
        warm_start(cfg, target)
    return str(target)


def load_run(variant: str, seed: int, run_dir: Path) -> dict[str, Any]:
    """A finished run's summary (summary.json) and per-step metrics (metrics.jsonl)."""
    from adora_openrlhf.backends.local.metrics import read_metrics

    if not (run_dir / "summary.json").exists():
        raise SystemExit(f"{run_dir} has no finished run (summary.json); run the benchmark first")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"variant": variant, "seed": seed, "summary": summary, "metrics": read_metrics(run_dir / "metrics.jsonl")}


def run_training(spec: RunSpec) -> dict[str, Any]:
    """One RL run; returns its summary and per-step metrics as :func:`load_run` reads them back."""
    from adora_openrlhf.backends.local.trainer import train
    from adora_openrlhf.recipes import build_run_config

    # a benchmark rerun recomputes its runs: replace what an earlier invocation left in the run directory
    train(build_run_config(spec.recipe, {**spec.overrides, "seed": spec.seed, "output_dir": spec.output_dir}), overwrite=True)
    return load_run(spec.variant, spec.seed, Path(spec.output_dir))


def run_pool(fn: Callable[[Any], Any], items: Sequence[Any], workers: int) -> list[Any]:
    """Map ``fn`` over ``items`` in ``workers`` processes (1 torch thread each); in-process when workers is 1."""
    if workers <= 1:
        _init_worker(max(1, os.cpu_count() or 1))
        return [fn(item) for item in items]
    with ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=(1,)) as pool:
        return list(pool.map(fn, items))


def mean_sd(values: Iterable[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None]
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def fmt_mean_sd(values: Iterable[float], digits: int = 3) -> str:
    m, s = mean_sd(values)
    return "n/a" if m != m else f"{m:.{digits}f} ± {s:.{digits}f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")


def first_step_reaching(curve: Sequence[tuple[float, float]], target: float) -> Optional[float]:
    """x of the first point of ``curve`` [(x, accuracy), ...] whose accuracy is >= target, or None."""
    for x, acc in curve:
        if acc >= target:
            return x
    return None
