"""What a task's rows and responses look like, per row ``source``, looked up on the task that reads the source
(:func:`~adora_openrlhf.tasks.registry.task_of_source`): its demonstrations (for the supervised warm-up), its response
probe (the behaviour a response shows, for the metrics) and its benchmark subsets (the evaluation's per-subset
accuracy). A task declares them on its :class:`~adora_openrlhf.tasks.task.Task`; nothing is filed here.

- :data:`DEMONSTRATIONS`: source -> (style -> ``fn(row, rng) -> response text``); :func:`demonstration_for` falls
  back to a row's ``meta.solution_text``; :data:`RANDOMISED_DEMONSTRATIONS`: the (source, style) pairs drawn anew
  each time;
- :data:`RESPONSE_PROBES`: source -> :class:`Probe` (``fn(response text) -> style name``); :func:`style_fractions`
  gives the share of each style over a batch of responses;
- :data:`SUBSET_RULES`: source -> ``fn(row) -> subset labels``; :func:`subset_labels`.

Each of the three is a :class:`~adora_openrlhf.registry.Registry` read from the registered tasks at every lookup
(its errors name the field, as every registry's do); they cannot be added to.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from typing import Any, TypeVar

from adora_openrlhf.errors import ConfigError
from adora_openrlhf.registry import Registry
from adora_openrlhf.tasks.registry import TASKS
from adora_openrlhf.tasks.task import Demonstration, Probe, ResponseProbe, SubsetRule

__all__ = ["DEMONSTRATIONS", "RANDOMISED_DEMONSTRATIONS", "RESPONSE_PROBES", "SUBSET_RULES", "Demonstration", "Probe",
           "ResponseProbe", "SubsetRule", "demonstration_for", "style_fractions", "subset_labels"]  # fmt: skip

T = TypeVar("T")


class _TaskView(Registry[T]):
    """A registry whose entries are read at each lookup (``entries()``), here from the registered tasks."""

    def __init__(self, kind: str, field: str, entries: Callable[[], Mapping[str, T]]) -> None:
        super().__init__(kind, field)
        self._read = entries

    def _load(self) -> None:
        self._entries = dict(self._read())

    def add(self, name: str, obj: T) -> T:
        raise TypeError(f"{self.kind} {name!r}: declare it on its task (tasks/registry.py register_task)")


def _by_source(kind: str) -> dict[str, Any]:
    """source -> the ``kind`` (``demonstrations``, ``probes``, ``subsets``) entry of the task that reads it first."""
    out: dict[str, Any] = {}
    for task in TASKS.values():
        for source, entry in getattr(task, kind).items():
            out.setdefault(source, entry)
    return out


def _styles(source: str, by_style: Mapping[str, Demonstration]) -> Registry[Demonstration]:
    return _TaskView("style", f"warmup.style (rows of source {source!r})", lambda: by_style)


# source -> (style -> builder): DEMONSTRATIONS.get(source).get(style), each level a Registry
DEMONSTRATIONS: Registry[Registry[Demonstration]] = _TaskView(
    "demonstration source",
    "source",
    lambda: {source: _styles(source, by_style) for source, by_style in _by_source("demonstrations").items()},
)
RESPONSE_PROBES: Registry[Probe] = _TaskView("response probe", "source", lambda: _by_source("probes"))
SUBSET_RULES: Registry[SubsetRule] = _TaskView("subset rule", "source", lambda: _by_source("subsets"))


class _RandomisedStyles(Set):
    """The (source, style) pairs whose demonstration is drawn at random each time (e.g. a guessed answer), never
    cached: the union of the tasks' ``randomised_styles``."""

    @staticmethod
    def _pairs() -> set[tuple[str, str]]:
        return set().union(*(task.randomised_styles for task in TASKS.values()))

    @classmethod
    def _from_iterable(cls, it: Any) -> set[Any]:
        return set(it)

    def __contains__(self, pair: object) -> bool:
        return pair in self._pairs()

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._pairs())

    def __len__(self) -> int:
        return len(self._pairs())


RANDOMISED_DEMONSTRATIONS: Set[tuple[str, str]] = _RandomisedStyles()


def subset_labels(row: Mapping[str, Any]) -> list[str]:
    """The subset labels of a row by its ``source``; none for a source without a rule."""
    rules = _by_source("subsets")
    source = row.get("source")
    return rules[source](row) if isinstance(source, str) and source in rules else []


def style_fractions(sources: Sequence[str], texts: Sequence[str], prefix: str) -> dict[str, float]:
    """``{prefix}thorough_fraction``, ``{prefix}shortcut_fraction`` ...: the share of responses whose probe names
    each style, over the responses whose source has a probe (empty when none has); the styles a probe was
    registered with are reported even when no response shows them."""
    probes: dict[str, Probe] = _by_source("probes")
    kinds = [probes[s].fn(t) for s, t in zip(sources, texts, strict=True) if s in probes]
    if not kinds:
        return {}
    names = sorted(set(kinds).union(*(probes[s].styles for s in set(sources) if s in probes)))
    return {f"{prefix}{name}_fraction": kinds.count(name) / len(kinds) for name in names}


def demonstration_for(row: Any, style: str = "direct", rng: random.Random | None = None) -> str:
    """The ``style`` demonstration of ``row``; sources without builders fall back to ``meta.solution_text``."""
    if row.source in DEMONSTRATIONS:
        return DEMONSTRATIONS.get(row.source).get(style)(row, rng or random.Random(0))
    solution = row.meta.get("solution_text") if isinstance(row.meta, dict) else None
    if isinstance(solution, str) and solution.strip():
        return solution
    raise ConfigError(
        f"warmup.steps: no demonstration for rows of source {row.source!r} (no registered builder and no meta.solution_text); "
        "set --warmup.steps 0 for a model that already follows the answer format"
    )
