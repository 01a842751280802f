"""Visual-math reward for Geometry3K and MathVista: multiple choice, numeric with tolerance, free form.

The answer is read from the text after the last ``</think>``: the last ``<answer>...</answer>`` block,
else the last ``\\boxed{}``, else the last line (after "answer is" / "Answer:" when present). It is graded by the row's ``meta``:

* ``multi_choice`` (``meta["choices"]``): the answer names an option by its text or, failing that, by
  letter ("B", "(B)", "Option B"); correct when that option is the one the label names the same way.
* ``answer_type`` ``integer`` / ``float``: the first number in the answer, normalised as MathVista's scorer
  does, equals the label: an integer answer is truncated (``str(int(float(x)))``: 4.6 -> 4), a float
  answer rounded to ``d = max(precision, decimals the label is written with)`` decimals, the label too
  (so a float is never compared at fewer decimals than its label has: 1.6 is not 2.5). A float row without
  ``precision`` states no tolerance: the answer must equal the label as written (3.0 is 3; 2.6 is not).
* otherwise (free form, Geometry3K): the math grader (``math-verify``, never raises, time-limited:
  ``timeout_s`` 10 s, or the row's ``meta["grader_timeout_s"]`` as for math rows); when
  ``meta["choices"]`` exist a letter answer is first mapped to its option's text.

``reward = (1 - format_weight) * accuracy + format_weight * format_ok`` where ``format_ok`` means one
``<think>...</think>`` block followed by a final answer (``\\boxed{}`` or ``<answer>``); ``correct`` is
``accuracy == 1``. A grader timeout or crash counts as accuracy 0 (so it scores as a wrong answer of the
same format) and is reported in ``info``. 0, the reward of an unformatted wrong answer, is the task's
failure reward. Everything but the math grader's call (time-limited) reads the response in linear time.
"""

from __future__ import annotations

import decimal
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from adora_openrlhf.rewards.base import RewardResult, meta_flag, register_reward
from adora_openrlhf.rewards.math import REWARD_STYLES, final_segment, normalize_answer_line, safe_grade
from adora_openrlhf.rewards.text import has_nonempty_tagged_block, last_tagged_block

_NUMBER = re.compile(r"[-+]?(?:\d+(?:,\d{3})*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
# A letter naming an option ("B", "(B)", "Option B", "choice (b)."), followed by the end, a space or ")", ".", ":".
_LETTER = re.compile(r"^\s*(?:(?:option|choice)\s*)?(?:\(\s*)?([A-Za-z])(?![^\s\).:])", re.IGNORECASE)
# "answer", "answer is", "answer:" ... : what follows on the line is the stated answer.
_STATED = re.compile(r"(?i)\banswer(?:\s*is)?\s*:?")


@dataclass(frozen=True)
class GeometryRewardConfig:
    """Weights of the visual-math reward (defaults follow the EasyR1 Geometry3K recipe)."""

    format_weight: float = 0.1  # share of the reward given for the <think> + final-answer format
    require_think: bool = True  # the format check needs a <think>...</think> block
    think_opened_in_prompt: bool = False  # the prompt template already ends with "<think>"


DEFAULT_GEOMETRY_CONFIG = GeometryRewardConfig()


def _last_boxed(text: str) -> str | None:
    starts = [m.end() for m in re.finditer(r"\\boxed\s*\{", text)]
    if not starts:
        return None
    i, depth = starts[-1], 1
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[starts[-1] : i - 1].strip() if depth == 0 else None


def extract_final_answer(response: str) -> str | None:
    """The final answer: last <answer> block, else last \\boxed{}, else the last non-empty line."""
    tail = final_segment(response)
    block = last_tagged_block(tail, "<answer>", "</answer>")
    if block is not None:
        inner = block.strip()
        return _last_boxed(inner) or inner
    boxed = _last_boxed(tail)
    if boxed is not None:
        return boxed
    lines = [line.strip() for line in tail.strip().splitlines() if line.strip()]
    if not lines:
        return None
    stated = _STATED.search(lines[-1])
    after = lines[-1][stated.end() :].strip() if stated else ""
    return after or lines[-1]


def geometry_format_ok(response: str, config: GeometryRewardConfig) -> bool:
    """One <think>...</think> block (when required) followed by \\boxed{} or <answer>...</answer>."""
    text = "<think>" + response if config.think_opened_in_prompt else response
    if config.require_think and (
        text.count("<think>") != 1 or text.count("</think>") != 1 or text.find("<think>") > text.find("</think>")
    ):
        return False
    tail = final_segment(text)
    return _last_boxed(tail) is not None or has_nonempty_tagged_block(tail, "<answer>", "</answer>")


def choice_index(answer: str, choices: Sequence[str]) -> int | None:
    """Index of the option an answer names: its exact text first, else a letter ("B", "(B)", "Option B").

    Texts come first because an option may itself start with a lone letter ("a logarithmic function",
    "(b)", "d + e = f + j"); read as a letter it would name the wrong option.
    """
    text = normalize_answer_line(answer)
    normalized = [normalize_answer_line(c).lower() for c in choices]
    if text.lower() in normalized:
        return normalized.index(text.lower())
    match = _LETTER.match(text)
    if match:
        index = ord(match.group(1).upper()) - ord("A")
        if 0 <= index < len(choices):
            return index
    return None


def _first_number_text(text: str) -> str | None:
    match = _NUMBER.search(normalize_answer_line(text))
    return match.group(0).replace(",", "") if match else None


def first_number(text: str) -> float | None:
    """The first number written in ``text`` (``1,200`` -> 1200.0), or None."""
    number = _first_number_text(text)
    try:
        return float(number) if number is not None else None
    except ValueError:
        return None


def decimals_written(number: str) -> int:
    """Decimal places a number is written with: ``"2.50"`` -> 2, ``"3"`` -> 0, ``"1e-3"`` -> 3."""
    try:
        exponent = decimal.Decimal(number).as_tuple().exponent
    except decimal.InvalidOperation:
        return 0
    return max(0, -exponent) if isinstance(exponent, int) else 0


def numeric_equal(answer: str, label: str, precision: int | None, answer_type: str = "float") -> bool:
    """MathVista's numeric normalisation (its ``normalize_extracted_answer``) on the first number of each side.

    ``integer``: ``int(pred) == label``, ``int`` truncating as MathVista's ``str(int(float(x)))`` does (label 5:
    5.9 is right, 4.6 is wrong); a label that is not a whole number matches nothing.
    ``float`` with a ``precision`` p (MathVista gives every float one): ``round(pred, d) == round(label, d)`` with
    ``d = max(p, decimals of the label)``: never fewer decimals than the label is written with (label 2.50 with
    p = 1: d = 2, so 2.54 is wrong).
    ``float`` without a precision (``None``): no tolerance is stated, so the written numbers must be equal
    (``Decimal(pred) == Decimal(label)``: 3.0 and 3 match; label 3 rejects 2.6 and 3.49, label 3.14 rejects
    3.14159). Rounding the answer to the label's own decimals would let a coarse label such as 3 accept
    anything from 2.5 to 3.49.
    """
    pred, gold_text = first_number(answer), _first_number_text(label)
    gold = first_number(label)
    if pred is None or gold is None or gold_text is None or not (math.isfinite(pred) and math.isfinite(gold)):
        return False
    if answer_type == "integer":
        return gold == int(gold) and int(pred) == int(gold)
    if precision is None:
        pred_text = _first_number_text(answer)
        try:
            return decimal.Decimal(pred_text) == decimal.Decimal(gold_text)
        except (decimal.InvalidOperation, TypeError):
            return False
    places = max(int(precision), decimals_written(gold_text))
    return round(pred, places) == round(gold, places)


def _precision(meta: Mapping[str, Any]) -> int | None:
    """``meta["precision"]`` as decimals (MathVista stores floats such as 2.0); None when absent or unreadable
    (then a float answer must equal the label as written, :func:`numeric_equal`)."""
    if meta.get("precision") is None:
        return None
    try:
        return max(0, int(meta["precision"]))
    except (TypeError, ValueError, OverflowError):
        return None


def score_geometry(response: str, label: str, meta: Mapping[str, Any], config: GeometryRewardConfig) -> RewardResult:
    """Reward of one response (see the module docstring for the rules)."""
    response = response if isinstance(response, str) else ""
    meta = meta if isinstance(meta, Mapping) else {}
    answer = extract_final_answer(response)
    info = {"grader_timeout": 0.0, "grader_error": 0.0}
    choices = meta.get("choices") or None
    question_type = meta.get("question_type", "free_form")
    answer_type = meta.get("answer_type", "text")
    correct = False
    if answer is not None:
        if question_type == "multi_choice" and choices:
            index = choice_index(answer, choices)
            gold = choice_index(label, choices)
            correct = index is not None and index == gold
        elif answer_type in ("integer", "float"):
            correct = numeric_equal(answer, label, _precision(meta), answer_type)
        else:
            if choices:
                index = choice_index(answer, choices)
                if index is not None and re.fullmatch(r"\(?[A-Za-z]\)?\.?", normalize_answer_line(answer)):
                    answer = choices[index]
            grader = REWARD_STYLES["math_verify"]
            if "grader_timeout_s" in meta:
                grader = replace(grader, timeout_s=float(meta["grader_timeout_s"]))
            status, correct, _, _ = safe_grade(f"\\boxed{{{answer}}}", label, grader)
            info["grader_timeout"] = float(status == "timeout")
            info["grader_error"] = float(status == "error")
            if not correct and normalize_answer_line(answer).lower() == normalize_answer_line(label).lower():
                correct = True
    formatted = geometry_format_ok(response, config)
    info["format_ok"] = float(formatted)
    info["accuracy"] = float(correct)
    reward = (1.0 - config.format_weight) * float(correct) + config.format_weight * float(formatted)
    return RewardResult(reward=reward, correct=bool(correct), extracted=answer, info=info)


@register_reward("geometry3k", "mathvista", "geo_synth", failure=0.0)
def geometry_reward(
    response: str, label: str, meta: Mapping[str, Any], config: GeometryRewardConfig = DEFAULT_GEOMETRY_CONFIG
) -> RewardResult:
    """Geometry3K / MathVista reward; ``meta["think_opened_in_prompt"]`` overrides the config flag."""
    if isinstance(meta, Mapping) and "think_opened_in_prompt" in meta:
        config = replace(config, think_opened_in_prompt=meta_flag(meta, "think_opened_in_prompt"))
    return score_geometry(response, label, meta, config)
