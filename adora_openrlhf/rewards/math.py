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
subprocesses (:class:`ProcessGrader`, one worker per concurrent caller, started on first use; the
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
import importlib
import json
import logging
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from adora_openrlhf.rewards.base import RewardResult, register_reward

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
            raise ValueError(f"wrong_reward: must be below correct_reward ({self.correct_reward}), got {self.wrong_reward}")


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


class GradingTimeout(BaseException):
    """Raised inside a grading call that overran its limit.

    A ``BaseException``: the many ``except Exception`` blocks inside math-verify and sympy cannot swallow it.
    """


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

    gold = parse(_gold_text(label), [LatexExtractionConfig(), ExprExtractionConfig()], parsing_timeout=None, raise_on_error=True)
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
    response: str, label: str, style: str, answer_after_think: bool = True, dapo_tail_chars: int = 300, float_rounding: int = 6
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


GradeFn = Callable[..., tuple[bool, str | None]]
_REFIRE_S = 0.05  # after the limit the alarm fires again every this many seconds until the call ends


def run_with_alarm(fn: GradeFn, args: tuple, timeout_s: float) -> tuple[str, bool, str | None, str]:
    """Run ``fn(*args)`` in the main thread under a SIGALRM interval timer.

    Returns ``(status, correct, extracted, message)`` with status ``"ok"``, ``"timeout"`` or ``"error"``.
    The alarm fires at ``timeout_s`` and again every ``_REFIRE_S`` until the call ends; a call during which
    it fired is a timeout even when the code under it caught the exception and returned. A signal is
    only handled between Python bytecodes, so one long C-level operation (a big-integer power in
    mpmath/gmpy) overruns it: only the process grader bounds that.
    """
    state = {"done": False, "fired": False}

    def alarm(signum: int, frame: Any) -> None:
        state["fired"] = True
        if not state["done"]:
            raise GradingTimeout("grading overran its time limit")

    previous = signal.signal(signal.SIGALRM, alarm)
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout_s, _REFIRE_S)
            try:
                correct, extracted = fn(*args)
            finally:
                state["done"] = True
                signal.setitimer(signal.ITIMER_REAL, 0)
            outcome = ("ok", bool(correct), extracted, "")
        except GradingTimeout:
            outcome = ("timeout", False, None, f"grading overran {timeout_s}s")
        except BaseException as err:  # math-verify raises TimeoutException (a BaseException) and sympy anything
            if isinstance(err, KeyboardInterrupt):
                raise
            name = type(err).__name__
            outcome = (("timeout" if name == "TimeoutException" else "error"), False, None, f"{name}: {err}"[:300])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    if state["fired"] and outcome[0] != "timeout":  # the timeout was caught inside the graded code
        return "timeout", False, None, f"grading overran {timeout_s}s (the timeout was caught inside the grader)"
    return outcome


def _resolve(ref: str) -> GradeFn:
    """``"package.module:function"`` -> the function (how a grading function is named to a worker)."""
    module_name, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def _ref(fn: GradeFn) -> str:
    return f"{fn.__module__}:{fn.__qualname__}"


class _Worker:
    """One grading subprocess speaking JSON lines on stdin/stdout (runs :func:`worker_main`).

    The worker imports math-verify and grades one warm-up answer, then writes a ready line; a call's
    limit starts only after that.
    """

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from adora_openrlhf.rewards.math import worker_main; worker_main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
            env=env,
        )
        self._buffer = b""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def read_line(self, wait_s: float) -> dict[str, Any] | None:
        """The next JSON line, or None when none came within ``wait_s`` seconds or the worker died."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + wait_s
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def wait_ready(self, wait_s: float) -> bool:
        reply = self.read_line(wait_s)
        return bool(reply and reply.get("ready"))

    def request(self, payload: dict[str, Any], wait_s: float) -> dict[str, Any] | None:
        """Send one request; the reply, or None when none came within ``wait_s`` seconds or the worker died."""
        assert self.proc.stdin is not None
        data = memoryview(json.dumps(payload).encode() + b"\n")
        while data:  # an unbuffered pipe write may be partial
            data = data[os.write(self.proc.stdin.fileno(), data) :]
        return self.read_line(wait_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def _worker_margin(timeout_s: float) -> float:
    """How much earlier than the caller's limit a worker's own alarm fires (so it can answer in time)."""
    return min(0.5, 0.2 * timeout_s)


class ProcessGrader:
    """A pool of grading subprocesses that bounds every call by its ``timeout_s`` of wall-clock time.

    A call takes an idle worker, or starts one when every worker is busy (up to ``max_processes``, so
    concurrent callers do not queue behind each other), or, at that cap, waits for one within its limit.
    The worker grades under its own alarm set ``_worker_margin`` earlier; when no answer comes within
    the limit (a long C-level operation, a crash) the caller kills the worker and returns a timeout at
    once. A worker's start-up (imports and a warm-up grading) is not counted against the call; it is
    bounded by ``startup_timeout_s``. Plain subprocesses rather than ``multiprocessing``: nothing is
    forked from a process holding threads (torch, Ray) and the caller's ``__main__`` is never re-imported.
    """

    def __init__(self, max_processes: int = 32, startup_timeout_s: float = 120.0) -> None:
        if max_processes < 1:
            raise ValueError(f"max_processes: must be >= 1, got {max_processes}")
        self.max_processes = max_processes
        self.startup_timeout_s = startup_timeout_s
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._count = 0  # workers idle, busy or starting
        self._closed = False

    @property
    def size(self) -> int:
        """Workers alive or starting."""
        return self._count

    def _acquire(self, timeout_s: float) -> tuple[_Worker | None, bool, float]:
        """(idle worker or None, whether a new one must be started, seconds of the limit left)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                while self._idle:
                    worker = self._idle.pop()
                    if worker.alive():
                        return worker, False, deadline - time.monotonic()
                    worker.kill()
                    self._count -= 1
                if self._count < self.max_processes:
                    self._count += 1
                    return None, True, timeout_s
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None, False, 0.0
                self._cond.wait(remaining)

    def _release(self, worker: _Worker | None) -> None:
        with self._cond:
            if worker is not None and worker.alive() and not self._closed:
                self._idle.append(worker)
            else:
                if worker is not None:
                    worker.kill()
                self._count -= 1
            self._cond.notify()

    def _start(self) -> _Worker:
        worker = _Worker()
        if not worker.wait_ready(self.startup_timeout_s):
            worker.kill()
            raise RuntimeError(f"grading worker did not start within {self.startup_timeout_s}s")
        return worker

    def run(self, fn: GradeFn, args: tuple, timeout_s: float) -> tuple[str, bool, str | None, str]:
        worker, start, remaining = self._acquire(timeout_s)
        if worker is None and not start:
            return "timeout", False, None, f"no grading worker became free within {timeout_s}s ({self.max_processes} busy)"
        try:
            if start:
                worker = self._start()
            assert worker is not None
            payload = {"fn": _ref(fn), "args": list(args), "timeout_s": max(remaining - _worker_margin(remaining), 0.01)}
            reply = worker.request(payload, remaining)
            if reply is None:
                worker.kill()
                worker = None
                return "timeout", False, None, f"grading worker gave no answer within {timeout_s}s and was killed"
            if reply["status"] == "timeout":
                return "timeout", False, None, f"grading overran {timeout_s}s ({reply['message']})"
            return reply["status"], bool(reply["correct"]), reply["extracted"], reply["message"]
        except Exception as err:  # noqa: BLE001 - never raise into the training step
            if worker is not None:
                worker.kill()
            worker = None
            return "error", False, None, f"{type(err).__name__}: {err}"[:300]
        finally:
            self._release(worker)

    def close(self) -> None:
        """Kill the idle workers; busy ones are killed when their call ends."""
        with self._cond:
            self._closed = True
            workers, self._idle = self._idle, []
            self._count -= len(workers)
        for worker in workers:
            worker.kill()


def worker_main() -> None:
    """Worker loop: a ready line after the warm-up, then one JSON reply per JSON request line on stdin."""
    channel, sys.stdout = sys.stdout, sys.stderr  # stray prints from graded code cannot corrupt the replies
    with contextlib.suppress(Exception):  # a broken install shows up as errors of the calls themselves
        grade_response("\\boxed{\\frac{1}{2}}", "0.5", "math_verify")  # imports and parser set-up
    channel.write(json.dumps({"ready": True}) + "\n")
    channel.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            fn, args, limit = _resolve(request["fn"]), tuple(request["args"]), float(request["timeout_s"])
            status, correct, extracted, message = run_with_alarm(fn, args, limit)
        except Exception as err:  # noqa: BLE001
            status, correct, extracted, message = "error", False, None, f"{type(err).__name__}: {err}"[:300]
        channel.write(json.dumps({"status": status, "correct": correct, "extracted": extracted, "message": message}) + "\n")
        channel.flush()


_PROCESS_GRADER = ProcessGrader()
atexit.register(_PROCESS_GRADER.close)
GRADER_COUNTS = {"calls": 0, "timeouts": 0, "errors": 0}  # process-wide tally, for logging
_COUNTS_LOCK = threading.Lock()


def safe_grade(
    response: str, label: str, config: MathRewardConfig, grade_fn: GradeFn = grade_response, process_grader: ProcessGrader | None = None
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
