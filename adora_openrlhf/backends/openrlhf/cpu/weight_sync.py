"""Trainer-to-vLLM weight sync over gloo, and the vLLM engine actor that receives it.

OpenRLHF 0.11.2 moves the policy's weights from DeepSpeed rank 0 into its vLLM engines after every update,
either by CUDA IPC (``--train.colocate_all``) or by a broadcast over a process group of its own between rank
0 and every engine worker. That group is always vLLM's NCCL communicator (``stateless_init_process_group``),
whatever ``--vllm.sync_backend`` says, and the engine receives into CUDA memory; on a CPU-only machine vLLM
disables NCCL silently and the trainer waits forever. This module is the gloo path, chosen by
``--vllm.sync_backend gloo`` (the launcher sets it on a machine without CUDA):

- :class:`GlooBroadcastGroup`: a process group of its own (a TCP store at the trainer's address and port, gloo
  on top; time-out: ``ADORA_WEIGHT_SYNC_TIMEOUT_S`` seconds, 30 minutes where unset, see ``..timeouts``) with the
  ``broadcast(tensor, src, stream)`` call OpenRLHF's trainer code makes on its NCCL communicator. A CUDA tensor
  is sent through a CPU copy. :func:`gloo_process_group` has the signature of OpenRLHF's
  ``stateless_init_process_group`` so the trainer side (``.actors.AdoraActorPPOTrainer``) runs OpenRLHF's own
  ``_init_vllm_sync_group`` and ``broadcast_to_vllm`` with it.
- :class:`AdoraWorkerExtension`: the vLLM worker extension (a subclass of OpenRLHF's ``WorkerWrap``; vLLM
  imports it by name, also inside a spawned engine-core process). With gloo, ``init_process_group`` joins the
  group above and ``update_weight`` receives each tensor into CPU memory. A CPU engine keeps the tensors of
  one sync and loads them all at its last tensor (OpenRLHF marks it with ``empty_cache=True``) through vLLM's
  ``model_runner.reload_weights``, which maps checkpoint names onto the engine's fused parameters as at
  start-up (vLLM's CPU build has no per-tensor ``load_weights`` after start-up); a GPU engine loads each
  tensor as OpenRLHF does. NCCL and CUDA IPC calls go to OpenRLHF's methods unchanged.
  ``reload_weights_from_dir(path)`` loads a ``save_pretrained`` folder instead (shared file systems, tests).
- :class:`AdoraRolloutActor` / :data:`RemoteAdoraRolloutActor`: OpenRLHF's ``RolloutRayActor`` started with
  that extension, plus ``reload_weights_from_dir``; :func:`adora_create_vllm_engines` is OpenRLHF's own
  ``create_vllm_engines`` creating this actor.

Importing this module needs vLLM (``openrlhf.trainer.ray.vllm_engine`` imports it).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray
import torch
from openrlhf.trainer.ray.vllm_engine import RolloutRayActor, create_vllm_engines
from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap

from adora_openrlhf.backends.openrlhf.compat.rebind import with_globals
from adora_openrlhf.backends.openrlhf.cpu.precision import engine_dtype_from_env
from adora_openrlhf.backends.openrlhf.timeouts import WEIGHT_SYNC_TIMEOUT, weight_sync_timeout

WORKER_EXTENSION = f"{__name__}.AdoraWorkerExtension"  # vLLM imports the extension by this qualified name
SYNC_TIMEOUT = WEIGHT_SYNC_TIMEOUT  # the default; ADORA_WEIGHT_SYNC_TIMEOUT_S sets another (timeouts.py)

logger = logging.getLogger(__name__)


class GlooBroadcastGroup:
    """A gloo process group of its own between the trainer (rank 0) and the engine workers (ranks 1..).

    Independent of torch's default group (DeepSpeed's on the trainer, vLLM's inside an engine): the ranks meet
    at a TCP store served by rank 0 at ``master_address:master_port``. ``timeout`` bounds the meeting and each
    broadcast's wait for the other ranks (default: ``ADORA_WEIGHT_SYNC_TIMEOUT_S``, else :data:`SYNC_TIMEOUT`)."""

    def __init__(
        self,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        timeout: datetime.timedelta | None = None,
    ) -> None:
        timeout = weight_sync_timeout() if timeout is None else timeout
        store = torch.distributed.TCPStore(
            master_address, int(master_port), world_size, is_master=rank == 0, timeout=timeout
        )
        self.group = torch.distributed.ProcessGroupGloo(store, rank, world_size, timeout)
        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout

    def broadcast(self, tensor: torch.Tensor, src: int = 0, stream: Any = None) -> torch.Tensor:
        """Broadcast ``tensor`` from rank ``src`` into ``tensor`` on every rank (``stream`` is ignored: gloo is
        synchronous). A tensor outside CPU memory travels through a CPU copy."""
        buffer = tensor if tensor.device.type == "cpu" else tensor.detach().to("cpu")
        if not buffer.is_contiguous():
            buffer = buffer.contiguous()
        self.group.broadcast(buffer, src).wait()
        if buffer is not tensor:
            tensor.copy_(buffer)
        return tensor


def gloo_process_group(
    master_address: str, master_port: int, rank: int, world_size: int, device: Any = None
) -> GlooBroadcastGroup:
    """OpenRLHF's ``stateless_init_process_group`` signature, answered with a :class:`GlooBroadcastGroup`
    (``device`` is unused: gloo works on CPU memory)."""
    group = GlooBroadcastGroup(master_address, master_port, rank, world_size)
    logger.info(
        "weight sync: gloo group of %d ranks at %s:%s, this process rank %d (time-out %g s)",
        world_size,
        master_address,
        master_port,
        rank,
        group.timeout.total_seconds(),
    )
    return group


def safetensors_weights(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every tensor of every ``*.safetensors`` file in ``model_dir`` (sorted files)."""
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"model_dir: no *.safetensors file in {str(model_dir)!r}; save the policy there with save_pretrained(model_dir) (safetensors is its default format)"
        )
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - a safe_open handle is not iterable
                yield name, handle.get_tensor(name)


class AdoraWorkerExtension(WorkerWrap):
    """vLLM worker extension: OpenRLHF's ``WorkerWrap`` plus the gloo weight sync and a reload from a folder."""

    def init_process_group(
        self, master_address, master_port, rank_offset, world_size, group_name, backend="nccl", use_ray=False
    ):
        """Join the trainer's weight-sync group: OpenRLHF's method for NCCL (or Ray collectives), a
        :class:`GlooBroadcastGroup` for ``backend="gloo"``."""
        if backend != "gloo" or use_ray:
            return super().init_process_group(
                master_address, master_port, rank_offset, world_size, group_name, backend, use_ray
            )
        if not torch.distributed.is_initialized():
            raise RuntimeError(
                "vllm.sync_backend gloo: the vLLM worker has no default process group to take its rank from"
            )
        rank = torch.distributed.get_rank() + rank_offset
        self._model_update_with_ray = False
        self._model_update_group = GlooBroadcastGroup(master_address, master_port, rank, world_size)
        self._gloo_sync = True
        self._pending_weights: list[tuple[str, torch.Tensor]] = []
        logger.info(
            "weight sync: joined the gloo group at %s:%s as rank %d of %d (time-out %g s)",
            master_address,
            master_port,
            rank,
            world_size,
            self._model_update_group.timeout.total_seconds(),
        )
        return None

    def update_weight(self, name, dtype, shape, empty_cache=False):
        """Receive one tensor of a sync (gloo), or OpenRLHF's NCCL receive. ``empty_cache`` is true on the last
        tensor of a sync (OpenRLHF sets it for ``count == num_params``)."""
        if not getattr(self, "_gloo_sync", False):
            return super().update_weight(name, dtype, shape, empty_cache)
        if dtype != self.model_config.dtype:
            raise TypeError(
                f"weight sync: {name} arrives as {dtype}, the engine computes in {self.model_config.dtype}; set the same --ds.param_dtype"
            )
        weight = torch.empty(shape, dtype=dtype, device="cpu")
        self._model_update_group.broadcast(weight, src=0)
        if self.device.type != "cpu":
            self.model_runner.model.load_weights(weights=[(name, weight.to(self.device))])
            return None
        self._pending_weights.append((name, weight))
        if empty_cache:
            pending, self._pending_weights = self._pending_weights, []
            self.model_runner.reload_weights(weights_iterator=iter(pending))
            refresh_cpu_matmul_handles(self.model_runner.get_model())
        return None

    def reload_weights_from_dir(self, model_dir: str) -> int:
        """Load every tensor of ``model_dir``'s safetensors files into the running model; returns the count."""
        count = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal count
            for item in safetensors_weights(model_dir):
                count += 1
                yield item

        self.model_runner.reload_weights(weights_iterator=counted())
        refresh_cpu_matmul_handles(self.model_runner.get_model())
        return count


def refresh_cpu_matmul_handles(model: torch.nn.Module) -> int:
    """Rebuild the CPU matmul handle of every layer that keeps its weight (embeddings and LM heads); returns the count.

    vLLM's CPU backend multiplies by a layer's weight through a handle made from that weight when the model loads
    (``dispatch_cpu_unquantized_gemm``: oneDNN or a packed copy). A reload in place rebuilds the layers whose tensors it
    loads, but an LM head tied to the embeddings (``tie_word_embeddings``, as the local backend's tiny models) is a layer
    of its own whose weight is the embedding's and for which no tensor arrives: its handle kept the first weights, so
    the engine sampled with the starting model's output layer while the trainer's moved. Layers whose weight the
    dispatch removed (the linear layers) have an empty weight here and were rebuilt by the reload."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    count = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if (
            hasattr(module, "cpu_linear")
            and isinstance(weight, torch.Tensor)
            and weight.ndim == 2
            and weight.numel() > 0
            and not weight.is_meta
        ):
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
            count += 1
    return count


class AdoraRolloutActor(RolloutRayActor.__ray_actor_class__):
    """OpenRLHF's vLLM engine actor with :class:`AdoraWorkerExtension` as its worker extension, computing in the
    run's training dtype (``precision.ENGINE_DTYPE_ENV``, set by the launcher; OpenRLHF's: bfloat16)."""

    async def __init__(self, *args, **kwargs):
        kwargs["worker_extension_cls"] = WORKER_EXTENSION
        kwargs["dtype"] = engine_dtype_from_env(kwargs.get("dtype", "bfloat16"))
        await super().__init__(*args, **kwargs)

    async def set_policy_version(self, version: int) -> None:
        """Record the policy version of the weights just loaded (the trainer's ``PolicyVersionBroadcast``)."""
        self.policy_version = int(version)

    async def get_policy_version(self) -> int:
        """Optimiser steps behind the weights this engine generates with (0: the starting model)."""
        return getattr(self, "policy_version", 0)

    async def reload_weights_from_dir(self, model_dir: str) -> list[int]:
        """Reload the weights on every worker of this engine from ``model_dir``; tensors loaded per worker."""
        counts = await self.llm.collective_rpc("reload_weights_from_dir", args=(str(model_dir),))
        await self.llm.reset_prefix_cache()
        return list(counts)


RemoteAdoraRolloutActor = ray.remote(AdoraRolloutActor)

# OpenRLHF's engine factory, creating our engine actor in place of its RolloutRayActor
adora_create_vllm_engines = with_globals(create_vllm_engines, {"RolloutRayActor": RemoteAdoraRolloutActor})
adora_create_vllm_engines.__module__ = __name__
adora_create_vllm_engines.__qualname__ = "adora_create_vllm_engines"
