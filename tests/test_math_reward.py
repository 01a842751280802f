"""Math reward: math-verify grading, DAPO's Answer: rule, timeouts and crashes from any thread."""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adora_openrlhf.rewards import grader_pool
from adora_openrlhf.rewards import math as mr
from adora_openrlhf.rewards.base import get_reward_fn

MV = mr.REWARD_STYLES["math_verify"]
DAPO = mr.REWARD_STYLES["dapo"]


def slow_grade(*args):
    """A grading function that hangs (stands in for a pathological sympy simplification)."""
    time.sleep(30)
    return True, "never"


def crashing_grade(*args):
    raise RuntimeError("sympy exploded")


@pytest.mark.parametrize("source", mr.MATH_SOURCES)
def test_registered_for_every_math_source(source):
    assert get_reward_fn(source).__wrapped__ is mr.math_reward


@pytest.mark.parametrize(
    "response, label, correct",
    [
        ("The answer is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}", True),
        ("So we get \\boxed{0.5}", "\\frac{1}{2}", True),
        ("\\boxed{1/2}", "\\frac12", True),
        ("\\boxed{\\dfrac{3}{4}}", "0.75", True),
        ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", False),
        ("\\boxed{10\\text{ cm}}", "10", True),  # units
        ("\\boxed{90^\\circ}", "90", True),
        ("\\boxed{\\$18.90}", "18.90", True),
        ("\\boxed{50\\%}", "50", True),
        ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}", True),  # LaTeX
        ("\\boxed{2\\sqrt{3}}", "\\sqrt{12}", True),
        ("\\boxed{x^2+2x+1}", "(x+1)^2", True),
        ("\\boxed{3, 2}", "2,3", True),  # ties: several answers, any order
        ("\\boxed{x=2 \\text{ or } x=3}", "2, 3", True),
        ("\\boxed{\\{3, 2\\}}", "\\{2,3\\}", True),  # sets
        ("\\boxed{(1,2]}", "(1,2]", True),  # intervals
        ("\\boxed{[1,2]}", "(1,2]", False),
        ("\\boxed{4}", "5", False),
        ("I give up.", "5", False),
        ("<think>maybe \\boxed{4}</think>The answer is \\boxed{3}.", "3", True),  # only after </think>
        ("<think>maybe \\boxed{3}</think>The answer is \\boxed{4}.", "3", False),
        ("The final answer is $\\frac{7}{2}$", "3.5", True),
    ],
)
def test_math_verify_cases(response, label, correct):
    result = mr.score_math(response, label, MV)
    assert result.correct is correct
    assert result.reward == (1.0 if correct else 0.0)
    assert result.info["grader_timeout"] == 0.0 and result.info["grader_error"] == 0.0


@pytest.mark.parametrize(
    "response, label, reward, extracted",
    [
        ("Reasoning...\nAnswer: 42", "42", 1.0, "42"),
        ("Answer: 41\nWait.\nAnswer: 42", "42", 1.0, "42"),  # the last Answer: line counts
        ("Answer: $1,000$.", "1000", 1.0, "1000"),
        ("Answer: \\boxed{042}", "42", 1.0, "042"),
        ("answer : -7", "-7", 1.0, "-7"),
        ("Answer: 41", "42", -1.0, "41"),
        ("The result is \\boxed{42}", "42", -1.0, None),  # DAPO needs the Answer: line
        ("Answer: \\frac{1}{2}", "\\frac12", 1.0, "\\frac{1}{2}"),  # non-integer label: math-verify
    ],
)
def test_dapo_answer_line(response, label, reward, extracted):
    result = mr.score_math(response, label, DAPO)
    assert result.reward == reward and result.extracted == extracted
    assert result.correct is (reward == 1.0)


def test_dapo_tail_window():
    long = "Answer: 42\n" + "x" * 400
    assert mr.extract_answer_line(long, 300) is None
    assert mr.extract_answer_line(long, 0) == "42"


def test_pure_helpers():
    assert mr.normalize_answer_line("$\\boxed{1,234}$.") == "1234"
    assert mr.normalize_answer_line("\\text{(B)}") == "(B)"
    assert mr.parse_int("042") == 42 and mr.parse_int("3.0") == 3 and mr.parse_int("3.5") is None
    assert mr.final_segment("a</think>b</think>c") == "c"
    assert mr._unwrap("\\boxed{\\frac{1}{2}} and \\boxed{x}", "boxed") == "\\frac{1}{2} and x"


def test_meta_selects_style():
    assert mr.math_reward("Answer: 7", "7", {"reward_style": "dapo"}).reward == 1.0
    assert mr.math_reward("Answer: 8", "7", {"reward_style": "dapo"}).reward == -1.0
    assert mr.math_reward("\\boxed{8}", "7", {}).reward == 0.0
    with pytest.raises(ValueError, match="reward_style"):
        mr.math_config_for({"reward_style": "nope"})


def test_inline_timeout_in_main_thread():
    config = replace(MV, timeout_s=0.5, mode="inline")
    start = time.monotonic()
    result = mr.score_math("\\boxed{1}", "1", config, grade_fn=slow_grade)
    assert time.monotonic() - start < 5
    assert result.reward == 0.0 and not result.correct and result.info["grader_timeout"] == 1.0
    dapo = mr.score_math("Answer: 1", "1", replace(DAPO, timeout_s=0.5, mode="inline"), grade_fn=slow_grade)
    assert dapo.reward == -1.0 and dapo.info["grader_timeout"] == 1.0  # a timeout is never above a wrong answer


def test_monkeypatched_slow_verify_times_out(monkeypatch):
    import math_verify

    def slow_verify(*args, **kwargs):
        time.sleep(30)
        return True

    monkeypatch.setattr(math_verify, "verify", slow_verify)
    before = mr.GRADER_COUNTS["timeouts"]
    result = mr.score_math("\\boxed{1}", "1", replace(MV, timeout_s=0.5, mode="inline"))
    assert result.reward == 0.0 and result.info["grader_timeout"] == 1.0
    assert mr.GRADER_COUNTS["timeouts"] == before + 1


def test_crash_yields_error_reward():
    result = mr.score_math("\\boxed{1}", "1", replace(MV, mode="inline"), grade_fn=crashing_grade)
    assert result.reward == 0.0 and result.info["grader_error"] == 1.0 and not result.correct


@pytest.mark.parametrize("grade_fn, flag", [(slow_grade, "grader_timeout"), (crashing_grade, "grader_error")])
@pytest.mark.parametrize("style", ["math_verify", "dapo"])
def test_timeouts_and_crashes_score_the_wrong_reward(style, grade_fn, flag):
    """A response that makes grading fail scores exactly what a wrong answer scores (DAPO: -1, not 0)."""
    config = replace(mr.REWARD_STYLES[style], timeout_s=0.5, mode="inline")
    wrong = mr.score_math("Answer: 41\n\\boxed{41}", "42", replace(config, timeout_s=30.0))
    failed = mr.score_math("Answer: 42\n\\boxed{42}", "42", config, grade_fn=grade_fn)
    assert wrong.reward == failed.reward == config.wrong_reward and not failed.correct and failed.info[flag] == 1.0


def test_the_config_has_no_reward_above_wrong_for_failures():
    assert not hasattr(MV, "timeout_reward") and not hasattr(MV, "error_reward")
    with pytest.raises(ValueError, match="wrong_reward"):
        mr.MathRewardConfig(wrong_reward=1.0)


@pytest.mark.parametrize(
    "response, label, timeout_s",
    [
        ("Answer: 7 " + "a" * 60 + "!", "42", 1.0),  # the unit-word pattern backtracked 2^60 ways
        ("Answer: 7 " + "a" * 280 + "!", "42", 1.0),  # the longest run within DAPO's 300-character window
        ("Answer: 7 " + "ab." * 90 + "1", "42", 1.0),
        ("Answer: 7^" + " " * 280 + "x", "42", 1.0),  # the degree pattern had two adjacent space runs
        ("Answer: 9^{9^{9^{9}}}", "\\frac{1}{2}", 1.0),  # math-verify; the power is cut by the time limit
        ("\\boxed{9^{9^{9^{9}}}}", "\\frac{1}{2}", 1.0),
    ],
)
def test_adversarial_answers_score_wrong_within_the_limit(grader, response, label, timeout_s):
    style = "dapo" if response.startswith("Answer") else "math_verify"
    config = replace(mr.REWARD_STYLES[style], timeout_s=timeout_s)
    status, correct, *_ = mr.safe_grade("Answer: 1\n\\boxed{1}", "1", config, process_grader=grader)  # a warm worker
    assert status == "ok" and correct
    (status, correct, *_), seconds = timed(mr.safe_grade, response, label, config, process_grader=grader)
    assert not correct and seconds < timeout_s + 1.0
    result = mr.score_math(response, label, replace(config, timeout_s=timeout_s))
    assert result.reward == config.wrong_reward and not result.correct


@pytest.mark.parametrize("n", [60, 2000])
def test_unit_word_pattern_is_linear(n):
    start = time.monotonic()
    assert mr.answer_integer("7 " + "a" * n + "!") is None
    assert mr.answer_integer("7 " + "ab." * n + "1") is None
    assert mr.answer_integer("7" + " " * n + "x") is None
    assert time.monotonic() - start < 0.5


OLD_NUMBER_WITH_UNIT = (
    r"\s*([+-]?\d+)(?:\.0+)?\s*(?:[A-Za-z]{2,}\.?\s*)+(?:\^\{?\d\}?)?\s*"  # the exponential one, as reference
)


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("7-+ .0abZ^{}2\t")), max_size=14))
def test_unit_word_pattern_matches_what_the_old_one_matched(text):
    """On short strings (where the old pattern is fast) both accept the same stripped texts and read the same integer."""
    import re

    stripped = text.strip()
    old, new = re.fullmatch(OLD_NUMBER_WITH_UNIT, stripped), mr._NUMBER_WITH_UNIT.fullmatch(stripped)
    assert (old is None) == (new is None), stripped
    if old is not None:
        assert old.group(1) == new.group(1)


@pytest.mark.parametrize(
    "meta, failure",
    [
        ({"reward_style": "dapo"}, -1.0),
        ({}, 0.0),
        ({"reward_style": "math_verify"}, 0.0),
        ({"reward_style": "nope"}, -1.0),
    ],
)
def test_failure_reward_is_the_wrong_reward(meta, failure):
    from adora_openrlhf.rewards.base import failure_reward

    assert failure_reward("dapo_math", meta) == failure_reward("aime24", meta) == failure


def blocked_grade(*args):
    """Stands in for C-level work that no signal interrupts (a big-integer power): SIGALRM is blocked."""
    import signal

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(30)
    return True, "never"


def napping_grade(*args):
    """A call that takes 2 s, so that concurrent callers overlap."""
    time.sleep(2.0)
    return False, None


def swallowing_grade(*args):
    """Catches the timeout and answers anyway, as a broad ``except`` inside a grading library would."""
    with contextlib.suppress(BaseException):
        time.sleep(30)
    return True, "swallowed"


@pytest.fixture(scope="module")
def grader():
    """One pool for the module: its workers are started once (each start-up imports math-verify)."""
    pool = grader_pool.ProcessGrader(max_processes=4, warm_up="adora_openrlhf.rewards.math:warm_up")
    yield pool
    pool.close()


def timed(fn, *args, **kwargs):
    start = time.monotonic()
    out = fn(*args, **kwargs)
    return out, time.monotonic() - start


def test_from_worker_thread_grades_and_times_out(grader):
    results = {}

    def work():
        # grading that succeeds gets a generous limit (a loaded CI machine may take seconds); the hanging call
        # gets 1 s and must come back near that limit, far before the 30 s it would otherwise take
        roomy, tight = replace(MV, timeout_s=30.0), replace(MV, timeout_s=1.0)
        results["ok"] = mr.safe_grade("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", roomy, process_grader=grader)
        results["slow"] = timed(mr.safe_grade, "x", "1", tight, grade_fn=slow_grade, process_grader=grader)
        results["after"] = mr.safe_grade("\\boxed{3}", "3", roomy, process_grader=grader)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(150)  # the first call starts a worker (imports); its limit counts from when it is ready
    assert not thread.is_alive()
    assert results["ok"][:2] == ("ok", True)
    (status, *_), seconds = results["slow"]
    assert status == "timeout" and seconds < 5
    assert results["after"][:2] == ("ok", True)


def test_start_up_is_not_counted_against_the_limit():
    # a cold worker takes far longer than 0.5 s to import math-verify; the call still grades
    pool = grader_pool.ProcessGrader(max_processes=1, warm_up="adora_openrlhf.rewards.math:warm_up")
    try:
        outcome = mr.safe_grade(
            "\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", replace(MV, timeout_s=0.5), process_grader=pool
        )
    finally:
        pool.close()
    assert outcome[:2] == ("ok", True)


@pytest.mark.parametrize(
    "response, label", [("\\boxed{10^{10^{10}}}", "5"), ("\\boxed{9^{9^{9^{9}}}}", "1"), ("\\boxed{1}", "10^{10^{10}}")]
)
def test_huge_powers_time_out_in_the_main_thread(grader, response, label):
    """Before: these ran past 40 s in the main thread (the alarm was swallowed inside math-verify)."""
    mr.safe_grade("\\boxed{1}", "1", MV, process_grader=grader)  # start the worker first
    (status, correct, *_), seconds = timed(
        mr.safe_grade, response, label, replace(MV, timeout_s=1.0), process_grader=grader
    )
    assert status == "timeout" and not correct and seconds < 1.5
    inline = replace(MV, timeout_s=1.0, mode="inline")
    (status, *_), seconds = timed(mr.safe_grade, response, label, inline)
    assert status == "timeout" and seconds < 1.5


def test_default_config_grades_in_a_worker_from_the_main_thread(monkeypatch, grader):
    monkeypatch.setattr(mr, "_PROCESS_GRADER", grader)
    assert threading.current_thread() is threading.main_thread()
    assert mr.score_math("\\boxed{2}", "2", MV).correct
    assert grader.size >= 1


def test_uninterruptible_call_is_killed_at_the_limit(grader):
    mr.safe_grade("\\boxed{1}", "1", MV, process_grader=grader)
    outcome, seconds = timed(grader.run, blocked_grade, (), 1.0)
    assert outcome[0] == "timeout" and "killed" in outcome[3] and seconds < 1.5
    assert grader.run(mr.grade_response, ("\\boxed{2}", "2", "math_verify", True, 300, 6), 30)[:2] == ("ok", True)


def test_swallowed_timeout_counts_as_timeout():
    outcome, seconds = timed(grader_pool.run_with_alarm, swallowing_grade, (), 0.3)
    assert outcome[0] == "timeout" and seconds < 2


def test_timeout_inside_math_verify_is_not_swallowed(monkeypatch):
    """math-verify wraps sympy's simplify in ``except Exception``; a timeout there must stay a timeout."""
    import math_verify.grader

    def slow_simplify(*args, **kwargs):
        time.sleep(30)

    monkeypatch.setattr(math_verify.grader, "simplify", slow_simplify)
    outcome, seconds = timed(
        grader_pool.run_with_alarm, mr.grade_response, ("\\boxed{x^2+2x+1}", "(x+1)^2", "math_verify"), 0.5
    )
    assert outcome[0] == "timeout" and seconds < 3


def test_concurrent_callers_do_not_queue(grader):
    """Four callers at once each get a worker: every call returns within its own limit."""

    def call(config, fn, out):
        out.append(timed(mr.safe_grade, "x", "1", config, grade_fn=fn, process_grader=grader))

    warm: list = []  # four overlapping calls: each needs its own worker (idle ones are reused)
    threads = [threading.Thread(target=call, args=(MV, napping_grade, warm)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    assert grader.size == 4 and all(o[:2] == ("ok", False) for o, _ in warm)
    slow: list = []
    threads = [threading.Thread(target=call, args=(replace(MV, timeout_s=1.0), slow_grade, slow)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [o[0] for o, _ in slow] == ["timeout"] * 4
    assert max(seconds for _, seconds in slow) < 1.8


def test_full_pool_wait_is_bounded():
    pool = grader_pool.ProcessGrader(max_processes=1, warm_up="adora_openrlhf.rewards.math:warm_up")
    try:
        mr.safe_grade("\\boxed{1}", "1", MV, process_grader=pool)
        out: list = []
        worker = threading.Thread(target=lambda: out.append(pool.run(slow_grade, (), 3.0)))
        worker.start()
        time.sleep(0.2)
        outcome, seconds = timed(pool.run, mr.grade_response, ("\\boxed{1}", "1", "math_verify"), 0.5)
        assert outcome[0] == "timeout" and "no grading worker became free" in outcome[3] and seconds < 1.0
        worker.join(10)
        assert out[0][0] == "timeout"
    finally:
        pool.close()


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=200))
def test_property_dapo_never_raises(text):
    result = mr.score_math(text, "42", DAPO)
    assert result.reward in (1.0, -1.0, 0.0)


@settings(max_examples=40, deadline=None)
@given(value=st.integers(-(10**6), 10**6))
def test_property_integer_answer_line_roundtrip(value):
    assert mr.score_math(f"work\nAnswer: {value}", str(value), DAPO).reward == 1.0
    assert mr.score_math(f"work\nAnswer: {value + 1}", str(value), DAPO).reward == -1.0


@pytest.mark.parametrize(
    "response, label, correct",
    [  # MATH500 answers with an escaped dollar sign (3 of 500 rows)
        ("<think>x</think>\\boxed{36}", "\\$36", True),
        ("\\boxed{\\$36}", "\\$36", True),
        ("\\boxed{18.90}", "\\$18.90", True),
        ("\\boxed{32348}", "\\$32,\\!348", True),
        ("\\boxed{35}", "\\$36", False),
        ("$\\frac{1}{2}$", "$\\frac12$", True),  # a label already in math delimiters is kept as is
    ],
)
def test_escaped_dollar_labels(response, label, correct):
    result = mr.score_math(response, label, MV)
    assert result.correct is correct and result.info["grader_error"] == 0.0
    assert mr.math_reward(response, label, {}).reward == float(correct)


@pytest.mark.parametrize(
    "response, label", [("$12:00$", "$12:00$"), ("The time is $12:00$", "12:00"), ("\\boxed{12:00}", "12:00")]
)
def test_identical_answer_whose_numeric_pair_raises(response, label):
    """``12:00`` parses to [zoo, "12:00"]: the zoo pair raises, the string pair is equal."""
    result = mr.score_math(response, label, MV)
    assert result.correct and result.reward == 1.0 and result.info["grader_error"] == 0.0


def test_any_pair_equal_reraises_only_when_every_pair_fails():
    import sympy

    assert mr.any_pair_equal([sympy.zoo, "12:00"], [sympy.zoo, "12:00"])
    assert not mr.any_pair_equal([sympy.zoo, "12:00"], [sympy.Integer(3), "3"])
    with pytest.raises(ValueError):
        mr.any_pair_equal([sympy.zoo], [sympy.zoo])


@pytest.mark.parametrize(
    "line, label, reward",
    [  # forms verl's math_dapo.py accepts
        ("Answer: x = 42", "42", 1.0),
        ("Answer: n=42", "42", 1.0),
        ("Answer: $x = 42$", "42", 1.0),
        ("Answer: 42 degrees", "42", 1.0),
        ("Answer: 42^\\circ", "42", 1.0),
        ("Answer: $42^{\\circ}$", "42", 1.0),
        ("Answer: 42 square units", "42", 1.0),
        ("Answer: $42\\text{ cm}^2$", "42", 1.0),
        ("Answer: 1{,}000", "1000", 1.0),
        ("Answer: 1 000", "1000", 1.0),
        ("Answer: $1\\,000$", "1000", 1.0),
        ("Answer: \\overline{42}", "42", 1.0),
        # kept where the reference is wrong or stricter
        ("Answer: 42.", "42", 1.0),
        ("Answer: 042", "42", 1.0),
        ("Answer: +42", "42", 1.0),
        ("Answer: 2, 1", "21", -1.0),  # no comma collapse
        ("Answer: 42 or 43", "42", -1.0),
        ("Answer: 42x", "42", -1.0),
        ("Answer: x = 41", "42", -1.0),
        ("Answer: 0.5", "\\frac{1}{2}", 1.0),  # non-integer label: math-verify
    ],
)
def test_dapo_reference_forms(line, label, reward):
    assert mr.score_math(f"work\n{line}", label, DAPO).reward == reward


def test_dapo_answer_scope():
    """after_think (default): the Answer: line after </think>; whole: the last 300 characters (verl)."""
    response = "<think>Answer: 7</think>" + "x" * 10 + "\nAnswer: 8"
    assert mr.math_reward(response, "8", {"reward_style": "dapo"}).reward == 1.0
    assert mr.math_reward(response, "7", {"reward_style": "dapo", "answer_scope": "whole"}).reward == -1.0
    only_in_think = "<think>Answer: 7\n</think>The end."
    assert mr.math_reward(only_in_think, "7", {"reward_style": "dapo"}).reward == -1.0
    assert mr.math_reward(only_in_think, "7", {"reward_style": "dapo", "answer_scope": "whole"}).reward == 1.0
    long_tail = "<think>Answer: 7</think>" + "y" * 400
    assert mr.math_reward(long_tail, "7", {"reward_style": "dapo", "answer_scope": "whole"}).reward == -1.0
    with pytest.raises(ValueError, match="answer_scope"):
        mr.math_config_for({"answer_scope": "tail"})
