"""Generation time of compact decoding against ``model.generate``, side by side, on a warmed-up testbed policy.

``python -m bench.decoding [--model DIR] [--recipe kk-testbed] [--seed 0] [--prompts 16] [--n 8] [--repeats 3]
[--threads 1] [--out DIR]``

What a rollout costs depends on how the response lengths of one batch spread: ``model.generate`` runs every
sequence until the longest ends, compact decoding (``model.decoding compact``, ``engine/decoding.py``)
drops finished sequences from the batch; ``compact-forward`` is compact decoding calling the model's forward for
every step, ``compact`` (what the trainer runs) takes the steps after the prefill through
``engine/decode_step.py``. So the benchmark times a real policy on the recipe's training
prompts: ``--model`` (a run's checkpoint directory, e.g. ``runs/kk-testbed/checkpoints/step_000020``), or
without it the recipe's warm start for ``--seed`` (built once under ``--out``, as the sample-efficiency
benchmark builds its own). ``--prompts`` x ``--n`` sequences in one batch, as one RL step generates them:
sampled at the recipe's temperature, and greedy (one response per prompt). The two loops alternate within
each repeat so that all see the same machine load. Prints the median wall and process-CPU seconds of each,
the ratios generate / compact and compact-forward / compact, the response lengths, whether the greedy tokens of
generate and compact were identical, and whether compact-forward and compact gave the same tokens (sampled too:
same seed, bitwise the same logits); writes
``table.md`` and ``results.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.common import warm_start_dir, write_table_report

LOOPS = ("generate", "compact-forward", "compact")
LOOP_SETTINGS = {  # generate_responses keyword arguments of each loop
    "generate": {"decoding": "generate"},
    "compact-forward": {"decoding": "compact", "fast_step": False},
    "compact": {"decoding": "compact"},
}


def time_mode(
    model, tokenizer, inputs: list[list[int]], cfg, batch: int, greedy: bool, mode: str, repeats: int
) -> dict[str, Any]:
    """Every loop of :data:`LOOPS` on ``inputs``, ``repeats`` times: median wall and CPU seconds, speed-ups, response
    lengths and whether the loops produced the same tokens."""
    from adora_openrlhf.engine.rollout import generate_responses

    seconds: dict[str, list[float]] = {loop: [] for loop in LOOPS}
    cpu_seconds: dict[str, list[float]] = {loop: [] for loop in LOOPS}
    tokens: dict[str, list] = {}
    for repeat in range(repeats):
        for loop in LOOPS:
            torch.manual_seed(repeat)
            started, cpu_started = time.perf_counter(), time.process_time()
            tokens[loop] = generate_responses(
                model,
                tokenizer,
                inputs,
                cfg.rollout,
                batch,
                greedy=greedy,
                kv_cache=cfg.model.kv_cache,
                **LOOP_SETTINGS[loop],
            )
            seconds[loop].append(time.perf_counter() - started)
            cpu_seconds[loop].append(time.process_time() - cpu_started)
    median = {loop: statistics.median(s) for loop, s in seconds.items()}
    cpu = {loop: statistics.median(s) for loop, s in cpu_seconds.items()}
    lengths = [len(ids) for ids, _ in tokens["compact"]]
    return {
        "mode": mode,
        "sequences": len(inputs),
        **{f"{loop}_s": median[loop] for loop in LOOPS},
        **{f"{loop}_cpu_s": cpu[loop] for loop in LOOPS},
        "speedup": median["generate"] / median["compact"],
        "cpu_speedup": cpu["generate"] / cpu["compact"],
        "step_speedup": median["compact-forward"] / median["compact"],
        "step_cpu_speedup": cpu["compact-forward"] / cpu["compact"],
        "length_mean": statistics.fmean(lengths),
        "length_max": max(lengths),
        "identical_tokens": tokens["generate"] == tokens["compact"] if greedy else None,
        "step_identical_tokens": tokens["compact-forward"] == tokens["compact"],
    }


def table_row(record: dict[str, Any]) -> list[str]:
    """One line of table.md for a :func:`time_mode` record."""
    same = record["identical_tokens"]
    row = [
        record["mode"],
        str(record["sequences"]),
        f"{record['length_mean']:.1f} / {record['length_max']}",
        f"{record['generate_s']:.2f}",
        f"{record['compact-forward_s']:.2f}",
        f"{record['compact_s']:.2f}",
        f"{record['speedup']:.2f}x",
        f"{record['cpu_speedup']:.2f}x",
        f"{record['step_speedup']:.2f}x",
        f"{record['step_cpu_speedup']:.2f}x",
        "n/a (sampled)" if same is None else ("yes" if same else "NO"),
        "yes" if record["step_identical_tokens"] else "NO",
    ]
    print(row, flush=True)
    return row


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.decoding", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default=None, help="a checkpoint directory of a run of --recipe (default: the recipe's warm start)"
    )
    parser.add_argument(
        "--recipe", default="kk-testbed", help="recipe whose prompts, sampling parameters and warm-up are used"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--prompts", type=int, default=16, help="training prompts per batch (the recipe's prompts_per_step)"
    )
    parser.add_argument("--n", type=int, default=8, help="sampled responses per prompt")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the benchmark runs use one each)")
    parser.add_argument("--out", default="bench/results/decoding")
    args = parser.parse_args(argv)

    from adora_openrlhf.engine.model import load_pretrained
    from adora_openrlhf.engine.tokenization import load_tokenizer
    from adora_openrlhf.prompt_templates import render_prompt
    from adora_openrlhf.recipes import build_run_config
    from adora_openrlhf.rows import load_run_rows

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    cfg = build_run_config(args.recipe, {"seed": args.seed})
    model_dir = args.model or warm_start_dir(args.recipe, args.seed, {}, out)
    tokenizer, model = load_tokenizer(model_dir), load_pretrained(model_dir).eval()
    train_rows, _ = load_run_rows(cfg.data, cfg.seed)
    texts = [render_prompt(r.prompt, tokenizer, cfg.data.prompt_template) for r in train_rows[: args.prompts]]
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    batch = len(prompts) * args.n

    records = [
        time_mode(model, tokenizer, [p for p in prompts for _ in range(copies)], cfg, batch, greedy, mode, args.repeats)
        for mode, greedy, copies in (("sampled", False, args.n), ("greedy", True, 1))
    ]
    rows = [table_row(r) for r in records]
    header = [
        "mode",
        "sequences",
        "response length mean / max",
        "generate s",
        "compact-forward s",
        "compact s",
        "speed-up (generate / compact)",
        "CPU speed-up",
        "step speed-up (compact-forward / compact)",
        "CPU step speed-up",
        "identical tokens (generate, compact)",
        "identical tokens (compact-forward, compact)",
    ]
    intro = (
        f"{args.recipe} policy {model_dir}, {len(prompts)} training prompts, one batch of {batch} sampled sequences and one of "
        f"{len(prompts)} greedy, {args.threads} torch thread(s), median of {args.repeats}."
    )
    payload = {"settings": vars(args), "model": str(model_dir), "runs": records}
    print(f"\n{write_table_report(out, intro, header, rows, payload)}")
    return 0 if all(r["identical_tokens"] is not False and r["step_identical_tokens"] for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
