"""End-to-end runs of the local backend's token estimators at tiny sizes: PPO (gae, with its critic) with ADORA and
the adaptive sampler, resumed with the critic restored; REINFORCE++ (reinforce) with one response per prompt."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from adora_openrlhf.backends.local import critic as critic_module
from adora_openrlhf.backends.local.trainer import train
from adora_openrlhf.recipes import build_run_config

TINY = {
    "model.tiny.vocab_size": 300,
    "model.tiny.hidden_size": 32,
    "model.tiny.intermediate_size": 64,
    "model.tiny.num_hidden_layers": 2,
    "model.tiny.num_attention_heads": 2,
    "model.tiny.num_key_value_heads": 1,
    "data.num_train": 24,
    "data.num_eval": 4,
    "data.kk.num_people": [2],
    "warmup.steps": 150,
    "warmup.lr": 1e-2,
    "warmup.batch_size": 8,
    "prompts_per_step": 2,
    "rollout.max_new_tokens": 40,
    "eval_every": 0,
    "save_every": 1,
    "eval_samples": 0,
    "train.lr": 1e-3,
    "critic.lr": 1e-3,
    "report_to": ["none"],
}


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_gae_with_adora_and_the_sampler_then_resume_restores_the_critic(tmp_path, monkeypatch):
    out = tmp_path / "run"
    overrides = {
        **TINY,
        "output_dir": str(out),
        "advantage.estimator": "gae",
        "advantage.lambd": 0.95,
        "adora.enabled": True,
        "sampling.enabled": True,
        "sampling.n_keep": 2,
        "sampling.samples_per_round": 2,
        "sampling.max_rounds": 2,
    }
    train(build_run_config("kk-tiny", {**overrides, "steps": 2}))
    steps = [r for r in _records(out) if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        for key in ("critic/value_loss", "critic/values_mean", "critic/grad_norm", "advantage/mean_abs", "train/loss"):
            assert math.isfinite(r[key]), key
        for key in ("adora/tas_fraction", "adora/mean_weight", "sampling/rounds_used", "sampling/pool_mean_reward"):
            assert key in r, key
    checkpoints = out / "checkpoints"
    critic0 = load_file(checkpoints / "step_000000" / "critic" / "model.safetensors")
    policy0 = load_file(checkpoints / "step_000000" / "model.safetensors")
    # warm start: the critic's transformer is the warmed-up policy's
    assert torch.equal(critic0["model.embed_tokens.weight"], policy0["model.embed_tokens.weight"])
    saved = load_file(checkpoints / "step_000002" / "critic" / "model.safetensors")
    assert any(not torch.equal(critic0[k], saved[k]) for k in saved), "the critic was not trained"

    loaded = {}
    original = critic_module.Critic.load

    def recording_load(self, checkpoint):
        original(self, checkpoint)
        loaded.update({k: v.detach().clone() for k, v in self.model.state_dict().items()})
        loaded["optimizer_steps"] = len(self.optimizer.state_dict()["state"])

    monkeypatch.setattr(critic_module.Critic, "load", recording_load)
    summary = train(build_run_config("kk-tiny", {**overrides, "steps": 3}), resume=True)
    assert summary["resumed_from_step"] == 2
    assert loaded.pop("optimizer_steps") > 0  # the critic's AdamW state came back too
    assert loaded.keys() == saved.keys() and all(torch.equal(loaded[k], saved[k]) for k in saved)
    assert [r["step"] for r in _records(out) if r["step"] > 0] == [1, 2, 3]
    assert math.isfinite(_records(out)[-1]["critic/value_loss"])


def test_reinforce_with_one_response_per_prompt(tmp_path):
    out = tmp_path / "run"
    cfg = build_run_config(
        "kk-tiny",
        {**TINY, "output_dir": str(out), "advantage.estimator": "reinforce", "sampling.n_keep": 1, "steps": 1},
    )
    train(cfg)
    (step,) = [r for r in _records(out) if r["step"] > 0]
    assert math.isfinite(step["train/loss"]) and "critic/value_loss" not in step
    assert not (out / "checkpoints" / "step_000001" / "critic").exists()


def test_the_critic_values_line_up_with_the_action_mask_and_its_loss_falls():
    from adora_openrlhf.algorithms.critic import CriticConfig
    from adora_openrlhf.backends.local.update import pack
    from adora_openrlhf.config import TinyModelConfig
    from adora_openrlhf.engine.model import build_tiny_model
    from adora_openrlhf.engine.tokenization import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(["Alice is a knight. Bob is a knave."] * 4, 300)
    tiny = TinyModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    policy = build_tiny_model(tiny, tokenizer, seed=0)
    critic = critic_module.build_critic(policy, CriticConfig(lr=1e-2, value_clip=None), seed=0, warm_start=True)
    assert torch.equal(critic.model.model.embed_tokens.weight, policy.model.embed_tokens.weight)
    batch = pack([[1, 2, 3], [4, 5]], [[6, 7], [8, 9, 10, 11]], pad_id=0)
    values = critic_module.critic_values(critic, batch, micro_batch_size=1)
    assert values.shape == batch.action_mask.shape and torch.all(values[batch.action_mask == 0] == 0)
    returns = batch.action_mask * 3.0
    cfg = CriticConfig(lr=1e-2, value_clip=None)
    losses = [
        critic_module.critic_update(critic, batch, returns, values, cfg, 2)["critic/value_loss"] for _ in range(5)
    ]
    assert losses[-1] < losses[0]


def test_gae_with_lora_is_refused_before_the_run_starts(tmp_path):
    from adora_openrlhf.config import ConfigError

    cfg = build_run_config(
        "kk-tiny", {"advantage.estimator": "gae", "model.lora_rank": 4, "output_dir": str(tmp_path / "run")}
    )
    with pytest.raises(
        ConfigError, match=r"^advantage.estimator: the local critic of 'gae' is built for text policies"
    ):
        train(cfg)
    assert not (tmp_path / "run").exists()
