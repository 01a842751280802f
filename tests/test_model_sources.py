"""Models and checkpoints: hub names through from_pretrained (offline hub cache), step directories that load
with from_pretrained and eval.run, LoRA merged on save, "all-linear" LoRA targets."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from adora_openrlhf.backends.local.loading import build_model
from adora_openrlhf.config import ConfigError, ModelConfig, TinyModelConfig
from adora_openrlhf.engine.model import apply_lora, build_tiny_model
from adora_openrlhf.engine.model_source import check_model_source
from adora_openrlhf.engine.tokenization import train_bpe_tokenizer
from adora_openrlhf.recipes import build_run_config
from adora_openrlhf.rundir import checkpoints as ckpt
from adora_openrlhf.tasks.kk import generate_rows

ROOT = Path(__file__).resolve().parents[1]
TINY = TinyModelConfig(
    vocab_size=300,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
)
TINY_FLAGS = {
    "model.tiny.vocab_size": 300,
    "model.tiny.hidden_size": 32,
    "model.tiny.intermediate_size": 64,
    "model.tiny.num_hidden_layers": 1,
    "model.tiny.num_attention_heads": 2,
    "model.tiny.num_key_value_heads": 1,
}
INPUT = torch.tensor([[5, 6, 7, 8, 9]])


@pytest.fixture(scope="module")
def tok():
    rows = generate_rows(30, [2], seed=3)
    return train_bpe_tokenizer([m["content"] for r in rows for m in r["prompt"]] + [r["label"] for r in rows], 300)


def _logits(model):
    with torch.no_grad():
        return model(input_ids=INPUT).logits


def _env(**extra):
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **extra}


def _fake_hub_cache(root: Path, repo: str, model, tok) -> Path:
    """``root`` laid out as a Hugging Face hub cache holding ``repo`` (models--owner--name/snapshots/<hash>/, refs/main)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / commit
    model.save_pretrained(str(snapshot))
    tok.save_pretrained(str(snapshot))
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(commit)
    return snapshot


# ---- hub names --------------------------------------------------------------------------------------------


def test_hub_name_loads_offline_from_hub_cache_via_hf_home(tok, tmp_path):
    """HF_HOME/hub holds owner/tiny: the trainer's model and tokenizer setup loads it by name with HF_HUB_OFFLINE=1."""
    model = build_tiny_model(TINY, tok, seed=0)
    _fake_hub_cache(tmp_path / "home" / "hub", "owner/tiny", model, tok)
    torch.save(_logits(model), tmp_path / "expected.pt")
    script = f"""
import torch
from adora_openrlhf.backends.local.loading import build_model, build_tokenizer
from adora_openrlhf.backends.local.trainer import _check_runnable
from adora_openrlhf.recipes import build_run_config
cfg = build_run_config("kk-tiny", {{"model.path": "owner/tiny", "model.init_kwargs": {{"attn_implementation": "eager"}},
                                   "output_dir": {str(tmp_path / "run")!r}}})
_check_runnable(cfg)
tokenizer, processor = build_tokenizer(cfg, [], None)
model = build_model(cfg, tokenizer, torch.device("cpu"))
assert processor is None and len(tokenizer) == {len(tok)}
assert model.config._attn_implementation == "eager"
with torch.no_grad():
    got = model(input_ids=torch.tensor([[5, 6, 7, 8, 9]])).logits
assert torch.allclose(got, torch.load({str(tmp_path / "expected.pt")!r}), atol=1e-5), "different weights"  # eager vs sdpa attention
print("loaded owner/tiny")
"""
    env = _env(HF_HOME=str(tmp_path / "home"))
    env.pop("HF_HUB_CACHE", None)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "loaded owner/tiny" in done.stdout


def test_eval_run_takes_a_hub_name_and_train_names_a_missing_one(tok, tmp_path):
    """HF_HUB_CACHE holds owner/tiny: `eval.run --engine hf --model owner/tiny` runs offline; a name that is not
    in the cache gives one error line naming model.path (train) or --model (eval) and the fix."""
    _fake_hub_cache(tmp_path / "cache", "owner/tiny", build_tiny_model(TINY, tok, seed=0), tok)
    bench = tmp_path / "kk.jsonl"
    bench.write_text("".join(json.dumps(r) + "\n" for r in generate_rows(2, [2], seed=5)))
    env = _env(HF_HUB_CACHE=str(tmp_path / "cache"))
    argv = [
        sys.executable,
        "-m",
        "eval.run",
        "--model",
        "owner/tiny",
        "--bench",
        "kk",
        "--bench-file",
        f"kk={bench}",
        "--k",
        "1",
        "--temperature",
        "0",
        "--max-new-tokens",
        "4",
        "--engine",
        "hf",
        "--out",
        str(tmp_path / "eval"),
    ]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len((tmp_path / "eval" / "samples.jsonl").read_text().splitlines()) == 2
    missing = subprocess.run(
        [
            sys.executable,
            "-m",
            "adora_openrlhf.train",
            "--model",
            "owner/missing",
            "--output-dir",
            str(tmp_path / "run"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    assert missing.stderr.startswith(
        "error: model.path: 'owner/missing' is not a local directory and not in the Hugging Face hub cache "
        "(HF_HUB_OFFLINE=1); download it first (`hf download owner/missing`) or unset HF_HUB_OFFLINE"
    )
    assert not (tmp_path / "run").exists()


def test_missing_hub_name_offline_is_one_config_error():
    """The test session runs with HF_HUB_OFFLINE=1 (conftest) and an empty cache for this name."""
    with pytest.raises(
        ConfigError,
        match=r"^model.path: 'nobody/no-such-model-xyz' is not a local directory and not in the Hugging Face hub cache",
    ):
        check_model_source("nobody/no-such-model-xyz")
    with pytest.raises(
        ConfigError,
        match=r"^--model: 'not a name' does not exist; give a local model directory or a hub name owner/name$",
    ):
        check_model_source("not a name", "--model")
    with pytest.raises(ConfigError, match=r"^model.path: '/no/such/dir' does not exist"):
        check_model_source("/no/such/dir")
    check_model_source(str(ROOT))  # an existing local path passes; its loader names what is wrong with it


# ---- step checkpoints -------------------------------------------------------------------------------------


def _state(step=3):
    return ckpt.TrainerState(step=step, data_position=12, sampler={"history": {}}, rng=ckpt.capture_rng())


RUN_RECORD = {"config": {}, "data": {"train": {"rows": 0, "sha256": ""}, "eval": {"rows": 0, "sha256": ""}}}


def test_step_dir_is_a_hugging_face_model_directory(tok, tmp_path):
    """A step directory loads with AutoModelForCausalLM/AutoTokenizer.from_pretrained and with eval.run; the
    trainer state sits beside it and restores the optimizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adora_openrlhf.evaluation.run import main as eval_main

    model = build_tiny_model(TINY, tok, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=INPUT).logits.sum().backward()
    opt.step()
    step = ckpt.save_checkpoint(tmp_path, model, opt, tok, _state(), RUN_RECORD)
    names = {p.name for p in step.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "trainer_state"} <= names and "model.pt" not in names
    saved = {"optimizer.pt", "state.pt", "run.json", "manifest.json"}
    assert {p.name for p in (step / "trainer_state").iterdir()} == saved
    assert ckpt.read_run_record(step) == RUN_RECORD
    loaded = AutoModelForCausalLM.from_pretrained(str(step), dtype=torch.float32)
    assert torch.allclose(_logits(loaded), _logits(model), atol=1e-6)
    assert AutoTokenizer.from_pretrained(str(step)).encode("Alice is a knight") == tok.encode("Alice is a knight")
    opt2 = torch.optim.AdamW(loaded.parameters(), lr=1e-3)
    state = ckpt.load_trainer_state(step, opt2)
    assert (state.step, state.data_position) == (3, 12) and opt2.state_dict()["state"].keys() == opt.state_dict()[
        "state"
    ].keys()
    bench = tmp_path / "kk.jsonl"
    bench.write_text("".join(json.dumps(r) + "\n" for r in generate_rows(2, [2], seed=5)))
    assert (
        eval_main(
            [
                "--model",
                str(step),
                "--bench",
                "kk",
                "--bench-file",
                f"kk={bench}",
                "--k",
                "1",
                "--temperature",
                "0",
                "--max-new-tokens",
                "4",
                "--engine",
                "hf",
                "--out",
                str(tmp_path / "eval"),
            ]
        )
        == 0
    )
    assert len((tmp_path / "eval" / "samples.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("merge", [False, True])
def test_lora_checkpoint_resumes_and_merged_save_is_plain(tok, tmp_path, merge):
    """With LoRA the step directory holds peft's adapters, or (model.merge_lora_on_save) the merged model: a plain
    checkpoint whose logits equal the adapted policy's. Either way the trainer rebuilds the same policy from it."""
    from transformers import AutoModelForCausalLM

    cfg = build_run_config("kk-tiny", {**TINY_FLAGS, "model.lora_rank": 4, "model.merge_lora_on_save": merge})
    policy = build_model(cfg, tok, torch.device("cpu"))
    with torch.no_grad():  # trained adapters (peft starts B at 0, which would hide a lost adapter)
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    step = ckpt.save_checkpoint(
        tmp_path, policy, None, tok, _state(), RUN_RECORD, merge_lora=cfg.model.merge_lora_on_save
    )
    expected = _logits(policy)
    resumed = build_model(cfg, tok, torch.device("cpu"), step)
    assert torch.allclose(_logits(resumed), expected, atol=1e-6)
    assert [n for n, p in resumed.named_parameters() if p.requires_grad] == [
        n for n, p in policy.named_parameters() if p.requires_grad
    ]
    if merge:
        assert (
            not (step / "adapter_config.json").exists()
            and (step / "trainer_state" / "adapter" / "adapter_config.json").exists()
        )
        plain = AutoModelForCausalLM.from_pretrained(str(step), dtype=torch.float32)
        assert not any("lora_" in n for n, _ in plain.named_parameters())
        assert torch.allclose(_logits(plain), expected, rtol=1e-4, atol=1e-4)  # W + scale * B A rounds differently
        assert any("lora_" in n for n, _ in policy.named_parameters())  # saving merged a copy, not the policy
    else:
        assert (step / "adapter_config.json").exists() and (step / "adapter_model.safetensors").exists()


def test_all_linear_lora_targets_every_linear_but_the_head(tok):
    wrapped = apply_lora(
        build_tiny_model(TINY, tok, seed=0), ModelConfig(lora_rank=2, lora_target_modules=["all-linear"])
    )
    adapted = {
        name.rsplit(".lora_A", 1)[0].rsplit(".", 1)[-1] for name, _ in wrapped.named_parameters() if ".lora_A." in name
    }
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert not any("lm_head" in name and "lora" in name for name, _ in wrapped.named_parameters())


def test_a_step_directory_in_another_layout_is_a_broken_checkpoint(tmp_path):
    """A step directory without ``trainer_state/`` (a single ``model.pt``, say) is no checkpoint this version wrote:
    ``--resume`` refuses it as broken, naming the missing manifest, in one line."""
    from adora_openrlhf.rundir.checks import check_previous_run

    out = tmp_path / "run"
    step = out / "checkpoints" / "step_000002"
    step.mkdir(parents=True)
    (step / "model.pt").write_bytes(b"old")
    assert ckpt.checkpoint_problem(step) == "trainer_state/manifest.json is missing"
    with pytest.raises(
        ConfigError,
        match=r"^--resume: checkpoint '.*step_000002' is broken: trainer_state/manifest.json is missing; no earlier "
        "checkpoint is complete: start a new run with --overwrite",
    ):
        check_previous_run(out, build_run_config("kk-tiny", {"output_dir": str(out)}), resume=True, overwrite=False)
