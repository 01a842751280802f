"""Checkpoints: every step directory is a Hugging Face model directory, plus what ``--resume`` needs and checks.

Layout of ``output_dir/checkpoints/step_000020/``:

- the policy as ``save_pretrained`` writes it (``config.json``, ``model.safetensors``, ``generation_config.json``),
  so ``from_pretrained``, ``eval.run`` and vLLM load the directory as it is. With LoRA: peft's adapter files
  (``adapter_config.json``, ``adapter_model.safetensors``; ``from_pretrained`` with peft installed loads them over
  the base model they name), or with ``model.merge_lora_on_save`` the merged model, a plain checkpoint;
- the tokenizer's files (the processor's, for vision-language policies) in the same directory;
- ``trainer_state/``: ``optimizer.pt``, ``state.pt`` (step, data position, sampler state, the rollout allocator's
  statistics store, Python/NumPy/torch RNG states), ``run.json`` (the run's config and the fingerprints of its training and held-out rows, what
  ``--resume`` compares, so a checkpoint copied without the run's ``config.json`` is still checked) and, for a
  merged LoRA save, ``adapter/`` (the adapters, which a resumed run keeps training);
- ``trainer_state/manifest.json``: the size and SHA-256 of every other file of the directory, written last.
  :func:`checkpoint_problem` compares the files with it, so a truncated, replaced or edited file (weights that
  are still finite numbers included) is found before a run resumes from it. Every checkpoint has both
  ``run.json`` and ``manifest.json``: one without either is broken.

Nothing in a checkpoint is unpickled: ``state.pt`` and ``optimizer.pt`` hold only tensors, numbers, strings,
lists, tuples and dicts and are read with ``torch.load(weights_only=True)``, whose unpickler builds no other
object and calls no function, so a crafted file cannot run code on ``--resume``; a file that needs anything
else is refused with one line naming it. The manifest is not a signature (whoever crafts a checkpoint can
rewrite it): it finds damage, the restricted loader stops code.

A checkpoint is written into ``step_000020.tmp`` and renamed when complete, so an interrupted save never
leaves a half-written checkpoint that resume would pick up; a save that fails (a full disk) removes the
partial directory and raises an ``OSError`` that says which checkpoint is the last complete one
(:func:`write_atomically`). The step-0 checkpoint (right after the warm-up) is always kept: it is the KL
reference on resume; of the others the newest ``keep_last`` are kept.
"""

from __future__ import annotations

import copy
import errno
import hashlib
import json
import os
import pickle
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from adora_openrlhf.algorithms.allocation import check_store_state
from adora_openrlhf.errors import is_disk_full

_STEP_DIR = re.compile(r"^step_(\d{6})$")
STATE_DIR = "trainer_state"  # optimizer / RNG / sampler / trainer state beside the model files
ADAPTER_DIR = "adapter"  # under STATE_DIR: the LoRA adapters of a merged save
RUN_FILE = (
    "run.json"  # under STATE_DIR: {"config": RunConfig.to_dict(), "data": {"train": fingerprint, "eval": fingerprint}}
)
MANIFEST_FILE = "manifest.json"  # under STATE_DIR: {"files": {relative path: {"bytes": n, "sha256": hex}}}


@dataclass
class TrainerState:
    step: int  # RL steps completed
    data_position: int  # training prompts consumed so far (the data order position)
    sampler: dict[str, Any]  # AdaptiveSampler.state_dict()
    rng: dict[str, Any]
    # the rollout allocator's statistics store (empty without one)
    allocation: dict[str, Any] = field(default_factory=dict)


def capture_rng() -> dict[str, Any]:
    """The Python, NumPy and torch (and CUDA) RNG states in types ``torch.load(weights_only=True)`` reads: tuples,
    lists, numbers, strings and tensors (NumPy's key array becomes a list of ints)."""
    name, key, pos, has_gauss, cached = np.random.get_state()
    numpy_state = (str(name), [int(k) for k in key], int(pos), int(has_gauss), float(cached))
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    name, key, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(key, dtype=np.uint32), pos, has_gauss, cached))
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


class _WriteErrorRecorder:
    """The file object ``torch.save`` writes to, keeping the ``OSError`` a write or flush raised: torch's archive
    writer turns it into ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos``, which says
    nothing of a full disk."""

    def __init__(self, handle):
        self.handle = handle
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self.handle.write(data)
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        try:
            self.handle.flush()
        except OSError as err:
            self.error = err
            raise


def _torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` to ``path``; a write that fails (a full disk, an exhausted quota) raises its own ``OSError``
    naming the file, not torch's "unexpected pos"."""
    with open(path, "wb") as handle:
        writer = _WriteErrorRecorder(handle)
        try:
            torch.save(obj, writer)
        except RuntimeError as err:
            if writer.error is None:
                raise
            raise OSError(writer.error.errno, writer.error.strerror or str(writer.error), str(path)) from err


def save_tensors_file(obj: Any, path: Path) -> None:
    """``torch.save`` of tensors, numbers, strings and containers (what :func:`read_tensors_file` loads back)."""
    _torch_save(obj, path)


def read_tensors_file(path: str | Path, name: str) -> Any:
    """``path/name`` read with ``torch.load(weights_only=True)`` (never code); a damaged file is a ConfigError."""
    return _load_pickle(Path(path), name)


def file_sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def write_manifest(directory: Path, manifest: Path | None = None) -> None:
    """``STATE_DIR/MANIFEST_FILE`` of ``directory`` (or ``manifest``): size and SHA-256 of every other file in it."""
    manifest = manifest or directory / STATE_DIR / MANIFEST_FILE
    files = {
        p.relative_to(directory).as_posix(): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p != manifest
    }
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"files": files}, indent=1) + "\n")


def write_atomically(final: Path, write: Callable[[Path], None], what: str, resume_hint: str = "") -> Path:
    """Run ``write(tmp)`` on an empty ``FINAL.tmp`` directory, then rename it to ``final`` (replacing it). When
    ``write`` fails, the partial directory is removed; a full disk becomes ``OSError(ENOSPC, filename=tmp)``
    whose ``advice`` says what was lost and ``resume_hint`` (the CLI prints both on one line)."""
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir(parents=True)
        write(tmp)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if not is_disk_full(err):
            raise
        full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))
        full.advice = f"{what} was not written and its partial files were removed" + (
            f"; {resume_hint}" if resume_hint else ""
        )  # type: ignore[attr-defined]
        raise full from err
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def resume_hint(output_dir: str | Path, before_step: int | None = None) -> str:
    """ "free some space, then continue from step N with --resume" for the newest checkpoint before ``before_step``."""
    found = [s for s, _ in list_checkpoints(output_dir) if before_step is None or s < before_step]
    if not found:
        return "free some space, then start the run again"
    return f"free some space, then continue from step {found[-1]} with --resume"


def save_checkpoint(
    output_dir: str | Path,
    model,
    optimizer,
    tokenizer,
    state: TrainerState,
    run_record: dict[str, Any],
    keep_last: int = 3,
    merge_lora: bool = False,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write the checkpoint of ``state.step`` atomically (layout in the module docstring); prune old ones (step 0
    is kept). ``tokenizer`` is the tokenizer or, for vision-language policies, the processor; ``run_record``
    (config and data fingerprints) goes to ``trainer_state/run.json``; ``extra(directory)`` writes more files
    into the checkpoint before its manifest (the local critic's ``critic/``)."""
    root = checkpoint_dir(output_dir)
    root.mkdir(parents=True, exist_ok=True)

    def write(tmp: Path) -> None:
        export_model(model, tmp, merge_lora)
        tokenizer.save_pretrained(str(tmp))
        trainer_state = tmp / STATE_DIR
        trainer_state.mkdir()
        if is_lora(model) and merge_lora:
            model.save_pretrained(str(trainer_state / ADAPTER_DIR))
        _torch_save(optimizer.state_dict() if optimizer is not None else {}, trainer_state / "optimizer.pt")
        saved = {
            "step": state.step,
            "data_position": state.data_position,
            "sampler": state.sampler,
            "rng": state.rng,
            "allocation": state.allocation,
        }
        _torch_save(saved, trainer_state / "state.pt")
        (trainer_state / RUN_FILE).write_text(json.dumps(run_record, indent=2, default=str) + "\n")
        if extra is not None:
            extra(tmp)
        write_manifest(tmp)

    final = write_atomically(
        root / f"step_{state.step:06d}",
        write,
        f"the checkpoint of step {state.step}",
        resume_hint(output_dir, before_step=state.step),
    )
    others = [p for s, p in list_checkpoints(output_dir) if s != 0]
    for old in others[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoint_problem(path: str | Path) -> str | None:
    """What is wrong with the files of checkpoint ``path`` (None when nothing is): no manifest, or a file its
    manifest lists (``run.json`` among them) that is missing, of another size, or of another SHA-256."""
    path = Path(path)
    manifest_path = path / STATE_DIR / MANIFEST_FILE
    if not manifest_path.is_file():
        return f"{STATE_DIR}/{MANIFEST_FILE} is missing"
    return _manifest_problem(path, manifest_path)


def _manifest_problem(path: Path, manifest_path: Path) -> str | None:
    """The first file the manifest at ``manifest_path`` lists (relative to ``path``) that is missing, of another size
    or of another SHA-256; an unreadable manifest; else None."""
    try:
        files = json.loads(manifest_path.read_text(encoding="utf-8"))["files"]
        entries = [(str(name), int(entry["bytes"]), str(entry["sha256"])) for name, entry in files.items()]
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"{manifest_path.relative_to(path).as_posix()} is unreadable"
    for name, size, digest in sorted(entries):
        file = path / name
        if ".." in Path(name).parts or not file.is_file():
            return f"{name} is missing"
        actual = file.stat().st_size
        if actual != size:
            return f"{name} is {'truncated' if actual < size else 'longer than when it was saved'} ({actual:,} of {size:,} bytes)"
        if file_sha256(file) != digest:
            return f"{name} does not match the checksum saved with it (its content changed after the save)"
    return None


def write_model_manifest(directory: Path) -> None:
    """``directory/MANIFEST_FILE`` of a model directory that is no checkpoint (``final_model/``): its files' sizes and SHA-256."""
    write_manifest(directory, directory / MANIFEST_FILE)


def model_files_problem(directory: str | Path) -> str | None:
    """What is wrong with the files of a model directory the trainer wrote: a checkpoint (``step_N``, checked as
    ``--resume`` checks it, :func:`checkpoint_problem`) or ``final_model/`` (its ``manifest.json``); None for a
    directory with neither (a model from elsewhere)."""
    directory = Path(directory)
    if (directory / STATE_DIR).is_dir():
        return checkpoint_problem(directory)
    if (directory / MANIFEST_FILE).is_file():
        return _manifest_problem(directory, directory / MANIFEST_FILE)
    return None


def complete_checkpoint_before(output_dir: str | Path, step: int) -> Path | None:
    """The newest checkpoint before ``step`` whose files pass :func:`checkpoint_problem`, or None."""
    for s, path in reversed(list_checkpoints(output_dir)):
        if s < step and checkpoint_problem(path) is None:
            return path
    return None


def broken_checkpoint_error(path: str | Path, problem: str, option: str = "--resume"):
    """A ConfigError ``OPTION: checkpoint PATH is broken: PROBLEM; resume from step_N with --resume-from step_N, or
    delete the broken checkpoint`` (the newest complete checkpoint before it, when there is one)."""
    from adora_openrlhf.config import ConfigError

    path = Path(path)
    match = _STEP_DIR.match(path.name)
    earlier = complete_checkpoint_before(path.parent.parent, int(match.group(1))) if match else None
    if earlier is not None:
        fix = f"resume from {earlier.name} with --resume-from {earlier.name}, or delete the broken checkpoint"
    else:
        fix = "no earlier checkpoint is complete: start a new run with --overwrite (or another --output-dir)"
    return ConfigError(f"{option}: checkpoint {str(path)!r} is broken: {problem}; {fix}")


def read_run_record(path: str | Path) -> dict[str, Any]:
    """The ``run.json`` of checkpoint ``path``; a missing or unreadable one is :func:`broken_checkpoint_error`."""
    file = Path(path) / STATE_DIR / RUN_FILE
    if not file.is_file():
        raise broken_checkpoint_error(path, f"{STATE_DIR}/{RUN_FILE} is missing")
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise broken_checkpoint_error(path, f"{STATE_DIR}/{RUN_FILE} is not valid JSON") from None
    if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
        raise broken_checkpoint_error(path, f"{STATE_DIR}/{RUN_FILE} holds no config")
    data = record.get("data")
    if not isinstance(data, dict) or not all(isinstance(data.get(split), dict) for split in ("train", "eval")):
        raise broken_checkpoint_error(
            path, f"{STATE_DIR}/{RUN_FILE} holds no data fingerprints (data.train, data.eval)"
        )
    return record


def load_lora_adapters(path: str | Path, model) -> None:
    """Load the LoRA adapter weights of checkpoint ``path`` into the peft ``model`` (same rank and targets)."""
    from peft.utils import load_peft_weights, set_peft_model_state_dict

    path = Path(path)
    adapters = path if (path / "adapter_config.json").exists() else path / STATE_DIR / ADAPTER_DIR
    if not (adapters / "adapter_config.json").exists():
        raise FileNotFoundError(
            f"no LoRA adapters in {path} (adapter_config.json); was it saved by a run without LoRA?"
        )
    result = set_peft_model_state_dict(
        model, load_peft_weights(str(adapters), device=str(next(model.parameters()).device))
    )
    if result.unexpected_keys:
        raise ValueError(
            f"the adapters in {adapters} do not fit this model (e.g. {result.unexpected_keys[:3]}); use the run's model.lora_* settings"
        )


def load_trainer_state(path: str | Path, optimizer=None) -> TrainerState:
    """The :class:`TrainerState` of checkpoint ``path``; loads the optimizer state into ``optimizer`` when given.
    A file that cannot be read is a ConfigError naming it (:func:`broken_checkpoint_error`); an optimizer state
    that does not fit ``optimizer`` is a ConfigError too."""
    from adora_openrlhf.config import ConfigError

    path = Path(path)
    raw = _load_pickle(path, f"{STATE_DIR}/state.pt")
    try:
        state = TrainerState(
            step=int(raw["step"]),
            data_position=int(raw["data_position"]),
            sampler=raw["sampler"],
            rng=raw["rng"],
            allocation=raw["allocation"],
        )
    except (TypeError, KeyError, ValueError) as err:
        raise broken_checkpoint_error(
            path, f"{STATE_DIR}/state.pt lacks the trainer state ({type(err).__name__}: {err})"
        ) from None
    if state.allocation:
        try:
            check_store_state(state.allocation)
        except ValueError as err:
            raise broken_checkpoint_error(path, f"{STATE_DIR}/state.pt: {err}") from None
    match = _STEP_DIR.match(path.name)
    if match and int(match.group(1)) != state.step:
        raise broken_checkpoint_error(
            path, f"{STATE_DIR}/state.pt is the state of step {state.step}, not of step {int(match.group(1))}"
        )
    if optimizer is not None:
        saved = _load_pickle(path, f"{STATE_DIR}/optimizer.pt")
        if saved:
            try:
                optimizer.load_state_dict(saved)
            except (ValueError, KeyError, TypeError) as err:
                raise ConfigError(
                    f"--resume: the optimizer state in {str(path / STATE_DIR / 'optimizer.pt')!r} does not fit this model "
                    f"({' '.join(str(err).split())[:160]}); resume with the run's own model options or start a new run"
                ) from None
    return state


def _load_pickle(path: Path, name: str) -> Any:
    """``torch.load(weights_only=True)`` of ``path/name``: tensors, numbers, strings and containers only, never code
    (module docstring). ConfigError naming the file when it is missing, not a torch file, or needs anything else."""
    try:
        return torch.load(path / name, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise broken_checkpoint_error(path, f"{name} is missing") from None
    except pickle.UnpicklingError as err:
        text = str(err)
        if "GLOBAL" in text or "Unsupported global" in text:  # the restricted unpickler met a class or function
            raise broken_checkpoint_error(
                path,
                f"{name} holds objects other than tensors, numbers, strings and containers, which are not loaded (a file "
                "this package did not write, perhaps crafted to run code)",
            ) from None
        reason = text.split("WeightsUnpickler error:", 1)[-1].split("Check the documentation", 1)[0]
        raise broken_checkpoint_error(
            path, f"{name} cannot be read (UnpicklingError: {' '.join(reason.split())[:120]})"
        ) from None
    except Exception as err:  # noqa: BLE001 - UnpicklingError, EOFError, RuntimeError (zip), ...: all mean a damaged file
        raise broken_checkpoint_error(
            path, f"{name} cannot be read ({type(err).__name__}: {' '.join(str(err).split())[:120]})"
        ) from None
