"""Geometry3K (``hiyouga/geometry3k`` layout) -> the JSONL schema, images saved as PNG files.

Input rows: ``images`` (a list with the diagram), ``problem`` (text, may contain ``<image>``),
``answer`` (the value, e.g. ``"3"`` or ``"2\\sqrt{3}"``), optionally ``choices`` (four options) and
``ground_truth`` (the correct letter), ``id``.

Output rows: ``{"prompt": [user message with one <image> tag], "label": answer, "images": [png path],
"source": "geometry3k", "meta": {"question_type": "free_form", "choices", "answer_letter", "id"}}``.
OpenRLHF turns ``<image>`` into an image slot of the VLM chat template; the local backend does the same.

CLI::

    python -m data_prep.geometry3k --out data/geo3k [--dataset hiyouga/geometry3k] [--split train]
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from adora_openrlhf.data_prep.common import (
    RowError,
    answer_text,
    require_text,
    run_image_converter,
    safe_name,
    save_image,
)

SOURCE = "geometry3k"
DEFAULT_DATASET = "hiyouga/geometry3k"
IMAGE_TAG = "<image>"
VLM_INSTRUCTION = (
    "You FIRST think about the reasoning process as an internal monologue and then provide the final answer. "
    "The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST BE put in \\boxed{}."
)


def build_vlm_prompt(question: str, num_images: int = 1) -> list[dict[str, str]]:
    """One user message; ``<image>`` tags are added in front when the question has none."""
    text = question if IMAGE_TAG in question else IMAGE_TAG * num_images + question
    return [{"role": "user", "content": f"{text}\n{VLM_INSTRUCTION}"}]


def _images(raw: Mapping[str, Any], number: int) -> list[Any]:
    images = raw.get("images")
    if images is None and raw.get("image") is not None:
        images = [raw["image"]]
    if not isinstance(images, (list, tuple)) or not images:
        raise RowError(f"row {number}: field 'images': expected a non-empty list of images")
    return list(images)


def convert_geometry_row(
    raw: Mapping[str, Any], number: int, image_dir: Path, base_dir: Path | None = None
) -> dict[str, Any]:
    """One Geometry3K row -> one schema row (writes its images under ``image_dir``)."""
    if not isinstance(raw, Mapping):
        raise RowError(f"row {number}: expected a record, got {type(raw).__name__}")
    problem = require_text(raw, ("problem", "question"), number)
    try:
        label = answer_text(raw.get("answer"))
    except TypeError as err:
        raise RowError(f"row {number}: field 'answer': {err}") from None
    if not label:
        raise RowError(f"row {number}: field 'answer': missing or empty")
    images = _images(raw, number)
    if problem.count(IMAGE_TAG) not in (0, len(images)):
        raise RowError(
            f"row {number}: field 'problem': {problem.count(IMAGE_TAG)} <image> tags for {len(images)} images"
        )
    meta: dict[str, Any] = {"question_type": "free_form"}
    choices = raw.get("choices")
    if choices is not None:
        if not isinstance(choices, (list, tuple)) or not all(isinstance(c, str) for c in choices):
            raise RowError(f"row {number}: field 'choices': expected a list of strings")
        meta["choices"] = list(choices)
    letter = raw.get("ground_truth")
    if isinstance(letter, str) and len(letter.strip()) == 1 and letter.strip().isalpha():
        meta["answer_letter"] = letter.strip().upper()
        if "choices" in meta:
            index = ord(meta["answer_letter"]) - ord("A")
            if not 0 <= index < len(meta["choices"]):
                raise RowError(
                    f"row {number}: field 'ground_truth': letter {letter!r} outside the {len(meta['choices'])} choices"
                )
    row_id = raw.get("id", number)
    meta["id"] = row_id if isinstance(row_id, (int, str)) else str(row_id)
    paths = [
        save_image(img, image_dir / f"{safe_name(row_id)}_{k}.png", number, f"images[{k}]", base_dir)
        for k, img in enumerate(images)
    ]
    return {
        "prompt": build_vlm_prompt(problem, len(images)),
        "label": label,
        "images": paths,
        "source": SOURCE,
        "meta": meta,
    }


def main(argv: Sequence[str] | None = None) -> int:
    return run_image_converter(
        argv,
        prog="python -m data_prep.geometry3k",
        title="Geometry3K",
        source=SOURCE,
        default_dataset=DEFAULT_DATASET,
        default_split="train",
        split_help="train | validation | test",
        convert_row=convert_geometry_row,
    )


if __name__ == "__main__":
    sys.exit(main())
