"""The import of ``flash_attn`` that OpenRLHF 0.11.2 makes at module level, answered on a machine without CUDA.

``openrlhf/models/ring_attn_utils.py`` (imported by ``openrlhf.models``, hence by every model actor and by
OpenRLHF's ``train`` entry) does ``from flash_attn.bert_padding import ...`` and ``from flash_attn.utils.distributed
import all_gather``. flash-attn is a CUDA package: it does not install on a CPU-only machine. OpenRLHF uses those
functions only for packed samples (``--ds.packing_samples``) and ring attention (``--ds.ring_attn_size > 1``),
both of which the launcher refuses on such a machine.

:func:`install_if_needed` therefore puts small modules under those names into ``sys.modules`` when, and only
when, this process has no CUDA device and flash-attn is not installed. Their functions are not kernels: each
raises an error naming the flag that needs flash-attn (``rearrange`` is einops', which flash-attn re-exports).
Where flash-attn is installed, or CUDA is available, nothing happens. The launcher calls it in the driver and
registers it as Ray's ``worker_process_setup_hook`` so every actor process does the same.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable

STANDIN_MARK = "__adora_cpu_standin__"
FUNCTIONS = {
    "flash_attn.bert_padding": ("index_first_axis", "pad_input", "unpad_input"),
    "flash_attn.utils.distributed": ("all_gather",),
}


def _needs_flash_attn(name: str) -> Callable[..., None]:
    def unavailable(*args, **kwargs):
        raise RuntimeError(
            f"{name}: flash-attn is not installed on this CPU-only machine; OpenRLHF calls it for packed samples and ring "
            "attention, which need a GPU (drop --ds.packing_samples / --ds.ring_attn_size)"
        )

    unavailable.__name__ = name.rsplit(".", 1)[-1]
    return unavailable


def _module(name: str, package: bool = False, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=package)
    if package:
        module.__path__ = []
    setattr(module, STANDIN_MARK, True)
    return module


def standin_modules() -> dict[str, types.ModuleType]:
    """The four modules: ``flash_attn``, ``flash_attn.bert_padding``, ``flash_attn.utils``, ``flash_attn.utils.distributed``."""
    from einops import rearrange

    def unavailable(module: str) -> dict[str, Callable[..., None]]:
        return {name: _needs_flash_attn(f"{module}.{name}") for name in FUNCTIONS[module]}

    bert = _module("flash_attn.bert_padding", rearrange=rearrange, **unavailable("flash_attn.bert_padding"))
    dist = _module("flash_attn.utils.distributed", **unavailable("flash_attn.utils.distributed"))
    utils = _module("flash_attn.utils", package=True, distributed=dist)
    root = _module("flash_attn", package=True, bert_padding=bert, utils=utils)
    return {
        "flash_attn": root,
        "flash_attn.bert_padding": bert,
        "flash_attn.utils": utils,
        "flash_attn.utils.distributed": dist,
    }


def install_if_needed() -> bool:
    """Install the stand-in modules if this process has no CUDA and no flash-attn; returns whether it did."""
    import torch

    if torch.cuda.is_available() or "flash_attn" in sys.modules or importlib.util.find_spec("flash_attn") is not None:
        return False
    sys.modules.update(standin_modules())
    return True
