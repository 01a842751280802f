"""Shared pieces of the dataset converters: loading through ``datasets``, row errors, JSONL output, summaries.

Every converter maps a public dataset's rows into the one JSONL schema
``{"prompt", "label", "images" (VLM only), "source", "meta"}`` (plus ``reward_label`` in the files, for
OpenRLHF); a malformed input row is skipped with a message naming it and the field (``FILE:LINE: field ...``
for a local file, lines counted from 1; ``row N`` for a hub dataset), and the CLI prints a summary line. A line
that is not JSON, not UTF-8 or not an object is skipped and counted the same way; a missing, empty or
unreadable input file, or a conversion that leaves no row, is an error (exit status 2) and writes nothing.
Output files are written atomically (a temporary file renamed when complete).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adora_openrlhf.datafiles import write_jsonl

logger = logging.getLogger(__name__)
LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


class RowError(ValueError):
    """A malformed input row; the message names the row number and the field."""


@dataclass
class NumberedRows:
    """Input rows with their numbers (1-based file lines for a local JSONL file, positions otherwise), the
    ``FILE:LINE: reason`` of each unreadable line, and the location prefix of messages (the file, or None)."""

    rows: list[Any]
    numbers: list[int]
    bad: list[str] = field(default_factory=list)
    where: str | None = None


def load_numbered(name_or_path: str, split: str, config: str | None = None) -> NumberedRows:
    """Rows of a hub dataset (``"HuggingFaceH4/MATH-500"``), a local folder or a local file, with their numbers
    (:func:`adora_openrlhf.datafiles.load_rows`); local ``.jsonl``/``.json`` files are read line by line, bad lines
    skipped and reported. Local files hold one split, so ``split`` is ignored for them."""
    from adora_openrlhf.datafiles import load_rows as load_row_source

    path = Path(name_or_path)
    if path.is_file() and path.suffix not in LOCAL_FORMATS:
        raise ValueError(f"--dataset: unsupported file type {path.suffix!r}; use one of {sorted(LOCAL_FORMATS)}")
    loaded = load_row_source(
        name_or_path, split=split, config=config, what="--dataset file", option="--dataset", lenient=True
    )
    return NumberedRows(loaded.rows, loaded.numbers, loaded.bad, loaded.where if path.is_file() else None)


def load_split_rows(name_or_path: str, split: str, config: str | None = None) -> list[dict[str, Any]]:
    """The rows of :func:`load_numbered`, without their numbers."""
    return load_numbered(name_or_path, split, config).rows


def first_field(row: Mapping[str, Any], names: Sequence[str]) -> tuple[str | None, Any]:
    """The first of ``names`` present in ``row`` with a non-empty value, as (name, value)."""
    for name in names:
        value = row.get(name)
        if value is not None and not (isinstance(value, str) and not value.strip()):
            return name, value
    return None, None


def require_text(row: Mapping[str, Any], names: Sequence[str], number: int) -> str:
    """A non-empty string field (first of ``names``); RowError naming the row and the fields otherwise."""
    name, value = first_field(row, names)
    if name is None:
        raise RowError(f"row {number}: field {names[0]!r}: missing or empty (looked for {list(names)})")
    if not isinstance(value, str):
        raise RowError(f"row {number}: field {name!r}: expected text, got {type(value).__name__}")
    return value.strip()


def answer_text(value: Any) -> str:
    """An answer value as text: 27.0 -> "27", 3 -> "3", " 1/2 " -> "1/2"."""
    if isinstance(value, bool):
        raise TypeError("a boolean is not an answer")
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return value.strip()
    raise TypeError(f"expected text or a number, got {type(value).__name__}")


def last_boxed(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced; None if none."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        return None
    start, depth, i = starts[-1], 1, starts[-1]
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[start : i - 1].strip() if depth == 0 else None


@dataclass
class ConversionReport:
    """What a conversion did: rows written, rows rejected with their messages, duplicates dropped."""

    written: int = 0
    rejected: list[str] = field(default_factory=list)
    duplicates: int = 0

    def summary(self, name: str, out: Path) -> str:
        return f"{name}: wrote {self.written} rows to {out}; rejected {len(self.rejected)} malformed rows; dropped {self.duplicates} duplicates"


def locate(message: str, where: str | None, number: int) -> str:
    """``row 7: field ...`` -> ``FILE:7: field ...`` when the rows come from file ``where``."""
    return re.sub(r"^row \d+:\s*", f"{where}:{number}: ", message) if where else message


def convert_rows(
    raw_rows: Iterable[Mapping[str, Any]],
    convert: Callable[[Mapping[str, Any], int], dict[str, Any]],
    desc: str,
    dedup_key: Callable[[dict[str, Any]], str] | None = None,
    total: int | None = None,
    progress: bool = True,
    numbered: NumberedRows | None = None,
) -> tuple[list[dict[str, Any]], ConversionReport]:
    """Apply ``convert(raw, row_number)`` to every row with a progress bar; collect rejects and duplicates.
    With ``numbered`` (from :func:`load_numbered`) its rows are converted under their file line numbers,
    its unreadable lines count as rejected, and messages name ``FILE:LINE``."""
    from tqdm.auto import tqdm

    rows: list[dict[str, Any]] = []
    report = ConversionReport()
    seen: set[str] = set()
    numbers: Iterable[int] = range(1, 1 << 62)
    where = None
    if numbered is not None:
        raw_rows, numbers, where, total = numbered.rows, numbered.numbers, numbered.where, len(numbered.rows)
        report.rejected.extend(numbered.bad)
    # numbers may be an endless count
    for number, raw in zip(
        numbers, tqdm(raw_rows, desc=desc, unit="row", total=total, disable=not progress), strict=False
    ):
        try:
            row = convert(raw, number)
        except RowError as err:
            report.rejected.append(locate(str(err), where, number))
            continue
        if dedup_key is not None:
            key = dedup_key(row)
            if key in seen:
                report.duplicates += 1
                continue
            seen.add(key)
        rows.append(row)
    report.written = len(rows)
    return rows, report


def write_converted(rows: Sequence[dict[str, Any]], report: ConversionReport, name: str, out: Path) -> int:
    """Write ``rows`` to ``out`` and log the report; a conversion that leaves no row writes nothing and raises."""
    if not rows:
        print_report(report, name, out, summary=False)
        raise ValueError(
            f"{name}: no rows to write to {out} ({len(report.rejected)} rejected as malformed, {report.duplicates} duplicates); nothing was written"
        )
    report.written = write_jsonl(rows, out)
    print_report(report, name, out)
    return report.written


def print_report(report: ConversionReport, name: str, out: Path, shown: int = 20, summary: bool = True) -> None:
    """Log the first ``shown`` rejected rows (warnings) and the summary line (info)."""
    for message in report.rejected[:shown]:
        logger.warning("rejected %s", message)
    if len(report.rejected) > shown:
        logger.warning("... and %d more rejected rows", len(report.rejected) - shown)
    if summary:
        logger.info(report.summary(name, out))


def prompt_key(row: Mapping[str, Any]) -> str:
    """A row's prompt as a string key (for de-duplication)."""
    return json.dumps(row["prompt"], sort_keys=True, ensure_ascii=False)


def save_image(value: Any, dest: Path, number: int, field: str, base_dir: Path | None = None) -> str:
    """Write one image to ``dest`` (PNG) and return its path as text.

    ``value`` may be a PIL image (what ``datasets`` decodes an ``Image`` feature to), a dict with
    ``bytes`` and/or ``path`` (an undecoded ``Image`` feature), or a path (relative paths are resolved
    against ``base_dir``). An unreadable image is a :class:`RowError` naming the row and the field.
    """
    import io

    from PIL import Image, UnidentifiedImageError

    try:
        if isinstance(value, Image.Image):
            image = value
        elif isinstance(value, Mapping) and value.get("bytes"):
            image = Image.open(io.BytesIO(value["bytes"]))
        elif isinstance(value, (Mapping, str, Path)):
            raw_path = value.get("path") if isinstance(value, Mapping) else value
            if not raw_path:
                raise RowError(f"row {number}: field {field!r}: image has neither bytes nor a path")
            path = Path(raw_path)
            if not path.is_absolute() and base_dir is not None:
                path = base_dir / path
            image = Image.open(path)
        else:
            raise RowError(f"row {number}: field {field!r}: expected an image, got {type(value).__name__}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if image.mode not in ("RGB", "RGBA", "L"):
            image = image.convert("RGB")
        image.save(dest, format="PNG")
    except (OSError, UnidentifiedImageError) as err:
        raise RowError(f"row {number}: field {field!r}: cannot read the image ({err})") from None
    return str(dest)


def safe_name(text: Any) -> str:
    """A file-name-safe version of an id."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text)).strip("._") or "x"


def run_image_converter(
    argv: Sequence[str] | None,
    *,
    prog: str,
    title: str,
    source: str,
    default_dataset: str,
    default_split: str,
    split_help: str,
    convert_row: Callable[[Mapping[str, Any], int, Path, Path | None], dict[str, Any]],
) -> int:
    """CLI of a dataset with images: load ``--dataset``/``--split``, convert every row with
    ``convert_row(raw, row_number, image_dir, base_dir)`` (images saved under OUT/images/SPLIT/), write
    OUT/SPLIT.jsonl and print the summary. Returns the exit code (2 when the dataset cannot be loaded)."""
    from adora_openrlhf.cli_errors import OneLineParser, add_debug_flag, check_output_dir, command_name, run_cli

    parser = OneLineParser(prog=command_name(prog), description=f"{title} -> JSONL schema")
    parser.add_argument("--out", required=True, help="output folder; writes <split>.jsonl and images/<split>/")
    parser.add_argument("--dataset", default=default_dataset, help="hub name, local folder, or .parquet/.jsonl file")
    parser.add_argument("--split", default=default_split, help=split_help)
    add_debug_flag(parser)

    def body() -> int:
        args = parser.parse_args(argv)
        out_dir = Path(args.out)
        check_output_dir(out_dir, "--out")
        numbered = load_numbered(args.dataset, args.split)
        base_dir = Path(args.dataset).parent if Path(args.dataset).is_file() else None
        image_dir = (out_dir / "images" / args.split).resolve()
        rows, report = convert_rows(
            numbered.rows, lambda r, n: convert_row(r, n, image_dir, base_dir), title, numbered=numbered
        )
        write_converted(rows, report, source, out_dir / f"{args.split}.jsonl")
        return 0

    return run_cli(body, argv, interrupted_hint="the output file was not written; run the command again")
