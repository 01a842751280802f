"""Weight sync for OpenRLHF's vLLM engine actors from a saved checkpoint, without NCCL or CUDA.

OpenRLHF 0.11 moves the policy's weights into its vLLM engines by a NCCL broadcast (or CUDA IPC) through
its worker extension ``WorkerWrap.update_weight``; neither exists on a CPU, or between machines that share
only a file system. Here the engine re-reads the weights from a directory the policy was saved to
(``save_pretrained``, safetensors): every tensor of every ``*.safetensors`` file in the directory is fed to
vLLM's in-place ``model_runner.reload_weights(weights_iterator=...)``, which maps checkpoint names onto
the engine's (fused) parameters exactly as at start-up, casting to the engine's dtype.

- :class:`FileWeightWorker`: the vLLM worker extension (a subclass of OpenRLHF's ``WorkerWrap``, so its
  NCCL methods stay available) with ``reload_weights_from_dir(model_dir)``.
- :class:`ReloadableRolloutActor`: OpenRLHF's ``RolloutRayActor`` started with that extension, plus the
  async actor method ``reload_weights_from_dir(model_dir)`` (one call per engine; it returns the number of
  tensors each worker loaded and clears the prefix cache, whose entries were computed with the old weights).
  :data:`RemoteReloadableRolloutActor` is its Ray actor class; it takes the keyword arguments
  ``create_vllm_engines`` passes to ``RolloutRayActor``.

Importing this module needs vLLM (``openrlhf.trainer.ray.vllm_engine`` imports it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import ray
import torch
from openrlhf.trainer.ray.vllm_engine import RolloutRayActor
from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap

WORKER_EXTENSION = f"{__name__}.FileWeightWorker"  # vLLM imports the extension by this qualified name


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


class FileWeightWorker(WorkerWrap):
    """vLLM worker extension: OpenRLHF's ``WorkerWrap`` plus a weight reload from a checkpoint directory."""

    def reload_weights_from_dir(self, model_dir: str) -> int:
        """Load every tensor of ``model_dir``'s safetensors files into the running model; returns the count."""
        count = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal count
            for item in safetensors_weights(model_dir):
                count += 1
                yield item

        self.model_runner.reload_weights(weights_iterator=counted())
        return count


class ReloadableRolloutActor(RolloutRayActor.__ray_actor_class__):
    """OpenRLHF's vLLM engine actor with :class:`FileWeightWorker` as its worker extension."""

    async def __init__(self, *args, **kwargs):
        kwargs["worker_extension_cls"] = WORKER_EXTENSION
        await super().__init__(*args, **kwargs)

    async def reload_weights_from_dir(self, model_dir: str) -> list[int]:
        """Reload the weights on every worker of this engine from ``model_dir``; tensors loaded per worker."""
        counts = await self.llm.collective_rpc("reload_weights_from_dir", args=(str(model_dir),))
        await self.llm.reset_prefix_cache()
        return list(counts)


RemoteReloadableRolloutActor = ray.remote(ReloadableRolloutActor)
