"""Learning-rate schedules of the RL phase, by name (``train.lr_scheduler``, registry :data:`LR_SCHEDULES`).

The names and formulas are those OpenRLHF's ``--actor.lr_scheduler`` selects (transformers'
``get_scheduler``, with ``num_warmup_steps = ceil(lr_warmup_ratio * K)`` as OpenRLHF computes it), so that
one config trains with the same schedule on both backends. Each maps optimiser step ``k`` (0-based) of ``K``,
with ``w`` warm-up steps and floor ``m = min_lr_ratio``, to a factor of ``train.lr``; during warm-up every
schedule but ``constant`` rises as ``k / w`` (so the first step has learning rate 0, as in transformers):

- ``constant``:              1 (no warm-up)
- ``constant_with_warmup``:  1 after the warm-up
- ``linear``:                (K - k) / (K - w) after the warm-up, down to 0
- ``cosine``:                0.5 * (1 + cos(pi * p)) with p = (k - w) / (K - w), down to 0
- ``cosine_with_min_lr``:    m + (1 - m) * 0.5 * (1 + cos(pi * p)), down to m (OpenRLHF's default, m = 0.1)
"""

from __future__ import annotations

import math
from collections.abc import Callable

from adora_openrlhf.registry import Registry

Schedule = Callable[[int, int, int, float], float]  # (k, K, w, m) -> factor after the warm-up
LR_SCHEDULES: Registry[Schedule] = Registry("learning-rate schedule", "train.lr_scheduler")


def _progress(k: int, total: int, warmup: int) -> float:
    return (k - warmup) / max(1, total - warmup)


@LR_SCHEDULES.register("constant")
def constant(k: int, total: int, warmup: int, min_ratio: float) -> float:
    return 1.0


@LR_SCHEDULES.register("constant_with_warmup")
def constant_with_warmup(k: int, total: int, warmup: int, min_ratio: float) -> float:
    return 1.0


@LR_SCHEDULES.register("linear")
def linear(k: int, total: int, warmup: int, min_ratio: float) -> float:
    return max(0.0, (total - k) / max(1, total - warmup))


@LR_SCHEDULES.register("cosine")
def cosine(k: int, total: int, warmup: int, min_ratio: float) -> float:
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * _progress(k, total, warmup))))


@LR_SCHEDULES.register("cosine_with_min_lr")
def cosine_with_min_lr(k: int, total: int, warmup: int, min_ratio: float) -> float:
    return max(0.0, min_ratio + (1.0 - min_ratio) * cosine(k, total, warmup, min_ratio))


def warmup_steps(total: int, warmup_ratio: float) -> int:
    """OpenRLHF's warm-up length: ``ceil(total * lr_warmup_ratio)`` optimiser steps."""
    return math.ceil(total * warmup_ratio)


def lr_factor(name: str, k: int, total: int, warmup_ratio: float, min_ratio: float) -> float:
    """The factor of ``train.lr`` at optimiser step ``k`` of ``total`` under schedule ``name``."""
    schedule = LR_SCHEDULES.get(name)
    if name == "constant":
        return 1.0
    warmup = warmup_steps(total, warmup_ratio)
    if k < warmup:
        return k / max(1, warmup)
    return schedule(k, total, warmup, min_ratio)
