"""A task is one registered unit: what ``data.task`` names.

A :class:`Task` declares the row ``source`` names it reads (each source's reward is registered in ``rewards/``),
its modality (``text``, or ``vision`` for rows with images and a vision-language model), the generator that
makes its train and held-out rows when no ``data.train_path`` is given, and the load-time checks of a row
(``row_check(prompt, label, meta)``, ``label_check(label, meta)``; each raises :class:`RowFieldError` or
``ValueError`` naming what is wrong), and what its rows and responses look like, per source (``tasks/behaviours.py``):
the warm-up's demonstrations by style, the response probe and the benchmark subsets. The built-in tasks (``kk``, ``math``, ``geometry``) are registered in
``tasks/builtin.py``; a plugin module registers its own with :func:`register_task`, and the trainer,
``eval.run`` and the config checks then treat it like a built-in one::

    register_task(Task("parity", sources=("parity",), generate=make_parity_rows, row_check=check_parity_row))

``generate(data_config, seed) -> (train rows, held-out rows)`` returns rows of the project's JSONL schema
(``{"prompt", "label", "source", "meta", "images"}``); ``data_config`` is the run's ``DataConfig``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from adora_openrlhf.registry import Registry
from adora_openrlhf.tasks.behaviours import (
    RESPONSE_PROBES,
    SUBSET_RULES,
    Demonstration,
    Probe,
    SubsetRule,
    register_demonstration,
)

RowCheck = Callable[[Any, str, dict[str, Any]], None]  # (prompt, label, meta) -> None; raises RowFieldError
LabelCheck = Callable[[str, dict[str, Any]], None]  # (label, meta) -> None; raises ValueError if unparsable
RowGenerator = Callable[[Any, int], tuple[list[dict[str, Any]], list[dict[str, Any]]]]  # (DataConfig, seed)
MODALITIES = ("text", "vision")


class RowFieldError(ValueError):
    """A row field whose value the row's reward cannot use; ``field`` names it (``label``, ``meta.names``, ...)."""

    def __init__(self, field_name: str, message: str):
        super().__init__(message)
        self.field = field_name


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

    def __post_init__(self) -> None:
        if not self.sources or not all(isinstance(s, str) and s for s in self.sources):
            raise ValueError(f"task {self.name!r}: sources must be a non-empty tuple of source names")
        if self.modality not in MODALITIES:
            raise ValueError(f"task {self.name!r}: modality must be one of {list(MODALITIES)}, got {self.modality!r}")
        for kind in ("demonstrations", "probes", "subsets"):
            strangers = sorted(set(getattr(self, kind)) - set(self.sources))
            if strangers:
                raise ValueError(f"task {self.name!r}: {kind} for sources {strangers} it does not read {self.sources}")
        styles = {(source, style) for source, by_style in self.demonstrations.items() for style in by_style}
        if not set(self.randomised_styles) <= styles:
            raise ValueError(f"task {self.name!r}: randomised_styles must name (source, style) demonstrations")


def _load_builtin() -> None:
    # registers kk, math and geometry (by name: no import circle)
    importlib.import_module("adora_openrlhf.tasks.builtin")


TASKS: Registry[Task] = Registry("task", "data.task", loader=_load_builtin)


def register_task(task: Task) -> Task:
    """Register ``task`` under its name (a name registered before raises ``ValueError``) and file its
    demonstrations, probes and subset rules by source (``tasks/behaviours.py``)."""
    TASKS.add(task.name, task)
    for source, by_style in task.demonstrations.items():
        for style, build in by_style.items():
            register_demonstration(source, style, randomised=(source, style) in task.randomised_styles)(build)
    for source, probe in task.probes.items():
        RESPONSE_PROBES.add(source, probe)
    for source, rule in task.subsets.items():
        SUBSET_RULES.add(source, rule)
    return task


def task_of_source(source: str) -> Task | None:
    """The task that reads row source ``source`` (the first registered), or None."""
    return next((task for _, task in TASKS.items() if source in task.sources), None)


def row_problem(source: str, prompt: Any, label: str, meta: dict[str, Any]) -> str | None:
    """``field 'NAME': what is wrong`` when the checks of the task that reads ``source`` refuse the row (its label
    check first, then its row check), else None; the trainer's and ``eval.run``'s loaders prefix the row's place."""
    task = task_of_source(source)
    if task is None:
        return None
    if task.label_check is not None:
        try:
            task.label_check(label, meta)
        except ValueError as err:
            return f"field 'label': the {source!r} reward cannot parse it ({err})"
        except Exception as err:  # noqa: BLE001 - a plug-in's check that fails itself: name it
            return _check_error(task.label_check, "label check", task.name, err)
    if task.row_check is not None:
        try:
            task.row_check(prompt, label, meta)
        except RowFieldError as err:
            return f"field '{err.field}': {err}"
        except Exception as err:  # noqa: BLE001 - see above
            return _check_error(task.row_check, "row check", task.name, err)
    return None


def _check_error(check: Any, what: str, task: str, err: Exception) -> str:
    """What a task's check that raised something else than its refusal of a row (a bug in the check) did, naming it."""
    name = f"{getattr(check, '__module__', '?')}.{getattr(check, '__qualname__', '?')}"
    return (
        f"the {what} of task {task!r} ({name}) raised {type(err).__name__} on this row: "
        f"{' '.join(str(err).split())[:200]}; fix the check (it refuses a row by raising RowFieldError)"
    )


def is_vision_task(name: str) -> bool:
    """Whether task ``name`` reads images (a vision-language model; the local backend builds a processor)."""
    return TASKS.get(name).modality == "vision"
