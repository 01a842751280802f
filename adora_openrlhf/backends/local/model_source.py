"""Where a policy comes from: a local Hugging Face directory or a hub name ``owner/name``, found the way
``from_pretrained`` finds it.

A name that is not a local path is looked up on the Hugging Face hub through the local hub cache
(``HF_HUB_CACHE``, or ``HF_HOME/hub``, laid out as ``models--owner--name/snapshots/<hash>/`` with ``refs/main``);
with ``HF_HUB_OFFLINE=1`` only that cache is read. :func:`check_model_source` runs this lookup on ``config.json``
before anything is built, so "not found" (offline or not) is one error line naming the option and the fix
instead of a loader traceback. ``model.init_kwargs`` go to every ``from_pretrained`` of the model; the subset a
tokenizer or processor understands (:func:`loader_kwargs`) goes to theirs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from adora_openrlhf.config import ConfigError

# from_pretrained arguments that also select or unlock a tokenizer's / processor's files
FILE_KWARGS = ("trust_remote_code", "revision", "cache_dir", "token", "local_files_only", "subfolder")


def loader_kwargs(init_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The part of ``model.init_kwargs`` that a tokenizer, processor or config loader takes too."""
    return {k: v for k, v in (init_kwargs or {}).items() if k in FILE_KWARGS}


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` as huggingface_hub read it."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def model_file(source: str, filename: str, option: str = "model.path", init_kwargs: Mapping[str, Any] | None = None) -> Path:
    """The local path of ``filename`` of model ``source`` (a directory, or a hub name resolved through the hub
    cache and, unless offline, the hub); :class:`ConfigError` naming ``option`` when it cannot be found."""
    from transformers.utils import cached_file

    if Path(source).is_dir():
        return Path(source) / filename
    if source.startswith(("/", "./", "../", "~")) or source.count("/") != 1:  # a path, not a hub name owner/name
        raise ConfigError(f"{option}: {source!r} does not exist; give a local model directory or a hub name owner/name")
    try:
        found = cached_file(source, filename, **{k: v for k, v in loader_kwargs(init_kwargs).items() if k != "trust_remote_code"})
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
    return json.loads(path.read_text()) if path.exists() else {}
