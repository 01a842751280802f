"""The reward interface every task implements, and the registry that maps a row's ``source`` to it.

A reward function takes the response text, the row's ground-truth ``label`` and its ``meta`` dict and
returns a :class:`RewardResult`: the scalar training reward, the 0/1 correctness that the samplers and
ADORA use, the extracted answer and a few scalars to log. Reward functions never raise on bad model output:
unparsable answers score as wrong and are counted in ``info``.

Each task also states its *failure reward* (:func:`failure_reward`): what a response scores when it could
not be graded at all (the math grader's time limit or a crash inside a grader, a reward call that failed in
OpenRLHF or in ``eval.run``). It is the task's lowest reward, so a policy can never gain by making grading
fail: no failure scores above a wrong answer.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from adora_openrlhf.registry import Registry


@dataclass(frozen=True)
class RewardResult:
    reward: float  # scalar training reward (format + answer terms, task-specific scale)
    correct: bool  # the task's 0/1 correctness ("score" in OpenRLHF's reward hook)
    extracted: str | None = None  # the answer parsed from the response, None if none
    info: Mapping[str, float] = field(default_factory=dict)  # extra scalars to log (format_ok, timeout, ...)


RewardFn = Callable[[str, str, Mapping[str, Any]], RewardResult]  # (response, label, meta) -> result


def _load_builtin_rewards() -> None:
    """Import the task modules, and the plugins a run names in ``ADORA_PLUGINS``, so that their ``@register_reward``
    decorators run."""
    import importlib

    for module in ("kk", "math", "geometry"):
        try:
            importlib.import_module(f"adora_openrlhf.rewards.{module}")
        except ModuleNotFoundError as err:  # a task module that is not part of this install
            if err.name != f"adora_openrlhf.rewards.{module}":
                raise
    from adora_openrlhf.plugins import import_plugins_from_env

    import_plugins_from_env()  # a run's own rewards (setting plugins), in OpenRLHF's reward worker too


# The built-in task modules are imported at the first lookup (they register themselves on import).
REWARD_FUNCTIONS: Registry[RewardFn] = Registry("reward source", "source", loader=_load_builtin_rewards)
FailureRewardFn = Callable[[Mapping[str, Any]], float]  # row meta -> the task's lowest reward
FAILURE_REWARDS: Registry[FailureRewardFn] = Registry("reward source", "source", loader=_load_builtin_rewards)


REWARD_LIMIT = 1e6  # |reward| a reward function may return: a larger one is a bug, not a learning signal


class RewardError(ValueError):
    """A reward function broke its contract: it returned no :class:`RewardResult`, a reward that is not a finite
    number within +-:data:`REWARD_LIMIT`, or (a plug-in's) it raised. The message names the source and the function."""


def check_reward_result(result: Any, where: str) -> RewardResult:
    """``result`` when it is a :class:`RewardResult` whose reward is a finite number with |reward| <= REWARD_LIMIT;
    else :class:`RewardError` naming ``where`` (the source and the function)."""
    if not isinstance(result, RewardResult):
        raise RewardError(
            f"{where} returned {type(result).__name__} {result!r:.60}, not a RewardResult; fix the reward function"
        )
    reward = result.reward
    if (
        isinstance(reward, bool)
        or not isinstance(reward, (int, float))
        or not math.isfinite(reward)
        or abs(reward) > REWARD_LIMIT
    ):
        raise RewardError(
            f"{where} returned reward {reward!r:.60}, not a finite number within +-{REWARD_LIMIT:g}; fix the reward function"
        )
    return result


def _checked(fn: RewardFn, sources: tuple[str, ...]) -> RewardFn:
    """``fn`` with its results checked (:func:`check_reward_result`); a plug-in's exception is re-raised as a
    :class:`RewardError` naming it (the built-in rewards raise only on bad data, with the field named)."""
    where = f"the reward of source {sources[0]!r}" if len(sources) == 1 else f"the reward of sources {list(sources)}"
    where += f" ({getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)!s})"
    plugin = not str(getattr(fn, "__module__", "")).startswith("adora_openrlhf.")

    @functools.wraps(fn)
    def checked(response: str, label: str, meta: Mapping[str, Any]) -> RewardResult:
        try:
            result = fn(response, label, meta)
        except Exception as err:
            if not plugin:
                raise
            message = " ".join(str(err).split())[:200]
            raise RewardError(
                f"{where} raised {type(err).__name__}: {message}; fix the reward function (score bad output as wrong)"
            ) from err
        return check_reward_result(result, where)

    return checked


def register_reward(*sources: str, failure: float | FailureRewardFn = 0.0) -> Callable[[RewardFn], RewardFn]:
    """Register ``fn`` as the reward of rows whose ``source`` is one of ``sources``.

    ``failure`` is the task's failure reward (a number, or a function of the row's meta when it depends on
    the row, as DAPO's -1 does): the lowest reward the task gives, scored by a response that could not be graded.
    The registry holds ``fn`` with its results checked (:func:`check_reward_result`: every reward that reaches
    training or evaluation is a finite number); the decorator returns ``fn`` itself.
    """
    failure_fn: FailureRewardFn = failure if callable(failure) else (lambda meta, value=float(failure): value)
    register = REWARD_FUNCTIONS.register(*sources)

    def wrap(fn: RewardFn) -> RewardFn:
        FAILURE_REWARDS.register(*sources)(failure_fn)
        register(_checked(fn, sources))
        return fn

    return wrap


def get_reward_fn(source: str) -> RewardFn:
    """The reward registered for ``source``; an unknown source raises one line listing the known sources."""
    return REWARD_FUNCTIONS.get(source)


def meta_flag(meta: Mapping[str, Any], key: str) -> bool:
    """The boolean ``meta[key]`` of a data row; ValueError naming ``meta.KEY`` for anything but true or false
    (the string "false" is truthy: read with ``bool()`` it would turn the option on)."""
    value = meta[key]
    if value is True or value is False:
        return value
    raise ValueError(f"meta.{key}: must be true or false, got {value!r}")


def failure_reward(source: str, meta: Mapping[str, Any] | None = None) -> float:
    """The reward of a ``source`` row's response that could not be graded: the task's lowest reward
    (math: the style's wrong-answer reward, 0 or DAPO's -1; K&K: -3, a malformed response; geometry: 0).
    Never raises: an unknown source, or a task whose failure reward itself fails on this meta, gives 0.0
    (no task, no reward scale to stay below)."""
    try:
        return float(FAILURE_REWARDS.get(source)(meta if isinstance(meta, Mapping) else {}))
    except Exception:  # noqa: BLE001 - called on error paths, where a second error would hide the first
        return 0.0
