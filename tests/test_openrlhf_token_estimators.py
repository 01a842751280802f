"""AdoraExperienceMaker with OpenRLHF's token estimators ``gae`` (a critic) and ``reinforce`` (REINFORCE++), on real
OpenRLHF 0.11 Experience objects (CPU).

ADORA's group weight lands where ALGORITHMS.md section 6 puts it: after GAE and before OpenRLHF's batch whitening
(``gae``), after the whitening (``reinforce``); the returns (the critic's targets) are never weighted. Checked
against a hand computation, against OpenRLHF's own ``compute_advantages_and_returns`` with ADORA off (bit for bit),
and against the local backend's ``compute_token_advantages`` with ADORA on.
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

from gpu_stubs import import_openrlhf
from orl_testkit import openrlhf_args, openrlhf_maker, ready_for_advantages, response_dict, rollout_experiences

(ours,) = import_openrlhf("adora_openrlhf.backends.openrlhf.experience_maker")
from adora_openrlhf.algorithms.token_advantages import TokenParams, compute_token_advantages  # noqa: E402
from adora_openrlhf.recipes import build_run_config  # noqa: E402

# two prompts, n = 2: (response length, reward)
#   group 0: the correct response (3 tokens) is longer than the wrong one (1) -> TAS, weight 1
#   group 1: the correct response (1 token) is not longer than the wrong one (2) -> TDS, weight 0.1
GROUPS = [[(3, 1.0), (1, 0.0)], [(1, 1.0), (2, 0.0)]]
WEIGHTS = [1.0, 1.0, 0.1, 0.1]
ADORA = {"adora.enabled": True, "adora.rule": "length", "adora.mode": "attenuate", "adora.lambda_att": 0.1}


def run_config(estimator: str, **overrides):
    return build_run_config(
        "kk-tiny", {"adora.correct_threshold": 0.5, "advantage.estimator": estimator, "sampling.n_keep": 2, **overrides}
    )


def responses(groups=GROUPS):
    return [
        response_dict(prompt_len=2 + g, response_len=length, reward=reward, prompt=f"q{g}")
        for g, group in enumerate(groups)
        for length, reward in group
    ]


def value(index: int, t: int) -> float:
    """The critic's value of token t of sample ``index`` (any fixed numbers)."""
    return 0.1 * (index + 1) + 0.05 * t


def with_values(batches):
    """What OpenRLHF's critic group writes in ``make_experience``: values [B, T] on the action positions."""
    for batch in batches:
        batch.values = torch.zeros(batch.action_mask.shape, dtype=torch.float32)
        for row, index in enumerate(batch.index):
            positions = batch.action_mask[row].nonzero().flatten().tolist()
            for t, pos in enumerate(positions):
                batch.values[row, pos] = value(index, t)
    return batches


def made(args, cfg, groups=GROUPS, maker_cls=ours.AdoraExperienceMaker, **kwargs):
    kwargs = {"run_config": cfg, **kwargs} if maker_cls is ours.AdoraExperienceMaker else kwargs
    maker = openrlhf_maker(args, maker_cls, **kwargs)
    batches = with_values(ready_for_advantages(maker, rollout_experiences(args, responses(groups))))
    return maker, batches


def by_sample(batches, field: str) -> list[list[float]]:
    """``field`` ([B, T]) of every sample on its response tokens, in prompt order."""
    out = {}
    for batch in batches:
        for row, index in enumerate(batch.index):
            out[index] = getattr(batch, field)[row][batch.action_mask[row].bool()].tolist()
    return [out[i] for i in sorted(out)]


def whitened(per_sample: list[list[float]]) -> list[list[float]]:
    """OpenRLHF's batch whitening by hand: mean and biased variance over every response token."""
    flat = [a for sample in per_sample for a in sample]
    mean = sum(flat) / len(flat)
    std = math.sqrt(max(sum((a - mean) ** 2 for a in flat) / len(flat), 1e-8))
    return [[(a - mean) / std for a in sample] for sample in per_sample]


def flat(nested: list[list[float]]) -> list[float]:
    return [a for sample in nested for a in sample]


def test_gae_weights_after_gae_before_whitening_and_leaves_the_critics_returns_alone():
    args = openrlhf_args(n=2, estimator="gae", micro_batch=3)  # gamma 1, lambd 1: A_t = r - V_t, R_t = r
    maker, batches = made(args, run_config("gae", **ADORA))
    maker.compute_advantages_and_returns(batches)

    lengths = [length for group in GROUPS for length, _ in group]
    rewards = [reward for group in GROUPS for _, reward in group]
    gae = [[rewards[i] - value(i, t) for t in range(lengths[i])] for i in range(4)]
    expected = whitened([[WEIGHTS[i] * a for a in gae[i]] for i in range(4)])
    assert flat(by_sample(batches, "advantages")) == pytest.approx(flat(expected), rel=1e-5, abs=1e-6)
    # the critic's targets: R_t = A_t + V_t = r on every token, whatever the weight
    assert by_sample(batches, "returns") == [[pytest.approx(rewards[i])] * lengths[i] for i in range(4)]
    weights = torch.cat([b.info["adora/weight"] for b in batches])
    order = torch.cat([torch.tensor(b.index) for b in batches])
    assert weights[order.argsort()].tolist() == pytest.approx(WEIGHTS)
    assert float(batches[0].info["adora/tas_fraction"][0]) == pytest.approx(0.5)
    assert float(batches[0].info["adora/zero_signal"].max()) == 0


def test_reinforce_weights_the_normalised_advantage():
    args = openrlhf_args("--algo.advantage.gamma", "0.5", n=2, estimator="reinforce", micro_batch=1)
    maker, batches = made(args, run_config("reinforce", **ADORA, **{"advantage.gamma": 0.5}))
    maker.compute_advantages_and_returns(batches)

    lengths = [length for group in GROUPS for length, _ in group]
    rewards = [reward for group in GROUPS for _, reward in group]
    # discounted return of the last-token reward: G_t = gamma^(L-1-t) r
    returns = [[rewards[i] * 0.5 ** (lengths[i] - 1 - t) for t in range(lengths[i])] for i in range(4)]
    expected = [[WEIGHTS[i] * a for a in sample] for i, sample in enumerate(whitened(returns))]
    assert flat(by_sample(batches, "advantages")) == pytest.approx(flat(expected), rel=1e-5, abs=1e-6)
    assert flat(by_sample(batches, "returns")) == pytest.approx(flat(returns))  # unweighted
    assert args.algo.advantage.gamma == 0.5  # a token estimator keeps its discount


@pytest.mark.parametrize("estimator", ["gae", "reinforce"])
def test_equals_openrlhf_exactly_with_adora_off(estimator):
    argv = ("--algo.advantage.gamma", "0.9", "--algo.advantage.lambd", "0.95")
    args = openrlhf_args(*argv, n=2, estimator=estimator, micro_batch=3)
    groups = [*GROUPS, [(4, 0.5), (2, 2.0)], [(5, -1.0), (3, -1.0)]]
    overrides = {"advantage.gamma": 0.9, **({"advantage.lambd": 0.95} if estimator == "gae" else {})}
    _, theirs = made(args, None, groups, maker_cls=None)
    maker, mine = made(args, run_config(estimator, **overrides), groups)
    theirs = openrlhf_maker(args).compute_advantages_and_returns(theirs)
    maker.compute_advantages_and_returns(mine)
    for a, b in zip(theirs, mine, strict=True):
        assert torch.equal(a.advantages, b.advantages)
        assert torch.equal(a.returns, b.returns)
        assert torch.equal(a.info["return"], b.info["return"])
        assert torch.equal(a.info["group_reward_std"], b.info["group_reward_std"])
    # ADORA off: classes logged, every weight 1; the last group's rewards are uniform
    assert torch.cat([b.info["adora/weight"] for b in mine]).eq(1).all()
    assert float(mine[0].info["advantage/zero_signal_fraction"][0]) == pytest.approx(0.25)


@pytest.mark.parametrize("estimator", ["gae", "reinforce"])
@pytest.mark.parametrize("micro", [1, 4])
def test_equals_the_local_backends_token_estimator_with_adora_on(estimator, micro):
    """The same rollout through the core's ``compute_token_advantages`` (the local backend's path) gives the same
    advantages and returns on every response token, however OpenRLHF micro-batches it; pool statistics written by
    the sampler change nothing (the baseline is the critic or the batch)."""
    args = openrlhf_args("--algo.advantage.lambd", "0.9", n=2, estimator=estimator, micro_batch=micro)
    overrides = {"advantage.lambd": 0.9} if estimator == "gae" else {}
    maker, batches = made(args, run_config(estimator, **ADORA, **overrides))
    for batch in batches:  # what AdoraSamplesGenerator writes with the sampler on
        for key, number in ((ours.POOL_COUNT, 8.0), (ours.POOL_MEAN, 0.25), (ours.POOL_STD, 0.4)):
            batch.info[key] = torch.full((len(batch.index),), number)
    maker.compute_advantages_and_returns(batches)

    lengths = [length for group in GROUPS for length, _ in group]
    width = max(lengths)
    mask = torch.tensor([[t < length for t in range(width)] for length in lengths])
    values = torch.tensor([[value(i, t) if t < lengths[i] else 0.0 for t in range(width)] for i in range(4)])
    rewards = torch.tensor([reward for group in GROUPS for _, reward in group])
    core = compute_token_advantages(
        estimator,
        rewards,
        mask,
        values=values if estimator == "gae" else None,
        weights=torch.tensor(WEIGHTS),
        params=TokenParams(gamma=1.0, lambd=0.9 if estimator == "gae" else 1.0),
    )
    assert flat(by_sample(batches, "advantages")) == pytest.approx(core.advantages[mask].tolist(), rel=1e-5, abs=1e-6)
    assert flat(by_sample(batches, "returns")) == pytest.approx(core.returns[mask].tolist(), rel=1e-5, abs=1e-6)
    assert float(torch.cat([b.info[ours.POOL_COUNT] for b in batches]).mean()) == 8.0  # still logged


def test_gae_without_the_critics_values_is_an_error():
    args = openrlhf_args(n=2, estimator="gae")
    maker, batches = made(args, run_config("gae"))
    for batch in batches:
        batch.values = None
    with pytest.raises(ValueError, match="Experience.values: advantage.estimator gae needs the critic's values"):
        maker.compute_advantages_and_returns(copy.copy(batches))


def test_groups_of_their_own_sizes_from_a_rollout_allocator():
    """A rollout allocator's groups (``adora/group_size`` on every sample: here 1 and 3): each response gets its own
    group's ADORA weight (``pipeline.response_weights``), the group of one its class's weight too."""
    from adora_openrlhf.algorithms.pipeline import GroupBatch, response_weights

    groups = [[(2, 1.0)], [(1, 1.0), (4, 0.0), (3, 0.0)]]  # group 1: correct 1 token <= wrong mean 3.5 -> TDS
    args = openrlhf_args(n=2, estimator="gae", micro_batch=3)
    cfg = run_config("gae", **ADORA)
    maker = openrlhf_maker(args, ours.AdoraExperienceMaker, run_config=cfg)
    experiences = rollout_experiences(args, responses(groups))
    for experience, size in zip(experiences, [1, 3, 3, 3], strict=True):
        experience.info[ours.GROUP_SIZE] = torch.tensor([float(size)])
    batches = with_values(ready_for_advantages(maker, experiences))
    maker.compute_advantages_and_returns(batches)

    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    lengths = torch.tensor([2.0, 1.0, 4.0, 3.0])
    expected, _, _ = response_weights(GroupBatch(rewards, lengths, rewards > 0.5), [1, 3], cfg.adora)
    weights = torch.cat([b.info["adora/weight"] for b in batches])
    order = torch.cat([torch.tensor(b.index) for b in batches])
    assert weights[order.argsort()].tolist() == pytest.approx(expected.tolist())
    assert expected[1:].tolist() == pytest.approx([0.1] * 3)
    mask = torch.tensor([[t < int(n) for t in range(4)] for n in lengths])
    values = torch.tensor([[value(i, t) if t < int(lengths[i]) else 0.0 for t in range(4)] for i in range(4)])
    core = compute_token_advantages("gae", rewards, mask, values=values, weights=expected)
    assert flat(by_sample(batches, "advantages")) == pytest.approx(core.advantages[mask].tolist(), rel=1e-5, abs=1e-6)
