"""The command line of ``python -m eval.run`` (``adora-eval``): its parser, the checks of its arguments, the
decoding numerics and workers they select, and the :class:`Plan` they make (with ``--run``, from the run's
saved settings).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from adora_openrlhf.cli_errors import OneLineParser, add_debug_flag, command_name
from adora_openrlhf.errors import ConfigError
from adora_openrlhf.evaluation.benchmarks import HELDOUT, Benchmark, get_benchmark
from adora_openrlhf.evaluation.generation import DTYPES
from adora_openrlhf.evaluation.runs import RunTarget, default_model, open_run
from adora_openrlhf.plugins import import_plugins
from adora_openrlhf.rewards.grading import GradingConfig

MAX_K = (
    1024  # samples per problem: a call generates a problem's k samples together, and writes them when they are graded
)

DEFAULT_MAX_NEW_TOKENS = 1024
DEFAULT_BATCH_SIZE = 256  # sequences per decoding batch of the transformers engine (vLLM's max_num_seqs default)
NUMERICS_CHOICES = ("auto", "exact", "fast")


def resolve_decoding(
    numerics: str, workers: str, engine: str, temperature: float, run_numerics: str | None = None
) -> tuple[str | None, int | None]:
    """``(numerics, workers)`` of the transformers engine for the checked ``--numerics`` and ``--workers``.
    ``run_numerics``: with ``--run``, the ``model.numerics`` the run's trainer evaluated with; None without
    ``--run``. Numerics ``auto`` is ``run_numerics`` when ``--run`` decodes greedily, with one decoding process
    unless ``--workers`` says otherwise (the trainer's own arithmetic and batches, so its held-out accuracy is
    repeated exactly), else ``fast``; workers ``auto`` is otherwise None (``evaluation/workers.py`` picks). Several
    workers need ``fast`` (``exact`` keeps the trainer's batches in one process). The vLLM engine has its own
    kernels and processes: ``(None, None)``, and an explicit value of either flag is refused."""
    if engine != "hf":
        for flag, value in (("--numerics", numerics), ("--workers", workers)):
            if value != "auto":
                raise ValueError(
                    f"{flag} {value}: only used by the transformers engine, but the engine is {engine!r}; drop it or pass --engine hf"
                )
        return None, None
    repeat_trainer = numerics == "auto" and run_numerics is not None and temperature == 0
    if numerics == "auto":
        numerics = run_numerics if repeat_trainer else "fast"
    count = None if workers == "auto" else int(workers)
    if repeat_trainer and count is None and numerics == "fast":
        count = 1  # the trainer's batches in one process: its own number, not one within float rounding of it
    if numerics == "exact" and count is not None and count > 1:
        raise ValueError(
            f"--workers {workers}: several decoding processes need --numerics fast "
            "(exact, the default for --run at temperature 0 of a run trained with model.numerics exact, keeps the "
            "trainer's batches in one process)"
        )
    return numerics, count


def parse_bench_files(items: Sequence[str] | None) -> dict[str, str]:
    files = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--bench-file: expected NAME=PATH, got {item!r}")
        name, path = item.split("=", 1)
        if not Path(path).exists():
            raise ValueError(f"--bench-file {name}: file {path} does not exist")
        files[name] = path
    return files


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=command_name("python -m eval.run"),
        description="avg@k and pass@k on AIME/AMC/MATH500/MathVista/K&K, or on a training run's held-out set.",
    )
    _add_target_flags(parser)
    _add_decoding_flags(parser)
    add_plugins_flag(parser)
    add_debug_flag(parser)
    return parser


def _add_target_flags(parser: argparse.ArgumentParser) -> None:
    """What is evaluated: the model or run, the benchmarks and their rows, k, the output directory, the engine."""
    parser.add_argument(
        "--run",
        default=None,
        help="a local training run's directory (e.g. runs/kk-testbed): evaluate its final model (or --model) on the run's saved held-out set, "
        "with the run's prompt template, token limit and batch size, next to the trainer's own held-out accuracy",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="local model directory (Hugging Face format, e.g. a training step directory) or hub name owner/name (with HF_HUB_OFFLINE=1: "
        "from the hub cache); with --run, default RUN/final_model",
    )
    parser.add_argument(
        "--bench",
        default=None,
        help="comma-separated: kk,aime24,aime25,amc23,math500,mathvista,geo_synth,heldout (default kk; not with --run)",
    )
    parser.add_argument("--k", type=int, default=8, help=f"samples per problem (avg@k, pass@1..k; at most {MAX_K})")
    parser.add_argument(
        "--grading-deadline-s",
        type=float,
        default=GradingConfig.deadline_s,
        help="the longest one generation call's samples wait on their grader, in seconds (the trainer's grading.deadline_s); "
        "a sample not graded by then scores its task's failure reward, counts as wrong and is marked grader_late",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="output directory (samples.jsonl, eval_config.json, report.json, report.md); with --run, default RUN/eval/<model and settings>",
    )
    parser.add_argument("--engine", default="auto", help="auto | hf | vllm")
    parser.add_argument(
        "--data-dir", default=None, help="directory with NAME.jsonl files from the data_prep converters"
    )
    parser.add_argument("--bench-file", action="append", help="NAME=PATH: rows of one benchmark from a JSONL file")
    parser.add_argument("--limit", type=int, default=None, help="first N problems of each benchmark")


def _add_decoding_flags(parser: argparse.ArgumentParser) -> None:
    """How the samples are decoded: temperature, top-p, limits, numerics, workers, seed, dtype, vLLM arguments."""
    parser.add_argument("--temperature", type=float, default=0.6, help="0 = greedy decoding (then --k 1)")
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help=f"response limit in tokens (default {DEFAULT_MAX_NEW_TOKENS}; with --run the run's rollout.max_new_tokens)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help=f"sequences per generation batch (default {DEFAULT_BATCH_SIZE}; with --run the run's model.generation_batch_size); "
        "a generation call takes batch-size // k problems (at least 1)",
    )
    parser.add_argument(
        "--numerics",
        default="auto",
        help="auto | exact | fast: the transformers engine's arithmetic: exact = the trainer's (the model's forward bitwise, transformers' samplers); fast = "
        "grouped-query attention, top-p without a full sort, each prompt prefilled once (the same rules within float rounding, faster on "
        "CPU); auto (default) = the run's model.numerics (in one process) for --run at temperature 0, which repeats the trainer's greedy "
        "evaluation, else fast",
    )
    parser.add_argument(
        "--workers",
        default="auto",
        help="N | auto: the transformers engine's decoding processes on a Linux CPU with --numerics fast, each taking every N-th "
        "problem of a call (evaluation/workers.py); auto (default) = one per torch thread, 1 elsewhere",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dtype",
        default="auto",
        help=f"{' | '.join(DTYPES)}: weights' dtype for either engine (auto: float32 on CPU, bfloat16 with CUDA)",
    )
    parser.add_argument(
        "--vllm-arg",
        action="append",
        metavar="KEY=VALUE",
        help="keyword argument of vllm.LLM (VALUE parsed as JSON when it is), e.g. max_model_len=4096, enforce_eager=true; repeatable",
    )


def check_args(args: argparse.Namespace) -> None:
    """ValueError naming the flag for every out-of-range argument."""
    if not 1 <= args.k <= MAX_K:
        raise ValueError(
            f"--k: must be between 1 and {MAX_K}, got {args.k} (every problem's k samples are generated in one call; "
            f"pass@k beyond {MAX_K} is not estimated here)"
        )
    if not (math.isfinite(args.grading_deadline_s) and args.grading_deadline_s > 0):
        raise ValueError(f"--grading-deadline-s: must be a finite number of seconds > 0, got {args.grading_deadline_s}")
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise ValueError(f"--temperature: must be a finite number >= 0, got {args.temperature}")
    if args.temperature == 0 and args.k > 1:
        raise ValueError(
            "--temperature 0 is greedy decoding: all k samples would be identical; use --k 1 or a temperature > 0"
        )
    if not (0 < args.top_p <= 1):
        raise ValueError(f"--top-p: must be in (0, 1], got {args.top_p}")
    for flag, value in (("--max-new-tokens", args.max_new_tokens), ("--batch-size", args.batch_size)):
        if value is not None and value < 1:
            raise ValueError(f"{flag}: must be >= 1, got {value}")
    if args.numerics not in NUMERICS_CHOICES:
        raise ValueError(f"--numerics: unknown {args.numerics!r}; choose one of {', '.join(NUMERICS_CHOICES)}")
    if args.workers != "auto" and not (args.workers.isdigit() and int(args.workers) >= 1):
        raise ValueError(f"--workers: expected a whole number >= 1 or auto, got {args.workers!r}")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit: must be >= 1, got {args.limit}")
    if args.seed < 0:
        raise ValueError(f"--seed: must be >= 0, got {args.seed}")
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        raise ValueError(f"--data-dir: {args.data_dir} is not a directory")
    if args.run is not None:
        for flag, value in (("--bench", args.bench), ("--bench-file", args.bench_file), ("--data-dir", args.data_dir)):
            if value is not None:
                raise ValueError(
                    f"{flag}: not used with --run (which evaluates the run's held-out set); drop one of them"
                )
    elif args.model is None:
        raise ValueError(
            "--model: required (a model directory or hub name), or --run RUN for a training run's held-out set"
        )
    elif args.out is None:
        raise ValueError("--out: required with --model (the output directory); only --run has a default")
    if args.model is not None:
        model = Path(args.model)
        if model.exists() and not model.is_dir():
            raise ValueError(f"--model: {args.model} is a file; give a model directory (Hugging Face format)")
        looks_local = args.model.startswith(("/", "./", "../", "~")) or args.model.count("/") != 1
        if not model.exists() and looks_local:
            raise ValueError(f"--model: {args.model} is neither a local directory nor a hub name (owner/name)")


@dataclass(frozen=True)
class Plan:
    """What to evaluate, from the command line (and with ``--run``, the run's saved settings)."""

    model: str
    benches: list[Benchmark]
    files: dict[str, str]  # benchmark name -> row file
    template: str
    repetition_penalty: float
    max_new_tokens: int
    batch_size: int
    target: RunTarget | None


def add_plugins_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--plugins",
        default="",
        metavar="MODULE[,MODULE...]",
        help="your modules that register rewards, tasks or templates (as the trainer's --plugins); the only code "
        "imported: with --run they must include the plug-ins the run was trained with, and a run's or model's folder "
        "is never searched for them",
    )


def plan_from_args(args: argparse.Namespace) -> Plan:
    """The :class:`Plan` of checked ``args``: with ``--run`` the run's held-out set, final model (unless
    ``--model``), prompt template, repetition penalty, token limit and batch size (unless given). The only
    plug-ins imported are ``--plugins`` (compared with a run's own list; see ``evaluation/runs.py``)."""
    plugins = [name.strip() for name in args.plugins.split(",") if name.strip()]
    if args.run is not None:
        target = open_run(args.run, plugins)
        return Plan(
            model=args.model or str(default_model(target)),
            benches=[get_benchmark(HELDOUT)],
            files={HELDOUT: str(target.rows_file)},
            template=target.prompt_template,
            repetition_penalty=target.repetition_penalty,
            max_new_tokens=args.max_new_tokens or target.max_new_tokens,
            batch_size=args.batch_size or target.batch_size,
            target=target,
        )
    try:
        import_plugins(
            plugins, field="--plugins", untrusted=[args.model] if args.model and Path(args.model).is_dir() else []
        )
    except ConfigError as err:
        raise ValueError(str(err)) from None
    benches = [get_benchmark(name.strip()) for name in (args.bench or "kk").split(",") if name.strip()]
    if not benches:
        raise ValueError(f"--bench: no benchmark named in {args.bench!r}")
    files = parse_bench_files(args.bench_file)
    unknown = sorted(set(files) - {b.name for b in benches})
    if unknown:
        raise ValueError(f"--bench-file: {unknown} not among --bench {args.bench}")
    return Plan(
        args.model,
        benches,
        files,
        "auto",
        1.0,
        args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
        args.batch_size or DEFAULT_BATCH_SIZE,
        None,
    )
