"""``python -m adora_openrlhf.train --backend openrlhf --recipe NAME [OpenRLHF flags...]``.

Steps: build the OpenRLHF command line from the RunConfig, the recipe's cluster flags and the pass-through
flags (:mod:`.flags`); parse and check it with OpenRLHF's own parser (:func:`.entry.parse_openrlhf_args`);
copy the shared fields back into the RunConfig and attach it to the namespace; then either print
everything (``--print-args``, a dry run that needs no GPU package) or run OpenRLHF's ``train(args)`` with
our trainer actor (:func:`.entry.run_openrlhf_train`). Submit it to a Ray cluster with the scripts in
``recipes/``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adora_openrlhf.backends.local.rundir import RunDirLock
from adora_openrlhf.backends.openrlhf.entry import ENTRY_MODULE, parse_openrlhf_args, run_openrlhf_train
from adora_openrlhf.backends.openrlhf.flags import attach_run_config, build_argv, namespace_to_dict, reconcile, signal_description
from adora_openrlhf.config import ConfigError, RunConfig

# what a launch and OpenRLHF write into output_dir besides the final model's files
RUN_ARTEFACTS = ("checkpoints", "tensorboard", "run_config.json", "openrlhf_command.txt")


def prepare(cfg: RunConfig, passthrough: Sequence[str] = (), resume: bool = False) -> tuple[list[str], Any, RunConfig]:
    """(OpenRLHF argv, checked OpenRLHF namespace carrying the config, reconciled RunConfig)."""
    argv = build_argv(cfg, passthrough, resume)
    args = parse_openrlhf_args(argv)
    cfg = reconcile(cfg, args)
    attach_run_config(args, cfg)
    return argv, args, cfg


def ray_env_vars(cfg: RunConfig) -> dict[str, str]:
    """``env_vars`` of the Ray job's runtime env: OpenRLHF 0.11's own (the values its ``train()`` would set,
    from the environment or its defaults) plus what the reward file reads in every rollout worker, the run's
    K&K answer parser (``data.kk_parser``; ``rewards/kk.py`` reads ``ADORA_KK_PARSER`` when a row names none).
    The launcher starts Ray with them, so OpenRLHF's ``train()`` finds Ray initialised and keeps them."""
    from adora_openrlhf.rewards.kk import KK_PARSER_ENV

    return {
        "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "true"),
        "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN"),
        "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": os.environ.get("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1"),
        KK_PARSER_ENV: cfg.data.kk_parser,
    }


def dry_run_report(argv: list[str], args: Any, cfg: RunConfig) -> dict[str, Any]:
    """What ``--print-args`` prints: the command line, OpenRLHF's resolved namespace and our config."""
    resolved = namespace_to_dict(args)
    resolved.pop("adora_run_config", None)
    return {
        "command": f"python -m {ENTRY_MODULE} " + " ".join(shlex.quote(token) for token in argv),
        "openrlhf_argv": argv,
        "openrlhf_args": resolved,
        "run_config": cfg.to_dict(),
        "signals": signal_description(cfg),
        "ray_env_vars": ray_env_vars(cfg),
    }


def launch(cfg: RunConfig, passthrough: list[str], print_args: bool = False, resume: bool = False, overwrite: bool = False) -> int:
    """Build, check and (unless ``print_args``) run the OpenRLHF training; returns the exit status. The run holds
    the local backend's lock on ``output_dir`` (rundir.RunDirLock) while it runs, so that a second launch into
    the same directory is refused, and a directory holding a previous run needs ``--resume`` or ``--overwrite``."""
    try:
        argv, args, cfg = prepare(cfg, passthrough, resume)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except SystemExit as exit_:  # OpenRLHF's argparse already printed its usage and message
        return int(exit_.code) if isinstance(exit_.code, int) else 2
    if print_args:
        print(json.dumps(dry_run_report(argv, args, cfg), indent=2, default=str))
        return 0
    try:
        from adora_openrlhf.backends.openrlhf.trainer import RemoteAdoraPPOTrainer
    except ImportError as err:  # vllm / flash-attn / deepspeed: GPU nodes only
        print(
            f"error: the cluster run needs OpenRLHF's GPU stack ({err}); install requirements/cluster.txt on the "
            "GPU nodes, or use --print-args for a dry run on this machine",
            file=sys.stderr,
        )
        return 2
    out_dir = Path(cfg.output_dir)
    try:
        check_previous_run(out_dir, resume, overwrite)  # read-only: nothing is written before it passes
        with RunDirLock(out_dir):
            if overwrite:
                clear_previous_run(out_dir)
            (out_dir / "run_config.json").write_text(json.dumps(cfg.to_dict(), indent=2), encoding="utf-8")
            (out_dir / "openrlhf_command.txt").write_text(dry_run_report(argv, args, cfg)["command"] + "\n", encoding="utf-8")
            import ray

            if not ray.is_initialized():  # a job-level runtime env (ray job submit) is merged with these env_vars
                ray.init(runtime_env={"env_vars": ray_env_vars(cfg)})
            run_openrlhf_train(args, RemoteAdoraPPOTrainer)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def previous_run_artefacts(out_dir: Path) -> list[str]:
    """The names in RUN_ARTEFACTS that ``out_dir`` holds: what a launch into it would mix with or replace."""
    return [name for name in RUN_ARTEFACTS if (out_dir / name).exists()]


def _has_checkpoint(out_dir: Path) -> bool:
    ckpts = out_dir / "checkpoints"
    return ckpts.is_dir() and any(ckpts.iterdir())


def check_previous_run(out_dir: Path, resume: bool, overwrite: bool) -> None:
    """Read-only checks before a cluster run touches ``output_dir`` (the local backend's rules, rundir.py):
    ``--resume`` needs a checkpoint under ``output_dir/checkpoints`` (OpenRLHF would silently start afresh);
    without it, a directory holding a previous launch's artefacts is refused unless ``--overwrite`` (OpenRLHF
    would mix the TensorBoard logs and rotate the old run's checkpoints away)."""
    from adora_openrlhf.cli_errors import check_output_dir

    if resume and overwrite:
        raise ConfigError("--overwrite: cannot be combined with --resume (one continues the run, the other replaces it)")
    check_output_dir(out_dir, "output_dir")
    if resume:
        if not _has_checkpoint(out_dir):
            raise ConfigError(f"--resume: no checkpoint under {str(out_dir / 'checkpoints')!r}; start the run without --resume")
        return
    found = previous_run_artefacts(out_dir)
    if found and not overwrite:
        raise ConfigError(
            f"output_dir: {str(out_dir)!r} holds a previous run ({', '.join(found)}); continue it with --resume, "
            "replace it with --overwrite, or choose another --output-dir"
        )


def clear_previous_run(out_dir: Path) -> None:
    """``--overwrite``: remove a previous launch's artefacts (only the names in RUN_ARTEFACTS, never other files;
    the final model files OpenRLHF saves into ``output_dir`` are overwritten by the new run's)."""
    for name in previous_run_artefacts(out_dir):
        target = out_dir / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()
