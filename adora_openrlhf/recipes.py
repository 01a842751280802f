"""Named recipes: each one a :class:`RunConfig` preset for one training.

A recipe is a nested dict of overrides on the :class:`RunConfig` defaults plus the backends it can run on.
``build_run_config("kk-tiny", {"adora.enabled": True})`` gives a validated config; an unknown name lists
the known ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from adora_openrlhf.cli_args import apply_overrides
from adora_openrlhf.config import RunConfig
from adora_openrlhf.dotted import merge
from adora_openrlhf.registry import Registry


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    backends: tuple[str, ...]  # backends able to run it; the first is the default
    overrides: Mapping[str, Any] = field(default_factory=dict)  # nested dict over RunConfig defaults
    needs_gpu_reason: str = ""  # why the local backend refuses it (empty: local is fine)


RECIPES: Registry[Recipe] = Registry("recipe", "recipe")


def register_recipe(recipe: Recipe) -> Recipe:
    return RECIPES.add(recipe.name, recipe)


def get_recipe(name: str) -> Recipe:
    """The recipe ``name``; an unknown name raises a ConfigError listing the recipes."""
    return RECIPES.get(name)


def build_run_config(name: str, overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """RunConfig of recipe ``name`` with dotted ``overrides`` applied on top (:func:`apply_overrides`), validated."""
    recipe = get_recipe(name)
    values = merge(
        RunConfig(recipe=name).to_dict(), {"recipe": name, "backend": recipe.backends[0], "output_dir": f"runs/{name}"}
    )
    values = merge(values, recipe.overrides)
    values = apply_overrides(values, overrides or {})
    return RunConfig.from_dict(values)


# ---------------------------------------------------------------------------------------------------------
# The recipes
# ---------------------------------------------------------------------------------------------------------


def _local_recipe(
    name: str, description: str, base: Mapping[str, Any], changes: Mapping[str, Any] | None = None
) -> Recipe:
    """Register a local-backend recipe: ``base`` settings with ``changes`` merged on top."""
    return register_recipe(Recipe(name, description, ("local",), merge(dict(base), changes or {})))


_KK_TINY = {
    "steps": 100,
    "prompts_per_step": 16,
    "save_every": 50,
    "eval_every": 50,
    "eval_samples": 2,  # held-out: one greedy + two sampled responses per puzzle
    "rollout": {"temperature": 1.0, "max_new_tokens": 64},
    "adora": {"correct_threshold": 1.0},  # Logic-RL reward: format +1, answer up to +2
    "sampling": {"n_keep": 8},
    # 2-person puzzles: the tiny model learns them within the time budget; add 3 with --data.kk.num_people [2,3]
    "data": {"task": "kk", "kk": {"num_people": [2]}, "num_train": 2000, "num_eval": 200, "prompt_template": "auto"},
    "model": {"tiny": {"vocab_size": 512, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4}},
    "warmup": {"steps": 400, "lr": 3e-3, "batch_size": 32},
    "train": {"lr": 5e-4, "micro_batch_size": 32},
}

# The K&K reasoning testbed (docs/local_backend.md): 2- and 3-person puzzles (a spread of difficulty: a guess is
# right 1/4 or 1/8 of the time, the thorough trace of a 3-person puzzle is about twice as long and fails more
# often), names from a pool of 3 in pool order (the tiny model's capacity goes to the logic, not to copying
# names). Phase 1 of the warm-up teaches the thorough guess-and-check trace (with a few "guess" shortcuts so
# that both branches exist); phase 2 shifts the mixture to mostly shortcuts at a low learning rate, which sets
# how often the policy guesses while keeping how well it checks; greedy decoding then always guesses. RL has a
# behaviour to select: thorough reasoning is longer and right far more often than a guess.
_KK_TESTBED = {
    "steps": 40,
    "prompts_per_step": 16,
    "save_every": 20,
    "eval_every": 10,
    "eval_samples": 0,  # held-out: greedy only (--eval_samples 1 adds one sampled response per puzzle)
    "rollout": {"temperature": 1.0, "max_new_tokens": 400},  # the longest 3-person thorough trace is about 330 tokens
    "adora": {"correct_threshold": 1.0, "edge_policy": "llm"},  # the ADORA K&K (LLM) reference's edge cases
    "sampling": {"n_keep": 8},
    # 2- and 3-person puzzles over a pool of 3 names, alternating: 1200 for training and 200 held out (no quiz in common)
    "data": {
        "task": "kk",
        "kk": {"num_people": [2, 3], "name_pool": 3, "name_order": "pool"},
        "num_train": 1200,
        "num_eval": 200,
        "prompt_template": "auto",
    },
    "model": {
        "tiny": {"vocab_size": 512, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4},
        "generation_batch_size": 128,
    },
    "warmup": {
        "steps": 1200,
        "lr": 3e-3,
        "lr_ramp": 0.03,
        "batch_size": 16,
        "style_shares": {"thorough": 0.85, "restate": 0.15},
        "mix_steps": 60,
        "mix_lr": 3e-4,  # at 1e-3 phase 2 also unlearned much of the checking (3-person accuracy 0.80 -> 0.53)
        "mix": {"thorough": 0.25, "restate": 0.75},
    },
    # micro-batches of 4 sequences of similar length pad little (the gradient is the same, summed in more pieces)
    "train": {"lr": 1.5e-4, "micro_batch_size": 4},
}

_local_recipe(
    "kk-tiny",
    "Tiny random-init model and BPE tokenizer, direct-answer SFT warm-up, GRPO on generated 2-person K&K puzzles (CPU).",
    _KK_TINY,
)
_local_recipe("kk-tiny-adora", "kk-tiny with ADORA length-rule attenuation.", _KK_TINY, {"adora": {"enabled": True}})
_local_recipe(
    "kk-tiny-ada",
    "kk-tiny with adaptive multi-round sampling (balance exit rule).",
    _KK_TINY,
    {"sampling": {"enabled": True, "exit_rule": "balance", "samples_per_round": 8, "max_rounds": 2}},
)

_local_recipe(
    "kk-testbed",
    "Embedded default, the K&K reasoning testbed: warm-up on thorough guess-and-check traces, then mostly shortcuts; GRPO selects thorough reasoning (CPU).",
    _KK_TESTBED,
)
_local_recipe(
    "kk-testbed-adora", "kk-testbed with ADORA length-rule attenuation.", _KK_TESTBED, {"adora": {"enabled": True}}
)

# Where allocation matters: the kk-testbed warm-up on all 1200 training puzzles, then RL on the first 128 of them
# only (data.rl_prompts), 80 steps of 16 prompts: each RL prompt is seen 10 times, and under GRPO most groups of
# the later epochs are all correct or all wrong. Held-out: 1000 puzzles (standard error of an accuracy about 0.01)
# every 5 steps, so that accuracy against generated tokens resolves a 2x saving (bench/allocation.py).
_local_recipe(
    "kk-revisit",
    "kk-testbed's warm-up, then RL on 128 of its puzzles seen 10 times each (80 steps), 1000 held out: the regime of the allocation benchmark.",
    _KK_TESTBED,
    {"steps": 80, "eval_every": 5, "save_every": 20, "data": {"num_eval": 1000, "rl_prompts": 128}},
)


# The vision-language path on CPU: a tiny random-init Qwen2.5-VL (vision tower + language model, processor
# saved with the run) on generated PIL images (tasks/geo_synth.py), graded by the Geometry3K reward
# (0.9 * correct + 0.1 * format, so correct_threshold 0.5), with ADORA's difficulty rule as in geo3k.
# The vision encoder stays frozen (model.freeze_visual_encoder; docs/local_backend.md, "What kept the warm-up from
# reading the images"). Questions: colour and larger, levels 1-4.
_GEO_TINY = {
    "steps": 40,
    "prompts_per_step": 8,
    "save_every": 20,
    "eval_every": 20,
    "eval_samples": 1,
    "rollout": {"temperature": 1.0, "max_new_tokens": 32},
    "adora": {"rule": "difficulty", "mode": "attenuate", "lambda_att": 0.1, "tau": 0.5, "correct_threshold": 0.5},
    "sampling": {"n_keep": 8},
    "data": {
        "task": "geometry",
        "geo": {"tasks": ["colour", "larger"]},
        "num_train": 2000,
        "num_eval": 200,
        "max_prompt_tokens": 128,
        "prompt_template": "auto",
    },
    "model": {
        "tiny": {"vocab_size": 512, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4},
        "freeze_visual_encoder": True,
    },
    "warmup": {"steps": 400, "lr": 1e-3, "batch_size": 32},
    "train": {"lr": 1e-4, "micro_batch_size": 32},
}

_local_recipe(
    "geo-tiny",
    "Vision-language path on CPU: tiny random-init Qwen2.5-VL (vision encoder frozen), SFT warm-up, GRPO on generated shape images (colour / larger).",
    _GEO_TINY,
)
_local_recipe(
    "geo-tiny-adora",
    "geo-tiny with ADORA's difficulty rule (TAS: 0 < group accuracy <= 0.5), attenuation 0.1.",
    _GEO_TINY,
    {"adora": {"enabled": True}},
)


# The geometry testbed (docs/local_backend.md, "The geometry testbed"): colour questions about 1 to 3 shapes
# (a spread of difficulty: reading one shape is nearly always right, three shapes about half the time). Phase 1
# of the warm-up teaches the reading (the think names every shape's colour and kind, then the answer), with a
# few "default" shortcuts (think "guess.", then always the first choice); phase 2 mixes the two at a low
# learning rate, after which greedy decoding mostly takes the shortcut. RL has a behaviour to select: reading is
# longer and right far more often than the default answer (1 in 4).
_GEO_TESTBED = merge(
    dict(_GEO_TINY),
    {
        "prompts_per_step": 16,
        "eval_every": 10,
        "eval_samples": 0,  # held-out: greedy only
        "data": {"geo": {"tasks": ["colour"], "levels": [1, 2, 3]}},
        "warmup": {
            "steps": 1600,
            "style_shares": {"read": 0.85, "default": 0.15},
            "mix_steps": 60,
            "mix_lr": 3e-4,
            "mix": {"read": 0.5, "default": 0.5},
        },
    },
)
_local_recipe(
    "geo-testbed",
    "Vision-language testbed: warm-up on reading the image in the think, then mostly a default answer; GRPO selects reading (CPU).",
    _GEO_TESTBED,
)
_local_recipe(
    "geo-testbed-adora",
    "geo-testbed with ADORA's difficulty rule (TAS: 0 < group accuracy <= 0.5), attenuation 0.1.",
    _GEO_TESTBED,
    {"adora": {"enabled": True}},
)

# ---------------------------------------------------------------------------------------------------------
# Cluster recipes (openrlhf backend). Each is run by a script in recipes/ (`ray job submit` ready); the
# OpenRLHF-only flags live in extra["openrlhf"] (see backends/openrlhf/flags.py). Data paths are the
# data_prep outputs under data/; the scripts point them at shared storage.
# ---------------------------------------------------------------------------------------------------------

_CLUSTER_GPU_REASON = (
    "a 7B-class model with vLLM rollouts and DeepSpeed training needs a GPU cluster (openrlhf backend)"
)


def _cluster_recipe(
    name: str, description: str, base: Mapping[str, Any], changes: Mapping[str, Any] | None = None
) -> Recipe:
    """Register an openrlhf-backend recipe: ``base`` settings with ``changes`` merged on top."""
    return register_recipe(
        Recipe(name, description, ("openrlhf",), merge(dict(base), changes or {}), _CLUSTER_GPU_REASON)
    )


# Logic-RL K&K 3-7 people, settings of the ADORA LLM script (ShadeCloak/ADORA, ADORA/ADORA.sh): 64 prompts
# per step, 16 responses, prompt 400 / response 2048 tokens, lr 3e-7, KL loss 0.001 (low_var_kl = k3),
# PPO mini-batch 32 prompts, ADORA length rule lambda 0.1, 4 GPUs, 5 epochs.
_KK_7B = {
    "steps": 350,  # caps the prompts read per epoch at 350 x 64 (data.max_samples); 5 epochs below, as in ADORA.sh
    "prompts_per_step": 64,
    "save_every": 10,
    "eval_every": 10,
    "eval_samples": 4,  # --eval.n_samples_per_prompt (OpenRLHF's default) at --eval.temperature
    "rollout": {"temperature": 1.0, "max_new_tokens": 2048},
    "advantage": {"estimator": "group_norm"},
    # edge groups as the LLM reference (verl code); its 3900-of-4096 truncation cut is not carried over to the
    # 2048-token limit here: the engine's length flag marks truncated responses
    "adora": {"rule": "length", "mode": "attenuate", "lambda_att": 0.1, "correct_threshold": 1.0, "edge_policy": "llm"},
    "sampling": {"n_keep": 16},
    "model": {"path": "Qwen/Qwen2.5-7B-Instruct-1M", "dtype": "bfloat16"},
    # Logic-RL's own answer rule: the reward the ADORA K&K results were trained with
    "data": {
        "task": "kk",
        "train_path": "data/kk/train.jsonl",
        "eval_path": "data/kk/test.jsonl",
        "max_prompt_tokens": 400,
        "kk": {"parser": "logic_rl"},
    },
    # constant lr: verl's default (ADORA.sh sets no schedule); OpenRLHF's own default is cosine_with_min_lr
    "train": {
        "lr": 3e-7,
        "lr_scheduler": "constant",
        "kl_coef": 0.001,
        "micro_batch_size": 4,
        "clip_eps_low": 0.2,
        "clip_eps_high": 0.2,
    },
    "extra": {
        "openrlhf": {
            "actor.num_nodes": 1,
            "actor.num_gpus_per_node": 4,
            "ref.num_nodes": 1,
            "ref.num_gpus_per_node": 4,
            "vllm.num_engines": 4,
            "vllm.tensor_parallel_size": 1,
            "vllm.gpu_memory_utilization": 0.6,
            "vllm.enable_sleep": True,
            "ds.enable_sleep": True,
            "train.colocate_all": True,
            "ds.zero_stage": 3,
            "ds.param_dtype": "bf16",
            "actor.gradient_checkpointing_enable": True,
            "ds.packing_samples": True,
            "train.batch_size": 512,  # PPO mini-batch: 32 prompts x 16 responses (two updates per step)
            "rollout.micro_batch_size": 16,
            "actor.adam.betas": [0.9, 0.999],  # torch/verl default; OpenRLHF's is (0.9, 0.95)
            "train.num_episodes": 5,
            "ckpt.save_hf": True,
        }
    },
}

_cluster_recipe(
    "kk-qwen2.5-7b-adora",
    "Qwen2.5-7B-Instruct-1M on K&K 3-7 people with ADORA length-rule attenuation (Logic-RL settings of the ADORA README), 4 GPUs.",
    _KK_7B,
    {"adora": {"enabled": True}},
)
_cluster_recipe(
    "kk-qwen2.5-7b-grpo", "GRPO baseline of kk-qwen2.5-7b-adora (same settings, ADORA off), 4 GPUs.", _KK_7B
)

# DAPO-Math-17k with Reinforce-Ada's balanced multi-round sampling. Settings of the Reinforce-Ada verl script
# (RLHFlow/Reinforce-Ada, scripts/run_reinforce_ada.sh): n = 4 kept responses, "balanced" exit rule, pool
# ("global") statistics for the baseline without std normalisation (dr_grpo here), lr 1e-6, clip 0.2/0.28,
# no KL, prompt 1024 tokens, temperature 1.0, PPO mini-batch 128 prompts, 400 steps, 8 GPUs. Rounds of 8
# samples, at most 4 rounds (the Tinker version's defaults). DAPO's overlong penalty buffer is kept.
_DAPO = {
    "steps": 400,  # reached through train.num_episodes below (an episode ends when the ~17K prompts run out)
    "prompts_per_step": 256,
    "save_every": 50,
    "eval_every": 50,
    "eval_samples": 0,  # greedy validation (--eval.n_samples_per_prompt 1 --eval.temperature 0, as in extra below)
    "rollout": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 4096},
    "advantage": {"estimator": "dr_grpo"},
    # edge groups and truncation cut (3900 of 4096 tokens) as the LLM reference (verl code)
    "adora": {
        "rule": "length",
        "mode": "attenuate",
        "lambda_att": 0.1,
        "correct_threshold": 0.5,
        "edge_policy": "llm",
        "truncation_length": 3900,
    },
    "sampling": {
        "n_keep": 4,
        "exit_rule": "balance",
        "samples_per_round": 8,
        "max_rounds": 4,
        "pool_scope": "step",
    },
    "model": {"path": "Qwen/Qwen3-1.7B", "dtype": "bfloat16"},
    "data": {
        "task": "math",
        "train_path": "data/dapo_math/train.jsonl",
        "eval_path": "data/math_eval/math500.jsonl",
        "max_prompt_tokens": 1024,
    },
    # Reinforce-Ada: constant lr after 10 warm-up steps, ~20 optimiser steps (10 rollout steps x 2 updates) of ~815
    "train": {
        "lr": 1e-6,
        "lr_scheduler": "constant_with_warmup",
        "lr_warmup_ratio": 0.025,
        "kl_coef": 0.0,
        "micro_batch_size": 8,
        "clip_eps_low": 0.2,
        "clip_eps_high": 0.28,
    },
    "extra": {
        "openrlhf": {
            "actor.num_nodes": 1,
            "actor.num_gpus_per_node": 8,
            "vllm.num_engines": 8,
            "vllm.tensor_parallel_size": 1,
            "vllm.gpu_memory_utilization": 0.7,
            "vllm.enable_sleep": True,
            "ds.enable_sleep": True,
            "train.colocate_all": True,
            "ds.zero_stage": 2,
            "ds.param_dtype": "bf16",
            "actor.gradient_checkpointing_enable": True,
            "ds.packing_samples": True,
            "train.batch_size": 512,  # PPO mini-batch: 128 prompts x 4 responses (two updates per step)
            "rollout.micro_batch_size": 16,
            "reward.overlong_buffer_len": 1024,  # DAPO overlong shaping over the last 1024 tokens
            "reward.overlong_penalty_factor": 1.0,
            "actor.adam.betas": [0.9, 0.999],  # verl default; OpenRLHF's is (0.9, 0.95)
            "eval.temperature": 0.0,  # Reinforce-Ada validates greedily: one greedy response per problem
            "eval.n_samples_per_prompt": 1,
            "train.num_episodes": 6,  # ~400 steps: 6 passes over ~17K prompts at 256 per step
            "ckpt.save_hf": True,
        }
    },
}

_cluster_recipe(
    "dapo-math-adora",
    "DAPO-Math-17k on Qwen3-1.7B (or Qwen2.5-Math-7B) with adaptive multi-round sampling (balance) and ADORA, 8 GPUs.",
    _DAPO,
    {"adora": {"enabled": True}, "sampling": {"enabled": True}},
)
# The baseline and the two ablations differ from dapo-math-adora only by the method: same estimator
# (dr_grpo), settings and budget of kept responses; adaptive sampling and ADORA switched off one at a time.
_cluster_recipe(
    "dapo-math-grpo",
    "Baseline of dapo-math-adora: dr_grpo with one round of n = 4 responses, ADORA off, 8 GPUs.",
    _DAPO,
)
_cluster_recipe(
    "dapo-math-ada",
    "Ablation of dapo-math-adora: adaptive multi-round sampling (balance) alone, ADORA off, 8 GPUs.",
    _DAPO,
    {"sampling": {"enabled": True}},
)
_cluster_recipe(
    "dapo-math-adora-only",
    "Ablation of dapo-math-adora: ADORA alone on one round of n = 4 responses (dr_grpo), 8 GPUs.",
    _DAPO,
    {"adora": {"enabled": True}},
)

# Geometry3K with Qwen2.5-VL-7B-Instruct, settings of the ADORA VLM script (ShadeCloak/ADORA,
# ADORA_VL/examples/scripts/qwen25vl_7b_geo3k_adora.sh): 128 prompts x 8 responses, 128 samples per PPO
# update, lr 1e-6, weight decay 1e-2, KL loss 0.001 (k3), prompt/response 4096 tokens, ZeRO-3, 15 episodes,
# actor 4 GPUs + reference colocated + 2 vLLM engines of tensor parallel 2 (8 GPUs). Here the group rule is
# ADORA's difficulty rule with attenuation.
_GEO3K = {
    "steps": 240,  # 15 episodes over ~2.1K training problems at 128 prompts per step
    "prompts_per_step": 128,
    "save_every": 50,
    "eval_every": 25,
    "eval_samples": 4,  # --eval.n_samples_per_prompt (OpenRLHF's default) at --eval.temperature
    "rollout": {"temperature": 1.0, "max_new_tokens": 4096},
    "advantage": {"estimator": "group_norm"},
    # edge_policy "vlm" (the VLM reference) matters only if --adora.rule length is chosen
    "adora": {
        "rule": "difficulty",
        "mode": "attenuate",
        "lambda_att": 0.1,
        "tau": 0.5,
        "correct_threshold": 0.5,
        "edge_policy": "vlm",
    },
    "sampling": {"n_keep": 8},
    "model": {"path": "Qwen/Qwen2.5-VL-7B-Instruct", "dtype": "bfloat16"},
    "data": {
        "task": "geometry",
        "train_path": "data/geometry3k/train.jsonl",
        "eval_path": "data/geometry3k/test.jsonl",
        "max_prompt_tokens": 4096,
    },
    # OpenRLHF's default schedule (the reference script sets none) without its warm-up
    "train": {
        "lr": 1e-6,
        "lr_scheduler": "cosine_with_min_lr",
        "lr_warmup_ratio": 0.0,
        "min_lr_ratio": 0.1,
        "weight_decay": 0.01,
        "kl_coef": 0.001,
        "micro_batch_size": 4,
    },
    "extra": {
        "openrlhf": {
            "actor.num_nodes": 1,
            "actor.num_gpus_per_node": 4,
            "ref.num_nodes": 1,
            "ref.num_gpus_per_node": 4,
            "train.colocate_actor_ref": True,
            "vllm.num_engines": 2,
            "vllm.tensor_parallel_size": 2,
            "vllm.gpu_memory_utilization": 0.7,
            "ds.zero_stage": 3,
            "ds.param_dtype": "bf16",
            "ds.adam_offload": True,
            "actor.gradient_checkpointing_enable": True,
            "train.batch_size": 128,
            "rollout.micro_batch_size": 8,
            "train.num_episodes": 15,
            "ckpt.save_hf": True,
        }
    },
}

_cluster_recipe(
    "geo3k-qwen2.5vl-7b-adora",
    "Qwen2.5-VL-7B-Instruct on Geometry3K with ADORA's difficulty rule and attenuation (ADORA VLM settings), 8 GPUs.",
    _GEO3K,
    {"adora": {"enabled": True}},
)
_cluster_recipe(
    "geo3k-qwen2.5vl-7b-grpo", "GRPO baseline of geo3k-qwen2.5vl-7b-adora (same settings, ADORA off), 8 GPUs.", _GEO3K
)


# The RL phase of kk-testbed on the openrlhf backend: the same settings (40 steps of 16 prompts x 8 responses,
# lr 1.5e-4, 400 new tokens, greedy held-out evaluation every 10 steps), started from a kk-testbed warm start
# (--model) on the testbed's puzzles written as JSONL (`python -m adora_openrlhf.testbed_files`).
# One vLLM engine and one DeepSpeed actor: one GPU, or a machine without one (the CPU run of the backend).
# Adam's betas are torch's (0.9, 0.999), as in the local backend (OpenRLHF's default is (0.9, 0.95)).
_KK_TESTBED_OPENRLHF = {
    "steps": 40,
    "prompts_per_step": 16,
    "save_every": 20,
    "eval_every": 10,
    "eval_samples": 0,
    "rollout": {"temperature": 1.0, "max_new_tokens": 400},
    "adora": {"correct_threshold": 1.0, "edge_policy": "llm"},
    "sampling": {"n_keep": 8},
    # as the local backend; bf16 is ~12x slower on AVX2 CPUs
    "model": {
        "path": "runs/kk-testbed-warm-start",
        "dtype": "float32",
    },
    "data": {
        "task": "kk",
        "train_path": "data/kk-testbed/train.jsonl",
        "eval_path": "data/kk-testbed/test.jsonl",
        "prompt_template": "auto",
    },
    "train": {"lr": 1.5e-4, "micro_batch_size": 4},
    "extra": {
        "openrlhf": {
            "vllm.num_engines": 1,
            "actor.num_gpus_per_node": 1,
            "ref.num_gpus_per_node": 1,
            "actor.adam.betas": [0.9, 0.999],
            "ds.zero_stage": 2,
        }
    },
}
register_recipe(
    Recipe(
        "kk-testbed-openrlhf",
        "The kk-testbed RL phase on the openrlhf backend from a kk-testbed warm start (--model): one vLLM engine, one DeepSpeed actor, GPU or CPU.",
        ("openrlhf",),
        _KK_TESTBED_OPENRLHF,
    )
)
