"""OpenRLHF's own training entry, ``openrlhf/cli/train_ppo_ray.py``, used as it ships.

That file defines ``train(args)`` (the Ray driver: vLLM engines, actor/reference groups, the trainer actor,
``fit``) and, under ``if __name__ == "__main__":``, its argument parser followed by the checks and
defaults it applies to the parsed namespace. Nothing here copies or edits it:

- :func:`parse_openrlhf_args` runs the statements of that ``__main__`` block up to (not including) its
  final ``train(args)`` call, read from the installed file, so every OpenRLHF flag, default and check is
  OpenRLHF's own. Only the standard-library imports of the file are needed for this, so the dry run
  (``--print-args``) works on machines without vLLM or flash-attn.
- :func:`run_openrlhf_train` calls OpenRLHF's ``train`` function object with the one name it imports for
  the trainer, ``from openrlhf.trainer.ppo_trainer import PPOTrainer``, resolved to our Ray actor class for
  that call. The resolution is private to the call (the function runs with its own copy of the module
  globals whose ``__import__`` answers that single import), so no module attribute is modified and the
  Ray worker processes see OpenRLHF unchanged. The trainer actor is created from our class (pickled by
  reference to :mod:`adora_openrlhf.backends.openrlhf.trainer`), and it builds our samples generator and
  experience maker inside its own process.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, redirect_stdout
from types import SimpleNamespace
from typing import Any

from adora_openrlhf.config import ConfigError

ENTRY_MODULE = "openrlhf.cli.train_ppo_ray"
TRAINER_MODULE = "openrlhf.trainer.ppo_trainer"
TRAINER_NAME = "PPOTrainer"
INSTALL_HINT = "pip install -r requirements/cluster.txt (GPU nodes) or see requirements/openrlhf-cpu-test.txt (CPU)"


class OpenRLHFArgsError(ConfigError):
    """OpenRLHF's own checks rejected the command line (its assertion message is kept)."""


def entry_source() -> tuple[str, str]:
    """(source text, file path) of the installed ``openrlhf/cli/train_ppo_ray.py``."""
    try:
        spec = importlib.util.find_spec(ENTRY_MODULE)
    except ModuleNotFoundError:
        spec = None
    if spec is None or not spec.origin:
        raise ConfigError(f"backend: the openrlhf package (0.11.x) is not installed; {INSTALL_HINT}")
    with open(spec.origin, encoding="utf-8") as handle:
        return handle.read(), spec.origin


def _is_main_guard(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
        and len(node.test.comparators) == 1
        and isinstance(node.test.comparators[0], ast.Constant)
        and node.test.comparators[0].value == "__main__"
    )


def _is_train_call(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) and node.value.func.id == "train"


def parser_program(source: str, filename: str) -> types.CodeType:
    """Code object: the file's standard-library imports + its ``__main__`` block minus the ``train(args)`` call."""
    tree = ast.parse(source, filename)
    guards = [node for node in tree.body if _is_main_guard(node)]
    if len(guards) != 1 or not guards[0].body or not _is_train_call(guards[0].body[-1]):
        raise ConfigError(f"backend: {filename} does not end its __main__ block with train(args) as openrlhf 0.11.x does; install openrlhf==0.11.2")
    stdlib_imports = [
        node
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        and all((alias.name if isinstance(node, ast.Import) else (node.module or "")).split(".")[0] in sys.stdlib_module_names for alias in node.names)
    ]
    module = ast.Module(body=stdlib_imports + guards[0].body[:-1], type_ignores=[])
    return compile(module, filename, "exec")


@contextmanager
def _argv(values: list[str]) -> Iterator[None]:
    saved = sys.argv
    sys.argv = values
    try:
        yield
    finally:
        sys.argv = saved


def parse_openrlhf_args(argv: Sequence[str]) -> SimpleNamespace:
    """OpenRLHF's hierarchical args namespace for ``argv``, after OpenRLHF's own checks and defaults.

    Unknown flags make OpenRLHF's argparse exit (status 2, message on stderr) as its CLI would; a failed
    OpenRLHF check raises :class:`OpenRLHFArgsError` with OpenRLHF's message.
    """
    source, filename = entry_source()
    program = parser_program(source, filename)
    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": filename}
    # OpenRLHF prints its warnings to stdout; they go to stderr so that --print-args output stays JSON
    with _argv(["openrlhf.cli.train_ppo_ray", *argv]), redirect_stdout(sys.stderr):
        try:
            exec(program, namespace)  # OpenRLHF's own parser code, from the installed package
        except AssertionError as err:
            raise OpenRLHFArgsError(f"OpenRLHF rejected the arguments: {err}") from None
    return namespace["args"]


def _trainer_import_in(train_fn: types.FunctionType) -> bool:
    """Whether ``train`` imports ``PPOTrainer`` from ``openrlhf.trainer.ppo_trainer`` (the name we resolve)."""
    import inspect

    tree = ast.parse(inspect.getsource(train_fn))
    return any(
        isinstance(node, ast.ImportFrom) and node.module == TRAINER_MODULE and any(alias.name == TRAINER_NAME and alias.asname is None for alias in node.names)
        for node in ast.walk(tree)
    )


def with_trainer(train_fn: types.FunctionType, trainer_actor_cls: Any) -> types.FunctionType:
    """A copy of ``train_fn`` whose ``from openrlhf.trainer.ppo_trainer import PPOTrainer`` gives
    ``trainer_actor_cls``; every other import, and the real module, are untouched."""
    real_import = builtins.__import__
    replacement = types.SimpleNamespace(**{TRAINER_NAME: trainer_actor_cls})

    def scoped_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name == TRAINER_MODULE and fromlist and tuple(fromlist) == (TRAINER_NAME,):
            return replacement
        return real_import(name, globals, locals, fromlist, level)

    call_globals = dict(train_fn.__globals__)
    call_globals["__builtins__"] = {**vars(builtins), "__import__": scoped_import}
    return types.FunctionType(train_fn.__code__, call_globals, train_fn.__name__, train_fn.__defaults__, train_fn.__closure__)


def run_openrlhf_train(args: SimpleNamespace, trainer_actor_cls: Any) -> None:
    """Run OpenRLHF's ``train(args)`` with ``trainer_actor_cls`` as its trainer actor (needs the GPU stack)."""
    entry = importlib.import_module(ENTRY_MODULE)
    if not _trainer_import_in(entry.train):
        raise ConfigError(
            f"backend: {ENTRY_MODULE}.train does not import {TRAINER_NAME} from {TRAINER_MODULE} as openrlhf 0.11.x does; install openrlhf==0.11.2"
        )
    with_trainer(entry.train, trainer_actor_cls)(args)
