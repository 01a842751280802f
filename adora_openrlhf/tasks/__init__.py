"""Tasks: the task registry (``registry.py``: what ``data.task`` names: row sources, modality, generator, row
checks, demonstrations, response probes, benchmark subsets; the built-in tasks in ``builtin.py``, their row checks
in ``row_checks.py``), the per-source lookups of demonstrations, probes and subsets (``behaviours.py``), each
task's logic in one module (``kk.py``: K&K puzzles; ``geo_synth.py``: generated shape images), and here the subset
rules of the benchmarks read from files (MATH500, MathVista).

The rewards are in ``rewards/`` (registry by source); ``data_prep/`` holds the command-line converters and
``evaluation/`` the evaluation command, both built on these modules (the modules below them never import them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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
