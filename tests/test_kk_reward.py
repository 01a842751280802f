"""The Logic-RL K&K reward: format term, answer term, parsing robustness."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adora_openrlhf.rewards.base import get_reward_fn
from adora_openrlhf.rewards.kk import (
    KKRewardConfig,
    kk_format_ok,
    kk_reward,
    make_kk_reward,
    parse_kk_answer,
    parse_kk_answer_logic_rl,
)
from adora_openrlhf.tasks import kk

NAMES = ["Alice", "Bob", "Carol"]
LABEL = "(1) Alice is a knight\n(2) Bob is a knave\n(3) Carol is a knight"
META = {"num_people": 3, "names": NAMES, "solution": [True, False, True]}


def wrap(answer: str, think: str = "reasoning") -> str:
    return f"<think>{think}</think>\n<answer>{answer}</answer>"


def test_registered_for_kk():
    assert get_reward_fn("kk").__wrapped__ is kk_reward  # with its results checked (rewards.base.check_reward_result)


def test_defaults_are_logic_rl_constants():
    cfg = KKRewardConfig()
    assert (cfg.format_reward, cfg.answer_correct, cfg.answer_wrong, cfg.answer_unparsable) == (1.0, 2.0, -1.5, -2.0)


def test_canonical_solution_scores_three():
    result = kk_reward(wrap(LABEL), LABEL, META)
    assert result.reward == 3.0 and result.correct
    assert result.extracted == LABEL
    assert result.info["format_ok"] == 1.0 and result.info["answer_parsed"] == 1.0


def test_flipped_solution_is_wrong():
    flipped = "(1) Alice is a knave\n(2) Bob is a knave\n(3) Carol is a knight"
    result = kk_reward(wrap(flipped), LABEL, META)
    assert result.reward == 1.0 - 1.5 and not result.correct


def test_unparsable_answer():
    result = kk_reward(wrap("(1) Alice is a knight\n(2) Bob is a knave"), LABEL, META)  # Carol missing
    assert result.reward == 1.0 - 2.0 and not result.correct and result.info["answer_parsed"] == 0.0
    contradictory = wrap("Alice is a knight\nAlice is a knave\nBob is a knave\nCarol is a knight")
    assert kk_reward(contradictory, LABEL, META).reward == -1.0


@pytest.mark.parametrize(
    "response",
    [
        LABEL,  # no tags
        f"<answer>{LABEL}</answer>",  # no think
        f"<think>a</think><think>b</think><answer>{LABEL}</answer>",  # two think blocks
        f"<answer>{LABEL}</answer><think>a</think>",  # wrong order
        f"<think>a<answer>{LABEL}</answer></think>",  # answer inside think
        f"<think>a</think><answer>{LABEL}</answer><answer>{LABEL}</answer>",  # two answers
        f"<think>a</think><answer>{LABEL}",  # unclosed
        "",
    ],
)
def test_format_failures_score_minus_three(response):
    result = kk_reward(response, LABEL, META)
    assert result.reward == -3.0 and not result.correct and result.info["format_ok"] == 0.0


def test_grading_without_format_when_configured():
    lenient = make_kk_reward(KKRewardConfig(grade_only_if_format_ok=False))
    result = lenient(f"<answer>{LABEL}</answer>", LABEL, META)
    assert result.reward == -1.0 + 2.0 and result.correct


def test_think_opened_in_prompt():
    response = f"reasoning</think><answer>{LABEL}</answer>"
    assert kk_reward(response, LABEL, META).reward == -3.0
    opened = make_kk_reward(KKRewardConfig(think_opened_in_prompt=True))
    assert opened(response, LABEL, META).reward == 3.0
    assert kk_reward(response, LABEL, dict(META, think_opened_in_prompt=True)).reward == 3.0
    # a response that opens <think> again has two openings once the prompt's is counted
    assert opened(wrap(LABEL), LABEL, META).reward == -3.0


def test_label_without_meta_names():
    assert kk_reward(wrap(LABEL), LABEL, {}).reward == 3.0


def test_bad_label_is_a_clear_error():
    with pytest.raises(ValueError, match="label"):
        kk_reward(wrap(LABEL), "Alice knight", {})


def test_non_string_response_never_raises():
    assert kk_reward(None, LABEL, META).reward == -3.0  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text",
    [
        "(1) Alice is a knight\n(2) Bob is a knave\n(3) Carol is a knight",
        "(3) Carol is a knight\n(1) Alice is a knight\n(2) Bob is a knave",
        "Alice is a Knight.\nBob is a KNAVE.\nCarol is a knight.",
        "1. alice is a knight;  2. bob   is   a knave; 3. carol is a knight",
        "Alice: Knight\nBob: Knave\nCarol: Knight",
        "**Alice** is a **knight**, Bob is not a knight, and Carol is a knight!",
        "(1)Alice is an knight (2)Bob is a knave (3)Carol is a knight",
    ],
)
def test_parse_variants(text):
    assert parse_kk_answer(text, NAMES) == {"Alice": True, "Bob": False, "Carol": True}


@pytest.mark.parametrize(
    "text", ["", "Alice is a knight", "Alice is a knight, Bob is a knave, Carol is a knight or a knave", None]
)
def test_parse_rejects(text):
    assert parse_kk_answer(text, NAMES) is None


def test_names_that_contain_each_other():
    names = ["Ann", "Anna"]
    assert parse_kk_answer("Anna is a knave\nAnn is a knight", names) == {"Ann": True, "Anna": False}


def test_format_ok_hand_cases():
    assert kk_format_ok("<think>x</think><answer>y</answer>")
    assert kk_format_ok("  <think>\nx\n</think>\n\n<answer>y</answer><|im_end|>")
    assert not kk_format_ok("<think>x</think>")
    assert kk_format_ok("x</think><answer>y</answer>", think_opened_in_prompt=True)


_SEP = st.sampled_from(["\n", "\n\n", "; ", ", ", " \n "])
_PUNCT = st.sampled_from(["", ".", "!", ";", " ."])


@settings(max_examples=80, deadline=None)
@given(roles=st.lists(st.booleans(), min_size=2, max_size=8), data=st.data())
def test_property_parse_roundtrip(roles, data):
    names = list(kk.NAMES[: len(roles)])
    order = data.draw(st.permutations(range(len(roles))))
    numbered = data.draw(st.booleans())
    lines = []
    for k, i in enumerate(order, 1):
        spellings = ["knight", "Knight", "KNIGHT"] if roles[i] else ["knave", "Knave", "KNAVE"]
        word = data.draw(st.sampled_from(spellings))
        name = data.draw(st.sampled_from([names[i], names[i].lower(), names[i].upper()]))
        spaces = " " * data.draw(st.integers(1, 3))
        prefix = f"({k}){spaces}" if numbered else ""
        lines.append(f"{prefix}{name}{spaces}is a {word}{data.draw(_PUNCT)}")
    text = data.draw(_SEP).join(lines)
    assert parse_kk_answer(text, names) == dict(zip(names, roles, strict=True))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 100_000), n=st.integers(2, 8), flip=st.integers(0, 7))
def test_property_generated_puzzle_reward(seed, n, flip):
    puzzle = kk.generate_puzzle(n, random.Random(seed))
    row = kk.kk_row(puzzle)
    assert kk_reward(wrap(row["label"]), row["label"], row["meta"]).reward == 3.0
    wrong = list(puzzle.solution)
    wrong[flip % n] = not wrong[flip % n]
    wrong_text = kk.format_solution(puzzle.names, wrong)
    result = kk_reward(wrap(wrong_text), row["label"], row["meta"])
    assert result.reward == -0.5 and not result.correct


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=300))
def test_property_never_raises_on_model_output(text):
    result = kk_reward(text, LABEL, META)
    assert result.reward in (3.0, -0.5, -1.0, -3.0)
    assert result.correct == (result.reward == 3.0)


@pytest.mark.parametrize(
    "answer",
    [
        "Zoey is a knight (or maybe a knave)",
        "Zoey is a knight and a knave",
        "Zoey is a knight, or possibly a knave",
        "Zoey is a knight or a knave",
        "Zoey: knight/knave",
    ],
)
def test_hedged_or_contradictory_roles_are_unparsable(answer):
    """Logic-RL gives -1 (well formed, unparsable) for these; the first role used to decide."""
    names, label = ["Zoey", "Ethan"], "(1) Zoey is a knight\n(2) Ethan is a knave"
    text = f"{answer}\nEthan is a knave"
    assert parse_kk_answer(text, names) is None
    assert kk_reward(wrap(text), label, {"names": names}).reward == -1.0


@pytest.mark.parametrize(
    "text",
    [
        "Zoey is a knight, and Ethan is a knave",
        "Zoey is not a knave but a knight\nEthan is a knave",
        "Zoey is a knight, not a knave. Ethan is a knave",
    ],
)
def test_one_role_per_clause(text):
    assert parse_kk_answer(text, ["Zoey", "Ethan"]) == {"Zoey": True, "Ethan": False}


LOGIC_RL = make_kk_reward(KKRewardConfig(parser="logic_rl"))


@pytest.mark.parametrize(
    "answer, reward",
    [
        (LABEL, 3.0),
        ("Carol is a knight, Alice is a knight and Bob is a knave", 3.0),  # any order, one line
        ("(1) Alice is a knight\n(2) Bob is a knight\n(3) Carol is a knight", -0.5),
        ("Alice: knight\nBob: knave\nCarol: knight", -1.0),  # no "is a" statement
        ("**Alice** is a knight\nBob is a knave\nCarol is a knight", -1.0),  # bold name: "** is" breaks \b...\s+is
        ("Alice is an knight\nBob is a knave\nCarol is a knight", -1.0),  # "an"
        ("Alice is a knight\nBob is a knave\nCarol is a knight\nSo: 2 knights, 1 knave.", -1.0),  # role count 5 != 3
        ("Alice is a knight\nBob is not a knight\nCarol is a knight", -1.0),  # negation: no statement for Bob
        ("Alice is a knight or a knave\nBob is a knave\nCarol is a knight", -1.0),  # hedge: role count 4
        ("Alice is a Knight\nBOB IS A KNAVE\ncarol is a knight", 3.0),  # case-insensitive
    ],
)
def test_logic_rl_parser_reproduces_the_reference_rule(answer, reward):
    assert LOGIC_RL(wrap(answer), LABEL, META).reward == reward


def test_parser_choice_from_meta_and_environment(monkeypatch):
    lenient_only = wrap("Alice: knight\nBob: knave\nCarol: knight")
    assert kk_reward(lenient_only, LABEL, META).reward == 3.0
    assert kk_reward(lenient_only, LABEL, dict(META, kk_parser="logic_rl")).reward == -1.0
    monkeypatch.setenv("ADORA_KK_PARSER", "logic_rl")
    assert kk_reward(lenient_only, LABEL, META).reward == -1.0
    assert kk_reward(lenient_only, LABEL, dict(META, kk_parser="lenient")).reward == 3.0
    with pytest.raises(ValueError, match="kk_parser"):
        kk_reward(lenient_only, LABEL, dict(META, kk_parser="strict"))


def test_recipes_choose_the_parser():
    from adora_openrlhf.recipes import build_run_config

    assert build_run_config("kk-tiny").data.kk.parser == "lenient"
    assert build_run_config("kk-qwen2.5-7b-adora").data.kk.parser == "logic_rl"
    assert build_run_config("kk-qwen2.5-7b-grpo").data.kk.parser == "logic_rl"


def test_config_parser_reaches_local_rows_and_is_validated():
    from adora_openrlhf.config import ConfigError, DataConfig
    from adora_openrlhf.rows import load_run_rows
    from adora_openrlhf.tasks.kk import KKDataConfig

    train, held = load_run_rows(
        DataConfig(num_train=3, num_eval=2, kk=KKDataConfig(num_people=[2], parser="logic_rl")), 0
    )
    assert {row.meta["kk_parser"] for row in (*train, *held)} == {"logic_rl"}
    with pytest.raises(ConfigError, match="data.kk.parser"):
        KKDataConfig(parser="strict")


_HEDGES = st.sampled_from(
    [" or a {other}", " (or maybe a {other})", " and a {other}", ", or possibly a {other}", " / {other}"]
)


@settings(max_examples=60, deadline=None)
@given(roles=st.lists(st.booleans(), min_size=2, max_size=6), data=st.data())
def test_property_a_second_role_makes_the_answer_unparsable(roles, data):
    names = list(kk.NAMES[: len(roles)])
    hedged = data.draw(st.integers(0, len(roles) - 1))
    lines = []
    for i, (name, knight) in enumerate(zip(names, roles, strict=True)):
        role, other = ("knight", "knave") if knight else ("knave", "knight")
        line = f"({i + 1}) {name} is a {role}"
        if i == hedged:
            line += data.draw(_HEDGES).format(other=other)
        lines.append(line)
    text = "\n".join(lines)
    assert parse_kk_answer(text, names) is None
    assert parse_kk_answer_logic_rl(text, names) is None


# ---------------------------------------------------------------------------------------------------------
# Bounded grading: every path reads the response in linear time, and the old patterns' answers are kept
# ---------------------------------------------------------------------------------------------------------

# The patterns before they were made linear, kept as the reference of what they matched.
OLD_NAME_PATTERN = r"(?<![A-Za-z]){name}(?![A-Za-z])[\s\*_]*(?:is|was|:|=|-|—)?\s*(?P<neg>not\s+)?(?:an?\s+)?\**(?P<role>knight|knave)s?\b"
OLD_LABEL_LINE = r"^\s*\(?\s*\d+\s*\)?[.:]?\s*(?P<name>.+?)\s+is\s+an?\s+(?P<role>knight|knave)\b"


@pytest.mark.parametrize(
    "answer",
    [
        "Alice" + " " * 64_000 + "x",  # 33 s per response with the old name pattern
        "Alice" + "*" * 64_000 + "x",
        "Alice" + " _*" * 20_000 + "x",
        "Alice is not" + " " * 64_000 + "x",
        "Alice is a knight " * 5_000,  # one line: each match searched for the line end to the end of the text
        "Alice " * 20_000,
    ],
)
@pytest.mark.parametrize("parser", ["lenient", "logic_rl"])
def test_adversarial_answers_are_parsed_in_linear_time(answer, parser):
    import time

    start = time.monotonic()
    result = kk_reward(wrap(answer), LABEL, dict(META, kk_parser=parser))
    assert time.monotonic() - start < 1.0
    assert result.reward <= -0.5 and not result.correct  # never above a well-formed wrong answer


@pytest.mark.parametrize(
    "text", ["<answer>" * 50_000, "<answer>x" * 30_000 + "</answer>", "</answer><answer>" * 30_000]
)
def test_answer_block_scan_is_linear(text):
    import re
    import time

    from adora_openrlhf.rewards.kk import extract_answer_block

    start = time.monotonic()
    block = extract_answer_block(text)
    assert time.monotonic() - start < 0.5
    small = text[:2000]
    found = re.findall(r"<answer>(.*?)</answer>", small, flags=re.DOTALL)
    assert extract_answer_block(small) == (found[-1].strip() if found else None)
    assert block is None or isinstance(block, str)


def test_label_lines_are_parsed_in_linear_time():
    import time

    from adora_openrlhf.rewards.kk import parse_kk_label

    start = time.monotonic()
    for line in ("(1) Alice" + " " * 64_000 + "x", "1" + " " * 64_000 + "x", " " * 64_000 + "(1) Alice is a knave x"):
        with pytest.raises(ValueError, match="label: line"):
            parse_kk_label(line if "knave" not in line else line + "\n2 Bob")
    assert time.monotonic() - start < 1.0


_TOKENS = [
    "Alice",
    "Bob",
    " ",
    "  ",
    "\n",
    "*",
    "_",
    ":",
    "-",
    "is",
    "was",
    "not",
    "a",
    "an",
    "knight",
    "knave",
    "s",
    "x",
    ".",
]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_TOKENS), max_size=12))
def test_property_name_pattern_matches_as_the_old_one(tokens):
    import re

    from adora_openrlhf.rewards.kk import _name_pattern

    text = "".join(tokens)
    for name in ("Alice", "Bob"):
        old = [
            (m.span(), m.group("neg"), m.group("role"))
            for m in re.finditer(OLD_NAME_PATTERN.format(name=name), text, re.IGNORECASE)
        ]
        new = [(m.span(), m.group("neg"), m.group("role")) for m in _name_pattern(name).finditer(text)]
        assert old == new, text


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            ["(", ")", "1", "2", ".", ":", " ", "  ", "Alice", "Bob", "Le", "is", "a", "an", "knight", "knave", "x"]
        ),
        max_size=12,
    )
)
def test_property_label_lines_parse_as_before(tokens):
    import re

    from adora_openrlhf.rewards.kk import parse_kk_label

    line = "".join(tokens).strip()
    old = re.match(OLD_LABEL_LINE, line, re.IGNORECASE)
    old_roles = (
        {old.group("name").strip(): old.group("role").lower() == "knight"}
        if old and old.group("name").strip()
        else None
    )
    try:
        new_roles = parse_kk_label(line) if line else None
    except ValueError:
        new_roles = None
    assert new_roles == old_roles, line


def test_failure_reward_is_the_lowest_reward():
    from adora_openrlhf.rewards.base import failure_reward
    from adora_openrlhf.rewards.kk import lowest_reward

    assert failure_reward("kk", META) == -3.0 == kk_reward("no tags", LABEL, META).reward
    assert lowest_reward(KKRewardConfig(grade_only_if_format_ok=False, answer_wrong=-2.5)) == -3.5


@pytest.mark.parametrize("value", ["false", "true", 0, 1, None])
def test_row_flags_must_be_booleans(value):
    """meta.think_opened_in_prompt "false" read with bool() turned the option on."""
    from adora_openrlhf.rewards.geometry import geometry_reward

    with pytest.raises(ValueError, match=rf"meta.think_opened_in_prompt: must be true or false, got {value!r}"):
        kk_reward(wrap(LABEL), LABEL, dict(META, think_opened_in_prompt=value))
    with pytest.raises(ValueError, match="meta.think_opened_in_prompt"):
        geometry_reward("<think>r</think>\\boxed{6}", "6", {"think_opened_in_prompt": value})
    assert kk_reward(wrap(LABEL), LABEL, dict(META, think_opened_in_prompt=False)).reward == 3.0
