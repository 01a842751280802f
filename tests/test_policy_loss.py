"""Policy loss: hand-computed PPO-clip, k3 KL and aggregation cases, plus property tests."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from adora_openrlhf.algorithms.policy_loss import LOSS_AGGREGATIONS, aggregate, k3_kl, policy_loss, ppo_clip_token_loss


def test_ppo_clip_hand_case():
    # ratios e^{ln 1.5}=1.5, e^{ln 0.5}=0.5, 1.0 ; advantages +1, -2, +3 ; eps 0.2
    old = torch.zeros(1, 3)
    new = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))
    adv = torch.tensor([[1.0, -2.0, 3.0]])
    loss, ratio, clipped = ppo_clip_token_loss(new, old, adv, 0.2, 0.2)
    # token 0: min(1.5*1, 1.2*1) = 1.2 -> loss -1.2 (clipped active)
    # token 1: min(0.5*-2, 0.8*-2) = min(-1, -1.6) = -1.6 -> loss 1.6 (clipped active)
    # token 2: ratio 1 -> loss -3 (not clipped)
    assert torch.allclose(loss, torch.tensor([[-1.2, 1.6, -3.0]]))
    assert torch.allclose(ratio, torch.tensor([[1.5, 0.5, 1.0]]))
    assert clipped.tolist() == [[True, True, False]]


def test_ppo_clip_asymmetric_range():
    old = torch.zeros(1, 1)
    new = torch.log(torch.tensor([[1.5]]))
    loss, _, _ = ppo_clip_token_loss(new, old, torch.ones(1, 1), 0.2, 0.28)
    assert torch.allclose(loss, torch.tensor([[-1.28]]))


def test_k3_hand_case():
    # r = ref - logp = ln 2 -> e^r - r - 1 = 2 - ln 2 - 1 = 1 - ln 2
    kl = k3_kl(torch.tensor([[0.0, -1.0]]), torch.tensor([[math.log(2.0), -1.0]]))
    assert torch.allclose(kl, torch.tensor([[1 - math.log(2.0), 0.0]]))


def test_aggregations_hand_case():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(values, mask, "token_mean").item() == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert aggregate(values, mask, "seq_mean_token_mean").item() == pytest.approx((2.0 + 4.0) / 2)
    assert aggregate(values, mask, "seq_mean_token_sum_norm", norm_length=10).item() == pytest.approx(
        (6 / 10 + 4 / 10) / 2
    )
    assert aggregate(values, mask, "seq_mean_token_sum_norm").item() == pytest.approx((6 / 3 + 4 / 3) / 2)


def test_policy_loss_total_with_kl_and_metrics():
    logp = torch.tensor([[0.0, 0.0]], requires_grad=True)
    old = torch.zeros(1, 2)
    ref = torch.tensor([[math.log(2.0), 0.0]])
    mask = torch.tensor([[1.0, 1.0]])
    out = policy_loss(logp, old, torch.tensor([2.0]), mask, kl_coef=0.5, ref_log_probs=ref)
    # pg: ratio 1 -> -2 per token -> mean -2 ; kl: (1 - ln2 + 0) / 2
    kl = (1 - math.log(2.0)) / 2
    assert out.pg_loss.item() == pytest.approx(-2.0)
    assert out.kl.item() == pytest.approx(kl)
    assert out.loss.item() == pytest.approx(-2.0 + 0.5 * kl)
    assert out.clip_fraction.item() == 0.0 and out.ratio_mean.item() == pytest.approx(1.0)
    out.loss.backward()
    # d/dlogp of -rho*A at rho=1 is -A = -2, /2 tokens; KL grad: d/dlogp (e^{ref-lp} - (ref-lp) - 1) = -e^{ref-lp} + 1
    expected = torch.tensor([[-1.0 + 0.5 * (1 - 2.0) / 2, -1.0 + 0.0]])
    assert torch.allclose(logp.grad, expected)


def test_padding_is_ignored():
    logp = torch.tensor([[0.1, 0.2, 99.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    a = policy_loss(logp, logp.detach(), torch.tensor([1.0]), mask)
    b = policy_loss(logp[:, :2], logp[:, :2].detach(), torch.tensor([1.0]), mask[:, :2])
    assert a.loss.item() == pytest.approx(b.loss.item())


def test_errors_are_clear():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="ref_log_probs"):
        policy_loss(x, x, torch.zeros(2), torch.ones(2, 3), kl_coef=0.1)
    with pytest.raises(ValueError, match="mask: shape"):
        policy_loss(x, x, torch.zeros(2), torch.ones(2, 2))
    with pytest.raises(ValueError, match="train.loss_agg: unknown loss aggregation"):
        aggregate(x, torch.ones(2, 3), "nope")


floats = st.floats(-3, 3, allow_nan=False)


@given(st.lists(st.tuples(floats, floats, floats), min_size=1, max_size=12), st.floats(0.05, 0.5), st.floats(0.05, 0.5))
def test_clip_properties(rows, eps_low, eps_high):
    new = torch.tensor([[r[0] for r in rows]], dtype=torch.float64)
    old = torch.tensor([[r[1] for r in rows]], dtype=torch.float64)
    adv = torch.tensor([[r[2] for r in rows]], dtype=torch.float64)
    loss, ratio, _ = ppo_clip_token_loss(new, old, adv, eps_low, eps_high)
    # the clipped objective is a pessimistic bound of the unclipped one
    assert torch.all(loss >= -(ratio * adv) - 1e-12)
    # with ratio 1 the loss is exactly -A
    same, _, _ = ppo_clip_token_loss(old, old, adv, eps_low, eps_high)
    assert torch.allclose(same, -adv)


@given(st.lists(st.tuples(floats, floats), min_size=1, max_size=12))
def test_k3_nonnegative_and_zero_iff_equal(pairs):
    lp = torch.tensor([p[0] for p in pairs], dtype=torch.float64)
    ref = torch.tensor([p[1] for p in pairs], dtype=torch.float64)
    kl = k3_kl(lp, ref)
    assert torch.all(kl >= -1e-12)
    assert torch.allclose(k3_kl(lp, lp), torch.zeros_like(lp))


@given(st.integers(1, 4), st.integers(1, 6), st.data())
def test_aggregation_of_constant_is_constant_for_means(b, t, data):
    c = data.draw(floats)
    mask = torch.ones(b, t)
    values = torch.full((b, t), c)
    for mode in ("token_mean", "seq_mean_token_mean"):
        assert aggregate(values, mask, mode).item() == pytest.approx(c, abs=1e-6)
    assert set(LOSS_AGGREGATIONS) == {"token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"}
