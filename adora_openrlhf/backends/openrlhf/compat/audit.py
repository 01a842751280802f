"""The parts of OpenRLHF this backend subclasses, re-executes or answers names for, and why.

The backend is tied to openrlhf 0.11.2 (``entry.TESTED_VERSIONS``): it subclasses OpenRLHF's classes, runs its
``train(args)`` and parser with some names answered differently (:mod:`adora_openrlhf.backends.openrlhf.compat.rebind`), and replaces a few of its helpers
on the CPU. :data:`AUDITED` lists each of those pieces of OpenRLHF's source with what depends on it. The test
``tests/test_openrlhf_audit.py`` keeps a digest of each piece's source text (:func:`source_digest`, read from the
installed files without importing them) and fails with a "re-audit" message naming the piece when an installed
OpenRLHF differs, so a new release is read before it is trusted.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
from pathlib import Path

MAIN_BLOCK = "__main__"  # the `if __name__ == "__main__":` block of a module

# (module, top-level name) -> what of ours depends on it
AUDITED: dict[tuple[str, str], str] = {
    (
        "openrlhf.cli.train_ppo_ray",
        "train",
    ): "entry.run_openrlhf_train re-executes it: our trainer import, actors.ACTOR_NAMES, create_vllm_engines",
    (
        "openrlhf.cli.train_ppo_ray",
        MAIN_BLOCK,
    ): "entry.parse_openrlhf_args runs its parser and checks (all but the final train(args)); fp32 added to --ds.param_dtype",
    (
        "openrlhf.utils.utils",
        "convert_to_torch_dtype",
    ): "cpu/precision.convert_param_dtype answers it (fp32), delegating bf16 and fp16 to it",
    (
        "openrlhf.utils.deepspeed.deepspeed_utils",
        "get_train_ds_config",
    ): "precision: fp32 relies on bf16/fp16 being enabled only for their own values",
    ("openrlhf.utils.deepspeed.deepspeed_utils", "get_eval_ds_config"): "precision: the same for the reference model",
    (
        "openrlhf.trainer.ppo_trainer",
        "BasePPOTrainer",
    ): "trainer.AdoraPPOTrainer: save_logs_and_checkpoints, save_best_checkpoint, init_checkpoint_states",
    (
        "openrlhf.trainer.ppo_trainer",
        "PPOTrainer",
    ): "trainer.AdoraPPOTrainer: __init__, fit, evaluate (evaluations, metrics.jsonl, marker)",
    (
        "openrlhf.trainer.ppo_trainer_async",
        "PPOTrainerAsync",
    ): "async_trainer.AdoraPPOTrainerAsync re-executes its __init__ with our two actor classes; its fit restores our states",
    (
        "openrlhf.trainer.ppo_trainer_async",
        "GenerateSamplesActor",
    ): "async_trainer.AdoraGenerateSamplesActor: samples_generator, generate_kwargs, _run_eval; its fit's lock and queue",
    (
        "openrlhf.trainer.ppo_trainer_async",
        "TrainingActor",
    ): "async_trainer.AdoraTrainingActor: fit (train_step, eval payloads to save_best_checkpoint), broadcast_to_vllm's lock",
    (
        "openrlhf.trainer.ppo_trainer",
        "prepare_datasets",
    ): "flags.derived_flags: data.max_samples caps the prompt and evaluation sets",
    (
        "openrlhf.trainer.ppo_utils.samples_generator",
        "SamplesGenerator",
    ): "samples_generator.AdoraSamplesGenerator: _generate_vllm, responses, evaluation rewards",
    (
        "openrlhf.trainer.ppo_utils.samples_generator",
        "_collect_prompt_batch",
    ): "AdoraSamplesGenerator._generate_adaptive draws prompts with it",
    (
        "openrlhf.trainer.ppo_utils.experience_maker",
        "RemoteExperienceMaker",
    ): "experience_maker.AdoraExperienceMaker replaces compute_advantages_and_returns",
    (
        "openrlhf.trainer.ppo_utils.length_penalty",
        "apply_length_penalties",
    ): "the sampler and the experience maker apply it before the pool statistics",
    (
        "openrlhf.trainer.ray.ppo_actor",
        "ActorPPOTrainer",
    ): "actors.AdoraActorPPOTrainer: gloo _init_vllm_sync_group; CPU copies of its methods",
    (
        "openrlhf.trainer.ray.ppo_actor",
        "PolicyModelActor",
    ): "actors.AdoraPolicyModelActor: copies of its methods building AdoraActorPPOTrainer",
    ("openrlhf.trainer.ray.ppo_critic", "CriticPPOTrainer"): "actors.AdoraCriticPPOTrainer: CPU copies of its methods",
    ("openrlhf.trainer.ray.ppo_critic", "CriticModelActor"): "actors.AdoraCriticModelActor: CPU copies of its methods",
    ("openrlhf.trainer.ray.launcher", "BaseDistributedActor"): "every Adora*ModelActor inherits a copy of it",
    (
        "openrlhf.trainer.ray.launcher",
        "BaseModelActor",
    ): "every Adora*ModelActor inherits a copy of it (empty_cache: CPU)",
    (
        "openrlhf.trainer.ray.launcher",
        "ReferenceModelActor",
    ): "actors.AdoraReferenceModelActor: CPU copies of its methods",
    ("openrlhf.trainer.ray.launcher", "RewardModelActor"): "actors.AdoraRewardModelActor: CPU copies of its methods",
    (
        "openrlhf.trainer.ppo_utils.replay_buffer",
        "NaiveReplayBuffer",
    ): "actors.AdoraReplayBuffer: CPU copies of its methods (target device)",
    (
        "openrlhf.utils.deepspeed.deepspeed",
        "DeepspeedStrategy",
    ): "actors.AdoraDeepspeedStrategy: CPU copies (set_device, mesh, collectives, barriers); its DeepSpeed configs (torch_adam, sequential ZeRO-3 gathers)",
    (
        "openrlhf.utils.utils",
        "get_strategy",
    ): "actors.adora_get_strategy re-executes it to build AdoraDeepspeedStrategy",
    (
        "openrlhf.utils.distributed_util",
        "torch_dist_barrier_and_cuda_sync",
    ): "cpu/device.barrier_without_cuda_sync answers it on the CPU",
    (
        "openrlhf.utils.distributed_util",
        "stateless_init_process_group",
    ): "cpu/weight_sync.gloo_process_group answers it for --vllm.sync_backend gloo",
    (
        "openrlhf.trainer.ray.vllm_engine",
        "RolloutRayActor",
    ): "cpu/weight_sync.AdoraRolloutActor: its __init__ with our worker extension and dtype",
    (
        "openrlhf.trainer.ray.vllm_engine",
        "create_vllm_engines",
    ): "cpu/weight_sync.adora_create_vllm_engines re-executes it (AdoraRolloutActor)",
    (
        "openrlhf.trainer.ray.vllm_worker_wrap",
        "WorkerWrap",
    ): "cpu/weight_sync.AdoraWorkerExtension: init_process_group, update_weight (gloo)",
    ("openrlhf.models.ring_attn_utils", "*"): "flash_attn_standin answers its flash_attn imports on a CPU-only machine",
}


def module_path(module: str) -> Path:
    """The installed source file of ``module``, found without importing it or its parent packages (some import
    vLLM): the top-level package's folder, then the dotted path."""
    root, *parts = module.split(".")
    spec = importlib.util.find_spec(root)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"{root}: not installed")
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def source_segment(module: str, name: str) -> str:
    """Source text of a top-level ``def``/``class`` named ``name`` of ``module``, of its ``__main__`` block
    (:data:`MAIN_BLOCK`), or of the whole module (``"*"``)."""
    text = module_path(module).read_text(encoding="utf-8")
    if name == "*":
        return text
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return ast.get_source_segment(text, node, padded=True) or ""
        if name == MAIN_BLOCK and isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return ast.get_source_segment(text, node) or ""
    raise LookupError(f"{module}: no top-level {name!r}")


def source_digest(module: str, name: str) -> str:
    """sha256 of the source text of that piece, with trailing spaces and blank lines dropped."""
    lines = [line.rstrip() for line in source_segment(module, name).splitlines()]
    return hashlib.sha256("\n".join(line for line in lines if line).encode("utf-8")).hexdigest()
