"""``python -m eval.run --model PATH --bench aime24,aime25,amc23,math500,mathvista,kk --k 8 --out DIR``, or
``python -m eval.run --run RUN --k 8`` for a local training run's own held-out set (``eval/runs.py``).

For every benchmark: k sampled responses per problem (vLLM on GPU machines, `transformers` otherwise; the
`transformers` engine decodes the samples of many problems in one batch, ``eval/generation.py``, with the local
backend's ``fast`` numerics unless ``--numerics exact`` or ``--run`` at temperature 0 (the run's own ``model.numerics``), and on a Linux CPU in one
forked process per torch thread, ``--workers``, ``eval/workers.py``), graded by
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
not fit the model (``eval/fit.py``), avg@k with its 95% sampling noise and unbiased pass@k per benchmark and
subset, and with ``--run`` the trainer's own held-out accuracy of the same checkpoint.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from adora_openrlhf.cli_errors import OneLineParser, add_debug_flag, check_output_dir, run_cli
from adora_openrlhf.engine.model_source import check_model_source, weight_files_problem
from adora_openrlhf.rundir.lock import DirLock
from eval.benchmarks import HELDOUT, Benchmark, get_benchmark, load_located_rows, row_file, row_source
from eval.fit import FitContext, PromptFit, fit_notes, prompt_fit
from eval.generation import DTYPES, GENERATORS, EvalSampling, Generator, parse_engine_args, pick_engine, resolve_dtype
from eval.metrics import ScoreRow, markdown_table, score_records
from eval.runs import RunTarget, default_model, default_out, model_origin, open_run, rows_changed, trainer_accuracy

logger = logging.getLogger(__name__)

SAMPLES_FILE = "samples.jsonl"
CONFIG_FILE = "eval_config.json"
SEEDING = "per-sample-stream"  # recorded in eval_config.json: problem_seed per problem, then generation.sample_seed per sample
DEFAULT_MAX_NEW_TOKENS = 1024
DEFAULT_BATCH_SIZE = 256  # sequences per decoding batch of the transformers engine (vLLM's max_num_seqs default)
NUMERICS_CHOICES = ("auto", "exact", "fast")


def resolve_decoding(
    numerics: str, workers: str, engine: str, temperature: float, run_numerics: str | None = None
) -> tuple[str | None, int | None]:
    """``(numerics, workers)`` of the transformers engine for the checked ``--numerics`` and ``--workers``.
    ``run_numerics``: with ``--run``, the ``model.numerics`` the run's trainer evaluated with (``exact`` for runs
    saved before it was recorded); None without ``--run``. Numerics ``auto`` is ``run_numerics`` when ``--run``
    decodes greedily, with one decoding process unless ``--workers`` says otherwise (the trainer's own arithmetic
    and batches, so its held-out accuracy is repeated exactly), else ``fast``; workers ``auto`` is otherwise None
    (``eval/workers.py`` picks). Several workers need ``fast`` (``exact`` keeps the trainer's batches in one
    process). The vLLM engine has its own kernels and processes: ``(None, None)``, and an explicit value of
    either flag is refused."""
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


def problem_id(row: Mapping[str, Any], index: int) -> str:
    meta = row.get("meta") or {}
    for key in ("id", "pid", "problem_id", "unique_id"):
        if meta.get(key) is not None:
            return str(meta[key])
    return str(index)


def problem_seed(seed: int, benchmark: str, pid: str) -> int:
    """The sampling seed of one problem: a stable 63-bit hash of (run seed, benchmark, problem id)."""
    digest = hashlib.sha256(f"{seed}:{benchmark}:{pid}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def problem_hash(row: Mapping[str, Any]) -> str:
    """The first 16 hex digits of the sha256 of a problem's content: its prompt, label, source and meta (as
    canonical JSON) and the bytes of its image files."""
    content = {
        "prompt": row.get("prompt"),
        "label": str(row.get("label")),
        "source": row.get("source"),
        "meta": row.get("meta") or {},
    }
    digest = hashlib.sha256(json.dumps(content, sort_keys=True, ensure_ascii=False, default=str).encode())
    for ref in row.get("images") or []:
        digest.update(Path(ref).read_bytes() if isinstance(ref, str) else repr(ref).encode())
    return digest.hexdigest()[:16]


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


def check_rows(bench: Benchmark, located: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
    """ValueError ``file:line: ...`` when two rows of ``bench`` share a problem id, when a row has no reward
    source (benchmark ``heldout`` grades each row by its own), when the reward cannot parse a row's label, or when
    a label is longer than ``MAX_LABEL_CHARS``, or a meta field the reward reads is wrong (the local backend's load-time checks, the label and row checks
    of the task that reads the row's source, ``adora_openrlhf/tasks/registry.py``: a K&K label against the prompt's names and
    ``meta.statements``, a math row's ``reward_style``/``answer_scope``/``grader_timeout_s``, a visual row's
    question and answer types)."""
    from adora_openrlhf.rewards.base import get_reward_fn
    from adora_openrlhf.rows import MAX_LABEL_CHARS
    from adora_openrlhf.tasks.registry import row_problem

    first: dict[str, str] = {}
    for index, (where, row) in enumerate(located):
        source = row_source(bench, row)
        if bench.source is None:
            try:
                get_reward_fn(source)
            except KeyError as err:
                what = err.args[0] if source else f"missing (--bench {bench.name} grades each row by its own source)"
                raise ValueError(f"{where}: field 'source': {what}") from None
        meta = row.get("meta") or {}
        if not isinstance(meta, dict):
            raise ValueError(f"{where}: field 'meta': expected an object, got {type(meta).__name__}")
        if len(str(row["label"])) > MAX_LABEL_CHARS:
            raise ValueError(
                f"{where}: field 'label': {len(str(row['label']))} characters, more than the {MAX_LABEL_CHARS} a ground-truth answer may have"
            )
        problem = row_problem(source, row["prompt"], str(row["label"]), meta)
        if problem is not None:
            raise ValueError(f"{where}: {problem}")
        pid = problem_id(row, index)
        if pid in first:
            raise ValueError(
                f"{where}: problem id {pid!r} of --bench {bench.name} repeats {first[pid]}; give every "
                "problem its own meta.id (otherwise their samples would be merged)"
            )
        first[pid] = where


def check_prompts(
    generator: Generator, bench: Benchmark, located: Sequence[tuple[str, Mapping[str, Any]]]
) -> PromptFit:
    """ValueError ``file:line: field ...`` for a row the model cannot take (images for a text-only model, a prompt
    the template cannot render, that encodes to nothing or to token ids the model has no embedding for); else
    what the tokenizer makes of the prompts (``eval/fit.py``)."""
    texts = []
    limit = getattr(generator, "vocab_limit", None)
    for where, row in located:
        if row.get("images") and not generator.accepts_images:
            raise ValueError(
                f"{where}: field 'images': the model is text-only (no vision_config); evaluate --bench {bench.name} with a vision-language model"
            )
        try:
            text = generator.prompt_text(row)
        except ValueError as err:
            raise ValueError(f"{where}: field 'prompt': {err}") from None
        ids = generator.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"{where}: field 'prompt': encodes to no tokens")
        if limit is not None and max(ids) >= limit:
            raise ValueError(
                f"{where}: field 'prompt': encodes to token id {max(ids)}, but the model has {limit} token embeddings "
                "(its tokenizer holds more tokens than the model: they do not belong together)"
            )
        texts.append(text)
    return prompt_fit(generator.tokenizer, texts, [where for where, _ in located], [row for _, row in located])


def model_identity(model: str) -> dict[str, Any]:
    """What identifies a model for eval_config.json: a local directory's resolved path and its files' names,
    sizes and modification times (a model retrained in place is another model); a hub name as given."""
    path = Path(model)
    if not path.exists():
        return {"model": model}
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    listing = [
        f"{p.relative_to(path) if path.is_dir() else p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files
    ]
    return {"model": str(path.resolve()), "model_files": hashlib.sha256("\n".join(listing).encode()).hexdigest()[:16]}


def check_eval_config(out_dir: Path, wanted: Mapping[str, Any]) -> None:
    """ValueError when ``out_dir`` holds samples made with other settings than ``wanted`` (module docstring)."""
    saved_path, samples = out_dir / CONFIG_FILE, out_dir / SAMPLES_FILE
    if not saved_path.exists():
        if samples.exists() and samples.stat().st_size > 0:
            raise ValueError(
                f"--out: {out_dir} holds samples without {CONFIG_FILE} (unknown model and settings); use a new --out"
            )
        return
    try:
        saved = json.loads(saved_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError(f"--out: {saved_path} is not valid JSON; use a new --out") from None
    changed = [key for key in sorted(set(saved) | set(wanted)) if saved.get(key) != wanted.get(key)]
    if changed:
        details = ", ".join(f"{k}: {saved.get(k)!r} -> {wanted.get(k)!r}" for k in changed)
        raise ValueError(
            f"--out: {out_dir} holds samples generated with other settings ({details}); use a new --out for this model and these settings"
        )


def grade(source: str, response: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """Reward-function verdict for one sample; any exception becomes a wrong answer, scored with the task's failure
    reward (its lowest, never above a wrong answer), with the error kept."""
    from adora_openrlhf.rewards.base import failure_reward, get_reward_fn

    try:
        result = get_reward_fn(source)(response, str(row["label"]), row.get("meta") or {})
        return {
            "correct": bool(result.correct),
            "reward": float(result.reward),
            "extracted": result.extracted,
            "grader_error": None,
        }
    except Exception as err:  # noqa: BLE001 - a grader bug must not end the evaluation
        reward = failure_reward(source, row.get("meta") if isinstance(row, Mapping) else None)
        return {"correct": False, "reward": reward, "extracted": None, "grader_error": f"{type(err).__name__}: {err}"}


SampleKey = tuple[str, str, str]  # (benchmark, problem id, problem hash)


def finished_samples(path: Path) -> dict[SampleKey, set[int]]:
    """(benchmark, problem_id, problem hash) -> sample indices already written (a torn last line is ignored;
    records without a hash, from before hashes were recorded, match no row)."""
    done: dict[SampleKey, set[int]] = {}
    for rec in read_records(path):
        done.setdefault((rec["benchmark"], str(rec["problem_id"]), str(rec.get("problem_hash"))), set()).add(
            int(rec["sample_index"])
        )
    return done


def drop_torn_tail(path: Path) -> None:
    """Cut a last line left unfinished by an interruption, so that appended records start on a new line."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as handle:
        data = handle.read()
        if not data.endswith(b"\n"):
            handle.truncate(data.rfind(b"\n") + 1)


def current_keys(bench: Benchmark, rows: Sequence[Mapping[str, Any]]) -> list[SampleKey]:
    """The sample key of each row of ``bench`` (benchmark, problem id, problem hash)."""
    return [(bench.name, problem_id(row, i), problem_hash(row)) for i, row in enumerate(rows)]


def evaluate_benchmark(
    bench: Benchmark,
    rows: Sequence[Mapping[str, Any]],
    generator: Generator,
    k: int,
    out_path: Path,
    batch_problems: int = 8,
    grade_fn: Callable[[str, str, Mapping[str, Any]], dict[str, Any]] = grade,
    seed: int = 0,
) -> int:
    """Generate and grade the problems of ``bench`` whose k samples of their current content are not all in
    ``out_path``, ``batch_problems`` problems per generation call; returns how many problems were generated.
    Problem ``p`` is sampled with ``problem_seed(seed, bench, p)``. Progress is shown per sample with an ETA."""
    drop_torn_tail(out_path)
    done = finished_samples(out_path)
    keys = current_keys(bench, rows)
    todo = [(i, row) for i, row in enumerate(rows) if len(done.get(keys[i], set())) < k]
    wanted = set(keys)
    stale = sum(
        len(v)
        for key, v in done.items()
        if key[0] == bench.name and key not in wanted and key[1] in {p for _, p, _ in wanted}
    )
    if stale:
        logger.info(
            "%s: ignoring %d samples of problems whose prompt, label or images changed since; they are generated again",
            bench.name,
            stale,
        )
    logger.info(
        "%s: %d problems x %d samples to generate (%d of %d problems finished in %s)",
        bench.name,
        len(todo),
        k,
        len(rows) - len(todo),
        len(rows),
        out_path,
    )
    with (
        open(out_path, "a", encoding="utf-8") as handle,
        tqdm(total=len(todo) * k, desc=bench.name, unit="sample", dynamic_ncols=True) as bar,
    ):
        for start in range(0, len(todo), batch_problems):
            chunk = todo[start : start + batch_problems]
            seeds = [problem_seed(seed, bench.name, keys[index][1]) for index, _ in chunk]
            shown = bar.n
            completions = generator.generate([row for _, row in chunk], k, seeds=seeds, progress=bar.update)
            for (index, row), samples in zip(chunk, completions, strict=True):
                _, pid, content = keys[index]
                have = done.get(keys[index], set())
                for sample_index, sample in enumerate(samples):
                    if sample_index in have:
                        continue
                    record = {
                        "benchmark": bench.name,
                        "problem_id": pid,
                        "problem_hash": content,
                        "source": row_source(bench, row),
                        "subsets": bench.subsets(row),
                        "sample_index": sample_index,
                        "prompt": row["prompt"],
                        "label": row["label"],
                        "response": sample.text,
                        "response_tokens": sample.tokens,
                        "truncated": sample.truncated,
                        **grade_fn(row_source(bench, row), sample.text, row),
                    }
                    handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
            bar.update(shown + len(chunk) * k - bar.n)  # whatever the engine did not report itself
    return len(todo)


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


def read_records(path: Path) -> list[dict[str, Any]]:
    records = []
    if path.exists():
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return records


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
        prog="python -m eval.run",
        description="avg@k and pass@k on AIME/AMC/MATH500/MathVista/K&K, or on a training run's held-out set.",
    )
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
    parser.add_argument("--k", type=int, default=8, help="samples per problem (avg@k, pass@1..k)")
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
        "problem of a call (eval/workers.py); auto (default) = one per torch thread, 1 elsewhere",
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
    add_debug_flag(parser)
    return parser


def _check_args(args: argparse.Namespace) -> None:
    """ValueError naming the flag for every out-of-range argument."""
    if args.k < 1:
        raise ValueError(f"--k: must be >= 1, got {args.k}")
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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    out = {"dir": "the output directory"}
    return run_cli(
        lambda: _main(argv, out),
        argv,
        interrupted_hint=lambda: f"finished samples are kept in {out['dir']}; rerun the same command to continue",
    )


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


def plan_from_args(args: argparse.Namespace) -> Plan:
    """The :class:`Plan` of checked ``args``: with ``--run`` the run's held-out set, final model (unless
    ``--model``), prompt template, repetition penalty, token limit and batch size (unless given)."""
    if args.run is not None:
        target = open_run(args.run)
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


def _checked_model(model: str) -> bool:
    """Whether ``model`` is a local directory (else a hub name), after refusing a model that cannot load."""
    checked_dir = Path(model).is_dir()  # a local model, whatever happens to the directory later
    if checked_dir and not (Path(model) / "config.json").exists():
        raise ValueError(f"--model: {model} has no config.json; give a model directory in Hugging Face format")
    check_model_source(model, "--model")  # a hub name: in the hub cache (HF_HUB_OFFLINE=1) or on the hub
    problem = weight_files_problem(model)  # a truncated or damaged weight file, named before the engine loads it
    if problem is not None:
        raise ValueError(f"--model: {model}: {problem}; re-export or re-download the model")
    return checked_dir


def _report_settings(
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


def _main(argv: Sequence[str], out: dict[str, str]) -> int:
    args = build_parser().parse_args(argv)
    _check_args(args)
    plan = plan_from_args(args)
    model, benches, files, target, batch_size = plan.model, plan.benches, plan.files, plan.target, plan.batch_size
    engine = pick_engine(args.engine)
    dtype = resolve_dtype(args.dtype)
    engine_args = parse_engine_args(args.vllm_arg)
    trained = target.numerics if target is not None else None
    numerics, workers = resolve_decoding(args.numerics, args.workers, engine, args.temperature, trained)
    if engine_args and engine != "vllm":
        raise ValueError(
            f"--vllm-arg: only used by the vLLM engine, but the engine is {engine!r}; drop it or pass --engine vllm"
        )
    checked_dir = _checked_model(model)
    sampling = EvalSampling(args.temperature, args.top_p, plan.max_new_tokens, args.seed, plan.repetition_penalty)
    template = plan.template
    settings = {
        **model_identity(model),
        "engine": engine,
        "dtype": dtype,
        "seeding": SEEDING,
        "prompt_template": template,
    }
    settings.update(asdict(sampling))
    out_dir = Path(args.out) if args.out is not None else default_out(target, Path(model), settings)
    out["dir"] = str(out_dir)
    check_output_dir(out_dir, "--out")
    lock = DirLock(out_dir, "--out", "eval.run")
    lock.check_free()  # another evaluation writing here: refused before the model loads
    check_eval_config(out_dir, settings)
    # read-only first (rows from files, the model), so that a bad file or model writes nothing; then the
    # benchmark loaders that convert hub datasets into out_dir/data
    located: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    by_file = [b for b in benches if row_file(b, files.get(b.name), args.data_dir) is not None]
    for bench in by_file:
        located[bench.name] = load_located_rows(
            bench, files.get(bench.name), args.data_dir, args.seed, args.limit, cache_dir=out_dir / "data"
        )
        check_rows(bench, located[bench.name])
    options = engine_args if engine == "vllm" else {"batch_size": batch_size, "numerics": numerics, "workers": workers}
    generator = open_generator(engine, model, sampling, checked_dir, dtype=args.dtype, template=template, **options)
    prompts = {bench.name: check_prompts(generator, bench, located[bench.name]) for bench in by_file}
    with lock:
        check_eval_config(out_dir, settings)  # again, now that no other evaluation can write here
        for bench in [b for b in benches if b not in by_file]:
            located[bench.name] = load_located_rows(
                bench, None, args.data_dir, args.seed, args.limit, cache_dir=out_dir / "data"
            )
            check_rows(bench, located[bench.name])
            prompts[bench.name] = check_prompts(generator, bench, located[bench.name])
        (out_dir / CONFIG_FILE).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
        keys: list[SampleKey] = []
        for bench in benches:
            rows = [row for _, row in located[bench.name]]
            evaluate_benchmark(
                bench,
                rows,
                generator,
                args.k,
                out_dir / SAMPLES_FILE,
                batch_problems=max(1, batch_size // args.k),
                seed=args.seed,
            )
            keys += current_keys(bench, rows)
        records = current_records(out_dir, keys)
        notes = _fit_notes(benches, located, prompts, records, sampling, generator, model, target)
        report_settings = _report_settings(model, engine, dtype, template, sampling, batch_size, numerics, generator)
        comparison = []
        if target is not None:
            report_settings["run"] = str(target.run_dir)
            comparison = run_comparison(target, Path(model), score_records(records, args.k), args.k, args.temperature)
        names = [b.name for b in benches]
        text = write_report(out_dir, args.k, names, report_settings, current=keys, notes=notes, comparison=comparison)
    print(f"{out_dir / 'report.md'}:\n{text}")
    return 0


def current_records(out_dir: Path, keys: Iterable[SampleKey]) -> list[dict[str, Any]]:
    """The samples of ``out_dir`` whose (benchmark, problem id, problem hash) is among ``keys``."""
    wanted = set(keys)
    return [
        r
        for r in read_records(out_dir / SAMPLES_FILE)
        if (r["benchmark"], str(r["problem_id"]), str(r.get("problem_hash"))) in wanted
    ]


def _fit_notes(
    benches, located, prompts, records, sampling: EvalSampling, generator, model: str, target: RunTarget | None
) -> list[str]:
    """The fit notes of every benchmark (``eval/fit.py``) from its rows, prompts and current samples."""
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


if __name__ == "__main__":
    raise SystemExit(main())
