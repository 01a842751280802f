"""ZeRO-3 parameter gathers that finish before they are read, on gloo.

DeepSpeed 0.19's ``GatheredParameters`` over several parameters (what ``transformers`` does per module when it
loads a checkpoint into a ZeRO-3 model: gather the module's weight and bias, load them on rank 0, broadcast)
launches one asynchronous all-gather per parameter and waits on the last handle only. On NCCL the collectives of
one stream finish in order, so that is enough. Gloo runs them on a pool of worker threads: an earlier gather can
still be writing when rank 0 has loaded the checkpoint's values, and overwrites them with the partition's
uninitialised memory, which rank 0 then broadcasts. Measured on this CPU with two gloo ranks, a two-layer model
of width 256 and bf16: 10 of 20 loads gave wrong (often non-finite) attention weights on both ranks; a tiny
policy whose attention output is then NaN trains on NaN from its first step.

ZeRO's own switch ``stage3_allgather_sequential`` gathers one parameter at a time with blocking calls (and sets
the prefetch bucket to one parameter): 0 of 20 loads wrong in the same measurement. :func:`sequential_zero3_gathers`
sets it in a DeepSpeed config; the CPU strategy (:class:`adora_openrlhf.backends.openrlhf.actors.AdoraDeepspeedStrategy`)
applies it to every ZeRO-3 config it hands out (the models' ``HfDeepSpeedConfig`` at load time and the engines),
where the collectives go through gloo. NCCL runs are left as OpenRLHF configures them.
"""

from __future__ import annotations

from typing import Any

SEQUENTIAL_GATHERS_KEY = "stage3_allgather_sequential"


def sequential_zero3_gathers(ds_config: dict[str, Any]) -> dict[str, Any]:
    """``ds_config`` with ``zero_optimization.stage3_allgather_sequential = True`` where its ZeRO stage is 3
    (changed in place and returned); any other stage is returned unchanged."""
    zero = ds_config.get("zero_optimization")
    if isinstance(zero, dict) and zero.get("stage") == 3:
        zero[SEQUENTIAL_GATHERS_KEY] = True
    return ds_config
