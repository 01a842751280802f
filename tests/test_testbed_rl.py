"""The testbed's mechanism in miniature: a warmed-up policy that mostly guesses, RL that selects thorough reasoning.

On a small fixed subset of 2-person puzzles, a tiny model learns from a mix of 30% thorough guess-and-check
traces and 70% ``<think>guess.</think>`` shortcuts. Thorough traces (memorised for these few puzzles) are
right; guesses only by luck, so GRPO raises the share of thorough responses and with it the training reward.
"""

import json

from adora_openrlhf.backends.local.trainer import train
from adora_openrlhf.recipes import build_run_config

SUBSET = {
    "model.tiny.vocab_size": 400,
    "model.tiny.hidden_size": 64,
    "model.tiny.intermediate_size": 128,
    "model.tiny.num_hidden_layers": 2,
    "data.num_train": 6,
    "data.num_eval": 4,
    "warmup.steps": 0,
    "warmup.mix_steps": 120,
    "warmup.mix_lr": 1e-2,
    "warmup.batch_size": 12,
    "warmup.mix": {"thorough": 0.3, "shortcut": 0.7},
    "steps": 12,
    "prompts_per_step": 6,
    "sampling.n_keep": 8,
    "rollout.max_new_tokens": 160,
    "train.lr": 2e-3,
    "eval_every": 0,
    "save_every": 0,
    "eval_samples": 0,
}


def test_rl_on_a_fixed_subset_raises_the_training_reward(tmp_path):
    cfg = build_run_config("kk-testbed", {**SUBSET, "output_dir": str(tmp_path / "run")})
    train(cfg)
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][1:]
    assert len(steps) == 12
    first, last = steps[:3], steps[-3:]

    def mean(records, key):
        return sum(r[key] for r in records) / len(records)

    assert mean(first, "response/shortcut_fraction") > 0.4, "the warmed-up policy should mostly guess"
    assert mean(last, "response/thorough_fraction") > mean(first, "response/thorough_fraction") + 0.2
    assert mean(last, "reward/mean") > mean(first, "reward/mean") + 0.3
    assert mean(last, "response/length_mean") > mean(first, "response/length_mean")
