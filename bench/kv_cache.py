"""Generation time with the growing KV cache against transformers' DynamicCache, side by side.

``python -m bench.kv_cache [--batch 128] [--new-tokens 64 192 512] [--repeats 3] [--threads 1] [--out DIR]``

The local backend's ``generate_responses`` on a random-init model of the kk-testbed recipe's shape (a random
model rarely emits eos, so every response runs to ``max_new_tokens``; prompts are K&K-length, left-padded),
greedy, the two caches alternating within each repeat so that both see the same machine load. Prints per
response length the median wall and process-CPU seconds of each cache, the ratios dynamic / growing
(speed-up; the CPU ratio is the one to read on a machine shared with other jobs) and whether the tokens
were identical; writes ``table.md`` and ``results.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from bench.common import random_kk_inputs, write_table_report

CACHES = ("dynamic", "growing")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.kv_cache", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--batch", type=int, default=128, help="sequences per generate call (the kk-testbed generation_batch_size)"
    )
    parser.add_argument("--prompt-tokens", type=int, default=90, help="prompt length in tokens")
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[64, 192, 512], help="response lengths to time")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the benchmark runs use one each)")
    parser.add_argument("--out", default="bench/results/kv_cache")
    return parser


def _measure(model, tokenizer, prompts: list, args: argparse.Namespace, new_tokens: int) -> tuple[list[str], dict]:
    """(table row, record) of one response length: both caches timed ``args.repeats`` times, interleaved."""
    from adora_openrlhf.config import SamplingParams
    from adora_openrlhf.engine.rollout import generate_responses

    params = SamplingParams(max_new_tokens=new_tokens)
    seconds: dict[str, list[float]] = {c: [] for c in CACHES}
    cpu_seconds: dict[str, list[float]] = {c: [] for c in CACHES}  # process CPU time: less sensitive to other jobs
    tokens: dict[str, list] = {}
    for _ in range(args.repeats):
        for cache in CACHES:
            started, cpu_started = time.perf_counter(), time.process_time()
            tokens[cache] = generate_responses(
                model, tokenizer, prompts, params, args.batch, greedy=True, kv_cache=cache, decoding="generate"
            )
            seconds[cache].append(time.perf_counter() - started)
            cpu_seconds[cache].append(time.process_time() - cpu_started)
    median = {c: statistics.median(s) for c, s in seconds.items()}
    cpu = {c: statistics.median(s) for c, s in cpu_seconds.items()}
    same = tokens["dynamic"] == tokens["growing"]
    speedup, cpu_speedup = median["dynamic"] / median["growing"], cpu["dynamic"] / cpu["growing"]
    seconds_cells = [f"{v:.2f}" for v in (median["dynamic"], median["growing"])]
    cpu_cells = [f"{v:.2f}" for v in (cpu["dynamic"], cpu["growing"])]
    row = [
        str(new_tokens),
        *seconds_cells,
        f"{speedup:.2f}x",
        *cpu_cells,
        f"{cpu_speedup:.2f}x",
        "yes" if same else "NO",
    ]
    print(row, flush=True)
    record = {
        "new_tokens": new_tokens,
        "dynamic_s": median["dynamic"],
        "growing_s": median["growing"],
        "speedup": speedup,
        "dynamic_cpu_s": cpu["dynamic"],
        "growing_cpu_s": cpu["growing"],
        "cpu_speedup": cpu_speedup,
        "identical_tokens": same,
    }
    return row, record


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)

    from adora_openrlhf.engine.model import build_tiny_model

    torch.set_num_threads(args.threads)
    cfg, tokenizer, prompts, _ = random_kk_inputs(args.batch, args.prompt_tokens)
    model = build_tiny_model(cfg.model.tiny, tokenizer, seed=0).eval()

    rows, records = [], []
    for new_tokens in args.new_tokens:
        row, record = _measure(model, tokenizer, prompts, args, new_tokens)
        rows.append(row)
        records.append(record)

    header = [
        "new tokens",
        "dynamic s",
        "growing s",
        "speed-up",
        "dynamic CPU s",
        "growing CPU s",
        "CPU speed-up",
        "identical tokens",
    ]
    intro = (
        f"{args.batch} sequences of ~{args.prompt_tokens} prompt tokens, kk-testbed model shape, greedy, "
        f"{args.threads} torch thread(s), median of {args.repeats}."
    )
    text = write_table_report(Path(args.out), intro, header, rows, {"settings": vars(args), "runs": records})
    print(f"\n{text}")
    return 0 if all(r["identical_tokens"] for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
