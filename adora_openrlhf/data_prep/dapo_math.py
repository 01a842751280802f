"""DAPO-Math-17k -> the JSONL schema.

Input rows (``BytedTsinghua-SIA/DAPO-Math-17k``, verl parquet layout): ``prompt`` (chat messages whose
user turn already asks for a final ``Answer: $Answer`` line), ``reward_model.ground_truth`` (an integer
answer as text), ``data_source``, ``ability``, ``extra_info.index``. The public file repeats every prompt
many times; duplicates (same prompt) are dropped.

Output rows: ``{"prompt": messages, "label": ground_truth, "source": "dapo_math",
"meta": {"reward_style": "dapo", "index": ...}}``; the reward is DAPO's +1/-1 on the last "Answer:" line
(:mod:`adora_openrlhf.rewards.math`).

CLI::

    python -m data_prep.dapo_math --out data/dapo [--dataset BytedTsinghua-SIA/DAPO-Math-17k] [--split train]
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from adora_openrlhf.cli_errors import OneLineParser, add_debug_flag, check_output_dir, command_name, run_cli
from adora_openrlhf.data_prep.common import (
    RowError,
    answer_text,
    convert_rows,
    load_numbered,
    prompt_key,
    write_converted,
)

SOURCE = "dapo_math"
DEFAULT_DATASET = "BytedTsinghua-SIA/DAPO-Math-17k"


def _prompt(raw: Mapping[str, Any], number: int) -> list[dict[str, str]]:
    prompt = raw.get("prompt")
    if isinstance(prompt, str) and prompt.strip():
        return [{"role": "user", "content": prompt.strip()}]
    if not isinstance(prompt, list) or not prompt:
        raise RowError(f"row {number}: field 'prompt': expected chat messages or text, got {type(prompt).__name__}")
    messages = []
    for k, message in enumerate(prompt):
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), str) or not message.get("role"):
            raise RowError(f"row {number}: field 'prompt[{k}]': expected {{'role': ..., 'content': text}}")
        messages.append({"role": str(message["role"]), "content": message["content"]})
    if not any(m["content"].strip() for m in messages if m["role"] == "user"):
        raise RowError(f"row {number}: field 'prompt': no non-empty user message")
    return messages


def convert_dapo_row(raw: Mapping[str, Any], number: int, reward_style: str = "dapo") -> dict[str, Any]:
    """One DAPO-Math row -> one schema row; RowError naming the row and field when malformed."""
    if not isinstance(raw, Mapping):
        raise RowError(f"row {number}: expected a record, got {type(raw).__name__}")
    messages = _prompt(raw, number)
    reward_model = raw.get("reward_model")
    truth = reward_model.get("ground_truth") if isinstance(reward_model, Mapping) else raw.get("answer")
    try:
        label = answer_text(truth)
    except TypeError as err:
        raise RowError(f"row {number}: field 'reward_model.ground_truth': {err}") from None
    if not label:
        raise RowError(f"row {number}: field 'reward_model.ground_truth': missing or empty")
    extra = raw.get("extra_info") if isinstance(raw.get("extra_info"), Mapping) else {}
    meta: dict[str, Any] = {"reward_style": reward_style}
    if extra.get("index") is not None:
        meta["index"] = str(extra["index"])
    if raw.get("data_source"):
        meta["data_source"] = str(raw["data_source"])
    return {"prompt": messages, "label": label, "source": SOURCE, "meta": meta}


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(
        prog=command_name("python -m data_prep.dapo_math"), description="DAPO-Math-17k -> JSONL schema"
    )
    parser.add_argument("--out", required=True, help="output folder; writes <split>.jsonl")
    parser.add_argument("--dataset", default=DEFAULT_DATASET, help="hub name, local folder, or .parquet/.jsonl file")
    parser.add_argument("--split", default="train")
    parser.add_argument(
        "--reward-style",
        default="dapo",
        choices=["dapo", "math_verify"],
        help="dapo: last 'Answer:' line, +1/-1; math_verify: boxed/last expression, 1/0",
    )
    parser.add_argument("--max-rows", type=int, default=None, help="keep at most this many (after de-duplication)")
    parser.add_argument("--keep-duplicates", action="store_true", help="keep repeated prompts")
    add_debug_flag(parser)

    def body() -> int:
        args = parser.parse_args(argv)
        if args.max_rows is not None and args.max_rows < 1:
            raise ValueError(f"--max-rows: must be >= 1, got {args.max_rows}")
        check_output_dir(args.out, "--out")
        numbered = load_numbered(args.dataset, args.split)
        rows, report = convert_rows(
            numbered.rows,
            lambda r, n: convert_dapo_row(r, n, args.reward_style),
            "DAPO-Math",
            dedup_key=None if args.keep_duplicates else prompt_key,
            numbered=numbered,
        )
        if args.max_rows is not None:
            rows = rows[: args.max_rows]
        write_converted(rows, report, SOURCE, Path(args.out) / f"{args.split}.jsonl")
        return 0

    return run_cli(body, argv, interrupted_hint="the output file was not written; run the command again")


if __name__ == "__main__":
    sys.exit(main())
