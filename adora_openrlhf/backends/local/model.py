"""Policy model for the local backend: the tiny random-init Qwen2-style LM, a local checkpoint, LoRA.

``build_tiny_model`` makes a ``transformers.Qwen2ForCausalLM`` from :class:`TinyModelConfig` (random
init, seeded), sized to the run's tokenizer. ``load_pretrained`` loads any local Hugging Face causal LM
directory with ``AutoModelForCausalLM.from_pretrained``. ``apply_lora`` wraps a model in peft LoRA
adapters when ``model.lora_rank > 0`` (only the adapters are trained).
"""

from __future__ import annotations

from pathlib import Path

import torch

from adora_openrlhf.config import ConfigError, ModelConfig, TinyModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def tiny_lm_settings(cfg: TinyModelConfig, tokenizer) -> dict:
    """Settings of the tiny language model (sizes from ``cfg``, vocabulary and special tokens from
    ``tokenizer``, tied embeddings), shared by the text model and the tiny Qwen2.5-VL's language model."""
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_tiny_model(cfg: TinyModelConfig, tokenizer, seed: int):
    """A random-init Qwen2-style causal LM whose vocabulary matches ``tokenizer``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**tiny_lm_settings(cfg, tokenizer))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model


def load_pretrained(path: str, dtype: str = "float32"):
    """A local Hugging Face causal LM (directory with config.json and weights)."""
    from transformers import AutoModelForCausalLM

    if not Path(path).exists():
        raise ConfigError(
            f"model.path: {path!r} does not exist; the local backend loads a local checkpoint directory "
            "(download it first, e.g. with `huggingface-cli download`), or leave --model unset for the tiny model"
        )
    return AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype])


def apply_lora(model, cfg: ModelConfig):
    """Wrap ``model`` in LoRA adapters (peft) when ``cfg.lora_rank > 0``; otherwise return it unchanged."""
    if cfg.lora_rank <= 0:
        return model
    from peft import LoraConfig, get_peft_model

    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [m for m in cfg.lora_target_modules if m not in names]
    if missing:
        raise ConfigError(f"model.lora_target_modules: {missing} are not modules of this model; some of its modules: {sorted(names)[:20]}")
    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=list(cfg.lora_target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def count_parameters(model) -> tuple[int, int]:
    """(total, trainable) parameter counts."""
    total = sum(p.numel() for p in model.parameters())
    return total, sum(p.numel() for p in trainable_parameters(model))
