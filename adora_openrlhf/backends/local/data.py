"""Training and held-out rows for the local backend, their reward functions, and the data order.

Rows follow the project's JSONL schema ``{"prompt", "label", "images", "source", "meta"}``. With no
``data.train_path`` and task ``kk`` the rows are generated K&K puzzles (``data_prep.kk``), with task
``geometry`` generated images (``data_prep.geo_synth``); train and eval share no puzzle or image. A local
``.jsonl``/``.json``/``.parquet`` file is read by :mod:`adora_openrlhf.datafiles` (errors name ``file:line``,
lines counted from 1); a name that is not a file path is loaded from the hub with ``datasets.load_dataset``.
Every row is checked at load time: prompt, label, meta, images, a known reward source, and a label the
source's reward can parse (:data:`LABEL_CHECKS`); errors name ``file:line: field``. Duplicate rows are
reported, and held-out rows never share a prompt with training rows (overlapping held-out rows are dropped,
with a warning).

The data order is a pure function of (seed, position): position ``i`` (the i-th prompt the run consumes)
maps to epoch ``i // N`` and to entry ``i % N`` of that epoch's seeded permutation, so a resumed run
continues with exactly the prompts the uninterrupted run would have used.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adora_openrlhf.config import ConfigError, DataConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Row:
    prompt: Any  # chat messages or a string
    label: str
    source: str
    meta: dict[str, Any]
    where: str = field(default="", compare=False)  # "file:line" (or "generated train:N") for error messages
    images: tuple[Any, ...] = ()  # image file paths or PIL images, one per <image> tag of the prompt (vision rows)


def _load_path(path: str, option: str) -> tuple[list[dict[str, Any]], list[int], str]:
    """(rows, their 1-based lines, location prefix) of a local file or a hub dataset (split ``train``)."""
    from adora_openrlhf.datafiles import load_rows as load_row_source

    loaded = load_row_source(path, what=f"{option} file", option=option)
    return loaded.rows, loaded.numbers, loaded.where  # hub rows: "NAME:ROW", rows numbered from 1


def _kk_label_ok(label: str, meta: dict[str, Any]) -> None:
    from adora_openrlhf.rewards.kk import parse_kk_label

    names = meta.get("names")
    parse_kk_label(label, names if isinstance(names, list) and names else None)


# reward source -> check that raises ValueError when that reward cannot parse the label (checked at load time)
LABEL_CHECKS: dict[str, Callable[[str, dict[str, Any]], None]] = {"kk": _kk_label_ok}


def validate_rows(raw: Sequence[dict[str, Any]], where: str, default_source: str, lines: Sequence[int] | None = None) -> list[Row]:
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
        if isinstance(prompt, list) and not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt):
            raise ConfigError(f'{at}: field \'prompt\': a list prompt must hold chat messages {{"role": text, "content": text}}')
        label = r.get("label")
        if label is None or isinstance(label, (dict, list, bool)) or str(label).strip() == "":
            raise ConfigError(f"{at}: field 'label': missing, empty or not text (the ground-truth answer)")
        meta = r.get("meta") or {}
        if not isinstance(meta, dict):
            raise ConfigError(f"{at}: field 'meta': expected an object, got {type(meta).__name__}")
        images = r.get("images") or []
        if not isinstance(images, (list, tuple)):
            raise ConfigError(f"{at}: field 'images': expected a list of image paths, got {type(images).__name__}")
        for k, ref in enumerate(images):
            if isinstance(ref, str) and not Path(ref).is_file():
                raise ConfigError(f"{at}: field 'images[{k}]': no image file at {ref!r}")
            if not isinstance(ref, str) and not hasattr(ref, "convert"):
                raise ConfigError(f"{at}: field 'images[{k}]': expected a file path, got {type(ref).__name__}")
        source = str(r.get("source") or default_source)
        try:
            get_reward_fn(source)
        except KeyError as err:
            raise ConfigError(f"{at}: field 'source': {err.args[0]}") from None
        check = LABEL_CHECKS.get(source)
        if check is not None:
            try:
                check(str(label), meta)
            except ValueError as err:
                raise ConfigError(f"{at}: field 'label': the {source!r} reward cannot parse it ({err})") from None
        rows.append(Row(prompt=prompt, label=str(label), source=source, meta=meta, where=at, images=tuple(images)))
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
        _warn(f"{rows[first].where}: duplicate row (same prompt and label as {rows[original].where}); {len(repeats)} duplicates in {where}")


def _without_overlap(train: list[Row], held: list[Row], option: str) -> list[Row]:
    """Held-out rows whose prompt is not among the training prompts (with a warning when some are dropped)."""
    train_keys = {row_key(r) for r in train}
    kept = [r for r in held if row_key(r) not in train_keys]
    if not kept:
        raise ConfigError(f"{option}: every held-out row's prompt is also a training prompt; give held-out rows that are not in the training data")
    if len(kept) < len(held):
        _warn(f"{option}: dropped {len(held) - len(kept)} held-out rows whose prompt is also a training prompt")
    return kept


def load_rows(cfg: DataConfig, seed: int) -> tuple[list[Row], list[Row]]:
    """(train rows, held-out rows) for ``cfg``; held-out prompts never appear among the training prompts. K&K rows
    get ``meta["kk_parser"] = cfg.kk_parser`` unless they name one."""
    train, held = _load_rows(cfg, seed)
    for row in (*train, *held):
        if row.source == "kk":
            row.meta.setdefault("kk_parser", cfg.kk_parser)
    return train, held


def _load_rows(cfg: DataConfig, seed: int) -> tuple[list[Row], list[Row]]:
    held: list[Row] | None = None
    if cfg.eval_path is not None:
        raw, lines, where = _load_path(cfg.eval_path, "data.eval_path")
        held = validate_rows(raw, where, cfg.task, lines)
    if cfg.train_path is None and cfg.task == "geometry":
        from data_prep.geo_synth import generate_splits as geo_splits

        train_raw, eval_raw = geo_splits(cfg.num_train, cfg.num_eval, seed, cfg.geo_tasks, cfg.geo_levels)
        train = validate_rows(train_raw, "generated train", cfg.task)
        if held is None:
            return train, validate_rows(eval_raw, "generated eval", cfg.task)
        return train, _without_overlap(train, held, "data.eval_path")
    if cfg.train_path is None:
        if cfg.task != "kk":
            raise ConfigError(f"data.train_path: task {cfg.task!r} has no generator; give a JSONL file (see data_prep/)")
        from data_prep.kk import generate_splits

        try:
            train_raw, eval_raw = generate_splits(
                cfg.num_train, cfg.num_eval, cfg.kk_num_people, seed, name_pool=cfg.kk_name_pool, name_order=cfg.kk_name_order
            )
        except (ValueError, RuntimeError) as err:  # e.g. more puzzles asked for than exist for these people counts
            raise ConfigError(
                f"data.num_train: cannot generate {cfg.num_train} + {cfg.num_eval} puzzles for kk_num_people {cfg.kk_num_people} ({err})"
            ) from None
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
        raise ConfigError("data.train_path: need at least 2 rows to hold some out for evaluation (or give data.eval_path)")
    k = min(cfg.num_eval, len(train) // 2)
    held = train[-k:]
    held_keys = {row_key(r) for r in held}
    train = [r for r in train[:-k] if row_key(r) not in held_keys]  # a held-out prompt is never also trained on
    if not train:
        raise ConfigError("data.train_path: no training rows left after holding out evaluation rows (the file repeats one prompt); give data.eval_path")
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
    """A stable identity of a prompt across steps (for the sampler's history pool)."""
    return repr(row.prompt)


def reward_fn_for(row: Row):
    from adora_openrlhf.rewards.base import get_reward_fn

    try:
        return get_reward_fn(row.source)
    except KeyError as err:
        raise ConfigError(f"data: {err.args[0]}") from None


def first_bad_prompt(lengths: Sequence[int], limit: int) -> int | None:
    for i, n in enumerate(lengths):
        if n > limit:
            return i
    return None
