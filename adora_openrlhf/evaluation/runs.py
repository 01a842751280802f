"""A local training run as an evaluation target: ``python -m eval.run --run RUN``.

The local trainer saves the held-out rows it evaluates and the settings it evaluates them with
(``RUN/heldout.jsonl``, ``RUN/heldout.json``; ``adora_openrlhf/rundir/heldout.py``). ``--run RUN``
evaluates ``RUN/final_model`` (or ``--model``, e.g. one of the run's checkpoints) on those rows (benchmark
``heldout``) with the run's prompt template, and by default its ``max_new_tokens``, repetition penalty and
generation batch size, and reports the result next to the trainer's own ``eval/greedy_accuracy`` of the same
checkpoint (``RUN/metrics.jsonl``). With ``--temperature 0 --k 1`` the two are equal: the same rows, prompts,
greedy decoding and batches.

A model directory inside a run (``RUN/final_model``, ``RUN/checkpoints/step_N``) is traced back to its run
(:func:`model_origin`), so that a benchmark from another distribution can be flagged (``evaluation/fit.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adora_openrlhf.engine.model_config import NUMERICS
from adora_openrlhf.errors import ConfigError
from adora_openrlhf.evaluation.fit import ModelOrigin
from adora_openrlhf.plugins import import_plugins
from adora_openrlhf.rundir.heldout import HELDOUT_ROWS, HELDOUT_SETTINGS

logger = logging.getLogger(__name__)
_STEP_DIR = re.compile(r"^step_(\d+)$")
# the fields of heldout.json that --run reads (rundir/heldout.py writes them all): dotted name, type, what it must be
_SETTINGS = (
    ("prompt_template", str, "a string"),
    ("rollout.max_new_tokens", int, "a positive integer"),
    ("rollout.repetition_penalty", (int, float), "a number"),
    ("generation_batch_size", int, "a positive integer"),
    ("numerics", str, "a string"),
    ("rows_sha256", str, "a string"),
    ("plugins", list, "a list of module names"),
)


@dataclass(frozen=True)
class RunTarget:
    """What ``--run`` evaluates: the run directory, its held-out rows file and the settings of ``heldout.json``."""

    run_dir: Path
    rows_file: Path
    settings: dict[str, Any]

    @property
    def prompt_template(self) -> str:
        return str(self.settings["prompt_template"])

    @property
    def max_new_tokens(self) -> int:
        return int(self.settings["rollout"]["max_new_tokens"])

    @property
    def repetition_penalty(self) -> float:
        return float(self.settings["rollout"]["repetition_penalty"])

    @property
    def batch_size(self) -> int:
        return int(self.settings["generation_batch_size"])

    @property
    def numerics(self) -> str:
        """The trainer's ``model.numerics``."""
        return str(self.settings["numerics"])


def _read_json(path: Path, option: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError(f"{option}: {path} is not valid JSON") from None
    if not isinstance(data, dict):
        raise ValueError(f"{option}: {path} holds no JSON object")
    return data


def open_run(path: str | Path, plugins: Sequence[str] = ()) -> RunTarget:
    """The ``--run`` target at ``path``; ValueError naming ``--run`` when it is no run with a saved held-out set.

    A run's files never cause an import: the plug-ins imported are the user's ``plugins`` (``--plugins``), never
    the list the run's ``heldout.json`` names, and never from inside the run directory (its folder is taken off
    ``sys.path`` while they import). A run trained with plug-ins the user did not name is refused, naming both
    lists; plug-ins named beyond the run's are imported with a warning."""
    run_dir = Path(path)
    if not run_dir.is_dir():
        raise ValueError(f"--run: {path} is not a directory (give a training run's --output_dir, e.g. runs/kk-testbed)")
    settings_file, rows_file = run_dir / HELDOUT_SETTINGS, run_dir / HELDOUT_ROWS
    if not settings_file.is_file() or not rows_file.is_file():
        what = "a local training run" if (run_dir / "config.json").is_file() else "a training run's directory"
        raise ValueError(
            f"--run: {path} has no {HELDOUT_SETTINGS} / {HELDOUT_ROWS} ({what} saves them when it starts); "
            "train the run again, or pass --model and --bench-file"
        )
    settings = _read_json(settings_file, "--run")
    _check_settings(settings, settings_file)
    _import_user_plugins(run_dir, settings_file, settings["plugins"], plugins)
    return RunTarget(run_dir, rows_file, settings)


def _import_user_plugins(run_dir: Path, settings_file: Path, saved: Any, given: Sequence[str]) -> None:
    """Import the user's ``--plugins`` (never from ``run_dir``), after comparing them with the run's saved list."""
    if not isinstance(saved, list) or not all(isinstance(name, str) for name in saved):
        raise ValueError(f"--run: {settings_file}: field plugins must be a list of module names, got {saved!r}")
    saved_names = [name.strip() for name in saved]
    missing = [name for name in saved_names if name not in given]
    if missing:
        raise ValueError(
            f"--run: {settings_file} says the run was trained with plug-ins {saved_names}, but --plugins names "
            f"{list(given)}; a run's files never choose code to import: pass --plugins {','.join(saved_names)} if you "
            "trust those modules (installed or on PYTHONPATH, outside the run directory)"
        )
    extra = [name for name in given if name not in saved_names]
    if extra:
        logger.warning(
            "--plugins %s: not among the run's plug-ins %s (%s); imported all the same",
            extra,
            saved_names,
            settings_file,
        )
    try:
        import_plugins(list(given), field="--plugins", untrusted=[run_dir])
    except ConfigError as err:
        raise ValueError(str(err)) from None


def _check_settings(settings: dict[str, Any], settings_file: Path) -> None:
    """ValueError naming ``heldout.json`` and the field when a setting ``RunTarget`` reads (:data:`_SETTINGS`) is
    missing or has the wrong type (or, for ``numerics``, is not one of ``engine/model_config.NUMERICS``)."""
    for name, kind, wanted in _SETTINGS:
        section, _, key = name.rpartition(".")
        holder = settings.get(section) if section else settings
        if not isinstance(holder, dict) or key not in holder:
            raise ValueError(
                f"--run: {settings_file}: field {name} is missing; train the run again or restore the file"
            )
        value = holder[key]
        if isinstance(value, bool) or not isinstance(value, kind) or (kind is int and value < 1):
            raise ValueError(
                f"--run: {settings_file}: field {name} must be {wanted}, got {value!r}; train the run again or restore the file"
            )
    numerics = settings["numerics"]
    if numerics not in NUMERICS:
        raise ValueError(
            f"--run: {settings_file}: field numerics must be one of {', '.join(NUMERICS)}, got {numerics!r}; "
            "train the run again or restore the file"
        )


def default_model(target: RunTarget) -> Path:
    """``RUN/final_model``; ValueError when the run has not written it."""
    final = target.run_dir / "final_model"
    if not (final / "config.json").is_file():
        raise ValueError(
            f"--run: {target.run_dir} has no final_model yet (unfinished run); pass --model {target.run_dir}/checkpoints/step_N"
        )
    return final


def _eval_records(run_dir: Path) -> dict[int, float]:
    """step -> the trainer's ``eval/greedy_accuracy`` (the last record of each step) from ``RUN/metrics.jsonl``."""
    from adora_openrlhf.rundir.metrics import read_metrics

    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return {}
    return {
        int(r["step"]): float(r["eval/greedy_accuracy"])
        for r in read_metrics(path)
        if "eval/greedy_accuracy" in r and "step" in r
    }


def trainer_accuracy(run_dir: Path, model: Path) -> tuple[int, float] | None:
    """(step, the trainer's ``eval/greedy_accuracy`` at that step) for ``model``: ``RUN/final_model`` is the last
    evaluated step, ``RUN/checkpoints/step_N`` step N; None for another directory or a step without evaluation."""
    evals = _eval_records(run_dir)
    model = model.resolve()
    if model == (run_dir / "final_model").resolve():
        step = max(evals, default=None)
    else:
        match = _STEP_DIR.match(model.name)
        step = int(match.group(1)) if match and model.parent.resolve() == (run_dir / "checkpoints").resolve() else None
    if step is None or step not in evals:
        return None
    return step, evals[step]


def model_origin(model: str | Path) -> ModelOrigin | None:
    """The local run that ``model`` (``RUN/final_model`` or ``RUN/checkpoints/step_N``) belongs to, or None."""
    path = Path(model)
    if not path.is_dir():
        return None
    for run_dir in (path.parent, path.parent.parent):
        config_file = run_dir / "config.json"
        if not config_file.is_file() or not ((run_dir / "final_model").is_dir() or (run_dir / "checkpoints").is_dir()):
            continue
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, OSError):
            return None
        data = config.get("data") if isinstance(config, dict) else None
        if not isinstance(data, dict):
            return None
        return ModelOrigin(str(run_dir), config.get("recipe"), data.get("train_path") is None)
    return None


def default_out(target: RunTarget, model: Path, settings: dict[str, Any]) -> Path:
    """``RUN/eval/<model>-<files>_<engine>_<dtype>_t<temperature>_p<top_p>_n<max_new_tokens>_s<seed>``: one folder per
    model and generation settings (``<files>``: the first 8 hex digits of the hash of the model's files, from
    ``settings["model_files"]``), so that a rerun with other settings, or after the run retrained its final model
    (``--resume`` with more steps, ``--overwrite``), never meets samples it would have to refuse."""
    files = settings.get("model_files")
    name = (
        f"{model.name}{f'-{files[:8]}' if files else ''}_{settings['engine']}_{settings['dtype']}_t{settings['temperature']:g}_p{settings['top_p']:g}"
        f"_n{settings['max_new_tokens']}_s{settings['seed']}"
    )
    return target.run_dir / "eval" / name


def rows_changed(target: RunTarget) -> str | None:
    """Why the held-out rows file differs from the one the run saved (its SHA-256 in ``heldout.json``), or None
    (the same file)."""
    saved = target.settings["rows_sha256"]
    digest = hashlib.sha256(target.rows_file.read_bytes()).hexdigest()
    if digest == saved:
        return None
    return f"{target.rows_file} changed after training (SHA-256 {digest[:12]}, saved {saved[:12]}): these are other rows than the trainer's"
