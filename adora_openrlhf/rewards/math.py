"""Math reward: answer checking with ``math-verify``, safe to call from any thread, plus DAPO's "Answer:" rule.

Two reward styles, chosen per row by ``meta["reward_style"]`` (default ``"math_verify"``):

* ``math_verify`` -- the gold label and the response (the text after the last ``</think>``) are parsed by
  ``math_verify.parse`` (``\\boxed{}`` first, then "final answer" anchors, then the last LaTeX or plain
  expression; fractions, LaTeX, units, sets and intervals are normalised) and compared with
  ``math_verify.verify``. Reward: ``correct_reward`` (1) if equal, else ``wrong_reward`` (0).
* ``dapo`` -- DAPO-Math-17k's rule: the answer is the last ``Answer: ...`` line in the last 300
  characters; after stripping ``$``, ``\\boxed{}``, ``\\text{}``, ``\\overline{}``, thousands separators and a
  final period, the text after its last ``=`` without degree signs and unit words is compared as an
  integer with the label (math-verify is used only when the label is not an integer). Reward: +1 if
  equal, else -1.

Both read the text after the last ``</think>`` (``meta["answer_scope"] = "after_think"``, the default);
``"whole"`` reads the whole response, as verl's ``math_dapo.py`` does.

Grading never raises and never hangs a training step: each call returns within its wall-clock limit
(``timeout_s``) from any thread, the main one included. The call is sent to a pool of grading
subprocesses (``rewards/grader_pool.py``, one worker per concurrent caller, started on first use; the
start-up is not counted against a call). The worker grades under a ``SIGALRM`` timer in its own main
thread; a worker that does not answer in time (a big-integer power such as ``10^{10^{10}}`` runs in C
where no signal reaches it) is killed and replaced. ``mode="inline"`` grades in the calling main thread
under the timer alone, which such C-level work can overrun. A timeout scores the style's
``wrong_reward`` (0, DAPO -1) with ``info["grader_timeout"] = 1``, and so does any other grading failure,
with ``info["grader_error"] = 1``: an answer that makes grading fail never scores above a wrong one.

The patterns of this module run in time linear in the response length (no nested or adjacent quantifiers
that can match the same characters); math-verify's own parsing is bounded by the time limit.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from adora_openrlhf.rewards.base import RewardResult, register_reward
from adora_openrlhf.rewards.grader_pool import GradeFn, ProcessGrader, run_with_alarm

logger = logging.getLogger(__name__)

MATH_SOURCES = ("dapo_math", "math500", "aime24", "aime25", "amc23")


@dataclass(frozen=True)
class MathRewardConfig:
    """How one math response is graded and scored."""

    style: str = "math_verify"  # "math_verify" (boxed / last expression) | "dapo" (last "Answer:" line)
    correct_reward: float = 1.0  # reward of a correct answer
    wrong_reward: float = 0.0  # reward of a wrong or missing answer (DAPO: -1), and of a grading timeout or crash
    answer_after_think: bool = True  # grade only the text after the last "</think>" when there is one
    dapo_tail_chars: int = 300  # DAPO looks for "Answer:" only in the last this many characters
    timeout_s: float = 10.0  # wall-clock limit of one grading call
    mode: str = "auto"  # "auto" / "process": process grader, a hard limit | "inline": main-thread alarm, no worker
    float_rounding: int = 6  # math-verify: decimals kept when comparing floats

    def __post_init__(self) -> None:
        if self.style not in REWARD_STYLES_NAMES:
            raise ValueError(f"reward_style: unknown style {self.style!r}; choose one of {list(REWARD_STYLES_NAMES)}")
        if self.mode not in ("auto", "inline", "process"):
            raise ValueError(f"mode: unknown grading mode {self.mode!r}; choose auto, inline or process")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s: must be > 0, got {self.timeout_s}")
        if not self.wrong_reward < self.correct_reward:
            raise ValueError(
                f"wrong_reward: must be below correct_reward ({self.correct_reward}), got {self.wrong_reward}"
            )


REWARD_STYLES_NAMES = ("math_verify", "dapo")
ANSWER_SCOPES = {"after_think": True, "whole": False}  # meta["answer_scope"] -> MathRewardConfig.answer_after_think
REWARD_STYLES: dict[str, MathRewardConfig] = {
    "math_verify": MathRewardConfig(),
    "dapo": MathRewardConfig(style="dapo", wrong_reward=-1.0),
}


# ----------------------------------------------------------------------------------------------------------
# Pure extraction helpers
# ----------------------------------------------------------------------------------------------------------


def final_segment(response: str) -> str:
    """The text after the last ``</think>``, or the whole response when there is none."""
    return response.rsplit("</think>", 1)[1] if "</think>" in response else response


def _unwrap(text: str, command: str) -> str:
    """Replace ``\\command{inner}`` by ``inner`` (balanced braces), for every occurrence."""
    out, i = [], 0
    token = "\\" + command + "{"
    while True:
        j = text.find(token, i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:j])
        depth, k = 1, j + len(token)
        while k < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            k += 1
        out.append(text[j + len(token) : k - 1 if depth == 0 else k])
        i = k


def extract_answer_line(response: str, tail_chars: int = 300) -> str | None:
    """DAPO: the content of the last ``Answer: ...`` line within the last ``tail_chars`` characters."""
    matches = re.findall(r"(?i)answer\s*:\s*([^\n]+)", response[-tail_chars:] if tail_chars > 0 else response)
    return matches[-1].strip() if matches else None


def normalize_answer_line(answer: str) -> str:
    """Strip ``$``, ``\\boxed{}``, ``\\text{}``, ``\\overline{}``, ``\\(\\)``, thousands separators and trailing punctuation.

    Thousands separators are ``,``, ``{,}`` and ``\\,`` between a digit and a group of three digits
    (``1{,}000`` -> ``1000``); ``2, 1`` is kept as it is.
    """
    text = answer.strip()
    for command in ("boxed", "text", "textbf", "mathrm", "mbox", "overline"):
        text = _unwrap(text, command)
    text = text.replace("$", "").replace("\\(", "").replace("\\)", "").replace("\\!", "").strip()
    text = re.sub(r"(?<=\d)(?:,|\{,\}|\\,)(?=\d{3}\b)", "", text)
    return text.rstrip(".").strip()


def parse_int(text: str) -> int | None:
    """``"042"`` -> 42, ``"-7"`` -> -7, ``"3.0"`` -> 3; anything else -> None."""
    match = re.fullmatch(r"\s*([+-]?\d+)(?:\.0+)?\s*", text)
    return int(match.group(1)) if match else None


_DEGREES = re.compile(r"\^\s*(?:\{\s*)?\\circ\s*\}?|\\circ|°")
_SPACE_THOUSANDS = re.compile(r"(?<=\d)(?:\s|\\ |\\;|~)(?=\d{3}(?!\d))")
# An integer, then unit words of two or more letters, each after a "." and/or spaces ("42 sq. units", "42cm^2").
# Consecutive words must be separated: "(?:[A-Za-z]{2,}\.?\s*)+" could split one run of n letters in 2^n ways,
# which a failing match tries one by one ("7 aaa...a!" with 60 letters ran for minutes).
_NUMBER_WITH_UNIT = re.compile(r"([+-]?\d+)(?:\.0+)?\s*[A-Za-z]{2,}(?:(?:\.\s*|\s+)[A-Za-z]{2,})*\.?(?:\s*\^\{?\d\}?)?")


def answer_integer(answer: str) -> int | None:
    """The integer a normalized ``Answer:`` line states, or None.

    Beyond :func:`parse_int` (which keeps ``042``, ``+42``, ``42.0``): the text after the last ``=``
    (``x = 42``, ``n=42``), without a degree sign (``42^\\circ``, ``42^{\\circ}``), with spaces as thousands
    separators (``1 000``), and followed by unit words (``42 degrees``, ``42 square units``).
    """
    text = answer.rsplit("=", 1)[-1]
    text = _SPACE_THOUSANDS.sub("", _DEGREES.sub("", text)).strip()  # stripped: the patterns need no outer spaces
    value = parse_int(text)
    if value is None:
        match = _NUMBER_WITH_UNIT.fullmatch(text)
        value = int(match.group(1)) if match else None
    return value


# ----------------------------------------------------------------------------------------------------------
# Grading (runs inline or inside a worker process)
# ----------------------------------------------------------------------------------------------------------


def _gold_text(label: str) -> str:
    """The label as math-verify reads it: in ``$...$`` unless it holds ``\\boxed`` or an unescaped ``$``.

    An escaped ``\\$`` (a currency sign, as in MATH500's ``\\$18.90``) is not a math delimiter.
    """
    return label if ("\\boxed" in label or re.search(r"(?<!\\)\$", label)) else f"${label}$"


def any_pair_equal(gold: list, pred: list, float_rounding: int = 6) -> bool:
    """math-verify's ``verify`` on each (gold, pred) pair on its own: True when any pair is equal.

    A pair whose comparison raises counts as unequal, so one failing pair does not decide the result
    (``12:00`` parses to ``[zoo, "12:00"]``: the numeric pair raises, the string pair is equal). The first
    error is re-raised only when every pair raised. :class:`GradingTimeout` passes through.
    """
    from math_verify import verify

    first_error: Exception | None = None
    compared = False
    for g in gold:
        for p in pred:
            try:
                if verify(g, p, float_rounding=float_rounding, timeout_seconds=None, raise_on_error=True):
                    return True
                compared = True
            except Exception as err:  # noqa: BLE001 - one failing pair does not decide the result
                first_error = first_error or err
    if not compared and first_error is not None:
        raise first_error
    return False


def math_verify_equal(label: str, answer_text: str, float_rounding: int = 6) -> tuple[bool, str | None]:
    """math-verify comparison of ``answer_text`` with ``label``; returns (equal, extracted answer string).

    math-verify's own signal timeouts are disabled here (they only work in the main thread); the caller
    puts the whole call under one limit instead.
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    gold = parse(
        _gold_text(label), [LatexExtractionConfig(), ExprExtractionConfig()], parsing_timeout=None, raise_on_error=True
    )
    if not gold:
        raise ValueError(f"label: math-verify cannot parse the gold answer {label!r}")
    pred = parse(
        answer_text,
        [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()],
        parsing_timeout=None,
        raise_on_error=True,
    )
    if not pred:
        return False, None
    return any_pair_equal(gold, pred, float_rounding), str(pred[-1])


def grade_response(
    response: str,
    label: str,
    style: str,
    answer_after_think: bool = True,
    dapo_tail_chars: int = 300,
    float_rounding: int = 6,
) -> tuple[bool, str | None]:
    """(correct, extracted) of one response under ``style``; may raise (callers catch everything)."""
    text = final_segment(response) if answer_after_think else response
    if style == "dapo":
        line = extract_answer_line(text, dapo_tail_chars)
        if line is None:
            return False, None
        answer = normalize_answer_line(line)
        gold_int, pred_int = parse_int(normalize_answer_line(label)), answer_integer(answer)
        if gold_int is not None:
            return pred_int == gold_int, answer
        equal, _ = math_verify_equal(label, f"${answer}$", float_rounding)
        return equal, answer
    return math_verify_equal(label, text, float_rounding)


def warm_up() -> None:
    """What a grading worker runs before it reports ready: math-verify's imports and parser set-up."""
    with contextlib.suppress(Exception):  # a broken install shows up as errors of the calls themselves
        grade_response("\\boxed{\\frac{1}{2}}", "0.5", "math_verify")


_PROCESS_GRADER = ProcessGrader(warm_up=f"{__name__}:warm_up")
atexit.register(_PROCESS_GRADER.close)
GRADER_COUNTS = {"calls": 0, "timeouts": 0, "errors": 0}  # process-wide tally, for logging
_COUNTS_LOCK = threading.Lock()


def safe_grade(
    response: str,
    label: str,
    config: MathRewardConfig,
    grade_fn: GradeFn = grade_response,
    process_grader: ProcessGrader | None = None,
) -> tuple[str, bool, str | None, str]:
    """Grade under ``config.timeout_s`` from any thread; returns ``(status, correct, extracted, message)``.

    ``mode`` ``auto`` and ``process`` use the process grader (a hard wall-clock limit); ``inline`` uses
    the main-thread alarm (no worker, but a long C-level operation can overrun it) and falls back to the
    process grader in other threads.
    """
    args = (response, label, config.style, config.answer_after_think, config.dapo_tail_chars, config.float_rounding)
    in_main = threading.current_thread() is threading.main_thread()
    if config.mode == "inline" and in_main:
        outcome = run_with_alarm(grade_fn, args, config.timeout_s)
    else:
        outcome = (process_grader or _PROCESS_GRADER).run(grade_fn, args, config.timeout_s)
    status = outcome[0]
    with _COUNTS_LOCK:
        GRADER_COUNTS["calls"] += 1
        if status != "ok":
            GRADER_COUNTS[status + "s"] += 1
            so_far = GRADER_COUNTS[status + "s"]
    if status != "ok":
        logger.warning("math grader %s (%d so far): %s", status, so_far, outcome[3])
    return outcome


def score_math(response: str, label: str, config: MathRewardConfig, grade_fn: GradeFn = grade_response) -> RewardResult:
    """Reward of one response under ``config`` (see the module docstring)."""
    response = response if isinstance(response, str) else ""
    status, correct, extracted, _ = safe_grade(response, str(label), config, grade_fn)
    correct = correct and status == "ok"
    reward = config.correct_reward if correct else config.wrong_reward  # a timeout or a crash scores as wrong
    info = {
        "grader_timeout": float(status == "timeout"),
        "grader_error": float(status == "error"),
        "answer_found": float(extracted is not None),
    }
    return RewardResult(reward=float(reward), correct=bool(correct), extracted=extracted, info=info)


def math_config_for(meta: Mapping[str, Any] | None) -> MathRewardConfig:
    """The style's config, with optional per-row ``meta["grader_timeout_s"]`` and ``meta["answer_scope"]``."""
    meta = meta if isinstance(meta, Mapping) else {}
    style = str(meta.get("reward_style", "math_verify"))
    if style not in REWARD_STYLES:
        raise ValueError(f"meta.reward_style: unknown style {style!r}; choose one of {sorted(REWARD_STYLES)}")
    config = REWARD_STYLES[style]
    if "grader_timeout_s" in meta:
        config = replace(config, timeout_s=float(meta["grader_timeout_s"]))
    scope = meta.get("answer_scope", "after_think")
    if scope not in ANSWER_SCOPES:
        raise ValueError(f"meta.answer_scope: unknown scope {scope!r}; choose one of {list(ANSWER_SCOPES)}")
    if ANSWER_SCOPES[scope] != config.answer_after_think:
        config = replace(config, answer_after_think=ANSWER_SCOPES[scope])
    return config


def math_failure_reward(meta: Mapping[str, Any] | None) -> float:
    """The row's wrong-answer reward (its style's), the lowest a math response scores; a row whose meta does
    not parse gets the lowest of every style."""
    try:
        return math_config_for(meta).wrong_reward
    except (TypeError, ValueError):
        return min(config.wrong_reward for config in REWARD_STYLES.values())


@register_reward(*MATH_SOURCES, failure=math_failure_reward)
def math_reward(response: str, label: str, meta: Mapping[str, Any]) -> RewardResult:
    """Math reward for DAPO-Math, MATH500, AIME and AMC rows; style from ``meta["reward_style"]``."""
    return score_math(response, label, math_config_for(meta))
