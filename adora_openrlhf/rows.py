"""Training and held-out rows for the local backend, their reward functions, and the data order.

Rows follow the project's JSONL schema ``{"prompt", "label", "images", "source", "meta"}``; a row without
``source`` takes the task's name. With no ``data.train_path`` the rows come from the task's generator
(``tasks/registry.py``: K&K puzzles for ``kk``, shape images for ``geometry``); train and eval share no puzzle
or image. A local
``.jsonl``/``.json``/``.parquet`` file is read by :mod:`adora_openrlhf.datafiles` (errors name ``file:line``,
lines counted from 1); a name that is not a file path is loaded from the hub with ``datasets.load_dataset``.
Every row is checked at load time, before a run writes anything: prompt, label, meta, images (each file
decoded; relative paths were resolved against the data file's folder by :mod:`adora_openrlhf.datafiles`), a
known reward source, and the checks of the task that reads the source (``Task.label_check``: a label its
reward can parse; ``Task.row_check``: the meta fields the reward reads, ``tasks/row_checks.py`` for the
built-in tasks);
errors name ``file:line: field``. A row is identified by its prompt and the content of its images
(:func:`row_key`): duplicate rows are reported, and held-out rows never repeat a training row (overlapping
held-out rows are dropped, with a warning). :func:`rows_fingerprint` is the content hash a checkpoint keeps
so that ``--resume`` notices data edited in place.

The data order is a pure function of (seed, position): position ``i`` (the i-th prompt the run consumes)
maps to epoch ``i // N`` and to entry ``i % N`` of that epoch's seeded permutation, so a resumed run
continues with exactly the prompts the uninterrupted run would have used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adora_openrlhf.config import ConfigError, DataConfig
from adora_openrlhf.tasks.registry import TASKS, row_problem, task_of_source

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Row:
    prompt: Any  # chat messages or a string
    label: str
    source: str
    meta: dict[str, Any]
    where: str = field(default="", compare=False)  # "file:line" (or "generated train:N") for error messages
    images: tuple[Any, ...] = ()  # image file paths or PIL images, one per <image> tag of the prompt (vision rows)
    key: str = field(default="", compare=False)  # row_identity(prompt, images); computed when not given

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(self, "key", row_identity(self.prompt, [_digest_or_name(ref) for ref in self.images]))


def image_digest(ref: Any) -> str:
    """A content hash of one image (a file path or a PIL image): SHA-256 of its size and RGB pixels, so the same
    picture has the same digest in memory, as PNG or as another lossless file. Raises what PIL raises for a
    file that is missing, not an image, or damaged."""
    from PIL import Image

    if isinstance(ref, Image.Image):
        rgb = ref.convert("RGB")
    else:
        with Image.open(ref) as image:
            rgb = image.convert("RGB")
    digest = hashlib.sha256(f"{rgb.size[0]}x{rgb.size[1]}:".encode())
    digest.update(rgb.tobytes())
    return digest.hexdigest()[:32]


def _digest_or_name(ref: Any) -> str:
    try:
        return image_digest(ref)
    except Exception:  # noqa: BLE001 - an unreadable image is reported by validate_rows; here it is only named
        return f"unreadable:{ref!r}"


def row_identity(prompt: Any, image_digests: Sequence[str]) -> str:
    """What makes two rows the same problem: the prompt and the content of its images (``repr(prompt)`` alone
    for a text row)."""
    return repr(prompt) if not image_digests else f"{prompt!r} images:{','.join(image_digests)}"


def _load_path(path: str, option: str) -> tuple[list[dict[str, Any]], list[int], str]:
    """(rows, their 1-based lines, location prefix) of a local file or a hub dataset (split ``train``)."""
    from adora_openrlhf.datafiles import load_rows as load_row_source

    loaded = load_row_source(path, what=f"{option} file", option=option)
    return loaded.rows, loaded.numbers, loaded.where  # hub rows: "NAME:ROW", rows numbered from 1


def _checked_image_digest(ref: Any, at: str) -> str:
    """:func:`image_digest` of one ``images`` entry; ConfigError ``AT: what is wrong`` when it is not a readable image."""
    if not isinstance(ref, str) and not hasattr(ref, "convert"):
        raise ConfigError(f"{at}: expected an image file path, got {type(ref).__name__}")
    if isinstance(ref, str) and not Path(ref).is_file():
        raise ConfigError(f"{at}: no image file at {ref!r} (a relative path is read from the data file's folder)")
    try:
        return image_digest(ref)
    except Exception as err:  # noqa: BLE001 - PIL raises OSError, UnidentifiedImageError, DecompressionBombError, SyntaxError...
        reason = " ".join(str(err).split())[:160] or type(err).__name__
        raise ConfigError(
            f"{at}: the image file {ref!r} cannot be decoded ({reason}); it is damaged or not an image: replace it"
        ) from None


MAX_LABEL_CHARS = 4096  # a ground-truth answer longer than this is refused at load (no task's answer comes near it)


def validate_rows(
    raw: Sequence[dict[str, Any]], where: str, default_source: str, lines: Sequence[int] | None = None
) -> list[Row]:
    """Rows from raw dicts; a malformed row raises ``WHERE:LINE: field 'name': what is wrong`` (``lines``: each
    row's 1-based line in its file; default: its 1-based position)."""
    from adora_openrlhf.rewards.base import get_reward_fn

    rows = []
    for i, r in enumerate(raw):
        at = f"{where}:{lines[i] if lines is not None else i + 1}"
        if not isinstance(r, dict):
            raise ConfigError(f"{at}: expected a JSON object, got {type(r).__name__}")
        prompt = r.get("prompt")
        if not (isinstance(prompt, str) and prompt.strip()) and not (isinstance(prompt, list) and prompt):
            raise ConfigError(f"{at}: field 'prompt': missing or empty (a string or a list of chat messages)")
        if isinstance(prompt, list) and not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt
        ):
            raise ConfigError(
                f'{at}: field \'prompt\': a list prompt must hold chat messages {{"role": text, "content": text}}'
            )
        label = r.get("label")
        if label is None or isinstance(label, (dict, list, bool)) or str(label).strip() == "":
            raise ConfigError(f"{at}: field 'label': missing, empty or not text (the ground-truth answer)")
        if len(str(label)) > MAX_LABEL_CHARS:
            raise ConfigError(
                f"{at}: field 'label': {len(str(label))} characters, more than the {MAX_LABEL_CHARS} a ground-truth answer may have "
                "(the graders would fail on it at every sample); put the answer alone in the label"
            )
        meta = r.get("meta") or {}
        if not isinstance(meta, dict):
            raise ConfigError(f"{at}: field 'meta': expected an object, got {type(meta).__name__}")
        images = r.get("images") or []
        if not isinstance(images, (list, tuple)):
            raise ConfigError(f"{at}: field 'images': expected a list of image paths, got {type(images).__name__}")
        digests = [_checked_image_digest(ref, f"{at}: field 'images[{k}]'") for k, ref in enumerate(images)]
        source = str(r.get("source") or default_source)
        try:
            get_reward_fn(source)
        except KeyError as err:
            raise ConfigError(f"{at}: field 'source': {err.args[0]}") from None
        problem = row_problem(source, prompt, str(label), meta)
        if problem is not None:
            raise ConfigError(f"{at}: {problem}")
        key = row_identity(prompt, digests)
        rows.append(
            Row(prompt=prompt, label=str(label), source=source, meta=meta, where=at, images=tuple(images), key=key)
        )
    if not rows:
        raise ConfigError(f"{where}: no rows")
    return rows


def _warn(message: str) -> None:
    logger.warning(message)


def _report_duplicates(rows: Sequence[Row], where: str) -> None:
    seen: dict[tuple[str, str], int] = {}
    repeats = []
    for i, row in enumerate(rows):
        key = (row_key(row), row.label)
        if key in seen:
            repeats.append((i, seen[key]))
        else:
            seen[key] = i
    if repeats:
        first, original = repeats[0]
        _warn(
            f"{rows[first].where}: duplicate row (same prompt, images and label as {rows[original].where}); {len(repeats)} duplicates in {where}"
        )


def _without_overlap(train: list[Row], held: list[Row], option: str) -> list[Row]:
    """Held-out rows that are not training rows (same prompt and images; with a warning when some are dropped)."""
    train_keys = {row_key(r) for r in train}
    kept = [r for r in held if row_key(r) not in train_keys]
    if not kept:
        raise ConfigError(
            f"{option}: every held-out row is also a training row (same prompt and images); give held-out rows that are not in the training data"
        )
    if len(kept) < len(held):
        _warn(
            f"{option}: dropped {len(held) - len(kept)} held-out rows that are also training rows (same prompt and images)"
        )
    return kept


def load_run_rows(cfg: DataConfig, seed: int) -> tuple[list[Row], list[Row]]:
    """(train rows, held-out rows) for ``cfg``; held-out prompts never appear among the training prompts. Each row
    gets the meta defaults of the task that reads its source (``Task.meta_defaults``; K&K rows the run's answer
    parser, ``meta["kk_parser"] = cfg.kk.parser``) where it names none."""
    train, held = _load_rows(cfg, seed)
    for row in (*train, *held):
        task = task_of_source(row.source)
        if task is not None and task.meta_defaults is not None:
            for key, value in task.meta_defaults(cfg).items():
                row.meta.setdefault(key, value)
    return train, held


def generated_rows(task: Any, cfg: DataConfig, seed: int) -> tuple[list[Any], list[Any]]:
    """``task.generate(cfg, seed)``: its (train rows, held-out rows), two lists of row mappings; a generator that
    raises or returns another shape is a ConfigError naming the task and its generator function."""
    where = f"data.task: the generator of task {task.name!r} ({getattr(task.generate, '__module__', '?')}.{getattr(task.generate, '__qualname__', '?')})"
    try:
        result = task.generate(cfg, seed)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - a plug-in task's own code: name it, one line
        raise ConfigError(
            f"{where} raised {type(err).__name__}: {' '.join(str(err).split())[:200]}; fix the generator"
        ) from None
    if not (isinstance(result, (tuple, list)) and len(result) == 2 and all(isinstance(part, list) for part in result)):
        raise ConfigError(
            f"{where} returned {type(result).__name__} {result!r:.60}; it must return (train rows, held-out rows), two lists of row mappings"
        )
    return result[0], result[1]


def _load_rows(cfg: DataConfig, seed: int) -> tuple[list[Row], list[Row]]:
    held: list[Row] | None = None
    if cfg.eval_path is not None:
        raw, lines, where = _load_path(cfg.eval_path, "data.eval_path")
        held = validate_rows(raw, where, cfg.task, lines)
    if cfg.train_path is None:
        task = TASKS.get(cfg.task)
        if task.generate is None:
            raise ConfigError(
                f"data.train_path: task {cfg.task!r} has no generator; give a JSONL file (see data_prep/)"
            )
        train_raw, eval_raw = generated_rows(task, cfg, seed)
        train = validate_rows(train_raw, "generated train", cfg.task)
        if held is None:
            return train, validate_rows(eval_raw, "generated eval", cfg.task)
        return train, _without_overlap(train, held, "data.eval_path")
    raw, lines, where = _load_path(cfg.train_path, "data.train_path")
    train = validate_rows(raw, where, cfg.task, lines)
    _report_duplicates(train, where)
    if held is not None:
        return train, _without_overlap(train, held, "data.eval_path")[: cfg.num_eval]
    if len(train) < 2:
        raise ConfigError(
            "data.train_path: need at least 2 rows to hold some out for evaluation (or give data.eval_path)"
        )
    k = min(cfg.num_eval, len(train) // 2)
    held = train[-k:]
    held_keys = {row_key(r) for r in held}
    train = [r for r in train[:-k] if row_key(r) not in held_keys]  # a held-out row is never also trained on
    if not train:
        raise ConfigError(
            "data.train_path: no training rows left after holding out evaluation rows (the file repeats one problem); give data.eval_path"
        )
    return train, held


def epoch_permutation(num_rows: int, seed: int, epoch: int) -> list[int]:
    order = list(range(num_rows))
    random.Random(f"data-order:{seed}:{epoch}").shuffle(order)
    return order


def batch_indices(position: int, count: int, num_rows: int, seed: int) -> list[int]:
    """Row indices of data positions ``position .. position + count - 1`` (see the module docstring)."""
    if num_rows < 1:
        raise ValueError("num_rows: the training set is empty")
    out, cache = [], {}
    for i in range(position, position + count):
        epoch = i // num_rows
        if epoch not in cache:
            cache[epoch] = epoch_permutation(num_rows, seed, epoch)
        out.append(cache[epoch][i % num_rows])
    return out


def row_key(row: Row) -> str:
    """A stable identity of a problem across steps (the sampler's history pool, duplicate and overlap checks):
    its prompt and the content of its images (:func:`row_identity`)."""
    return row.key


def rows_fingerprint(rows: Sequence[Row]) -> dict[str, Any]:
    """``{"rows": count, "sha256": hex}``: a hash of every row's identity (prompt and image contents), label,
    source and meta, in order. Equal for the same rows however the file is laid out; different when any row's
    content, or the order of the rows, changes."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps([row.key, row.label, row.source, row.meta], sort_keys=True, default=repr).encode())
        digest.update(b"\n")
    return {"rows": len(rows), "sha256": digest.hexdigest()}


def reward_fn_for(row: Row):
    from adora_openrlhf.rewards.base import get_reward_fn

    try:
        return get_reward_fn(row.source)
    except KeyError as err:
        raise ConfigError(f"data: {err.args[0]}") from None
