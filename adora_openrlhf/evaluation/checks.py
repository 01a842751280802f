"""The checks of ``python -m eval.run`` before any generation: the model (it loads: a Hugging Face directory
or a hub name, no damaged weight file), every row (problem ids, reward source, label and meta as the trainer
checks them), every prompt (the model can take it), and ``--out`` (its samples were made with the same model
and settings: ``eval_config.json``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from adora_openrlhf.engine.model_source import check_model_source, json_files_problem, weight_files_problem
from adora_openrlhf.evaluation.benchmarks import Benchmark, row_source
from adora_openrlhf.evaluation.fit import PromptFit, prompt_fit
from adora_openrlhf.evaluation.generation import Generator
from adora_openrlhf.evaluation.loop import SAMPLES_FILE, problem_id
from adora_openrlhf.rundir.checkpoints import model_files_problem

CONFIG_FILE = "eval_config.json"


def check_rows(bench: Benchmark, located: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
    """ValueError ``file:line: ...`` when two rows of ``bench`` share a problem id, when a row has no reward
    source (benchmark ``heldout`` grades each row by its own), when the reward cannot parse a row's label, or when
    a label is longer than ``MAX_LABEL_CHARS``, or a meta field the reward reads is wrong (the local backend's load-time checks, the label and row checks
    of the task that reads the row's source, ``adora_openrlhf/tasks/registry.py``: a K&K label against the prompt's names and
    ``meta.statements``, a math row's ``reward_style``/``answer_scope``/``grader_timeout_s``, a visual row's
    question and answer types)."""
    from adora_openrlhf.rewards.base import get_reward_fn
    from adora_openrlhf.rows import MAX_LABEL_CHARS
    from adora_openrlhf.tasks.registry import row_problem

    first: dict[str, str] = {}
    for index, (where, row) in enumerate(located):
        source = row_source(bench, row)
        if bench.source is None:
            try:
                get_reward_fn(source)
            except KeyError as err:
                what = err.args[0] if source else f"missing (--bench {bench.name} grades each row by its own source)"
                raise ValueError(f"{where}: field 'source': {what}") from None
        meta = row.get("meta") or {}
        if not isinstance(meta, dict):
            raise ValueError(f"{where}: field 'meta': expected an object, got {type(meta).__name__}")
        if len(str(row["label"])) > MAX_LABEL_CHARS:
            raise ValueError(
                f"{where}: field 'label': {len(str(row['label']))} characters, more than the {MAX_LABEL_CHARS} a ground-truth answer may have"
            )
        problem = row_problem(source, row["prompt"], str(row["label"]), meta)
        if problem is not None:
            raise ValueError(f"{where}: {problem}")
        pid = problem_id(row, index)
        if pid in first:
            raise ValueError(
                f"{where}: problem id {pid!r} of --bench {bench.name} repeats {first[pid]}; give every "
                "problem its own meta.id (otherwise their samples would be merged)"
            )
        first[pid] = where


def check_prompts(
    generator: Generator, bench: Benchmark, located: Sequence[tuple[str, Mapping[str, Any]]]
) -> PromptFit:
    """ValueError ``file:line: field ...`` for a row the model cannot take (images for a text-only model, a prompt
    the template cannot render, that encodes to nothing or to token ids the model has no embedding for); else
    what the tokenizer makes of the prompts (``evaluation/fit.py``)."""
    texts = []
    limit = getattr(generator, "vocab_limit", None)
    for where, row in located:
        if row.get("images") and not generator.accepts_images:
            raise ValueError(
                f"{where}: field 'images': the model is text-only (no vision_config); evaluate --bench {bench.name} with a vision-language model"
            )
        try:
            text = generator.prompt_text(row)
        except ValueError as err:
            raise ValueError(f"{where}: field 'prompt': {err}") from None
        images = row.get("images") or []
        slots = text.count("<|image_pad|>") if generator.accepts_images else len(images)
        if slots != len(images):  # named with the row's file:line here, before any generation
            raise ValueError(
                f"{where}: field 'images': {len(images)} image(s) for {slots} image slot(s) (<image> tags) in the prompt"
            )
        ids = generator.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"{where}: field 'prompt': encodes to no tokens")
        if limit is not None and max(ids) >= limit:
            raise ValueError(
                f"{where}: field 'prompt': encodes to token id {max(ids)}, but the model has {limit} token embeddings "
                "(its tokenizer holds more tokens than the model: they do not belong together)"
            )
        texts.append(text)
    return prompt_fit(generator.tokenizer, texts, [where for where, _ in located], [row for _, row in located])


def model_identity(model: str) -> dict[str, Any]:
    """What identifies a model for eval_config.json: a local directory's resolved path and its files' names,
    sizes and modification times (a model retrained in place is another model); a hub name as given."""
    path = Path(model)
    if not path.exists():
        return {"model": model}
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    listing = [
        f"{p.relative_to(path) if path.is_dir() else p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files
    ]
    return {"model": str(path.resolve()), "model_files": hashlib.sha256("\n".join(listing).encode()).hexdigest()[:16]}


def check_eval_config(out_dir: Path, wanted: Mapping[str, Any]) -> None:
    """ValueError when ``out_dir`` holds samples made with other settings than ``wanted`` (module docstring)."""
    saved_path, samples = out_dir / CONFIG_FILE, out_dir / SAMPLES_FILE
    if not saved_path.exists():
        if samples.exists() and samples.stat().st_size > 0:
            raise ValueError(
                f"--out: {out_dir} holds samples without {CONFIG_FILE} (unknown model and settings); use a new --out"
            )
        return
    try:
        saved = json.loads(saved_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError(f"--out: {saved_path} is not valid JSON; use a new --out") from None
    changed = [key for key in sorted(set(saved) | set(wanted)) if saved.get(key) != wanted.get(key)]
    if changed:
        details = ", ".join(f"{k}: {saved.get(k)!r} -> {wanted.get(k)!r}" for k in changed)
        raise ValueError(
            f"--out: {out_dir} holds samples generated with other settings ({details}); use a new --out for this model and these settings"
        )


def checked_model(model: str) -> bool:
    """Whether ``model`` is a local directory (else a hub name), after refusing a model that cannot load."""
    checked_dir = Path(model).is_dir()  # a local model, whatever happens to the directory later
    if checked_dir and not (Path(model) / "config.json").exists():
        raise ValueError(f"--model: {model} has no config.json; give a model directory in Hugging Face format")
    check_model_source(model, "--model")  # a hub name: in the hub cache (HF_HUB_OFFLINE=1) or on the hub
    # a truncated or damaged weight or JSON file, named before the engine loads it
    problem = weight_files_problem(model) or json_files_problem(model)
    if problem is not None:
        raise ValueError(f"--model: {model}: {problem}; re-export or re-download the model")
    problem = (
        model_files_problem(model) if checked_dir else None
    )  # a checkpoint or final_model: its manifest, as --resume
    if problem is not None:
        raise ValueError(f"--model: {model}: {problem}; these are not the files the trainer saved there")
    return checked_dir
