"""Dotted names over nested configs: the one walker of the config plumbing.

A run's config is nested (``{"adora": {"enabled": True}}``, a ``RunConfig`` of dataclasses, OpenRLHF's namespace
of namespaces); flags, recipes, config files, run-directory comparisons and metrics speak of it by dotted names
(``"adora.enabled"``). Every conversion between the two is here:

- :func:`flatten`: ``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; an empty mapping, or one ``is_leaf`` names, is a value;
- :func:`nest`: the inverse, ``{"a.b": 1}`` -> ``{"a": {"b": 1}}``;
- :func:`merge`: ``changes`` laid over ``base`` key by key, mappings merged recursively (copies, inputs untouched);
- :func:`overlay`: dotted overrides merged into nested values, a mapping-valued *field* replaced whole;
- :func:`value_at`: ``obj.a.b`` or ``obj["a"]["b"]`` for ``"a.b"``;
- :func:`dataclass_leaves`: ``(dotted name, dataclasses.Field, type hint)`` of every leaf field of a config class.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any


def _never(dotted: str) -> bool:
    return False


def flatten(values: Mapping[str, Any], is_leaf: Callable[[str], bool] = _never, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": v}}`` -> ``{"a.b": v}``. A non-empty mapping is walked into unless ``is_leaf(dotted name)``
    says it is a value (a dict-valued field such as ``extra``); an empty one is a value."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and not is_leaf(dotted):
            out.update(flatten(value, is_leaf, dotted + "."))
        else:
            out[dotted] = value
    return out


def nest(dotted: Mapping[str, Any]) -> dict[str, Any]:
    """``{"adora.enabled": True}`` -> ``{"adora": {"enabled": True}}``."""
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def merge(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` on top: a mapping laid over a dict is merged into it key by key, anything else
    replaces. Returns a deep copy; neither input changes."""
    out = copy.deepcopy(dict(base))
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def overlay(values: Mapping[str, Any], overrides: Mapping[str, Any], is_field: Callable[[str], bool]) -> dict[str, Any]:
    """Nested ``values`` with dotted ``overrides`` on top. A mapping given for a section is merged into it key by
    key (``{"adora": {"enabled": true}}`` keeps the other adora options); a mapping given for a name
    ``is_field`` accepts replaces that field whole (``warmup.mix={"thorough": 1.0}`` is exactly that mixture)."""
    out = merge(values, nest(overrides))
    for key, value in overrides.items():
        if isinstance(value, Mapping) and is_field(key):
            *parents, leaf = key.split(".")
            node = out
            for part in parents:
                node = node[part]
            node[leaf] = copy.deepcopy(dict(value))
    return out


def value_at(obj: Any, dotted: str) -> Any:
    """``obj.a.b`` (or ``obj["a"]["b"]`` through mappings) for ``"a.b"``; None where a part is missing."""
    for part in dotted.split("."):
        obj = obj.get(part) if isinstance(obj, Mapping) else getattr(obj, part, None)
    return obj


def dataclass_leaves(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """``(dotted name, field, resolved type hint)`` of every field of config class ``cls`` that is not itself a
    config class, walking nested config classes in field order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            yield from dataclass_leaves(hint, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f, hint
