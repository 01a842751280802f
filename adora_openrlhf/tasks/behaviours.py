"""What a task's rows and responses look like, per row ``source``: its demonstrations (for the supervised warm-up),
its response probe (the behaviour a response shows, for the metrics) and its benchmark subsets (the evaluation's
per-subset accuracy). A task declares them on its :class:`~adora_openrlhf.tasks.registry.Task`, and
``register_task`` files them here; the built-in tasks (``tasks/builtin.py``) are loaded on the first lookup.

- :data:`DEMONSTRATIONS`: source -> (style -> ``fn(row, rng) -> response text``); :func:`demonstration_for` falls
  back to a row's ``meta.solution_text``;
- :data:`RESPONSE_PROBES`: source -> :class:`Probe` (``fn(response text) -> style name``); :func:`style_fractions`
  gives the share of each style over a batch of responses;
- :data:`SUBSET_RULES`: source -> ``fn(row) -> subset labels``; :func:`subset_labels`.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from adora_openrlhf.errors import ConfigError
from adora_openrlhf.registry import Registry


def _load_builtin() -> None:
    # the built-in tasks declare their behaviours (by name: no import circle)
    importlib.import_module("adora_openrlhf.tasks.builtin")


Demonstration = Callable[[Any, random.Random], str]  # (row, rng) -> response text (without the eos token)
# source -> (style -> builder): DEMONSTRATIONS.get(source).get(style), each level a Registry
DEMONSTRATIONS: Registry[Registry[Demonstration]] = Registry("demonstration source", "source", loader=_load_builtin)


# (source, style) pairs whose demonstration is drawn at random each time (e.g. a guessed answer): never cached
RANDOMISED_DEMONSTRATIONS: set[tuple[str, str]] = set()


def register_demonstration(
    source: str, style: str, randomised: bool = False
) -> Callable[[Demonstration], Demonstration]:
    """Register ``fn(row, rng) -> response text`` as the ``style`` demonstration of rows of ``source``;
    ``randomised``: the text depends on ``rng``, so the warm-up draws it anew each time instead of caching it."""
    if source not in DEMONSTRATIONS:
        DEMONSTRATIONS.add(source, Registry("style", f"warmup.style (rows of source {source!r})"))
    if randomised:
        RANDOMISED_DEMONSTRATIONS.add((source, style))
    return DEMONSTRATIONS.get(source).register(style)


# Response probes: name the behaviour a response shows (for the metrics), one per source.
ResponseProbe = Callable[[str], str]  # response text -> style name ("other" when none fits)


@dataclass(frozen=True)
class Probe:
    """A source's response probe and the styles it reports every time, seen or not."""

    fn: ResponseProbe
    styles: tuple[str, ...]


RESPONSE_PROBES: Registry[Probe] = Registry("response probe", "source", loader=_load_builtin)

SubsetRule = Callable[[Mapping[str, Any]], list[str]]  # row -> its subset labels (K&K: ppl=N ...)
SUBSET_RULES: Registry[SubsetRule] = Registry("subset rule", "source", loader=_load_builtin)


def subset_labels(row: Mapping[str, Any]) -> list[str]:
    """The subset labels of a row by its ``source``; none for a source without a rule."""
    source = row.get("source")
    return SUBSET_RULES.get(source)(row) if source in SUBSET_RULES else []


def style_fractions(sources: Sequence[str], texts: Sequence[str], prefix: str) -> dict[str, float]:
    """``{prefix}thorough_fraction``, ``{prefix}shortcut_fraction`` ...: the share of responses whose probe names
    each style, over the responses whose source has a probe (empty when none has); the styles a probe was
    registered with are reported even when no response shows them."""
    kinds = [RESPONSE_PROBES.get(s).fn(t) for s, t in zip(sources, texts, strict=True) if s in RESPONSE_PROBES]
    if not kinds:
        return {}
    names = sorted(set(kinds).union(*(RESPONSE_PROBES.get(s).styles for s in set(sources) if s in RESPONSE_PROBES)))
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
