"""``python -m eval.run --model PATH --bench aime24,aime25,amc23,math500,mathvista,kk --k 8 --out DIR``.

For every benchmark: k sampled responses per problem (vLLM on GPU machines, `transformers` otherwise),
graded by the same reward functions as training, written one sample per line to ``DIR/samples.jsonl``
(prompt, response, extracted answer, correct, reward). The run is resumable: problems whose k samples are
already in that file are skipped. Grading is isolated per sample: a grader crash marks that sample wrong
with ``grader_error`` set and never loses finished samples. At the end ``DIR/report.json`` and
``DIR/report.md`` hold avg@k and unbiased pass@k per benchmark and subset.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from tqdm.auto import tqdm

from eval.benchmarks import Benchmark, get_benchmark, load_rows
from eval.generation import GENERATORS, EvalSampling, Generator, pick_engine
from eval.metrics import markdown_table, score_records

SAMPLES_FILE = "samples.jsonl"


def problem_id(row: Mapping[str, Any], index: int) -> str:
    meta = row.get("meta") or {}
    for key in ("id", "pid", "problem_id", "unique_id"):
        if meta.get(key) is not None:
            return str(meta[key])
    return str(index)


def grade(source: str, response: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """Reward-function verdict for one sample; any exception becomes a wrong answer with the error kept."""
    try:
        from adora_openrlhf.rewards.base import get_reward_fn

        result = get_reward_fn(source)(response, str(row["label"]), row.get("meta") or {})
        return {"correct": bool(result.correct), "reward": float(result.reward), "extracted": result.extracted, "grader_error": None}
    except Exception as err:  # noqa: BLE001 - a grader bug must not end the evaluation
        return {"correct": False, "reward": 0.0, "extracted": None, "grader_error": f"{type(err).__name__}: {err}"}


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
) -> int:
    """Generate and grade the problems of ``bench`` that are not finished in ``out_path``; returns how many
    problems were generated in this call."""
    drop_torn_tail(out_path)
    done = finished_samples(out_path)
    todo = [(i, row) for i, row in enumerate(rows) if len(done.get((bench.name, problem_id(row, i)), set())) < k]
    with open(out_path, "a", encoding="utf-8") as handle, tqdm(total=len(rows), initial=len(rows) - len(todo), desc=bench.name, unit="problem") as bar:
        for start in range(0, len(todo), batch_problems):
            chunk = todo[start : start + batch_problems]
            responses = generator.generate([row for _, row in chunk], k)
            for (index, row), samples in zip(chunk, responses):
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


def parse_bench_files(items: Optional[Sequence[str]]) -> dict[str, str]:
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
    parser = argparse.ArgumentParser(prog="python -m eval.run", description="avg@k and pass@k on AIME/AMC/MATH500/MathVista/K&K.")
    parser.add_argument("--model", required=True, help="local model directory (Hugging Face format) or hub name on GPU nodes")
    parser.add_argument("--bench", default="kk", help="comma-separated: kk,aime24,aime25,amc23,math500,mathvista,geo_synth")
    parser.add_argument("--k", type=int, default=8, help="samples per problem (avg@k, pass@1..k)")
    parser.add_argument("--out", required=True, help="output directory (samples.jsonl, report.json, report.md)")
    parser.add_argument("--engine", default="auto", help="auto | hf | vllm")
    parser.add_argument("--data-dir", default=None, help="directory with NAME.jsonl files from the data_prep converters")
    parser.add_argument("--bench-file", action="append", help="NAME=PATH: rows of one benchmark from a JSONL file")
    parser.add_argument("--limit", type=int, default=None, help="first N problems of each benchmark")
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--max-new-tokens", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=8, help="problems per generation call")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.k < 1:
            raise ValueError(f"--k: must be >= 1, got {args.k}")
        if args.temperature == 0 and args.k > 1:
            raise ValueError("--temperature 0 is greedy decoding: all k samples would be identical; use --k 1 or a temperature > 0")
        benches = [get_benchmark(name.strip()) for name in args.bench.split(",") if name.strip()]
        files = parse_bench_files(args.bench_file)
        unknown = sorted(set(files) - {b.name for b in benches})
        if unknown:
            raise ValueError(f"--bench-file: {unknown} not among --bench {args.bench}")
        if not Path(args.model).exists() and "/" not in args.model:
            raise ValueError(f"--model: {args.model} is neither a local directory nor a hub name (owner/name)")
        engine = pick_engine(args.engine)
    except ValueError as err:
        parser.exit(2, f"error: {err}\n")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    sampling = EvalSampling(temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens, seed=args.seed)
    generator = GENERATORS[engine](args.model, sampling) if engine == "vllm" else GENERATORS[engine](args.model, sampling, batch_size=args.batch_size * args.k)
    for bench in benches:
        rows = load_rows(bench, files.get(bench.name), args.data_dir, args.seed, args.limit, cache_dir=out_dir / "data")
        evaluate_benchmark(bench, rows, generator, args.k, out_dir / SAMPLES_FILE, batch_problems=args.batch_size)
    settings = {"model": args.model, "engine": engine, "k": args.k, **asdict(sampling)}
    print(write_report(out_dir, args.k, [b.name for b in benches], settings))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
