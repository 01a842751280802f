"""``python -m adora_openrlhf.train --backend openrlhf --recipe NAME [OpenRLHF flags...]``.

Steps: check the installed openrlhf release (:func:`.entry.check_openrlhf_version`); build the OpenRLHF
command line from the RunConfig, the recipe's cluster flags and the pass-through flags (:mod:`.flags`);
parse and check it with OpenRLHF's own parser (:func:`.entry.parse_openrlhf_args`); copy the shared fields
back into the RunConfig and attach it to the namespace; then either print everything (``--print-args``, a
dry run that needs no GPU package) or run OpenRLHF's ``train(args)`` with our trainer, actor classes, strategy
and engine factory (:func:`.entry.run_openrlhf_train`). Submit it to a Ray cluster with the scripts in
``recipes/``; on a machine without a GPU it runs on the CPU (:mod:`adora_openrlhf.backends.openrlhf.cpu.launch`).

The run directory (``output_dir``) follows the local backend's rules (``rundir.py``): a lock for the whole run,
a directory holding a previous launch refused without ``--resume`` or ``--overwrite``, and every check made
before anything is written. It holds ``run_config.json``, ``openrlhf_command.txt``, ``metrics.jsonl``, the
trainer's marker (``adora_trainer.json``), OpenRLHF's ``tensorboard/`` and ``checkpoints/`` (each DeepSpeed
checkpoint folder also holds the run's config, :data:`CHECKPOINT_CONFIG`, which ``--resume`` compares) and the
final model in ``final_model/``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adora_openrlhf.backends.openrlhf.compat.entry import (
    ENTRY_MODULE,
    INSTALL_HINT,
    TrainerClasses,
    check_openrlhf_version,
    missing_engines,
    parse_openrlhf_args,
    run_openrlhf_train,
)
from adora_openrlhf.backends.openrlhf.field_flags import FINAL_MODEL_DIR
from adora_openrlhf.backends.openrlhf.flags import (
    CHECKPOINT_CONFIG,
    LAUNCH_ID_ATTR,
    MARKER_FILE,
    attach_run_config,
    build_argv,
    namespace_to_dict,
    reconcile,
    signal_description,
)
from adora_openrlhf.config import ConfigError, RunConfig
from adora_openrlhf.rundir.checks import RunDirLock, config_differences

# what a launch, our trainer and OpenRLHF write into output_dir
RUN_ARTEFACTS = (
    "checkpoints",
    "tensorboard",
    FINAL_MODEL_DIR,
    "run_config.json",
    "openrlhf_command.txt",
    "metrics.jsonl",
    MARKER_FILE,
)
# as on the local backend (report_to is fixed here)
RESUMABLE_CHANGES = (
    "steps",
    "save_every",
    "eval_every",
    "output_dir",
)


def prepare(
    cfg: RunConfig, passthrough: Sequence[str] = (), resume: bool = False, base_flags: dict[str, Any] | None = None
) -> tuple[list[str], Any, RunConfig]:
    """(OpenRLHF argv, checked OpenRLHF namespace carrying the config, reconciled RunConfig). ``base_flags`` come
    first on the command line (the CPU defaults), so the config's, the recipe's and the user's flags win."""
    check_openrlhf_version()
    argv = build_argv(cfg, passthrough, resume, base_flags)
    args = parse_openrlhf_args(argv)
    cfg = reconcile(cfg, args)
    attach_run_config(args, cfg)
    return argv, args, cfg


def ray_env_vars(cfg: RunConfig) -> dict[str, str]:
    """``env_vars`` of the Ray job's runtime env: OpenRLHF 0.11's own (the values its ``train()`` would set,
    from the environment or its defaults) plus what the reward file reads in every rollout worker, the run's
    K&K answer parser (``data.kk.parser``; ``rewards/kk.py`` reads ``ADORA_KK_PARSER`` when a row names none) and the
    run's plugins (``ADORA_PLUGINS``: the reward registry imports them) and its grading section (``ADORA_GRADING_*``).
    The launcher starts Ray with them, so OpenRLHF's ``train()`` finds Ray initialised and keeps them. The vLLM
    engines compute in the training dtype (``precision.ENGINE_DTYPE_ENV``; OpenRLHF's engines: always bfloat16)."""
    from adora_openrlhf.backends.openrlhf.cpu.precision import ENGINE_DTYPE_ENV
    from adora_openrlhf.backends.openrlhf.timeouts import timeout_env_vars
    from adora_openrlhf.plugins import PLUGINS_ENV
    from adora_openrlhf.rewards.grading import GRADING_DEADLINE_ENV, GRADING_WORKERS_ENV
    from adora_openrlhf.rewards.kk import KK_PARSER_ENV

    return {
        "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "true"),
        "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN"),
        "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": os.environ.get("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1"),
        KK_PARSER_ENV: cfg.data.kk.parser,
        ENGINE_DTYPE_ENV: cfg.model.dtype,
        PLUGINS_ENV: ",".join(cfg.plugins),  # the reward worker imports them (rewards/base.py)
        # the reward file's per-call deadline (rewards/grading.py)
        GRADING_DEADLINE_ENV: repr(float(cfg.grading.deadline_s)),
        GRADING_WORKERS_ENV: str(cfg.grading.workers),
        **timeout_env_vars(),  # the process groups' time-outs set in this environment (timeouts.py)
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


def launch(
    cfg: RunConfig, passthrough: list[str], print_args: bool = False, resume: bool = False, overwrite: bool = False
) -> int:
    """Build, check and (unless ``print_args``) run the OpenRLHF training; returns the exit status. The run holds
    the local backend's lock on ``output_dir`` (rundir.RunDirLock) while it runs, so that a second launch into
    the same directory is refused, and a directory holding a previous run needs ``--resume`` or ``--overwrite``.
    On a machine without a GPU the run is set up for the CPU (:mod:`adora_openrlhf.backends.openrlhf.cpu.launch`)."""
    from adora_openrlhf.backends.openrlhf.cpu.launch import CPU_DEFAULT_FLAGS, check_cpu_args

    try:
        if not print_args:
            check_engines_installed()  # before the options: a GPU recipe on a machine without vLLM hears of vLLM first
        on_cpu = not print_args and runs_on_cpu()
        argv, args, cfg = prepare(cfg, passthrough, resume, CPU_DEFAULT_FLAGS if on_cpu else None)
        if on_cpu:
            check_cpu_args(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except SystemExit as exit_:  # OpenRLHF's argparse already printed its usage and message
        return int(exit_.code) if isinstance(exit_.code, int) else 2
    if print_args:
        print(json.dumps(dry_run_report(argv, args, cfg), indent=2, default=str))
        return 0
    out_dir = Path(cfg.output_dir)
    try:
        check_previous_launch(out_dir, cfg, resume, overwrite)  # read-only: nothing is written before it passes
        components = import_components()
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    trainer_cls, names = components
    launch_id = uuid.uuid4().hex
    setattr(args, LAUNCH_ID_ATTR, launch_id)
    try:
        with RunDirLock(out_dir):
            if overwrite:
                clear_previous_launch(out_dir)
            (out_dir / MARKER_FILE).unlink(missing_ok=True)
            (out_dir / "run_config.json").write_text(json.dumps(cfg.to_dict(), indent=2), encoding="utf-8")
            (out_dir / "openrlhf_command.txt").write_text(
                dry_run_report(argv, args, cfg)["command"] + "\n", encoding="utf-8"
            )
            failure = train_in_ray(args, cfg, on_cpu, trainer_cls, names)
            if failure is not None:  # after the shutdown, so that no actor's forwarded log line comes after it
                sys.stdout.flush()
                sys.stderr.flush()
                print(
                    f"error: the OpenRLHF run failed ({failure}); the actors' log lines above have the details",
                    file=sys.stderr,
                )
                return 1
            check_trainer_marker(out_dir, launch_id)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def runs_on_cpu() -> bool:
    """Whether this launch trains without a GPU: Ray started here on a machine without CUDA, or a submitted job on a
    cluster whose GPUs are logical (:mod:`adora_openrlhf.backends.openrlhf.cpu.launch`); a cluster with no GPU at all is a ConfigError."""
    from adora_openrlhf.backends.openrlhf.cpu.launch import cluster_sees_cuda, is_cpu_machine, joins_a_cluster

    if not joins_a_cluster():
        return is_cpu_machine()
    sees_cuda = cluster_sees_cuda()
    if sees_cuda is None:
        raise ConfigError(
            f"RAY_ADDRESS: the Ray cluster at {os.environ.get('RAY_ADDRESS')} offers no GPU for OpenRLHF to place its actors on; "
            "start it with GPUs (on machines without one: ray start --head --num-gpus 2, logical GPUs for the CPU run)"
        )
    return not sees_cuda


def train_in_ray(args: Any, cfg: RunConfig, on_cpu: bool, trainer_cls: Any, names: dict[str, Any]) -> str | None:
    """OpenRLHF's ``train(args)`` with our classes, in the Ray instance of the job (or one started here, on a CPU
    machine with logical GPUs, and shut down after); returns :func:`run_failure`'s line, or None when it ran."""
    import ray

    from adora_openrlhf.backends.openrlhf.cpu.launch import cpu_ray_init_kwargs, joins_a_cluster

    started_ray = not ray.is_initialized()
    if started_ray and on_cpu and joins_a_cluster():  # a submitted job on a CPU cluster: its CPU settings and hook
        local = cpu_ray_init_kwargs(args, ray_env_vars(cfg))
        ray.init(runtime_env=local["runtime_env"])
    elif started_ray and on_cpu:
        ray.init(**cpu_ray_init_kwargs(args, ray_env_vars(cfg)))
    elif started_ray:  # a job-level runtime env (ray job submit) is merged with these env_vars
        ray.init(runtime_env={"env_vars": ray_env_vars(cfg)})
    try:
        run_openrlhf_train(args, trainer_cls, names)
    except Exception as err:  # noqa: BLE001 - an actor's failure, raised by Ray in the driver: one line
        failure = run_failure(err)
        if "ActorDied" not in failure and any(sign in failure for sign in PEER_LOST):
            failure += dead_actors_note(ray.get_runtime_context().get_job_id())
        return failure
    finally:
        if started_ray:  # the engines and model actors of this launch end with it
            ray.shutdown()
    return None


def run_failure(err: BaseException) -> str:
    """``where: ExceptionType: first line`` of the exception behind an error Ray raised in the driver: a Ray task
    error carries the actor method (``function_name``) and the exception raised in the actor (``cause``)."""
    import re

    where = getattr(err, "function_name", None)
    while isinstance(getattr(err, "cause", None), BaseException):
        err = err.cause
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", str(err)).splitlines() if line.strip()]
    text = actor_death(lines) or (f"{type(err).__name__}: {lines[0][:200]}" if lines else type(err).__name__)
    actor_id = getattr(err, "actor_id", None)  # a RayActorError whose text has only the actor's id
    if isinstance(actor_id, str) and actor_id in text and (named := actor_class_name(actor_id)):
        text = text.replace(f"actor {actor_id}", f"actor {actor_id} ({named})", 1)
    return f"{where}: {text}" if where else text


# A collective (gloo / NCCL) operation that lost its peer: the peer's actor or node died, which Ray may learn only
# seconds later (node health checks), so the error that reaches the driver first names the collective, not the actor.
# Gloo's TCP pair says which side saw the loss: a read of a closed socket, a read of a reset one, a write to a closed one.
PEER_LOST = ("Connection closed by peer", "remote worker crashing", "Connection reset by peer", "Broken pipe")


def dead_actors_note(job_id: str, wait_s: float = 60.0, poll_s: float = 2.0) -> str:
    """``"; after it: ActorDied: <class> (<why>)"`` for the actors of the job ``job_id`` (not those of earlier jobs on
    the cluster) that Ray's state API reports dead within ``wait_s`` seconds (polled every ``poll_s``), or "" when
    none is (no state API, or every actor alive): the actor whose death a collective's lost peer stands for."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        try:
            from ray.util.state import list_actors

            dead = list_actors(filters=[("state", "=", "DEAD"), ("job_id", "=", job_id)], detail=True, timeout=10)
        except Exception:  # noqa: BLE001 - no dashboard, or the cluster is going down: nothing to add
            return ""
        named = [f"{a.class_name} ({_death_reason(getattr(a, 'death_cause', None))})" for a in dead]
        if named or time.monotonic() >= deadline:
            return f"; after it: ActorDied: {', '.join(named)}" if named else ""
        time.sleep(poll_s)


def _death_reason(cause: Any) -> str:
    """The first line of a dead actor's ``death_cause``: Ray's state API gives a mapping of one context (e.g.
    ``{"actor_died_error_context": {"error_message": ..., "pid": ...}}``); its ``error_message`` is the reason."""
    if isinstance(cause, dict):
        messages = [c.get("error_message") for c in cause.values() if isinstance(c, dict) and c.get("error_message")]
        cause = messages[0] if messages else None
    text = str(cause or "no cause given").strip()
    return (text.splitlines() or ["no cause given"])[0][:160]


def actor_class_name(actor_id: str) -> str | None:
    """The class of the actor ``actor_id``, from Ray's state API (None without a reachable one): an actor on a node
    that is going away is reported by id only (``ActorUnavailableError``) before Ray knows that it died."""
    try:
        from ray.util.state import get_actor

        state = get_actor(actor_id, timeout=10)
    except Exception:  # noqa: BLE001 - no dashboard, or the cluster is going down: the id stays as it is
        return None
    return getattr(state, "class_name", None)


def actor_death(lines: list[str]) -> str | None:
    """``ActorDied: <class> (ip <address>): <why>`` from the lines of Ray's ``ActorDiedError`` (an actor's process or
    its node gone: its first line names neither the actor nor the reason), or None for any other error."""
    keys = [line.split(": ", 1)[0] for line in lines]
    if "class_name" not in keys:
        return None
    start = keys.index("class_name")  # the fields block, then the reason (also inside a task's traceback text)
    end = next((i for i in range(start, len(lines)) if keys[i] not in _ACTOR_FIELDS), len(lines))
    fields = dict(line.split(": ", 1) for line in lines[start:end])
    why = lines[end] if end < len(lines) else lines[start - 1]
    ip = f" (ip {fields['ip']})" if "ip" in fields else ""
    return f"ActorDied: {fields['class_name']}{ip}: {why[:200]}"


_ACTOR_FIELDS = ("class_name", "actor_id", "pid", "name", "namespace", "ip")


def check_engines_installed() -> None:
    """ConfigError naming vLLM / DeepSpeed when either is missing: the first thing a launch checks, so that a machine
    without them hears of that before any option of a GPU recipe that it could not run anyway (a missing openrlhf is
    named by the version check, which ``--print-args`` runs too)."""
    if missing := [name for name in missing_engines() if name != "openrlhf"]:
        raise ConfigError(
            f"backend: the cluster run needs OpenRLHF's engines, and {', '.join(missing)} is not installed; "
            f"{INSTALL_HINT}; or use --print-args for a dry run"
        )


def import_components() -> tuple[TrainerClasses, dict[str, Any]]:
    """(our trainer actor classes, the names of OpenRLHF's ``train`` answered with our classes). Needs OpenRLHF's
    GPU stack, or vLLM's CPU build; flash-attn's module-level import is answered on a CPU-only machine
    (:mod:`adora_openrlhf.backends.openrlhf.cpu.flash_attn_standin`)."""
    from adora_openrlhf.backends.openrlhf.cpu.flash_attn_standin import install_if_needed

    check_engines_installed()
    install_if_needed()
    try:
        from adora_openrlhf.backends.openrlhf.actors import ACTOR_NAMES
        from adora_openrlhf.backends.openrlhf.async_trainer import RemoteAdoraPPOTrainerAsync
        from adora_openrlhf.backends.openrlhf.cpu.weight_sync import adora_create_vllm_engines
        from adora_openrlhf.backends.openrlhf.trainer import RemoteAdoraPPOTrainer
    except ImportError as err:  # vllm / flash-attn / deepspeed
        raise ConfigError(
            f"backend: the cluster run needs OpenRLHF's engines ({err}); {INSTALL_HINT}; or use --print-args for a dry run"
        ) from None
    trainers = TrainerClasses(RemoteAdoraPPOTrainer, RemoteAdoraPPOTrainerAsync)
    return trainers, {**ACTOR_NAMES, "create_vllm_engines": adora_create_vllm_engines}


def check_trainer_marker(out_dir: Path, launch_id: str) -> None:
    """After ``train(args)``: the marker our trainer writes must name this launch, else OpenRLHF ran without our
    classes (ADORA, the sampler and the metrics would all be missing)."""
    path = out_dir / MARKER_FILE
    try:
        marker = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        marker = {}
    if marker.get("launch_id") != launch_id:
        raise ConfigError(
            f"backend: OpenRLHF finished without this package's trainer ({path} {'names another launch' if marker else 'was not written'}): "
            "the run had no ADORA weights and no adaptive sampler; check that OpenRLHF's train() still imports its PPOTrainer "
            "as openrlhf 0.11.2 does (tests/test_openrlhf_audit.py)"
        )


def previous_run_artefacts(out_dir: Path) -> list[str]:
    """The names in RUN_ARTEFACTS that ``out_dir`` holds: what a launch into it would mix with or replace."""
    return [name for name in RUN_ARTEFACTS if (out_dir / name).exists()]


def latest_actor_checkpoint(out_dir: Path) -> Path | None:
    """The DeepSpeed checkpoint folder ``--resume`` loads: ``checkpoints/_actor/<tag>`` named by its ``latest`` file."""
    actor = out_dir / "checkpoints" / "_actor"
    try:
        tag = (actor / "latest").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return actor / tag if tag and (actor / tag).is_dir() else None


def check_checkpoint_config(checkpoint: Path, cfg: RunConfig) -> None:
    """``--resume`` continues the run of the checkpoint: its config (saved in the checkpoint folder) must equal
    this one but for :data:`RESUMABLE_CHANGES`."""
    path = checkpoint / CHECKPOINT_CONFIG
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"--resume: {path} is missing, so the checkpoint's settings cannot be compared; it was not written by this package's trainer "
            "(start a new run, or resume with OpenRLHF's own entry)"
        ) from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        raise ConfigError(
            f"--resume: {path} is not valid JSON; restore it, or resume from an earlier checkpoint"
        ) from None
    changed = [key for key in config_differences(saved, cfg.to_dict()) if key not in RESUMABLE_CHANGES]
    if changed:
        from adora_openrlhf.dotted import flatten

        flat_saved, flat_now = flatten(saved), flatten(cfg.to_dict())
        details = ", ".join(f"{k}: {flat_saved.get(k)!r} -> {flat_now.get(k)!r}" for k in changed[:8])
        raise ConfigError(
            f"--resume: the config differs from the checkpoint's ({checkpoint.name}) in {details}; resume with the same options "
            f"(only {list(RESUMABLE_CHANGES)} may change) or use a new --output-dir"
        )


def check_previous_launch(out_dir: Path, cfg: RunConfig, resume: bool, overwrite: bool) -> None:
    """Read-only checks before a cluster run touches ``output_dir`` (the local backend's rules, rundir.py):
    ``--resume`` needs a checkpoint under ``output_dir/checkpoints`` (OpenRLHF would silently start afresh) whose
    config equals this one (:func:`check_checkpoint_config`); without it, a directory holding a previous launch's
    artefacts is refused unless ``--overwrite`` (OpenRLHF would mix the logs and rotate the old run's checkpoints
    away)."""
    from adora_openrlhf.cli_errors import check_output_dir

    if resume and overwrite:
        raise ConfigError(
            "--overwrite: cannot be combined with --resume (one continues the run, the other replaces it)"
        )
    check_output_dir(out_dir, "output_dir")
    if resume:
        checkpoint = latest_actor_checkpoint(out_dir)
        if checkpoint is None:
            raise ConfigError(
                f"--resume: no checkpoint under {str(out_dir / 'checkpoints')!r}; start the run without --resume"
            )
        check_checkpoint_config(checkpoint, cfg)
        return
    found = previous_run_artefacts(out_dir)
    if found and not overwrite:
        raise ConfigError(
            f"output_dir: {str(out_dir)!r} holds a previous run ({', '.join(found)}); continue it with --resume, "
            "replace it with --overwrite, or choose another --output-dir"
        )


def clear_previous_launch(out_dir: Path) -> None:
    """``--overwrite``: remove a previous launch's artefacts (only the names in RUN_ARTEFACTS, never other files)."""
    for name in previous_run_artefacts(out_dir):
        target = out_dir / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()
