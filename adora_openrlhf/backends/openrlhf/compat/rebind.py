"""Run OpenRLHF's own functions with some of the names they look up answered differently.

OpenRLHF 0.11.2 hard-codes a few things this package has to change: the trainer class its ``train(args)``
imports, the actor classes and engine factory it names, and, on a machine without CUDA, the
``torch.cuda`` calls and the NCCL helpers inside its actor methods. None of that is done by editing OpenRLHF's
files or by assigning to its modules' attributes. Instead a *copy* of the function object is made with the
same code, defaults and closure, but with its own globals: a copy of the defining module's namespace in which
the given names are replaced. The original function, its module and every other caller are untouched, and the
code that runs is OpenRLHF's.

- :func:`with_globals`: one function.
- :func:`inherit_rebound`: a class decorator giving a subclass rebound copies of every method it inherits
  from an OpenRLHF base (methods the subclass defines itself are kept). The copies are renamed into the
  subclass (``__qualname__``, ``__module__``) so that pickling (Ray ships classes and functions by reference)
  finds exactly them.

``super()`` inside a copied method still names the class that defined the original (the closure cell is
shared), which is what the original code means.
"""

from __future__ import annotations

import builtins
import types
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T", bound=type)

# one rebound namespace per (module namespace, replacements), so that every copied function of one module
# sees the same globals, as the originals do
_NAMESPACES: dict[tuple[int, tuple[tuple[str, int], ...]], dict[str, Any]] = {}


def _namespace(module_globals: dict[str, Any], names: Mapping[str, Any]) -> dict[str, Any]:
    key = (id(module_globals), tuple(sorted((name, id(value)) for name, value in names.items())))
    if key not in _NAMESPACES:
        namespace = dict(module_globals)
        namespace.update(names)
        _NAMESPACES[key] = namespace
    return _NAMESPACES[key]


def with_globals(
    fn: types.FunctionType, names: Mapping[str, Any], imports: Mapping[tuple[str, str], Any] | None = None
) -> types.FunctionType:
    """A copy of ``fn`` that sees ``names`` in place of its module's globals of the same names.

    ``imports`` answers ``from MODULE import NAME`` statements executed inside the function: a mapping
    ``{(MODULE, NAME): object}``; other imports go to the real import machinery."""
    namespace = _namespace(fn.__globals__, names)
    if imports:
        namespace = dict(namespace)
        real_import = builtins.__import__
        answers = dict(imports)

        def scoped_import(name, globals=None, locals=None, fromlist=(), level=0):
            if level == 0 and fromlist and len(fromlist) == 1 and (name, fromlist[0]) in answers:
                return types.SimpleNamespace(**{fromlist[0]: answers[(name, fromlist[0])]})
            return real_import(name, globals, locals, fromlist, level)

        namespace["__builtins__"] = {**vars(builtins), "__import__": scoped_import}
    copy = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__dict__.update(fn.__dict__)
    copy.__doc__ = fn.__doc__
    copy.__annotations__ = fn.__annotations__
    copy.__wrapped__ = fn
    return copy


def _rebound_member(member: Any, names: Mapping[str, Any]) -> Any:
    if isinstance(member, types.FunctionType):
        return with_globals(member, names)
    if isinstance(member, (staticmethod, classmethod)) and isinstance(member.__func__, types.FunctionType):
        return type(member)(with_globals(member.__func__, names))
    return None  # properties, attributes: inherited as they are


def inherit_rebound(
    names: Mapping[str, Any] | Callable[[], Mapping[str, Any]], package: str = "openrlhf"
) -> Callable[[T], T]:
    """Class decorator: the subclass gets a copy of every method it inherits from classes of ``package``,
    each seeing ``names`` (or what the callable returns, evaluated once, now) in place of its module globals.
    An empty mapping changes nothing: the subclass then simply inherits."""

    def decorate(cls: T) -> T:
        replacements = names() if callable(names) else names
        if not replacements:
            return cls
        done = set(vars(cls))
        for base in cls.__mro__[1:]:
            if not (base.__module__ or "").startswith(package):
                done.update(vars(base))  # an own class between: its methods win, as in the MRO
                continue
            for attr, member in vars(base).items():
                if attr in done or attr.startswith("__") and attr not in ("__init__",):
                    continue
                copy = _rebound_member(member, replacements)
                if copy is None:
                    continue
                done.add(attr)
                function = copy.__func__ if isinstance(copy, (staticmethod, classmethod)) else copy
                function.__qualname__ = f"{cls.__qualname__}.{attr}"
                function.__module__ = cls.__module__
                setattr(cls, attr, copy)
        return cls

    return decorate
