"""``python -m adora_openrlhf.train --recipe NAME [--config FILE] [--backend local|openrlhf] [--a.b VALUE ...]``.

Builds the run's :class:`RunConfig` from the recipe, the config file and the dotted overrides (later ones
win), then hands it to a backend:

- ``local`` (default for the CPU recipes: ``kk-testbed``, the default recipe, ``kk-tiny``, ``geo-tiny``): the embedded single-process trainer;
- ``openrlhf``: builds OpenRLHF's argument namespace and launches its Ray PPO/GRPO entry with our classes;
  flags this parser does not know are passed through to OpenRLHF unchanged.

With the local backend, stdout holds the run's JSON summary and nothing else (``> summary.json`` works):
everything else, libraries' prints included, goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adora_openrlhf.cli_args import add_config_flags, format_config, load_config_file, overrides_from_args, parse_value
from adora_openrlhf.cli_errors import OneLineParser, add_debug_flag, command_name, run_cli, stdout_to_stderr
from adora_openrlhf.config import BACKENDS, ConfigError, RunConfig
from adora_openrlhf.plugins import import_plugins
from adora_openrlhf.recipes import RECIPES, build_run_config, get_recipe


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=command_name("python -m adora_openrlhf.train"),
        description="GRPO/PPO with ADORA advantage reweighting and adaptive multi-round sampling.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--recipe",
        default=None,
        help=f"named preset (default: the --config file's recipe, else kk-testbed); one of {sorted(RECIPES)}",
    )
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="YAML or JSON config (e.g. saved --print-config output) applied over the recipe; flags win over it",
    )
    parser.add_argument(
        "--backend", default=None, choices=BACKENDS, help="engine (default: the recipe's first backend)"
    )
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in output_dir")
    parser.add_argument(
        "--resume-from",
        default=None,
        metavar="CHECKPOINT",
        help="local backend: continue from this checkpoint of output_dir instead of the latest (a step number, step_000002, or its path); "
        "implies --resume, and the later checkpoints are moved to checkpoints/superseded/",
    )
    parser.add_argument(
        "--resume-changes",
        default="",
        metavar="OPTION[,OPTION]",
        help="local backend: options the resumed run changes on purpose, from "
        "train.lr and train.max_grad_norm (e.g. after a divergence: --resume-changes train.lr --train.lr 1e-6)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start a new run in an output_dir that holds a previous run's checkpoints, replacing it",
    )
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument(
        "--print-args", action="store_true", help="openrlhf backend: print the OpenRLHF command line and exit"
    )
    add_debug_flag(parser)
    add_config_flags(parser)
    return parser


def _resume_hint(argv: Sequence[str], output_dir: str) -> str:
    """How to continue an interrupted run: the same command with --resume (names the last checkpoint)."""
    from adora_openrlhf.rundir.checkpoints import list_checkpoints

    found = list_checkpoints(output_dir)
    if not found:
        return f"no checkpoint was written in {output_dir}; start the run again"
    args, skip = [], False
    for a in argv:
        if skip or a in ("--resume", "--overwrite") or a.startswith("--resume-from="):
            skip = False
            continue
        if a == "--resume-from":
            skip = True  # and its value
            continue
        args.append(a)
    return f"continue from step {found[-1][0]} with: python -m adora_openrlhf.train {' '.join(args)} --resume".replace(
        "  ", " "
    )


def train_local(
    cfg: RunConfig,
    resume: bool = False,
    overwrite: bool = False,
    resume_from: str | None = None,
    resume_changes: Sequence[str] = (),
) -> dict[str, Any]:
    """Train ``cfg`` in this process on the local backend, as the command does; returns the run's summary (also
    written to ``output_dir/summary.json``). The entry point of ``bench/`` and of notebooks."""
    from adora_openrlhf.backends.local.trainer import train

    return train(cfg, resume=resume, overwrite=overwrite, resume_from=resume_from, resume_changes=resume_changes)


def warm_start(cfg: RunConfig, out_dir: str | Path) -> Path:
    """Run ``cfg``'s supervised warm-up alone on the local backend and save the policy under ``out_dir``
    (Hugging Face format), for ``--model.path``: the shared starting point of a benchmark's variants."""
    from adora_openrlhf.backends.local.trainer import warm_start as run_warm_start

    return run_warm_start(cfg, out_dir)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    state: dict[str, str] = {}
    return run_cli(
        lambda: _main(argv, state),
        argv,
        interrupted_hint=lambda: _resume_hint(argv, state["output_dir"]) if "output_dir" in state else "",
    )


def _import_named_plugins(argv: Sequence[str]) -> None:
    """Import the ``--plugins`` of the command line before its flags are read: a plug-in task's options section
    (``data.<section>.<field>``) is then a flag like any other. (A ``--config`` file's plugins are imported when
    the file is read.)"""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--plugins", default=None)
    known, _ = pre.parse_known_args(argv)
    if known.plugins is not None:
        import_plugins(parse_value("plugins", list[str], known.plugins))


def _main(argv: Sequence[str], state: dict[str, str]) -> int:
    _import_named_plugins(argv)  # a ConfigError: one line from run_cli (exit 2), the traceback with --debug
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    try:
        from_file = load_config_file(args.config) if args.config is not None else {}
        args.recipe = args.recipe or from_file.get("recipe") or "kk-testbed"
        recipe = get_recipe(args.recipe)
        overrides = {**from_file, "recipe": args.recipe, **overrides_from_args(args)}  # recipe < file < flags
        if args.backend is not None:
            overrides["backend"] = args.backend
        cfg = build_run_config(args.recipe, overrides)
        if cfg.backend not in recipe.backends:
            raise ConfigError(
                f"backend: recipe {recipe.name!r} runs on {list(recipe.backends)}, not {cfg.backend!r}"
                + (f" ({recipe.needs_gpu_reason})" if recipe.needs_gpu_reason else "")
                + f"; pick a recipe for {cfg.backend!r} from {sorted(n for n, r in RECIPES.items() if cfg.backend in r.backends)}"
            )
        if cfg.backend == "local" and unknown:
            raise ConfigError(
                f"unknown flag(s) {unknown}; run with --help for the list (OpenRLHF flags need --backend openrlhf)"
            )
        if cfg.backend != "local" and args.resume_from is not None:
            raise ConfigError("--resume-from: only the local backend resumes from a chosen checkpoint; use --resume")
        args.resume_changes = [name.strip() for name in args.resume_changes.split(",") if name.strip()]
        if cfg.backend != "local" and args.resume_changes:
            raise ConfigError("--resume-changes: only the local backend changes options on resume")
    except ConfigError as err:
        if args.debug:
            raise
        parser.exit(2, f"error: {err}\n")
    if args.print_config:
        print(format_config(cfg))
        return 0
    if cfg.backend == "local":
        state["output_dir"] = cfg.output_dir
        try:
            with stdout_to_stderr():  # stdout holds the summary alone (deepspeed's import prints a warning there)
                summary = train_local(cfg, args.resume, args.overwrite, args.resume_from, args.resume_changes)
        except ConfigError as err:
            if args.debug:
                raise
            parser.exit(2, f"error: {err}\n")
        print(json.dumps(summary, indent=2))  # the run's result on stdout (also in output_dir/summary.json)
        return 0
    from adora_openrlhf.backends.openrlhf.launcher import launch

    return launch(
        cfg, passthrough=list(unknown), print_args=args.print_args, resume=args.resume, overwrite=args.overwrite
    )


if __name__ == "__main__":
    sys.exit(main())
