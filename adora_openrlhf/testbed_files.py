"""The kk-testbed's inputs as files, for runs that read files (the openrlhf backend; ``python -m adora_openrlhf.smoke``
on a machine without a GPU, where there is no hub to download a model from).

- :func:`write_rows_jsonl`: rows in the package's one JSONL schema (``prompt``, ``label``, ``source``, ``meta``).
- :func:`testbed_rows`: the first ``num_train`` training and ``num_eval`` held-out K&K puzzles that the local
  backend's ``kk-testbed`` recipe generates for a seed.
- :func:`save_tiny_model`: a random-init tiny Qwen2 model of the kk-testbed's shape (heads of 32 dimensions, the
  smallest vLLM's CPU attention takes) with a byte-level BPE tokenizer trained on the rows' prompts and the compact
  chat template, saved with ``save_pretrained``: a checkpoint folder any ``--model`` accepts.
- :func:`warm_start_dir`: a recipe's supervised warm-up run once per seed and saved (the benchmarks' shared start).
- ``python -m adora_openrlhf.testbed_files --seeds 0 --out DIR`` (:func:`prepare`): per seed the kk-testbed warm start
  and its puzzles as ``train.jsonl`` / ``test.jsonl``, the inputs of the ``kk-testbed-openrlhf`` recipe.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from adora_openrlhf.cli_errors import OneLineParser, add_debug_flag, run_cli
from adora_openrlhf.datafiles import write_jsonl
from adora_openrlhf.rows import Row

TESTBED_RECIPE = "kk-testbed"


def row_record(row: Row) -> dict[str, Any]:
    """One row as a JSONL record of the package's schema."""
    record: dict[str, Any] = {"prompt": row.prompt, "label": row.label, "source": row.source, "meta": row.meta}
    if row.images:
        record["images"] = [str(image) for image in row.images]
    return record


def write_rows_jsonl(rows: Iterable[Row], path: str | Path) -> Path:
    """Write ``rows`` to ``path`` as JSONL (:func:`row_record` per line, with the ``reward_label`` column that
    OpenRLHF's reward hook reads; ``datafiles.write_jsonl``)."""
    write_jsonl((row_record(row) for row in rows), path)
    return Path(path)


def testbed_rows(
    num_train: int | None = None, num_eval: int | None = None, seed: int = 0
) -> tuple[list[Row], list[Row]]:
    """(training rows, held-out rows): the kk-testbed recipe's puzzles of ``seed``, ``num_train`` and ``num_eval``
    of them (None: the recipe's; no held-out prompt among the training prompts)."""
    from adora_openrlhf.recipes import build_run_config
    from adora_openrlhf.rows import load_run_rows

    sizes = {"data.num_train": num_train, "data.num_eval": num_eval}
    cfg = build_run_config(TESTBED_RECIPE, {"seed": seed, **{k: v for k, v in sizes.items() if v is not None}})
    return load_run_rows(cfg.data, seed)


def save_tiny_model(path: str | Path, rows: Sequence[Row], seed: int = 0) -> Path:
    """Save a random-init tiny Qwen2 model of the kk-testbed's shape and its tokenizer (trained on the compact
    prompts of ``rows``, with the compact chat template) into ``path``; returns ``path``."""
    from adora_openrlhf.engine.model import build_tiny_model
    from adora_openrlhf.engine.tokenization import COMPACT_CHAT_TEMPLATE, train_bpe_tokenizer
    from adora_openrlhf.prompt_templates import render_prompt
    from adora_openrlhf.recipes import build_run_config

    tiny = build_run_config(TESTBED_RECIPE, {"seed": seed}).model.tiny
    tokenizer = train_bpe_tokenizer([render_prompt(r.prompt, None, "compact") for r in rows], tiny.vocab_size)
    tokenizer.chat_template = COMPACT_CHAT_TEMPLATE  # OpenRLHF's --data.apply_chat_template renders it as compact
    model = build_tiny_model(tiny, tokenizer, seed)
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def warm_start_dir(recipe: str, seed: int, overrides: Mapping[str, Any], out: Path) -> str:
    """Run the recipe's supervised warm-up once for ``seed`` and save the policy (HF format) in
    ``out/warm_start_seed<seed>``. ``warm_start.json`` beside the model records the recipe and overrides it was built
    with; a folder built with other settings is rebuilt, never silently reused."""
    from adora_openrlhf.recipes import build_run_config
    from adora_openrlhf.train import warm_start

    target = out / f"warm_start_seed{seed}"
    marker = target / "warm_start.json"
    built_with = json.loads(json.dumps({"recipe": recipe, "seed": seed, "overrides": dict(overrides)}, default=str))
    if not (target / "config.json").exists() or not marker.exists() or json.loads(marker.read_text()) != built_with:
        cfg = build_run_config(recipe, {**overrides, "seed": seed, "output_dir": str(target)})
        warm_start(cfg, target)
        marker.write_text(json.dumps(built_with, indent=2) + "\n")
    return str(target)


def prepare(seed: int, out: Path) -> dict[str, str]:
    """The kk-testbed warm start of ``seed`` and the recipe's puzzles of that seed as JSONL, under ``out``:
    ``{"model", "train", "test"}`` paths (files already there are kept)."""
    model = warm_start_dir(TESTBED_RECIPE, seed, {}, out)
    data = out / f"data_seed{seed}"
    if not (data / "test.jsonl").exists():
        train, held = testbed_rows(seed=seed)
        write_rows_jsonl(train, data / "train.jsonl")
        write_rows_jsonl(held, data / "test.jsonl")
    return {"model": model, "train": str(data / "train.jsonl"), "test": str(data / "test.jsonl")}


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m adora_openrlhf.testbed_files",
        description="Write the kk-testbed warm start and puzzles (JSONL) of each seed: the inputs of the "
        "kk-testbed-openrlhf recipe. Prints their paths as JSON.",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path, default=Path("runs/kk-testbed-inputs"), help="folder of the inputs")
    add_debug_flag(parser)

    def run() -> int:
        args = parser.parse_args(argv)
        if any(seed < 0 for seed in args.seeds):
            raise ValueError(f"--seeds: must be >= 0, got {args.seeds}")
        print(json.dumps({seed: prepare(seed, args.out) for seed in sorted(set(args.seeds))}, indent=2))
        return 0

    return run_cli(run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
