"""The reports of ``python -m eval.run``: ``DIR/report.md`` and ``DIR/report.json`` (the settings, the fit notes
of ``evaluation/fit.py``, with ``--run`` the comparison with the trainer's own held-out accuracy, and avg@k and
pass@k per benchmark and subset).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from adora_openrlhf.evaluation.benchmarks import HELDOUT
from adora_openrlhf.evaluation.fit import FitContext, fit_notes
from adora_openrlhf.evaluation.generation import EvalSampling
from adora_openrlhf.evaluation.loop import SAMPLES_FILE, SampleKey, current_records, read_records
from adora_openrlhf.evaluation.metrics import ScoreRow, markdown_table, score_records
from adora_openrlhf.evaluation.runs import RunTarget, model_origin, rows_changed, trainer_accuracy

SETTING_ORDER = (
    "model",
    "engine",
    "dtype",
    "prompt_template",
    "temperature",
    "top_p",
    "k",
    "max_new_tokens",
    "repetition_penalty",
    "seed",
    "batch_size",
    "numerics",
    "workers",
)


def settings_table(settings: Mapping[str, Any]) -> str:
    """The generation settings as a two-column Markdown table (the known ones first)."""
    keys = [key for key in SETTING_ORDER if key in settings] + sorted(set(settings) - set(SETTING_ORDER))
    return "\n".join(["| setting | value |", "|---|---|", *(f"| {key} | {settings[key]} |" for key in keys)])


def report_settings(
    model: str, engine: str, dtype: str, template: str, sampling: EvalSampling, batch_size: int, numerics, generator
) -> dict[str, Any]:
    """The settings the report shows (the evaluation's, plus the decoding numerics and workers where they apply)."""
    settings = {
        "model": model,
        "engine": engine,
        "dtype": dtype,
        "prompt_template": template,
        **asdict(sampling),
        "batch_size": batch_size,
    }
    if numerics is not None:
        settings["numerics"] = numerics
        settings["workers"] = generator.workers
    return settings


def write_report(
    out_dir: Path,
    k: int,
    benches: Iterable[str],
    settings: Mapping[str, Any],
    current: Iterable[SampleKey] | None = None,
    notes: Sequence[str] = (),
    comparison: Sequence[str] = (),
) -> str:
    """Score ``samples.jsonl`` and write report.md / report.json: the settings, the fit ``notes``, the run
    ``comparison`` lines and the scores. ``current``: the sample keys of the rows in use (only their samples are
    scored; None: every sample of ``benches``). Returns the text printed at the end (notes, comparison, table)."""
    wanted = set(benches)
    records = read_records(out_dir / SAMPLES_FILE) if current is None else current_records(out_dir, current)
    records = [r for r in records if r["benchmark"] in wanted]
    rows = score_records(records, k)
    greedy = settings.get("temperature") == 0
    table = markdown_table(rows, k, greedy)
    parts = ["# Evaluation", settings_table({**settings, "k": k})]
    if notes:
        parts += ["## Fit of the benchmarks to the model", "\n".join(f"- {note}" for note in notes)]
    if comparison:
        parts += ["## Against the training run", "\n".join(comparison)]
    parts += ["## Scores", table]
    (out_dir / "report.md").write_text("\n\n".join(parts) + "\n", encoding="utf-8")
    report = {
        "settings": dict(settings),
        "k": k,
        "fit_notes": list(notes),
        "comparison": list(comparison),
        "rows": [{**asdict(r), "pass_at": {str(kk): v for kk, v in r.pass_at.items()}} for r in rows],
    }
    (out_dir / "report.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    return "\n".join([*(f"note: {note}" for note in notes), *comparison, table])


def run_comparison(target: RunTarget, model: Path, rows: Sequence[ScoreRow], k: int, temperature: float) -> list[str]:
    """Lines that set the held-out score next to the trainer's ``eval/greedy_accuracy`` of the same checkpoint."""
    overall = next((r for r in rows if r.benchmark == HELDOUT and r.subset == "all"), None)
    found = trainer_accuracy(target.run_dir, model)
    if overall is None:
        return []
    greedy = temperature == 0
    if greedy:
        noise = "greedy: no sampling noise"
    elif overall.sampling_se is None:
        noise = "sampling noise unknown with k=1"
    else:
        noise = f"95% sampling noise ± {1.96 * overall.sampling_se:.3f}"
    ours = f"held-out accuracy avg@{k} = {overall.avg_at_k:.3f} over {overall.problems} problems ({noise})"
    if found is None:
        return [f"{ours}; the run has no held-out evaluation of this checkpoint in {target.run_dir / 'metrics.jsonl'}"]
    step, accuracy = found
    line = f"{ours}; the trainer's eval/greedy_accuracy at step {step}: {accuracy:.3f}"
    changed = rows_changed(target)
    if changed is not None:
        return [f"{line} (not comparable: {changed})"]
    if greedy and k == 1:
        verdict = (
            "equal, as it must be"
            if math.isclose(overall.avg_at_k, accuracy, abs_tol=1e-9)
            else "DIFFERENT although both are greedy on the same rows"
        )
        return [f"{line} ({verdict})"]
    return [
        f"{line} (greedy decoding; this evaluation samples at temperature {temperature:g}; --temperature 0 --k 1 repeats the trainer's measurement)"
    ]


def benchmark_fit_notes(
    benches, located, prompts, records, sampling: EvalSampling, generator, model: str, target: RunTarget | None
) -> list[str]:
    """The fit notes of every benchmark (``evaluation/fit.py``) from its rows, prompts and current samples."""
    origin = model_origin(model)
    same_run = target is not None and origin is not None and Path(origin.run_dir).resolve() == target.run_dir.resolve()
    notes = []
    for bench in benches:
        ctx = FitContext(
            bench=bench.name,
            rows=[row for _, row in located[bench.name]],
            records=[r for r in records if r["benchmark"] == bench.name],
            prompts=prompts.get(bench.name),
            max_new_tokens=sampling.max_new_tokens,
            context_length=getattr(generator, "context_length", None),
            origin=origin,
            is_run_heldout=bench.name == HELDOUT and same_run,
        )
        notes += fit_notes(ctx)
    return notes
