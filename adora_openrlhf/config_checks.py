"""Declaration and validation helpers shared by every config dataclass (the run's sections live beside their
algorithms).

- :func:`option`: a config field with its help text (``--help``, HF argument parsers);
- :func:`require`: a ``ConfigError`` naming the dotted field when a condition fails;
- :func:`check_choice`: a value that must be one of a fixed set (:func:`choice_message` is the one wording, which
  :class:`~adora_openrlhf.registry.Registry` uses for registered names too);
- :func:`check_number`: a numeric field's type, finiteness and range in one call;
- :func:`check_field_types`: every field of a dataclass has its annotated type (first thing in each ``__post_init__``);
- :func:`from_dict`: a config dataclass from a mapping, nested sections included; unknown keys are an error.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, Union

from adora_openrlhf.errors import ConfigError


def option(default: Any = dataclasses.MISSING, help: str = "", *, factory: Callable[[], Any] | None = None) -> Any:
    """A config dataclass field with its help text: ``field(default=default, metadata={"help": help})``, or
    ``field(default_factory=factory, ...)`` for a mutable default (``option(factory=list, help="...")``)."""
    made = dataclasses.MISSING if factory is None else factory
    return dataclasses.field(default=default, default_factory=made, metadata={"help": help})


def require(condition: bool, field_path: str, message: str) -> None:
    """``ConfigError("field_path: message")`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError.about(field_path, message)


def choice_problem(kind: str, value: Any, choices: Any) -> str:
    """``unknown <kind> <value>; choose one of [...]``: the one wording of a value outside its choices."""
    return f"unknown {kind} {value!r}; choose one of {list(choices)}"


def choice_message(field_path: str, kind: str, value: Any, choices: Any) -> str:
    """``<field>: `` and :func:`choice_problem`."""
    return f"{field_path}: {choice_problem(kind, value, choices)}"


def check_choice(value: Any, choices: Any, field_path: str, kind: str = "value") -> None:
    """``ConfigError`` (:func:`choice_message`) unless ``value`` is one of ``choices``."""
    try:
        ok = value in choices
    except TypeError:  # an unhashable value from a config file
        ok = False
    if not ok:
        raise ConfigError.about(field_path, choice_problem(kind, value, choices))


def check_number(
    value: Any,
    field_path: str,
    *,
    integer: bool = False,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    also: tuple = (),
) -> None:
    """One check per numeric field: the type (an integer, or any real number; never a bool or a string), a finite
    value, and the range ``gt < v``, ``ge <= v``, ``v < lt``, ``v <= le``. Values in ``also`` (e.g. -1 = off) pass."""
    if any(value is a or (type(value) is type(a) and value == a) for a in also):
        return
    bounds = [
        f"> {gt}" if gt is not None else "",
        f">= {ge}" if ge is not None else "",
        f"< {lt}" if lt is not None else "",
        f"<= {le}" if le is not None else "",
    ]
    wanted = (("an integer" if integer else "a finite number") + " " + " and ".join(b for b in bounds if b)).strip()
    wanted += "".join(f" or {a}" for a in also)
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float))
    ok = ok and math.isfinite(value)
    ok = (
        ok
        and (gt is None or value > gt)
        and (ge is None or value >= ge)
        and (lt is None or value < lt)
        and (le is None or value <= le)
    )
    if not ok:
        raise ConfigError.about(field_path, f"must be {wanted}, got {value!r}")


def _kind(value: Any) -> str:
    """What a value is, in the words of a JSON/YAML file."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    return f"a {type(value).__name__}"


def _type_problem(value: Any, hint: Any) -> str | None:
    """What ``value`` should be instead, when it is not of type ``hint``; None when it is (or the hint is a number,
    which :func:`check_number` checks with its range). Elements of lists and mappings are checked too."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        problems = [_type_problem(value, arm) for arm in args if arm is not type(None)]
        if any(p is None for p in problems):
            return None
        return " or ".join(p for p in problems if p) + (" or null" if type(None) in args else "")
    if hint is Any or hint in (int, float):
        return None
    if hint is bool:
        return None if value is True or value is False else "true or false"
    if hint is str:
        return None if isinstance(value, str) else "a string"
    if origin is list:
        if not isinstance(value, list):
            return "a list"
        for i, item in enumerate(value):
            problem = _type_problem(item, args[0])
            if problem:
                return f"a list whose items are each {problem} (item {i} is {item!r})"
        return None
    if origin is dict:
        if not isinstance(value, Mapping):
            return "a mapping"
        for key, item in value.items():
            problem = "a string" if not isinstance(key, str) else _type_problem(item, args[1])
            if problem:
                return f"a mapping whose {'keys' if not isinstance(key, str) else 'values'} are each {problem} (at {key!r})"
        return None
    if dataclasses.is_dataclass(hint):
        return None if isinstance(value, hint) else "a mapping of its options"
    return None


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def clear_type_hints() -> None:
    """Forget the resolved annotations (after ``config.DataConfig`` was rebuilt with a plug-in task's section)."""
    _type_hints.cache_clear()


def check_field_types(obj: Any, section: str) -> None:
    """ConfigError naming the first field of dataclass ``obj`` (``section.field``) whose value is not of its
    annotated type, with what it should be and what it is. Numbers are left to :func:`check_number`."""
    hints = _type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        problem = _type_problem(value, hints[f.name])
        if problem:
            fix = (
                "; write true or false without quotes" if problem == "true or false" and isinstance(value, str) else ""
            )
            raise ConfigError.about(
                f"{section + '.' if section else ''}{f.name}", f"must be {problem}, got {value!r} ({_kind(value)}){fix}"
            )


T = TypeVar("T")


def from_dict(cls: type[T], values: Mapping[str, Any], path: str = "") -> T:
    """Build dataclass ``cls`` from a mapping, recursing into nested config dataclasses.

    Unknown keys raise :class:`ConfigError` listing the valid ones.
    """
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(known))
    if unknown:
        where = path or cls.__name__
        raise ConfigError(f"{where}: unknown option(s) {unknown}; valid options are {sorted(known)}")
    kwargs: dict[str, Any] = {}
    for name, value in values.items():
        default = known[name].default_factory if known[name].default_factory is not dataclasses.MISSING else None  # type: ignore[misc]
        sample = default() if callable(default) else None
        if dataclasses.is_dataclass(sample) and isinstance(value, Mapping):
            kwargs[name] = from_dict(type(sample), value, f"{path + '.' if path else ''}{name}")
        else:
            kwargs[name] = value
    return cls(**kwargs)  # type: ignore[call-arg]
