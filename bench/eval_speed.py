"""``eval.run --engine hf`` time: one generation call per problem against batching across problems, side by side.

``python -m bench.eval_speed --model runs/kk-testbed/final_model [--bench kk] [--bench-file FILE] [--limit 40] [--k 4]
[--temperature 0.6] [--max-new-tokens 1024] [--batch-size 256] [--exact-batch-size 128] [--threads 1 2]
[--out bench/results/eval_speed]``

Three ways through ``eval.run.evaluate_benchmark`` (generation, grading, ``samples.jsonl``), on the same model, rows
and settings, in one process:

- ``per-problem``: the `transformers` engine before cross-problem batching, reproduced here
  (:class:`PerProblemGenerator`): one compact-decoding call per problem for its k samples, with the growing cache
  holding one entry per key/value head (as it did then), the model's forward at every step, under
  ``torch.manual_seed(problem seed)``, 8 problems per ``evaluate_benchmark`` call;
- ``batched-exact``: ``eval.generation.HFGenerator`` with ``numerics="exact"`` (the trainer's arithmetic, bitwise
  the model's logits): the samples of ``exact-batch-size // k`` problems per call and decoding batch, one random
  stream per sample, the cache's heads repeated for grouped-query attention on CPU, the one-token steps through
  ``engine/decode_step.py``;
- ``batched-fast``: ``HFGenerator`` as ``eval.run`` uses it by default: ``numerics="fast"`` (grouped-query attention
  over one cache entry per key/value head, fewer operations per step, top-p without a full sort, each prompt
  prefilled once for its k samples), ``batch-size`` sequences per decoding batch, and the problems of a call
  split over one forked process per torch thread (``evaluation/workers.py``; one thread: no fork).

Each ``--threads`` value (torch threads) times each way ``--repeats`` times, the ways interleaved (a slow spell of the
shared machine then falls on all of them); the table gives the median.

Two modes: ``sampled`` (``--k`` samples at ``--temperature``: the README's evaluation example by default) and
``greedy`` (temperature 0, k = 1, where the ways should give the same responses: counted). Prints and writes
(``table.md``, ``results.json`` in ``--out``) the wall and CPU seconds (worker processes included) of each way, the speed-ups, avg@k
of each, and for greedy decoding how many responses are identical to per-problem's; the samples of each way go
to ``--out/runs/``.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from adora_openrlhf.evaluation.generation import Completion, EvalSampling, HFGenerator, Progress
from bench.common import markdown_table, write_json

WAYS = ("per-problem", "batched-exact", "batched-fast")
OLD_PROBLEMS_PER_CALL = 8  # eval.run's --batch-size default before batching: problems per generation call


class PerProblemGenerator(HFGenerator):
    """The `transformers` engine of ``eval.run`` before batching across problems: each problem's k samples in a
    compact-decoding call of their own (k copies of one prompt: no padding), the growing cache with one entry per
    key/value head, the model's forward for every step, under ``torch.manual_seed`` of the problem's seed."""

    def generate(
        self,
        rows: Sequence[Mapping[str, Any]],
        k: int,
        seeds: Sequence[int] | None = None,
        progress: Progress | None = None,
    ) -> list[list[Completion]]:
        from adora_openrlhf.config import SamplingParams
        from adora_openrlhf.engine.decoding import compact_decode
        from adora_openrlhf.engine.kv_cache import growing_cache_for

        greedy = self.sampling.temperature == 0
        params = SamplingParams(
            temperature=1.0 if greedy else self.sampling.temperature,
            top_p=self.sampling.top_p,
            max_new_tokens=self.sampling.max_new_tokens,
        )
        prompts, _ = self._encode(rows)
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        out = []
        for prompt, seed in zip(prompts, seeds or [self.sampling.seed] * len(rows), strict=True):
            torch.manual_seed(seed)
            ids = torch.tensor([prompt] * k)
            cache = growing_cache_for(self.model)  # no batch size given: one entry per key/value head
            responses = compact_decode(
                self.model, ids, torch.ones_like(ids), params, eos, pad, cache, greedy=greedy, fast_step=False
            )
            out.append(
                [
                    Completion(self.tokenizer.decode(ids, skip_special_tokens=True), len(ids), truncated)
                    for ids, truncated in responses
                ]
            )
            if progress is not None:
                progress(k)
        return out


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The first run's results with the median wall and CPU seconds of all runs and their range; every run must
    have given the same responses (fixed seeds)."""
    if any(run["responses"] != runs[0]["responses"] for run in runs[1:]):
        raise RuntimeError("a repeated run gave other responses than the first: the seeds do not fix the samples")
    walls = [run["wall_s"] for run in runs]
    return {
        **runs[0],
        "wall_s": statistics.median(walls),
        "cpu_s": statistics.median(run["cpu_s"] for run in runs),
        "wall_s_min": min(walls),
        "wall_s_max": max(walls),
    }


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its finished child processes (batched-fast's decoding workers)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _generator(way: str, model: str, sampling: EvalSampling, batch_size: int):
    if way == "per-problem":
        return PerProblemGenerator(model, sampling, workers=1)
    return HFGenerator(model, sampling, batch_size=batch_size, numerics=way.removeprefix("batched-"))


def _time_way(
    way: str, model: str, bench, rows, k: int, sampling: EvalSampling, batch_size: int, out: Path
) -> dict[str, Any]:
    from adora_openrlhf.evaluation.loop import evaluate_benchmark, read_records

    generator = _generator(way, model, sampling, batch_size)
    samples = out / "runs" / f"{way}_t{sampling.temperature:g}_k{k}.jsonl"  # runs/: not committed (.gitignore)
    samples.parent.mkdir(parents=True, exist_ok=True)
    samples.unlink(missing_ok=True)
    per_call = OLD_PROBLEMS_PER_CALL if way == "per-problem" else max(1, batch_size // k)
    started, cpu_started = time.perf_counter(), _cpu_seconds()
    evaluate_benchmark(bench, rows, generator, k, samples, batch_problems=per_call, seed=sampling.seed)
    wall, cpu = time.perf_counter() - started, _cpu_seconds() - cpu_started
    records = read_records(samples)
    return {
        "workers": getattr(generator, "workers", 1),
        "wall_s": wall,
        "cpu_s": cpu,
        "avg_at_k": sum(r["correct"] for r in records) / len(records),
        "tokens_mean": sum(r["response_tokens"] for r in records) / len(records),
        "truncated": sum(r["truncated"] for r in records),
        "responses": {(r["problem_id"], r["sample_index"]): r["response"] for r in records},
    }


def _record_and_row(
    runs: dict[str, list], threads: int, mode: str, problems: int, k: int, temperature: float
) -> tuple[dict[str, Any], list[str]]:
    """results.json's record and table.md's row of one setting: each way's median run, speed-ups over per-problem,
    and (greedy) how many problems' responses are identical to per-problem's."""
    result = {way: _median_run(runs[way]) for way in WAYS}
    old = result["per-problem"]
    same = {
        way: sum(old["responses"][key] == text for key, text in result[way]["responses"].items()) for way in WAYS[1:]
    }
    record = {
        "threads": threads,
        "mode": mode,
        "problems": problems,
        "k": k,
        "temperature": temperature,
        **{f"{way}_{key}": value for way in WAYS for key, value in result[way].items() if key != "responses"},
        **{f"{way}_speedup": old["wall_s"] / result[way]["wall_s"] for way in WAYS[1:]},
        **{f"{way}_cpu_speedup": old["cpu_s"] / result[way]["cpu_s"] for way in WAYS[1:]},
        **{f"{way}_identical_responses": same[way] if mode == "greedy" else None for way in WAYS[1:]},
    }
    row = [
        str(threads),
        mode,
        f"{problems} x {k}",
        " / ".join(f"{result[way]['tokens_mean']:.0f}" for way in WAYS),
        " / ".join(f"{result[way]['wall_s']:.1f}" for way in WAYS),
        " / ".join(f"{record[f'{way}_speedup']:.1f}x" for way in WAYS[1:]),
        " / ".join(f"{result[way]['cpu_s']:.1f}" for way in WAYS),
        " / ".join(f"{record[f'{way}_cpu_speedup']:.1f}x" for way in WAYS[1:]),
        " / ".join(f"{result[way]['avg_at_k']:.3f}" for way in WAYS),
        "n/a (sampled)" if mode != "greedy" else " / ".join(f"{same[way]} of {problems}" for way in WAYS[1:]),
    ]
    return record, row


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.eval_speed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model directory, e.g. runs/kk-testbed/final_model")
    parser.add_argument("--bench", default="kk", help="one benchmark of eval.run")
    parser.add_argument(
        "--bench-file", default=None, help="its rows from a JSONL file (default: the benchmark's own rows)"
    )
    parser.add_argument("--limit", type=int, default=40, help="first N problems")
    parser.add_argument("--k", type=int, default=4, help="samples per problem in the sampled mode")
    parser.add_argument("--temperature", type=float, default=0.6, help="the sampled mode's temperature")
    parser.add_argument("--max-new-tokens", type=int, default=1024)
    parser.add_argument(
        "--batch-size", type=int, default=256, help="batched-fast's sequences per decoding batch (eval.run's default)"
    )
    parser.add_argument(
        "--exact-batch-size",
        type=int,
        default=128,
        help="batched-exact's (eval.run's default before the fast numerics)",
    )
    parser.add_argument("--threads", type=int, nargs="+", default=[1], help="torch threads; each value times both ways")
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="times each way is run per setting, interleaved; the table gives the median",
    )
    parser.add_argument("--out", default="bench/results/eval_speed")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats: must be >= 1, got {args.repeats}")

    from adora_openrlhf.evaluation.benchmarks import get_benchmark, load_located_rows

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bench = get_benchmark(args.bench)
    rows = [
        row
        for _, row in load_located_rows(bench, args.bench_file, None, 0, args.limit, cache_dir=out / "runs" / "data")
    ]
    table, records = [], []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for mode, k, temperature in (("sampled", args.k, args.temperature), ("greedy", 1, 0.0)):
            sampling = EvalSampling(temperature=temperature, max_new_tokens=args.max_new_tokens)
            sizes = {"per-problem": k, "batched-exact": args.exact_batch_size, "batched-fast": args.batch_size}
            runs = {way: [] for way in WAYS}
            for _ in range(args.repeats):  # interleaved, so a slow spell of the machine falls on every way
                for way in WAYS:
                    runs[way].append(_time_way(way, args.model, bench, rows, k, sampling, sizes[way], out))
            record, row = _record_and_row(runs, threads, mode, len(rows), k, temperature)
            records.append(record)
            table.append(row)
            print(table[-1], flush=True)
    ways, faster = " / ".join(WAYS), " / ".join(WAYS[1:])
    header = [
        "threads",
        "mode",
        "problems x samples",
        f"mean response tokens ({ways})",
        f"wall s ({ways})",
        f"speed-up ({faster})",
        f"CPU s ({ways})",
        f"CPU speed-up ({faster})",
        f"avg@k ({ways})",
        f"responses identical to per-problem ({faster})",
    ]
    intro = (
        f"`eval.run --engine hf` on {args.model}, --bench {args.bench} (first {len(rows)} problems), sampled at temperature "
        f"{args.temperature:g} with k = {args.k} and greedy with k = 1, --max-new-tokens {args.max_new_tokens}, torch threads {args.threads}; "
        f"per-problem: one decoding call per problem, {OLD_PROBLEMS_PER_CALL} problems per call of evaluate_benchmark, the model's forward "
        f"for every step; batched-exact: {args.exact_batch_size} sequences per decoding batch, numerics exact (bitwise the model's logits); "
        f"batched-fast: {args.batch_size} sequences per decoding batch, numerics fast, one decoding process per torch thread (eval.run's "
        "default). Wall and CPU seconds (worker processes included) of generation, grading and writing the samples; speed-ups over "
        f"per-problem. Median of {args.repeats} runs of each way, interleaved."
    )
    text = markdown_table(header, table)
    (out / "table.md").write_text(f"{intro}\n\n{text}\n")
    write_json(out / "results.json", {"settings": vars(args), "runs": records})
    print(f"\n{intro}\n\n{text}")
    identical = all(
        r[f"{way}_identical_responses"] == r["problems"] for r in records if r["mode"] == "greedy" for way in WAYS[1:]
    )
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
