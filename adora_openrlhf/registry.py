"""One registry type for every name -> object table of the package (estimators, ADORA rules, exit rules,
loss aggregations, rewards, prompt templates, demonstrations, response probes, recipes).

A :class:`Registry` knows what it holds (``kind``) and which config field picks from it (``field``), so every
failed lookup reads the same and names the fix::

    <field>: unknown <kind> '<name>'; choose one of ['a', 'b']

The error, :class:`UnknownNameError`, is a :class:`~adora_openrlhf.errors.ConfigError` (one line at every
entry point) and a ``KeyError`` (what a ``dict`` lookup raised before). Registering a name twice is an error.
This module imports nothing of the package but the error type, so ``config.py`` and the algorithm modules
may both use it without an import circle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from adora_openrlhf.config_checks import choice_problem
from adora_openrlhf.errors import ConfigError

T = TypeVar("T")


class UnknownNameError(ConfigError, KeyError):
    """A name that is not registered; the message names the config field and lists the choices."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """``name -> object`` in registration order.

    ``kind``: what one entry is, for messages (``"exit rule"``); ``field``: the config field whose value is looked
    up (``"sampling.exit_rule"``); ``loader``: called once before the first lookup, to import the modules whose
    decorators fill the registry (rewards register on import of their task module).
    """

    def __init__(self, kind: str, field: str, loader: Callable[[], None] | None = None) -> None:
        self.kind = kind
        self.field = field
        self._entries: dict[str, T] = {}
        self._loader = loader

    def _load(self) -> None:
        if self._loader is not None:
            loader, self._loader = self._loader, None  # once, even when the loader registers or looks up
            try:
                loader()
            except BaseException:
                self._loader = loader  # a failed import is tried again (and raises again) on the next lookup
                raise

    def add(self, name: str, obj: T) -> T:
        """Register ``obj`` under ``name``; a name registered before raises ``ValueError``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind}: a registered name must be a non-empty string, got {name!r}")
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered; choose another name")
        self._entries[name] = obj
        return obj

    def register(self, *names: str) -> Callable[[T], T]:
        """Decorator: register the decorated object under each of ``names`` and return it unchanged."""
        if not names:
            raise ValueError(f"{self.kind}: register() needs at least one name")

        def wrap(obj: T) -> T:
            for name in names:
                self.add(name, obj)
            return obj

        return wrap

    def get(self, name: str) -> T:
        """The object registered as ``name``; :class:`UnknownNameError` (field, choices) when there is none."""
        self._load()
        try:
            return self._entries[name]
        except (KeyError, TypeError):  # TypeError: an unhashable value from a config file
            raise UnknownNameError.about(self.field, choice_problem(self.kind, name, self.names())) from None

    def check(self, name: str) -> str:
        """``name`` when registered, else :class:`UnknownNameError`; for validating a config value."""
        self.get(name)
        return name

    def names(self) -> list[str]:
        """The registered names, sorted."""
        self._load()
        return sorted(self._entries)

    def items(self) -> list[tuple[str, T]]:
        self._load()
        return list(self._entries.items())

    def values(self) -> list[T]:
        self._load()
        return list(self._entries.values())

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        self._load()
        try:
            return name in self._entries
        except TypeError:
            return False

    def __iter__(self) -> Iterator[str]:
        self._load()
        return iter(list(self._entries))

    def __len__(self) -> int:
        self._load()
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.field!r}, names={list(self._entries)})"
