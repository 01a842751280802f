"""What a smaller tiny model saves: decoding and policy-update time of several model shapes, side by side.

``python -m bench.model_size [--shapes 128x384x4 96x288x4 64x192x4] [--batch 128] [--prompt-tokens 120]
[--new-tokens 200] [--update-tokens 400] [--repeats 3] [--threads 1] [--numerics fast] [--out DIR]``

A shape is ``HIDDENxINTERMEDIATExLAYERS`` of the tiny Qwen2-style model (``model.tiny.hidden_size``,
``intermediate_size``, ``num_hidden_layers``; heads as the recipe has them); the first one is the reference, the
kk-testbed recipe's by default. Per shape, a random-init model of the recipe's vocabulary:

- **decode**: the trainer's ``engine.rollout.generate_responses`` (compact decoding, ``--numerics``), greedy, ``--batch``
  K&K-length prompts, ``--new-tokens`` each (a random model rarely emits eos, so every response runs to the limit):
  a rollout's or a held-out evaluation's cost per generated token;
- **update**: one policy-gradient pass of an optimiser step's sequences (four micro-batches of the recipe's
  ``train.micro_batch_size``, each sequence ``--update-tokens`` long with ``--prompt-tokens`` of prompt): the
  response tokens' log-probs, forward and backward; the update's cost per trained token.

The shapes alternate within each repeat, so all see the same machine load. Prints the median process-CPU
seconds of each phase per shape and the ratio to the reference shape; writes ``table.md`` and ``results.json`` to
``--out``. The ratios bound what a smaller model saves on the allocation benchmark's runs: their decoding
(rollouts and evaluation) and updates shrink so, their grading, batching and bookkeeping do not (whole runs are
measured in ``docs/results.md``); whether a smaller model still learns the regime is answered by training it
(``--model.tiny.hidden_size`` etc. on ``adora_openrlhf.train``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from bench.common import random_kk_inputs, write_table_report

PHASES = ("decode", "update")
UPDATE_MICRO_BATCHES = 4  # kk-testbed: 16 sequences per optimiser step in micro-batches of 4


def parse_shape(text: str) -> tuple[int, int, int]:
    """``"128x384x4"`` -> (hidden_size, intermediate_size, num_hidden_layers); a malformed shape is an argparse error."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(
            f"--shapes: {text!r} is not HIDDENxINTERMEDIATExLAYERS with positive integers, e.g. 96x288x4"
        )
    hidden, intermediate, layers = (int(p) for p in parts)
    return hidden, intermediate, layers


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.model_size", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shapes",
        type=parse_shape,
        nargs="+",
        default=[(128, 384, 4), (96, 288, 4), (64, 192, 4), (128, 384, 2)],
        help="HIDDENxINTERMEDIATExLAYERS; the first is the reference (default: the kk-testbed recipe's, 128x384x4)",
    )
    parser.add_argument(
        "--batch", type=int, default=128, help="sequences per decoding batch (model.generation_batch_size)"
    )
    parser.add_argument("--prompt-tokens", type=int, default=120, help="prompt length in tokens")
    parser.add_argument("--new-tokens", type=int, default=200, help="generated tokens per sequence")
    parser.add_argument(
        "--update-tokens", type=int, default=400, help="tokens per trained sequence, its prompt included"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the benchmark runs use one each)")
    parser.add_argument("--numerics", choices=("exact", "fast"), default="fast", help="model.numerics of the decoding")
    parser.add_argument("--out", default="bench/results/model_size")
    return parser


def _time_decode(model, tokenizer, prompts: list[list[int]], args: argparse.Namespace) -> float:
    from adora_openrlhf.config import SamplingParams
    from adora_openrlhf.engine.rollout import generate_responses

    params = SamplingParams(max_new_tokens=args.new_tokens)
    started = time.process_time()
    generate_responses(model, tokenizer, prompts, params, args.batch, greedy=True, numerics=args.numerics)
    return time.process_time() - started


def _time_update(model, batches: Sequence[torch.Tensor], prompt_tokens: int) -> float:
    """CPU seconds of one policy-gradient pass over ``batches`` ([micro, L] token ids): the sum of the response
    tokens' log-probs ``log p(x_{t+1} | x_{<=t})``, t >= prompt_tokens - 1, through the forward pass and backward."""
    model.train()
    started = time.process_time()
    for ids in batches:
        log_probs = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[:, :-1].float(), dim=-1)
        targets = log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
        targets[:, prompt_tokens - 1 :].sum().backward()
    model.zero_grad(set_to_none=True)
    model.eval()
    return time.process_time() - started


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.update_tokens <= args.prompt_tokens:
        parser.error(
            f"--update-tokens: {args.update_tokens} leaves no response after --prompt-tokens {args.prompt_tokens}"
        )

    from adora_openrlhf.engine.model import build_tiny_model, count_parameters

    torch.set_num_threads(args.threads)
    cfg, tokenizer, prompts, draw = random_kk_inputs(args.batch, args.prompt_tokens)
    micro = cfg.train.micro_batch_size
    # prompt + response sequences of update_tokens; the loss is on the response tokens
    batches = [draw(micro, args.update_tokens) for _ in range(UPDATE_MICRO_BATCHES)]
    models = {}
    for hidden, intermediate, layers in args.shapes:
        tiny = replace(cfg.model.tiny, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers)
        models[f"{hidden}x{intermediate}x{layers}"] = build_tiny_model(tiny, tokenizer, seed=0).eval()

    seconds: dict[str, dict[str, list[float]]] = {name: {p: [] for p in PHASES} for name in models}
    for _ in range(args.repeats):
        for name, model in models.items():
            seconds[name]["decode"].append(_time_decode(model, tokenizer, prompts, args))
            seconds[name]["update"].append(_time_update(model, batches, args.prompt_tokens))
    median = {name: {p: statistics.median(s) for p, s in phases.items()} for name, phases in seconds.items()}
    reference = next(iter(models))
    rows, records = [], []
    for name, model in models.items():
        ratios = {p: median[name][p] / median[reference][p] for p in PHASES}
        params = count_parameters(model)[0]
        rows.append(
            [
                name,
                f"{params / 1e6:.2f}M",
                f"{median[name]['decode']:.2f}",
                f"{ratios['decode']:.2f}x",
                f"{median[name]['update']:.2f}",
                f"{ratios['update']:.2f}x",
            ]
        )
        records.append(
            {"shape": name, "parameters": params, **{f"{p}_cpu_s": median[name][p] for p in PHASES},
             **{f"{p}_ratio": ratios[p] for p in PHASES}}
        )  # fmt: skip
    header = ["shape (hidden x intermediate x layers)", "parameters", "decode CPU s", "ratio", "update CPU s", "ratio"]
    intro = (
        f"decode: {args.batch} sequences of ~{args.prompt_tokens} prompt tokens, {args.new_tokens} generated each, "
        f"greedy, {args.numerics} numerics; update: {UPDATE_MICRO_BATCHES} micro-batches of {micro} x "
        f"{args.update_tokens} tokens, forward and backward; {args.threads} torch thread(s), median process-CPU "
        f"seconds of {args.repeats}; ratios to {reference}."
    )
    settings = {**vars(args), "shapes": [list(s) for s in args.shapes]}
    print(write_table_report(Path(args.out), intro, header, rows, {"settings": settings, "shapes": records}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
