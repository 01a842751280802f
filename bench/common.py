"""Shared pieces of the benchmarks: variants, warm starts, parallel runs, tables.

Every variant of one seed starts from the same warmed-up policy: the supervised warm-up runs once per seed
(``adora_openrlhf.testbed_files.warm_start_dir``), and each RL run loads that checkpoint with ``warmup.steps = 0``. Runs go to a
process pool (one torch thread per process: on a 2-core machine two tiny-model runs side by side finish
sooner than one run on two threads).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Every variant changes only the method; the rest (learning rate, batch, group size n, rollout parameters,
# steps) is the recipe's, chosen for GRPO. Adaptive variants share one budget: rounds of 8 responses per
# still-active prompt, at most 2 rounds, n_keep kept for training. ADORA runs use the K&K (LLM) reference's
# edge cases (``edge_policy llm``, algorithms/adora.py): no correct response -> TDS, correct but no counted incorrect -> TAS.
_ADORA_ATT = {"adora.enabled": True, "adora.mode": "attenuate", "adora.edge_policy": "llm"}
_ADORA_AMP = {"adora.enabled": True, "adora.mode": "amplify", "adora.edge_policy": "llm"}
_ADA = {"sampling.enabled": True, "sampling.samples_per_round": 8, "sampling.max_rounds": 2}

VARIANTS: dict[str, dict[str, Any]] = {
    "GRPO": {},
    "GRPO+ADORA": _ADORA_ATT,  # attenuate: TDS advantages x lambda_att (0.1)
    "GRPO+ADORA-amp": _ADORA_AMP,  # amplify: TAS advantages x lambda_amp (2.0)
    "Ada-pos": {**_ADA, "sampling.exit_rule": "pos"},
    "Ada-balance": {**_ADA, "sampling.exit_rule": "balance"},
    "Ada-balance+ADORA": {**_ADA, "sampling.exit_rule": "balance", **_ADORA_ATT},
    # DAPO dynamic filtering: all-correct and all-wrong groups are dropped and refilled with new prompts
    # (at most dynamic_filtering.max_refills rounds per step), the simple alternative to adaptive sampling.
    "DAPO-filter": {"dynamic_filtering.enabled": True},
    # adaGRPO: a prompt whose group has no correct answer (the judge) is retried with hotter sampling
    # parameters; the pos exit rule is that judge, escalation[0] the retry's parameter set.
    "adaGRPO": {**_ADA, "sampling.exit_rule": "pos", "sampling.escalation": [{"temperature": 1.3}]},
    # PPO with a critic (GAE; docs/results.md "kk-testbed: PPO with a critic": critic.lr 1e-4, its default 1e-5 untried)
    "PPO": {"advantage.estimator": "gae", "critic.lr": 1e-4},
    "PPO+ADORA": {"advantage.estimator": "gae", "critic.lr": 1e-4, **_ADORA_ATT},
}
# The variants of the group estimators (GRPO's baseline): the sample-efficiency benchmark's default set
GROUP_VARIANTS = [name for name, changes in VARIANTS.items() if "advantage.estimator" not in changes]

# Overrides that make a run start RL from a saved warm start (no supervised phase of either kind).
FROM_WARM_START: dict[str, Any] = {"warmup.steps": 0, "warmup.mix_steps": 0}


@dataclass(frozen=True)
class RunSpec:
    variant: str
    seed: int
    recipe: str
    overrides: Mapping[str, Any]
    output_dir: str
    reuse: bool = False  # keep a finished run with the same config; continue an interrupted one from its checkpoint


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def load_run(variant: str, seed: int, run_dir: Path) -> dict[str, Any]:
    """A finished run's summary (summary.json) and per-step metrics (metrics.jsonl)."""
    from adora_openrlhf.rundir.metrics import read_metrics

    if not (run_dir / "summary.json").exists():
        raise SystemExit(f"{run_dir} has no finished run (summary.json); run the benchmark first")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"variant": variant, "seed": seed, "summary": summary, "metrics": read_metrics(run_dir / "metrics.jsonl")}


def _started_from(saved_output_dir: Any, run_dir: Path | None) -> Path:
    """The folder a run was started from, which its config's relative paths are relative to: the one in which
    the saved ``output_dir`` names ``run_dir`` (the folder holding the config); the current one otherwise."""
    if run_dir is None or not isinstance(saved_output_dir, str) or Path(saved_output_dir).is_absolute():
        return Path.cwd()
    here, parts = run_dir.resolve(), Path(saved_output_dir).parts
    if parts and here.parts[-len(parts) :] == parts:
        return Path(*here.parts[: -len(parts)])
    return Path.cwd()


def setting_differences(
    saved: Mapping[str, Any], now: Mapping[str, Any], defaults: Mapping[str, Any], run_dir: Path | None = None
) -> list[str]:
    """The fields in which a saved run's config (``config.json`` in ``run_dir``) differs from the run ``now`` asks
    for, as "field: saved -> now": a saved field of another value, a field added since (absent from ``saved``)
    not at its default in ``defaults`` (the behaviour the run had before the field existed), a field removed
    since (only in ``saved``); a path
    (``output_dir``, ``rundir.checks.PATH_OPTIONS``) by the location it names, a relative one read from the
    folder the run was started from (:func:`_started_from`)."""
    from adora_openrlhf.dotted import flatten
    from adora_openrlhf.rundir.checks import PATH_OPTIONS

    path_fields = {"output_dir", *PATH_OPTIONS}

    def located(values: Mapping[str, Any], base: Path) -> dict[str, Any]:  # a path field by the file it names
        flat = flatten(values)
        return {k: str((base / v).resolve()) if k in path_fields and isinstance(v, str) else v for k, v in flat.items()}

    saved_flat = located(saved, _started_from(saved.get("output_dir"), run_dir))
    now_flat, default_flat = located(now, Path.cwd()), flatten(defaults)
    missing = object()
    changed = [f"{name}: {saved_flat[name]!r} -> removed" for name in sorted(set(saved_flat) - set(now_flat))]
    for name, value in now_flat.items():
        before = saved_flat.get(name, default_flat.get(name, missing))
        if before != value:
            changed.append(f"{name}: {'(absent)' if before is missing else repr(before)} -> {value!r}")
    return changed


def _saved_and_now(spec: RunSpec) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The config saved in ``spec``'s run folder and the one ``spec`` asks for, both as the trainer writes them
    (``format_config``), or None without a readable saved one."""
    from adora_openrlhf.cli_args import format_config
    from adora_openrlhf.recipes import build_run_config

    path = Path(spec.output_dir) / "config.json"
    if not path.exists():
        return None
    cfg = build_run_config(spec.recipe, {**spec.overrides, "seed": spec.seed, "output_dir": spec.output_dir})
    try:
        return json.loads(path.read_text()), json.loads(format_config(cfg))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def _saved_run_differences(spec: RunSpec) -> tuple[bool, list[str] | None]:
    """(same config exactly, :func:`setting_differences`) of the run ``spec`` asks for and the one its directory
    holds (``config.json``); (False, None) without a readable one."""
    from adora_openrlhf.cli_args import format_config
    from adora_openrlhf.config import RunConfig

    configs = _saved_and_now(spec)
    if configs is None:
        return False, None
    saved, now = configs
    defaults = json.loads(format_config(RunConfig()))
    return saved == now, setting_differences(saved, now, defaults, Path(spec.output_dir))


def run_training(spec: RunSpec) -> dict[str, Any]:
    """One RL run; returns its summary and per-step metrics as :func:`load_run` reads them back.

    With ``spec.reuse`` a run directory that already holds this config is not recomputed: a finished run
    (summary.json) whose config is this one up to fields added since at their defaults (no :func:`setting_differences`)
    is read back, an interrupted one with exactly this config resumes from its last checkpoint, one with these
    settings otherwise is recomputed; a folder holding a finished run or checkpoints of other settings stops the
    benchmark with the differing fields named, never replaced. Without ``reuse`` (a benchmark's ``--fresh``) the
    run is recomputed over whatever its directory holds."""
    from adora_openrlhf.recipes import build_run_config
    from adora_openrlhf.rundir import checkpoints as ckpt
    from adora_openrlhf.train import train_local as train

    out = Path(spec.output_dir)
    cfg = build_run_config(spec.recipe, {**spec.overrides, "seed": spec.seed, "output_dir": spec.output_dir})
    same_config, changed = _saved_run_differences(spec) if spec.reuse else (False, None)
    same_settings = same_config or changed == []
    if same_settings and (out / "summary.json").exists():
        return load_run(spec.variant, spec.seed, out)
    if not same_settings and changed and ((out / "summary.json").exists() or ckpt.list_checkpoints(out)):
        shown = "; ".join(changed[:5]) + (f"; and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise SystemExit(
            f"{out} holds a run of other settings ({shown}); move it away or delete it to recompute it there"
        )
    resume = same_config and bool(ckpt.list_checkpoints(out))
    train(cfg, resume=resume, overwrite=not resume)
    return load_run(spec.variant, spec.seed, out)


def run_pool(fn: Callable[[Any], Any], items: Sequence[Any], workers: int) -> list[Any]:
    """Map ``fn`` over ``items`` in ``workers`` processes (1 torch thread each); in-process when workers is 1."""
    if workers <= 1:
        _init_worker(max(1, os.cpu_count() or 1))
        return [fn(item) for item in items]
    with ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=(1,)) as pool:
        return list(pool.map(fn, items))


def t_quantile(p: float, df: int) -> float:
    """Quantile ``t`` of Student's t distribution with ``df`` degrees of freedom: P(T <= t) = p (scipy's, as the
    paired tests of ``bench/paired_stats.py``), for 0.5 <= p < 1."""
    from scipy import stats

    if not 0.5 <= p < 1 or df < 1:
        raise ValueError(f"t_quantile: need 0.5 <= p < 1 and df >= 1, got p={p}, df={df}")
    return float(stats.t.ppf(p, df))


def mean_ci(values: Iterable[float | None], level: float = 0.95) -> tuple[float, float]:
    """(mean, half-width) of the ``level`` confidence interval of the mean over the non-None values:
    half-width = t_{(1+level)/2, n-1} * s / sqrt(n), s the sample standard deviation (n - 1 in the
    denominator). One value: half-width 0 (no spread to estimate, shown as such); none: (nan, nan)."""
    values = [v for v in values if v is not None]
    if not values:
        return float("nan"), float("nan")
    if len(values) == 1:
        return float(values[0]), 0.0
    n = len(values)
    return statistics.fmean(values), t_quantile((1 + level) / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)


def band(series: Sequence[Sequence[tuple[float, float]]]) -> tuple[list[float], list[float], list[float]]:
    """Mean x, mean y and the y's 95% CI half-width at each index, over runs (cut to the shortest series)."""
    length = min((len(s) for s in series), default=0)
    xs = [sum(s[i][0] for s in series) / len(series) for i in range(length)]
    ys, hs = zip(*[mean_ci(s[i][1] for s in series) for i in range(length)], strict=True) if length else ((), ())
    return xs, list(ys), list(hs)


def fmt_mean_ci(values: Iterable[float | None], digits: int = 3) -> str:
    """``mean ± half-width`` of :func:`mean_ci`, or ``n/a`` without values."""
    m, h = mean_ci(values)
    return "n/a" if math.isnan(m) else f"{m:.{digits}f} ± {h:.{digits}f}"


def trapezoid_auc(curve: Sequence[tuple[float, float]]) -> float | None:
    """Area under ``curve`` [(x, y), ...] (x increasing) by the trapezoid rule, divided by the x range:
    sum_i (x_{i+1} - x_i) (y_i + y_{i+1}) / 2 / (x_last - x_first), i.e. the curve's mean height. A single
    point gives its y; an empty curve None."""
    if not curve:
        return None
    if len(curve) == 1 or curve[-1][0] == curve[0][0]:
        return float(curve[0][1])
    # neighbouring points
    area = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(curve, curve[1:], strict=False))
    return area / (curve[-1][0] - curve[0][0])


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")


def first_step_reaching(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """x of the first point of ``curve`` [(x, accuracy), ...] whose accuracy is >= target, or None."""
    for x, acc in curve:
        if acc >= target:
            return x
    return None
