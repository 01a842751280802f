"""Reading row files with ``file:line: what is wrong`` errors, for every loader (trainer, ``eval.run``, ``data_prep``).

Rows are numbered by their 1-based line in the file (``.jsonl``/``.json`` lines; blank lines count but hold
no row) or, for a ``.json`` array or a ``.parquet`` table, by their 1-based position. Each row comes back as
``(number, value)``.

- :func:`read_rows` (strict): the first bad line raises :class:`DataFileError` ``PATH:LINE: reason``;
  a missing path, a directory, an empty file, bytes that are not UTF-8, a line that is not JSON or not an
  object all name the file (and line).
- :func:`read_rows_lenient`: the same reader, but a bad line is skipped and reported as
  ``PATH:LINE: reason`` in the returned list (the ``data_prep`` converters skip and count bad lines).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Optional

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


def _jsonl_lines(p: Path) -> Iterator[tuple[int, Any, Optional[str]]]:
    """(line number, value or None, error or None) for every non-blank line of a JSONL file."""
    with open(p, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                yield number, None, f"{p}:{number}: not UTF-8 text (byte {err.start + 1} of the line); re-save the file as UTF-8"
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


def _json_array(p: Path) -> Iterator[tuple[int, Any, Optional[str]]]:
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


def _parquet(p: Path) -> Iterator[tuple[int, Any, Optional[str]]]:
    try:
        import pyarrow.parquet as pq

        table = pq.read_table(p)
    except Exception as err:  # noqa: BLE001 - any pyarrow failure is an unreadable file
        raise DataFileError(f"{p}: cannot read as parquet ({type(err).__name__}: {str(err)[:160]})") from None
    for number, row in enumerate(table.to_pylist(), 1):
        yield number, row, None


def _iter_rows(path: str | Path, what: str) -> Iterator[tuple[int, Any, Optional[str]]]:
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
