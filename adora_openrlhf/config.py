"""Typed configuration for every component, in one place.

Each dataclass documents its fields where they are defined (field comments are the reference). Every
config validates itself in ``__post_init__`` and raises :class:`ConfigError` naming the field and the fix,
so a bad recipe or flag fails before any model is built.

Configs are plain dataclasses: ``dataclasses.asdict`` gives the JSON saved with each run, and
``from_dict`` rebuilds them (unknown keys are an error, not silently ignored).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, TypeVar


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and how to fix it."""


def _require(condition: bool, field_path: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{field_path}: {message}")


T = TypeVar("T")


def from_dict(cls: type[T], values: Mapping[str, Any], path: str = "") -> T:
    """Build dataclass ``cls`` from a mapping, recursing into nested config dataclasses.

    Unknown keys raise :class:`ConfigError` listing the valid ones.
    """
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(known))
    if unknown:
        where = path or cls.__name__
        raise ConfigError(f"{where}: unknown option(s) {unknown}; valid options are {sorted(known)}")
    kwargs: dict[str, Any] = {}
    for name, value in values.items():
        default = known[name].default_factory if known[name].default_factory is not dataclasses.MISSING else None  # type: ignore[misc]
        sample = default() if callable(default) else None
        if dataclasses.is_dataclass(sample) and isinstance(value, Mapping):
            kwargs[name] = from_dict(type(sample), value, f"{path + '.' if path else ''}{name}")
        else:
            kwargs[name] = value
    return cls(**kwargs)  # type: ignore[call-arg]


# ---------------------------------------------------------------------------------------------------------
# Sampling parameters
# ---------------------------------------------------------------------------------------------------------

SAMPLING_PARAM_NAMES = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass(frozen=True)
class SamplingParams:
    """Decoding parameters for one generation request (the subset shared by vLLM and transformers)."""

    temperature: float = 1.0  # softmax temperature; > 0 (greedy decoding is not used for RL rollouts)
    top_p: float = 1.0  # nucleus sampling mass in (0, 1]
    top_k: int = -1  # keep the k most likely tokens; -1 disables (vLLM convention)
    min_p: float = 0.0  # drop tokens below min_p * p(max token); 0 disables
    repetition_penalty: float = 1.0  # >1 penalises tokens already generated; 1 disables
    max_new_tokens: int = 512  # generation limit per response; a response that hits it is "truncated"

    def __post_init__(self) -> None:
        _require(self.temperature > 0, "sampling.temperature", f"must be > 0, got {self.temperature}")
        _require(0 < self.top_p <= 1, "sampling.top_p", f"must be in (0, 1], got {self.top_p}")
        _require(self.top_k == -1 or self.top_k >= 1, "sampling.top_k", f"must be -1 (off) or >= 1, got {self.top_k}")
        _require(0 <= self.min_p < 1, "sampling.min_p", f"must be in [0, 1), got {self.min_p}")
        _require(self.repetition_penalty > 0, "sampling.repetition_penalty", f"must be > 0, got {self.repetition_penalty}")
        _require(self.max_new_tokens >= 1, "sampling.max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")

    def override(self, changes: Mapping[str, Any]) -> "SamplingParams":
        """Return a copy with ``changes`` applied; unknown parameter names are an error."""
        valid = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - valid)
        _require(not unknown, "sampling.escalation", f"unknown sampling parameter(s) {unknown}; valid: {sorted(valid)}")
        return dataclasses.replace(self, **dict(changes))


# ---------------------------------------------------------------------------------------------------------
# Group advantages
# ---------------------------------------------------------------------------------------------------------


@dataclass
class AdvantageConfig:
    """Group baseline / advantage estimator (see ``algorithms/advantages.py`` for the formulas)."""

    estimator: str = "group_norm"  # one of algorithms.advantages.ADVANTAGE_ESTIMATORS
    eps: float = 1e-9  # added to the group std by group_norm (OpenRLHF 0.11 uses 1e-9)

    def __post_init__(self) -> None:
        from adora_openrlhf.algorithms.advantages import ADVANTAGE_ESTIMATORS

        _require(
            self.estimator in ADVANTAGE_ESTIMATORS,
            "advantage.estimator",
            f"unknown estimator {self.estimator!r}; choose one of {sorted(ADVANTAGE_ESTIMATORS)}",
        )
        _require(self.eps >= 0, "advantage.eps", f"must be >= 0, got {self.eps}")


# ---------------------------------------------------------------------------------------------------------
# ADORA
# ---------------------------------------------------------------------------------------------------------

ADORA_MODES = ("attenuate", "amplify")


@dataclass
class AdoraConfig:
    """ADORA advantage reweighting (see ``algorithms/adora.py``).

    Every prompt group is classed as temporarily advantageous (TAS), disadvantageous (TDS) or neutral (the
    length rule's groups with no correct response). ``attenuate`` multiplies TDS advantages by
    ``lambda_att``; ``amplify`` multiplies TAS advantages by ``lambda_amp``. Neutral groups keep weight 1.
    """

    enabled: bool = False  # off = plain estimator output, untouched
    rule: str = "length"  # group classification rule: one of algorithms.adora.GROUP_RULES ("length", "difficulty")
    mode: str = "attenuate"  # "attenuate" (TDS *= lambda_att; the reference code) or "amplify" (TAS *= lambda_amp)
    lambda_att: float = 0.1  # attenuation factor for TDS groups, in (0, 1]
    lambda_amp: float = 2.0  # amplification factor for TAS groups, >= 1 (paper constant unverified; tune it)
    tau: float = 0.5  # difficulty rule: TAS when 0 < group accuracy <= tau
    correct_threshold: float = 0.5  # a response is correct when reward > this (1.0 for the Logic-RL K&K reward)
    drop_truncated_negatives: bool = True  # length rule: incorrect responses that hit the limit are not counted
    length_shaping: bool = False  # reference LLM option: shift correct rewards by length before normalising
    shaping_beta: float = 0.5  # length shaping magnitude: shift = +-beta * (2u - 1)
    shaping_p: float = 0.5  # length shaping: hard group if #correct < n*p, easy if #correct >= n*(1-p)

    def __post_init__(self) -> None:
        from adora_openrlhf.algorithms.adora import GROUP_RULES

        _require(self.rule in GROUP_RULES, "adora.rule", f"unknown rule {self.rule!r}; choose one of {sorted(GROUP_RULES)}")
        _require(self.mode in ADORA_MODES, "adora.mode", f"unknown mode {self.mode!r}; choose one of {list(ADORA_MODES)}")
        _require(0 < self.lambda_att <= 1, "adora.lambda_att", f"must be in (0, 1] so weights only scale, got {self.lambda_att}")
        _require(self.lambda_amp >= 1 and math.isfinite(self.lambda_amp), "adora.lambda_amp", f"must be a finite value >= 1, got {self.lambda_amp}")
        _require(0 < self.tau <= 1, "adora.tau", f"must be in (0, 1], got {self.tau}")
        _require(self.shaping_beta >= 0, "adora.shaping_beta", f"must be >= 0, got {self.shaping_beta}")
        _require(0 < self.shaping_p <= 1, "adora.shaping_p", f"must be in (0, 1], got {self.shaping_p}")


# ---------------------------------------------------------------------------------------------------------
# Adaptive multi-round sampling (Reinforce-Ada) with adaGRPO escalation
# ---------------------------------------------------------------------------------------------------------

POOL_SCOPES = ("step", "history")


@dataclass
class AdaptiveSamplingConfig:
    """Adaptive multi-round sampling (see ``algorithms/sampling.py``).

    When ``enabled`` is False the sampler does one round of ``n_keep`` responses per prompt and keeps them
    all, which is plain GRPO sampling.
    """

    enabled: bool = False  # False = one round of n_keep responses per prompt (plain GRPO)
    exit_rule: str = "balance"  # when a prompt retires: one of algorithms.sampling.EXIT_RULES ("balance", "pos")
    positive_threshold: float = 0.5  # a response is positive when reward > this (Reinforce-Ada: 0.7 for 0/1 rewards)
    n_keep: int = 4  # responses kept per prompt for training (the group size n)
    samples_per_round: int = 8  # responses generated per round for each still-active prompt
    max_rounds: int = 4  # rounds per training step at most
    max_responses_per_prompt: Optional[int] = None  # hard cap on the pool per prompt per step; None = max_rounds*samples_per_round
    pool_scope: str = "step"  # baseline pool: "step" (this step's responses) or "history" (every step so far)
    drop_unfinished: bool = False  # drop prompts that never retired instead of keeping what they have
    escalation: list[dict[str, Any]] = field(default_factory=list)  # round r>=1 uses escalation[min(r-1, len-1)] over the defaults
    trigger_after_step: int = 0  # escalation is used only from this training step on (adaGRPO's K)

    def __post_init__(self) -> None:
        from adora_openrlhf.algorithms.sampling import EXIT_RULES

        _require(self.exit_rule in EXIT_RULES, "sampling.exit_rule", f"unknown exit rule {self.exit_rule!r}; choose one of {sorted(EXIT_RULES)}")
        _require(self.n_keep >= 1, "sampling.n_keep", f"must be >= 1, got {self.n_keep}")
        _require(self.samples_per_round >= 1, "sampling.samples_per_round", f"must be >= 1, got {self.samples_per_round}")
        _require(self.max_rounds >= 1, "sampling.max_rounds", f"must be >= 1, got {self.max_rounds}")
        _require(self.pool_scope in POOL_SCOPES, "sampling.pool_scope", f"must be one of {list(POOL_SCOPES)}, got {self.pool_scope!r}")
        _require(self.trigger_after_step >= 0, "sampling.trigger_after_step", f"must be >= 0, got {self.trigger_after_step}")
        _require(
            isinstance(self.escalation, list) and all(isinstance(e, Mapping) for e in self.escalation),
            "sampling.escalation",
            "must be a list of mappings such as [{'temperature': 1.2}, {'temperature': 1.4, 'top_p': 1.0}]",
        )
        for i, changes in enumerate(self.escalation):
            unknown = sorted(set(changes) - set(SAMPLING_PARAM_NAMES))
            _require(not unknown, f"sampling.escalation[{i}]", f"unknown sampling parameter(s) {unknown}; valid: {list(SAMPLING_PARAM_NAMES)}")
        if self.enabled:
            budget = self.response_budget
            _require(
                budget >= self.n_keep,
                "sampling.max_responses_per_prompt",
                f"the per-prompt budget ({budget} responses) is smaller than n_keep={self.n_keep}; raise "
                "max_rounds, samples_per_round or max_responses_per_prompt, or lower n_keep",
            )

    @property
    def response_budget(self) -> int:
        """Most responses one prompt may receive in one step."""
        full = self.max_rounds * self.samples_per_round
        return full if self.max_responses_per_prompt is None else min(full, self.max_responses_per_prompt)


# ---------------------------------------------------------------------------------------------------------
# Model, data, optimisation, and the whole run
# ---------------------------------------------------------------------------------------------------------

TASKS = ("kk", "math", "geometry")
PROMPT_TEMPLATE_NAMES = ("auto", "chat", "compact")  # local backend prompt templates (backends/local/tokenization.py)
BACKENDS = ("local", "openrlhf")


@dataclass
class TinyModelConfig:
    """Random-init Qwen2-style causal LM built on the spot when no ``model.path`` is given (local backend)."""

    vocab_size: int = 512  # size of the byte-level BPE tokenizer trained on the task corpus
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024

    def __post_init__(self) -> None:
        _require(self.hidden_size % self.num_attention_heads == 0, "model.tiny.hidden_size", "must be divisible by num_attention_heads")
        _require(self.num_attention_heads % self.num_key_value_heads == 0, "model.tiny.num_key_value_heads", "must divide num_attention_heads")
        _require(self.vocab_size >= 256, "model.tiny.vocab_size", f"must be >= 256 (byte alphabet), got {self.vocab_size}")


@dataclass
class TinyVisionConfig:
    """Vision tower of the tiny random-init Qwen2.5-VL built for ``data.task geometry`` (local backend)."""

    image_size: int = field(default=64, metadata={"help": "images are resized to image_size x image_size pixels; must be a multiple of patch_size * spatial_merge_size"})
    patch_size: int = field(default=8, metadata={"help": "ViT patch side in pixels; (image_size / patch_size)^2 / spatial_merge_size^2 image tokens per image"})
    spatial_merge_size: int = field(default=2, metadata={"help": "patches merged per side into one language-model token"})
    depth: int = field(default=2, metadata={"help": "vision transformer blocks (the last one uses full attention)"})
    hidden_size: int = field(default=64, metadata={"help": "vision transformer width"})
    intermediate_size: int = field(default=128, metadata={"help": "vision MLP width"})
    num_heads: int = field(default=2, metadata={"help": "vision attention heads; must divide hidden_size"})

    def __post_init__(self) -> None:
        unit = self.patch_size * self.spatial_merge_size
        _require(self.patch_size >= 1 and self.spatial_merge_size >= 1, "model.tiny_vision.patch_size", "patch_size and spatial_merge_size must be >= 1")
        _require(self.image_size >= unit and self.image_size % unit == 0, "model.tiny_vision.image_size",
                 f"must be a positive multiple of patch_size * spatial_merge_size = {unit}, got {self.image_size}")
        _require(self.depth >= 1, "model.tiny_vision.depth", f"must be >= 1, got {self.depth}")
        _require(self.hidden_size % self.num_heads == 0, "model.tiny_vision.hidden_size", "must be divisible by num_heads")


@dataclass
class ModelConfig:
    """Policy model: a local Hugging Face checkpoint or the tiny model."""

    path: Optional[str] = None  # local HF causal-LM directory (or hub name on the cluster); None -> tiny model
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    tiny_vision: TinyVisionConfig = field(default_factory=TinyVisionConfig, metadata={"help": "vision tower of the tiny Qwen2.5-VL (data.task geometry, no model.path)"})
    lora_rank: int = 0  # > 0 trains LoRA adapters (peft) instead of all weights
    lora_alpha: int = 16
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    dtype: str = "float32"  # "float32" | "bfloat16" | "float16"
    generation_batch_size: int = 64  # local backend: sequences per model.generate call (memory bound)

    def __post_init__(self) -> None:
        _require(self.generation_batch_size >= 1, "model.generation_batch_size", f"must be >= 1, got {self.generation_batch_size}")
        _require(self.lora_rank >= 0, "model.lora_rank", f"must be >= 0, got {self.lora_rank}")
        _require(self.dtype in ("float32", "bfloat16", "float16"), "model.dtype", f"must be float32, bfloat16 or float16, got {self.dtype!r}")


@dataclass
class DataConfig:
    """Training / evaluation prompts in the one JSONL schema (prompt, label, images, source, meta)."""

    task: str = "kk"  # "kk" | "math" | "geometry": picks the reward and the prompt template
    train_path: Optional[str] = None  # JSONL file or HF dataset name; None -> generated K&K puzzles (task kk)
    eval_path: Optional[str] = None  # held-out JSONL; None -> generated K&K puzzles disjoint from training
    kk_num_people: list[int] = field(default_factory=lambda: [2, 3])  # people per generated puzzle (task kk), cycled: [2, 2, 3] = two 2-person per 3-person
    num_train: int = 2000  # generated training puzzles
    num_eval: int = 100  # generated held-out puzzles
    max_prompt_tokens: int = 512  # prompts longer than this are rejected with their row index
    geo_tasks: list[str] = field(default_factory=lambda: ["count", "most", "larger"], metadata={"help": "task geometry without train_path: question kinds of the generated images (data_prep.geo_synth.TASKS)"})
    geo_levels: list[int] = field(default_factory=lambda: [1, 2, 3, 4], metadata={"help": "task geometry without train_path: difficulty levels 1..4 of the generated images (more shapes, distractors, closer sizes)"})
    prompt_template: str = "auto"  # local backend: "auto" (chat template if the tokenizer has one, else "compact") | "chat" | "compact"

    def __post_init__(self) -> None:
        _require(self.prompt_template in PROMPT_TEMPLATE_NAMES, "data.prompt_template", f"unknown template {self.prompt_template!r}; choose one of {list(PROMPT_TEMPLATE_NAMES)}")
        _require(self.task in TASKS, "data.task", f"unknown task {self.task!r}; choose one of {list(TASKS)}")
        _require(all(2 <= k <= 8 for k in self.kk_num_people) and self.kk_num_people, "data.kk_num_people", "each must be in 2..8")
        _require(self.num_train >= 1 and self.num_eval >= 1, "data.num_train", "num_train and num_eval must be >= 1")
        _require(bool(self.geo_tasks) and all(t in ("count", "most", "larger") for t in self.geo_tasks), "data.geo_tasks",
                 f"each must be one of count, most, larger, got {self.geo_tasks}")
        _require(bool(self.geo_levels) and all(1 <= v <= 4 for v in self.geo_levels), "data.geo_levels", f"each must be in 1..4, got {self.geo_levels}")


@dataclass
class PolicyLossConfig:
    """Token-level PPO-clip objective with optional KL to a frozen reference."""

    lr: float = 1e-5  # AdamW learning rate
    weight_decay: float = 0.0
    clip_eps_low: float = 0.2  # ratio clipped to [1 - clip_eps_low, 1 + clip_eps_high]
    clip_eps_high: float = 0.2  # DAPO's clip-higher uses e.g. 0.28
    kl_coef: float = 0.0  # > 0 adds kl_coef * KL(policy || reference) (k3 estimator) per token
    max_grad_norm: float = 1.0  # gradient clipping
    ppo_epochs: int = 1  # passes over each rollout batch
    micro_batch_size: int = 8  # responses per forward/backward
    loss_agg: str = "token_mean"  # "token_mean" (DAPO) | "seq_mean_token_mean" (GRPO paper) | "seq_mean_token_sum_norm" (Dr. GRPO)

    def __post_init__(self) -> None:
        _require(self.lr > 0, "train.lr", f"must be > 0, got {self.lr}")
        _require(self.clip_eps_low > 0 and self.clip_eps_high > 0, "train.clip_eps_low", "clip ranges must be > 0")
        _require(self.kl_coef >= 0, "train.kl_coef", f"must be >= 0, got {self.kl_coef}")
        _require(self.ppo_epochs >= 1, "train.ppo_epochs", f"must be >= 1, got {self.ppo_epochs}")
        _require(self.micro_batch_size >= 1, "train.micro_batch_size", f"must be >= 1, got {self.micro_batch_size}")
        _require(
            self.loss_agg in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"),
            "train.loss_agg",
            f"unknown loss aggregation {self.loss_agg!r}; choose token_mean, seq_mean_token_mean or seq_mean_token_sum_norm",
        )


@dataclass
class WarmupConfig:
    """Supervised warm-up before RL (local backend): next-token loss on the task's demonstrations (for K&K,
    the canonical solution in the Logic-RL answer format), so a random-init model has some reward signal."""

    steps: int = 0  # optimiser steps of supervised training before RL; 0 = none
    lr: float = 1e-3  # AdamW learning rate of the warm-up (linear decay to 0)
    batch_size: int = 32  # demonstrations per warm-up step

    def __post_init__(self) -> None:
        _require(self.steps >= 0, "warmup.steps", f"must be >= 0, got {self.steps}")
        _require(self.lr > 0, "warmup.lr", f"must be > 0, got {self.lr}")
        _require(self.batch_size >= 1, "warmup.batch_size", f"must be >= 1, got {self.batch_size}")


@dataclass
class RunConfig:
    """One training run: recipe name, backend and every component's config."""

    recipe: str = "kk-tiny"
    backend: str = "local"  # "local" (embedded, one process) | "openrlhf" (Ray + vLLM + DeepSpeed cluster)
    seed: int = 0
    steps: int = 100  # RL steps (each: sample, score, advantages, policy update)
    prompts_per_step: int = 8  # prompts per RL step (rollout batch)
    output_dir: str = "runs/kk-tiny"
    save_every: int = 25  # checkpoint every k steps (0 = only at the end)
    eval_every: int = 25  # held-out evaluation every k steps (0 = only at start and end)
    rollout: SamplingParams = field(default_factory=SamplingParams)  # default (round-0) sampling parameters
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    adora: AdoraConfig = field(default_factory=AdoraConfig)
    sampling: AdaptiveSamplingConfig = field(default_factory=AdaptiveSamplingConfig)  # n_keep = group size n
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)  # local backend: supervised warm-up before RL
    eval_samples: int = 1  # held-out evaluation: sampled responses per puzzle (rollout parameters) besides the greedy one; 0 = greedy only
    extra: dict[str, Any] = field(default_factory=dict)  # backend-specific options (e.g. OpenRLHF pass-through flags)

    def __post_init__(self) -> None:
        _require(self.backend in BACKENDS, "backend", f"unknown backend {self.backend!r}; choose one of {list(BACKENDS)}")
        _require(self.steps >= 1, "steps", f"must be >= 1, got {self.steps}")
        _require(self.prompts_per_step >= 1, "prompts_per_step", f"must be >= 1, got {self.prompts_per_step}")
        _require(self.save_every >= 0 and self.eval_every >= 0, "save_every", "save_every and eval_every must be >= 0")
        _require(self.eval_samples >= 0, "eval_samples", f"must be >= 0, got {self.eval_samples}")

    @property
    def n_samples_per_prompt(self) -> int:
        """The training group size n (kept responses per prompt)."""
        return self.sampling.n_keep

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(values: Mapping[str, Any]) -> "RunConfig":
        return from_dict(RunConfig, values)
