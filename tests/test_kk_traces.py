"""The K&K testbed's reasoning traces: thorough guess-and-check vs shortcut, their grading, the warm-up
styles and phases, and the behaviour probe."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adora_openrlhf.backends.local.sft import warmup_lr_factor, warmup_styles
from adora_openrlhf.config import ConfigError, WarmupConfig
from adora_openrlhf.rewards.kk import kk_format_ok, kk_reward
from adora_openrlhf.rows import Row
from adora_openrlhf.tasks import kk
from adora_openrlhf.tasks.behaviours import DEMONSTRATIONS, demonstration_for, style_fractions


def _row(raw: dict) -> Row:
    return Row(raw["prompt"], raw["label"], raw["source"], raw["meta"])


def test_hand_case_two_people():
    # Alice: "Bob is a knave."  Bob: "Alice is a knight".  Candidates in order: (knight, knight), (knight, knave), (knave, knight), (knave, knave).
    # (K, K): Alice says Bob knave -> F, a knight must say T -> no.
    # (K, N): Alice: Bob knave T ok; Bob (knave) says Alice knight T -> a knave must say F -> no.
    # (N, K): Alice: Bob knave F ok (knave says F); Bob: Alice knight F, a knight needs T -> no.
    # (N, N): Alice: Bob knave T, knave needs F -> no.  No solution.
    with pytest.raises(ValueError, match="no consistent assignment"):
        kk.thorough_trace(["Alice", "Bob"], (("lying", 1), ("telling-truth", 0)))
    # Alice: "Bob is a knave."  Bob: "Alice is a knave."  Two solutions; the trace stops at the first, (K, N).
    trace, found = kk.thorough_trace(["Alice", "Bob"], (("lying", 1), ("lying", 0)))
    assert found == (True, False)
    assert trace == (
        "try 1: Alice knight Bob knight. Alice knight says Bob knave F no. "
        "try 2: Alice knight Bob knave. Alice knight says Bob knave T ok. Bob knave says Alice knave F ok. found."
    )


def test_connective_check_texts():
    names, x = ["Alice", "Bob", "Carol"], (True, False, True)
    cases = {
        ("and", ("lying", 1), ("telling-truth", 2)): ("Bob knave T and Carol knight T = T", True),
        ("or", ("telling-truth", 1), ("lying", 2)): ("Bob knight F or Carol knave F = F", False),
        ("not", ("lying", 1)): ("not Bob knave T = F", False),
        ("->", ("telling-truth", 1), ("lying", 2)): ("if Bob knight F then Carol knave F = T", True),
        ("<=>", ("telling-truth", 1), ("lying", 2)): ("Bob knight F iff Carol knave F = T", True),
        ("telling-truth", 0): ("Alice knight T", True),
    }
    for statement, expected in cases.items():
        assert kk.statement_check_text(statement, names, x) == expected
        assert expected[1] == kk.evaluate(statement, x)


def test_candidate_order_counts_in_binary_from_all_knights():
    assert kk.candidate_order(2) == [(True, True), (True, False), (False, True), (False, False)]
    assert len(set(kk.candidate_order(4))) == 16


@settings(max_examples=60)
@given(st.integers(2, 4), st.integers(0, 10_000))
def test_thorough_trace_finds_the_solution_and_is_graded_correct(num_people, seed):
    puzzle = kk.generate_puzzle(num_people, random.Random(seed))
    trace, found = kk.thorough_trace(puzzle.names, puzzle.statements)
    assert found == puzzle.solution
    # one "try" per candidate up to the solution; every try but the last ends with a failed check
    tries = trace.count("try ")
    assert tries == kk.candidate_order(num_people).index(puzzle.solution) + 1
    assert trace.count(" no.") == tries - 1 and trace.endswith("found.")
    response = kk.thorough_response(puzzle.names, puzzle.statements)
    result = kk_reward(response, puzzle.solution_text, {"names": list(puzzle.names)})
    assert kk_format_ok(response) and result.correct and result.reward == 3.0
    assert kk.trace_kind(response) == "thorough"


@settings(max_examples=40)
@given(st.integers(2, 4), st.integers(0, 10_000))
def test_shortcut_is_right_only_when_its_guess_is(num_people, seed):
    puzzle = kk.generate_puzzle(num_people, random.Random(seed))
    response = kk.shortcut_response(puzzle.names, random.Random(seed))
    result = kk_reward(response, puzzle.solution_text, {"names": list(puzzle.names)})
    assert kk_format_ok(response) and kk.trace_kind(response) == "shortcut"
    from adora_openrlhf.rewards.kk import extract_answer_block, parse_kk_answer

    guessed = parse_kk_answer(extract_answer_block(response), puzzle.names)
    right = tuple(guessed[n] for n in puzzle.names) == puzzle.solution
    assert result.correct == right
    assert result.reward == (3.0 if right else -0.5)


@settings(max_examples=40)
@given(st.integers(2, 4), st.integers(0, 10_000))
def test_restating_shortcut_reads_the_statements_back_and_is_right_only_when_its_guess_is(num_people, seed):
    puzzle = kk.generate_puzzle(num_people, random.Random(seed))
    response = kk.restate_response(puzzle.names, puzzle.statements, random.Random(seed))
    think = response[len("<think>") : response.index("</think>")]
    assert think.startswith(f"Knights always tell the truth and knaves always lie. You meet {num_people} inhabitants: ")
    assert think.endswith(" Who is a knight and who is a knave? guess.")
    for name, statement in zip(puzzle.names, puzzle.statements, strict=True):
        text = kk.render_statement(statement, puzzle.names)
        assert f'{name} says: "{text[0].upper()}{text[1:]}."' in think
    assert "try " not in think and kk.trace_kind(response) == "shortcut"
    result = kk_reward(response, puzzle.solution_text, {"names": list(puzzle.names)})
    from adora_openrlhf.rewards.kk import extract_answer_block, parse_kk_answer

    guessed = parse_kk_answer(extract_answer_block(response), puzzle.names)
    right = tuple(guessed[n] for n in puzzle.names) == puzzle.solution
    assert kk_format_ok(response) and result.correct == right and result.reward == (3.0 if right else -0.5)


def test_restating_shortcut_hand_checked_case():
    """Alice: "Bob is a knave." Bob: "Alice is a knave and Bob is a knave." (solution: Alice knight, Bob knave,
    found at try 2). The restating shortcut reads the quiz back and guesses; it is much longer than the bare
    guess and here even a little longer than the checked trace (285 against 263 characters), so length alone
    does not tell a checked answer from a guess."""
    names = ("Alice", "Bob")
    statements = (("lying", 1), ("and", ("lying", 0), ("lying", 1)))
    assert kk.solve(statements, 2) == [(True, False)]
    rng = random.Random(0)
    restate = kk.restate_response(names, statements, rng)
    assert restate.startswith(
        "<think>Knights always tell the truth and knaves always lie. You meet 2 inhabitants: Alice and Bob. "
        'Alice says: "Bob is a knave." Bob says: "Alice is a knave and Bob is a knave." Who is a knight and who is a knave? guess.</think>\n<answer>'
    )
    assert len(kk.shortcut_response(names, rng)) < len(kk.thorough_response(names, statements)) < len(restate)


def test_shortcut_guess_is_uniform():
    rng = random.Random(0)
    names = ["Alice", "Bob"]
    counts: dict[str, int] = {}
    for _ in range(4000):
        answer = kk.shortcut_response(names, rng).split("<answer>")[1]
        counts[answer] = counts.get(answer, 0) + 1
    assert len(counts) == 4 and all(800 < c < 1200 for c in counts.values())


def test_demonstrations_are_reproducible_for_a_seed():
    first = kk.generate_rows(20, [2, 3], seed=5)
    second = kk.generate_rows(20, [2, 3], seed=5)
    assert first == second
    rows = [_row(r) for r in first]
    for style in ("direct", "thorough", "shortcut", "restate"):
        a = [demonstration_for(r, style, random.Random(1)) for r in rows]
        b = [demonstration_for(r, style, random.Random(1)) for r in rows]
        assert a == b
    # statements travel in the row, so the trace can be rebuilt from a saved JSONL row
    restored = kk.statements_from_json(first[0]["meta"]["statements"])
    assert kk.solve(restored, first[0]["meta"]["num_people"]) == [tuple(first[0]["meta"]["solution"])]


def test_trace_kind():
    assert kk.trace_kind("<think>guess.</think>\n<answer>x</answer>") == "shortcut"
    assert kk.trace_kind("<think>try 1: Alice knight.</think>") == "thorough"
    assert kk.trace_kind("<think>Alice knight.</think>") == "other"
    assert (
        kk.trace_kind('<think>You meet 2 inhabitants: Alice and Bob. Alice says: "Bob is a knight." guess.</think>')
        == "shortcut"
    )
    assert kk.trace_kind("<think>Alice knight. guessing</think>") == "other"
    assert kk.trace_kind("") == "other"


def test_style_fractions_and_registry():
    assert set(DEMONSTRATIONS["kk"]) >= {"direct", "thorough", "shortcut"}
    texts = ["<think>guess.</think>", "<think>try 1: a</think>", "<think>try 1: b</think>", "junk"]
    out = style_fractions(["kk"] * 4, texts, "eval/greedy_")
    assert out == {
        "eval/greedy_other_fraction": 0.25,
        "eval/greedy_shortcut_fraction": 0.25,
        "eval/greedy_thorough_fraction": 0.5,
    }
    assert style_fractions(["math"], ["x"], "p/") == {}


def test_rows_without_statements_name_the_fix():
    row = Row("q", "(1) Alice is a knight", "kk", {"names": ["Alice"], "solution": [True]})
    with pytest.raises(ConfigError, match="meta.statements"):
        demonstration_for(row, "thorough")
    with pytest.raises(ConfigError, match="unknown style 'deep'"):
        demonstration_for(row, "deep")
    assert demonstration_for(row, "direct").startswith("<think>Alice knight.</think>")


def test_warmup_config_phases_are_validated():
    cfg = WarmupConfig(steps=10, style="thorough", mix_steps=5, mix={"thorough": 0.25, "shortcut": 0.75})
    assert warmup_styles(cfg) == ["thorough", "shortcut"]
    assert warmup_styles(WarmupConfig(steps=0)) == []
    with pytest.raises(ConfigError, match=r"warmup.mix\['shortcut'\]"):
        WarmupConfig(mix_steps=5, mix={"shortcut": -1})
    with pytest.raises(ConfigError, match="warmup.mix"):
        WarmupConfig(mix_steps=5, mix={})
    with pytest.raises(ConfigError, match="warmup.mix_steps"):
        WarmupConfig(mix_steps=-1)


def test_phase_one_style_shares_and_lr_ramp_are_validated():
    cfg = WarmupConfig(
        steps=10,
        style_shares={"thorough": 0.85, "shortcut": 0.15},
        mix_steps=5,
        mix={"thorough": 0.25, "shortcut": 0.75},
    )
    assert warmup_styles(cfg) == ["thorough", "shortcut"]
    assert warmup_styles(WarmupConfig(steps=10, style_shares={"shortcut": 1.0})) == ["shortcut"]
    with pytest.raises(ConfigError, match=r"warmup.style_shares\['thorough'\]"):
        WarmupConfig(style_shares={"thorough": -0.1})
    with pytest.raises(ConfigError, match="warmup.style_shares"):
        WarmupConfig(style_shares={"thorough": 0.0})
    for bad in (-0.1, 1.0):
        with pytest.raises(ConfigError, match="warmup.lr_ramp"):
            WarmupConfig(lr_ramp=bad)


def test_lr_factor_rises_then_decays():
    # 10 steps, ramp 0.2 -> r = 2: 1/2, 2/2, then (10 - s) / 8 for s = 2..9
    assert [warmup_lr_factor(s, 10, 0.2) for s in range(10)] == [0.5, 1.0] + [(10 - s) / 8 for s in range(2, 10)]
    assert [warmup_lr_factor(s, 4, 0.0) for s in range(4)] == [1.0, 0.75, 0.5, 0.25]
    assert warmup_lr_factor(0, 1000, 0.03) == 1 / 30 and warmup_lr_factor(29, 1000, 0.03) == 1.0


def test_lr_factor_when_the_rise_takes_every_step():
    # 1 step with any ramp -> r = 1: the one step at full rate; 2 steps, ramp 0.9 -> r = 2: 1/2, 1
    # LambdaLR also asks for the step after the last
    assert [warmup_lr_factor(s, 1, 0.5) for s in range(2)] == [
        1.0,
        0.0,
    ]
    assert [warmup_lr_factor(s, 2, 0.9) for s in range(3)] == [0.5, 1.0, 0.0]


@settings(max_examples=200, deadline=None)
@given(steps=st.integers(1, 60), ramp=st.floats(0.0, 0.999))
def test_property_lr_factor_is_defined_for_every_phase_length(steps, ramp):
    """Every step of a phase of any length, and the scheduler's call after its last step, has a factor in [0, 1],
    and the phase's peak is 1."""
    factors = [warmup_lr_factor(s, steps, ramp) for s in range(steps + 1)]
    assert all(0.0 <= f <= 1.0 for f in factors) and max(factors[:steps]) == 1.0 and factors[steps] == 0.0


def test_name_pool_and_order():
    rows = kk.generate_rows(30, [2, 3], seed=2, name_pool=3, name_order="pool")
    for row in rows:
        names = row["meta"]["names"]
        assert set(names) <= {"Alice", "Bob", "Carol"} and names == sorted(names, key=kk.NAMES.index)
        statements = kk.statements_from_json(row["meta"]["statements"])
        assert kk.solve(statements, len(names)) == [tuple(row["meta"]["solution"])]
    assert any(
        r["meta"]["names"] != sorted(r["meta"]["names"], key=kk.NAMES.index) for r in kk.generate_rows(30, [3], seed=2)
    )
    with pytest.raises(ValueError, match="name_pool"):
        kk.generate_puzzle(3, random.Random(0), name_pool=2)
    with pytest.raises(ValueError, match="name_order"):
        kk.generate_puzzle(2, random.Random(0), name_order="alphabetical")
    from adora_openrlhf.tasks.kk import KKDataConfig

    with pytest.raises(ConfigError, match="data.kk.name_pool"):
        KKDataConfig(num_people=[2, 3], name_pool=2)
    with pytest.raises(ConfigError, match="data.kk.name_order"):
        KKDataConfig(name_order="sorted")


def test_guessing_styles_are_registered_as_randomised_so_the_warm_up_redraws_them():
    """The warm-up caches a row's tokenized demonstration unless its (source, style) is randomised: the
    guesses must be redrawn every time, the checked trace and the direct answer are fixed."""
    from adora_openrlhf.tasks.behaviours import RANDOMISED_DEMONSTRATIONS

    assert {("kk", "shortcut"), ("kk", "restate")} <= RANDOMISED_DEMONSTRATIONS
    assert not {("kk", "thorough"), ("kk", "direct")} & RANDOMISED_DEMONSTRATIONS
