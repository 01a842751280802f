"""What OpenRLHF 0.11.2's actor code needs in place of CUDA on a machine without a GPU.

OpenRLHF calls ``torch.cuda`` directly in its model actors, its DeepSpeed strategy and its replay buffer
(``set_device``, ``current_device``, ``synchronize``, ``current_stream``, ``empty_cache``), builds its device
mesh with ``init_device_mesh("cuda", ...)`` and ends many methods with ``torch_dist_barrier_and_cuda_sync()``.
DeepSpeed itself runs on the CPU (its CPU accelerator, gloo for collectives, ZeRO 0-3). :func:`cpu_names` is
the set of names that OpenRLHF's methods get in place of those, through :mod:`adora_openrlhf.backends.openrlhf.compat.rebind` (copies of OpenRLHF's
functions with these globals; nothing in torch or OpenRLHF is modified):

- ``torch``: :data:`TORCH_ON_CPU`, which is torch except for ``torch.cuda`` (:class:`CpuCuda`: the current
  device is the CPU, synchronisation and cache calls do nothing, there is no stream) and ``torch.device``
  (a device string ``"cuda..."`` means the CPU);
- ``init_device_mesh``: torch's, with ``"cuda"`` read as ``"cpu"``;
- ``torch_dist_barrier_and_cuda_sync``: the barrier alone.

:func:`needs_cpu_layer` decides per process: the layer is used where ``torch.cuda.is_available()`` is false.
On a GPU node the names are not replaced and OpenRLHF runs as it ships.
"""

from __future__ import annotations

import types
from typing import Any

import torch


def needs_cpu_layer() -> bool:
    """Whether this process has no usable CUDA device (then OpenRLHF's CUDA calls are answered on the CPU)."""
    return not torch.cuda.is_available()


class CpuCuda:
    """``torch.cuda`` as OpenRLHF's actor code uses it, answered on the CPU; any other attribute is torch's."""

    @staticmethod
    def current_device() -> torch.device:
        return torch.device("cpu")

    @staticmethod
    def set_device(device: Any) -> None:
        """Nothing to select: one CPU."""

    @staticmethod
    def synchronize(device: Any = None) -> None:
        """CPU operations are synchronous."""

    @staticmethod
    def empty_cache() -> None:
        """No caching allocator on the CPU."""

    @staticmethod
    def current_stream(device: Any = None) -> None:
        """No streams on the CPU; the weight-sync group ignores the stream argument."""
        return None

    @staticmethod
    def is_available() -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


def cpu_device(spec: Any = "cpu", index: int | None = None) -> torch.device:
    """``torch.device`` with every CUDA device read as the CPU (OpenRLHF builds ``cuda:<current_device()>``)."""
    text = str(spec)
    if text.startswith("cuda"):
        return torch.device("cpu")
    return torch.device(spec) if index is None else torch.device(spec, index)


class TorchOnCpu(types.ModuleType):
    """The ``torch`` module as seen by OpenRLHF's rebound methods: torch itself, but for ``cuda`` and ``device``."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = CpuCuda()
        self.device = cpu_device

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


TORCH_ON_CPU = TorchOnCpu()


def init_device_mesh_on_cpu(device_type: str, *args: Any, **kwargs: Any):
    """torch's ``init_device_mesh`` with the device type ``"cuda"`` read as ``"cpu"`` (gloo process groups)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu" if device_type == "cuda" else device_type, *args, **kwargs)


def barrier_without_cuda_sync() -> None:
    """OpenRLHF's ``torch_dist_barrier_and_cuda_sync`` without the CUDA part."""
    torch.distributed.barrier()


def cpu_names() -> dict[str, Any]:
    """The names OpenRLHF's actor, strategy and replay-buffer methods see in this process: the CPU answers
    above where there is no CUDA, nothing (OpenRLHF unchanged) where there is."""
    if not needs_cpu_layer():
        return {}
    return {
        "torch": TORCH_ON_CPU,
        "init_device_mesh": init_device_mesh_on_cpu,
        "torch_dist_barrier_and_cuda_sync": barrier_without_cuda_sync,
    }
