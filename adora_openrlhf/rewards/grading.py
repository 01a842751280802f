"""Grading a step's responses concurrently under one deadline per step.

Each response is graded by its task's reward function on a pool of ``workers`` threads. The math grader
sends its work to grading subprocesses (``rewards/grader_pool.py``), so math responses are graded in parallel;
the pure-Python K&K and geometry rewards take microseconds each and run one after another under the GIL.

The deadline bounds the time a step waits on its grader. With ``deadline_s`` = D, a step whose grading has
already waited w seconds (earlier rounds of adaptive sampling, earlier refills of DAPO filtering) gives its
next batch D - w seconds; when that runs out, every response of the batch whose grade has not arrived
scores its task's failure reward (``rewards/base.py`` :func:`failure_reward`: the task's lowest reward, so
no answer gains by being slow to grade), with ``info["grader_late"] = 1`` and ``correct = False``, and the
step goes on. A grading call still running then is not waited for: it ends in its thread within its own
limit (the math grader's ``timeout_s``) and its result is discarded; calls queued behind the deadline are
cancelled unstarted. So no step waits on the grader for more than D plus the time to collect the batch.

The grades themselves do not depend on the number of workers: each response is scored by the same
function of (response, label, meta) as one at a time, and the results come back in the batch's order.
"""

from __future__ import annotations

import concurrent.futures as cf
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from adora_openrlhf.config_checks import check_field_types, check_number, option
from adora_openrlhf.rewards.base import RewardResult


@dataclass(frozen=True)
class GradingConfig:
    """How a step's responses are graded (section ``grading``; both backends)."""

    deadline_s: float = option(
        60.0,
        "the longest a step waits on its grader, in seconds, over all its rounds; responses not graded by "
        "then score the task's failure reward and are counted in reward/grader_late",
    )
    workers: int = option(8, "responses graded at the same time (threads; the math grader runs in subprocesses)")

    def __post_init__(self) -> None:
        check_field_types(self, "grading")
        check_number(self.deadline_s, "grading.deadline_s", gt=0)
        check_number(self.workers, "grading.workers", integer=True, ge=1, le=256)


GRADING_DEADLINE_ENV = "ADORA_GRADING_DEADLINE_S"  # grading.deadline_s in every Ray worker of the openrlhf backend
GRADING_WORKERS_ENV = "ADORA_GRADING_WORKERS"  # grading.workers


def config_from_env(environ: Mapping[str, str] | None = None) -> GradingConfig:
    """The run's grading section as the launcher passed it to a Ray worker (defaults where unset); a value that
    does not parse raises naming the variable."""
    import os

    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for name, key, kind in ((GRADING_DEADLINE_ENV, "deadline_s", float), (GRADING_WORKERS_ENV, "workers", int)):
        if environ.get(name, "").strip():
            try:
                values[key] = kind(environ[name])
            except ValueError:
                raise ValueError(f"{name}: expected {kind.__name__} for grading.{key}, got {environ[name]!r}") from None
    return GradingConfig(**values)


@dataclass(frozen=True)
class GradingJob:
    """One response to grade: its task's reward function, the row's label and meta, and the failure reward."""

    reward_fn: Callable[[str, str, Mapping[str, Any]], RewardResult]
    response: str
    label: str
    meta: Mapping[str, Any]
    failure: float  # the task's lowest reward: what a response not graded in time scores


def late_result(failure: float) -> RewardResult:
    """The result of a response whose grade did not arrive before the deadline."""
    return RewardResult(reward=float(failure), correct=False, extracted=None, info={"grader_late": 1.0})


class GradingThreads:
    """A minimal executor on daemon threads, shareable by several graders: a grading call that never returns (a
    plugin reward stuck in a loop) cannot keep the process from exiting, as a ``ThreadPoolExecutor``'s joined
    threads would. ``size`` threads are kept alive (started on demand)."""

    def __init__(self, size: int):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.base_size = self.size = size

    def submit(self, fn: Callable[..., Any], *args: Any) -> cf.Future:
        future: cf.Future = cf.Future()
        self._queue.put((future, fn, args))
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            while len(self._threads) < self.size:
                thread = threading.Thread(target=self._work, name="adora-grader", daemon=True)
                thread.start()
                self._threads.append(thread)
        return future

    def replace_stuck(self, count: int) -> None:
        """``count`` calls were abandoned while running: start as many more threads (up to 4 x the base size)."""
        with self._lock:
            self.size = min(self.size + count, 4 * self.base_size)

    def _work(self) -> None:
        while True:
            future, fn, args = self._queue.get()
            if not future.set_running_or_notify_cancel():
                continue  # cancelled before it started
            try:
                future.set_result(fn(*args))
            except BaseException as err:  # noqa: BLE001 - handed to the caller through the future
                future.set_exception(err)


class StepGrader:
    """Grades batches of responses on ``workers`` threads; one deadline budget per step (:meth:`start_step`).

    ``grade(jobs)`` returns the results in the jobs' order. A reward function that raises propagates its
    exception, as grading one at a time would (reward functions report bad model output as a wrong answer
    and raise only on bad data or bugs). A call abandoned at the deadline while running keeps its thread
    until it ends; the pool starts a replacement (up to 4 x ``workers`` threads in all) so that the next
    steps keep their parallelism."""

    def __init__(
        self,
        config: GradingConfig | None = None,
        threads: GradingThreads | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.config = config or GradingConfig()
        self._clock = clock
        self._threads = threads or GradingThreads(self.config.workers)
        self.waited_s = 0.0  # time this step has waited on grading so far
        self.late = 0  # responses of this step scored late

    def start_step(self) -> None:
        """A new step: its full deadline budget again, and the late count back to 0."""
        self.waited_s = 0.0
        self.late = 0

    def grade(self, jobs: Sequence[GradingJob]) -> list[RewardResult]:
        """Every job's result: the reward function's, or :func:`late_result` for those past the step's deadline."""
        if not jobs:
            return []
        start = self._clock()
        budget = max(self.config.deadline_s - self.waited_s, 0.0)
        futures = [self._threads.submit(job.reward_fn, job.response, job.label, job.meta) for job in jobs]
        cf.wait(futures, timeout=budget)
        results: list[RewardResult] = []
        abandoned = 0
        for job, future in zip(jobs, futures, strict=True):
            if future.done():
                results.append(future.result())  # re-raises a reward function's own exception
                continue
            if not future.cancel():  # already running: it ends within its own limit, its result discarded
                abandoned += 1
            results.append(late_result(job.failure))
            self.late += 1
        if abandoned:
            self._threads.replace_stuck(abandoned)
        self.waited_s += self._clock() - start
        return results
