"""The built-in tasks: ``kk`` (generated Knights-and-Knaves puzzles, Logic-RL's reward), ``math`` (rows from files:
DAPO-Math, MATH500, AIME, AMC) and ``geometry`` (images: generated shapes, Geometry3K, MathVista)."""

from __future__ import annotations

from typing import Any

from adora_openrlhf.errors import ConfigError
from adora_openrlhf.rewards.math import MATH_SOURCES
from adora_openrlhf.tasks import geo_synth, kk, math500_subsets, mathvista_subsets, row_checks
from adora_openrlhf.tasks.registry import Task, register_task


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


register_task(
    Task(
        kk.SOURCE,
        (kk.SOURCE,),
        generate=kk_rows,
        row_check=row_checks.kk_row_ok,
        label_check=row_checks.kk_label_ok,
        demonstrations={kk.SOURCE: kk.DEMONSTRATION_STYLES},
        randomised_styles=frozenset((kk.SOURCE, style) for style in kk.RANDOMISED_STYLES),
        probes={kk.SOURCE: kk.PROBE},
        subsets={kk.SOURCE: kk.subsets},
        meta_defaults=lambda data: {"kk_parser": data.kk.parser},  # the run's answer parser (rewards/kk.py)
    )
)
register_task(Task("math", tuple(MATH_SOURCES), row_check=row_checks.math_row_ok, subsets={"math500": math500_subsets}))
register_task(
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
    )
)
