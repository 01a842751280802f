"""Policy model for the local backend: the tiny random-init Qwen2-style LM, a local checkpoint, LoRA.

``build_tiny_model`` makes a ``transformers.Qwen2ForCausalLM`` from :class:`TinyModelConfig` (random
init, seeded), sized to the run's tokenizer. ``load_pretrained`` loads any Hugging Face causal LM, local
directory or hub name (``model_source.py``), with ``AutoModelForCausalLM.from_pretrained``, through
:func:`from_pretrained_checked`: weights that do not fit the config (missing, unexpected or of another shape,
e.g. a config of another architecture over Qwen2 weights) are refused instead of leaving a partly random
model. ``apply_lora`` wraps a model in peft LoRA adapters when ``model.lora_rank > 0`` (only the adapters are
trained). :func:`vocabulary_problem` checks that every token id of a tokenizer has an embedding row.
"""

from __future__ import annotations

import torch

from adora_openrlhf.engine.model_config import ModelConfig, TinyModelConfig
from adora_openrlhf.errors import ConfigError

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


def from_pretrained_checked(auto_class, path: str, option: str = "model.path", **kwargs):
    """``auto_class.from_pretrained(path, **kwargs)`` that refuses weights which do not fit the model the config
    describes: ConfigError naming ``option`` when a parameter is missing from the weights, a weight has no
    parameter, or shapes differ (transformers would initialise those parameters at random, with a warning).
    transformers' own load report is silenced; the error says what it would have listed."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model, info = auto_class.from_pretrained(path, output_loading_info=True, **kwargs)
    except RuntimeError as err:
        if "mismatched" not in str(err) and "size mismatch" not in str(err):
            raise
        raise ConfigError(
            f"{option}: the weights in {path!r} have other shapes than its config.json describes; the config and the weights "
            "come from different models: use the config.json saved with the weights"
        ) from None
    finally:
        hf_logging.set_verbosity(verbosity)
    problems = [
        f"{len(keys)} {what} (e.g. {sorted(map(str, keys))[:2]})"
        for what, keys in (
            ("parameters missing from the weights", info.get("missing_keys") or ()),
            ("weights the model has no parameter for", info.get("unexpected_keys") or ()),
            ("weights of another shape", info.get("mismatched_keys") or ()),
        )
        if keys
    ]
    if problems:
        raise ConfigError(
            f"{option}: the weights in {path!r} do not fit the {type(model).__name__} its config.json describes: {'; '.join(problems)}; "
            "the config and the weights come from different models: use the config.json saved with the weights"
        )
    return model


def load_pretrained(path: str, dtype: str = "float32", init_kwargs: dict | None = None, option: str = "model.path"):
    """A Hugging Face causal LM: a local directory (config.json and weights) or a hub name ``owner/name``
    (hub cache, or the hub unless ``HF_HUB_OFFLINE=1``), with ``init_kwargs`` passed to ``from_pretrained``;
    weights that do not fit its config are refused (:func:`from_pretrained_checked`)."""
    from transformers import AutoModelForCausalLM

    from adora_openrlhf.engine.model_source import check_model_source

    check_model_source(path, option, init_kwargs)
    return from_pretrained_checked(AutoModelForCausalLM, path, option, dtype=DTYPES[dtype], **(init_kwargs or {}))


def vocabulary_problem(tokenizer, model) -> str | None:
    """What is wrong when ``tokenizer`` has token ids the model has no embedding row for (None otherwise):
    such a token in a prompt would index past the embedding."""
    rows = model.get_input_embeddings().num_embeddings
    needed = max(tokenizer.get_vocab().values(), default=-1) + 1
    if needed > rows:
        return (
            f"the tokenizer has token ids up to {needed - 1:,}, but the model's embedding has {rows:,} rows (vocab_size in config.json); "
            "the tokenizer belongs to another model: use the model's own tokenizer files"
        )
    return None


def apply_lora(model, cfg: ModelConfig):
    """Wrap ``model`` in LoRA adapters (peft) when ``cfg.lora_rank > 0``; otherwise return it unchanged.
    ``["all-linear"]`` adapts every linear layer but the output head (peft's ``target_modules="all-linear"``)."""
    if cfg.lora_rank <= 0:
        return model
    from peft import LoraConfig, get_peft_model

    targets: str | list[str] = (
        "all-linear" if cfg.lora_target_modules == ["all-linear"] else list(cfg.lora_target_modules)
    )
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [m for m in cfg.lora_target_modules if m not in names and targets != "all-linear"]
    if missing:
        raise ConfigError(
            f"model.lora_target_modules: {missing} are not modules of this model; some of its modules: {sorted(names)[:20]}"
        )
    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=targets, task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def count_parameters(model) -> tuple[int, int]:
    """(total, trainable) parameter counts."""
    total = sum(p.numel() for p in model.parameters())
    return total, sum(p.numel() for p in trainable_parameters(model))
