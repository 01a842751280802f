"""The built-in tasks, :data:`BUILTIN_TASKS` (``tasks/registry.py`` registers them on its first lookup): ``kk``
(generated Knights-and-Knaves puzzles, Logic-RL's reward), ``math`` (rows from files: DAPO-Math, MATH500, AIME, AMC)
and ``geometry`` (images: generated shapes, Geometry3K, MathVista), with the subset rules of the benchmarks read from
files (MATH500, MathVista) beside them; K&K's and the shape images' are in ``kk.py`` and ``geo_synth.py``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adora_openrlhf.errors import ConfigError
from adora_openrlhf.rewards.math import MATH_SOURCES
from adora_openrlhf.tasks import geo_synth, kk, kk_demonstrations, row_checks
from adora_openrlhf.tasks.task import Task


def kk_rows(data: Any, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``data.num_train`` + ``data.num_eval`` distinct puzzles of ``data.kk.num_people`` people (``tasks/kk.py``)."""
    try:
        return kk.generate_splits(
            data.num_train,
            data.num_eval,
            data.kk.num_people,
            seed,
            name_pool=data.kk.name_pool,
            name_order=data.kk.name_order,
        )
    except (ValueError, RuntimeError) as err:  # e.g. more puzzles asked for than exist for these people counts
        raise ConfigError(
            f"data.num_train: cannot generate {data.num_train} + {data.num_eval} puzzles for kk.num_people "
            f"{data.kk.num_people} ({err})"
        ) from None


def geometry_rows(data: Any, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Generated shape images (``tasks/geo_synth.py``) of ``data.geo.tasks`` at ``data.geo.levels``."""
    return geo_synth.generate_splits(data.num_train, data.num_eval, seed, data.geo.tasks, data.geo.levels)


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


BUILTIN_TASKS: tuple[Task, ...] = (
    Task(
        kk.SOURCE,
        (kk.SOURCE,),
        generate=kk_rows,
        row_check=row_checks.kk_row_ok,
        label_check=row_checks.kk_label_ok,
        demonstrations={kk.SOURCE: kk_demonstrations.DEMONSTRATION_STYLES},
        randomised_styles=frozenset((kk.SOURCE, style) for style in kk_demonstrations.RANDOMISED_STYLES),
        probes={kk.SOURCE: kk_demonstrations.PROBE},
        subsets={kk.SOURCE: kk.subsets},
        meta_defaults=lambda data: {"kk_parser": data.kk.parser},  # the run's answer parser (rewards/kk.py)
        options=kk.KKDataConfig,
    ),
    Task("math", tuple(MATH_SOURCES), row_check=row_checks.math_row_ok, subsets={"math500": math500_subsets}),
    Task(
        "geometry",
        ("geometry3k", "mathvista", geo_synth.SOURCE),
        modality="vision",
        generate=geometry_rows,
        row_check=row_checks.geometry_row_ok,
        demonstrations={geo_synth.SOURCE: geo_synth.DEMONSTRATION_STYLES},
        randomised_styles=frozenset((geo_synth.SOURCE, style) for style in geo_synth.RANDOMISED_STYLES),
        probes={geo_synth.SOURCE: geo_synth.PROBE},
        subsets={"mathvista": mathvista_subsets, geo_synth.SOURCE: geo_synth.subsets},
        options=geo_synth.GeoDataConfig,
        options_key="geo",
    ),
)
