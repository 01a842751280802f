"""AdoraExperienceMaker on real OpenRLHF 0.11 Experience objects (CPU).

Experiences are built by OpenRLHF's own response -> Experience conversion and micro-batched by OpenRLHF's
own ``split_rollout_samples``; advantages are compared with a hand computation and, with ADORA and the
sampler off, with OpenRLHF's own ``compute_advantages_and_returns`` bit for bit.
"""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("openrlhf", reason="needs requirements/openrlhf-cpu-test.txt")
pytest.importorskip("deepspeed", reason="needs requirements/openrlhf-cpu-test.txt")
sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "openrlhf"))

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_stubs import import_openrlhf
from orl_testkit import openrlhf_args, openrlhf_maker, ready_for_advantages, response_dict, rollout_experiences

(ours,) = import_openrlhf("adora_openrlhf.backends.openrlhf.experience_maker")
from adora_openrlhf.recipes import build_run_config  # noqa: E402


def run_config(**overrides):
    """kk-tiny with the correctness threshold of the 0/1 rewards used in these rollouts."""
    return build_run_config("kk-tiny", {"adora.correct_threshold": 0.5, **overrides})


def advantages_by_sample(batches) -> list[torch.Tensor]:
    """Token advantages of every sample (action tokens only), in prompt order."""
    out = {}
    for batch in batches:
        for row, index in enumerate(batch.index):
            mask = batch.action_mask[row].bool()
            out[index] = batch.advantages[row][mask]
    return [out[i] for i in sorted(out)]


def scalar_by_sample(batches) -> list[float]:
    values = []
    for adv in advantages_by_sample(batches):
        assert torch.all(adv == adv[0]), "the advantage must be the same on every response token (no KL term)"
        values.append(float(adv[0]))
    return values


# ---------------------------------------------------------------------------------------------------------
# Hand computation: group_norm + ADORA length rule (attenuate, lambda 0.1), truncated negatives dropped
# ---------------------------------------------------------------------------------------------------------

# three prompts, n = 4: (response length, reward, score, truncated)
GROUPS = [
    # max correct length 10 > mean wrong length (4+6+8)/3 = 6 -> TAS, weight 1
    [(10, 1.0, 1.0, False), (4, 0.0, 0.0, False), (6, 0.0, 0.0, False), (8, 0.0, 0.0, False)],
    # max correct length 5 <= mean wrong length (9+7)/2 = 8 -> TDS, weight 0.1
    [(3, 1.0, 1.0, False), (5, 1.0, 1.0, False), (9, 0.0, 0.0, False), (7, 0.0, 0.0, False)],
    # the truncated wrong answer (20 tokens) is not counted: mean wrong = (2+3)/2 = 2.5 < 6 -> TAS, weight 1
    [(6, 1.0, 1.0, False), (20, 0.0, 0.0, True), (2, 0.0, 0.0, False), (3, 0.0, 0.0, False)],
]


def responses_for(groups):
    out = []
    for g, group in enumerate(groups):
        for length, reward, score, truncated in group:
            out.append(
                response_dict(
                    prompt_len=3 + g,
                    response_len=length,
                    reward=reward,
                    score=score,
                    truncated=truncated,
                    prompt=f"prompt {g}",
                )
            )
    return out


def test_hand_computed_group_norm_with_adora_length_rule():
    args = openrlhf_args(n=4, micro_batch=3)
    cfg = run_config(
        **{"adora.enabled": True, "adora.rule": "length", "adora.mode": "attenuate", "adora.lambda_att": 0.1}
    )
    maker = openrlhf_maker(args, ours.AdoraExperienceMaker, run_config=cfg)
    batches = ready_for_advantages(maker, rollout_experiences(args, responses_for(GROUPS)))
    maker.compute_advantages_and_returns(batches)

    # group 0 rewards [1,0,0,0]: mean 1/4, unbiased std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    a0 = [0.75 / (0.5 + 1e-9), -0.25 / (0.5 + 1e-9), -0.25 / (0.5 + 1e-9), -0.25 / (0.5 + 1e-9)]
    # group 1 rewards [1,1,0,0]: mean 1/2, std sqrt(4 * 0.25 / 3) = 1/sqrt(3); TDS -> times 0.1
    s1 = math.sqrt(1 / 3)
    a1 = [0.1 * 0.5 / (s1 + 1e-9)] * 2 + [0.1 * -0.5 / (s1 + 1e-9)] * 2
    expected = a0 + a1 + a0  # group 2 has group 0's rewards and is TAS
    assert scalar_by_sample(batches) == pytest.approx(expected, rel=1e-6, abs=1e-7)

    weights = torch.cat([b.info["adora/weight"] for b in batches])
    order = torch.cat([torch.tensor(b.index) for b in batches])
    by_sample = torch.empty_like(weights)
    by_sample[order] = weights
    assert by_sample.tolist() == pytest.approx([1.0] * 4 + [0.1] * 4 + [1.0] * 4)
    tas = torch.cat([b.info["adora/tas"] for b in batches])
    assert float(tas.mean()) == pytest.approx(2 / 3)
    assert float(batches[0].info["adora/tds_fraction"][0]) == pytest.approx(1 / 3)
    assert torch.cat([b.info["group_reward_std"] for b in batches]).numel() == 12


def test_counting_truncated_negatives_flips_the_class():
    args = openrlhf_args(n=4, micro_batch=4)
    cfg = run_config(**{"adora.enabled": True, "adora.drop_truncated_negatives": False})
    maker = openrlhf_maker(args, ours.AdoraExperienceMaker, run_config=cfg)
    batches = ready_for_advantages(maker, rollout_experiences(args, responses_for(GROUPS[2:])))
    maker.compute_advantages_and_returns(batches)
    # mean wrong length now (20+2+3)/3 = 8.33 >= 6 -> TDS
    assert scalar_by_sample(batches) == pytest.approx([0.1 * 1.5, 0.1 * -0.5, 0.1 * -0.5, 0.1 * -0.5], rel=1e-6)


def test_pool_statistics_from_the_sampler_set_the_baseline():
    """dr_grpo with pool statistics: A = r - pool mean (the kept 4 of an 8-response pool)."""
    args = openrlhf_args(n=4, estimator="dr_grpo", micro_batch=2)
    cfg = run_config(**{"advantage.estimator": "dr_grpo"})
    maker = openrlhf_maker(args, ours.AdoraExperienceMaker, run_config=cfg)
    experiences = rollout_experiences(args, responses_for(GROUPS[:1]))
    for e in experiences:  # what AdoraSamplesGenerator writes: pool of 8 with 3 positives
        e.info[ours.POOL_COUNT] = torch.tensor([8.0])
        e.info[ours.POOL_MEAN] = torch.tensor([3 / 8])
        e.info[ours.POOL_STD] = torch.tensor([math.sqrt((3 * (5 / 8) ** 2 + 5 * (3 / 8) ** 2) / 7)])
    batches = ready_for_advantages(maker, experiences)
    maker.compute_advantages_and_returns(batches)
    assert scalar_by_sample(batches) == pytest.approx([1 - 3 / 8, -3 / 8, -3 / 8, -3 / 8], rel=1e-6)


# ---------------------------------------------------------------------------------------------------------
# Everything off: exactly OpenRLHF's own result
# ---------------------------------------------------------------------------------------------------------


def both_paths(args, responses, cfg, seed=0):
    """(OpenRLHF's batches, ours) after compute_advantages_and_returns on identical inputs."""
    theirs_maker = openrlhf_maker(args)
    ours_maker = openrlhf_maker(args, ours.AdoraExperienceMaker, run_config=cfg)
    experiences = rollout_experiences(args, responses)
    theirs = ready_for_advantages(theirs_maker, copy.deepcopy(experiences))
    mine = ready_for_advantages(ours_maker, copy.deepcopy(experiences))
    return theirs_maker.compute_advantages_and_returns(theirs), ours_maker.compute_advantages_and_returns(mine)


@pytest.mark.parametrize("estimator", ["group_norm", "dr_grpo", "rloo", "reinforce_baseline"])
def test_equals_openrlhf_exactly_with_adora_off(estimator):
    args = openrlhf_args(n=4, estimator=estimator, micro_batch=3)
    cfg = run_config(**{"advantage.estimator": estimator})
    responses = responses_for(GROUPS) + responses_for(
        [[(5, 0.5, 0.0, False), (7, 2.0, 1.0, False), (2, -1.0, 0.0, True), (9, 0.25, 0.0, False)]]
    )
    theirs, mine = both_paths(args, responses, cfg)
    for a, b in zip(theirs, mine, strict=True):
        assert torch.equal(a.advantages, b.advantages)
        assert torch.equal(a.returns, b.returns)
        assert torch.equal(a.info["return"], b.info["return"])
        assert torch.equal(a.info["group_reward_std"], b.info["group_reward_std"])


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 5), groups=st.integers(1, 4), micro=st.integers(1, 6), data=st.data())
def test_group_norm_equals_openrlhf_for_any_rollout(n, groups, micro, data):
    """Property: ADORA off, any rewards (including uniform groups), any micro-batching -> identical tensors."""
    values = st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, -1.0, 3.0])
    rewards = data.draw(st.lists(values, min_size=n * groups, max_size=n * groups))
    lengths = data.draw(st.lists(st.integers(1, 12), min_size=n * groups, max_size=n * groups))
    responses = [
        response_dict(prompt_len=2 + i // n, response_len=length, reward=r, score=float(r > 0.5), prompt=f"q{i // n}")
        for i, (r, length) in enumerate(zip(rewards, lengths, strict=True))
    ]
    args = openrlhf_args(n=n, micro_batch=micro)
    theirs, mine = both_paths(args, responses, run_config())
    for a, b in zip(theirs, mine, strict=True):
        assert torch.equal(a.advantages, b.advantages)
        assert torch.equal(a.returns, b.returns)


def test_dynamic_batching_order_is_respected():
    """Micro-batches re-ordered by sequence length (--train.dynamic_batch_enable) still group by prompt."""
    args = openrlhf_args(
        "--train.dynamic_batch_enable",
        "--vllm.num_engines",
        "1",
        "--ds.attn_implementation",
        "eager",
        "--rollout.max_tokens_per_gpu",
        "40",
        n=4,
    )
    cfg = run_config(**{"adora.enabled": True})
    maker = openrlhf_maker(args, ours.AdoraExperienceMaker, run_config=cfg)
    batches = ready_for_advantages(maker, rollout_experiences(args, responses_for(GROUPS)))
    assert len(batches) > 1 and any(
        b.index != sorted(b.index) or b.index[-1] - b.index[0] >= len(b.index) for b in batches
    )
    maker.compute_advantages_and_returns(batches)
    a0 = [1.5, -0.5, -0.5, -0.5]
    s1 = math.sqrt(1 / 3)
    a1 = [0.05 / s1] * 2 + [-0.05 / s1] * 2
    assert scalar_by_sample(batches) == pytest.approx(a0 + a1 + a0, rel=1e-6)


def test_non_group_estimators_are_left_to_openrlhf():
    """flash_reinforce (no group); gae and reinforce: tests/test_openrlhf_token_estimators.py."""
    args = openrlhf_args(n=4, estimator="flash_reinforce")
    maker = openrlhf_maker(args, ours.AdoraExperienceMaker, run_config=run_config())
    assert not maker.uses_core() and not maker.uses_token_estimator()
    batches = ready_for_advantages(maker, rollout_experiences(args, responses_for(GROUPS[:1])))
    maker.compute_advantages_and_returns(batches)
    assert not any(key.startswith("adora/") for b in batches for key in b.info)


def test_rollout_that_does_not_form_groups_is_rejected():
    args = openrlhf_args(n=4)
    maker = openrlhf_maker(args, ours.AdoraExperienceMaker, run_config=run_config())
    batches = ready_for_advantages(maker, rollout_experiences(args, responses_for(GROUPS)[:6]))
    with pytest.raises(ValueError, match="n_samples_per_prompt: 6 samples do not form groups of 4"):
        maker.compute_advantages_and_returns(batches)


@settings(max_examples=15, deadline=None)
@given(
    micro=st.integers(1, 12),
    rule=st.sampled_from(["length", "difficulty"]),
    mode=st.sampled_from(["attenuate", "amplify"]),
)
def test_adora_advantages_do_not_depend_on_micro_batching(micro, rule, mode):
    """Property: the per-sample advantages are a function of the rollout, not of how it is split."""
    cfg = run_config(**{"adora.enabled": True, "adora.rule": rule, "adora.mode": mode})

    def scalars(micro_batch):
        args = openrlhf_args(n=4, micro_batch=micro_batch)
        maker = openrlhf_maker(args, ours.AdoraExperienceMaker, run_config=cfg)
        batches = ready_for_advantages(maker, rollout_experiences(args, responses_for(GROUPS)))
        maker.compute_advantages_and_returns(batches)
        return scalar_by_sample(batches)

    reference = scalars(1)
    assert scalars(micro) == reference
    plain = scalar_by_sample(both_paths(openrlhf_args(n=4, micro_batch=micro), responses_for(GROUPS), run_config())[0])
    assert all(
        abs(a) <= abs(p) * (cfg.adora.lambda_amp if mode == "amplify" else 1) + 1e-9
        for a, p in zip(reference, plain, strict=True)
    )
    # weights never flip signs
    assert all((a > 0) == (p > 0) and (a < 0) == (p < 0) for a, p in zip(reference, plain, strict=True))


# ---------------------------------------------------------------------------------------------------------
# Correctness signal, length penalties, gamma
# ---------------------------------------------------------------------------------------------------------


def test_adora_reads_the_configured_threshold_on_the_raw_reward():
    """K&K-scale rewards from a source without scores (OpenRLHF copies rewards into scores): 3.0 is correct, the
    well-formed wrong answers score 0.8 <= correct_threshold 1.0. max correct length 10 > mean wrong length 6 -> TAS."""
    group = [(10, 3.0, None, False), (4, 0.8, None, False), (6, 0.8, None, False), (8, 0.8, None, False)]
    responses = [
        response_dict(prompt_len=3, response_len=n, reward=r, score=s, truncated=t, prompt="q") for n, r, s, t in group
    ]
    args = openrlhf_args(n=4, estimator="dr_grpo", micro_batch=4)
    cfg = build_run_config(
        "kk-tiny", {"adora.enabled": True, "adora.correct_threshold": 1.0, "advantage.estimator": "dr_grpo"}
    )
    maker = openrlhf_maker(args, ours.AdoraExperienceMaker, run_config=cfg)
    batches = maker.compute_advantages_and_returns(ready_for_advantages(maker, rollout_experiences(args, responses)))
    assert float(batches[0].info["adora/tas_fraction"][0]) == 1.0
    assert scalar_by_sample(batches) == pytest.approx([1.65, -0.55, -0.55, -0.55])  # weight 1: r - 1.35


def test_length_penalties_applied_by_the_generator_are_not_applied_again():
    args = openrlhf_args(
        "--rollout.max_new_tokens", "10", "--reward.overlong_buffer_len", "5", n=2, estimator="dr_grpo", micro_batch=2
    )
    cfg = run_config(**{"advantage.estimator": "dr_grpo"})
    responses = [
        response_dict(prompt_len=3, response_len=9, reward=1.0, prompt="q"),
        response_dict(prompt_len=3, response_len=4, reward=0.0, prompt="q"),
    ]

    fresh = openrlhf_maker(args, ours.AdoraExperienceMaker, run_config=cfg)  # no mark: penalised here, 9 tokens -> -4/5
    batches = fresh.compute_advantages_and_returns(ready_for_advantages(fresh, rollout_experiences(args, responses)))
    assert scalar_by_sample(batches) == pytest.approx([(0.2 - 0.0) / 2, -(0.2 - 0.0) / 2])
    assert [float(r) for r in batches[0].info["adora/raw_reward"]] == [1.0, 0.0]

    marked = rollout_experiences(args, responses)
    for e in marked:
        e.info[ours.LENGTH_PENALIZED] = torch.ones(1)
    maker = openrlhf_maker(args, ours.AdoraExperienceMaker, run_config=cfg)
    batches = maker.compute_advantages_and_returns(ready_for_advantages(maker, marked))
    assert scalar_by_sample(batches) == pytest.approx([0.5, -0.5])


def test_gamma_override_is_warned(caplog):
    args = openrlhf_args("--algo.advantage.gamma", "0.9", n=4, micro_batch=4)
    maker = openrlhf_maker(args, ours.AdoraExperienceMaker, run_config=run_config())
    with caplog.at_level("WARNING", logger=ours.__name__):
        maker.compute_advantages_and_returns(
            ready_for_advantages(maker, rollout_experiences(args, responses_for(GROUPS[:1])))
        )
    assert args.algo.advantage.gamma == 1.0
    assert "algo.advantage.gamma=0.9 is set to 1.0" in caplog.text


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("sizes", [None, [2, 6, 4]])
def test_two_ranks_get_the_advantages_of_a_one_rank_run(dynamic, sizes):
    """Data parallelism: the experience maker writes the advantages of the whole rollout before OpenRLHF hands its
    micro-batches to the ranks (``async_run_method_batch``: consecutive chunks, one per rank), so every sample's
    advantage is the one-rank run's, however the rollout is split (dynamic batching partitions it by length into a
    multiple of the rank count) and for groups of their own sizes (a rollout allocator's ``adora/group_size``)."""
    cfg = run_config(**{"adora.enabled": True, "adora.rule": "length", "adora.lambda_att": 0.1})
    extra = ("--train.dynamic_batch_enable", "--rollout.max_tokens_per_gpu", "40") if dynamic else ()

    def scalars(ranks: int) -> tuple[list[float], int]:
        args = openrlhf_args(
            *extra, "--vllm.num_engines", "1", "--actor.num_gpus_per_node", str(ranks), n=4, micro_batch=3
        )
        maker = openrlhf_maker(args, ours.AdoraExperienceMaker, run_config=cfg)
        experiences = rollout_experiences(args, responses_for(GROUPS))
        if sizes is not None:
            per_sample = [size for size in sizes for _ in range(size)]
            for experience, size in zip(experiences, per_sample, strict=True):
                experience.info[ours.GROUP_SIZE] = torch.tensor([float(size)])
        batches = ready_for_advantages(maker, experiences)
        maker.compute_advantages_and_returns(batches)
        return scalar_by_sample(batches), len(batches)

    one, _ = scalars(1)
    two, micro_batches = scalars(2)
    assert two == one and micro_batches >= 2
    if sizes is not None:  # the first group (2 samples: one correct, one wrong) is normalised on its own
        assert one[:2] == pytest.approx([0.7071, -0.7071], abs=1e-3)


def test_staleness_is_the_step_minus_the_generating_policy_version():
    """Each sample carries the policy version of the engines that generated it (``adora/policy_version``); the trainer
    logs this step's version minus the samples' (0 in the synchronous loop, up to the queue size in the asynchronous
    one) and hands the engines ``global_step + 1`` with the broadcast that ends the step. The step's rollout list
    carries the generator's state through Ray's queue (pickled) to the checkpoint of the step that trains on it."""
    import pickle

    (trainer_mod, generator_mod) = import_openrlhf(
        "adora_openrlhf.backends.openrlhf.trainer", "adora_openrlhf.backends.openrlhf.samples_generator"
    )

    class OpenRLHFStep:  # stands for BasePPOTrainer.train_step, which broadcasts the step's weights
        def train_step(self, rollout_samples, global_step):
            self.broadcast_version = self.policy_version
            return {"policy_loss": 0.5}, global_step + 1

    class Trainer(trainer_mod.AdoraTrainerRecords, OpenRLHFStep):
        pass

    samples = []
    for version in (3.0, 2.0, 3.0):
        experience = rollout_experiences(openrlhf_args(), [response_dict(3, 2, 1.0)])[0]
        experience.info[generator_mod.POLICY_VERSION] = torch.tensor([version])
        samples.append(experience)
    rollout = pickle.loads(pickle.dumps(generator_mod.StepRollout(samples, sampler_state={"sampling_step": 4})))
    assert isinstance(rollout, list) and rollout.sampler_state == {"sampling_step": 4} and len(rollout) == 3
    trainer = Trainer()
    status, next_step = trainer.train_step(rollout, 3)
    assert next_step == 4 and trainer.broadcast_version == 4
    assert status["async/staleness_mean"] == pytest.approx(1 / 3) and status["async/staleness_max"] == 1.0
    assert status["policy_loss"] == 0.5
    status, _ = trainer.train_step([], 0)  # samples without versions (no engines): nothing logged
    assert "async/staleness_max" not in status


def test_is_correction_reweights_the_loss_of_rollouts_from_an_older_policy():
    """Asynchronous training trains on batches an older policy generated: vLLM's log-probs of the sampled tokens
    (``rollout_log_probs``, asked for by ``--algo.advantage.is_correction_level``) differ from the trainer's
    (``action_log_probs``, PPO's old policy). Our experience maker writes the advantages (ADORA on) and keeps both
    on OpenRLHF's micro-batches, row for row; OpenRLHF's PolicyLoss, built from the flags as its actor builds it,
    then applies the correction: each token's loss x pi_train / pi_rollout, tokens outside [0.5, 2] dropped
    (mode mask), ``vllm_kl`` and ``is_filter_ratio`` logged. Hand computation: the trainer's log-prob is the
    engine's + 0.1 on every response token (weight e^0.1, kept) but the first (+1.0: weight e > 2, dropped)."""
    (loss_mod,) = import_openrlhf("openrlhf.models.loss")
    correction = ["--algo.advantage.is_correction_level", "token", "--algo.advantage.is_correction_threshold"]
    args = openrlhf_args(*correction, "0.5", "2.0", "--algo.kl.unbiased_gradient", n=4, micro_batch=3)
    cfg = run_config(**{"adora.enabled": True, "adora.rule": "length", "adora.lambda_att": 0.1})
    maker = openrlhf_maker(args, ours.AdoraExperienceMaker, run_config=cfg)
    responses = responses_for(GROUPS)
    for r in responses:  # the engine's log-prob of every observation token (OpenRLHF drops the first)
        r["rollout_log_probs"] = [-1.0 - 0.1 * (i % 3) for i in range(len(r["observation_tokens"]))]
    batches = ready_for_advantages(maker, rollout_experiences(args, responses))
    for batch in batches:
        first = torch.zeros_like(batch.action_mask, dtype=torch.bool)
        first[torch.arange(len(first)), batch.action_mask.int().argmax(dim=1)] = True
        batch.action_log_probs = batch.rollout_log_probs + torch.where(first, 1.0, 0.1) * batch.action_mask
        batch.first_token = first
    trainer_log_probs = [b.action_log_probs.clone() for b in batches]
    maker.compute_advantages_and_returns(batches)
    policy_loss = loss_mod.PolicyLoss(
        clip_eps_low=args.actor.eps_clip_low_high[0],
        clip_eps_high=args.actor.eps_clip_low_high[1],
        token_level_loss=args.actor.loss_agg_mode == "token-mean",
        is_correction_level=args.algo.advantage.is_correction_level,
        is_correction_mode=args.algo.advantage.is_correction_mode,
        is_correction_gating=args.algo.advantage.is_correction_gating,
        is_correction_threshold=args.algo.advantage.is_correction_threshold,
    )
    uncorrected = loss_mod.PolicyLoss()
    tokens = sum(float(b.action_mask.sum()) for b in batches)
    firsts = sum(len(b.index) for b in batches)
    gap = (tokens - firsts) / tokens * 0.1 + firsts / tokens * 1.0
    changed = []
    for batch, before in zip(batches, trainer_log_probs, strict=True):
        # the KL loss's unbiased gradient weighs by pi / pi_old with these: left as OpenRLHF computed them
        assert torch.equal(batch.action_log_probs, before)
        assert float(batch.info[ours.ENGINE_LOGPROB_GAP][0]) == pytest.approx(gap, rel=1e-5)
        mask = batch.action_mask.float()
        # first PPO epoch: the policy is the trainer's old policy, ratio 1, per-token loss -A
        loss, _, _, vllm_kl, filtered = policy_loss(
            batch.action_log_probs, batch.action_log_probs, batch.advantages, batch.action_mask, batch.rollout_log_probs
        )
        weight = torch.where(batch.first_token, 0.0, math.exp(0.1))
        expected = float((weight * -batch.advantages * mask).sum() / mask.sum())
        assert float(loss) == pytest.approx(expected, rel=1e-5)
        plain, *_ = uncorrected(batch.action_log_probs, batch.action_log_probs, batch.advantages, batch.action_mask)
        assert float(plain) == pytest.approx(float((-batch.advantages * mask).sum() / mask.sum()), rel=1e-5)
        changed.append(abs(float(loss) - float(plain)) > 1e-3)
        assert float(filtered) == pytest.approx(len(batch.index) / float(mask.sum()), rel=1e-5)
        expected_kl = float((torch.where(batch.first_token, -1.0, -0.1) * mask).sum() / mask.sum())
        assert float(vllm_kl) == pytest.approx(expected_kl, rel=1e-5)
    assert any(changed)  # the correction changed the loss
