"""Command-line flags generated from :class:`RunConfig`: every config field is a dotted flag.

``--adora.lambda_att 0.1``, ``--sampling.exit_rule pos``, ``--train.lr 1e-5``, ``--steps 20`` ... Values are
parsed by the field's type (bools accept true/false/1/0/yes/no; lists and dicts take JSON, e.g.
``--sampling.escalation '[{"temperature": 1.2}]'``; a list of strings also takes a comma list, ``--report_to tensorboard,wandb``). A few short aliases exist for the common ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from typing import Any, Iterator, Union

from adora_openrlhf.config import ConfigError, RunConfig

ALIASES = {
    "--model": "model.path",
    "--estimator": "advantage.estimator",
    "--n": "sampling.n_keep",
    "--lr": "train.lr",
    "--kl-coef": "train.kl_coef",
    "--output-dir": "output_dir",
}


def _leaf_fields(cls: type, prefix: str = "") -> Iterator[tuple[str, Any]]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            yield from _leaf_fields(hint, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", hint


def _strip_optional(hint: Any) -> Any:
    if typing.get_origin(hint) is Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def parse_value(dotted: str, hint: Any, text: str) -> Any:
    """Parse ``text`` for field ``dotted`` of type ``hint``; errors name the flag."""
    optional = typing.get_origin(hint) is Union and type(None) in typing.get_args(hint)
    base = _strip_optional(hint)
    if optional and text.lower() in ("none", "null"):
        return None
    try:
        if base is bool:
            lowered = text.lower()
            if lowered in ("true", "1", "yes", "on"):
                return True
            if lowered in ("false", "0", "no", "off"):
                return False
            raise ValueError("expected true or false")
        if base in (int, float, str):
            return base(text)
        if typing.get_origin(base) is list and typing.get_args(base) == (str,) and not text.lstrip().startswith("["):
            return [part.strip() for part in text.split(",") if part.strip()]  # a comma list: --report_to tensorboard,wandb
        if typing.get_origin(base) in (list, dict):
            value = json.loads(text)
            expected = typing.get_origin(base)
            if expected is list and isinstance(value, (int, float, str)):
                value = [value]
            if not isinstance(value, expected):
                raise ValueError(f"expected a JSON {expected.__name__}")
            return value
    except (ValueError, json.JSONDecodeError) as err:
        raise ConfigError(f"--{dotted}: cannot parse {text!r} ({err})") from None
    return text


LEAF_TYPES: dict[str, Any] = dict(_leaf_fields(RunConfig))


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Add one ``--a.b`` flag per RunConfig leaf (raw strings; parsed later by :func:`overrides_from_args`)."""
    group = parser.add_argument_group("config overrides (every RunConfig field)")
    for dotted in LEAF_TYPES:
        if dotted in ("recipe", "backend"):
            continue
        flags = [f"--{dotted}"] + [alias for alias, target in ALIASES.items() if target == dotted]
        group.add_argument(*flags, dest=f"cfg:{dotted}", default=None, metavar="VALUE")


def overrides_from_args(namespace: argparse.Namespace) -> dict[str, Any]:
    """Dotted overrides from the parsed flags that were given."""
    out = {}
    for key, text in vars(namespace).items():
        if key.startswith("cfg:") and text is not None:
            dotted = key[4:]
            out[dotted] = parse_value(dotted, LEAF_TYPES[dotted], text)
    return out


def format_config(cfg: RunConfig) -> str:
    """Pretty JSON of a RunConfig for printing at start."""
    return json.dumps(cfg.to_dict(), indent=2, sort_keys=False, default=str)

