"""The installed product: the wheel built from this checkout, installed into a fresh venv outside it, trains,
evaluates and prepares data through its console scripts, with no ``eval`` or ``data_prep`` package installed.

Slow (a wheel build and a venv install of the dependencies; pip's cache makes the install quick on a machine
that installed them before): skipped unless ``ADORA_WHEEL_TEST=1``; ``.ci/run`` runs it after the main suite, beside the real-engine tests
with ``ADORA_WHEEL_TEST=1 python -m pytest -q -m wheel tests/test_wheel.py``.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "requirements" / "constraints.txt"

pytestmark = [
    pytest.mark.wheel,
    pytest.mark.skipif(
        os.environ.get("ADORA_WHEEL_TEST") != "1", reason="builds and installs the wheel; set ADORA_WHEEL_TEST=1"
    ),
]

sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
from tiny_runs import TINY_KK  # noqa: E402

# the tests' smallest local run (kk-tiny, a one-layer model, no warm-up) for two RL steps, with the trainer's
# held-out evaluation (4 rows, 8 new tokens) that adora-eval --run repeats
_WHEEL_RUN = {**TINY_KK, "steps": 2, "data.num_eval": 4, "rollout.max_new_tokens": 8, "report_to": "none"}
_WHEEL_RUN.pop("eval_every")  # the recipe's: the final evaluation is the one repeated
TRAIN_FLAGS = ["--recipe", "kk-tiny"] + [
    token
    for key, value in _WHEEL_RUN.items()
    for token in (f"--{key}", json.dumps(value) if isinstance(value, list) else str(value))
]


def _source_copy(dest: pathlib.Path) -> pathlib.Path:
    """The checkout's tracked and not-ignored files (committed or not) in ``dest``: the wheel is built from them
    alone, never from a stale ``build/`` folder of the checkout."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def _clean_env(venv: pathlib.Path) -> dict[str, str]:
    """The environment of a user of the installed wheel: its venv first on PATH, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    return env


def _run(args: list[str], cwd: pathlib.Path, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{args[0]} failed ({result.returncode}):\n{result.stdout}\n{result.stderr[-4000:]}"
    return result


@pytest.fixture(scope="module")
def installed():
    """(venv, work folder): the wheel of this checkout installed into a fresh venv, both outside the checkout."""
    with tempfile.TemporaryDirectory(prefix="adora-wheel-") as tmp:
        tmp = pathlib.Path(tmp)
        assert ROOT not in tmp.resolve().parents
        source = _source_copy(tmp / "src")
        dist = tmp / "dist"
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), "."],
            cwd=source,
            check=True,
        )
        (wheel,) = dist.glob("adora_openrlhf-*.whl")
        venv = tmp / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        env = _clean_env(venv)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-c", str(CONSTRAINTS), str(wheel)]
        subprocess.run(pip, cwd=tmp, env=env, check=True, timeout=1500)
        work = tmp / "work"
        work.mkdir()
        yield venv, work, env


def test_the_wheel_holds_the_package_alone(installed):
    venv, work, env = installed
    probe = (
        "import importlib.util, json, adora_openrlhf, adora_openrlhf.evaluation.run, adora_openrlhf.data_prep.kk; "
        "print(json.dumps({'file': adora_openrlhf.__file__, "
        "'eval': importlib.util.find_spec('eval') is not None, "
        "'data_prep': importlib.util.find_spec('data_prep') is not None}))"
    )
    found = json.loads(_run([str(venv / "bin" / "python"), "-c", probe], work, env).stdout)
    assert found["eval"] is False and found["data_prep"] is False
    site = pathlib.Path(found["file"]).resolve()
    assert venv.resolve() in site.parents and "site-packages" in site.parts and ROOT not in site.parents


def test_train_evaluate_and_prepare_data_with_the_console_scripts(installed):
    venv, work, env = installed
    run = work / "run"
    summary = json.loads(_run(["adora-train", *TRAIN_FLAGS, "--output-dir", str(run)], work, env).stdout)
    trained = summary["eval_final"]["eval/greedy_accuracy"]
    assert (run / "final_model" / "config.json").is_file() and (run / "heldout.jsonl").is_file()

    evaluated = _run(["adora-eval", "--run", str(run), "--temperature", "0", "--k", "1", "--engine", "hf"], work, env)
    assert f"eval/greedy_accuracy at step 2: {trained:.3f}" in evaluated.stdout
    assert "equal, as it must be" in evaluated.stdout, evaluated.stdout

    data = work / "kk"
    _run(["adora-prep-kk", "--out", str(data), "--num-train", "6", "--num-eval", "2", "--people", "2"], work, env)
    rows = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and {r["source"] for r in rows} == {"kk"}
    assert len((data / "test.jsonl").read_text().splitlines()) == 2

    bad = subprocess.run(["adora-prep-kk"], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("adora-prep-kk: error:"), bad.stderr
