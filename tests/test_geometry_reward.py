"""Geometry3K / MathVista reward: multiple choice, numeric tolerance, free form, format weight."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adora_openrlhf.rewards.base import get_reward_fn
from adora_openrlhf.rewards.geometry import (
    GeometryRewardConfig,
    choice_index,
    extract_final_answer,
    geometry_format_ok,
    geometry_reward,
    numeric_equal,
    score_geometry,
)

MC = {"question_type": "multi_choice", "answer_type": "text", "choices": ["3", "6", "9", "12"]}
FLOAT1 = {"question_type": "free_form", "answer_type": "float", "precision": 1}
INT = {"question_type": "free_form", "answer_type": "integer"}
GEO = {"question_type": "free_form", "choices": ["2\\sqrt{3}", "4", "6", "8"], "answer_letter": "A"}


def think(answer: str) -> str:
    return f"<think>reasoning</think> The answer is \\boxed{{{answer}}}."


@pytest.mark.parametrize("source", ["geometry3k", "mathvista"])
def test_registered(source):
    assert get_reward_fn(source).__wrapped__ is geometry_reward


@pytest.mark.parametrize(
    "response, correct",
    [
        (think("B"), True),
        (think("(B)"), True),
        (think("6"), True),
        ("<think>r</think><answer>B</answer>", True),
        ("<think>r</think>Answer: Option B", True),
        ("<think>r</think>The answer is (B).", True),
        (think("C"), False),
        (think("9"), False),
        (think("E"), False),  # no fifth option
        ("<think>r</think>", False),
    ],
)
def test_multiple_choice(response, correct):
    result = geometry_reward(response, "6", MC)
    assert result.correct is correct


@pytest.mark.parametrize(
    "answer, label, precision, equal",
    [
        ("1.24", "1.2", 1, True),
        ("1.3", "1.2", 1, False),
        ("1.2 cm", "1.2", 1, True),
        ("3.14159", "3.14", 2, True),
        ("1,200", "1200", 0, True),
        ("x", "1", 0, False),
        ("2.5", "3", 0, False),
    ],
)
def test_numeric_equal(answer, label, precision, equal):
    assert numeric_equal(answer, label, precision) is equal


def test_float_and_integer_answer_types():
    assert geometry_reward(think("1.24"), "1.2", FLOAT1).correct
    assert not geometry_reward(think("1.3"), "1.2", FLOAT1).correct
    assert geometry_reward(think("7"), "7", INT).correct
    assert not geometry_reward(think("7.4"), "8", INT).correct


def test_free_form_geometry_uses_math_grader_and_letters():
    assert geometry_reward(think("2\\sqrt{3}"), "2\\sqrt{3}", GEO).correct
    assert geometry_reward(think("\\sqrt{12}"), "2\\sqrt{3}", GEO).correct
    assert geometry_reward(think("A"), "2\\sqrt{3}", GEO).correct
    assert not geometry_reward(think("B"), "2\\sqrt{3}", GEO).correct
    assert not geometry_reward(think("4"), "2\\sqrt{3}", GEO).correct
    assert geometry_reward(think("\\frac{1}{2}"), "0.5", {}).correct


def test_reward_formula_hand_case():
    # reward = (1 - w) * accuracy + w * geometry_format_ok, w = 0.1
    assert geometry_reward(think("6"), "6", MC).reward == pytest.approx(1.0)
    assert geometry_reward(think("9"), "6", MC).reward == pytest.approx(0.1)
    assert geometry_reward("\\boxed{6}", "6", MC).reward == pytest.approx(0.9)  # no <think>
    assert geometry_reward("nothing", "6", MC).reward == 0.0
    half = GeometryRewardConfig(format_weight=0.5)
    assert score_geometry(think("9"), "6", MC, half).reward == pytest.approx(0.5)


def test_format_rules():
    cfg = GeometryRewardConfig()
    assert geometry_format_ok(think("1"), cfg)
    assert not geometry_format_ok("\\boxed{1}", cfg)
    assert not geometry_format_ok("<think>a</think><think>b</think>\\boxed{1}", cfg)
    assert geometry_format_ok("a</think>\\boxed{1}", GeometryRewardConfig(think_opened_in_prompt=True))
    assert geometry_reward("a</think>\\boxed{6}", "6", dict(MC, think_opened_in_prompt=True)).reward == pytest.approx(
        1.0
    )


def test_extract_final_answer_order():
    assert extract_final_answer("<think>\\boxed{1}</think>\\boxed{2}") == "2"
    assert extract_final_answer("<think>x</think><answer>\\boxed{3}</answer>") == "3"
    assert extract_final_answer("<think>x</think>so\nthe answer is 5") == "5"
    assert extract_final_answer("") is None


def test_choice_index():
    choices = ["3", "6", "9", "12"]
    assert choice_index("B", choices) == 1 and choice_index("(d)", choices) == 3 and choice_index("12", choices) == 3
    assert choice_index("Because", choices) is None and choice_index("E", choices) is None


@settings(max_examples=80, deadline=None)
@given(text=st.text(max_size=200))
def test_property_never_raises(text):
    for meta in (MC, FLOAT1, INT):
        result = geometry_reward(text, "6", meta)
        assert 0.0 <= result.reward <= 1.0


@settings(max_examples=50, deadline=None)
@given(value=st.floats(-1000, 1000, allow_nan=False), precision=st.integers(0, 3))
def test_property_rounded_value_is_correct(value, precision):
    label = f"{round(value, precision):.{precision}f}"
    meta = {"question_type": "free_form", "answer_type": "float", "precision": precision}
    assert geometry_reward(think(label), label, meta).correct


PID_302 = {  # MathVista testmini pid 302
    "question_type": "multi_choice",
    "answer_type": "text",
    "choices": ["a polynomial", "a trigonometric function", "an exponential function", "a logarithmic function"],
}
SUMS = {
    "question_type": "multi_choice",
    "answer_type": "text",
    "choices": ["d + e = f + j", "b + c = f", "a + d = e", "b + e = j"],
}


@pytest.mark.parametrize(
    "meta, label, answer, reward",
    [
        (PID_302, "a logarithmic function", "D", 1.0),
        (PID_302, "a logarithmic function", "A", 0.1),
        (PID_302, "a logarithmic function", "a logarithmic function", 1.0),
        (PID_302, "a logarithmic function", "a polynomial", 0.1),
        (SUMS, "d + e = f + j", "A", 1.0),
        (SUMS, "d + e = f + j", "D", 0.1),
        (SUMS, "d + e = f + j", "(A)", 1.0),
    ],
)
def test_options_starting_with_a_letter(meta, label, answer, reward):
    """Option texts are matched before letters, for the label and for the response."""
    result = geometry_reward(think(answer), label, meta)
    assert result.reward == pytest.approx(reward)


def test_choice_index_text_before_letter():
    choices = PID_302["choices"]
    assert choice_index("a logarithmic function", choices) == 3
    assert choice_index("(D)", choices) == 3 and choice_index("Option B", choices) == 1
    assert choice_index("(b)", ["(c)", "(b)", "(a)"]) == 1  # the option text "(b)" is the second option
    assert choice_index("E", choices) is None


def test_free_form_label_with_escaped_dollar():
    meta = {"question_type": "free_form", "answer_type": "text"}
    result = geometry_reward(think("36"), "\\$36", meta)
    assert result.correct and result.info["grader_error"] == 0.0


# ---------------------------------------------------------------------------------------------------------
# MathVista's numeric normalisation, and bounded parsing
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer, label, answer_type, precision, equal",
    [
        ("5", "5", "integer", 0, True),
        ("5.0", "5", "integer", 0, True),
        ("5.9", "5", "integer", 0, True),  # MathVista: str(int(float("5.9"))) == "5"
        ("4.6", "5", "integer", 0, False),  # truncated to 4, not rounded to 5
        ("4.5000001", "5", "integer", 0, False),
        ("-4.6", "-4", "integer", 0, True),  # int() truncates toward zero
        ("5", "5.5", "integer", 0, False),  # a label that is not a whole number matches nothing
        ("1e999", "5", "integer", 0, False),  # an overflowing answer is wrong, not an error
        ("1.6", "2.5", "float", 0, False),  # no precision: the label's one decimal, not 0
        ("2.4", "2.5", "float", None, False),
        ("2.54", "2.5", "float", 0, True),
        ("2.5", "2.5", "float", 1, True),
        ("2.54", "2.50", "float", 1, False),  # the label is written with 2 decimals: compared at 2
        ("2.504", "2.50", "float", 1, True),
        ("1.24", "1.2", "float", 1, True),
        ("0.0012", "1e-3", "float", 0, True),
        ("0.0016", "1e-3", "float", 0, False),
        ("3.14159", "3.14", "float", 2, True),
        ("3.14159", "3.1416", "float", 2, True),
        ("3.1", "3.1416", "float", 2, False),
        ("2.6", "3", "float", None, False),  # no precision, no tolerance: a coarse label is not a wide one
        ("3.49", "3", "float", None, False),
        ("3.0", "3", "float", None, True),
        ("3", "3.00", "float", None, True),
        ("3.14159", "3.14", "float", None, False),
        ("1,200", "1200", "float", None, True),
        ("1.5e2", "150", "float", None, True),
    ],
)
def test_mathvista_numeric_normalisation(answer, label, answer_type, precision, equal):
    assert numeric_equal(answer, label, precision, answer_type) is equal
    meta = {"question_type": "free_form", "answer_type": answer_type}
    if precision is not None:
        meta["precision"] = precision
    assert geometry_reward(think(answer), label, meta).correct is equal


@settings(max_examples=200, deadline=None)
@given(
    value=st.decimals(-1000, 1000, allow_nan=False, allow_infinity=False, places=3),
    precision=st.integers(0, 3),
    offset=st.integers(-9, 9),
)
def test_property_floats_are_compared_at_the_labels_decimals(value, precision, offset):
    """An answer that differs from the label in the label's last written decimal is never right."""
    label = str(value)
    places = max(precision, -value.as_tuple().exponent)
    answer = value + offset * value.__class__(10) ** -places
    assert numeric_equal(str(answer), label, precision, "float") is (offset == 0)


@settings(max_examples=200, deadline=None)
@given(
    value=st.decimals(-1000, 1000, allow_nan=False, allow_infinity=False, places=3),
    zeros=st.integers(0, 3),
    offset=st.integers(-999, 999),
)
def test_property_floats_without_precision_must_equal_the_label_as_written(value, zeros, offset):
    """Without meta.precision a float answer is right exactly when its value is the label's (trailing zeros aside)."""
    label = str(value)
    answer = value + offset * value.__class__("0.0001")
    written = f"{answer:.{4 + zeros}f}"
    assert numeric_equal(written, label, None, "float") is (offset == 0)
    meta = {"question_type": "free_form", "answer_type": "float"}
    assert geometry_reward(think(written), label, meta).correct is (offset == 0)


OLD_LETTER = r"^\s*(?:(?:option|choice)\s*)?\(?\s*([A-Za-z])\s*[\).:]?\s*(?:$|[\s\).:])"  # before it was made linear


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(["option", "Choice", " ", "  ", "(", ")", ".", ":", "B", "c", "x1", "!"]), max_size=8))
def test_property_letter_pattern_matches_as_the_old_one(tokens):
    import re

    from adora_openrlhf.rewards.geometry import _LETTER

    text = "".join(tokens).strip()
    old = re.match(OLD_LETTER, text, re.IGNORECASE)
    new = _LETTER.match(text)
    assert (old and old.group(1)) == (new and new.group(1)), text


def test_stated_answer_of_the_last_line():
    assert extract_final_answer("so\nThe answer is: 7") == "7"
    assert extract_final_answer("so\nanswer: (B)  ") == "(B)"
    assert extract_final_answer("so\nthe final answer") == "the final answer"  # nothing stated after it: the whole line


@pytest.mark.parametrize(
    "response, meta",
    [
        ("<think>r</think><answer>Option" + " " * 64_000 + "!</answer>", MC),
        ("<think>r</think><answer>(" + " " * 64_000 + "!</answer>", MC),
        ("<think>r</think>the answer" + " " * 64_000 + "is" + " " * 64_000 + "x", FLOAT1),
        ("<think>r</think>answer x" + " " * 64_000 + "y", INT),
        ("<answer>" * 50_000, INT),
        ("<think>r</think>" + "<answer>x" * 30_000, MC),
        ("\\boxed{" * 20_000, INT),
    ],
)
def test_adversarial_responses_are_parsed_in_linear_time(response, meta):
    import time

    start = time.monotonic()
    result = geometry_reward(response, "6", meta)
    assert time.monotonic() - start < 1.0
    assert not result.correct and result.reward <= 0.1  # never above a formatted wrong answer


def test_failure_reward_and_row_time_limit():
    from adora_openrlhf.rewards.base import failure_reward

    assert failure_reward("mathvista", {}) == failure_reward("geometry3k", {}) == failure_reward("geo_synth", {}) == 0.0
    meta = {"question_type": "free_form", "answer_type": "text", "grader_timeout_s": 1.0}
    import time

    geometry_reward(think("1"), "1", meta)  # a warm grading worker
    start = time.monotonic()
    result = geometry_reward(think("9^{9^{9^{9}}}"), "\\frac{1}{2}", meta)
    assert time.monotonic() - start < 2.5
    assert result.info["grader_timeout"] == 1.0 and result.reward == pytest.approx(
        geometry_reward(think("3"), "\\frac{1}{2}", meta).reward
    )
