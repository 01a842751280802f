"""The package's rewards as TRL reward functions and verl compute_score, called the way those trainers call them."""

from __future__ import annotations

import inspect
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adora_openrlhf.config import ConfigError
from adora_openrlhf.rewards import as_trl_reward_func, as_verl_compute_score
from adora_openrlhf.rewards.adapters import completion_text
from adora_openrlhf.rewards.geometry import geometry_reward

NAMES = ["Alice", "Bob", "Carol"]
KK_LABEL = "(1) Alice is a knight\n(2) Bob is a knave\n(3) Carol is a knight"
KK_WRONG = "(1) Alice is a knave\n(2) Bob is a knave\n(3) Carol is a knight"
KK_META = {"num_people": 3, "names": NAMES, "solution": [True, False, True]}
GEO_INT = {"question_type": "free_form", "answer_type": "integer"}


def kk_response(answer: str) -> str:
    return f"<think>reasoning</think>\n<answer>{answer}</answer>"


def trl_call(fn, completions, **columns):
    """How TRL's GRPOTrainer calls a custom reward function: keywords only, extra columns as lists."""
    return fn(
        prompts=["p"] * len(completions),
        completions=completions,
        completion_ids=[[1, 2]] * len(completions),
        trainer_state=object(),
        **columns,
    )


def test_trl_kk_plain_and_conversational_completions():
    fn = as_trl_reward_func("kk")
    plain = [kk_response(KK_LABEL), kk_response(KK_WRONG)]
    # Logic-RL constants: format +1 and answer +2 (correct) or -1.5 (wrong)
    assert trl_call(fn, plain, label=[KK_LABEL, KK_LABEL], meta=[KK_META, KK_META]) == [3.0, -0.5]
    chat = [[{"role": "assistant", "content": text}] for text in plain]
    assert trl_call(fn, chat, label=[KK_LABEL, KK_LABEL], meta=[KK_META, KK_META]) == [3.0, -0.5]
    assert trl_call(as_trl_reward_func("kk", value="correct"), chat, label=[KK_LABEL] * 2, meta=[KK_META] * 2) == [
        1.0,
        0.0,
    ]
    assert fn.__name__ == "adora_kk_reward"


def test_trl_math_with_a_renamed_label_column_and_per_row_sources():
    fn = as_trl_reward_func("dapo_math", label_key="answer")
    dapo = {"reward_style": "dapo"}
    assert trl_call(fn, ["Answer: 7", "Answer: 8"], answer=["7", "7"], meta=[dapo, dapo]) == [1.0, -1.0]
    mixed = as_trl_reward_func()  # the reward of each row's source column
    got = trl_call(
        mixed,
        [kk_response(KK_LABEL), "Answer: 8"],
        label=[KK_LABEL, "7"],
        meta=[KK_META, dapo],
        source=["kk", "dapo_math"],
    )
    assert got == [3.0, -1.0]


def test_trl_geometry_matches_the_grader():
    fn = as_trl_reward_func("geometry3k")
    texts = ["<think>reasoning</think> The answer is \\boxed{7}.", "<think>reasoning</think> The answer is \\boxed{8}."]
    got = trl_call(
        fn,
        [[{"role": "assistant", "content": [{"type": "text", "text": t}]}] for t in texts],
        label=["7", "7"],
        meta=[GEO_INT] * 2,
    )
    assert got == [geometry_reward(t, "7", GEO_INT).reward for t in texts]
    assert geometry_reward(texts[0], "7", GEO_INT).correct and not geometry_reward(texts[1], "7", GEO_INT).correct
    assert got[0] > got[1]


def test_trl_errors_name_the_column_or_source():
    with pytest.raises(ValueError, match=r"label_key: the dataset has no 'label' column \(columns: \['answer'\]\)"):
        trl_call(as_trl_reward_func("kk"), ["x"], answer=["y"])
    with pytest.raises(ConfigError, match=r"^source: unknown reward source 'nope'; choose one of \["):
        as_trl_reward_func("nope")
    with pytest.raises(
        ConfigError, match=r"^value: unknown reward value 'score'; choose one of \['correct', 'reward'\]"
    ):
        as_trl_reward_func("kk", value="score")


def test_verl_compute_score_signature_and_results():
    compute_score = as_verl_compute_score()
    assert list(inspect.signature(compute_score).parameters)[:4] == [
        "data_source",
        "solution_str",
        "ground_truth",
        "extra_info",
    ]
    # how verl's reward managers call it: keywords, extra_info = the row's extra_info
    right = compute_score(
        data_source="kk",
        solution_str=kk_response(KK_LABEL),
        ground_truth=KK_LABEL,
        extra_info={"meta": KK_META, "index": 0},
    )
    assert right == {"score": 3.0, "acc": 1.0, "pred": KK_LABEL}
    wrong = compute_score("dapo_math", "Answer: 8", "7", {"reward_style": "dapo"})  # meta given as extra_info itself
    assert (wrong["score"], wrong["acc"]) == (-1.0, 0.0) and isinstance(wrong["pred"], str)
    geo = compute_score("geometry3k", "<think>r</think> The answer is \\boxed{7}.", "7", {"meta": GEO_INT})
    assert (
        geo["acc"] == 1.0
        and geo["score"] == geometry_reward("<think>r</think> The answer is \\boxed{7}.", "7", GEO_INT).reward
    )
    assert set(compute_score("kk", "no answer", KK_LABEL)) == {"score", "acc", "pred"}  # the same keys for every row
    with pytest.raises(ConfigError, match="^source: unknown reward source 'gsm8k'"):
        compute_score("gsm8k", "x", "1")


def test_completion_text_forms():
    assert completion_text("a") == "a"
    assert completion_text([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]) == "a"
    assert completion_text({"role": "assistant", "content": "b"}) == "b"
    with pytest.raises(TypeError, match="completions: expected a string or a list of chat messages"):
        completion_text(3)


_SOURCE_NUMBERS = itertools.count()


@settings(max_examples=100, deadline=None)
@given(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-(10**8), 10**8),
        st.booleans(),
        st.text(max_size=3),
        st.none(),
    )
)
def test_a_plugin_rewards_value_reaches_training_only_when_finite_and_bounded(value):
    """Property: every registered reward's result is checked where it is produced; a reward that is not a finite
    number within +-REWARD_LIMIT (NaN, inf, 1e300, a string, None, a bool) is refused naming the source and the
    function; any other comes back unchanged."""
    import math

    from adora_openrlhf.rewards.base import REWARD_LIMIT, RewardError, RewardResult, get_reward_fn, register_reward

    source = f"toy_value_{next(_SOURCE_NUMBERS)}"

    @register_reward(source)
    def value_reward(response, label, meta):
        return RewardResult(reward=value, correct=False)

    fine = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) <= REWARD_LIMIT
    )
    if fine:
        assert get_reward_fn(source)("r", "l", {}).reward == value
    else:
        with pytest.raises(RewardError, match=rf"^the reward of source '{source}' \(.*value_reward\) returned reward "):
            get_reward_fn(source)("r", "l", {})


def test_a_plugin_reward_that_returns_no_result_or_raises_is_named():
    from adora_openrlhf.rewards.base import RewardError, get_reward_fn, register_reward

    @register_reward("toy_returns_text")
    def returns_text(response, label, meta):
        return "1.0"

    @register_reward("toy_raises")
    def raises(response, label, meta):
        raise KeyError("answer")

    with pytest.raises(
        RewardError,
        match=r"^the reward of source 'toy_returns_text' \(.*returns_text\) returned str '1.0', not a RewardResult",
    ):
        get_reward_fn("toy_returns_text")("r", "l", {})
    with pytest.raises(
        RewardError, match=r"^the reward of source 'toy_raises' \(.*raises\) raised KeyError: 'answer'; fix the reward"
    ):
        get_reward_fn("toy_raises")("r", "l", {})
