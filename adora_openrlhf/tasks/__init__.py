"""Tasks: the task registry (``registry.py``: what ``data.task`` names: row sources, modality, generator, row
checks; the built-in tasks in ``builtin.py``, their row checks in ``row_checks.py``), each task's logic in one
module (``kk.py``: K&K puzzles; ``geo_synth.py``: generated shape images), and :data:`SUBSET_RULES`, the
benchmark subsets of a row by its ``source`` (the evaluation's per-subset accuracy).

The rewards are in ``rewards/`` (registry by source); ``data_prep/`` holds the command-line converters and
``eval/`` the evaluation command, both built on these modules (the library never imports them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from adora_openrlhf.registry import Registry
from adora_openrlhf.tasks import geo_synth, kk

SubsetRule = Callable[[Mapping[str, Any]], list[str]]  # row -> its subset labels
SUBSET_RULES: Registry[SubsetRule] = Registry("subset rule", "source")


def _meta(row: Mapping[str, Any]) -> Mapping[str, Any]:
    return row.get("meta") or {}


def math500_subsets(row: Mapping[str, Any]) -> list[str]:
    """MATH500: ``level=L``."""
    level = _meta(row).get("level")
    return [f"level={level}"] if level is not None else []


def mathvista_subsets(row: Mapping[str, Any]) -> list[str]:
    """MathVista: ``ID`` (math-targeted VQA) or ``OOD``, and ``task=TASK``."""
    meta = _meta(row)
    labels = []
    category = meta.get("category") or (meta.get("metadata") or {}).get("category")
    if category:
        labels.append("ID" if category == "math-targeted-vqa" else "OOD")
    task = meta.get("task") or (meta.get("metadata") or {}).get("task")
    if task:
        labels.append(f"task={task}")
    return labels


SUBSET_RULES.add(kk.SOURCE, kk.subsets)
SUBSET_RULES.add(geo_synth.SOURCE, geo_synth.subsets)
SUBSET_RULES.add("math500", math500_subsets)
SUBSET_RULES.add("mathvista", mathvista_subsets)


def subset_labels(row: Mapping[str, Any]) -> list[str]:
    """The subset labels of a row by its ``source``; none for a source without a rule."""
    source = row.get("source")
    return SUBSET_RULES.get(source)(row) if source in SUBSET_RULES.names() else []
