"""``python -m data_prep.geo_synth``: the generated shape images of ``adora_openrlhf.tasks.geo_synth`` as files.

PNG files under ``OUT/images/<split>/``, rows in ``OUT/<split>.jsonl``::

    python -m data_prep.geo_synth --out data/geo_synth --num-train 2000 --num-eval 200 --seed 0
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adora_openrlhf.cli_errors import command_name
from adora_openrlhf.log_setup import setup_logging
from adora_openrlhf.tasks.geo_synth import TASKS, generate_splits

logger = logging.getLogger(__name__)


def write_split(rows: Sequence[dict[str, Any]], out: Path, split: str) -> Path:
    """Save each row's images as PNG under ``out/images/<split>/`` and the rows (with the images' absolute paths,
    as the other image converters write them, so the file works from any directory and with OpenRLHF, and a
    ``reward_label`` column for OpenRLHF) to ``out/<split>.jsonl``."""
    image_dir = (out / "images" / split).resolve()
    image_dir.mkdir(parents=True, exist_ok=True)
    path = out / f"{split}.jsonl"
    with open(path, "w", encoding="utf-8") as handle:
        for i, row in enumerate(rows):
            paths = []
            for k, image in enumerate(row["images"]):
                dest = image_dir / f"{i:06d}_{k}.png"
                image.save(dest)
                paths.append(str(dest))
            record = {**row, "images": paths}
            record["reward_label"] = json.dumps({"source": row["source"], "label": row["label"], "meta": row["meta"]})
            handle.write(json.dumps(record) + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=command_name("python -m data_prep.geo_synth"), description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--num-train", type=int, default=2000)
    parser.add_argument("--num-eval", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated question kinds: {','.join(TASKS)}")
    parser.add_argument("--levels", default="1,2,3,4", help="comma-separated difficulty levels in 1..4")
    args = parser.parse_args(argv)
    setup_logging()
    try:
        tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
        levels = [int(v) for v in args.levels.split(",") if v.strip()]
        train, held = generate_splits(args.num_train, args.num_eval, args.seed, tasks, levels)
    except ValueError as err:
        parser.exit(2, f"error: {err}\n")
    out = Path(args.out)
    for split, rows in (("train", train), ("test", held)):
        logger.info("%s: %d rows -> %s", split, len(rows), write_split(rows, out, split))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
