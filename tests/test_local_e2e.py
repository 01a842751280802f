"""End-to-end runs of the local backend at tiny sizes: GRPO, GRPO+ADORA, adaptive sampling, resume, errors."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from adora_openrlhf.backends.local.trainer import train
from adora_openrlhf.config import ConfigError
from adora_openrlhf.recipes import build_run_config
from adora_openrlhf.rundir.checkpoints import latest_checkpoint
from adora_openrlhf.train import main

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
    "warmup.steps": 150,  # enough for some well-formed answers, so groups have mixed rewards
    "warmup.lr": 1e-2,
    "warmup.batch_size": 8,
    "steps": 3,
    "prompts_per_step": 2,
    "sampling.n_keep": 4,
    "rollout.max_new_tokens": 40,
    "eval_every": 0,
    "save_every": 0,
    "eval_samples": 1,
    "train.lr": 1e-3,
}


def _cfg(tmp_path, recipe="kk-tiny", **extra):
    return build_run_config(recipe, {**TINY, "output_dir": str(tmp_path / "run"), **extra})


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _final_weights(out):
    return load_file(latest_checkpoint(out) / "model.safetensors")


def _check_run(tmp_path, cfg):
    summary = train(cfg)
    out = tmp_path / "run"
    records = _records(out)
    steps = [r for r in records if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert math.isfinite(r["train/loss"]) and math.isfinite(r["train/grad_norm"])
        assert 0.0 < r["train/entropy"] < math.log(1024)  # mean token entropy (nats), below log(vocab size)
        assert 0.0 <= r["response/truncated_fraction"] <= 1.0 and r["response/length_max"] <= 40
        for key in (
            "reward/mean",
            "reward/accuracy",
            "response/length_mean",
            "advantage/zero_signal_fraction",
            "sampling/responses_generated",
            "adora/tas_fraction",
            "adora/mean_weight",
            "time/generate_s",
            "time/score_s",
            "time/train_s",
        ):
            assert key in r, key
    assert "eval/greedy_accuracy" in records[0] and "eval/greedy_accuracy" in steps[-1]
    assert min(r["advantage/zero_signal_fraction"] for r in steps) < 1.0, "no group had a learning signal"
    # parameters changed between the post-warm-up checkpoint and the end
    start = load_file(out / "checkpoints" / "step_000000" / "model.safetensors")
    end = _final_weights(out)
    assert any(not torch.equal(start[k], end[k]) for k in start)
    assert (out / "config.json").exists() and (out / "reward_curve.png").stat().st_size > 0
    assert list((out / "tb").glob("events.*")), "TensorBoard events were not written"
    assert (out / "final_model" / "config.json").exists() and (out / "tokenizer" / "tokenizer.json").exists()
    assert summary["eval_step0"] and summary["eval_final"]
    return records


def test_grpo_end_to_end(tmp_path):
    records = _check_run(tmp_path, _cfg(tmp_path))
    assert all(r["sampling/responses_generated"] == 2 * 4 for r in records if r["step"] > 0)


def test_grpo_adora_end_to_end(tmp_path):
    cfg = _cfg(tmp_path, "kk-tiny-adora")
    assert cfg.adora.enabled
    records = _check_run(tmp_path, cfg)
    assert all(0.0 < r["adora/mean_weight"] <= 1.0 for r in records if r["step"] > 0)


def test_adaptive_sampling_end_to_end(tmp_path):
    cfg = _cfg(tmp_path, "kk-tiny-ada", **{"sampling.samples_per_round": 4, "sampling.max_rounds": 2})
    assert cfg.sampling.enabled
    records = _check_run(tmp_path, cfg)
    for r in records[1:]:
        assert 8 <= r["sampling/responses_generated"] <= 16  # 2 prompts x 4 per round x 1..2 rounds
        assert 1 <= r["sampling/rounds_used"] <= 2


def test_kl_and_multi_epoch_update(tmp_path):
    cfg = _cfg(
        tmp_path,
        **{
            "train.kl_coef": 0.1,
            "train.ppo_epochs": 2,
            "train.micro_batch_size": 3,
            "steps": 2,
            "train.loss_agg": "seq_mean_token_sum_norm",
        },
    )
    train(cfg)
    records = _records(tmp_path / "run")
    assert all(math.isfinite(r["train/kl"]) and r["train/kl"] >= 0 for r in records[1:])


def test_resume_continues_at_same_step_with_same_data(tmp_path):
    full = build_run_config("kk-tiny", {**TINY, "steps": 4, "output_dir": str(tmp_path / "full")})
    train(full)
    part = build_run_config("kk-tiny", {**TINY, "steps": 2, "output_dir": str(tmp_path / "part")})
    train(part)  # "interrupted" after step 2 (the last step is always checkpointed)
    (tmp_path / "part" / "checkpoints" / "step_000003.tmp").mkdir()  # a save cut off mid-write is ignored
    resumed = build_run_config("kk-tiny", {**TINY, "steps": 4, "output_dir": str(tmp_path / "part")})
    summary = train(resumed, resume=True)
    assert summary["resumed_from_step"] == 2
    a, b = _records(tmp_path / "full"), _records(tmp_path / "part")
    assert [r["step"] for r in b] == [0, 1, 2, 3, 4]
    for ra, rb in zip(a[3:], b[3:], strict=True):  # steps 3 and 4: same prompts, same samples, same updates
        assert rb["sampling/first_round_mean_reward"] == pytest.approx(ra["sampling/first_round_mean_reward"])
        assert rb["train/loss"] == pytest.approx(ra["train/loss"], rel=1e-4, abs=1e-6)
    end_a, end_b = _final_weights(tmp_path / "full"), _final_weights(tmp_path / "part")
    assert all(torch.allclose(end_a[k], end_b[k], atol=1e-5) for k in end_a)


def test_resume_errors(tmp_path):
    with pytest.raises(ConfigError, match="no checkpoint"):
        train(_cfg(tmp_path), resume=True)
    train(_cfg(tmp_path, steps=2))
    with pytest.raises(
        ConfigError,
        match="holds a run with checkpoints .up to step 2.; continue it with --resume, replace it with --overwrite",
    ):
        train(_cfg(tmp_path, steps=1))  # a new run never replaces a run with checkpoints unasked
    assert (tmp_path / "run" / "checkpoints" / "step_000002").exists()
    train(_cfg(tmp_path, steps=1), overwrite=True)  # --overwrite replaces the old run's checkpoints
    assert [p.name for p in sorted((tmp_path / "run" / "checkpoints").iterdir())] == ["step_000000", "step_000001"]
    with pytest.raises(
        ConfigError, match="the config differs from the config saved in checkpoint step_000001 in train.lr"
    ):
        train(_cfg(tmp_path, steps=2, **{"train.lr": 0.5}), resume=True)


def test_cli_bad_flags_and_recipes(tmp_path, capsys):
    for argv, pattern in (
        (["--recipe", "nope"], "unknown recipe 'nope'"),
        (["--estimator", "bogus"], "unknown advantage estimator 'bogus'"),
        (["--steps", "zero"], "--steps: cannot parse"),
        (["--frobnicate", "1"], "unknown flag"),
        (["--warmup.steps", "-1"], "warmup.steps: must be an integer >= 0"),
        (["--data.prompt_template", "fancy", "--output-dir", str(tmp_path / "x")], "unknown prompt template 'fancy'"),
    ):
        try:
            main(argv)
        except SystemExit as exit_:
            assert exit_.code == 2, argv
            assert pattern in capsys.readouterr().err, argv
        except (ConfigError, ValueError) as err:
            assert pattern in str(err), argv
        else:
            pytest.fail(f"{argv} did not fail")


def test_local_refuses_gpu_only_settings(tmp_path):
    (tmp_path / "text_lm").mkdir()
    (tmp_path / "text_lm" / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    # geometry runs on the tiny VLM, not a text LM
    with pytest.raises(ConfigError, match="geometry' needs a vision-language checkpoint"):
        train(_cfg(tmp_path, **{"data.task": "geometry", "model.path": str(tmp_path / "text_lm")}))
    with pytest.raises(ConfigError, match="model.path"):
        train(_cfg(tmp_path, **{"model.path": str(tmp_path / "missing")}))


def test_local_checkpoint_with_lora_and_chat_template(tmp_path):
    """``--model PATH``: a saved Hugging Face checkpoint with a chat template, LoRA adapters, KL to the base."""
    from adora_openrlhf.config import TinyModelConfig
    from adora_openrlhf.engine.model import build_tiny_model
    from adora_openrlhf.engine.tokenization import train_bpe_tokenizer
    from adora_openrlhf.tasks.kk import generate_rows

    rows = generate_rows(20, [2], seed=5)
    texts = [m["content"] for r in rows for m in r["prompt"]] + [r["label"] for r in rows]
    tok = train_bpe_tokenizer(texts, 400)
    tok.chat_template = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
    small = TinyModelConfig(
        vocab_size=400,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    build_tiny_model(small, tok, seed=0).save_pretrained(str(tmp_path / "ckpt"))
    tok.save_pretrained(str(tmp_path / "ckpt"))
    cfg = _cfg(
        tmp_path,
        **{
            "model.path": str(tmp_path / "ckpt"),
            "model.lora_rank": 4,
            "warmup.steps": 0,
            "steps": 2,
            "train.kl_coef": 0.05,
            "data.max_prompt_tokens": 1024,
        },
    )
    train(cfg)
    out = tmp_path / "run"
    records = _records(out)
    assert [r["step"] for r in records] == [0, 1, 2] and all(math.isfinite(r["train/loss"]) for r in records[1:])
    start = load_file(out / "checkpoints" / "step_000000" / "adapter_model.safetensors")
    assert any("lora_" in k for k in start)
    assert (out / "final_model" / "adapter_config.json").exists()
