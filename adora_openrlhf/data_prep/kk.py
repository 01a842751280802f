"""``python -m data_prep.kk``: K&K rows as JSONL files, generated (``adora_openrlhf.tasks.kk``) or converted from the
public K&K files (fields quiz, names, solution, solution_text_format, statements).

CLI::

    python -m data_prep.kk --out data/kk --num-train 2000 --num-eval 100 --people 3-7 --seed 0
    python -m data_prep.kk --out data/kk --from-jsonl train.jsonl [--eval-jsonl test.jsonl]
"""

from __future__ import annotations

import argparse
import ast
import logging
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from adora_openrlhf.data_prep.common import RowError
from adora_openrlhf.datafiles import write_jsonl
from adora_openrlhf.tasks.kk import (
    MAX_PEOPLE,
    MIN_PEOPLE,
    Statement,
    generate_splits,
    make_row,
    solve,
    split_disjoint,
    to_tuple,
)

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------------------
# Converter for the public K&K files (fields quiz, names, solution, solution_text_format, statements, ...)
# ----------------------------------------------------------------------------------------------------------


def _parse_statements(value: Any, num_people: int, where: str) -> tuple[Statement, ...]:
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError) as err:
            raise RowError(f"{where} field 'statements': not a Python tuple literal ({err})") from None

    statements = to_tuple(value)
    if not isinstance(statements, tuple) or len(statements) != num_people:
        raise RowError(f"{where} field 'statements': expected one statement per name ({num_people})")
    return statements


def convert_public_row(raw: Any, row_number: int) -> dict[str, Any]:
    """One public K&K row -> one schema row; raises :class:`RowError` naming the row and field when malformed.

    Checks: ``quiz`` is a non-empty string; ``names`` a list of distinct non-empty strings; ``solution`` a
    list of booleans, one per name; ``solution_text_format`` (when present) agrees with ``solution``;
    ``statements`` (when present) are satisfied by ``solution`` and by no other assignment.
    """
    where = f"row {row_number}:"
    if not isinstance(raw, dict):
        raise RowError(f"{where} expected a JSON object, got {type(raw).__name__}")
    quiz = raw.get("quiz")
    if not isinstance(quiz, str) or not quiz.strip():
        raise RowError(f"{where} field 'quiz': missing or empty (expected the puzzle text)")
    names = raw.get("names")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n.strip() for n in names):
        raise RowError(f"{where} field 'names': expected a non-empty list of names, got {names!r}")
    if len(set(names)) != len(names):
        raise RowError(f"{where} field 'names': names must be distinct, got {names!r}")
    solution = raw.get("solution")
    if not isinstance(solution, list) or len(solution) != len(names) or not all(isinstance(s, bool) for s in solution):
        raise RowError(
            f"{where} field 'solution': expected a list of {len(names)} booleans (true = knight), got {solution!r}"
        )
    text_format = raw.get("solution_text_format")
    if text_format is not None:
        from adora_openrlhf.rewards.kk import parse_kk_answer

        parsed = parse_kk_answer(text_format, names) if isinstance(text_format, str) else None
        if parsed is None or [parsed[n] for n in names] != solution:
            raise RowError(f"{where} field 'solution_text_format': does not state the roles given by 'solution'")
    statements = None
    if raw.get("statements") is not None:
        statements = _parse_statements(raw["statements"], len(names), where)
        try:
            solutions = solve(statements, len(names))
        except (ValueError, IndexError, TypeError) as err:
            raise RowError(f"{where} field 'statements': cannot be evaluated ({err})") from None
        if solutions != [tuple(solution)]:
            raise RowError(
                f"{where} field 'statements': consistent assignments are {solutions}, expected only {tuple(solution)}"
            )
    return make_row(quiz.strip(), names, solution, statements)


def convert_public_rows(
    raw_rows: Iterable[Any], progress: bool = False, numbers: Sequence[int] | None = None, where: str | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Convert every row; malformed ones are skipped and their messages returned. Rows are numbered by
    ``numbers`` (their 1-based file lines) or from 1; with ``where`` (the file) messages read ``FILE:LINE: ...``."""
    from tqdm.auto import tqdm

    from adora_openrlhf.data_prep.common import locate

    rows, rejected = [], []
    counter = numbers if numbers is not None else range(1, 1 << 62)
    # the counter outlasts the rows
    numbered = zip(counter, tqdm(raw_rows, desc="K&K rows", unit="row", disable=not progress), strict=False)
    for number, raw in numbered:
        try:
            rows.append(convert_public_row(raw, number))
        except RowError as err:
            rejected.append(locate(str(err), where, number))
    return rows, rejected


def convert_file(path: str | Path, progress: bool = False) -> tuple[list[dict[str, Any]], list[str]]:
    """Convert a public K&K ``.jsonl`` file (or ``.json`` list / ``.parquet``) into schema rows; returns (rows,
    ``FILE:LINE: reason`` of each skipped line or row). A missing, empty or unreadable file raises."""
    from adora_openrlhf.datafiles import read_rows_lenient

    pairs, bad = read_rows_lenient(path, "K&K file")
    rows, rejected = convert_public_rows([r for _, r in pairs], progress, [n for n, _ in pairs], str(path))
    return rows, sorted(bad + rejected, key=_line_of)


def _line_of(message: str) -> int:
    match = re.match(r"^.*?:(\d+): ", message)
    return int(match.group(1)) if match else 0


# ----------------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------------


def parse_people(spec: str) -> list[int]:
    """``"3-7"`` -> [3, 4, 5, 6, 7]; ``"2,3,5"`` -> [2, 3, 5]; each count must be in 2..8."""
    try:
        if "-" in spec:
            low, high = (int(x) for x in spec.split("-", 1))
            counts = list(range(low, high + 1))
        else:
            counts = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--people: expected a range like 3-7 or a list like 2,3,5, got {spec!r}") from None
    if not counts or not all(MIN_PEOPLE <= k <= MAX_PEOPLE for k in counts):
        raise ValueError(f"--people: counts must be in {MIN_PEOPLE}..{MAX_PEOPLE}, got {spec!r}")
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    from adora_openrlhf.cli_errors import OneLineParser, add_debug_flag, command_name, run_cli

    parser = OneLineParser(prog=command_name("python -m data_prep.kk"), description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder for train.jsonl and test.jsonl")
    parser.add_argument("--num-train", type=int, default=2000, help="generated training puzzles")
    parser.add_argument("--num-eval", type=int, default=100, help="generated held-out puzzles")
    parser.add_argument("--people", default="3-7", help="people per puzzle: a range 3-7 or a list 2,3,5 (2..8)")
    parser.add_argument("--eval-people", default=None, help="people per eval puzzle (default: --people)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--from-jsonl", default=None, help="convert this public K&K file into train.jsonl instead of generating"
    )
    parser.add_argument(
        "--eval-jsonl", default=None, help="with --from-jsonl: convert this public file into test.jsonl"
    )
    add_debug_flag(parser)
    return run_cli(
        lambda: _main(parser.parse_args(argv)),
        argv,
        interrupted_hint="no output file was written; run the command again",
    )


def _main(args: argparse.Namespace) -> int:
    from adora_openrlhf.cli_errors import check_output_dir

    out = Path(args.out)
    check_output_dir(out, "--out")
    if args.eval_jsonl and not args.from_jsonl:
        raise ValueError("--eval-jsonl: needs --from-jsonl (the generator makes its own held-out puzzles)")
    if not args.from_jsonl:
        if args.num_train < 1:
            raise ValueError(f"--num-train: must be >= 1, got {args.num_train}")
        if args.num_eval < 0:
            raise ValueError(f"--num-eval: must be >= 0, got {args.num_eval}")
        people = parse_people(args.people)
        eval_people = parse_people(args.eval_people) if args.eval_people else people
        train, evals = generate_splits(args.num_train, args.num_eval, people, args.seed, eval_people, progress=True)
        n_train = write_jsonl(train, out / "train.jsonl")
        n_eval = write_jsonl(evals, out / "test.jsonl")
        logger.info(
            f"kk: wrote {n_train} train and {n_eval} test rows to {out} (people {people}, seed {args.seed}); rejected 0 rows; train and test share no quiz"
        )
        return 0
    train, rejected = convert_file(args.from_jsonl, progress=True)
    evals: list[dict[str, Any]] = []
    if args.eval_jsonl:
        evals, eval_rejected = convert_file(args.eval_jsonl, progress=True)
        rejected += eval_rejected
    train, evals, dropped = split_disjoint(train, evals)
    for message in rejected[:20]:
        logger.warning("rejected %s", message)
    if not train or (args.eval_jsonl and not evals):
        empty = args.from_jsonl if not train else args.eval_jsonl
        raise ValueError(
            f"{empty}: no usable K&K rows ({len(rejected)} rejected, {dropped} duplicate or train/test-overlapping); nothing was written"
        )
    n_train = write_jsonl(train, out / "train.jsonl")
    n_eval = write_jsonl(evals, out / "test.jsonl") if args.eval_jsonl else 0
    logger.info(
        f"kk: wrote {n_train} train and {n_eval} test rows to {out}; rejected {len(rejected)} malformed rows; "
        f"dropped {dropped} duplicate or train/test-overlapping rows"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
