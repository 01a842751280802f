"""A pool of grading subprocesses: any ``fn(*args) -> (correct, extracted)`` run under a hard wall-clock limit.

A reward whose checking can hang (math-verify on ``10^{10^{10}}`` runs in C, where no signal reaches it) sends
each call here (:class:`ProcessGrader`): the call goes to an idle worker subprocess (one per concurrent caller,
started on first use, the start-up not counted against the call), which runs it under a ``SIGALRM`` timer in its
own main thread (:func:`run_with_alarm`); a worker that does not answer in time is killed and replaced, and the
call returns ``("timeout", False, None, message)``. Functions travel to the workers by name
(``"package.module:function"``); a worker runs the pool's ``warm_up`` function before it reports ready.
``rewards/math.py`` grades through one such pool.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any


class GradingTimeout(BaseException):
    """Raised inside a grading call that overran its limit.

    A ``BaseException``: the many ``except Exception`` blocks inside math-verify and sympy cannot swallow it.
    """


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

    The worker runs the pool's warm-up function (the grader's imports), then writes a ready line; a call's
    limit starts only after that.
    """

    def __init__(self, warm_up: str = "") -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"from {__name__} import worker_main; worker_main()", warm_up],
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

    def __init__(self, max_processes: int = 32, startup_timeout_s: float = 120.0, warm_up: str = "") -> None:
        self._warm_up = warm_up  # "module:function" each worker runs before it reports ready
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
        worker = _Worker(self._warm_up)
        if not worker.wait_ready(self.startup_timeout_s):
            worker.kill()
            raise RuntimeError(f"grading worker did not start within {self.startup_timeout_s}s")
        return worker

    def run(self, fn: GradeFn, args: tuple, timeout_s: float) -> tuple[str, bool, str | None, str]:
        worker, start, remaining = self._acquire(timeout_s)
        if worker is None and not start:
            return (
                "timeout",
                False,
                None,
                f"no grading worker became free within {timeout_s}s ({self.max_processes} busy)",
            )
        try:
            if start:
                worker = self._start()
            assert worker is not None
            payload = {
                "fn": _ref(fn),
                "args": list(args),
                "timeout_s": max(remaining - _worker_margin(remaining), 0.01),
            }
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
    if len(sys.argv) > 1 and sys.argv[1]:
        with contextlib.suppress(Exception):  # a broken install shows up as errors of the calls themselves
            _resolve(sys.argv[1])()  # the grader's imports and set-up, before the ready line
    channel.write(json.dumps({"ready": True}) + "\n")
    channel.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            fn, args, limit = _resolve(request["fn"]), tuple(request["args"]), float(request["timeout_s"])
            status, correct, extracted, message = run_with_alarm(fn, args, limit)
        except Exception as err:  # noqa: BLE001
            status, correct, extracted, message = "error", False, None, f"{type(err).__name__}: {err}"[:300]
        channel.write(
            json.dumps({"status": status, "correct": correct, "extracted": extracted, "message": message}) + "\n"
        )
        channel.flush()
