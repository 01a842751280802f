"""The reward interface every task implements, and the registry that maps a row's ``source`` to it.

A reward function takes the response text, the row's ground-truth ``label`` and its ``meta`` dict and
returns a :class:`RewardResult`: the scalar training reward, the 0/1 correctness that the samplers and
ADORA use, the extracted answer and a few scalars to log. Reward functions never raise on bad model output:
unparsable answers score as wrong and are counted in ``info``.
"""

from __future__ import annotations

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
    """Import the task modules so that their ``@register_reward`` decorators run."""
    import importlib

    for module in ("kk", "math", "geometry"):
        try:
            importlib.import_module(f"adora_openrlhf.rewards.{module}")
        except ModuleNotFoundError as err:  # a task module that is not part of this install
            if err.name != f"adora_openrlhf.rewards.{module}":
                raise


# The built-in task modules are imported at the first lookup (they register themselves on import).
REWARD_FUNCTIONS: Registry[RewardFn] = Registry("reward source", "source", loader=_load_builtin_rewards)


def register_reward(*sources: str) -> Callable[[RewardFn], RewardFn]:
    """Register ``fn`` as the reward of rows whose ``source`` is one of ``sources``."""
    return REWARD_FUNCTIONS.register(*sources)


def get_reward_fn(source: str) -> RewardFn:
    """The reward registered for ``source``; an unknown source raises one line listing the known sources."""
    return REWARD_FUNCTIONS.get(source)
