"""A task is one registered unit: what ``data.task`` names.

A :class:`Task` declares the row ``source`` names it reads (each source's reward is registered in ``rewards/``),
its modality (``text``, or ``vision`` for rows with images and a vision-language model), the generator that
makes its train and held-out rows when no ``data.train_path`` is given, and the load-time checks of a row
(``row_check(prompt, label, meta)``, ``label_check(label, meta)``; each raises :class:`RowFieldError` or
``ValueError`` naming what is wrong), and what its rows and responses look like, per source (``tasks/behaviours.py``):
the warm-up's demonstrations by style, the response probe and the benchmark subsets (:class:`Task` is declared in
``tasks/task.py``). The built-in tasks (``kk``, ``math``, ``geometry``) are declared in ``tasks/builtin.py`` and
registered on the first lookup; a plugin module registers its own with :func:`register_task`, and the trainer,
``eval.run`` and the config checks then treat it like a built-in one::

    register_task(Task("parity", sources=("parity",), generate=make_parity_rows, row_check=check_parity_row))

``generate(data_config, seed) -> (train rows, held-out rows)`` returns rows of the project's JSONL schema
(``{"prompt", "label", "source", "meta", "images"}``); ``data_config`` is the run's ``DataConfig``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from adora_openrlhf.registry import Registry
from adora_openrlhf.tasks.task import MODALITIES, Probe, RowFieldError, Task

__all__ = ["MODALITIES", "OPTIONS_LISTENERS", "TASKS", "Probe", "RowFieldError", "Task", "is_vision_task", "register_task", "row_problem",
           "task_of_source"]  # fmt: skip


def _load_builtin() -> None:
    from adora_openrlhf.tasks import builtin

    for task in builtin.BUILTIN_TASKS:  # kk, math and geometry
        register_task(task)


TASKS: Registry[Task] = Registry("task", "data.task", loader=_load_builtin)


# called with each task registered that brings an options section (config.py rebuilds DataConfig with it)
OPTIONS_LISTENERS: list[Callable[[Task], None]] = []


def register_task(task: Task) -> Task:
    """Register ``task`` under its name (a name registered before raises ``ValueError``); its demonstrations,
    probes and subset rules are looked up on it by source (``tasks/behaviours.py``); a task with ``options`` is
    announced to :data:`OPTIONS_LISTENERS`, so that ``data.<section>`` becomes part of the config."""
    TASKS.add(task.name, task)
    if task.options is not None:
        for listener in list(OPTIONS_LISTENERS):
            listener(task)
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
