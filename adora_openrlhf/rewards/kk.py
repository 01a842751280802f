"""Knights-and-Knaves reward in the Logic-RL style: a format term plus an answer term.

``reward = format_score + answer_score`` with (defaults = Logic-RL's constants)

* ``format_score = +format_reward`` when the response holds exactly one ``<think>``, ``</think>``,
  ``<answer>`` and ``</answer>`` in that order, else ``-format_reward`` (``format_reward = 1``);
* ``answer_score`` (graded only when the format holds, as in Logic-RL; otherwise ``answer_unparsable``):
  ``+2`` when every person's role matches the label, ``-1.5`` when the answer parses but some role is
  wrong, ``-2`` when it cannot be parsed (a name missing, or a name given both roles).

Two answer parsers (``KKRewardConfig.parser``, or per row ``meta["kk_parser"]``, or run-wide the
``ADORA_KK_PARSER`` environment variable): ``lenient`` (:func:`parse_kk_answer`, accepts phrasing
variants) and ``logic_rl`` (:func:`parse_kk_answer_logic_rl`, Logic-RL's role-count rule and
"Name is a knight" statements exactly, the training signal the ADORA K&K results were trained with).

So a correct, well-formed response scores 3.0, a well-formed wrong one -0.5, a well-formed unparsable
one -1, and any malformed response -3. ``correct`` is True exactly when the answer was graded and every
role matches. -3 is also the task's failure reward (:func:`adora_openrlhf.rewards.base.failure_reward`).

Grading is linear in the response length: the tag checks count and find, the answer block is found
with ``str.find``, and no pattern has two quantifiers that can match the same characters next to each
other (the lenient parser's ``Name`` + 32k spaces took 33 s per response when one did).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from adora_openrlhf.rewards.base import RewardResult, meta_flag, register_reward
from adora_openrlhf.rewards.text import last_tagged_block

THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<think>", "</think>", "<answer>", "</answer>"


@dataclass(frozen=True)
class KKRewardConfig:
    """Constants of the K&K reward (defaults: Logic-RL's ``kk.py`` reward)."""

    format_reward: float = 1.0  # +this for a well-formed response, -this otherwise
    answer_correct: float = 2.0  # every role right
    answer_wrong: float = -1.5  # parsed, at least one role wrong
    answer_unparsable: float = -2.0  # no answer block, a name missing, contradictory roles, or format failed
    grade_only_if_format_ok: bool = True  # Logic-RL: a malformed response gets answer_unparsable without grading
    think_opened_in_prompt: bool = False  # the prompt template already ends with "<think>"; the response lacks it
    parser: str = "lenient"  # answer parser: "lenient" (phrasing variants) | "logic_rl" (Logic-RL's rule exactly)

    def __post_init__(self) -> None:
        if self.parser not in KK_PARSERS:
            raise ValueError(
                f"kk_parser: unknown K&K answer parser {self.parser!r}; choose one of {sorted(KK_PARSERS)}"
            )


_LABEL_NUMBER = re.compile(r"\s*(?:\(\s*)?\d+(?:\s*\))?[.:]?\s*")  # "(1) ", "1. ", "2: "
# from the start of a space run
_LABEL_ROLE = re.compile(r"(?<!\s)\s+is\s+an?\s+(?P<role>knight|knave)\b", re.IGNORECASE)


def kk_format_ok(response: str, think_opened_in_prompt: bool = False) -> bool:
    """True when each of the four tags occurs exactly once, ordered think, /think, answer, /answer."""
    text = THINK_OPEN + response if think_opened_in_prompt else response
    tags = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
    if any(text.count(tag) != 1 for tag in tags):
        return False
    positions = [text.find(tag) for tag in tags]
    return positions == sorted(positions)


def extract_answer_block(response: str) -> str | None:
    """Contents of the last ``<answer>...</answer>`` block, stripped; None when there is none."""
    block = last_tagged_block(response, ANSWER_OPEN, ANSWER_CLOSE)
    return block.strip() if block is not None else None


def _name_pattern(name: str) -> re.Pattern[str]:
    # "<Name> is a knight", "<Name>: Knave.", "<Name> - knight", "<Name> is not a knave", with any spacing/case.
    # The gap of spaces, stars and underscores after the name is taken whole, never given back: "(?=(X))\1" is an
    # atomic group in Python's re. Given back, each of its n characters could be re-read by the optional "\s*"
    # and "\**" after it, n^2 steps when no role follows (Name + 16k spaces: 8 s).
    return re.compile(
        rf"(?<![A-Za-z]){re.escape(name)}(?![A-Za-z])(?=(?P<gap>[\s\*_]*))(?P=gap)(?:(?:is|was|:|=|-|—)\s*)?"
        r"(?P<neg>not\s+)?(?:an?\s+)?\**(?P<role>knight|knave)s?\b",
        re.IGNORECASE,
    )


_ROLE_WORD = re.compile(r"(?P<neg>\bnot\s+)?(?:\ban?\s+)?(?P<role>knight|knave)", re.IGNORECASE)


def _any_name(names: Sequence[str]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.compile(rf"(?<![A-Za-z])(?:{alternatives})(?![A-Za-z])", re.IGNORECASE)


def _is_knight(match: re.Match[str]) -> bool:
    return (match.group("role").lower() == "knight") != bool(match.group("neg"))


def parse_kk_answer(text: str | None, names: Sequence[str]) -> dict[str, bool] | None:
    """Roles stated in ``text`` for every name (True = knight), or None when any name has no role or two roles.

    The lenient parser. Accepts "(k) Name is a knight" lines in any order, with or without numbers, any
    case, extra spaces and punctuation ("Knight.", "knave;"), "Name: knave", bold names, and "Name is not
    a knight" (read as a knave). Every role word in the rest of a statement's clause (up to the next
    person's name or line break) is a role given to that person too, so a hedge or a contradiction ("a
    knight (or maybe a knave)", "a knight and a knave", "a knight, or possibly a knave") gives two roles.
    """
    if not text or not names:
        return None
    mentions = _any_name(names)
    roles: dict[str, bool] = {}
    for name in names:
        found = set()
        for match in _name_pattern(name).finditer(text):
            found.add(_is_knight(match))
            # the clause ends at the next name or line break; both searches stop at the next mention of a
            # name (the next match's own, at the latest), so all matches together read the text once
            next_name = mentions.search(text, match.end())
            end = next_name.start() if next_name else len(text)
            line_end = text.find("\n", match.end(), end)
            end = end if line_end < 0 else line_end
            found.update(_is_knight(extra) for extra in _ROLE_WORD.finditer(text, match.end(), end))
        if len(found) != 1:
            return None
        roles[name] = found.pop()
    return roles


def parse_kk_answer_logic_rl(text: str | None, names: Sequence[str]) -> dict[str, bool] | None:
    """Roles under Logic-RL's own answer rule (True = knight), or None when it does not parse.

    Two conditions, both case-insensitive: the substrings "knight" and "knave" together occur exactly
    once per person in the whole text ("knights" counts; so does a summary line), and every name has a
    "<Name> is a knight|knave" statement (whole words, whitespace between them); the first such statement
    gives the role. "Name: knight", "Name is an knight" or "**Name** is a knight" do not parse.
    """
    if not text or not names:
        return None
    lowered = text.lower()
    if lowered.count("knight") + lowered.count("knave") != len(names):
        return None
    roles: dict[str, bool] = {}
    for name in names:
        match = re.search(rf"\b{re.escape(name)}\b\s+is\s+a\s+\b(knight|knave)\b", text, re.IGNORECASE)
        if match is None:
            return None
        roles[name] = match.group(1).lower() == "knight"
    return roles


KK_PARSERS: dict[str, Callable[[str | None, Sequence[str]], dict[str, bool] | None]] = {
    "lenient": parse_kk_answer,
    "logic_rl": parse_kk_answer_logic_rl,
}
KK_PARSER_ENV = "ADORA_KK_PARSER"  # run-wide parser choice when a row's meta names none
DEFAULT_KK_REWARD_CONFIG = KKRewardConfig()


def parse_kk_label(label: str, names: Sequence[str] | None = None) -> dict[str, bool]:
    """Ground-truth roles from a canonical solution text; raises ValueError naming the label when malformed."""
    if names:
        roles = parse_kk_answer(label, names)
        if roles is None:
            raise ValueError(f"label: {label!r} does not state one role for each of {list(names)}")
        return roles
    roles = {}
    for line in label.strip().splitlines():
        number = _LABEL_NUMBER.match(line)
        rest = line[number.end() :] if number else ""
        role = _LABEL_ROLE.search(rest)
        name = rest[: role.start()].strip() if role else ""
        if not name:
            raise ValueError(f"label: line {line[:200]!r} is not of the form '(k) Name is a knight/knave'")
        roles[name] = role.group("role").lower() == "knight"
    if not roles:
        raise ValueError("label: empty K&K solution text")
    return roles


def score_kk(response: str, label: str, meta: Mapping[str, Any], config: KKRewardConfig) -> RewardResult:
    """The Logic-RL reward of one response (see the module docstring for the formula)."""
    names = meta.get("names") if isinstance(meta, Mapping) else None
    truth = parse_kk_label(label, names)
    response = response if isinstance(response, str) else ""
    well_formed = kk_format_ok(response, config.think_opened_in_prompt)
    format_score = config.format_reward if well_formed else -abs(config.format_reward)
    answer = extract_answer_block(response)
    parse = KK_PARSERS[config.parser]
    predicted = parse(answer, list(truth)) if (well_formed or not config.grade_only_if_format_ok) else None
    if predicted is None:
        answer_score, correct = config.answer_unparsable, False
    elif predicted == truth:
        answer_score, correct = config.answer_correct, True
    else:
        answer_score, correct = config.answer_wrong, False
    info = {
        "format_ok": float(well_formed),
        "answer_parsed": float(predicted is not None),
        "format_score": float(format_score),
        "answer_score": float(answer_score),
    }
    return RewardResult(reward=float(format_score + answer_score), correct=correct, extracted=answer, info=info)


def make_kk_reward(config: KKRewardConfig):
    """A reward function ``(response, label, meta) -> RewardResult`` bound to ``config``."""

    def reward(response: str, label: str, meta: Mapping[str, Any]) -> RewardResult:
        return score_kk(response, label, meta, config)

    return reward


def kk_config_for(meta: Mapping[str, Any], config: KKRewardConfig) -> KKRewardConfig:
    """``config`` with the row's overrides: ``meta["think_opened_in_prompt"]`` and the answer parser
    (``meta["kk_parser"]``, else the ``ADORA_KK_PARSER`` environment variable, else ``config.parser``)."""
    changes: dict[str, Any] = {}
    if "think_opened_in_prompt" in meta:
        changes["think_opened_in_prompt"] = meta_flag(meta, "think_opened_in_prompt")
    parser = meta.get("kk_parser") or os.environ.get(KK_PARSER_ENV)
    if parser:
        changes["parser"] = str(parser)
    return replace(config, **changes) if changes else config


def lowest_reward(config: KKRewardConfig) -> float:
    """The lowest reward under ``config``: a malformed response, graded as unparsable (or as wrong, when
    malformed responses are graded and that scores lower)."""
    answer = (
        min(config.answer_unparsable, config.answer_wrong)
        if not config.grade_only_if_format_ok
        else config.answer_unparsable
    )
    return -abs(config.format_reward) + answer


@register_reward("kk", failure=lowest_reward(DEFAULT_KK_REWARD_CONFIG))
def kk_reward(
    response: str, label: str, meta: Mapping[str, Any], config: KKRewardConfig = DEFAULT_KK_REWARD_CONFIG
) -> RewardResult:
    """K&K reward with Logic-RL's constants; the row's meta may override the parser and the think flag."""
    meta = meta if isinstance(meta, Mapping) else {}
    return score_kk(response, label, meta, kk_config_for(meta, config))
