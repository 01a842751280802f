"""RL raises the training reward: a few GRPO steps on a small fixed subset of puzzles, end to end.

A tiny model warmed up on four 2-person puzzles answers them right about a third of the time; 20 GRPO steps
on the same four puzzles (8 responses each) must raise the mean training reward clearly. Fast (about 30 s on
one core), and a check of the whole loop's direction: rollout, reward, advantages, policy update.
"""

import json

from test_local_e2e import TINY

from adora_openrlhf.backends.local.trainer import train
from adora_openrlhf.recipes import build_run_config


def test_rl_on_a_fixed_subset_raises_the_training_reward(tmp_path):
    cfg = build_run_config(
        "kk-tiny",
        {
            **TINY,
            "data.num_train": 4,
            "prompts_per_step": 4,
            "sampling.n_keep": 8,
            "steps": 20,
            "train.lr": 5e-4,
            "output_dir": str(tmp_path / "run"),
        },
    )
    train(cfg)
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][1:]
    assert [r["step"] for r in steps] == list(range(1, 21))
    first = sum(r["reward/mean"] for r in steps[:5]) / 5
    last = sum(r["reward/mean"] for r in steps[-5:]) / 5
    assert last > first + 0.3, (first, last)
