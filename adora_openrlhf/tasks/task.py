"""What a task declares (:class:`Task`): its row sources, modality, generator, row checks and, per source, the
warm-up's demonstrations, the response probe and the benchmark subsets. ``tasks/registry.py`` registers tasks
(:func:`~adora_openrlhf.tasks.registry.register_task`) and ``tasks/behaviours.py`` looks a source's behaviours up on
the task that reads it; this module imports neither, so the built-in tasks (``tasks/builtin.py``) and each task's
logic (``kk.py``, ``geo_synth.py``, ``row_checks.py``) build on it without an import circle.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

RowCheck = Callable[[Any, str, dict[str, Any]], None]  # (prompt, label, meta) -> None; raises RowFieldError
LabelCheck = Callable[[str, dict[str, Any]], None]  # (label, meta) -> None; raises ValueError if unparsable
RowGenerator = Callable[[Any, int], tuple[list[dict[str, Any]], list[dict[str, Any]]]]  # (DataConfig, seed)
Demonstration = Callable[[Any, random.Random], str]  # (row, rng) -> response text (without the eos token)
ResponseProbe = Callable[[str], str]  # response text -> style name ("other" when none fits)
SubsetRule = Callable[[Mapping[str, Any]], list[str]]  # row -> its subset labels (K&K: ppl=N ...)
MODALITIES = ("text", "vision")


class RowFieldError(ValueError):
    """A row field whose value the row's reward cannot use; ``field`` names it (``label``, ``meta.names``, ...)."""

    def __init__(self, field_name: str, message: str):
        super().__init__(message)
        self.field = field_name


@dataclass(frozen=True)
class Probe:
    """A source's response probe (names the behaviour a response shows, for the metrics) and the styles it reports
    every time, seen or not."""

    fn: ResponseProbe
    styles: tuple[str, ...]


@dataclass(frozen=True)
class Task:
    """One task: its row sources (the first is the default of a row without ``source``), modality, generator,
    row checks, the meta defaults of its rows and, keyed by source, its demonstrations (style -> builder;
    ``randomised_styles``: the (source, style) pairs drawn anew each time), response probes and benchmark subset
    rules. Fields other than ``name`` and ``sources`` are optional: a task without a generator needs
    ``data.train_path``; a source without checks is checked for the common schema only; one without
    demonstrations falls back to ``meta.solution_text``."""

    name: str
    sources: tuple[str, ...]
    modality: str = "text"
    generate: RowGenerator | None = None
    row_check: RowCheck | None = None
    label_check: LabelCheck | None = None
    demonstrations: Mapping[str, Mapping[str, Demonstration]] = field(default_factory=dict)
    randomised_styles: frozenset[tuple[str, str]] = frozenset()
    probes: Mapping[str, Probe] = field(default_factory=dict)
    subsets: Mapping[str, SubsetRule] = field(default_factory=dict)
    # meta keys every row of the task's sources gets from the run's DataConfig unless it names them (K&K: kk_parser)
    meta_defaults: Callable[[Any], dict[str, Any]] | None = None
    # the task's own options: a dataclass whose fields are ``data.<options_key>.<field>`` flags, config-file keys and
    # saved-config entries (K&K: ``data.kk.num_people``); its first docstring line is the section's help
    options: type | None = None
    options_key: str = ""  # the section's name under ``data``; "" = the task's name

    def __post_init__(self) -> None:
        if not self.sources or not all(isinstance(s, str) and s for s in self.sources):
            raise ValueError(f"task {self.name!r}: sources must be a non-empty tuple of source names")
        if self.modality not in MODALITIES:
            raise ValueError(f"task {self.name!r}: modality must be one of {list(MODALITIES)}, got {self.modality!r}")
        for kind in ("demonstrations", "probes", "subsets"):
            strangers = sorted(set(getattr(self, kind)) - set(self.sources))
            if strangers:
                raise ValueError(f"task {self.name!r}: {kind} for sources {strangers} it does not read {self.sources}")
        if self.options is not None and not (isinstance(self.options, type) and dataclasses.is_dataclass(self.options)):
            raise ValueError(f"task {self.name!r}: options must be a dataclass type, got {self.options!r}")
        if self.options is not None and not self.section.isidentifier():
            raise ValueError(f"task {self.name!r}: options_key must be a Python identifier, got {self.section!r}")
        styles = {(source, style) for source, by_style in self.demonstrations.items() for style in by_style}
        if not set(self.randomised_styles) <= styles:
            raise ValueError(f"task {self.name!r}: randomised_styles must name (source, style) demonstrations")

    @property
    def section(self) -> str:
        """The options section's name under ``data`` (``options_key``, or the task's name)."""
        return self.options_key or self.name
