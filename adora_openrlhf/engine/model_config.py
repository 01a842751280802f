"""The model section of a run's config (``model.*``): the policy's path or the tiny random-init model's shape
(:class:`TinyModelConfig`, with :class:`TinyVisionConfig` for the vision tower), LoRA, precision, and how the local
backend's engine generates (``model.kv_cache``, ``model.decoding``, ``model.numerics``). ``config.RunConfig``
assembles it with the other sections (and re-exports these names); it imports nothing of the engine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from adora_openrlhf.config_checks import check_choice, check_field_types, check_number, option, require
from adora_openrlhf.errors import ConfigError

KV_CACHES = ("growing", "dynamic")  # engine/kv_cache.py: model.generate's key/value cache
DECODINGS = ("compact", "generate")  # engine/decoding.py: the local backend's decoding loop
NUMERICS = ("exact", "fast")  # engine/decoding.py's NUMERICS: how compact decoding computes a step


@dataclass
class TinyModelConfig:
    """Random-init Qwen2-style causal LM built on the spot when no ``model.path`` is given (local backend)."""

    vocab_size: int = option(512, "size of the byte-level BPE tokenizer trained on the task corpus")
    hidden_size: int = option(128, "tiny LM width")
    intermediate_size: int = option(384, "tiny LM MLP width")
    num_hidden_layers: int = option(4, "tiny LM transformer blocks")
    num_attention_heads: int = option(4, "tiny LM attention heads; must divide hidden_size")
    num_key_value_heads: int = option(
        2, "tiny LM key/value heads (grouped-query attention); must divide num_attention_heads"
    )
    max_position_embeddings: int = option(1024, "tiny LM context length in tokens (prompt + response)")

    def __post_init__(self) -> None:
        check_field_types(self, "model.tiny")
        for name in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
        ):
            check_number(getattr(self, name), f"model.tiny.{name}", integer=True, ge=1)
        require(
            self.hidden_size % self.num_attention_heads == 0,
            "model.tiny.hidden_size",
            "must be divisible by num_attention_heads",
        )
        require(
            self.num_attention_heads % self.num_key_value_heads == 0,
            "model.tiny.num_key_value_heads",
            "must divide num_attention_heads",
        )
        check_number(self.vocab_size, "model.tiny.vocab_size", integer=True, ge=256)  # the byte alphabet


@dataclass
class TinyVisionConfig:
    """Vision tower of the tiny random-init Qwen2.5-VL built for ``data.task geometry`` (local backend)."""

    image_size: int = option(
        64,
        "images are resized to image_size x image_size pixels; must be a multiple of patch_size * spatial_merge_size",
    )
    patch_size: int = option(
        8, "ViT patch side in pixels; (image_size / patch_size)^2 / spatial_merge_size^2 image tokens per image"
    )
    spatial_merge_size: int = option(2, "patches merged per side into one language-model token")
    depth: int = option(2, "vision transformer blocks (the last one uses full attention)")
    hidden_size: int = option(64, "vision transformer width")
    intermediate_size: int = option(128, "vision MLP width")
    num_heads: int = option(2, "vision attention heads; must divide hidden_size")

    def __post_init__(self) -> None:
        check_field_types(self, "model.tiny_vision")
        for name in (
            "image_size",
            "patch_size",
            "spatial_merge_size",
            "depth",
            "hidden_size",
            "intermediate_size",
            "num_heads",
        ):
            check_number(getattr(self, name), f"model.tiny_vision.{name}", integer=True, ge=1)
        unit = self.patch_size * self.spatial_merge_size
        require(
            self.image_size >= unit and self.image_size % unit == 0,
            "model.tiny_vision.image_size",
            f"must be a positive multiple of patch_size * spatial_merge_size = {unit}, got {self.image_size}",
        )
        require(self.depth >= 1, "model.tiny_vision.depth", f"must be >= 1, got {self.depth}")
        require(
            self.hidden_size % self.num_heads == 0, "model.tiny_vision.hidden_size", "must be divisible by num_heads"
        )


@dataclass
class ModelConfig:
    """Policy model: a local Hugging Face checkpoint or the tiny model."""

    path: str | None = option(
        None,
        "Hugging Face model: a local directory or a hub name owner/name (loaded with from_pretrained; "
        "HF_HUB_OFFLINE=1 reads only the local hub cache); None -> tiny model",
    )
    tiny: TinyModelConfig = option(factory=TinyModelConfig, help="the tiny random-init language model (no model.path)")
    tiny_vision: TinyVisionConfig = option(
        factory=TinyVisionConfig, help="vision tower of the tiny Qwen2.5-VL (data.task geometry, no model.path)"
    )
    lora_rank: int = option(0, "> 0 trains LoRA adapters (peft) instead of all weights")
    lora_alpha: int = option(16, "LoRA scaling numerator: adapters are scaled by lora_alpha / lora_rank")
    lora_target_modules: list[str] = option(
        factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        help='module names that get LoRA adapters, or ["all-linear"] (every linear layer but the output head, as in peft)',
    )
    dtype: str = option("float32", '"float32" | "bfloat16" | "float16"')
    generation_batch_size: int = option(64, "local backend: sequences per model.generate call (memory bound)")
    freeze_visual_encoder: bool = option(
        False,
        "vision-language models: keep the vision encoder and its projector into the language model fixed and train the "
        "language model only (OpenRLHF's --actor.freeze_visual_encoder; every parameter outside language_model.* and lm_head.*)",
    )
    kv_cache: str = option(
        "growing",
        'local backend: the KV cache of model.generate, "growing" (a preallocated buffer that doubles when full; '
        'same tokens as "dynamic", faster decoding) or "dynamic" (transformers\' DynamicCache, which concatenates every token)',
    )
    decoding: str = option(
        "compact",
        'local backend: "compact" (finished sequences leave the batch, so a batch costs about the sum of its response '
        'lengths; text prompts of full-attention models, others use model.generate) or "generate" (transformers\' model.generate, '
        "which runs every sequence until the longest ends); greedy tokens are the same",
    )
    numerics: str = option(
        "exact",
        'local backend, compact decoding: "exact" (bitwise model.generate\'s logits; a run repeats itself token for '
        'token on one machine) or "fast" (grouped-query attention, top-p from top-k candidates, identical prompts '
        "prefilled once: the same sampling rules with logits within float rounding, faster rollouts and held-out "
        "evaluation; timings in docs/results.md); used for rollouts and held-out evaluation alike",
    )
    init_kwargs: dict[str, Any] = option(
        factory=dict,
        help='extra from_pretrained arguments for model.path as a JSON object, e.g. {"trust_remote_code": true, "attn_implementation": "sdpa"}',
    )
    merge_lora_on_save: bool = option(
        False,
        "with LoRA: checkpoints and final_model hold the merged model (a plain checkpoint) instead of the adapters; resume still works",
    )

    def __post_init__(self) -> None:
        if self.lora_target_modules == "all-linear":  # peft's spelling: one string
            self.lora_target_modules = ["all-linear"]
        check_field_types(self, "model")
        check_number(self.generation_batch_size, "model.generation_batch_size", integer=True, ge=1)
        check_choice(self.kv_cache, KV_CACHES, "model.kv_cache", "KV cache")
        check_choice(self.decoding, DECODINGS, "model.decoding", "decoding")
        check_choice(self.numerics, NUMERICS, "model.numerics", "numerics")
        require(
            self.numerics == "exact" or self.decoding == "compact",
            "model.numerics",
            f"{self.numerics!r} is a way of computing compact decoding's steps; model.decoding generate runs "
            "transformers' own loop: set model.decoding compact or model.numerics exact",
        )
        check_number(self.lora_rank, "model.lora_rank", integer=True, ge=0)
        check_number(self.lora_alpha, "model.lora_alpha", integer=True, gt=0)  # peft: an integer
        require(
            self.path is None or (isinstance(self.path, str) and self.path.strip() != ""),
            "model.path",
            f"must be a directory or hub name (or unset for the tiny model), got {self.path!r}",
        )
        require(
            isinstance(self.lora_target_modules, list)
            and all(isinstance(m, str) and m for m in self.lora_target_modules)
            and (self.lora_rank == 0 or len(self.lora_target_modules) > 0),
            "model.lora_target_modules",
            f'must be a non-empty list of module names such as ["q_proj", "v_proj"], got {self.lora_target_modules!r}',
        )
        check_choice(self.dtype, ("float32", "bfloat16", "float16"), "model.dtype", "dtype")
        require(
            isinstance(self.init_kwargs, Mapping) and all(isinstance(k, str) and k for k in self.init_kwargs),
            "model.init_kwargs",
            f'must be a JSON object of from_pretrained arguments such as {{"trust_remote_code": true}}, got {self.init_kwargs!r}',
        )
        for key in ("dtype", "torch_dtype", "pretrained_model_name_or_path"):
            require(
                key not in self.init_kwargs,
                f"model.init_kwargs.{key}",
                "is set by the run itself" + (" (use model.dtype)" if "dtype" in key else " (use model.path)"),
            )
        try:
            json.dumps(self.init_kwargs)
        except (TypeError, ValueError):
            raise ConfigError(
                f"model.init_kwargs: values must be JSON (strings, numbers, booleans, lists, objects), got {self.init_kwargs!r}"
            ) from None
        require(
            self.lora_target_modules == ["all-linear"] or "all-linear" not in self.lora_target_modules,
            "model.lora_target_modules",
            '"all-linear" stands alone: give ["all-linear"] or a list of module names',
        )
