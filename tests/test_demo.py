"""The synthetic-policy demo runs the real core end to end and prints its metrics table."""

import pytest

from adora_openrlhf.config import AdaptiveSamplingConfig
from adora_openrlhf.demo import main, run_variant


def test_demo_prints_table(capsys):
    assert main(["--steps", "2", "--prompts", "8", "--n", "4"]) == 0
    out = capsys.readouterr().out
    assert "adaptive balance" in out and "zero-signal" in out


def test_adaptive_sampling_reduces_zero_signal_on_simulated_policy():
    plain = run_variant("grpo", AdaptiveSamplingConfig(enabled=False, n_keep=8), steps=10, prompts=64, seed=1)
    ada = run_variant(
        "pos",
        AdaptiveSamplingConfig(enabled=True, exit_rule="pos", n_keep=8, samples_per_round=8, max_rounds=4),
        steps=10,
        prompts=64,
        seed=1,
    )
    assert plain["sampling/responses_generated"] == pytest.approx(64 * 8)
    assert ada["sampling/responses_generated"] > plain["sampling/responses_generated"]
    assert ada["advantage/zero_signal_fraction"] < plain["advantage/zero_signal_fraction"]
