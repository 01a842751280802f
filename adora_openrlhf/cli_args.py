"""Command-line flags generated from :class:`RunConfig`: every config field is a dotted flag.

``--adora.lambda_att 0.1``, ``--sampling.exit_rule pos``, ``--train.lr 1e-5``, ``--steps 20`` ... Values are
parsed by the field's type (bools accept true/false/1/0/yes/no; lists and dicts take JSON, e.g.
``--sampling.escalation '[{"temperature": 1.2}]'``; a list of names also takes ``a,b``). A few short aliases
exist for the common ones; a list of names also takes a comma list, ``--report_to tensorboard,wandb``.
Each flag's ``--help`` text is the field's ``metadata["help"]`` and its default.

``--config FILE`` (YAML or JSON, nested like ``--print-config``'s output) sits between the recipe and the flags:
recipe < file < flags. :func:`load_config_file` turns it into dotted overrides; an unknown key is an error naming it,
and so are a duplicate key and a file that expands past a bound through YAML aliases (``config_files.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

from adora_openrlhf.config import DATA_CONFIG_LISTENERS, ConfigError, RunConfig
from adora_openrlhf.dotted import dataclass_leaves, flatten, overlay
from adora_openrlhf.plugins import import_plugins

ALIASES = {
    "--model": "model.path",
    "--estimator": "advantage.estimator",
    "--n": "sampling.n_keep",
    "--lr": "train.lr",
    "--kl-coef": "train.kl_coef",
    "--output-dir": "output_dir",
}


def _is_union(hint: Any) -> bool:
    """``Optional[int]`` (typing.Union) or ``int | None`` (types.UnionType, what the config's annotations use)."""
    return typing.get_origin(hint) in (Union, types.UnionType)


def _strip_optional(hint: Any) -> Any:
    if _is_union(hint):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def parse_value(dotted: str, hint: Any, text: str) -> Any:
    """Parse ``text`` for field ``dotted`` of type ``hint``; errors name the flag."""
    optional = _is_union(hint) and type(None) in typing.get_args(hint)
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
        if base == list[str] and not text.lstrip().startswith(("[", '"')):  # names: q_proj,v_proj or all-linear
            return [name.strip() for name in text.split(",") if name.strip()]
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


# every RunConfig field by dotted name; updated in place when a plug-in task adds its options section
LEAF_TYPES: dict[str, Any] = {}
LEAF_FIELDS: dict[str, dataclasses.Field] = {}


def _refresh_leaves() -> None:
    leaves = list(dataclass_leaves(RunConfig))
    LEAF_TYPES.clear()
    LEAF_TYPES.update((name, hint) for name, _, hint in leaves)
    LEAF_FIELDS.clear()
    LEAF_FIELDS.update((name, f) for name, f, _ in leaves)


_refresh_leaves()
DATA_CONFIG_LISTENERS.append(_refresh_leaves)


def field_help(dotted: str) -> str:
    """The ``metadata["help"]`` of config field ``dotted`` ("" when it has none)."""
    return str(LEAF_FIELDS[dotted].metadata.get("help", ""))


def field_default(dotted: str) -> Any:
    """The default value of config field ``dotted`` (a fresh copy for list/dict fields)."""
    f = LEAF_FIELDS[dotted]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default  # type: ignore[misc]


def _flag_help(dotted: str) -> str:
    default = field_default(dotted)
    shown = json.dumps(default) if isinstance(default, (list, dict, bool)) or default is None else str(default)
    return f"{field_help(dotted)} (default: {shown})".replace("%", "%%")  # argparse formats help with %


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Add one ``--a.b`` flag per RunConfig leaf (raw strings; parsed later by :func:`overrides_from_args`),
    with the field's help text and default."""
    group = parser.add_argument_group("config overrides (every RunConfig field; recipe < --config FILE < these flags)")
    for dotted in LEAF_TYPES:
        if dotted in ("recipe", "backend"):
            continue
        flags = [f"--{dotted}"] + [alias for alias, target in ALIASES.items() if target == dotted]
        group.add_argument(*flags, dest=f"cfg:{dotted}", default=None, metavar="VALUE", help=_flag_help(dotted))


def _is_section(dotted: str) -> bool:
    return any(leaf.startswith(dotted + ".") for leaf in LEAF_TYPES)


def _file_overrides(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Dotted overrides of a nested config file's ``values``: each key a RunConfig field, each section a mapping."""
    out: dict[str, Any] = {}
    for dotted, value in flatten(values, is_leaf=lambda name: not _is_section(name)).items():
        if dotted in LEAF_TYPES:
            # YAML 1.1 reads 1e-5 as a string
            if _strip_optional(LEAF_TYPES[dotted]) is float and isinstance(value, str):
                value = parse_value(dotted, LEAF_TYPES[dotted], value)
            out[dotted] = value
        elif _is_section(dotted):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where}: {dotted} must be a mapping of its options, got {value!r}")
        else:
            parent = dotted.rpartition(".")[0]
            prefix = f"{parent}." if parent else ""
            siblings = sorted({leaf[len(prefix) :].split(".")[0] for leaf in LEAF_TYPES if leaf.startswith(prefix)})
            raise ConfigError(
                f"{where}: unknown key {dotted!r}; valid keys{' under ' + repr(parent) if parent else ''}: {siblings}"
            )
    return out


def load_config_file(path: str) -> dict[str, Any]:
    """Dotted overrides from a YAML or JSON config file (nested like ``--print-config``'s output); errors name
    the file and the key."""
    from adora_openrlhf.config_files import MAX_FILE_BYTES, read_config_text

    file = Path(path)
    if not file.is_file():
        raise ConfigError(
            f"--config: {path} is not a file; give a YAML or JSON config (e.g. saved from --print-config)"
        )
    if file.stat().st_size > MAX_FILE_BYTES:
        raise ConfigError(
            f"{path}: larger than {MAX_FILE_BYTES // 1024} KiB; a config file holds options (as printed by --print-config), not data"
        )
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not valid YAML or JSON ({err})") from None
    values = read_config_text(text, path)  # JSON is YAML; bounded expansion, no duplicate keys
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise ConfigError(
            f"{path}: a config file holds a mapping of options (as printed by --print-config), got {type(values).__name__}"
        )
    if "plugins" in values:  # first: a plug-in task's options section is then a key like any other
        import_plugins(values["plugins"], f"{path}: plugins")
    return _file_overrides(values, path)


def apply_overrides(values: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with dotted ``overrides`` on top (:func:`adora_openrlhf.dotted.overlay`): a mapping given for a
    section is merged into it key by key, one given for a mapping-valued field (``warmup.mix``) replaces it whole."""
    return overlay(values, overrides, is_field=LEAF_TYPES.__contains__)


def overrides_from_args(namespace: argparse.Namespace) -> dict[str, Any]:
    """Dotted overrides from the parsed flags that were given."""
    out = {}
    for key, text in vars(namespace).items():
        if text is None or ":" not in key:
            continue
        kind, dotted = key.split(":", 1)
        if kind == "cfg":
            out[dotted] = parse_value(dotted, LEAF_TYPES[dotted], text)
    return out


def format_config(cfg: RunConfig) -> str:
    """Pretty JSON of a RunConfig for printing at start."""
    return json.dumps(cfg.to_dict(), indent=2, sort_keys=False, default=str)
