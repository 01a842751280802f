"""K&K generator, rows, splits, converter and CLI."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adora_openrlhf.data_prep import kk as kk_files
from adora_openrlhf.rewards.kk import parse_kk_answer
from adora_openrlhf.tasks import kk


def _to_python(statement) -> str:
    """An independent translation of a statement into a Python boolean expression over x[0..n-1]."""
    op = statement[0]
    if op == "telling-truth":
        return f"x[{statement[1]}]"
    if op == "lying":
        return f"(not x[{statement[1]}])"
    if op == "not":
        return f"(not {_to_python(statement[1])})"
    if op in ("and", "or"):
        return "(" + f" {op} ".join(_to_python(s) for s in statement[1:]) + ")"
    if op == "->":
        return f"((not {_to_python(statement[1])}) or {_to_python(statement[2])})"
    if op == "<=>":
        return f"({_to_python(statement[1])} == {_to_python(statement[2])})"
    raise AssertionError(op)


def _brute_force(statements, n):
    exprs = [compile(_to_python(s), "<stmt>", "eval") for s in statements]
    return [
        x for x in itertools.product([False, True], repeat=n) if all(x[i] == eval(exprs[i], {"x": x}) for i in range(n))
    ]


@pytest.mark.parametrize("num_people", range(2, 9))
def test_generated_puzzles_have_exactly_one_solution(num_people):
    for seed in range(12):
        puzzle = kk.generate_puzzle(num_people, random.Random(seed * 31 + num_people))
        solutions = _brute_force(puzzle.statements, num_people)
        assert solutions == [puzzle.solution]
        assert len(puzzle.names) == len(set(puzzle.names)) == num_people
        for name in puzzle.names:
            assert name in puzzle.quiz

        # statements are about others only
        def targets(s):
            return [s[1]] if s[0] in ("telling-truth", "lying") else [t for sub in s[1:] for t in targets(sub)]

        for speaker, statement in enumerate(puzzle.statements):
            assert speaker not in targets(statement)


def test_solve_hand_case():
    # A says "B is a knave"; B says "A and B are both knights"... only about others: B says "A is a knave".
    # x = (A, B): A true <=> not B; B true <=> not A. Two solutions (T, F) and (F, T).
    statements = (("lying", 1), ("lying", 0))
    assert sorted(kk.solve(statements, 2)) == [(False, True), (True, False)]
    # A says "B is a knight"; B says "A is a knave" -> A=B and B=not A: no solution.
    assert kk.solve((("telling-truth", 1), ("lying", 0)), 2) == []
    # A says "B is a knave or B is a knight" (always true) -> A knight; B says "A is a knight" -> B knight.
    assert kk.solve((("or", ("lying", 1), ("telling-truth", 1)), ("telling-truth", 0)), 2) == [(True, True)]


def test_solution_text_and_row_schema():
    puzzle = kk.generate_puzzle(3, random.Random(5))
    lines = puzzle.solution_text.split("\n")
    assert len(lines) == 3
    for k, (line, name, role) in enumerate(zip(lines, puzzle.names, puzzle.solution, strict=True), 1):
        assert line == f"({k}) {name} is a {'knight' if role else 'knave'}"
    row = kk.kk_row(puzzle)
    assert set(row) == {"prompt", "label", "source", "meta"}
    assert row["source"] == "kk" and row["label"] == puzzle.solution_text
    assert row["meta"] == {
        "num_people": 3,
        "names": list(puzzle.names),
        "solution": list(puzzle.solution),
        "statements": kk.statements_to_json(puzzle.statements),
    }
    assert row["prompt"][0]["role"] == "system" and "<think>" in row["prompt"][0]["content"]
    assert "<answer>" in row["prompt"][0]["content"]
    assert row["prompt"][1] == {"role": "user", "content": puzzle.quiz}
    json.dumps(row)  # serialisable


def test_quiz_is_compact():
    puzzle = kk.generate_puzzle(8, random.Random(0))
    assert len(puzzle.quiz) < 900  # well under the tiny model's 1k-token context


def test_generate_rows_deterministic_and_cycles_people():
    a = kk.generate_rows(12, [2, 3, 4], seed=7)
    b = kk.generate_rows(12, [2, 3, 4], seed=7)
    c = kk.generate_rows(12, [2, 3, 4], seed=8)
    assert a == b and a != c
    assert [r["meta"]["num_people"] for r in a] == [2, 3, 4] * 4
    assert len({kk.row_quiz(r) for r in a}) == 12


def test_generate_splits_disjoint():
    train, evals = kk.generate_splits(60, 20, [2, 3], seed=0)
    assert len(train) == 60 and len(evals) == 20
    assert not {kk.row_quiz(r) for r in train} & {kk.row_quiz(r) for r in evals}


def test_split_disjoint_drops_overlap_and_duplicates():
    rows = kk.generate_rows(5, [3], seed=1)
    train, evals, dropped = kk.split_disjoint(rows + rows[:1], rows[3:])
    assert [kk.row_quiz(r) for r in train] == [kk.row_quiz(r) for r in rows[:3]]
    assert len(evals) == 2 and dropped == 1 + 2


def _public_row(puzzle):
    return {
        "quiz": puzzle.quiz,
        "names": list(puzzle.names),
        "knight_knave": {"knight": "knight", "knave": "knave"},
        "solution": list(puzzle.solution),
        "solution_text": ", ".join(
            f"{n} is a {'knight' if s else 'knave'}" for n, s in zip(puzzle.names, puzzle.solution, strict=True)
        ),
        "solution_text_format": puzzle.solution_text,
        "statements": repr(puzzle.statements),
        "index": 0,
    }


def test_converter_accepts_public_rows_and_rejects_malformed(tmp_path):
    good = [_public_row(kk.generate_puzzle(n, random.Random(n))) for n in (3, 4, 5)]
    bad_solution = dict(good[0], solution=[True, "yes", False])
    bad_names = dict(good[0], names="Alice")
    bad_quiz = dict(good[0], quiz="")
    flipped = dict(good[1], solution=[not s for s in good[1]["solution"]])
    path = tmp_path / "kk.jsonl"
    lines = [json.dumps(r) for r in good + [bad_solution, bad_names, bad_quiz, flipped]] + ["{not json"]
    path.write_text("\n".join(lines) + "\n")
    rows, rejected = kk_files.convert_file(path)
    assert [r["label"] for r in rows] == [g["solution_text_format"] for g in good]
    assert rows[0]["meta"]["names"] == good[0]["names"] and rows[0]["source"] == "kk"
    assert len(rejected) == 5
    assert rejected[0].startswith(f"{path}:4: ") and "'solution'" in rejected[0]  # FILE:LINE, lines from 1
    assert rejected[1].startswith(f"{path}:5: ") and "'names'" in rejected[1]
    assert rejected[2].startswith(f"{path}:6: ") and "'quiz'" in rejected[2]
    assert rejected[3].startswith(f"{path}:7: ") and "'solution_text_format'" in rejected[3]
    assert rejected[4].startswith(f"{path}:8: ") and "JSON" in rejected[4]


def test_converter_checks_statements_against_solution():
    row = _public_row(kk.generate_puzzle(3, random.Random(3)))
    row["statements"] = repr((("lying", 1), ("lying", 0), ("telling-truth", 0)))  # two solutions
    row.pop("solution_text_format")
    with pytest.raises(kk_files.RowError, match=r"row 9: field 'statements'"):
        kk_files.convert_public_row(row, 9)


def test_converter_reads_parquet_via_datasets(tmp_path):
    import datasets

    good = [_public_row(kk.generate_puzzle(n, random.Random(n))) for n in (2, 3)]
    path = tmp_path / "kk.parquet"
    datasets.Dataset.from_list(good).to_parquet(str(path))
    rows, rejected = kk_files.convert_file(path)
    assert not rejected and [r["meta"]["solution"] for r in rows] == [g["solution"] for g in good]


def test_cli_generate_and_convert(tmp_path, capsys):
    out = tmp_path / "gen"
    assert (
        kk_files.main(["--out", str(out), "--num-train", "30", "--num-eval", "10", "--people", "2-4", "--seed", "3"])
        == 0
    )
    train = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    test = [json.loads(line) for line in (out / "test.jsonl").read_text().splitlines()]
    assert len(train) == 30 and len(test) == 10
    assert {r["meta"]["num_people"] for r in train} == {2, 3, 4}
    assert "wrote 30 train and 10 test rows" in capsys.readouterr().err  # log lines go to stderr

    src = tmp_path / "public.jsonl"
    src.write_text(
        "\n".join(json.dumps(_public_row(kk.generate_puzzle(3, random.Random(i)))) for i in range(4)) + "\n{}\n"
    )
    out2 = tmp_path / "conv"
    assert kk_files.main(["--out", str(out2), "--from-jsonl", str(src)]) == 0
    captured = capsys.readouterr()
    assert "rejected 1 malformed rows" in captured.err and f"warning: rejected {src}:5: field 'quiz'" in captured.err
    assert len((out2 / "train.jsonl").read_text().splitlines()) == 4


@pytest.mark.parametrize("spec, expected", [("3-7", [3, 4, 5, 6, 7]), ("2,3,5", [2, 3, 5]), ("8", [8])])
def test_parse_people(spec, expected):
    assert kk_files.parse_people(spec) == expected


@pytest.mark.parametrize("spec", ["1-3", "9", "a-b", ""])
def test_parse_people_rejects(spec):
    with pytest.raises(ValueError, match="--people"):
        kk_files.parse_people(spec)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 6))
def test_property_label_parses_back_to_solution(seed, n):
    puzzle = kk.generate_puzzle(n, random.Random(seed))
    parsed = parse_kk_answer(puzzle.solution_text, puzzle.names)
    assert parsed is not None and tuple(parsed[name] for name in puzzle.names) == puzzle.solution
    assert _brute_force(puzzle.statements, n) == [puzzle.solution]
