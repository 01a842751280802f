"""Training precision of the openrlhf backend: OpenRLHF 0.11.2's bf16 and fp16, plus fp32.

OpenRLHF trains in bf16 or fp16 (``--ds.param_dtype``). On a CPU without bf16 instructions (AVX2 only) a bf16
matrix product runs about 12x slower than a float32 one, so the CPU run of this backend trains in fp32:

- :data:`PARAM_DTYPE_CHOICE`, ``fp32``, is added to ``--ds.param_dtype``'s choices when OpenRLHF's parser runs
  (``entry.parse_openrlhf_args``);
- :func:`convert_param_dtype` answers OpenRLHF's ``convert_to_torch_dtype`` (its models read it at load time),
  ``fp32`` -> ``torch.float32``, the rest OpenRLHF's; :func:`install` puts it in place in a process;
- DeepSpeed's config already follows: OpenRLHF enables its ``bf16``/``fp16`` sections for those values only, so
  ``fp32`` leaves both off (DeepSpeed's fp32 training);
- the vLLM engines compute in the same dtype (:data:`ENGINE_DTYPE_ENV`, read by ``weight_sync.AdoraRolloutActor``),
  so that the synced weights arrive in the engine's dtype.
"""

from __future__ import annotations

import os

import torch

PARAM_DTYPE_CHOICE = "fp32"
# environment variable of the Ray job naming the engines' dtype: the run's model.dtype (field_flags.PARAM_DTYPES maps it
# to --ds.param_dtype), set by the launcher
ENGINE_DTYPE_ENV = "ADORA_VLLM_DTYPE"


def convert_param_dtype(param_dtype: str) -> torch.dtype:
    """``--ds.param_dtype`` -> torch dtype: ``fp32`` -> ``torch.float32``; ``bf16``, ``fp16`` as OpenRLHF."""
    if param_dtype == PARAM_DTYPE_CHOICE:
        return torch.float32
    from openrlhf.utils import utils

    return getattr(utils, "_openrlhf_convert_to_torch_dtype", utils.convert_to_torch_dtype)(param_dtype)


def install() -> None:
    """Answer ``openrlhf.utils.utils.convert_to_torch_dtype`` with :func:`convert_param_dtype` in this process
    (OpenRLHF's models import it inside their loading functions, so the module attribute is what they get)."""
    from openrlhf.utils import utils

    if utils.convert_to_torch_dtype is not convert_param_dtype:
        utils._openrlhf_convert_to_torch_dtype = utils.convert_to_torch_dtype
        utils.convert_to_torch_dtype = convert_param_dtype


def engine_dtype_from_env(default: str) -> str:
    """The engines' dtype the launcher set for this job (:data:`ENGINE_DTYPE_ENV`), else ``default``."""
    return os.environ.get(ENGINE_DTYPE_ENV) or default
