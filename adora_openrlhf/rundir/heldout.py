"""A run's held-out set and prompt settings, saved in the run directory so that the run can be evaluated again.

``output_dir/heldout.jsonl`` holds the held-out rows the trainer evaluates (the project's JSONL schema: prompt,
label, images, source, meta, in the trainer's order, with the meta the trainer grades with, e.g. K&K's
``kk_parser``); images held in memory (generated vision rows) are saved as PNG files under
``output_dir/heldout_images/`` and named relative to the run directory. ``output_dir/heldout.json`` holds what the
trainer's held-out evaluation generated with: the prompt template, the rollout's decoding parameters (its greedy
view uses ``max_new_tokens`` and ``repetition_penalty``), the generation batch size, decoding, KV cache and numerics, the number of rows and the SHA-256 of
``heldout.jsonl`` as written (``eval.run --run`` compares it, so rows edited since training are not set against
the trainer's number).

``python -m eval.run --run output_dir`` reads both (``evaluation/runs.py``); with ``--temperature 0 --k 1`` it
reproduces the trainer's ``eval/greedy_accuracy`` for the same checkpoint.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

HELDOUT_ROWS = "heldout.jsonl"
HELDOUT_SETTINGS = "heldout.json"
HELDOUT_IMAGES = "heldout_images"


def _image_refs(out: Path, index: int, images: Sequence[Any]) -> list[str]:
    """File names of a row's images: paths as given, in-memory images saved as PNG under ``heldout_images/``."""
    refs = []
    for k, image in enumerate(images):
        if isinstance(image, (str, Path)):
            refs.append(str(Path(image).resolve()))
            continue
        folder = out / HELDOUT_IMAGES
        folder.mkdir(exist_ok=True)
        name = f"{index:06d}_{k}.png"
        image.save(folder / name)
        refs.append(f"{HELDOUT_IMAGES}/{name}")
    return refs


def save_heldout(out: Path, rows: Sequence[Any], cfg: Any) -> Path:
    """Write ``heldout.jsonl`` and ``heldout.json`` (module docstring) for the held-out ``rows`` of a run of
    ``cfg`` (a ``RunConfig``) into ``out``; returns the rows file. Each file is written whole, then renamed."""
    lines = []
    for i, row in enumerate(rows):
        record = {
            "prompt": row.prompt,
            "label": row.label,
            "images": _image_refs(out, i, row.images),
            "source": row.source,
            "meta": row.meta,
        }
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    settings = {
        "rows": HELDOUT_ROWS,
        "count": len(rows),
        "task": cfg.data.task,
        "plugins": list(cfg.plugins),  # imported again by eval.run --run: a plugin task's rewards
        "prompt_template": cfg.data.prompt_template,
        "rollout": asdict(cfg.rollout),
        "generation_batch_size": cfg.model.generation_batch_size,
        "decoding": cfg.model.decoding,
        "kv_cache": cfg.model.kv_cache,
        "numerics": cfg.model.numerics,
        "eval_samples": cfg.eval_samples,
        "rows_sha256": hashlib.sha256(
            "".join(lines).encode("utf-8")
        ).hexdigest(),  # eval.run --run: rows changed since?
    }
    for name, text in ((HELDOUT_ROWS, "".join(lines)), (HELDOUT_SETTINGS, json.dumps(settings, indent=2) + "\n")):
        tmp = out / f"{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out / name)
    return out / HELDOUT_ROWS
