"""``python -m eval.run --model PATH --bench aime24,aime25,amc23,math500,mathvista,kk --k 8 --out DIR``, or
``python -m eval.run --run RUN --k 8`` for a local training run's own held-out set (``evaluation/runs.py``); installed,
the command is ``adora-eval``.

For every benchmark: k sampled responses per problem (vLLM on GPU machines, `transformers` otherwise; the
`transformers` engine decodes the samples of many problems in one batch, ``evaluation/generation.py``, with the local
backend's ``fast`` numerics unless ``--numerics exact`` or ``--run`` at temperature 0 (the run's own ``model.numerics``), and on a Linux CPU in one
forked process per torch thread, ``--workers``, ``evaluation/workers.py``), graded by
the same reward functions as training, written one sample per line to ``DIR/samples.jsonl`` (prompt, response,
its length in tokens, extracted answer, correct, reward). Progress is reported per sample, with an ETA.

Resumable: a sample is identified by its benchmark, problem id (``meta.id``/``pid``/... or the row position) and
the problem's content hash (:func:`problem_hash`: prompt, label, source, meta and image bytes), so samples of a
row that changed since are ignored and the problem is generated again; only the current rows are scored.
``DIR/eval_config.json`` records what the samples were generated with (the model, identified by its resolved
path and its files' sizes and times, the engine, dtype, prompt template, temperature, top_p, max_new_tokens,
repetition penalty, seed and seeding scheme); a rerun into the same ``--out`` with any of them changed is
refused, so samples of two models or settings never mix, and two processes writing one ``--out`` at once are
refused too (a lock, ``adora_openrlhf/rundir/lock.py``). Each problem's samples are drawn from seeds of their own
(from the run's seed, the benchmark and the problem id, then one stream per sample), so a problem's samples do
not depend on which problems share its batch and an interrupted batch is redone identically. Problem ids must
be unique within a benchmark; a repeated one is refused with its ``file:line``. Every row is checked before any
generation (label and meta as the trainer checks them, images, prompt encoding). Grading is isolated per sample: a grader crash marks that sample
wrong with ``grader_error`` set and never loses finished samples.

At the end ``DIR/report.md`` and ``DIR/report.json`` give the settings, one line per sign that a benchmark does
not fit the model (``evaluation/fit.py``), avg@k with its 95% sampling noise and unbiased pass@k per benchmark and
subset, and with ``--run`` the trainer's own held-out accuracy of the same checkpoint.

This module runs the steps: the command line is ``evaluation/cli.py``, the checks before generation
``evaluation/checks.py``, the benchmark loop and ``samples.jsonl`` ``evaluation/loop.py``, the reports
``evaluation/report.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from adora_openrlhf.cli_errors import check_output_dir, run_cli
from adora_openrlhf.evaluation.benchmarks import Benchmark, load_located_rows, row_file
from adora_openrlhf.evaluation.checks import (
    CONFIG_FILE,
    check_eval_config,
    check_prompts,
    check_rows,
    checked_model,
    model_identity,
)
from adora_openrlhf.evaluation.cli import Plan, build_parser, check_args, plan_from_args, resolve_decoding
from adora_openrlhf.evaluation.generation import (
    GENERATORS,
    EvalSampling,
    Generator,
    parse_engine_args,
    pick_engine,
    resolve_dtype,
)
from adora_openrlhf.evaluation.loop import SAMPLES_FILE, SampleKey, current_keys, current_records, evaluate_benchmark
from adora_openrlhf.evaluation.metrics import score_records
from adora_openrlhf.evaluation.report import benchmark_fit_notes, report_settings, run_comparison, write_report
from adora_openrlhf.evaluation.runs import default_out
from adora_openrlhf.rewards.grading import GradingConfig, StepGrader
from adora_openrlhf.rundir.lock import DirLock

SEEDING = "per-sample-stream"  # recorded in eval_config.json: problem_seed per problem, then generation.sample_seed per sample

Located = dict[str, list[tuple[str, dict[str, Any]]]]  # benchmark name -> its rows with their file:line


def open_generator(engine: str, model: str, sampling: EvalSampling, checked_dir: bool, **options: Any):
    """The engine's generator for ``model``. A model directory that disappears after ``main`` checked it
    (``checked_dir``; a training still running prunes its older checkpoints) is named as such, not as the hub
    name it then looks like."""
    try:
        return GENERATORS[engine](model, sampling, **options)
    except Exception:
        if checked_dir and not Path(model).is_dir():
            raise ValueError(
                f"--model: {model} was removed while it was being loaded (a training still running prunes its older "
                "checkpoints); evaluate its newest checkpoint or its final_model"
            ) from None
        raise


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    out = {"dir": "the output directory"}
    return run_cli(
        lambda: _main(argv, out),
        argv,
        interrupted_hint=lambda: f"finished samples are kept in {out['dir']}; rerun the same command to continue",
    )


@dataclass(frozen=True)
class Decoding:
    """How the samples are made: the engine and its options, the sampling, and the settings eval_config.json records."""

    engine: str
    dtype: str
    numerics: str | None
    workers: int | None
    engine_args: dict[str, Any]
    sampling: EvalSampling
    settings: dict[str, Any]

    def engine_options(self, batch_size: int) -> dict[str, Any]:
        """The engine's own keyword arguments: ``--vllm-arg`` for vLLM, else the batch size, numerics and workers."""
        if self.engine == "vllm":
            return self.engine_args
        return {"batch_size": batch_size, "numerics": self.numerics, "workers": self.workers}


def decoding_of(args: argparse.Namespace, plan: Plan) -> Decoding:
    """The :class:`Decoding` of checked ``args`` and their ``plan``; ValueError for a flag the engine does not use."""
    engine = pick_engine(args.engine)
    dtype = resolve_dtype(args.dtype)
    engine_args = parse_engine_args(args.vllm_arg)
    trained = plan.target.numerics if plan.target is not None else None
    numerics, workers = resolve_decoding(args.numerics, args.workers, engine, args.temperature, trained)
    if engine_args and engine != "vllm":
        raise ValueError(
            f"--vllm-arg: only used by the vLLM engine, but the engine is {engine!r}; drop it or pass --engine vllm"
        )
    sampling = EvalSampling(args.temperature, args.top_p, plan.max_new_tokens, args.seed, plan.repetition_penalty)
    settings = {
        **model_identity(plan.model),
        "engine": engine,
        "dtype": dtype,
        "seeding": SEEDING,
        "prompt_template": plan.template,
        **asdict(sampling),
    }
    return Decoding(engine, dtype, numerics, workers, engine_args, sampling, settings)


def _main(argv: Sequence[str], out: dict[str, str]) -> int:
    args = build_parser().parse_args(argv)
    check_args(args)
    plan = plan_from_args(args)
    decoding = decoding_of(args, plan)
    checked_dir = checked_model(plan.model)
    out_dir = Path(args.out) if args.out is not None else default_out(plan.target, Path(plan.model), decoding.settings)
    out["dir"] = str(out_dir)
    check_output_dir(out_dir, "--out")
    lock = DirLock(out_dir, "--out", "eval.run")
    lock.check_free()  # another evaluation writing here: refused before the model loads
    check_eval_config(out_dir, decoding.settings)
    # read-only first (rows from files, the model), so that a bad file or model writes nothing; then the
    # benchmark loaders that convert hub datasets into out_dir/data
    located: Located = {}
    by_file = [b for b in plan.benches if row_file(b, plan.files.get(b.name), args.data_dir) is not None]
    for bench in by_file:
        located[bench.name] = _checked_rows(bench, plan.files.get(bench.name), args, out_dir)
    options = decoding.engine_options(plan.batch_size)
    generator = open_generator(
        decoding.engine, plan.model, decoding.sampling, checked_dir, dtype=args.dtype, template=plan.template, **options
    )
    prompts = {bench.name: check_prompts(generator, bench, located[bench.name]) for bench in by_file}
    with lock:
        check_eval_config(out_dir, decoding.settings)  # again, now that no other evaluation can write here
        for bench in [b for b in plan.benches if b not in by_file]:
            located[bench.name] = _checked_rows(bench, None, args, out_dir)
            prompts[bench.name] = check_prompts(generator, bench, located[bench.name])
        (out_dir / CONFIG_FILE).write_text(json.dumps(decoding.settings, indent=2) + "\n", encoding="utf-8")
        keys = _generate(plan, located, generator, args, out_dir)
        text = _report(plan, decoding, located, prompts, generator, keys, args, out_dir)
    print(f"{out_dir / 'report.md'}:\n{text}")
    return 0


def _checked_rows(bench: Benchmark, file: str | None, args: argparse.Namespace, out_dir: Path):
    """The rows of ``bench`` with their ``file:line``, checked (``check_rows``)."""
    located = load_located_rows(bench, file, args.data_dir, args.seed, args.limit, cache_dir=out_dir / "data")
    check_rows(bench, located)
    return located


def _generate(
    plan: Plan, located: Located, generator: Generator, args: argparse.Namespace, out_dir: Path
) -> list[SampleKey]:
    """Generate and grade the missing samples of every benchmark; the sample keys of the rows in use."""
    keys: list[SampleKey] = []
    grader = StepGrader(GradingConfig(deadline_s=args.grading_deadline_s))  # one deadline per generation call
    for bench in plan.benches:
        rows = [row for _, row in located[bench.name]]
        evaluate_benchmark(
            bench,
            rows,
            generator,
            args.k,
            out_dir / SAMPLES_FILE,
            batch_problems=max(1, plan.batch_size // args.k),
            seed=args.seed,
            grader=grader,
        )
        keys += current_keys(bench, rows)
    return keys


def _report(
    plan: Plan,
    decoding: Decoding,
    located: Located,
    prompts,
    generator: Generator,
    keys: list[SampleKey],
    args: argparse.Namespace,
    out_dir: Path,
) -> str:
    """Write report.md and report.json of the current samples; the text printed at the end."""
    records = current_records(out_dir, keys)
    target = plan.target
    notes = benchmark_fit_notes(
        plan.benches, located, prompts, records, decoding.sampling, generator, plan.model, target
    )
    settings = report_settings(
        plan.model,
        decoding.engine,
        decoding.dtype,
        plan.template,
        decoding.sampling,
        plan.batch_size,
        decoding.numerics,
        generator,
    )
    comparison = []
    if target is not None:
        settings["run"] = str(target.run_dir)
        scores = score_records(records, args.k)
        comparison = run_comparison(target, Path(plan.model), scores, args.k, args.temperature)
    late = sum(bool(r.get("grader_late")) for r in records)
    if late:
        notes = [
            *notes,
            f"{late} of {len(records)} samples were not graded within the grading deadline ({args.grading_deadline_s:g} s) and "
            "count as wrong (grader_late in samples.jsonl); raise --grading-deadline-s or fix the reward",
        ]
    names = [b.name for b in plan.benches]
    return write_report(out_dir, args.k, names, settings, current=keys, notes=notes, comparison=comparison)


if __name__ == "__main__":
    raise SystemExit(main())
