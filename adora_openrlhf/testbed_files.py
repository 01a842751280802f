"""The kk-testbed's inputs as files, for runs that read files (the openrlhf backend; ``python -m adora_openrlhf.smoke``
on a machine without a GPU, where there is no hub to download a model from).

- :func:`write_rows_jsonl`: rows in the package's one JSONL schema (``prompt``, ``label``, ``source``, ``meta``).
- :func:`testbed_rows`: the first ``num_train`` training and ``num_eval`` held-out K&K puzzles that the local
  backend's ``kk-testbed`` recipe generates for a seed.
- :func:`save_tiny_model`: a random-init tiny Qwen2 model of the kk-testbed's shape (heads of 32 dimensions, the
  smallest vLLM's CPU attention takes) with a byte-level BPE tokenizer trained on the rows' prompts and the compact
  chat template, saved with ``save_pretrained``: a checkpoint folder any ``--model`` accepts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from adora_openrlhf.rows import Row

TESTBED_RECIPE = "kk-testbed"


def row_record(row: Row) -> dict[str, Any]:
    """One row as a JSONL record of the package's schema, with the ``reward_label`` column that OpenRLHF's reward
    hook reads (``--data.label_key reward_label``)."""
    from adora_openrlhf.rewards.openrlhf_reward import with_reward_label

    record: dict[str, Any] = {"prompt": row.prompt, "label": row.label, "source": row.source, "meta": row.meta}
    if row.images:
        record["images"] = [str(image) for image in row.images]
    return with_reward_label(record)


def write_rows_jsonl(rows: Iterable[Row], path: str | Path) -> Path:
    """Write ``rows`` as JSONL (one :func:`row_record` per line) to ``path`` (its folder made; written to a temporary
    name, then renamed, so that an interrupted write never leaves half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row_record(row), ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path


def testbed_rows(num_train: int, num_eval: int, seed: int = 0) -> tuple[list[Row], list[Row]]:
    """(training rows, held-out rows): the kk-testbed recipe's puzzles of ``seed``, ``num_train`` and ``num_eval``
    of them (no held-out prompt among the training prompts)."""
    from adora_openrlhf.recipes import build_run_config
    from adora_openrlhf.rows import load_run_rows

    cfg = build_run_config(TESTBED_RECIPE, {"seed": seed, "data.num_train": num_train, "data.num_eval": num_eval})
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
