"""Group advantage estimators: hand-computed cases, OpenRLHF equality, properties, bad input."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from adora_openrlhf.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    PoolStats,
    broadcast_to_tokens,
    compute_group_advantages,
)

SQRT3 = math.sqrt(3.0)


def test_group_norm_hand_case():
    # r = [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(1/3), A = +-0.5 * sqrt(3)
    adv, stats = compute_group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), "group_norm")
    expected = 0.5 * SQRT3 / (1 + 1e-9 * SQRT3)
    assert torch.allclose(adv, torch.tensor([[expected, -expected, -expected, expected]]), atol=1e-6)
    assert stats.mean.item() == pytest.approx(0.5)
    assert stats.std.item() == pytest.approx(1 / SQRT3)
    assert not stats.zero_signal.item()


@pytest.mark.parametrize("name", ["dr_grpo", "reinforce_baseline"])
def test_mean_baseline_hand_case(name):
    adv, _ = compute_group_advantages(torch.tensor([[3.0, -1.0, 1.0]]), name)
    assert torch.allclose(adv, torch.tensor([[2.0, -2.0, 0.0]]))


def test_rloo_hand_case():
    # A_0 = 1 - (0 + 0 + 1)/3 = 2/3 ; A_1 = 0 - (1 + 0 + 1)/3 = -2/3
    adv, _ = compute_group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), "rloo")
    assert torch.allclose(adv, torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3]]))


def test_group_norm_equals_openrlhf_formula_bitwise():
    torch.manual_seed(0)
    rewards = torch.randn(64, 8)
    rewards[::7] = torch.bernoulli(torch.full((8,), 0.5))  # some binary rows
    openrlhf = (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-9)
    ours, _ = compute_group_advantages(rewards, "group_norm", eps=1e-9)
    non_uniform = rewards.max(-1).values != rewards.min(-1).values
    assert torch.equal(ours[non_uniform], openrlhf[non_uniform])


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_uniform_group_gives_exact_zero(name):
    rewards = torch.tensor([[0.1, 0.1, 0.1], [1.0, 0.0, 1.0]])
    adv, stats = compute_group_advantages(rewards, name)
    assert torch.equal(adv[0], torch.zeros(3))
    assert stats.zero_signal.tolist() == [True, False]
    assert stats.zero_signal_fraction == 0.5


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_single_response_groups_are_finite_and_zero(name):
    adv, stats = compute_group_advantages(torch.tensor([[1.0], [0.0]]), name)
    assert torch.equal(adv, torch.zeros(2, 1))
    assert stats.std.tolist() == [0.0, 0.0]


def test_ragged_groups():
    adv, stats = compute_group_advantages([torch.tensor([1.0, 0.0]), torch.tensor([2.0, 0.0, 1.0])], "group_norm")
    # group 2: mean 1, std 1 -> (1, -1, 0) / (1 + eps)
    assert isinstance(adv, list) and [a.shape[0] for a in adv] == [2, 3]
    assert torch.allclose(adv[1], torch.tensor([1.0, -1.0, 0.0]), atol=1e-6)
    assert torch.allclose(adv[0], torch.tensor([1 / math.sqrt(0.5), -1 / math.sqrt(0.5)]) * 0.5, atol=1e-6)
    assert stats.mean.tolist() == pytest.approx([0.5, 1.0])


def test_ragged_matches_dense_for_equal_sizes():
    torch.manual_seed(1)
    rewards = torch.randn(5, 4)
    dense, _ = compute_group_advantages(rewards, "rloo")
    ragged, _ = compute_group_advantages(list(rewards), "rloo")
    assert torch.allclose(torch.stack(ragged), dense, atol=1e-6)


def test_pool_statistics_baseline():
    # kept [1, 0]; pool [1, 0, 0, 0] -> mean 0.25, std = sqrt(0.25) = 0.5
    pool = PoolStats.from_rewards([[1.0, 0.0, 0.0, 0.0]])
    adv, stats = compute_group_advantages(torch.tensor([[1.0, 0.0]]), "group_norm", pool_stats=pool)
    assert torch.allclose(adv, torch.tensor([[0.75 / 0.5, -0.25 / 0.5]]), atol=1e-6)
    adv, _ = compute_group_advantages(torch.tensor([[1.0, 0.0]]), "dr_grpo", pool_stats=pool)
    assert torch.allclose(adv, torch.tensor([[0.75, -0.25]]))
    # rloo over the pool: A_i = r_i - (sum - r_i)/(m - 1), sum 1, m 4
    adv, _ = compute_group_advantages(torch.tensor([[1.0, 0.0]]), "rloo", pool_stats=pool)
    assert torch.allclose(adv, torch.tensor([[1.0, -1 / 3]]))
    assert stats.mean.item() == pytest.approx(0.25)


def test_pool_uniform_kept_but_pool_not_gives_signal():
    # kept all positive, pool has negatives: the pool baseline still gives a learning signal
    pool = PoolStats.from_rewards([[1.0, 1.0, 0.0, 0.0]])
    adv, stats = compute_group_advantages(torch.tensor([[1.0, 1.0]]), "dr_grpo", pool_stats=pool)
    assert torch.allclose(adv, torch.tensor([[0.5, 0.5]]))
    assert not stats.zero_signal.item()


def test_broadcast_to_tokens():
    out = broadcast_to_tokens(torch.tensor([2.0, -1.0]), torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert torch.equal(out, torch.tensor([[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]))


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        compute_group_advantages(torch.zeros(2, 2), "gae_typo")
    with pytest.raises(ValueError, match="empty"):
        compute_group_advantages(torch.zeros(2, 0))
    with pytest.raises(ValueError, match=r"\[num_prompts, n\]"):
        compute_group_advantages(torch.zeros(4))
    with pytest.raises(ValueError, match=r"rewards\[1\]"):
        compute_group_advantages([torch.tensor([1.0]), torch.tensor([])])
    with pytest.raises(ValueError, match="pool_stats"):
        compute_group_advantages(torch.zeros(2, 2), pool_stats=PoolStats.from_rewards([[0.0, 1.0]]))
    with pytest.raises(ValueError, match="smaller than its group"):
        compute_group_advantages(torch.zeros(1, 3), pool_stats=PoolStats.from_rewards([[0.0, 1.0]]))
    with pytest.raises(ValueError, match="empty"):
        PoolStats.from_rewards([[1.0], []])
    with pytest.raises(ValueError, match="broadcast_to_tokens"):
        broadcast_to_tokens(torch.zeros(2), torch.ones(3, 4))


reward_values = st.one_of(st.sampled_from([0.0, 1.0, -1.0, 3.0, 0.5]), st.floats(-5, 5, allow_nan=False, width=32))


@settings(max_examples=80, deadline=None)
@given(
    groups=st.lists(st.lists(reward_values, min_size=1, max_size=8), min_size=1, max_size=6),
    name=st.sampled_from(sorted(ADVANTAGE_ESTIMATORS)),
    ragged=st.booleans(),
)
def test_properties_finite_zero_signal_and_centering(groups, name, ragged):
    if not ragged:
        width = len(groups[0])
        groups = [(g * width)[:width] for g in groups]
        rewards = torch.tensor(groups, dtype=torch.float32)
        adv, stats = compute_group_advantages(rewards, name)
        rows = list(adv)
    else:
        rows, stats = compute_group_advantages([torch.tensor(g, dtype=torch.float32) for g in groups], name)
    for g, a, zero in zip(groups, rows, stats.zero_signal.tolist(), strict=True):
        assert torch.isfinite(a).all()
        if len(set(g)) == 1:
            assert torch.equal(a, torch.zeros_like(a)) and zero
        if name in ("dr_grpo", "reinforce_baseline", "group_norm", "rloo"):
            # every estimator's advantages sum to ~0 within a group (rloo: m/(m-1) times the mean-centred ones)
            assert abs(float(a.double().sum())) <= 1e-3 * max(1.0, float(a.abs().sum()))
