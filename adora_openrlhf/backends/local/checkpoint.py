"""Checkpoints: every step directory is a Hugging Face model directory, plus what ``--resume`` needs.

Layout of ``output_dir/checkpoints/step_000020/``:

- the policy as ``save_pretrained`` writes it (``config.json``, ``model.safetensors``, ``generation_config.json``),
  so ``from_pretrained``, ``eval.run`` and vLLM load the directory as it is. With LoRA: peft's adapter files
  (``adapter_config.json``, ``adapter_model.safetensors``; ``from_pretrained`` with peft installed loads them over
  the base model they name), or with ``model.merge_lora_on_save`` the merged model, a plain checkpoint;
- the tokenizer's files (the processor's, for vision-language policies) in the same directory;
- ``trainer_state/``: ``optimizer.pt``, ``state.pt`` (step, data position, sampler state, Python/NumPy/torch RNG
  states) and, for a merged LoRA save, ``adapter/`` (the adapters, which a resumed run keeps training).

A checkpoint is written into ``step_000020.tmp`` and renamed when complete, so an interrupted save never
leaves a half-written checkpoint that resume would pick up. The step-0 checkpoint (right after the warm-up)
is always kept: it is the KL reference on resume; of the others the newest ``keep_last`` are kept.
"""

from __future__ import annotations

import copy
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

_STEP_DIR = re.compile(r"^step_(\d{6})$")
STATE_DIR = "trainer_state"  # optimizer / RNG / sampler / trainer state beside the model files
ADAPTER_DIR = "adapter"  # under STATE_DIR: the LoRA adapters of a merged save


@dataclass
class TrainerState:
    step: int  # RL steps completed
    data_position: int  # training prompts consumed so far (the data order position)
    sampler: dict[str, Any]  # AdaptiveSampler.state_dict()
    rng: dict[str, Any]


def capture_rng() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def list_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    root = checkpoint_dir(output_dir)
    if not root.exists():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(found)


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    found = list_checkpoints(output_dir)
    return found[-1][1] if found else None


def is_lora(model) -> bool:
    """True for a peft model (LoRA adapters over a base model)."""
    return hasattr(model, "peft_config")


def export_model(model, directory: str | Path, merge_lora: bool = False) -> None:
    """``save_pretrained`` of the policy into ``directory`` (safetensors). A LoRA policy writes its adapters, or
    with ``merge_lora`` a merged copy (W + alpha/r * B A per adapted layer) as a plain model; ``model`` itself is
    never changed."""
    if is_lora(model) and merge_lora:
        copy.deepcopy(model).merge_and_unload().save_pretrained(str(directory))
    else:
        model.save_pretrained(str(directory))


def save_checkpoint(output_dir: str | Path, model, optimizer, tokenizer, state: TrainerState, keep_last: int = 3, merge_lora: bool = False) -> Path:
    """Write the checkpoint of ``state.step`` atomically (layout in the module docstring); prune old ones (step 0
    is kept). ``tokenizer`` is the tokenizer or, for vision-language policies, the processor."""
    root = checkpoint_dir(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{state.step:06d}"
    tmp = root / f"step_{state.step:06d}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    export_model(model, tmp, merge_lora)
    tokenizer.save_pretrained(str(tmp))
    trainer_state = tmp / STATE_DIR
    trainer_state.mkdir()
    if is_lora(model) and merge_lora:
        model.save_pretrained(str(trainer_state / ADAPTER_DIR))
    torch.save(optimizer.state_dict() if optimizer is not None else {}, trainer_state / "optimizer.pt")
    torch.save({"step": state.step, "data_position": state.data_position, "sampler": state.sampler, "rng": state.rng}, trainer_state / "state.pt")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    others = [p for s, p in list_checkpoints(output_dir) if s != 0]
    for old in others[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def check_layout(path: str | Path) -> None:
    """ConfigError naming ``--resume`` when ``path`` is a checkpoint of the earlier layout (``model.pt``, no model
    files), which this version does not load."""
    from adora_openrlhf.config import ConfigError

    path = Path(path)
    if (path / "model.pt").exists() and not (path / STATE_DIR).exists():
        raise ConfigError(
            f"--resume: checkpoint {str(path)!r} has the earlier layout (model.pt); this version resumes from "
            "step directories in the Hugging Face layout: start a new run (--overwrite) or resume with the version that wrote it"
        )


def load_lora_adapters(path: str | Path, model) -> None:
    """Load the LoRA adapter weights of checkpoint ``path`` into the peft ``model`` (same rank and targets)."""
    from peft.utils import load_peft_weights, set_peft_model_state_dict

    path = Path(path)
    adapters = path if (path / "adapter_config.json").exists() else path / STATE_DIR / ADAPTER_DIR
    if not (adapters / "adapter_config.json").exists():
        raise FileNotFoundError(f"no LoRA adapters in {path} (adapter_config.json); was it saved by a run without LoRA?")
    result = set_peft_model_state_dict(model, load_peft_weights(str(adapters), device=str(next(model.parameters()).device)))
    if result.unexpected_keys:
        raise ValueError(f"the adapters in {adapters} do not fit this model (e.g. {result.unexpected_keys[:3]}); use the run's model.lora_* settings")


def load_trainer_state(path: str | Path, optimizer=None) -> TrainerState:
    """The :class:`TrainerState` of checkpoint ``path``; loads the optimizer state into ``optimizer`` when given."""
    state_dir = Path(path) / STATE_DIR
    if optimizer is not None:
        saved = torch.load(state_dir / "optimizer.pt", weights_only=False)
        if saved:
            optimizer.load_state_dict(saved)
    raw = torch.load(state_dir / "state.pt", weights_only=False)
    return TrainerState(step=raw["step"], data_position=raw["data_position"], sampler=raw["sampler"], rng=raw["rng"])
