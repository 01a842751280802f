"""A user's own extensions, named by the setting ``plugins`` and imported on every process of a run.

A plugin is an importable module whose top level registers what it adds with the registries' decorators:
``register_estimator`` (``algorithms/advantages.py``), ``register_rule`` (``algorithms/adora.py``),
``register_exit_rule`` (``algorithms/sampling.py``), ``register_reward`` (``rewards/base.py``: a task's reward,
picked by each row's ``source``), ``register_template`` (``prompt_templates.py``) ...::

    python -m adora_openrlhf.train --recipe kk-tiny --plugins my_project.adora_plugins --advantage.estimator my_estimator

Where they are imported: :meth:`RunConfig.from_dict` imports ``plugins`` before it validates any other field (so
a plugin's names are valid choices on the command line, in recipes and in the Ray trainer actor, which rebuilds the
config from JSON); on the openrlhf backend every Ray worker has :data:`PLUGINS_ENV` set, and the reward registry
imports them before its first lookup (OpenRLHF's reward worker). The module must be importable on every node
(installed, or its folder on ``PYTHONPATH``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from adora_openrlhf.errors import ConfigError

PLUGINS_ENV = "ADORA_PLUGINS"  # comma-separated module names, in the environment of every Ray worker of a run


def import_plugins(names: Sequence[str], field: str = "plugins", untrusted: Sequence[str | Path] = ()) -> None:
    """Import each named module once (Python caches them); ConfigError naming ``field[i]`` when one cannot be imported.
    ``untrusted``: folders never searched for code (a run directory someone sent): their ``sys.path`` entries (the
    current directory's ``''`` too, when it lies in one) are left out while the plugins import, and a module found
    in one all the same (imported earlier from there) is refused."""
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise ConfigError(
            f"{field}: must be a list of module names such as ['my_project.adora_plugins'], got {names!r}"
        )
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{field}[{i}]: must be a module name such as my_project.adora_plugins, got {name!r}")
        try:
            with _without_paths(untrusted):
                module = importlib.import_module(name.strip())
        except ImportError as err:
            raise ConfigError(
                f"{field}[{i}]: cannot import {name!r} ({err}); install it or put its folder on PYTHONPATH (on every node of a cluster run)"
            ) from None
        except ConfigError as err:  # a registration the plugin makes is refused (a name taken, ...)
            raise ConfigError(f"{field}[{i}]: plugin module {name!r} failed while it was imported: {err}") from None
        except SystemExit as err:  # sys.exit() at the plugin's top level would end the run with no message
            raise ConfigError(
                f"{field}[{i}]: plugin module {name!r} called sys.exit({err.code!r}) while it was imported; "
                "a plugin's import must only register what it adds"
            ) from None
        except Exception as err:  # noqa: BLE001 - the plugin's own code raised: name the module and where
            where = _raising_line(err, name.strip())
            raise ConfigError(
                f"{field}[{i}]: plugin module {name!r} raised {type(err).__name__} while it was imported{where}: "
                f"{' '.join(str(err).split())[:200]}; fix the module (its import must not fail)"
            ) from None
        _refuse_if_inside(module, untrusted, f"{field}[{i}]")


def _inside(path: str | Path, folders: Sequence[Path]) -> bool:
    resolved = Path(path or os.getcwd()).resolve()
    return any(resolved == folder or folder in resolved.parents for folder in folders)


@contextlib.contextmanager
def _without_paths(untrusted: Sequence[str | Path]) -> Iterator[None]:
    """``sys.path`` without the entries inside ``untrusted`` folders while the block runs."""
    folders = [Path(folder).resolve() for folder in untrusted]
    saved = list(sys.path)
    if folders:
        sys.path[:] = [entry for entry in saved if not _inside(entry, folders)]
    try:
        yield
    finally:
        if folders:
            sys.path[:] = saved + [entry for entry in sys.path if entry not in saved]


def _refuse_if_inside(module: object, untrusted: Sequence[str | Path], where: str) -> None:
    origin = getattr(module, "__file__", None)
    folders = [Path(folder).resolve() for folder in untrusted]
    if origin and folders and _inside(origin, folders):
        raise ConfigError(
            f"{where}: module {getattr(module, '__name__', '?')!r} comes from {origin}, inside {folders[0]}, a folder "
            "whose files are never run; install the plugin or put it on PYTHONPATH outside that folder"
        )


def _raising_line(err: BaseException, module: str) -> str:
    """`` (FILE:LINE)`` of the innermost traceback frame inside the plugin's own file, or ''."""
    spec = importlib.util.find_spec(module) if module else None
    origin = getattr(spec, "origin", None)
    frames = [f for f in traceback.extract_tb(err.__traceback__) if origin and f.filename == origin]
    return f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def plugins_from_env(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The module names of :data:`PLUGINS_ENV` (empty when unset)."""
    return [name.strip() for name in environ.get(PLUGINS_ENV, "").split(",") if name.strip()]


def import_plugins_from_env(environ: Mapping[str, str] = os.environ) -> None:
    """Import the plugins a run named in :data:`PLUGINS_ENV` (Ray workers of the openrlhf backend)."""
    import_plugins(plugins_from_env(environ), PLUGINS_ENV)
