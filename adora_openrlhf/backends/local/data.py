"""Training and held-out rows for the local backend, their reward functions, and the data order.

Rows follow the project's JSONL schema ``{"prompt", "label", "images", "source", "meta"}``. With no
``data.train_path`` and task ``kk`` the rows are generated K&K puzzles (``data_prep.kk``), with task
``geometry`` generated images (``data_prep.geo_synth``); train and eval share no puzzle or image. A path is read with ``datasets.load_dataset`` ("json" for ``.jsonl``/``.json`` files,
"parquet" for ``.parquet``, otherwise a dataset name).

The data order is a pure function of (seed, position): position ``i`` (the i-th prompt the run consumes)
maps to epoch ``i // N`` and to entry ``i % N`` of that epoch's seeded permutation, so a resumed run
continues with exactly the prompts the uninterrupted run would have used.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from adora_openrlhf.config import ConfigError, DataConfig


@dataclass(frozen=True)
class Row:
    prompt: Any  # chat messages or a string
    label: str
    source: str
    meta: dict[str, Any]
    images: tuple[Any, ...] = ()  # image file paths or PIL images, one per <image> tag of the prompt (vision rows)


def _load_path(path: str) -> list[dict[str, Any]]:
    import datasets

    p = Path(path)
    if p.exists():
        kind = "parquet" if p.suffix == ".parquet" else "json"
        ds = datasets.load_dataset(kind, data_files=str(p), split="train")
    else:
        ds = datasets.load_dataset(path, split="train")
    return [dict(r) for r in ds]


def validate_rows(raw: Sequence[dict[str, Any]], where: str, default_source: str) -> list[Row]:
    """Rows from raw dicts; a missing or malformed field raises naming the file, row and field."""
    rows = []
    for i, r in enumerate(raw):
        if not isinstance(r, dict):
            raise ConfigError(f"{where} row {i}: expected a JSON object, got {type(r).__name__}")
        prompt = r.get("prompt")
        if not (isinstance(prompt, str) and prompt.strip()) and not (isinstance(prompt, list) and prompt):
            raise ConfigError(f"{where} row {i} field 'prompt': missing or empty (a string or a list of chat messages)")
        label = r.get("label")
        if label is None or str(label).strip() == "":
            raise ConfigError(f"{where} row {i} field 'label': missing or empty (the ground-truth answer)")
        meta = r.get("meta") or {}
        if not isinstance(meta, dict):
            raise ConfigError(f"{where} row {i} field 'meta': expected an object, got {type(meta).__name__}")
        images = r.get("images") or []
        if not isinstance(images, (list, tuple)):
            raise ConfigError(f"{where} row {i} field 'images': expected a list of image paths, got {type(images).__name__}")
        for k, ref in enumerate(images):
            if isinstance(ref, str) and not Path(ref).is_file():
                raise ConfigError(f"{where} row {i} field 'images[{k}]': no image file at {ref!r}")
            if not isinstance(ref, str) and not hasattr(ref, "convert"):
                raise ConfigError(f"{where} row {i} field 'images[{k}]': expected a file path, got {type(ref).__name__}")
        rows.append(Row(prompt=prompt, label=str(label), source=str(r.get("source") or default_source), meta=meta, images=tuple(images)))
    if not rows:
        raise ConfigError(f"{where}: no rows")
    return rows


def load_rows(cfg: DataConfig, seed: int) -> tuple[list[Row], list[Row]]:
    """(train rows, held-out rows) for ``cfg``."""
    if cfg.train_path is None and cfg.task == "geometry":
        from data_prep.geo_synth import generate_splits as geo_splits

        train_raw, eval_raw = geo_splits(cfg.num_train, cfg.num_eval, seed, cfg.geo_tasks, cfg.geo_levels)
        if cfg.eval_path is not None:
            eval_raw = _load_path(cfg.eval_path)
        return validate_rows(train_raw, "generated train", cfg.task), validate_rows(eval_raw, "data.eval_path" if cfg.eval_path else "generated eval", cfg.task)
    if cfg.train_path is None:
        if cfg.task != "kk":
            raise ConfigError(f"data.train_path: task {cfg.task!r} has no generator; give a JSONL file (see data_prep/)")
        from data_prep.kk import generate_splits

        train_raw, eval_raw = generate_splits(cfg.num_train, cfg.num_eval, cfg.kk_num_people, seed)
        if cfg.eval_path is not None:
            eval_raw = _load_path(cfg.eval_path)
        return validate_rows(train_raw, "generated train", cfg.task), validate_rows(eval_raw, "data.eval_path" if cfg.eval_path else "generated eval", cfg.task)
    train = validate_rows(_load_path(cfg.train_path), f"data.train_path {cfg.train_path!r}", cfg.task)
    if cfg.eval_path is not None:
        held = validate_rows(_load_path(cfg.eval_path), f"data.eval_path {cfg.eval_path!r}", cfg.task)
    else:
        if len(train) < 2:
            raise ConfigError("data.train_path: need at least 2 rows to hold some out for evaluation (or give data.eval_path)")
        k = min(cfg.num_eval, len(train) // 2)
        train, held = train[:-k], train[-k:]
    return train, held[: cfg.num_eval]


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
    """A stable identity of a prompt across steps (for the sampler's history pool)."""
    return repr(row.prompt)


def reward_fn_for(row: Row):
    from adora_openrlhf.rewards.base import get_reward_fn

    try:
        return get_reward_fn(row.source)
    except KeyError as err:
        raise ConfigError(f"data: {err.args[0]}") from None


def first_bad_prompt(lengths: Sequence[int], limit: int) -> Optional[int]:
    for i, n in enumerate(lengths):
        if n > limit:
            return i
    return None
