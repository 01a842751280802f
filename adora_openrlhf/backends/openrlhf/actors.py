"""OpenRLHF's model actors, DeepSpeed strategy and replay buffer, as this package runs them.

Each class here is a subclass of OpenRLHF's own and adds only what OpenRLHF 0.11.2 lacks:

- the gloo weight sync (:mod:`adora_openrlhf.backends.openrlhf.cpu.weight_sync`): :class:`AdoraActorPPOTrainer` runs OpenRLHF's
  ``_init_vllm_sync_group`` with a gloo group when ``--vllm.sync_backend gloo``, and OpenRLHF's own
  ``broadcast_to_vllm`` then broadcasts through it; with ``nccl`` it is OpenRLHF's method;
- the DeepSpeed process group's time-out from ``ADORA_DEEPSPEED_TIMEOUT_S`` (:mod:`.timeouts`; unset: OpenRLHF's 60
  minutes), :meth:`AdoraDeepspeedStrategy.setup_distributed`;
- ``--ds.param_dtype fp32`` (:mod:`adora_openrlhf.backends.openrlhf.cpu.precision`), answered in every process that imports this module;
- on a process without CUDA, the CPU answers of :mod:`adora_openrlhf.backends.openrlhf.cpu.device`: every method inherited from OpenRLHF is a
  copy of OpenRLHF's function with ``torch.cuda``, ``init_device_mesh`` and the barrier-and-sync helper read on
  the CPU (:func:`.rebind.inherit_rebound`); with CUDA the mapping is empty and the methods are OpenRLHF's,
  except that the policy actor's copies build :class:`AdoraActorPPOTrainer` in place of OpenRLHF's trainer.

The choice is made when this module is imported, in each process (the driver, every Ray actor), so a GPU
worker of a cluster whose head node has no GPU still runs OpenRLHF's CUDA code. :data:`ACTOR_NAMES` are
the names OpenRLHF's ``train(args)`` looks up for its actor classes and strategy, answered with these.
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer
from openrlhf.trainer.ray.launcher import ReferenceModelActor, RewardModelActor
from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer, PolicyModelActor
from openrlhf.trainer.ray.ppo_critic import CriticModelActor, CriticPPOTrainer
from openrlhf.utils.deepspeed import DeepspeedStrategy
from openrlhf.utils.utils import get_strategy

from adora_openrlhf.backends.openrlhf.compat.rebind import inherit_rebound, with_globals
from adora_openrlhf.backends.openrlhf.cpu import precision
from adora_openrlhf.backends.openrlhf.cpu.device import cpu_names, needs_cpu_layer
from adora_openrlhf.backends.openrlhf.cpu.weight_sync import gloo_process_group
from adora_openrlhf.backends.openrlhf.cpu.zero3_gathers import sequential_zero3_gathers
from adora_openrlhf.backends.openrlhf.timeouts import deepspeed_timeout

CPU_NAMES: dict[str, Any] = cpu_names()  # empty where this process has CUDA
logger = logging.getLogger(__name__)
precision.install()  # --ds.param_dtype fp32 loads the models in float32, in every process that imports these classes


def _on_cpu(**names: Any) -> dict[str, Any]:
    """``CPU_NAMES`` plus ``names`` in a process without CUDA; nothing (OpenRLHF unchanged) with CUDA."""
    return {**CPU_NAMES, **names} if CPU_NAMES else {}


@inherit_rebound(CPU_NAMES)
class AdoraReplayBuffer(NaiveReplayBuffer):
    """OpenRLHF's replay buffer; on the CPU its target device is the CPU."""


@inherit_rebound(CPU_NAMES)
class AdoraDeepspeedStrategy(DeepspeedStrategy):
    """OpenRLHF's DeepSpeed strategy; on the CPU: no ``set_device``, a CPU device mesh, gloo collectives
    (DeepSpeed's CPU accelerator chooses gloo when oneCCL is not installed), ZeRO-3 gathers one parameter at a
    time (:mod:`adora_openrlhf.backends.openrlhf.cpu.zero3_gathers`), and torch's AdamW as DeepSpeed's optimizer
    (:meth:`get_ds_train_config`)."""

    def setup_distributed(self, timeout=None) -> None:
        """OpenRLHF's set-up (``deepspeed.init_distributed`` and the device mesh), the process group's time-out
        ``ADORA_DEEPSPEED_TIMEOUT_S`` seconds where set, else OpenRLHF's 60 minutes."""
        timeout = deepspeed_timeout() if timeout is None else timeout
        logger.info("DeepSpeed process group: time-out %g s", timeout.total_seconds())
        _SETUP_DISTRIBUTED(self, timeout)

    def get_ds_train_config(self, optim_dict: dict | None = None, *, max_norm: float | None = None) -> dict:
        """OpenRLHF's DeepSpeed training config; in a process without CUDA its AdamW runs as torch's
        (DeepSpeed's ``torch_adam``, the same update) instead of DeepSpeed's fused CPU kernel, which DeepSpeed would
        first compile (about 4 CPU-minutes). Adam offload keeps DeepSpeed's CPU Adam."""
        config = super().get_ds_train_config(optim_dict, max_norm=max_norm)
        optimizer = config.get("optimizer")
        if needs_cpu_layer() and optimizer and optimizer.get("type") in ("Adam", "AdamW") and not self.adam_offload:
            optimizer.setdefault("params", {})["torch_adam"] = True
        return sequential_zero3_gathers(config) if needs_cpu_layer() else config

    def get_ds_eval_config(self, offload: bool = False) -> dict:
        """OpenRLHF's DeepSpeed config of a model that does not train (the reference model); in a process without
        CUDA, ZeRO-3 gathers one parameter at a time, as for the policy."""
        config = super().get_ds_eval_config(offload=offload)
        return sequential_zero3_gathers(config) if needs_cpu_layer() else config


# OpenRLHF's setup_distributed, in a process without CUDA with the CPU names (as inherit_rebound copies the others)
_SETUP_DISTRIBUTED = with_globals(DeepspeedStrategy.setup_distributed, CPU_NAMES)


def _nccl_or_cuda_refused(backend: str) -> None:
    if needs_cpu_layer():
        raise RuntimeError(
            f"vllm.sync_backend {backend!r}: this process has no CUDA device, and OpenRLHF's {backend} weight sync needs one; "
            "pass --vllm.sync_backend gloo (the launcher sets it by itself on a machine without CUDA)"
        )


@inherit_rebound(lambda: _on_cpu(NaiveReplayBuffer=AdoraReplayBuffer))
class AdoraActorPPOTrainer(ActorPPOTrainer):
    """OpenRLHF's policy trainer (inside the policy actor) with the gloo weight sync."""

    def _init_vllm_sync_group(self, backend: str):
        """OpenRLHF's sync-group set-up (gloo: with :func:`.weight_sync.gloo_process_group`), once every engine has
        started: a group waits for all of its ranks, so an engine that died while starting would leave the trainer
        waiting for the group's 30-minute timeout; its start-up error is raised here instead."""
        ray.get([engine.get_num_unfinished_requests.remote() for engine in self.vllm_engines])
        if backend == "gloo" and not getattr(self.strategy.args.vllm, "sync_with_ray", False):
            return _GLOO_SYNC_GROUP(self, backend)
        _nccl_or_cuda_refused(backend)
        return super()._init_vllm_sync_group(backend)


# OpenRLHF's own _init_vllm_sync_group, its process group answered by gloo_process_group
_GLOO_SYNC_GROUP = with_globals(
    ActorPPOTrainer._init_vllm_sync_group, {**CPU_NAMES, "stateless_init_process_group": gloo_process_group}
)


@inherit_rebound(lambda: {**CPU_NAMES, "ActorPPOTrainer": AdoraActorPPOTrainer})
class AdoraPolicyModelActor(PolicyModelActor.__ray_actor_class__):
    """OpenRLHF's policy actor building :class:`AdoraActorPPOTrainer`."""


@inherit_rebound(CPU_NAMES)
class AdoraReferenceModelActor(ReferenceModelActor.__ray_actor_class__):
    """OpenRLHF's reference-model actor."""


@inherit_rebound(lambda: _on_cpu(NaiveReplayBuffer=AdoraReplayBuffer))
class AdoraCriticPPOTrainer(CriticPPOTrainer):
    """OpenRLHF's critic trainer (GAE runs)."""


@inherit_rebound(lambda: _on_cpu(CriticPPOTrainer=AdoraCriticPPOTrainer))
class AdoraCriticModelActor(CriticModelActor.__ray_actor_class__):
    """OpenRLHF's critic actor."""


@inherit_rebound(CPU_NAMES)
class AdoraRewardModelActor(RewardModelActor.__ray_actor_class__):
    """OpenRLHF's reward-model actor (runs without ``--reward.remote_url``)."""


# Ray actor classes with OpenRLHF's resource defaults (num_gpus=1 per actor; train() overrides per placement)
RemoteAdoraPolicyModelActor = ray.remote(num_gpus=1)(AdoraPolicyModelActor)
RemoteAdoraReferenceModelActor = ray.remote(num_gpus=1)(AdoraReferenceModelActor)
RemoteAdoraCriticModelActor = ray.remote(num_gpus=1)(AdoraCriticModelActor)
RemoteAdoraRewardModelActor = ray.remote(num_gpus=1)(AdoraRewardModelActor)

# OpenRLHF's get_strategy, building AdoraDeepspeedStrategy
adora_get_strategy = with_globals(
    get_strategy, {}, imports={("openrlhf.utils.deepspeed", "DeepspeedStrategy"): AdoraDeepspeedStrategy}
)
adora_get_strategy.__module__ = __name__
adora_get_strategy.__qualname__ = "adora_get_strategy"

# names of openrlhf/cli/train_ppo_ray.py's train() answered with this module's classes
ACTOR_NAMES: dict[str, Any] = {
    "PolicyModelActor": RemoteAdoraPolicyModelActor,
    "ReferenceModelActor": RemoteAdoraReferenceModelActor,
    "CriticModelActor": RemoteAdoraCriticModelActor,
    "RewardModelActor": RemoteAdoraRewardModelActor,
    "get_strategy": adora_get_strategy,
}
