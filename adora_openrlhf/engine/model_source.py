"""Where a policy comes from: a local Hugging Face directory or a hub name ``owner/name``, found the way
``from_pretrained`` finds it.

A name that is not a local path is looked up on the Hugging Face hub through the local hub cache
(``HF_HUB_CACHE``, or ``HF_HOME/hub``, laid out as ``models--owner--name/snapshots/<hash>/`` with ``refs/main``);
with ``HF_HUB_OFFLINE=1`` only that cache is read. :func:`check_model_source` runs this lookup on ``config.json``
before anything is built, so "not found" (offline or not) is one error line naming the option and the fix
instead of a loader traceback. ``model.init_kwargs`` go to every ``from_pretrained`` of the model; the subset a
tokenizer or processor understands (:func:`loader_kwargs`) goes to theirs. :func:`weight_files_problem`
reads the headers of a directory's ``.safetensors`` files, so a truncated or damaged weights file is named
before a loader fails on it.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from adora_openrlhf.errors import ConfigError

# from_pretrained arguments that also select or unlock a tokenizer's / processor's files
FILE_KWARGS = ("trust_remote_code", "revision", "cache_dir", "token", "local_files_only", "subfolder")


def loader_kwargs(init_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The part of ``model.init_kwargs`` that a tokenizer, processor or config loader takes too."""
    return {k: v for k, v in (init_kwargs or {}).items() if k in FILE_KWARGS}


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` as huggingface_hub read it."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def model_file(
    source: str, filename: str, option: str = "model.path", init_kwargs: Mapping[str, Any] | None = None
) -> Path:
    """The local path of ``filename`` of model ``source`` (a directory, or a hub name resolved through the hub
    cache and, unless offline, the hub); :class:`ConfigError` naming ``option`` when it cannot be found."""
    from transformers.utils import cached_file

    if Path(source).is_dir():
        return Path(source) / filename
    if source.startswith(("/", "./", "../", "~")) or source.count("/") != 1:  # a path, not a hub name owner/name
        raise ConfigError(f"{option}: {source!r} does not exist; give a local model directory or a hub name owner/name")
    try:
        found = cached_file(
            source, filename, **{k: v for k, v in loader_kwargs(init_kwargs).items() if k != "trust_remote_code"}
        )
    except (OSError, ValueError) as err:
        found, reason = None, " ".join(str(err).split())[:160]
    else:
        reason = f"it has no {filename}"
    if found is None:
        if hub_offline():
            where = "is not a local directory and not in the Hugging Face hub cache (HF_HUB_OFFLINE=1)"
            fix = f"download it first (`hf download {source}`) or unset HF_HUB_OFFLINE"
        else:
            where = "is neither a local directory nor a model found on the Hugging Face hub"
            fix = "check the name (owner/name) and your access to it"
        raise ConfigError(f"{option}: {source!r} {where}; {fix}, or give a local model directory ({reason})")
    return Path(found)


def check_model_source(source: str, option: str = "model.path", init_kwargs: Mapping[str, Any] | None = None) -> None:
    """ConfigError naming ``option`` unless ``source`` is an existing local path or a hub model whose
    ``config.json`` can be found (in the cache when offline). An existing local path passes unread: the loader
    names what is wrong with it."""
    if not Path(source).exists():
        model_file(source, "config.json", option, init_kwargs)


def model_config_dict(source: str, init_kwargs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``config.json`` of ``source`` as a dict ({} when a local directory has none)."""
    path = model_file(source, "config.json", init_kwargs=init_kwargs)
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(
            f"{path}: not valid JSON ({type(err).__name__}: {err}); restore the model's config.json"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object (the model's config), got {type(data).__name__}")
    return data


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with one ``.safetensors`` file (None when its size is the one its header describes): the
    format is an 8-byte little-endian header length, a JSON header giving each tensor's byte range, the data."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"{path.name} is truncated ({size:,} bytes, not even a header)"
        (header_len,) = struct.unpack("<Q", head)
        if header_len > size - 8:
            return f"{path.name} is truncated ({size:,} bytes; its header alone claims {header_len:,}) or is not a safetensors file"
        try:
            header = json.loads(handle.read(header_len).decode("utf-8"))
            ends = [int(entry["data_offsets"][1]) for name, entry in header.items() if name != "__metadata__"]
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, IndexError, AttributeError):
            return f"{path.name} is not a readable safetensors file (its header is damaged)"
    expected = 8 + header_len + max(ends, default=0)
    if size < expected:
        return f"{path.name} is truncated ({size:,} of {expected:,} bytes)"
    if size > expected:
        return f"{path.name} has {size - expected:,} bytes more than its header describes (damaged)"
    return None


def weight_files_problem(directory: str | Path) -> str | None:
    """The first problem :func:`safetensors_problem` finds among the ``.safetensors`` files of a local model
    directory (or the shards its ``model.safetensors.index.json`` names that are missing); None otherwise, and
    for anything that is not a local directory."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            return f"{index.name} is not a readable index of weight shards"
        missing = [name for name in shards if not (directory / name).is_file()]
        if missing:
            return f"{missing[0]} (a shard {index.name} names) is missing"
    for file in sorted(directory.glob("*.safetensors")):
        problem = safetensors_problem(file)
        if problem is not None:
            return problem
    return None


LOADER_JSON_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "preprocessor_config.json",
)


def json_files_problem(directory: str | Path) -> str | None:
    """The first of a local model directory's :data:`LOADER_JSON_FILES` that is present but not valid JSON (a
    truncated ``tokenizer.json``), named with where parsing stopped; None otherwise, and for anything that is not a
    local directory. Loaders report such a file as a problem of the directory, or not at all."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    for name in LOADER_JSON_FILES:
        file = directory / name
        if not file.is_file():
            continue
        try:
            json.loads(file.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            return f"{name} is not UTF-8 text (damaged)"
        except ValueError as err:
            return f"{name} is not valid JSON ({err}): truncated or damaged"
    return None
