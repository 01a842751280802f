"""The Ray side of the OpenRLHF backend on CPU: sampler over an engine actor, trainer actor construction.

A local Ray instance runs :class:`fake_engine.ScriptedRolloutEngine` as a real Ray actor: the generator's
calls cross the process boundary exactly as with OpenRLHF's ``RolloutRayActor``; inside the engine,
OpenRLHF's own ``SingleTurnAgentExecutor`` tokenises, builds the response dicts and calls our reward file
(K&K reward) from its path. Only the vLLM generation itself is scripted.

The last test starts our PPO trainer as a Ray actor, as OpenRLHF's ``train(args)`` does, and checks that
the actor process built our generator and experience maker from the config carried by the args namespace,
then runs one training batch of adaptive sampling inside that actor (OpenRLHF's dataloader over a JSONL
file, our sampler, the engine actor). The worker processes of this test cluster get the GPU-package stubs
through Ray's ``worker_process_setup_hook`` (tests only).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("openrlhf", reason="needs requirements/openrlhf-cpu-test.txt")
pytest.importorskip("deepspeed", reason="needs requirements/openrlhf-cpu-test.txt")
FIXTURES = Path(__file__).parent / "fixtures" / "openrlhf"
sys.path.insert(0, str(FIXTURES))

from gpu_stubs import import_openrlhf  # noqa: E402
from orl_testkit import (  # noqa: E402
    advantages_in_prompt_order,
    openrlhf_args,
    openrlhf_maker,
    plain_generator,
    ready_for_advantages,
    response_dict,
    tiny_tokenizer,
)

ray = pytest.importorskip("ray")
import torch  # noqa: E402

(gen_mod, maker_mod, flags_mod) = import_openrlhf(
    "adora_openrlhf.backends.openrlhf.samples_generator",
    "adora_openrlhf.backends.openrlhf.experience_maker",
    "adora_openrlhf.backends.openrlhf.flags",
)
from adora_openrlhf.recipes import build_run_config  # noqa: E402

KK_LABEL = json.dumps(
    {"source": "kk", "label": "(1) Zoey is a knight\n(2) Oliver is a knave", "meta": {"names": ["Zoey", "Oliver"]}}
)
PROMPTS = [
    "Puzzle [mixed]: Zoey says Oliver lies.",
    "Puzzle [hard]: Zoey says Oliver lies.",
    "Puzzle [solved]: Zoey says Oliver lies.",
]
GENERATE_KWARGS = {"do_sample": True, "max_len": 256, "max_new_tokens": 128, "temperature": 1.0, "top_p": 1.0}


@pytest.fixture(scope="module")
def ray_cluster():
    repo = Path(__file__).resolve().parents[1]
    pythonpath = os.pathsep.join([str(repo), str(FIXTURES), os.environ.get("PYTHONPATH", "")])
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # CPU-only test cluster: keep Ray's default quiet
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={
            "env_vars": {"PYTHONPATH": pythonpath, "TOKENIZERS_PARALLELISM": "false"},
            "worker_process_setup_hook": "gpu_stubs.install_worker_stubs",
        },
    )
    yield
    ray.shutdown()


def make_engine(reward_file=None):
    from fake_engine import ScriptedRolloutEngine

    return (
        ray.remote(ScriptedRolloutEngine)
        .options(num_cpus=0)
        .remote(reward_file or flags_mod.reward_file_path(), tiny_tokenizer())
    )


def prompt_batches(prompts):
    """OpenRLHF's prompt dataloader items: (datasources, prompts, labels, images) with batch size 1."""
    return iter([(["kk"], [p], [KK_LABEL], [None]) for p in prompts])


def sampler_config(**overrides):
    values = {
        "sampling.enabled": True,
        "sampling.exit_rule": "balance",
        "sampling.n_keep": 4,
        "sampling.samples_per_round": 4,
        "sampling.max_rounds": 3,
        "sampling.positive_threshold": 0.5,
        "sampling.escalation": [{"temperature": 1.3, "min_p": 0.05}, {"temperature": 1.5, "repetition_penalty": 1.1}],
        "advantage.estimator": "dr_grpo",
    }
    values.update(overrides)
    return build_run_config("kk-tiny", values)


def generator(args, engines, cfg):
    return gen_mod.AdoraSamplesGenerator(
        strategy=type("S", (), {"args": args})(),
        prompts_dataloader=None,
        eval_dataloader=None,
        tokenizer=tiny_tokenizer(),
        vllm_engines=engines,
        run_config=cfg,
    )


def test_adaptive_rounds_escalation_and_balanced_down_sampling(ray_cluster):
    engine = make_engine()
    args = openrlhf_args("--vllm.num_engines", "1", n=4, estimator="dr_grpo", micro_batch=4)
    cfg = sampler_config()
    gen = generator(args, [engine], cfg)
    experiences, consumed, exhausted = gen._generate_vllm(prompt_batches(PROMPTS), 3, False, **GENERATE_KWARGS)
    assert consumed == 3 and not exhausted and len(experiences) == 12

    # rounds: only still-active prompts are asked again, with the escalated parameters
    requests = ray.get(engine.logged_requests.remote())
    by_round = [[r for r in requests if r["params"]["temperature"] == t] for t in (1.0, 1.3, 1.5)]
    assert [sorted(r["prompt"] for r in rnd) for rnd in by_round] == [
        sorted(PROMPTS),
        sorted(PROMPTS[1:]),
        [PROMPTS[2]],
    ]
    assert all(r["num_samples"] == 4 and r["label"] == KK_LABEL and r["max_length"] == 256 for r in requests)
    assert {r["params"]["min_p"] for r in by_round[1]} == {0.05}
    assert by_round[2][0]["params"]["repetition_penalty"] == 1.1 and by_round[2][0]["params"]["min_p"] == 0.0
    assert all(r["params"]["max_tokens"] == 128 for r in requests)

    # kept samples: n per prompt, prompt by prompt; balance keeps 2 positives + 2 negatives where it can
    prompts = [e.prompts[0] for e in experiences]
    assert prompts == [PROMPTS[0]] * 4 + [PROMPTS[1]] * 4 + [PROMPTS[2]] * 4
    scores = [float(e.scores.reshape(-1)[0]) for e in experiences]
    rewards = [float(e.rewards.reshape(-1)[0]) for e in experiences]
    assert sorted(scores[:4]) == [0, 0, 1, 1] and sorted(scores[4:8]) == [0, 0, 1, 1] and scores[8:] == [1, 1, 1, 1]
    assert set(rewards) == {3.0, -0.5}  # Logic-RL reward: correct 3.0, well-formed wrong -0.5

    # pool statistics: mixed 4 responses, hard 8 (2 correct), solved 12 (never retires: no negatives)
    info = experiences[0].info
    pool = [(float(e.info["adora/pool_count"]), float(e.info["adora/pool_mean"])) for e in experiences[::4]]
    assert pool == [(4, pytest.approx(1.25)), (8, pytest.approx((2 * 3 - 6 * 0.5) / 8)), (12, pytest.approx(3.0))]
    assert float(info["sampling/responses_generated"]) == 24
    assert float(info["sampling/rounds_used"]) == 3
    assert float(info["sampling/retired_round_0"]) == 1 and float(info["sampling/retired_round_1"]) == 1
    assert float(info["sampling/unfinished_prompts"]) == 1
    assert [float(e.info["sampling/response_round"]) for e in experiences[4:8]].count(
        1.0
    ) >= 2  # hard: positives from round 1
    assert gen.sampling_step == 1

    # the experience maker takes the baseline from the pool: dr_grpo A = r - pool mean
    maker = openrlhf_maker(args, maker_mod.AdoraExperienceMaker, run_config=cfg)
    got = [float(a[0]) for a in advantages_in_prompt_order(maker, experiences)]
    means = [1.25] * 4 + [0.375] * 4 + [3.0] * 4
    assert [got[i] for i in range(12)] == pytest.approx([r - m for r, m in zip(rewards, means, strict=True)], abs=1e-6)


def test_sampler_off_keeps_openrlhf_dynamic_filtering(ray_cluster):
    """sampling.enabled off: OpenRLHF's own generation; its DAPO filter drops all-correct / all-wrong groups
    and refills from the dataloader."""
    engine = make_engine()
    args = openrlhf_args("--vllm.num_engines", "1", "--algo.dynamic_filtering_enable", n=4, micro_batch=4)
    gen = generator(args, [engine], build_run_config("kk-tiny", {}))
    prompts = [PROMPTS[2], PROMPTS[1], PROMPTS[0]]  # solved (filtered), hard at T=1 (filtered), mixed (kept)
    experiences, consumed, exhausted = gen._generate_vllm(prompt_batches(prompts), 1, True, **GENERATE_KWARGS)
    assert consumed == 3 and exhausted is False
    assert [e.prompts[0] for e in experiences] == [PROMPTS[0]] * 4
    assert not any(key.startswith(("adora/pool", "sampling/")) for e in experiences for key in e.info)  # no sampler ran
    requests = ray.get(engine.logged_requests.remote())
    assert [r["num_samples"] for r in requests] == [4, 4, 4]


def test_evaluation_uses_openrlhf_generation(ray_cluster):
    engine = make_engine()
    args = openrlhf_args("--vllm.num_engines", "1", n=4, estimator="dr_grpo", micro_batch=4)
    gen = generator(args, [engine], sampler_config())
    gen.eval_dataloader = [(["kk"], [PROMPTS[0]], [KK_LABEL], [None])]
    samples = gen.generate_eval_samples(**{**GENERATE_KWARGS, "n_samples_per_prompt": 2})
    assert len(samples) == 2 and not any("adora/pool_count" in e.info for e in samples)
    assert gen.sampling_step == 0 and not gen._evaluating
    # pass@k = accuracy: rewards are the 0/1 scores, the K&K reward (-3..3) stays in info
    raw = [e.info[gen_mod.RAW_REWARD].item() for e in samples]
    assert [e.rewards.item() for e in samples] == [float(r > 1.0) for r in raw] and all(
        r in (-3.0, -1.0, -0.5, 3.0) for r in raw
    )
    from openrlhf.trainer.ppo_trainer import compute_eval_metrics

    logs = compute_eval_metrics(gen.eval_dataloader, samples, 2)
    assert logs["eval_kk_pass1"] == pytest.approx(sum(r > 1.0 for r in raw) / 2) == 0.5  # [mixed]: one of two right


def test_overlong_penalty_is_inside_the_pool_baseline(ray_cluster):
    """DAPO's overlong penalty is applied before the pool statistics: dr_grpo advantages sum to 0 over a pool
    (here pool = kept: the [mixed] prompt retires after one round of n = 4)."""
    engine = make_engine()
    args = openrlhf_args(
        "--vllm.num_engines",
        "1",
        "--rollout.max_new_tokens",
        "128",
        "--reward.overlong_buffer_len",
        "100",
        n=4,
        estimator="dr_grpo",
        micro_batch=4,
    )
    cfg = sampler_config(**{"sampling.samples_per_round": 4})
    experiences, _, _ = generator(args, [engine], cfg)._generate_vllm(
        prompt_batches(PROMPTS[:1]), 1, False, **GENERATE_KWARGS
    )
    assert len(experiences) == 4 and float(experiences[0].info["adora/pool_count"]) == 4
    # responses of 52 (correct) and 53 (wrong) tokens exceed 128 - 100 = 28 by 24 and 25: penalty -24/100, -25/100
    raw = sorted(float(e.info["adora/raw_reward"]) for e in experiences)
    penalised = sorted(float(e.rewards) for e in experiences)
    assert raw == [-0.5, -0.5, 3.0, 3.0] and penalised == pytest.approx([-0.75, -0.75, 2.76, 2.76])
    assert float(experiences[0].info["adora/pool_mean"]) == pytest.approx((2 * 2.76 - 2 * 0.75) / 4)

    maker = openrlhf_maker(args, maker_mod.AdoraExperienceMaker, run_config=cfg)
    batches = maker.compute_advantages_and_returns(ready_for_advantages(maker, experiences))
    advantages = [
        float(b.advantages[row][b.action_mask[row].bool()][0]) for b in batches for row in range(len(b.index))
    ]
    assert sum(advantages) == pytest.approx(0.0, abs=1e-6)  # not penalised twice, baseline centred
    assert sorted(advantages) == pytest.approx([-1.755, -1.755, 1.755, 1.755])
    assert sorted(float(r) for b in batches for r in b.info["reward"]) == pytest.approx([-0.75, -0.75, 2.76, 2.76])


def test_rollouts_without_reward_are_counted_and_fail_past_the_limit(ray_cluster, tmp_path):
    """OpenRLHF's executor returns reward None when the reward call fails: scored with the task's failure reward
    (K&K: -3, never above a wrong answer), counted, fatal past the limit."""
    failing = tmp_path / "failing_reward.py"
    failing.write_text("def reward_func(queries, prompts, labels):\n    raise RuntimeError('reward server down')\n")
    engine = make_engine(str(failing))
    args = openrlhf_args("--vllm.num_engines", "1", n=4, micro_batch=4)
    gen = generator(args, [engine], build_run_config("kk-tiny", {"max_missing_reward_fraction": 1.0}))
    experiences, consumed, _ = gen._generate_vllm(prompt_batches(PROMPTS[:1]), 1, False, **GENERATE_KWARGS)
    assert consumed == 1 and len(experiences) == 4
    assert [float(e.rewards) for e in experiences] == [-3.0] * 4
    assert [float(e.info["reward_missing"]) for e in experiences] == [1.0] * 4

    gen = generator(args, [engine], build_run_config("kk-tiny", {"max_missing_reward_fraction": 0.5}))
    with pytest.raises(
        RuntimeError,
        match=r"rewards: 4 of 4 rollouts of this batch came back without a reward .* max_missing_reward_fraction=0.5",
    ):
        gen._generate_vllm(prompt_batches(PROMPTS[:1]), 1, False, **GENERATE_KWARGS)


def test_rewarded_and_unrewarded_samples_share_info_keys():
    args = openrlhf_args(n=2)
    gen = generator(args, [], build_run_config("kk-tiny", {}))
    scored = gen._process_response_into_experience(response_dict(3, 4, 1.0, extra_logs={"correct": 1.0}))
    missing = gen._process_response_into_experience(response_dict(3, 4, None))
    assert (
        float(missing.rewards) == 0.0
        and float(missing.info["reward_missing"]) == 1.0
        and float(scored.info["reward_missing"]) == 0.0
    )
    gen_mod.align_info_keys([scored, missing])
    assert set(scored.info) == set(missing.info) and float(missing.info["correct"]) == 0.0


@pytest.mark.parametrize(
    "source, label, meta, failure",
    [("kk", "(1) Alice is a knight", {}, -3.0), ("dapo_math", "42", {"reward_style": "dapo"}, -1.0)],
)
def test_unrewarded_samples_get_their_tasks_failure_reward(source, label, meta, failure):
    """A rollout whose reward call failed never scores above a wrong answer of its task."""
    from adora_openrlhf.rewards.openrlhf_reward import encode_reward_label

    gen = generator(openrlhf_args(n=2), [], build_run_config("kk-tiny", {}))
    missing = gen._process_response_into_experience(
        response_dict(3, 4, None, label=encode_reward_label(source, label, meta))
    )
    assert (
        float(missing.rewards) == failure
        and float(missing.info["reward_missing"]) == 1.0
        and float(missing.scores) == 0.0
    )


def allocation_config(**overrides):
    values = {"sampling.n_keep": 4, "allocation.explore": 0.0, "advantage.estimator": "group_norm"}
    values.update(overrides)
    return build_run_config("kk-tiny", values)


def seen_before(gen, prompt, positives, times=3):
    """Tell the generator's allocation store that ``prompt`` gave ``positives`` of 4, ``times`` times."""
    for _ in range(times):
        gen.allocator.store.observe(gen_mod.prompt_key(prompt, KK_LABEL), positives, 4)


def test_difficulty_allocator_samples_the_candidate_with_signal_and_keeps_its_store(ray_cluster):
    """allocation.method difficulty, 3 candidates for 1 prompt: the store says [solved] always passes and [hard] never
    does, so the unseen [mixed] prompt is the one sampled; all three are consumed from the dataloader; the store learns
    the sampled group and travels in the generator's state (saved with OpenRLHF's checkpoints)."""
    engine = make_engine()
    args = openrlhf_args("--vllm.num_engines", "1", "--rollout.batch_size", "1", "--train.batch_size", "4", n=4)
    cfg = allocation_config(**{"allocation.method": "difficulty", "allocation.candidates": 3.0})
    gen = generator(args, [engine], cfg)
    gen.prompts_dataloader = [(["kk"], [p], [KK_LABEL], [None]) for p in (PROMPTS[2], PROMPTS[1], PROMPTS[0])]
    seen_before(gen, PROMPTS[2], 4)
    seen_before(gen, PROMPTS[1], 0)
    experiences, _, consumed, _ = gen.generate_samples(**GENERATE_KWARGS)
    assert consumed == 3
    assert [e.prompts[0] for e in experiences] == [PROMPTS[0]] * 4
    info = experiences[0].info
    assert float(info["adora/group_size"]) == 4 and float(info["allocation/prompts_sampled"]) == 1
    assert float(info["allocation/prompts_skipped"]) == 2 and float(info["allocation/candidates_seen_before"]) == 2
    key = gen_mod.prompt_key(PROMPTS[0], KK_LABEL)
    assert gen.allocator.store.observations(key) == 1 and gen.allocator.store.posterior(key) == (2.5, 2.5)
    state = json.loads(json.dumps(gen.state_dict()))  # JSON, as the trainer writes it
    restored = generator(args, [], cfg)
    restored.load_state_dict(state)
    assert restored.allocator.store.state_dict() == gen.allocator.store.state_dict() and restored.sampling_step == 1


def test_knapsack_groups_of_their_own_sizes_get_each_groups_own_advantages(ray_cluster):
    """allocation.method knapsack (budget 1: 2 prompts x 4 = 8 responses) over 3 candidates: groups of the sizes the
    allocator chose, each sample carrying its group's size; the experience maker's advantages of every group equal
    GRPO's on that group alone, across OpenRLHF's micro-batches."""
    from adora_openrlhf.algorithms.advantages import compute_group_advantages

    engine = make_engine()
    args = openrlhf_args("--vllm.num_engines", "1", "--rollout.batch_size", "2", "--train.batch_size", "8", n=4)
    overrides = {"allocation.method": "knapsack", "allocation.candidates": 1.5, "allocation.max_responses": 6}
    cfg = allocation_config(**overrides)
    gen = generator(args, [engine], cfg)
    gen.prompts_dataloader = [(["kk"], [p], [KK_LABEL], [None]) for p in (PROMPTS[2], PROMPTS[0], PROMPTS[1])]
    seen_before(gen, PROMPTS[2], 4)
    seen_before(gen, PROMPTS[1], 0)
    experiences, _, consumed, _ = gen.generate_samples(**GENERATE_KWARGS)
    sizes, start = [], 0
    while start < len(experiences):
        sizes.append(int(experiences[start].info["adora/group_size"]))
        start += sizes[-1]
    # the unseen [mixed] prompt gets the most responses; [solved] and [hard] tie, the earlier candidate is taken
    assert consumed == 3 and sizes == [3, 5]
    assert [e.prompts[0] for e in experiences] == [PROMPTS[2]] * 3 + [PROMPTS[0]] * 5
    rewards = [float(e.rewards.reshape(-1)[0]) for e in experiences]

    maker = openrlhf_maker(args, maker_mod.AdoraExperienceMaker, run_config=cfg)
    got = [float(a[0]) for a in advantages_in_prompt_order(maker, experiences)]
    expected = torch.cat(
        [
            compute_group_advantages(part.unsqueeze(0), "group_norm", cfg.advantage.eps)[0][0]
            for part in torch.tensor(rewards).split(sizes)
        ]
    )
    assert [got[i] for i in range(8)] == pytest.approx(expected.tolist(), abs=1e-5)


def test_sampler_state_is_saved_and_restored_with_openrlhfs_checkpoints(ray_cluster, tmp_path):
    """AdoraPPOTrainer writes the generator's state as JSON into OpenRLHF's checkpoint folder and restores it on resume
    (OpenRLHF's own save_logs_and_checkpoints / init_checkpoint_states; the actor group keeps DeepSpeed's client states
    in memory and makes the folder as DeepSpeed does). Nothing of ours goes into DeepSpeed's pickled client states; a
    sampler-state file that is not the trainer's JSON (a pickle, say) is refused naming it, never unpickled."""
    import pickle

    (trainer_mod,) = import_openrlhf("adora_openrlhf.backends.openrlhf.trainer")

    class MemoryActorGroup:  # the DeepSpeed checkpoint of the actor group: client_states in, client_states out
        def __init__(self):
            self.saved = None

        def async_run_method(self, method_name, **kwargs):
            if method_name == "save_checkpoint":
                self.saved = kwargs["client_states"]
                (tmp_path / "_actor" / kwargs["tag"]).mkdir(parents=True, exist_ok=True)
                (tmp_path / "_actor" / "latest").write_text(kwargs["tag"])
                return [ray.put(None)]
            assert method_name == "get_checkpoint_states"
            return [ray.put(self.saved)]

    args = openrlhf_args("--ckpt.path", str(tmp_path), "--ckpt.save_steps", "1", "--ckpt.load_enable", n=4)
    cfg = sampler_config(**{"sampling.pool_scope": "history"})

    def trainer():
        t = trainer_mod.AdoraPPOTrainer.__new__(trainer_mod.AdoraPPOTrainer)
        t.args, t.samples_generator, t.critic_model_group = args, generator(args, [], cfg), None
        t.run_config, t.output_dir, t.metrics_log, t.eval_dataloader = cfg, tmp_path, None, None
        t.wandb_logger = t.tensorboard_logger = None
        t.best_eval_metric_key, t.best_eval_metric_value, t._latest_eval_metric_value = "", None, None
        return t

    first = trainer()
    first.actor_model_group = MemoryActorGroup()
    first.samples_generator.sampling_step = 7
    first.samples_generator.sampler.load_state_dict({"history": {"'q'": ("q", 3, 2.0, 2.0)}})
    first.save_logs_and_checkpoints(
        7, {}, {"episode": 0, "global_step": 7, "total_consumed_prompts": 28, "data_loader_state_dict": {}}
    )

    saved_file = tmp_path / "_actor" / "global_step7" / trainer_mod.SAMPLER_STATE_FILE
    assert json.loads(saved_file.read_text()) == first.samples_generator.state_dict()
    assert not any(key.startswith("adora") for key in first.actor_model_group.saved)  # not in DeepSpeed's pickle
    resumed = trainer()
    resumed.actor_model_group = first.actor_model_group
    states = resumed.init_checkpoint_states()
    assert states["global_step"] == 7 and resumed.samples_generator.sampling_step == 7
    assert resumed.samples_generator.state_dict() == first.samples_generator.state_dict()
    # metrics.jsonl reopened at the resumed step
    assert resumed.last_step == 7 and resumed.metrics_log.path == tmp_path / "metrics.jsonl"

    class Payload:
        def __reduce__(self):
            return (exec, (f"open({str(tmp_path / 'ran')!r}, 'w').write('ran')",))

    for crafted in (
        pickle.dumps({"sampling_step": 7, "payload": Payload()}),
        b'{"sampling_step": "7", "sampler": {}}',
        b"[1, 2]",
        b'{"sampling_step": 7, "sampler": {}, "allocation": {"posteriors": [["q", NaN, 1.0, 2]]}}',
    ):
        saved_file.write_bytes(crafted)
        with pytest.raises(ValueError, match=f"^{saved_file}: "):
            trainer().saved_sampler_state(7)
    with pytest.raises(ValueError, match=r"field allocation: allocation store: posteriors\[0\]: a must be a finite"):
        trainer().saved_sampler_state(7)
    assert not (tmp_path / "ran").exists()

    saved_file.write_text(json.dumps(first.samples_generator.state_dict()))
    allocating = trainer()
    allocating.run_config = allocation_config(**{"allocation.method": "difficulty", "allocation.candidates": 2.0})
    with pytest.raises(ValueError, match=f"^{saved_file}: field allocation is missing"):
        allocating.saved_sampler_state(7)  # a run that allocates rollouts saves the allocator's store with its state

    saved_file.unlink()  # a save interrupted before the state was written: the step counter, an empty history
    interrupted = trainer()
    interrupted.actor_model_group = first.actor_model_group
    interrupted.init_checkpoint_states()
    assert interrupted.samples_generator.sampling_step == 7
    assert interrupted.samples_generator.sampler.state_dict() == {"history": {}}


def test_missing_reward_is_a_clear_error():
    args = openrlhf_args(n=4)
    experience = plain_generator(args)._process_response_into_experience(
        {
            "prompt": "p",
            "label": "l",
            "images": None,
            "mm_train_inputs": None,
            "observation_tokens": [1, 2, 3],
            "action_ranges": [(1, 3)],
            "rollout_log_probs": None,
            "truncated": False,
            "reward": None,
            "scores": None,
            "extra_logs": {},
        }
    )
    assert args.reward.remote_url
    with pytest.raises(ValueError, match="without a reward; adaptive sampling needs the reward at rollout time"):
        gen_mod.scored_response(experience, 0.5)


def test_vllm_params_carry_every_escalated_field():
    from adora_openrlhf.config import SamplingParams

    params = gen_mod.vllm_sampling_params(
        SamplingParams(temperature=1.4, top_p=0.9, top_k=50, min_p=0.1, repetition_penalty=1.2),
        {"max_new_tokens": 64},
        logprobs=True,
    )
    assert (params.temperature, params.top_p, params.top_k, params.min_p, params.repetition_penalty) == (
        1.4,
        0.9,
        50,
        0.1,
        1.2,
    )
    assert (
        params.max_tokens == 64
        and params.min_tokens == 1
        and params.logprobs == 1
        and params.skip_special_tokens is False
    )


def test_trainer_actor_builds_our_classes_in_its_own_process(ray_cluster, tmp_path):
    from transformers import Qwen2Config

    (launcher,) = import_openrlhf("adora_openrlhf.backends.openrlhf.launcher")
    (trainer_mod, utils_mod) = import_openrlhf("adora_openrlhf.backends.openrlhf.trainer", "openrlhf.utils.utils")

    model_dir = tmp_path / "model"  # tokenizer + config only: the trainer actor loads no weights
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    tokenizer.save_pretrained(model_dir)
    Qwen2Config(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    ).save_pretrained(model_dir)
    data = tmp_path / "train.jsonl"
    with data.open("w") as handle:
        for prompt in PROMPTS:
            handle.write(json.dumps({"prompt": [{"role": "user", "content": prompt}], "reward_label": KK_LABEL}) + "\n")

    cfg = build_run_config(
        "dapo-math-adora",
        {
            "model.path": str(model_dir),
            "data.train_path": str(data),
            "data.eval_path": None,
            "output_dir": str(tmp_path / "out"),
            "prompts_per_step": 3,
            "sampling.max_rounds": 3,
            "sampling.samples_per_round": 4,
            "sampling.escalation": [{"temperature": 1.3}],
            "rollout.max_new_tokens": 128,
            "data.max_prompt_tokens": 128,
        },
    )
    argv, args, cfg = launcher.prepare(
        cfg,
        [
            "--actor.num_gpus_per_node",
            "1",
            "--vllm.num_engines",
            "1",
            "--rollout.micro_batch_size",
            "4",
            "--train.batch_size",
            "12",
            "--reward.overlong_buffer_len",
            "64",
        ],
    )
    strategy = utils_mod.get_strategy(args)
    engine = make_engine()
    actor = trainer_mod.RemoteAdoraPPOTrainer.options(num_cpus=0).remote(
        cfg.model.path,
        strategy,
        None,
        None,
        None,
        None,
        [engine],
        do_sample=True,
        max_len=args.data.max_len,
        max_new_tokens=args.rollout.max_new_tokens,
        temperature=args.rollout.temperature,
        top_p=args.rollout.top_p,
    )
    classes = ray.get(actor.component_classes.remote())
    assert classes == {
        "samples_generator": "adora_openrlhf.backends.openrlhf.samples_generator.AdoraSamplesGenerator",
        "experience_maker": "adora_openrlhf.backends.openrlhf.experience_maker.AdoraExperienceMaker",
    }
    # OpenRLHF's prepare_datasets ran
    assert ray.get(actor.get_max_steps.remote()) == 3 * 4 // 12 * args.train.num_episodes

    def one_batch(trainer):  # runs inside the trainer actor's process
        samples, _, consumed, _ = trainer.samples_generator.generate_samples(**trainer.generate_kwargs)
        return (
            consumed,
            [
                (s.prompts[0].strip(), float(s.scores.reshape(-1)[0]), float(s.info["adora/pool_count"]))
                for s in samples
            ],
            os.getpid(),
        )

    consumed, samples, actor_pid = ray.get(actor.__ray_call__.remote(one_batch))
    assert actor_pid != os.getpid() and consumed == 3 and len(samples) == 12
    assert {p for p, _, _ in samples} == set(PROMPTS)  # chat template: the message text + newline
    pools = {p: count for p, _, count in samples}
    assert pools == {PROMPTS[0]: 4.0, PROMPTS[1]: 8.0, PROMPTS[2]: 12.0}


def test_a_step_whose_policy_loss_is_not_finite_stops_the_run():
    """OpenRLHF would go on training from a NaN policy (DeepSpeed's stage 3 reports the NaN gradient's norm as -1);
    the trainer stops at the step, naming the statistic, the step and what to check."""
    (trainer_mod,) = import_openrlhf("adora_openrlhf.backends.openrlhf.trainer")

    trainer_mod.check_finite_step({"policy_loss": 0.25, "ppo_kl": 0.0, "actor_lr": 1e-6}, step=3)
    trainer_mod.check_finite_step({"actor_lr": 1e-6}, step=1)  # a frozen actor's step has no policy loss
    for key, value in (("policy_loss", float("nan")), ("ppo_kl", float("inf"))):
        with pytest.raises(
            trainer_mod.PolicyNotFinite, match=rf"the policy's {key} is {value} at step 2: .*--model.path"
        ):
            trainer_mod.check_finite_step({"policy_loss": 0.1, "ppo_kl": 0.0, key: value}, step=2)
