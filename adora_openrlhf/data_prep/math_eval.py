"""Math evaluation sets (MATH500, AIME 2024, AIME 2025, AMC23) -> the JSONL schema.

Each benchmark names its default hub dataset and split; any dataset with a question field (``problem``,
``question``, ``Problem``...) and an answer field (``answer``, ``Answer``..., or a ``solution`` whose last
``\\boxed{}`` holds the answer) converts, so local copies and mirrors work too.

Output rows: ``{"prompt": [user message asking for \\boxed{}], "label": answer, "source": benchmark,
"meta": {"reward_style": "math_verify", "id", "level", "subject", ...}}``.

CLI::

    python -m data_prep.math_eval --benchmark aime24 --out data/eval [--dataset math-ai/aime24] [--split test]
    python -m data_prep.math_eval --benchmark all --out data/eval
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adora_openrlhf.cli_errors import OneLineParser, add_debug_flag, check_output_dir, command_name, run_cli
from adora_openrlhf.data_prep.common import (
    RowError,
    answer_text,
    convert_rows,
    first_field,
    last_boxed,
    load_numbered,
    require_text,
    write_converted,
)

BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
QUESTION_FIELDS = ("problem", "question", "Problem", "Question")
ANSWER_FIELDS = ("answer", "Answer", "final_answer", "ground_truth")
SOLUTION_FIELDS = ("solution", "Solution")
META_FIELDS = ("id", "ID", "unique_id", "level", "subject", "url", "year")


@dataclass(frozen=True)
class Benchmark:
    source: str  # the row's source (selects the reward)
    dataset: str  # default hub dataset
    split: str  # default split


BENCHMARKS: dict[str, Benchmark] = {
    "math500": Benchmark("math500", "HuggingFaceH4/MATH-500", "test"),
    "aime24": Benchmark("aime24", "math-ai/aime24", "test"),
    "aime25": Benchmark("aime25", "math-ai/aime25", "test"),
    "amc23": Benchmark("amc23", "math-ai/amc23", "test"),
}


def build_math_prompt(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{question}\n{BOXED_INSTRUCTION}"}]


def convert_math_row(raw: Mapping[str, Any], number: int, source: str) -> dict[str, Any]:
    """One benchmark row -> one schema row; RowError naming the row and field when malformed."""
    if not isinstance(raw, Mapping):
        raise RowError(f"row {number}: expected a record, got {type(raw).__name__}")
    question = require_text(raw, QUESTION_FIELDS, number)
    name, value = first_field(raw, ANSWER_FIELDS)
    if name is not None:
        if isinstance(value, list) and value:  # some mirrors store a list of accepted answers
            value = value[0]
        try:
            label = answer_text(value)
        except TypeError as err:
            raise RowError(f"row {number}: field {name!r}: {err}") from None
    else:
        sol_name, solution = first_field(raw, SOLUTION_FIELDS)
        label = last_boxed(solution) if isinstance(solution, str) else None
        if not label:
            raise RowError(f"row {number}: field 'answer': missing, and no \\boxed{{}} answer in a 'solution' field")
    if not label:
        raise RowError(f"row {number}: field {name!r}: empty answer")
    meta: dict[str, Any] = {"reward_style": "math_verify"}
    for key in META_FIELDS:
        if raw.get(key) is not None:
            meta[key.lower()] = raw[key] if isinstance(raw[key], (int, float, str)) else str(raw[key])
    return {"prompt": build_math_prompt(question), "label": label, "source": source, "meta": meta}


def convert_benchmark(name: str, out_dir: Path, dataset: str | None = None, split: str | None = None) -> int:
    bench = BENCHMARKS[name]
    numbered = load_numbered(dataset or bench.dataset, split or bench.split)
    rows, report = convert_rows(
        numbered.rows, lambda r, n: convert_math_row(r, n, bench.source), name, numbered=numbered
    )
    return write_converted(rows, report, name, out_dir / f"{name}.jsonl")


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(
        prog=command_name("python -m data_prep.math_eval"), description="math eval sets -> JSONL schema"
    )
    parser.add_argument("--out", required=True, help="output folder; writes <benchmark>.jsonl")
    parser.add_argument("--benchmark", default="all", choices=[*BENCHMARKS, "all"])
    parser.add_argument("--dataset", default=None, help="hub name, local folder or file (default: the benchmark's)")
    parser.add_argument("--split", default=None, help="split to read (default: the benchmark's)")
    add_debug_flag(parser)

    def body() -> int:
        args = parser.parse_args(argv)
        names = list(BENCHMARKS) if args.benchmark == "all" else [args.benchmark]
        if args.dataset and len(names) > 1:
            raise ValueError("--dataset: give --benchmark too when converting a specific dataset")
        check_output_dir(args.out, "--out")
        for name in names:
            convert_benchmark(name, Path(args.out), args.dataset, args.split)
        return 0

    return run_cli(
        body,
        argv,
        interrupted_hint="files already reported as written are complete; run the command again for the rest",
    )


if __name__ == "__main__":
    sys.exit(main())
