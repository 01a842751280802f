"""Every grader on adversarial text: it returns within its stated bound, and a non-answer never scores above a
wrong answer.

Stated bounds (docs/data_and_rewards.md): a grader that calls the math grader (math rows, DAPO rows whose label
is not an integer, free-form geometry) returns within the row's time limit, ``meta.grader_timeout_s``, plus the
process grader's hand-over; everything else reads the response in linear time, so 100k characters take well under
a second (0.1 s measured; the tests allow 2 s, for a loaded machine). A quadratic pattern needs minutes on these
lengths and an exponential one never ends, so the bounds cannot pass by luck.

Adversarial text: runs of up to 20k copies of letters, spaces, digits, braces, nested tags, names, role words and
answer anchors, concatenated (at most 100k characters).
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from adora_openrlhf.rewards.base import failure_reward, get_reward_fn

TIME_LIMIT_S = 1.0  # meta.grader_timeout_s of the rows that reach the math grader
HAND_OVER_S = 1.5  # the process grader's answer or kill after the limit, on a loaded machine
LINEAR_BOUND_S = 2.0  # 100k characters, parsed in linear time
MAX_CHARS = 100_000

KK_LABEL = "(1) Alice is a knight\n(2) Bob is a knave"
KK_WRONG = "<think>t</think><answer>(1) Alice is a knave\n(2) Bob is a knight</answer>"
MC = {"question_type": "multi_choice", "answer_type": "text", "choices": ["3", "6", "9", "12"]}
LIMIT = {"grader_timeout_s": TIME_LIMIT_S}

# name: (source, label, meta, a wrong answer, whether the math grader (time limit) is on the path)
GRADERS = {
    "kk lenient": ("kk", KK_LABEL, {"names": ["Alice", "Bob"], "kk_parser": "lenient"}, KK_WRONG, False),
    "kk logic_rl": ("kk", KK_LABEL, {"names": ["Alice", "Bob"], "kk_parser": "logic_rl"}, KK_WRONG, False),
    "kk think opened": (
        "kk",
        KK_LABEL,
        {"names": ["Alice", "Bob"], "think_opened_in_prompt": True},
        KK_WRONG[7:],
        False,
    ),
    "dapo integer": ("dapo_math", "42", {"reward_style": "dapo", **LIMIT}, "work\nAnswer: 41", True),
    "dapo expression": ("dapo_math", "\\frac{1}{2}", {"reward_style": "dapo", **LIMIT}, "work\nAnswer: 3", True),
    "math_verify": ("math500", "\\frac{1}{2}", dict(LIMIT), "so \\boxed{3}", True),
    "math_verify whole": ("aime24", "42", {"answer_scope": "whole", **LIMIT}, "so \\boxed{41}", True),
    "mathvista choice": ("mathvista", "6", MC, "<think>t</think><answer>C</answer>", False),
    "mathvista integer": (
        "mathvista",
        "6",
        {"question_type": "free_form", "answer_type": "integer"},
        "<think>t</think><answer>7</answer>",
        False,
    ),
    "mathvista float": (
        "mathvista",
        "6.5",
        {"question_type": "free_form", "answer_type": "float", "precision": 1},
        "<think>t</think><answer>6.4</answer>",
        False,
    ),
    "geometry3k free form": (
        "geometry3k",
        "2\\sqrt{3}",
        {"question_type": "free_form", "choices": ["2\\sqrt{3}", "4", "6", "8"], **LIMIT},
        "<think>t</think>\\boxed{4}",
        True,
    ),
    "geo_synth count": (
        "geo_synth",
        "6",
        {"question_type": "free_form", "answer_type": "integer"},
        "<think>t</think><answer>7</answer>",
        False,
    ),
}
MATH_GRADERS = [name for name, spec in GRADERS.items() if spec[4]]
PARSE_GRADERS = [name for name, spec in GRADERS.items() if not spec[4]]

PIECES = [
    "a", "Z", " ", "\n", "\t", "1", "9", "0", ".", ",", "-", "+", "=", ":", "!", "^", "*", "_", "$", "\\", "(", ")", "{", "}",
    "<think>", "</think>", "<answer>", "</answer>", "\\boxed{", "\\frac{", "\\text{", "10^{", "9^{", "^{\\circ}",
    "Answer:", "answer is", "Answer: 7 ", "Alice", "Bob", " is a ", "not ", "knight", "knave", "Option ", "(B)", "cm", "ab.",
]  # fmt: skip
RUNS = st.lists(st.tuples(st.sampled_from(PIECES), st.integers(1, 20_000)), min_size=1, max_size=6)

# The cases of the issue and their variants, always tried.
NAMED_CASES = [
    "Answer: 7 " + "a" * 60 + "!",
    "Answer: 7 " + "ab " * 30 + "!",
    "Answer: 9^{9^{9^{9}}}",
    "\\boxed{9^{9^{9^{9}}}}",
    "<think>t</think><answer>Alice" + " " * 32_000 + "x</answer>",
    "<think>t</think><answer>Bob" + "*" * 32_000 + "</answer>",
    "<answer>" * 12_000,
    "<think>" * 5_000 + "</think>" * 5_000,
    "{" * 50_000,
    "1 " * 16_000,
    "the answer" + " " * 40_000 + "is" + " " * 40_000 + "x",
]


def _text(runs) -> str:
    return "".join(piece * count for piece, count in runs)[:MAX_CHARS]


@pytest.fixture(scope="module", autouse=True)
def warm_grader():
    """Start a grading worker first: its start-up is not part of any call's bound."""
    get_reward_fn("math500")("\\boxed{1}", "1", dict(LIMIT))


def _check(name: str, response: str) -> None:
    source, label, meta, wrong, timed = GRADERS[name]
    reward_fn = get_reward_fn(source)
    wrong_reward = reward_fn(wrong, label, dict(meta)).reward
    assert failure_reward(source, meta) <= wrong_reward  # a response that breaks grading gains nothing either
    start = time.monotonic()
    result = reward_fn(response, label, dict(meta))
    seconds = time.monotonic() - start
    bound = TIME_LIMIT_S + HAND_OVER_S if timed else LINEAR_BOUND_S
    assert seconds < bound, f"{name}: {seconds:.2f} s on {len(response)} characters {response[:80]!r}"
    if not result.correct:
        assert result.reward <= wrong_reward, f"{name}: {result.reward} > {wrong_reward} for {response[:80]!r}"


@pytest.mark.parametrize("name", list(GRADERS))
@pytest.mark.parametrize("response", NAMED_CASES, ids=range(len(NAMED_CASES)))
def test_named_adversarial_cases(name, response):
    _check(name, response)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(runs=RUNS)
@example(runs=[("Alice", 1), (" ", 20_000), ("x", 1)])
def test_property_parsing_graders_are_linear_and_never_reward_a_non_answer(runs):
    response = _text(runs)
    for name in PARSE_GRADERS:
        _check(name, response)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(runs=RUNS)
@example(runs=[("Answer: 7 ", 1), ("a", 60), ("!", 1)])
def test_property_math_graders_keep_their_time_limit_and_never_reward_a_non_answer(runs):
    response = _text(runs)
    for name in MATH_GRADERS:
        _check(name, response)
