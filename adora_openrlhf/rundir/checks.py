"""The run directory: checks before a run touches it, its lock, and what a new run replaces.

A run's start-up order (``trainer.train``): every check here and every load (config, data, tokenizer, model,
trainer state) happens before anything is written; only then is the directory created, locked and cleared.

- :func:`check_output_dir`: ``output_dir`` is (or can become) a writable directory.
- :func:`check_previous_run`: without ``--resume`` a directory holding checkpoints is refused unless
  ``--overwrite``; with ``--resume`` the checkpoint (the latest, or the one ``--resume-from`` names) must be
  complete (its files match their checksums, :func:`checkpoint.checkpoint_problem`; a broken one is refused
  naming the file and the newest complete checkpoint before it), its saved config (``trainer_state/run.json``)
  must match, and ``steps`` must not be below its step.
- :func:`check_resume_data`: the training and held-out rows are those the checkpoint was trained on (their
  content fingerprints, ``data.rows_fingerprint``), so a data file edited in place is noticed.
- :class:`RunDirLock`: an exclusive ``flock`` on ``output_dir/.lock`` held for the whole run, so a second
  training into the same directory is refused instead of deleting the first one's checkpoints. The kernel
  drops the lock when the process ends, however it ends.
- :func:`clear_previous_run`: removes the artefacts a previous run left (checkpoints, metrics, TensorBoard
  events, final model, saved held-out set, ...), never other files. :func:`set_aside_later_checkpoints`: a run resumed from an
  earlier checkpoint moves the later ones, and a copy of ``metrics.jsonl``, to ``checkpoints/superseded/``
  (kept, never deleted).
- :func:`config_differences`: what ``--resume`` compares. ``output_dir`` is not compared (a moved or
  differently spelled directory is the same run); path options (model, data files) are equal when they
  name the same file or directory, or files with the same bytes; an unset ``sampling.positive_threshold`` equals
  the value it stands for.
"""

from __future__ import annotations

import filecmp
import logging
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adora_openrlhf.config import ConfigError, RunConfig
from adora_openrlhf.dotted import flatten
from adora_openrlhf.rundir import checkpoints as ckpt
from adora_openrlhf.rundir.heldout import HELDOUT_IMAGES, HELDOUT_ROWS, HELDOUT_SETTINGS
from adora_openrlhf.rundir.lock import DirLock

RESUMABLE_CHANGES = {"steps", "save_every", "eval_every", "output_dir", "report_to"}  # options a resumed run may change
# options a resumed run changes only when asked to by name (--resume-changes), e.g. after a divergence
CHANGES_ON_REQUEST = ("train.lr", "train.max_grad_norm")
PATH_OPTIONS = {"model.path", "data.train_path", "data.eval_path"}  # compared by what they name, not by spelling
RUN_ARTEFACTS = (
    *(
        "checkpoints",
        "tb",
        "final_model",
        "tokenizer",
        "metrics.jsonl",
        "summary.json",
        "reward_curve.png",
        "config.json",
        "wandb",
    ),
    *(HELDOUT_ROWS, HELDOUT_SETTINGS, HELDOUT_IMAGES),  # the saved held-out set (heldout.py)
)
SUPERSEDED_DIR = "superseded"  # under checkpoints/: later checkpoints set aside by a resume from an earlier one

logger = logging.getLogger(__name__)


def same_location(a: str | None, b: str | None) -> bool:
    """True when two path options name the same thing: equal text, the same file/directory, or files with equal
    bytes (a moved copy). Hub names (not on disk) compare as text."""
    if a == b:
        return True
    if a is None or b is None:
        return False
    pa, pb = Path(a), Path(b)
    if not (pa.exists() and pb.exists()):
        return False
    if pa.resolve() == pb.resolve():
        return True
    if pa.is_file() and pb.is_file():
        return filecmp.cmp(pa, pb, shallow=False)
    if pa.is_dir() and pb.is_dir():
        names = sorted(p.name for p in pa.iterdir() if p.is_file())
        if names != sorted(p.name for p in pb.iterdir() if p.is_file()):
            return False
        return all(filecmp.cmp(pa / n, pb / n, shallow=False) for n in names)
    return False


def _effective(flat: dict[str, Any]) -> dict[str, Any]:
    """An unset ``sampling.positive_threshold`` (None) read as what it means, ``adora.correct_threshold``
    (``RunConfig.positive_threshold``): a run saved with the value written out resumes under a recipe that
    leaves it unset."""
    if flat.get("sampling.positive_threshold", 0) is None:
        flat["sampling.positive_threshold"] = flat.get("adora.correct_threshold")
    return flat


def config_differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Flattened option names whose values differ in a way that matters for resuming (module docstring)."""
    flat_saved, flat_now = _effective(flatten(saved)), _effective(flatten(now))
    changed = []
    for key in sorted(set(flat_saved) | set(flat_now)):
        old, new = flat_saved.get(key), flat_now.get(key)
        if key in RESUMABLE_CHANGES or old == new:
            continue
        if key in PATH_OPTIONS and same_location(old, new):
            continue
        changed.append(key)
    return changed


def _compare_config(saved: dict[str, Any], cfg: RunConfig, where: str, allowed: Sequence[str] = ()) -> None:
    """ConfigError naming the options of ``cfg`` that differ from ``saved``, less those ``allowed`` to
    (``--resume-changes``, from :data:`CHANGES_ON_REQUEST`)."""
    now = cfg.to_dict()
    changed = [key for key in config_differences(saved, now) if key not in allowed]
    if changed:
        flat_saved, flat_now = flatten(saved), flatten(now)
        details = ", ".join(f"{k}: {flat_saved.get(k)!r} -> {flat_now.get(k)!r}" for k in changed[:8])
        on_request = [key for key in changed if key in CHANGES_ON_REQUEST]
        ask = (
            f"; to change {', '.join(on_request)} on purpose add --resume-changes {','.join(on_request)}"
            if on_request
            else ""
        )
        raise ConfigError(
            f"--resume: the config differs from {where} in {details}; resume with the same options "
            f"(only {sorted(RESUMABLE_CHANGES)} may change){ask}, or use a new --output-dir"
        )


def check_resume_changes(names: Sequence[str], resume: bool) -> None:
    """ConfigError unless every name of ``--resume-changes`` is one of :data:`CHANGES_ON_REQUEST`, given with --resume."""
    unknown = [name for name in names if name not in CHANGES_ON_REQUEST]
    if unknown:
        raise ConfigError(
            f"--resume-changes: {unknown} cannot change on resume; choose from {list(CHANGES_ON_REQUEST)}"
        )
    if names and not resume:
        raise ConfigError(
            "--resume-changes: lets a resumed run change an option; give it with --resume or --resume-from"
        )


def select_checkpoint(out: Path, resume_from: str | None = None) -> tuple[int, Path]:
    """(step, directory) of the checkpoint to resume from: the latest, or the one ``resume_from`` names (a step
    number, a directory name such as ``step_000002``, or the directory's path)."""
    found = ckpt.list_checkpoints(out)
    if not found:
        raise ConfigError(
            f"--resume: no checkpoint under {str(ckpt.checkpoint_dir(out))!r}; start the run without --resume"
        )
    if resume_from is None:
        return found[-1]
    spec = str(resume_from).strip()
    wanted = f"step_{int(spec):06d}" if re.fullmatch(r"\d+", spec) else Path(spec).name
    for step, path in found:
        if path.name == wanted and (
            Path(spec).name == spec or re.fullmatch(r"\d+", spec) or Path(spec).resolve() == path.resolve()
        ):
            return step, path
    raise ConfigError(
        f"--resume-from: no checkpoint {spec!r} in {str(ckpt.checkpoint_dir(out))!r}; it holds {[p.name for _, p in found]} "
        "(give a step number, a directory name or its path)"
    )


def check_previous_run(
    out: Path,
    cfg: RunConfig,
    resume: bool,
    overwrite: bool,
    resume_from: str | None = None,
    verify_files: bool = True,
    changes: Sequence[str] = (),
) -> Path | None:
    """The checkpoint to resume from (None for a new run), after the read-only checks of the module docstring.
    ``resume_from`` selects a checkpoint other than the latest; ``verify_files`` False skips the checksums
    (the re-check under the lock, after a first full check); ``changes`` names options of
    :data:`CHANGES_ON_REQUEST` the resumed run may change (``--resume-changes``)."""
    check_resume_changes(changes, resume)
    if resume and overwrite:
        raise ConfigError(
            "--overwrite: cannot be combined with --resume (one continues the run, the other replaces it)"
        )
    if resume_from is not None and not resume:
        raise ConfigError("--resume-from: continues a run; give it with --resume (or alone)")
    found = ckpt.list_checkpoints(out)
    if resume:
        step, path = select_checkpoint(out, resume_from)
        if verify_files:
            problem = ckpt.checkpoint_problem(path)
            if problem is not None:
                raise ckpt.broken_checkpoint_error(path, problem)
        record = ckpt.read_run_record(path)
        _compare_config(record["config"], cfg, f"the config saved in checkpoint {path.name}", changes)
        if cfg.steps < step:
            raise ConfigError(
                f"steps: {cfg.steps} is below step {step} of checkpoint {str(path)!r}, where --resume continues; give "
                f"--steps {step} or more, or --resume-from an earlier checkpoint"
            )
        return path
    if found and not overwrite:
        raise ConfigError(
            f"output_dir: {str(out)!r} holds a run with checkpoints (up to step {found[-1][0]}); continue it with --resume, "
            "replace it with --overwrite, or choose another --output-dir"
        )
    return None


def _data_source(cfg: RunConfig, split: str) -> str:
    if split == "train":
        return (
            f"data.train_path {cfg.data.train_path!r}"
            if cfg.data.train_path
            else "the generated training rows (the generator changed)"
        )
    if cfg.data.eval_path:
        return f"data.eval_path {cfg.data.eval_path!r}"
    return (
        f"the rows held out of data.train_path {cfg.data.train_path!r}"
        if cfg.data.train_path
        else "the generated held-out rows (the generator changed)"
    )


def check_resume_data(checkpoint: Path, cfg: RunConfig, train_rows, eval_rows) -> None:
    """ConfigError when the training or held-out rows differ from those ``checkpoint`` recorded (content
    fingerprints)."""
    from adora_openrlhf.rows import rows_fingerprint

    record = ckpt.read_run_record(checkpoint)
    for split, rows in (("train", train_rows), ("eval", eval_rows)):
        saved, now = record["data"][split], rows_fingerprint(rows)
        if saved != now:
            what = "training" if split == "train" else "held-out"
            raise ConfigError(
                f"--resume: the {what} rows differ from those checkpoint {checkpoint.name} was trained on ({saved.get('rows')} rows, "
                f"sha256 {str(saved.get('sha256'))[:12]} then; {now['rows']} rows, {now['sha256'][:12]} now): {_data_source(cfg, split)} "
                "changed after the run started; restore the data it started with, or start a new run (--overwrite or another --output-dir)"
            )


def _free_name(path: Path) -> Path:
    """``path``, or ``path`` with ``-2``, ``-3``, ... before its suffix when that exists already."""
    n, target = 1, path
    while target.exists():
        n += 1
        target = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return target


def set_aside_later_checkpoints(out: Path, step: int) -> list[Path]:
    """Move the checkpoints after ``step`` to ``checkpoints/superseded/`` (a run resumed from an earlier checkpoint
    would otherwise leave them to be taken for its own), with a copy of ``metrics.jsonl`` as it was (the resumed
    run drops the records after ``step``); returns the moved checkpoints' new paths. Nothing is deleted."""
    later = [path for s, path in ckpt.list_checkpoints(out) if s > step]
    if not later:
        return []
    folder = ckpt.checkpoint_dir(out) / SUPERSEDED_DIR
    folder.mkdir(exist_ok=True)
    if (out / "metrics.jsonl").exists():
        shutil.copy2(out / "metrics.jsonl", _free_name(folder / "metrics.jsonl"))
    moved = []
    for path in later:
        target = _free_name(folder / path.name)
        os.replace(path, target)
        moved.append(target)
    logger.info(
        "resuming from step %d: moved the later checkpoints %s and a copy of metrics.jsonl aside",
        step,
        [str(p) for p in moved],
    )
    return moved


def clear_previous_run(out: Path) -> None:
    """Remove a previous run's artefacts from ``out`` (only the names in RUN_ARTEFACTS)."""
    for name in RUN_ARTEFACTS:
        target = out / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()


class RunDirLock(DirLock):
    """The training's exclusive lock on ``out/.lock`` (:class:`~adora_openrlhf.rundir.lock.DirLock`, creates ``out``);
    ConfigError naming ``output_dir`` when another process holds it."""

    def __init__(self, out: Path):
        super().__init__(out, "output_dir", "a training run")
        self.out = out

    def refusal(self, holder: str) -> str:
        return f"output_dir: {str(self.out)!r} is in use by another process ({holder}); wait for it to finish or choose another --output-dir"
