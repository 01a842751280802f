"""Reading row files with ``file:line: what is wrong`` errors, for every loader (trainer, ``eval.run``, ``data_prep``),
and writing them (:func:`write_jsonl`).

Rows are numbered by their 1-based line in the file (``.jsonl``/``.json`` lines; blank lines count but hold
no row) or, for a ``.json`` array or a ``.parquet`` table, by their 1-based position. Each row comes back as
``(number, value)``.

- :func:`read_rows` (strict): the first bad line raises :class:`DataFileError` ``PATH:LINE: reason``;
  a missing path, a directory, an empty file, bytes that are not UTF-8, a line that is not JSON or not an
  object all name the file (and line).
- :func:`read_rows_lenient`: the same reader, but a bad line is skipped and reported as
  ``PATH:LINE: reason`` in the returned list (the ``data_prep`` converters skip and count bad lines).
- :func:`load_rows`: the one row loader of the trainer, ``eval.run`` and ``data_prep``: a local file (the
  readers above; ``.csv`` and folders through ``datasets``) or a hub dataset name (``datasets.load_dataset``
  with ``split`` and ``config``), with an optional column mapping (``prompt_key``/``label_key`` -> ``prompt``/``label``).
  The image paths in a local file's ``images`` column are read relative to the file's folder
  (:func:`resolve_image_paths`), wherever the command runs from.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adora_openrlhf.config import ConfigError

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


class DataFileError(ConfigError):
    """A data file cannot be used; the message starts with ``PATH`` or ``PATH:LINE``."""


def check_file(path: str | Path, what: str = "data file") -> Path:
    """``path`` as a Path if it is a readable, non-empty file; DataFileError naming it otherwise."""
    p = Path(path)
    if not p.exists():
        raise DataFileError(f"{p}: {what} does not exist")
    if p.is_dir():
        raise DataFileError(f"{p}: is a directory, expected a {what} ({', '.join(FILE_SUFFIXES)})")
    if p.stat().st_size == 0:
        raise DataFileError(f"{p}: {what} is empty")
    return p


def _jsonl_lines(p: Path) -> Iterator[tuple[int, Any, str | None]]:
    """(line number, value or None, error or None) for every non-blank line of a JSONL file."""
    with open(p, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                yield (
                    number,
                    None,
                    f"{p}:{number}: not UTF-8 text (byte {err.start + 1} of the line); re-save the file as UTF-8",
                )
                continue
            if not line.strip():
                continue
            try:
                value = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as err:
                yield number, None, f"{p}:{number}: not valid JSON ({err.msg} at column {err.colno})"
                continue
            if not isinstance(value, dict):
                yield number, None, f"{p}:{number}: expected a JSON object per line, got {type(value).__name__}"
                continue
            yield number, value, None


def _json_array(p: Path) -> Iterator[tuple[int, Any, str | None]]:
    try:
        value = json.loads(p.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise DataFileError(f"{p}: not UTF-8 text (byte {err.start + 1}); re-save the file as UTF-8") from None
    except json.JSONDecodeError as err:
        if err.lineno > 1 or "Extra data" in err.msg:  # several JSON values: JSON Lines in a .json file
            yield from _jsonl_lines(p)
            return
        raise DataFileError(f"{p}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno})") from None
    if isinstance(value, dict):
        yield 1, value, None
        return
    if not isinstance(value, list):
        raise DataFileError(f"{p}: expected a JSON list of objects or one object per line, got {type(value).__name__}")
    for number, item in enumerate(value, 1):
        if isinstance(item, dict):
            yield number, item, None
        else:
            yield number, None, f"{p}:{number}: item {number} is not a JSON object (got {type(item).__name__})"


def _parquet(p: Path) -> Iterator[tuple[int, Any, str | None]]:
    try:
        import pyarrow.parquet as pq

        table = pq.read_table(p)
    except Exception as err:  # noqa: BLE001 - any pyarrow failure is an unreadable file
        raise DataFileError(f"{p}: cannot read as parquet ({type(err).__name__}: {str(err)[:160]})") from None
    for number, row in enumerate(table.to_pylist(), 1):
        yield number, row, None


def _iter_rows(path: str | Path, what: str) -> Iterator[tuple[int, Any, str | None]]:
    p = check_file(path, what)
    if p.suffix == ".parquet":
        yield from _parquet(p)
    elif p.suffix == ".json":
        yield from _json_array(p)
    else:
        yield from _jsonl_lines(p)


def read_rows(path: str | Path, what: str = "data file") -> list[tuple[int, dict[str, Any]]]:
    """Every row of ``path`` as (1-based line, object); the first bad line raises ``PATH:LINE: reason``."""
    rows = []
    for number, value, error in _iter_rows(path, what):
        if error is not None:
            raise DataFileError(error)
        rows.append((number, value))
    if not rows:
        raise DataFileError(f"{path}: {what} holds no rows (only blank lines)")
    return rows


def read_rows_lenient(path: str | Path, what: str = "data file") -> tuple[list[tuple[int, dict[str, Any]]], list[str]]:
    """(rows as (line, object), ``PATH:LINE: reason`` for each skipped bad line)."""
    rows, bad = [], []
    for number, value, error in _iter_rows(path, what):
        if error is not None:
            bad.append(error)
        else:
            rows.append((number, value))
    if not rows and not bad:
        raise DataFileError(f"{path}: {what} holds no rows (only blank lines)")
    return rows, bad


# ---------------------------------------------------------------------------------------------------------
# The one row loader: local file, local folder or hub dataset
# ---------------------------------------------------------------------------------------------------------

LOCAL_SUFFIXES = (*FILE_SUFFIXES, ".csv")  # a name with one of these is a local file, never a hub name


@dataclass
class LoadedRows:
    """Rows of one file or dataset. ``rows[i]`` is row number ``numbers[i]`` (its 1-based file line, or its 1-based
    position in a table or hub split); messages locate it as ``{where}:{number}``. ``bad`` holds the
    ``PATH:LINE: reason`` of lines skipped by a lenient read; ``local`` is False for a hub dataset; ``folder`` is
    the folder relative image paths were resolved against (None for a hub dataset)."""

    rows: list[dict[str, Any]]
    numbers: list[int]
    where: str
    local: bool
    bad: list[str] = field(default_factory=list)
    folder: Path | None = None


IMAGE_COLUMN = "images"  # the row schema's list of image paths


def resolve_image_paths(rows: list[dict[str, Any]], folder: Path) -> None:
    """Make every relative path in each row's ``images`` list relative to ``folder`` (in place): a data file's
    image paths name files beside it, so the file works from any working directory and after the folder is
    moved. Absolute paths, images that are not paths (PIL images, ``{"bytes": ...}``) and rows whose ``images``
    is not a list are left as they are (row validation reports those)."""
    for row in rows:
        images = row.get(IMAGE_COLUMN)
        if isinstance(images, list):
            row[IMAGE_COLUMN] = [_resolved(ref, folder) for ref in images]


def _resolved(ref: Any, folder: Path) -> Any:
    if not isinstance(ref, str) or not ref:
        return ref
    path = Path(ref).expanduser()
    return str(path if path.is_absolute() else folder / path)


def looks_like_file(name: str) -> bool:
    """A name meant as a local file (a typo in it must not be sent to the hub): a known suffix or a path prefix."""
    return Path(name).suffix in LOCAL_SUFFIXES or name.startswith(("/", "./", "../", "~"))


def _with_datasets(option: str, shown: str, what: str, **kwargs: Any) -> list[dict[str, Any]]:
    """``datasets.load_dataset(**kwargs)`` as a list of row dicts; any failure is one line naming ``option``."""
    try:
        import datasets

        return [dict(r) for r in datasets.load_dataset(**kwargs)]
    except Exception as err:  # noqa: BLE001 - hub, network, split and format errors get the same advice
        split = kwargs.get("split", "train")
        raise DataFileError(
            f"{option}: cannot load {shown!r} split {split!r}, neither as a local {what} nor as a hub dataset ({type(err).__name__}: "
            f"{' '.join(str(err).split())[:200]}); check the name and the split, or give a local .jsonl/.parquet file (see data_prep/)"
        ) from None


def _map_columns(loaded: LoadedRows, mapping: dict[str, str], lenient: bool) -> None:
    """Rename each row's column ``mapping[target]`` to ``target`` (in place); a row without it is an error
    ``WHERE:N: no column 'question' (the prompt_key); columns: [...]`` (skipped and reported when lenient)."""
    mapping = {target: key for target, key in mapping.items() if key != target}
    if not mapping:
        return
    rows, numbers = [], []
    for number, row in zip(loaded.numbers, loaded.rows, strict=True):
        missing = [(target, key) for target, key in mapping.items() if key not in row]
        if missing:
            target, key = missing[0]
            error = f"{loaded.where}:{number}: no column {key!r} (the {target}_key); the row has {sorted(row)}"
            if not lenient:
                raise DataFileError(error)
            loaded.bad.append(error)
            continue
        renamed = {k: v for k, v in row.items() if k not in mapping.values() and k not in mapping}
        renamed.update({target: row[key] for target, key in mapping.items()})
        rows.append(renamed)
        numbers.append(number)
    loaded.rows, loaded.numbers = rows, numbers


def load_rows(
    name_or_path: str | Path,
    *,
    split: str = "train",
    config: str | None = None,
    prompt_key: str = "prompt",
    label_key: str = "label",
    what: str = "data file",
    option: str = "--dataset",
    lenient: bool = False,
) -> LoadedRows:
    """Every row of a local file, a local folder or a hub dataset, numbered.

    - ``.jsonl``/``.json``/``.parquet`` file (any other suffix is read as JSON Lines): :func:`read_rows`
      (``lenient``: :func:`read_rows_lenient`), rows numbered by file line; ``split`` and ``config`` do not apply;
    - ``.csv`` file: the ``datasets`` csv builder; a folder: ``datasets.load_dataset(folder, config, split=split)``;
    - any other name that is not an existing path and does not look like one (:func:`looks_like_file`):
      ``datasets.load_dataset(name, config, split=split)`` from the hub.

    ``prompt_key``/``label_key`` name the columns that become ``prompt``/``label`` (the other columns are kept).
    Relative paths in the ``images`` column of a local file or folder are resolved against that file's folder
    (the folder itself for a folder dataset; :func:`resolve_image_paths`).
    Errors are :class:`DataFileError` lines naming ``PATH[:LINE]`` or, for a dataset that cannot be loaded, ``option``.
    """
    name = str(name_or_path)
    path = Path(name).expanduser()
    # a folder named like a file is a mistake, not a dataset
    if path.is_dir() and path.suffix in FILE_SUFFIXES + (".csv",):
        check_file(path, what)
    if path.is_dir():
        rows = _with_datasets(option, name, what, path=str(path), name=config, split=split)
        loaded = LoadedRows(rows, list(range(1, len(rows) + 1)), str(path), local=True)
    elif path.exists() or looks_like_file(name):
        if path.suffix == ".csv":
            check_file(path, what)
            rows = _with_datasets(option, name, what, path="csv", data_files=str(path), split="train")
            loaded = LoadedRows(rows, list(range(1, len(rows) + 1)), str(path), local=True)
        elif lenient:
            pairs, bad = read_rows_lenient(path, what)
            loaded = LoadedRows([r for _, r in pairs], [n for n, _ in pairs], str(path), local=True, bad=bad)
        else:
            pairs = read_rows(path, what)
            loaded = LoadedRows([r for _, r in pairs], [n for n, _ in pairs], str(path), local=True)
    else:
        rows = _with_datasets(option, name, what, path=name, name=config, split=split)
        loaded = LoadedRows(rows, list(range(1, len(rows) + 1)), name, local=False)
    _map_columns(loaded, {"prompt": prompt_key, "label": label_key}, lenient)
    if loaded.local:
        loaded.folder = (path if path.is_dir() else path.parent).resolve()
        resolve_image_paths(loaded.rows, loaded.folder)
    return loaded


def write_jsonl(rows: Iterable[dict[str, Any]], path: str | Path) -> int:
    """Write rows as JSON lines (UTF-8); returns the count.

    Each row also gets a ``reward_label`` column (JSON of source, label and meta) so that OpenRLHF's
    reward hook can dispatch by task when launched with ``--data.label_key reward_label``.
    """
    from adora_openrlhf.rewards.openrlhf_reward import REWARD_LABEL_KEY, with_reward_label

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            for row in rows:
                if REWARD_LABEL_KEY not in row and "source" in row and "label" in row:
                    row = with_reward_label(row)
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
                count += 1
        os.replace(tmp, path)  # a full disk or Ctrl-C never leaves a half-written output file
    finally:
        if tmp.exists():
            tmp.unlink()
    return count
