"""Evaluation benchmarks: where their rows come from, which reward grades them, how they split into subsets.

Rows follow the project's one JSONL schema (prompt, label, images, source, meta). A benchmark's rows come
from, in this order: an explicit file (``--bench-file NAME=PATH``), ``DATA_DIR/NAME.jsonl`` (as written by
the ``data_prep`` converters), or the benchmark's own loader (the Hugging Face hub through ``datasets``, or
the K&K generator).

Subsets reported besides "all":
- ``kk``: ``ppl=N`` for each number of people, and ``ID`` (2-5 people) / ``OOD`` (6-8), the split of the
  ADORA Logic-RL table (its model was trained on puzzles of up to 5 people);
- ``mathvista``: ``ID`` = math-targeted VQA, ``OOD`` = general VQA (MathVista's ``category`` metadata;
  the ADORA report does not publish its split, so this one is ours), and one subset per task;
- ``math500``: ``level=L``;
- ``geo_synth`` (the generated shape images of ``adora_openrlhf/tasks/geo_synth.py``): ``task=T`` and ``level=L``;
- ``heldout`` (a training run's held-out set, ``--run``): each row is graded by its own ``source`` and split
  into that source's subsets.

Relative image paths of a row file resolve against the file's folder (those of a benchmark's own loader against
the working directory); every image of the rows in use must exist and decode, or loading fails before any
generation with ``file:line: field 'images[k]': ...`` (lines counted from 1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adora_openrlhf.tasks import geo_synth, kk
from adora_openrlhf.tasks.builtin import math500_subsets, mathvista_subsets

Row = dict[str, Any]


@dataclass(frozen=True)
class Benchmark:
    name: str
    source: str | None  # reward registry key used to grade the responses; None: each row's own "source"
    subsets: Callable[[Mapping[str, Any]], list[str]]  # row -> subset labels (besides "all")
    load: Callable[[int, Path], list[Row]] | None = None  # (seed, cache dir) -> rows, when no file is given


def row_source(bench: Benchmark, row: Mapping[str, Any]) -> str:
    """The reward source that grades ``row`` in ``bench``."""
    return bench.source or str(row.get("source") or "")


def resolve_images(row: Row, where: str, base_dir: Path | None) -> Row:
    """``row`` with each image path made absolute (a relative one: against ``base_dir``, or the working directory
    when None) after checking that the file exists and decodes; ValueError ``where: field 'images[k]': ...``
    otherwise."""
    images = row.get("images") or []
    if not isinstance(images, (list, tuple)):
        raise ValueError(f"{where}: field 'images': expected a list of image paths, got {type(images).__name__}")
    resolved = []
    for k, ref in enumerate(images):
        if not isinstance(ref, str):
            raise ValueError(f"{where}: field 'images[{k}]': expected a file path, got {type(ref).__name__}")
        path = Path(ref).expanduser()
        found = path if path.is_absolute() or base_dir is None else base_dir / path
        # a row file's relative paths were made absolute when it was read (adora_openrlhf/datafiles.py)
        if not found.is_file():
            looked = (
                f"looked for {str(found)!r}" if found != path else "a relative path is read from the row file's folder"
            )
            raise ValueError(f"{where}: field 'images[{k}]': no image file at {ref!r} ({looked})")
        try:
            from PIL import Image

            with Image.open(found) as image:
                image.load()
        except Exception as err:  # noqa: BLE001 - any decoder error: the file is not a usable image
            raise ValueError(
                f"{where}: field 'images[{k}]': {str(found)!r} is not a readable image ({type(err).__name__}: {err})"
            ) from None
        resolved.append(str(found.resolve()))
    return {**row, "images": resolved} if images else row


def read_located(path: str | Path) -> list[tuple[str, Row]]:
    """(``path:line``, row) for every row of a row file (``.jsonl``/``.json``/``.parquet``, or a hub dataset name; read by
    :func:`adora_openrlhf.datafiles.load_rows`); a missing, empty or non-UTF-8 file, a line that is not a JSON object
    or a row without prompt/label raises ``path:line: what is wrong``. Images are not checked here
    (:func:`load_located_rows` checks those of the rows in use)."""
    from adora_openrlhf.datafiles import load_rows as load_row_source

    loaded = load_row_source(path, what="benchmark file", option="--bench-file")
    located = []
    for number, row in zip(loaded.numbers, loaded.rows, strict=True):
        for key in ("prompt", "label"):
            if key not in row:
                raise ValueError(
                    f"{loaded.where}:{number}: row has no {key!r} field (expected the schema prompt/label/images/source/meta)"
                )
        located.append((f"{loaded.where}:{number}", row))
    return located


def read_jsonl(path: str | Path) -> list[Row]:
    """Rows of a JSONL file (errors as :func:`read_located`)."""
    return [row for _, row in read_located(path)]


def _geo_synth_generated(seed: int, cache_dir: Path) -> list[Row]:
    """200 generated shape images (``tasks/geo_synth.py``) from a seed stream of their own, saved as PNG files."""
    from adora_openrlhf.data_prep.geo_synth import write_split

    path = write_split(geo_synth.generate_rows(200, 20_000 + seed), cache_dir / "geo_synth", "eval")
    return read_jsonl(path)


def _kk_generated(seed: int, cache_dir: Path) -> list[Row]:
    # 100 puzzles per people count, 2..8, with a seed far from the training generator's default
    return [row for people in range(2, 9) for row in kk.generate_rows(100, [people], seed=10_000 + 97 * seed + people)]


def _math_hub(name: str) -> Callable[[int, Path], list[Row]]:
    """Default hub dataset of a math benchmark, converted by ``data_prep.math_eval`` into the cache dir."""

    def load(seed: int, cache_dir: Path) -> list[Row]:
        from adora_openrlhf.data_prep import math_eval

        math_eval.convert_benchmark(name, cache_dir)
        return read_jsonl(cache_dir / f"{name}.jsonl")

    return load


def _mathvista_hub(seed: int, cache_dir: Path) -> list[Row]:
    """MathVista testmini from the hub, converted by ``data_prep.mathvista`` (images saved under the cache dir)."""
    from adora_openrlhf.data_prep import mathvista

    if mathvista.main(["--out", str(cache_dir), "--split", "testmini"]) != 0:
        raise ValueError(
            "--bench mathvista: the dataset could not be loaded; convert it with data_prep.mathvista and pass --data-dir"
        )
    return read_jsonl(cache_dir / "testmini.jsonl")


def _by_row_source(row: Mapping[str, Any]) -> list[str]:
    """The subsets of the benchmark that grades the row's own source (K&K: ``ppl=N`` ...), or none."""
    source = row.get("source")
    bench = next((b for b in BENCHMARKS.values() if source and b.source == source), None)
    return bench.subsets(row) if bench is not None else []


HELDOUT = "heldout"  # a training run's held-out set (evaluation/runs.py)

BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark("kk", "kk", kk.subsets, _kk_generated),
        Benchmark("aime24", "aime24", lambda row: [], _math_hub("aime24")),
        Benchmark("aime25", "aime25", lambda row: [], _math_hub("aime25")),
        Benchmark("amc23", "amc23", lambda row: [], _math_hub("amc23")),
        Benchmark("math500", "math500", math500_subsets, _math_hub("math500")),
        Benchmark("mathvista", "mathvista", mathvista_subsets, _mathvista_hub),
        Benchmark("geo_synth", "geo_synth", geo_synth.subsets, _geo_synth_generated),
        Benchmark(HELDOUT, None, _by_row_source),
    )
}


def get_benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise ValueError(f"--bench: unknown benchmark {name!r}; choose from {sorted(BENCHMARKS)}")
    return BENCHMARKS[name]


def row_file(bench: Benchmark, explicit_file: str | None, data_dir: str | None) -> Path | None:
    """The file ``bench`` reads its rows from, or None when its loader provides them."""
    if explicit_file:
        return Path(explicit_file)
    if data_dir and (Path(data_dir) / f"{bench.name}.jsonl").exists():
        return Path(data_dir) / f"{bench.name}.jsonl"
    return None


def load_located_rows(
    bench: Benchmark, explicit_file: str | None, data_dir: str | None, seed: int, limit: int | None, cache_dir: Path
) -> list[tuple[str, Row]]:
    """(location, row) of ``bench``'s rows from the explicit file, DATA_DIR/NAME.jsonl or its loader (which may
    write converted files under ``cache_dir``), cut to ``limit``. Locations are ``file:line`` (lines counted from 1)
    or ``NAME row N``. The images of the rows kept are resolved and checked (:func:`resolve_images`)."""
    path = row_file(bench, explicit_file, data_dir)
    if path is not None:
        located, base_dir = read_located(path), path.parent
    elif bench.load is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        located, base_dir = (
            [(f"{bench.name} row {i}", row) for i, row in enumerate(bench.load(seed, cache_dir), 1)],
            None,
        )
    else:
        raise ValueError(
            f"--bench {bench.name}: no data; pass --bench-file {bench.name}=PATH or --data-dir with {bench.name}.jsonl"
        )
    located = located[:limit] if limit else located
    return [(where, resolve_images(row, where, base_dir)) for where, row in located]


def load_benchmark_rows(
    bench: Benchmark, explicit_file: str | None, data_dir: str | None, seed: int, limit: int | None, cache_dir: Path
) -> list[Row]:
    """Rows of ``bench`` (see :func:`load_located_rows`)."""
    return [row for _, row in load_located_rows(bench, explicit_file, data_dir, seed, limit, cache_dir)]
