"""The benchmark loop of ``python -m eval.run``: problem ids, seeds and content hashes, grading, and
``samples.jsonl`` (one graded sample per line, appended and fsynced per generation call, resumed by problem id
and content hash; a torn last line is cut).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from adora_openrlhf.evaluation.benchmarks import Benchmark, row_source
from adora_openrlhf.evaluation.generation import Completion, Generator
from adora_openrlhf.rewards.grading import StepGrader

logger = logging.getLogger(__name__)

SAMPLES_FILE = "samples.jsonl"


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


def finished_samples(path: Path) -> dict[SampleKey, set[int]]:
    """(benchmark, problem_id, problem hash) -> sample indices already written (a torn last line is ignored;
    records without a hash, from before hashes were recorded, match no row)."""
    done: dict[SampleKey, set[int]] = {}
    for rec in read_records(path):
        done.setdefault((rec["benchmark"], str(rec["problem_id"]), str(rec.get("problem_hash"))), set()).add(
            int(rec["sample_index"])
        )
    return done


def current_records(out_dir: Path, keys: Iterable[SampleKey]) -> list[dict[str, Any]]:
    """The samples of ``out_dir`` whose (benchmark, problem id, problem hash) is among ``keys``."""
    wanted = set(keys)
    return [
        r
        for r in read_records(out_dir / SAMPLES_FILE)
        if (r["benchmark"], str(r["problem_id"]), str(r.get("problem_hash"))) in wanted
    ]


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


def _log_todo(
    bench: Benchmark,
    done: dict[SampleKey, set[int]],
    keys: Sequence[SampleKey],
    todo: int,
    total: int,
    k: int,
    out_path: Path,
) -> None:
    """Log how many problems of ``bench`` are to generate, and how many samples of changed problems are ignored."""
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
        todo,
        k,
        total - todo,
        total,
        out_path,
    )


GradeFn = Callable[[str, str, Mapping[str, Any]], dict[str, Any]]  # (source, response, row) -> grade fields


def grade_batch(
    items: Sequence[tuple[str, str, Mapping[str, Any]]], grade_fn: GradeFn, grader: StepGrader
) -> list[dict[str, Any]]:
    """The grades of ``(source, response, row)`` items, graded together under one ``grader`` deadline (the run's
    ``grading.deadline_s`` for every reward call, as in training): an item not graded in time scores its task's
    failure reward, counts as wrong and carries ``grader_late: true``."""
    from adora_openrlhf.rewards.base import RewardResult, failure_reward
    from adora_openrlhf.rewards.grading import GradingJob

    graded: dict[int, dict[str, Any]] = {}  # item -> its grade fields, written by the grading thread

    def reward_fn(i: int, source: str, row: Mapping[str, Any]) -> Callable[..., RewardResult]:
        def grade_item(response: str, label: str, meta: Mapping[str, Any]) -> RewardResult:
            graded[i] = grade_fn(source, response, row)
            return RewardResult(float(graded[i]["reward"]), bool(graded[i]["correct"]), graded[i].get("extracted"))

        return grade_item

    grader.start_step()
    jobs = [
        GradingJob(
            reward_fn(i, source, row),
            response,
            "",
            {},
            failure_reward(source, row.get("meta") if isinstance(row, Mapping) else None),
        )
        for i, (source, response, row) in enumerate(items)
    ]
    return [
        {"correct": False, "reward": result.reward, "extracted": None, "grader_error": None, "grader_late": True}
        if result.info.get("grader_late")  # grading.late_result: the task's failure reward
        else {**graded[i], "grader_late": False}
        for i, result in enumerate(grader.grade(jobs))
    ]


def _sample_record(
    bench: Benchmark,
    row: Mapping[str, Any],
    key: SampleKey,
    sample_index: int,
    sample: Completion,
    grade: dict[str, Any],
) -> dict[str, Any]:
    """One line of ``samples.jsonl``: the sample, its problem and its grade."""
    _, pid, content = key
    return {
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
        **grade,
    }


def evaluate_benchmark(
    bench: Benchmark,
    rows: Sequence[Mapping[str, Any]],
    generator: Generator,
    k: int,
    out_path: Path,
    batch_problems: int = 8,
    grade_fn: GradeFn = grade,
    seed: int = 0,
    grader: StepGrader | None = None,
) -> int:
    """Generate and grade the problems of ``bench`` whose k samples of their current content are not all in
    ``out_path``, ``batch_problems`` problems per generation call; returns how many problems were generated.
    Problem ``p`` is sampled with ``problem_seed(seed, bench, p)``. Progress is shown per sample with an ETA.
    Each call's samples are graded together under ``grader``'s deadline (default: ``GradingConfig()``'s) and
    written, fsynced, before the next call, so an interrupt keeps every finished call."""
    grader = grader or StepGrader()
    drop_torn_tail(out_path)
    done = finished_samples(out_path)
    keys = current_keys(bench, rows)
    todo = [(i, row) for i, row in enumerate(rows) if len(done.get(keys[i], set())) < k]
    _log_todo(bench, done, keys, len(todo), len(rows), k, out_path)
    with (
        open(out_path, "a", encoding="utf-8") as handle,
        tqdm(total=len(todo) * k, desc=bench.name, unit="sample", dynamic_ncols=True) as bar,
    ):
        for start in range(0, len(todo), batch_problems):
            chunk = todo[start : start + batch_problems]
            seeds = [problem_seed(seed, bench.name, keys[index][1]) for index, _ in chunk]
            shown = bar.n
            completions = generator.generate([row for _, row in chunk], k, seeds=seeds, progress=bar.update)
            new = [
                (index, row, sample_index, sample)
                for (index, row), samples in zip(chunk, completions, strict=True)
                for sample_index, sample in enumerate(samples)
                if sample_index not in done.get(keys[index], set())
            ]
            grades = grade_batch([(row_source(bench, row), s.text, row) for _, row, _, s in new], grade_fn, grader)
            for (index, row, sample_index, sample), graded in zip(new, grades, strict=True):
                record = _sample_record(bench, row, keys[index], sample_index, sample, graded)
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
            bar.update(shown + len(chunk) * k - bar.n)  # whatever the engine did not report itself
    return len(todo)
