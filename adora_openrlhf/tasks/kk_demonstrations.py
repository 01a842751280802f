"""The warm-up's demonstrations of a K&K row (by style: ``direct``, ``thorough``, ``shortcut``, ``restate``) and the
response probe, built on the traces of ``tasks/kk.py``; the ``kk`` task declares them (``tasks/builtin.py``)."""

from __future__ import annotations

import random
from typing import Any

from adora_openrlhf.errors import ConfigError
from adora_openrlhf.tasks.kk import (
    restate_response,
    shortcut_response,
    statements_from_json,
    thorough_response,
    trace_kind,
)
from adora_openrlhf.tasks.task import Probe


def _kk_names_statements(row: Any):
    names, statements = row.meta.get("names"), row.meta.get("statements")
    if not names or statements is None or len(statements) != len(names):
        raise ConfigError(
            "warmup.style: K&K reasoning traces need meta.names and meta.statements in every row (generated puzzles and "
            "public K&K files with a 'statements' field have them); use --warmup.style direct for rows without statements"
        )
    return names, statements_from_json(statements)


def kk_direct(row: Any, rng: random.Random) -> str:
    """Logic-RL format answer for a K&K row, from ``meta`` names/solution (or the label alone)."""
    names, solution = row.meta.get("names"), row.meta.get("solution")
    if names and solution is not None and len(names) == len(solution):
        check = ", ".join(f"{n} {'knight' if s else 'knave'}" for n, s in zip(names, solution, strict=True))
    else:
        check = row.label.replace("\n", ", ")
    return f"<think>{check}.</think>\n<answer>{row.label}</answer>"


def kk_thorough(row: Any, rng: random.Random) -> str:
    """Guess-and-check trace that tests candidates in a fixed order until one passes every statement."""
    return thorough_response(*_kk_names_statements(row))


def kk_shortcut(row: Any, rng: random.Random) -> str:
    """``<think>guess.</think>`` and a uniformly random assignment."""
    return shortcut_response(row.meta.get("names") or _kk_names_statements(row)[0], rng)


def kk_restate(row: Any, rng: random.Random) -> str:
    """The whole quiz read back, ``guess.``, and a uniformly random assignment."""
    return restate_response(*_kk_names_statements(row), rng)


def kk_probe(response: str) -> str:
    """``thorough``, ``shortcut`` or ``other`` (see ``tasks.kk.trace_kind``)."""
    return trace_kind(response)


# The warm-up's demonstration styles of K&K rows; shortcut and restate guess at random (drawn anew each time).
DEMONSTRATION_STYLES = {"direct": kk_direct, "thorough": kk_thorough, "shortcut": kk_shortcut, "restate": kk_restate}
RANDOMISED_STYLES = ("shortcut", "restate")
PROBE = Probe(kk_probe, ("thorough", "shortcut"))  # the styles reported in every step's metrics


def direct_demonstration(row: Any) -> str:
    """The ``direct`` K&K demonstration (kept for callers that want the plain answer)."""
    return kk_direct(row, random.Random(0))
