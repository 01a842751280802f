"""ZeRO-3 on gloo (``backends/openrlhf/cpu/zero3_gathers.py``): the CPU strategy's configs gather one parameter at
a time, and with them a checkpoint loads into a two-rank ZeRO-3 model exactly (real DeepSpeed 0.19, transformers,
gloo; without the switch about half such loads came out wrong on this machine): the two-rank load itself is
``test_openrlhf_e2e.test_a_checkpoint_loads_exactly_into_two_zero3_gloo_ranks``, with the real-engine tests."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("openrlhf", reason="needs requirements/openrlhf-cpu-test.txt")
pytest.importorskip("deepspeed", reason="needs requirements/openrlhf-cpu-test.txt")
FIXTURES = Path(__file__).parent / "fixtures" / "openrlhf"
sys.path.insert(0, str(FIXTURES))

from adora_openrlhf.backends.openrlhf.cpu.zero3_gathers import SEQUENTIAL_GATHERS_KEY, sequential_zero3_gathers  # noqa: E402
from gpu_stubs import import_openrlhf  # noqa: E402

(actors,) = import_openrlhf("adora_openrlhf.backends.openrlhf.actors")


def strategy(*flags: str):
    from adora_openrlhf.backends.openrlhf.compat.entry import parse_openrlhf_args

    return actors.adora_get_strategy(parse_openrlhf_args(["--reward.remote_url", "r.py", *flags]))


def test_only_zero3_configs_get_sequential_gathers():
    assert sequential_zero3_gathers({"zero_optimization": {"stage": 3}}) == {
        "zero_optimization": {"stage": 3, SEQUENTIAL_GATHERS_KEY: True}
    }
    for config in ({"zero_optimization": {"stage": 2}}, {"zero_optimization": {"stage": 0}}, {"train_batch_size": 8}):
        assert sequential_zero3_gathers(json.loads(json.dumps(config))) == config


def test_the_cpu_strategy_gathers_zero3_parameters_one_at_a_time():
    zero3 = strategy("--ds.zero_stage", "3")
    assert zero3.get_ds_train_config()["zero_optimization"][SEQUENTIAL_GATHERS_KEY] is True
    assert zero3.get_ds_eval_config(offload=False)["zero_optimization"][SEQUENTIAL_GATHERS_KEY] is True
    zero2 = strategy("--ds.zero_stage", "2")
    assert SEQUENTIAL_GATHERS_KEY not in zero2.get_ds_train_config()["zero_optimization"]
