"""What a local run loads before it writes anything: the tokenizer (trained on the corpus for the tiny model, or
the checkpoint's or ``model.path``'s own; the processor for vision tasks), the policy (tiny random-init model,
``model.path`` or a checkpoint, optional LoRA), each checked with one error naming its source, and on
``--resume`` the KL reference and the critic saved with the run."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from adora_openrlhf.algorithms.token_advantages import CRITIC_ESTIMATORS
from adora_openrlhf.backends.local.critic import build_critic
from adora_openrlhf.backends.local.sft import warmup_styles
from adora_openrlhf.config import ConfigError, RunConfig
from adora_openrlhf.engine import vlm
from adora_openrlhf.engine.model import apply_lora, build_tiny_model, load_pretrained, vocabulary_problem
from adora_openrlhf.engine.model_source import json_files_problem, weight_files_problem
from adora_openrlhf.engine.tokenization import (
    COMPACT_CHAT_TEMPLATE,
    load_tokenizer,
    tokenizer_problem,
    train_bpe_tokenizer,
)
from adora_openrlhf.prompt_templates import render_prompt
from adora_openrlhf.rundir import checkpoints as ckpt
from adora_openrlhf.tasks.behaviours import demonstration_for
from adora_openrlhf.tasks.registry import is_vision_task


def build_tokenizer(cfg: RunConfig, train_rows, resume_from: Path | None):
    """(tokenizer, processor): the processor (tokenizer + image processor, saved in its place) for vision tasks, else None."""
    vision = is_vision_task(cfg.data.task)
    if resume_from is not None or cfg.model.path is not None:  # a checkpoint directory holds its tokenizer's files
        path, kwargs = (str(resume_from), None) if resume_from is not None else (cfg.model.path, cfg.model.init_kwargs)
        if vision:
            processor = vlm.load_processor(path, kwargs)
            return processor.tokenizer, processor
        return load_tokenizer(path, kwargs), None
    template = "compact" if cfg.data.prompt_template == "auto" else cfg.data.prompt_template
    corpus = [render_prompt(r.prompt, None, template).replace(vlm.IMAGE_TAG, "") for r in train_rows]
    rng = random.Random(f"tokenizer-corpus:{cfg.seed}")
    corpus += [demonstration_for(r, style, rng) for style in warmup_styles(cfg.warmup) for r in train_rows]
    tokenizer = train_bpe_tokenizer(corpus, cfg.model.tiny.vocab_size)
    if template == "compact" and not vision:  # saved with the model: chat-template users render the same text
        tokenizer.chat_template = COMPACT_CHAT_TEMPLATE
    return tokenizer, (vlm.build_tiny_processor(tokenizer, cfg.model.tiny_vision) if vision else None)


def demonstrations(rows, styles, rng: random.Random) -> list[str]:
    """The warm-up demonstration of every row in every style (style by style); a row the style cannot be built
    for is a ConfigError naming the row, raised before a run writes anything."""
    out = []
    for style in styles:
        for row in rows:
            try:
                out.append(demonstration_for(row, style, rng))
            except (ConfigError, KeyError, ValueError) as err:
                raise ConfigError(f"{row.where}: {' '.join(str(err).split())}") from None
    return out


def build_model(cfg: RunConfig, tokenizer, device, checkpoint: Path | None = None):
    """The policy: ``model.path`` or the tiny model (+ LoRA); with ``checkpoint`` (a step directory) the policy
    saved there: its model files, or for LoRA the same base with the saved adapters. With
    ``model.freeze_visual_encoder`` the vision encoder and projector get no gradients (``vlm.freeze_visual_encoder``)."""
    model = _load_policy(cfg, tokenizer, device, checkpoint)
    if cfg.model.freeze_visual_encoder:
        vlm.freeze_visual_encoder(model)
    return model


def _load_policy(cfg: RunConfig, tokenizer, device, checkpoint: Path | None = None):
    vision = is_vision_task(cfg.data.task)
    if checkpoint is not None and cfg.model.lora_rank == 0:
        dtype = cfg.model.dtype if cfg.model.path is not None else "float32"  # the tiny model is built in float32
        option = f"--resume: checkpoint {str(checkpoint)!r}"
        return (vlm.load_vlm if vision else load_pretrained)(
            str(checkpoint), dtype, cfg.model.init_kwargs, option=option
        ).to(device)
    if cfg.model.path is not None:
        model = (vlm.load_vlm if vision else load_pretrained)(cfg.model.path, cfg.model.dtype, cfg.model.init_kwargs)
    elif vision:
        model = vlm.build_tiny_vlm(cfg.model.tiny, cfg.model.tiny_vision, tokenizer, cfg.seed)
    else:
        model = build_tiny_model(cfg.model.tiny, tokenizer, cfg.seed)
    model = apply_lora(model, cfg.model)
    if checkpoint is not None:
        ckpt.load_lora_adapters(checkpoint, model)
    return model.to(device)


def load_policy_and_tokenizer(cfg: RunConfig, train_rows, checkpoint: Path | None, device):
    """(tokenizer, processor, model), checked: weight files that are truncated or damaged, a tokenizer that
    encodes nothing (no tokenizer files), weights that do not fit the config, and token ids past the model's
    embedding are each one ConfigError naming the checkpoint (with the complete one to resume from instead) or
    ``model.path``."""
    model_dir = Path(cfg.model.path) if cfg.model.path is not None and Path(cfg.model.path).is_dir() else None

    def failure(problem: str, in_checkpoint: bool) -> ConfigError:
        if in_checkpoint:
            return ckpt.broken_checkpoint_error(checkpoint, problem)
        return ConfigError(
            f"model.path: {cfg.model.path!r}{'' if problem.startswith('cannot be loaded') else ':'} {problem}"
        )

    for directory, in_checkpoint in ((checkpoint, True), (model_dir, False)):
        problem = (weight_files_problem(directory) or json_files_problem(directory)) if directory is not None else None
        if problem is not None:
            raise failure(
                problem if in_checkpoint else f"cannot be loaded: {problem}; re-download or re-export the model",
                in_checkpoint,
            )
    from_checkpoint = checkpoint is not None  # the tokenizer comes from the checkpoint; the model too unless LoRA
    try:
        tokenizer, processor = build_tokenizer(cfg, train_rows, checkpoint)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - any loader failure: name the directory, one line
        raise failure(
            f"cannot be loaded ({type(err).__name__}: {' '.join(str(err).split())[:200]})", from_checkpoint
        ) from None
    if checkpoint is not None or cfg.model.path is not None:
        problem = tokenizer_problem(tokenizer)
        if problem is not None:
            raise failure(problem, from_checkpoint)
    try:
        model = build_model(cfg, tokenizer, device, checkpoint)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - SafetensorError, OSError, ValueError, ...: one line naming the source
        raise failure(
            f"cannot be loaded ({type(err).__name__}: {' '.join(str(err).split())[:200]})",
            from_checkpoint and cfg.model.lora_rank == 0,
        ) from None
    problem = vocabulary_problem(tokenizer, model)
    if problem is not None:
        raise failure(problem, from_checkpoint)
    return tokenizer, processor, model


def resumed_reference(cfg: RunConfig, tokenizer, device, out: Path):
    """The KL reference of a resumed run (the step-0 checkpoint), checked and loaded before anything is written;
    None when the run has no KL term or is a LoRA run (whose reference is the base model, adapters off)."""
    if not (cfg.train.kl_coef > 0 and cfg.model.lora_rank == 0):
        return None
    step0 = ckpt.checkpoint_dir(out) / "step_000000"
    problem = "it is missing" if not step0.is_dir() else ckpt.checkpoint_problem(step0) or weight_files_problem(step0)
    if problem is not None:
        raise ConfigError(
            f"--resume: checkpoint {str(step0)!r}, the KL reference policy (train.kl_coef > 0), is broken: {problem}; it cannot be "
            "recreated: start a new run with --overwrite (or another --output-dir)"
        )
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        ref_model = build_model(cfg, tokenizer, device, step0)
    return ref_model.eval().requires_grad_(False)


def resumed_critic(cfg: RunConfig, model, checkpoint: Path):
    """The critic saved with ``checkpoint`` (``advantage.estimator gae``; ``critic.py``), or None for other estimators."""
    if cfg.advantage.estimator not in CRITIC_ESTIMATORS:
        return None
    critic = build_critic(model, cfg.critic, cfg.seed, warm_start=False)
    critic.load(checkpoint)
    return critic
