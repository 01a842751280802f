"""The run directory: checks before a run touches it, its lock, and what a new run replaces.

A run's start-up order (``trainer.train``): every check here and every load (config, data, tokenizer, model)
happens before anything is written; only then is the directory created, locked and cleared.

- :func:`check_output_dir`: ``output_dir`` is (or can become) a writable directory.
- :func:`check_previous_run`: without ``--resume`` a directory holding checkpoints is refused unless
  ``--overwrite``; with ``--resume`` the latest checkpoint must exist and the saved config must match.
- :class:`RunDirLock`: an exclusive ``flock`` on ``output_dir/.lock`` held for the whole run, so a second
  training into the same directory is refused instead of deleting the first one's checkpoints. The kernel
  drops the lock when the process ends, however it ends.
- :func:`clear_previous_run`: removes the artefacts a previous run left (checkpoints, metrics, TensorBoard
  events, final model, ...), never other files.
- :func:`config_differences`: what ``--resume`` compares. ``output_dir`` is not compared (a moved or
  differently spelled directory is the same run); path options (model, data files) are equal when they
  name the same file or directory, or files with the same bytes.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
from pathlib import Path
from typing import Any

from adora_openrlhf.backends.local import checkpoint as ckpt
from adora_openrlhf.config import ConfigError, RunConfig

RESUMABLE_CHANGES = {"steps", "save_every", "eval_every", "output_dir", "report_to"}  # options a resumed run may change
PATH_OPTIONS = {"model.path", "data.train_path", "data.eval_path"}  # compared by what they name, not by spelling
RUN_ARTEFACTS = ("checkpoints", "tb", "final_model", "tokenizer", "metrics.jsonl", "summary.json", "reward_curve.png", "config.json", "wandb")
LOCK_FILE = ".lock"


def check_output_dir(out: Path) -> None:
    """ConfigError unless ``out`` is a directory, or can be created as one, that this user may write."""
    from adora_openrlhf.cli_errors import check_output_dir as check

    check(out, "output_dir")


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}": v})
    return out


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


def config_differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Flattened option names whose values differ in a way that matters for resuming (module docstring)."""
    flat_saved, flat_now = _flatten(saved), _flatten(now)
    changed = []
    for key in sorted(set(flat_saved) | set(flat_now)):
        old, new = flat_saved.get(key), flat_now.get(key)
        if key in RESUMABLE_CHANGES or old == new:
            continue
        if key in PATH_OPTIONS and same_location(old, new):
            continue
        changed.append(key)
    return changed


def check_resume_config(saved_path: Path, cfg: RunConfig) -> None:
    try:
        saved = json.loads(saved_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ConfigError(f"--resume: {saved_path} is not valid JSON; restore it from a backup or start a new run") from None
    now = cfg.to_dict()
    changed = config_differences(saved, now)
    if changed:
        flat_saved, flat_now = _flatten(saved), _flatten(now)
        details = ", ".join(f"{k}: {flat_saved.get(k)!r} -> {flat_now.get(k)!r}" for k in changed[:8])
        raise ConfigError(
            f"--resume: the config differs from the saved run in {details}; resume with the same options "
            f"(only {sorted(RESUMABLE_CHANGES)} may change) or use a new --output-dir"
        )


def check_previous_run(out: Path, cfg: RunConfig, resume: bool, overwrite: bool) -> Path | None:
    """The checkpoint to resume from (None for a new run), after the read-only checks of the module docstring."""
    if resume and overwrite:
        raise ConfigError("--overwrite: cannot be combined with --resume (one continues the run, the other replaces it)")
    found = ckpt.list_checkpoints(out)
    if resume:
        if not found:
            raise ConfigError(f"--resume: no checkpoint under {str(ckpt.checkpoint_dir(out))!r}; start the run without --resume")
        if (out / "config.json").exists():
            check_resume_config(out / "config.json", cfg)
        return found[-1][1]
    if found and not overwrite:
        raise ConfigError(
            f"output_dir: {str(out)!r} holds a run with checkpoints (up to step {found[-1][0]}); continue it with --resume, "
            "replace it with --overwrite, or choose another --output-dir"
        )
    return None


def clear_previous_run(out: Path) -> None:
    """Remove a previous run's artefacts from ``out`` (only the names in RUN_ARTEFACTS)."""
    for name in RUN_ARTEFACTS:
        target = out / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()


class RunDirLock:
    """Exclusive lock on ``out/.lock`` (creates ``out``); ConfigError when another process holds it."""

    def __init__(self, out: Path):
        self.out = out
        self.handle = None

    def __enter__(self) -> RunDirLock:
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / LOCK_FILE
        handle = open(path, "a+", encoding="utf-8")
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no lock
            self.handle = handle
            return self
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise ConfigError(
                f"output_dir: {str(self.out)!r} is in use by a running training ({holder}); wait for it to finish or choose another --output-dir"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        self.handle = handle
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.handle is not None:
            self.handle.close()  # closing the descriptor releases the flock
            self.handle = None
