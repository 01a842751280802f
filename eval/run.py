"""``python -m eval.run --model PATH --bench aime24,aime25,amc23,math500,mathvista,kk --k 8 --out DIR``.

For every benchmark: k sampled responses per problem (vLLM on GPU machines, `transformers` otherwise),
graded by the same reward functions as training, written one sample per line to ``DIR/samples.jsonl``
(prompt, response, extracted answer, correct, reward). The run is resumable: problems whose k samples are
already in that file are skipped. ``DIR/eval_config.json`` records what the samples were generated with (the
model, identified by its resolved path and its files' sizes and times, the engine, temperature, top_p,
max_new_tokens and seed); a rerun into the same ``--out`` with any of them changed is refused, so samples of
two models or settings never mix. Each problem's samples are drawn with their own seed (from the run's seed,
the benchmark and the problem id), so a problem's samples do not depend on which problems share its batch and
an interrupted batch is redone identically. Problem ids (``meta.id``/``pid``/... or the row position) must be
unique within a benchmark; a repeated one is refused with its ``file:line``. Grading is isolated per sample: a
grader crash marks that sample wrong with ``grader_error`` set and never loses finished samples. At the end
``DIR/report.json`` and ``DIR/report.md`` hold avg@k and unbiased pass@k per benchmark and subset.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from adora_openrlhf.backends.local.model_source import check_model_source
from adora_openrlhf.cli_errors import OneLineParser, add_debug_flag, check_output_dir, run_cli
from eval.benchmarks import Benchmark, get_benchmark, load_located_rows, row_file
from eval.generation import DTYPES, GENERATORS, EvalSampling, Generator, parse_engine_args, pick_engine, resolve_dtype
from eval.metrics import markdown_table, score_records

SAMPLES_FILE = "samples.jsonl"
CONFIG_FILE = "eval_config.json"
SEEDING = "per-problem"  # recorded in eval_config.json: how sample seeds are derived (problem_seed)


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


def check_rows(bench: Benchmark, located: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
    """ValueError ``file:line: ...`` when two rows of ``bench`` share a problem id, or when the benchmark's reward
    cannot parse a row's label (the local backend's load-time label checks)."""
    from adora_openrlhf.backends.local.data import LABEL_CHECKS

    check_label = LABEL_CHECKS.get(bench.source)
    first: dict[str, str] = {}
    for index, (where, row) in enumerate(located):
        if check_label is not None:
            meta = row.get("meta") if isinstance(row.get("meta"), dict) else {}
            try:
                check_label(str(row["label"]), meta)
            except ValueError as err:
                raise ValueError(f"{where}: field 'label': the {bench.source!r} reward cannot parse it ({err})") from None
        pid = problem_id(row, index)
        if pid in first:
            raise ValueError(
                f"{where}: problem id {pid!r} of --bench {bench.name} repeats {first[pid]}; give every "
                "problem its own meta.id (otherwise their samples would be merged)"
            )
        first[pid] = where


def model_identity(model: str) -> dict[str, Any]:
    """What identifies a model for eval_config.json: a local directory's resolved path and its files' names,
    sizes and modification times (a model retrained in place is another model); a hub name as given."""
    path = Path(model)
    if not path.exists():
        return {"model": model}
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    listing = [f"{p.relative_to(path) if path.is_dir() else p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files]
    return {"model": str(path.resolve()), "model_files": hashlib.sha256("\n".join(listing).encode()).hexdigest()[:16]}


def check_eval_config(out_dir: Path, wanted: Mapping[str, Any]) -> None:
    """ValueError when ``out_dir`` holds samples made with other settings than ``wanted`` (module docstring)."""
    saved_path, samples = out_dir / CONFIG_FILE, out_dir / SAMPLES_FILE
    if not saved_path.exists():
        if samples.exists() and samples.stat().st_size > 0:
            raise ValueError(f"--out: {out_dir} holds samples without {CONFIG_FILE} (unknown model and settings); use a new --out")
        return
    try:
        saved = json.loads(saved_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError(f"--out: {saved_path} is not valid JSON; use a new --out") from None
    changed = [key for key in sorted(set(saved) | set(wanted)) if saved.get(key) != wanted.get(key)]
    if changed:
        details = ", ".join(f"{k}: {saved.get(k)!r} -> {wanted.get(k)!r}" for k in changed)
        raise ValueError(f"--out: {out_dir} holds samples generated with other settings ({details}); use a new --out for this model and these settings")


def grade(source: str, response: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """Reward-function verdict for one sample; any exception becomes a wrong answer, scored with the task's failure
    reward (its lowest, never above a wrong answer), with the error kept."""
    from adora_openrlhf.rewards.base import failure_reward, get_reward_fn

    try:
        result = get_reward_fn(source)(response, str(row["label"]), row.get("meta") or {})
        return {"correct": bool(result.correct), "reward": float(result.reward), "extracted": result.extracted, "grader_error": None}
    except Exception as err:  # noqa: BLE001 - a grader bug must not end the evaluation
        reward = failure_reward(source, row.get("meta") if isinstance(row, Mapping) else None)
        return {"correct": False, "reward": reward, "extracted": None, "grader_error": f"{type(err).__name__}: {err}"}


def finished_samples(path: Path) -> dict[tuple[str, str], set[int]]:
    """(benchmark, problem_id) -> sample indices already written (a torn last line is ignored)."""
    done: dict[tuple[str, str], set[int]] = {}
    if not path.exists():
        return done
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by an interruption; its problem is redone
            done.setdefault((rec["benchmark"], str(rec["problem_id"])), set()).add(int(rec["sample_index"]))
    return done


def drop_torn_tail(path: Path) -> None:
    """Cut a last line left unfinished by an interruption, so that appended records start on a new line."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as handle:
        data = handle.read()
        if not data.endswith(b"\n"):
            handle.truncate(data.rfind(b"\n") + 1)


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
    """Generate and grade the problems of ``bench`` that are not finished in ``out_path``; returns how many
    problems were generated in this call. Problem ``p`` is sampled with ``problem_seed(seed, bench, p)``."""
    drop_torn_tail(out_path)
    done = finished_samples(out_path)
    todo = [(i, row) for i, row in enumerate(rows) if len(done.get((bench.name, problem_id(row, i)), set())) < k]
    with open(out_path, "a", encoding="utf-8") as handle, tqdm(total=len(rows), initial=len(rows) - len(todo), desc=bench.name, unit="problem") as bar:
        for start in range(0, len(todo), batch_problems):
            chunk = todo[start : start + batch_problems]
            seeds = [problem_seed(seed, bench.name, problem_id(row, index)) for index, row in chunk]
            responses = generator.generate([row for _, row in chunk], k, seeds=seeds)
            for (index, row), samples in zip(chunk, responses, strict=True):
                pid = problem_id(row, index)
                have = done.get((bench.name, pid), set())
                for sample_index, response in enumerate(samples):
                    if sample_index in have:
                        continue
                    record = {
                        "benchmark": bench.name,
                        "problem_id": pid,
                        "subsets": bench.subsets(row),
                        "sample_index": sample_index,
                        "prompt": row["prompt"],
                        "label": row["label"],
                        "response": response,
                        **grade_fn(bench.source, response, row),
                    }
                    handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
            bar.update(len(chunk))
    return len(todo)


def write_report(out_dir: Path, k: int, benches: Iterable[str], settings: Mapping[str, Any]) -> str:
    """Score ``samples.jsonl`` and write report.json / report.md; returns the Markdown table."""
    wanted = set(benches)
    records = [r for r in read_records(out_dir / SAMPLES_FILE) if r["benchmark"] in wanted]
    rows = score_records(records, k)
    table = markdown_table(rows, k)
    (out_dir / "report.md").write_text(f"# Evaluation\n\n{json.dumps(dict(settings))}\n\n{table}\n", encoding="utf-8")
    report = {"settings": dict(settings), "k": k, "rows": [{**asdict(r), "pass_at": {str(kk): v for kk, v in r.pass_at.items()}} for r in rows]}
    (out_dir / "report.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    return table


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
    parser = OneLineParser(prog="python -m eval.run", description="avg@k and pass@k on AIME/AMC/MATH500/MathVista/K&K.")
    parser.add_argument(
        "--model",
        required=True,
        help="local model directory (Hugging Face format, e.g. a training step directory) or hub name owner/name (with HF_HUB_OFFLINE=1: from the hub cache)",
    )
    parser.add_argument("--bench", default="kk", help="comma-separated: kk,aime24,aime25,amc23,math500,mathvista,geo_synth")
    parser.add_argument("--k", type=int, default=8, help="samples per problem (avg@k, pass@1..k)")
    parser.add_argument("--out", required=True, help="output directory (samples.jsonl, eval_config.json, report.json, report.md)")
    parser.add_argument("--engine", default="auto", help="auto | hf | vllm")
    parser.add_argument("--data-dir", default=None, help="directory with NAME.jsonl files from the data_prep converters")
    parser.add_argument("--bench-file", action="append", help="NAME=PATH: rows of one benchmark from a JSONL file")
    parser.add_argument("--limit", type=int, default=None, help="first N problems of each benchmark")
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--max-new-tokens", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=8, help="problems per generation call")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="auto", help=f"{' | '.join(DTYPES)}: weights' dtype for either engine (auto: float32 on CPU, bfloat16 with CUDA)")
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
        raise ValueError("--temperature 0 is greedy decoding: all k samples would be identical; use --k 1 or a temperature > 0")
    if not (0 < args.top_p <= 1):
        raise ValueError(f"--top-p: must be in (0, 1], got {args.top_p}")
    for flag, value in (("--max-new-tokens", args.max_new_tokens), ("--batch-size", args.batch_size)):
        if value < 1:
            raise ValueError(f"{flag}: must be >= 1, got {value}")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit: must be >= 1, got {args.limit}")
    if args.seed < 0:
        raise ValueError(f"--seed: must be >= 0, got {args.seed}")
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        raise ValueError(f"--data-dir: {args.data_dir} is not a directory")
    model = Path(args.model)
    if model.exists() and not model.is_dir():
        raise ValueError(f"--model: {args.model} is a file; give a model directory (Hugging Face format)")
    looks_local = args.model.startswith(("/", "./", "../", "~")) or args.model.count("/") != 1
    if not model.exists() and looks_local:
        raise ValueError(f"--model: {args.model} is neither a local directory nor a hub name (owner/name)")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    out = {"dir": "the output directory"}
    return run_cli(lambda: _main(argv, out), argv, interrupted_hint=lambda: f"finished samples are kept in {out['dir']}; rerun the same command to continue")


def _main(argv: Sequence[str], out: dict[str, str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_args(args)
    benches = [get_benchmark(name.strip()) for name in args.bench.split(",") if name.strip()]
    if not benches:
        raise ValueError(f"--bench: no benchmark named in {args.bench!r}")
    files = parse_bench_files(args.bench_file)
    unknown = sorted(set(files) - {b.name for b in benches})
    if unknown:
        raise ValueError(f"--bench-file: {unknown} not among --bench {args.bench}")
    engine = pick_engine(args.engine)
    dtype = resolve_dtype(args.dtype)
    engine_args = parse_engine_args(args.vllm_arg)
    if engine_args and engine != "vllm":
        raise ValueError(f"--vllm-arg: only used by the vLLM engine, but the engine is {engine!r}; drop it or pass --engine vllm")
    if Path(args.model).is_dir() and not (Path(args.model) / "config.json").exists():
        raise ValueError(f"--model: {args.model} has no config.json; give a model directory in Hugging Face format")
    check_model_source(args.model, "--model")  # a hub name: in the hub cache (HF_HUB_OFFLINE=1) or on the hub
    out_dir = Path(args.out)
    out["dir"] = str(out_dir)
    check_output_dir(out_dir, "--out")
    sampling = EvalSampling(temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens, seed=args.seed)
    settings = {**model_identity(args.model), "engine": engine, "dtype": dtype, "seeding": SEEDING, **asdict(sampling)}
    check_eval_config(out_dir, settings)
    # read-only first (rows from files, the model), so that a bad file or model writes nothing; then the
    # benchmark loaders that convert hub datasets into out_dir/data
    located: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    by_file = [b for b in benches if row_file(b, files.get(b.name), args.data_dir) is not None]
    for bench in by_file:
        located[bench.name] = load_located_rows(bench, files.get(bench.name), args.data_dir, args.seed, args.limit, cache_dir=out_dir / "data")
        check_rows(bench, located[bench.name])
    if engine == "vllm":
        generator = GENERATORS[engine](args.model, sampling, dtype=args.dtype, **engine_args)
    else:
        generator = GENERATORS[engine](args.model, sampling, batch_size=args.batch_size * args.k, dtype=args.dtype)
    out_dir.mkdir(parents=True, exist_ok=True)
    for bench in [b for b in benches if b not in by_file]:
        located[bench.name] = load_located_rows(bench, None, args.data_dir, args.seed, args.limit, cache_dir=out_dir / "data")
        check_rows(bench, located[bench.name])
    (out_dir / CONFIG_FILE).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    for bench in benches:
        rows = [row for _, row in located[bench.name]]
        evaluate_benchmark(bench, rows, generator, args.k, out_dir / SAMPLES_FILE, batch_problems=args.batch_size, seed=args.seed)
    settings = {"model": args.model, "engine": engine, "dtype": dtype, "k": args.k, **asdict(sampling)}
    print(write_report(out_dir, args.k, [b.name for b in benches], settings))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
