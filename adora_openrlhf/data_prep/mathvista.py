"""MathVista (``AI4Math/MathVista``, split ``testmini``) -> the JSONL schema, images saved as PNG files.

Input rows: ``pid``, ``question``, ``decoded_image`` (or ``image`` as a path), ``choices`` (multiple
choice only), ``unit``, ``precision`` (decimals for float answers), ``answer``, ``question_type``
(``multi_choice`` | ``free_form``), ``answer_type`` (``integer`` | ``float`` | ``text`` | ``list``),
``metadata``, ``query`` (the benchmark's prompt with hint and options).

Output rows: ``{"prompt": [user message with one <image> tag], "label": answer, "images": [png path],
"source": "mathvista", "meta": {"pid", "question_type", "answer_type", "precision", "choices", "unit",
"category", "task"}}``.

CLI::

    python -m data_prep.mathvista --out data/mathvista [--dataset AI4Math/MathVista] [--split testmini]
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from adora_openrlhf.data_prep.common import RowError, require_text, run_image_converter, safe_name, save_image
from adora_openrlhf.data_prep.geometry3k import build_vlm_prompt

SOURCE = "mathvista"
DEFAULT_DATASET = "AI4Math/MathVista"
QUESTION_TYPES = ("multi_choice", "free_form")
ANSWER_TYPES = ("integer", "float", "text", "list")


def _question_text(raw: Mapping[str, Any], number: int, choices: list[str] | None) -> str:
    query = raw.get("query")
    if isinstance(query, str) and query.strip():
        return query.strip()
    question = require_text(raw, ("question",), number)
    if choices:
        options = "\n".join(f"({chr(ord('A') + k)}) {c}" for k, c in enumerate(choices))
        return f"{question}\nChoices:\n{options}"
    return question


def convert_mathvista_row(
    raw: Mapping[str, Any], number: int, image_dir: Path, base_dir: Path | None = None
) -> dict[str, Any]:
    """One MathVista row -> one schema row (writes its image under ``image_dir``)."""
    if not isinstance(raw, Mapping):
        raise RowError(f"row {number}: expected a record, got {type(raw).__name__}")
    require_text(raw, ("question",), number)
    answer = raw.get("answer")
    if not isinstance(answer, str) or not answer.strip():
        raise RowError(f"row {number}: field 'answer': missing or empty")
    question_type = raw.get("question_type")
    if question_type not in QUESTION_TYPES:
        raise RowError(
            f"row {number}: field 'question_type': expected one of {list(QUESTION_TYPES)}, got {question_type!r}"
        )
    answer_type = raw.get("answer_type")
    if answer_type not in ANSWER_TYPES:
        raise RowError(f"row {number}: field 'answer_type': expected one of {list(ANSWER_TYPES)}, got {answer_type!r}")
    choices = raw.get("choices")
    if question_type == "multi_choice":
        if not isinstance(choices, (list, tuple)) or not choices:
            raise RowError(f"row {number}: field 'choices': a multi_choice question needs its choices")
        choices = [str(c) for c in choices]
        if answer.strip() not in [c.strip() for c in choices]:
            raise RowError(f"row {number}: field 'answer': {answer!r} is not one of the choices")
    else:
        choices = None
    precision = raw.get("precision")
    if answer_type == "float" and precision is None:
        raise RowError(f"row {number}: field 'precision': a float answer needs its precision (decimals)")
    image = raw.get("decoded_image") if raw.get("decoded_image") is not None else raw.get("image")
    if image is None:
        raise RowError(f"row {number}: field 'decoded_image': missing image")
    pid = raw.get("pid", number)
    path = save_image(image, image_dir / f"{safe_name(pid)}.png", number, "decoded_image", base_dir)
    meta: dict[str, Any] = {"pid": str(pid), "question_type": question_type, "answer_type": answer_type}
    if precision is not None:
        meta["precision"] = int(precision)
    if choices:
        meta["choices"] = choices
    if raw.get("unit"):
        meta["unit"] = str(raw["unit"])
    metadata = raw.get("metadata")
    if isinstance(metadata, Mapping):
        for key in ("category", "task", "context", "grade"):
            if metadata.get(key):
                meta[key] = str(metadata[key])
    return {
        "prompt": build_vlm_prompt(_question_text(raw, number, choices)),
        "label": answer.strip(),
        "images": [path],
        "source": SOURCE,
        "meta": meta,
    }


def main(argv: Sequence[str] | None = None) -> int:
    return run_image_converter(
        argv,
        prog="python -m data_prep.mathvista",
        title="MathVista",
        source=SOURCE,
        default_dataset=DEFAULT_DATASET,
        default_split="testmini",
        split_help="testmini | test",
        convert_row=convert_mathvista_row,
    )


if __name__ == "__main__":
    sys.exit(main())
