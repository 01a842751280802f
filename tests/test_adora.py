"""ADORA classification and weights: the reference length rule by hand, the difficulty rule, modes,
length shaping, properties and bad input."""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from adora_openrlhf.algorithms.adora import (
    NEUTRAL,
    TAS,
    TDS,
    adora_weights,
    apply_group_weights,
    classify_groups,
    length_shaped_rewards,
)
from adora_openrlhf.algorithms.advantages import compute_group_advantages
from adora_openrlhf.algorithms.pipeline import GroupBatch, compute_step_advantages
from adora_openrlhf.config import AdoraConfig, AdvantageConfig, ConfigError

# Logic-RL K&K rewards: correct when reward > 1.0
KK = AdoraConfig(enabled=True, correct_threshold=1.0)


def reference_length_weight(rewards, lengths, truncated, threshold=1.0, lam=0.1):
    """Literal hand transcription of the reference rule for one group (lists in, weight out)."""
    pos = [length for r, length in zip(rewards, lengths, strict=True) if r > threshold]
    neg = [length for r, length, t in zip(rewards, lengths, truncated, strict=True) if r <= threshold and not t]
    max_pos = max(pos) if pos else float("-inf")
    mean_neg = sum(neg) / len(neg) if neg else float("inf")
    if not pos or max_pos > mean_neg:
        return 1.0
    return lam


def test_length_rule_hand_cases():
    rewards = torch.tensor(
        [
            [3.0, -1.0, 3.0, -0.5],  # correct lengths 10, 8; wrong 5, 7 -> max 10 > mean 6 -> TAS, w 1
            [3.0, 3.0, -1.0, -1.0],  # correct 4, 5; wrong 6, 8 -> 5 <= 7 -> TDS, w 0.1
            [-1.0, -1.0, -3.0, 0.0],  # no correct -> neutral, w 1
            [3.0, 3.0, 3.0, 3.0],  # all correct -> mean_neg = +inf -> TDS, w 0.1
        ]
    )
    lengths = torch.tensor([[10, 5, 8, 7], [4, 5, 6, 8], [3, 3, 3, 3], [9, 9, 9, 9]])
    res = adora_weights(rewards, lengths, KK)
    assert res.group_class.tolist() == [TAS, TDS, NEUTRAL, TDS]
    assert torch.allclose(res.weights, torch.tensor([1.0, 0.1, 1.0, 0.1]))
    assert res.num_correct.tolist() == [2, 2, 0, 4]
    m = res.metrics()
    assert m["adora/tas_fraction"] == 0.25 and m["adora/tds_fraction"] == 0.5 and m["adora/neutral_fraction"] == 0.25
    assert m["adora/weight_one_fraction"] == 0.5
    assert m["adora/mean_weight"] == pytest.approx(0.55)


def test_truncated_negatives_are_dropped_from_the_statistic():
    rewards = torch.tensor([[3.0, -1.0, -1.0]])
    lengths = torch.tensor([[4, 20, 3]])
    truncated = torch.tensor([[False, True, False]])
    # counted negatives: only length 3 -> 4 > 3 -> TAS
    assert adora_weights(rewards, lengths, KK, truncated=truncated).weights.tolist() == [1.0]
    # counting the truncated one: mean (20 + 3)/2 = 11.5 -> TDS
    keep_all = dataclasses.replace(KK, drop_truncated_negatives=False)
    assert adora_weights(rewards, lengths, keep_all, truncated=truncated).weights.tolist() == pytest.approx([0.1])
    # all negatives truncated -> mean_neg = +inf -> TDS
    all_trunc = torch.tensor([[False, True, True]])
    assert adora_weights(rewards, lengths, KK, truncated=all_trunc).group_class.tolist() == [TDS]


def reference_llm_length_weight(rewards, lengths, truncated, threshold=1.0, lam=0.1):
    """Hand transcription of the verl LLM reference for one group: -inf for an empty side."""
    pos = [length for r, length in zip(rewards, lengths, strict=True) if r > threshold]
    neg = [length for r, length, t in zip(rewards, lengths, truncated, strict=True) if r <= threshold and not t]
    max_pos = max(pos) if pos else float("-inf")
    mean_neg = sum(neg) / len(neg) if neg else float("-inf")
    return 1.0 if max_pos > mean_neg else lam


def test_edge_policies_on_the_reference_table():
    rewards = torch.tensor(
        [
            [-1.0, -1.0, -3.0, 0.0],  # no correct response
            [3.0, 3.0, 3.0, 3.0],  # all correct
            [3.0, -1.0, -1.0, 3.0],  # correct ones, every wrong one truncated
            [3.0, -1.0, 3.0, -0.5],  # common case: max 10 > mean 6 -> TAS in both
        ]
    )
    lengths = torch.tensor([[3, 3, 3, 3], [9, 9, 9, 9], [4, 20, 20, 5], [10, 5, 8, 7]])
    truncated = torch.tensor([[False] * 4, [False] * 4, [False, True, True, False], [False] * 4])
    vlm = adora_weights(rewards, lengths, KK, truncated=truncated)
    llm = adora_weights(rewards, lengths, dataclasses.replace(KK, edge_policy="llm"), truncated=truncated)
    assert vlm.group_class.tolist() == [NEUTRAL, TDS, TDS, TAS] and vlm.weights.tolist() == pytest.approx(
        [1.0, 0.1, 0.1, 1.0]
    )
    assert llm.group_class.tolist() == [TDS, TAS, TAS, TAS] and llm.weights.tolist() == pytest.approx(
        [0.1, 1.0, 1.0, 1.0]
    )
    amplify = adora_weights(
        rewards,
        lengths,
        dataclasses.replace(KK, edge_policy="llm", mode="amplify", lambda_amp=2.0),
        truncated=truncated,
    )
    assert amplify.weights.tolist() == pytest.approx([1.0, 2.0, 2.0, 2.0])


def test_truncation_length_counts_long_responses_as_truncated():
    """The LLM reference treats length >= 3900 (of 4096) as truncated, whatever the engine reported."""
    rewards, lengths = torch.tensor([[3.0, -1.0, -1.0]]), torch.tensor([[5, 3900, 4000]])
    cfg = dataclasses.replace(KK, edge_policy="llm")
    assert adora_weights(rewards, lengths, cfg).group_class.tolist() == [TDS]  # mean wrong 3950 >= 5
    assert adora_weights(rewards, lengths, dataclasses.replace(cfg, truncation_length=3900)).group_class.tolist() == [
        TAS
    ]
    assert adora_weights(rewards, lengths, dataclasses.replace(cfg, truncation_length=3901)).group_class.tolist() == [
        TDS
    ]
    with pytest.raises(ConfigError, match="adora.truncation_length"):
        AdoraConfig(truncation_length=0)
    with pytest.raises(ConfigError, match="adora.edge_policy"):
        AdoraConfig(edge_policy="verl")


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 6), g=st.integers(1, 5), data=st.data())
def test_both_policies_match_their_reference_transcriptions(n, g, data):
    response = st.tuples(st.sampled_from([-3.0, -1.0, -0.5, 0.0, 1.0, 3.0]), st.integers(1, 12), st.booleans())
    groups = data.draw(st.lists(st.lists(response, min_size=n, max_size=n), min_size=g, max_size=g))
    rewards = torch.tensor([[r for r, _, _ in g] for g in groups])
    lengths = torch.tensor([[length for _, length, _ in g] for g in groups])
    truncated = torch.tensor([[t for _, _, t in g] for g in groups])
    vlm = adora_weights(rewards, lengths, KK, truncated=truncated).weights.tolist()
    llm = adora_weights(
        rewards, lengths, dataclasses.replace(KK, edge_policy="llm"), truncated=truncated
    ).weights.tolist()
    for g, group in enumerate(groups):
        r, lens, t = zip(*group, strict=True)
        assert vlm[g] == pytest.approx(reference_length_weight(r, lens, t))
        assert llm[g] == pytest.approx(reference_llm_length_weight(r, lens, t))


def test_correct_mask_overrides_threshold():
    rewards = torch.tensor([[0.3, 0.2]])
    lengths = torch.tensor([[9, 2]])
    res = adora_weights(rewards, lengths, KK, correct=torch.tensor([[True, False]]))
    assert res.group_class.tolist() == [TAS]


def test_difficulty_rule_and_modes():
    cfg = AdoraConfig(enabled=True, rule="difficulty", tau=0.5, correct_threshold=0.5)
    rewards = torch.tensor([[1.0, 0, 0, 0], [1.0, 1, 0, 0], [1.0, 1, 1, 0], [0.0, 0, 0, 0], [1.0, 1, 1, 1]])
    lengths = torch.ones_like(rewards)
    res = adora_weights(rewards, lengths, cfg)
    assert res.group_class.tolist() == [TAS, TAS, TDS, TDS, TDS]
    assert torch.allclose(res.weights, torch.tensor([1.0, 1.0, 0.1, 0.1, 0.1]))
    amp = adora_weights(rewards, lengths, dataclasses.replace(cfg, mode="amplify", lambda_amp=1.5))
    assert torch.allclose(amp.weights, torch.tensor([1.5, 1.5, 1.0, 1.0, 1.0]))


def test_amplify_leaves_neutral_and_tds_at_one():
    rewards = torch.tensor([[3.0, -1.0], [-1.0, -1.0], [3.0, 3.0]])
    lengths = torch.tensor([[9, 2], [1, 1], [5, 5]])
    res = adora_weights(rewards, lengths, dataclasses.replace(KK, mode="amplify", lambda_amp=3.0))
    assert res.weights.tolist() == [3.0, 1.0, 1.0]


def test_disabled_gives_unit_weights_but_still_classifies():
    rewards = torch.tensor([[3.0, 3.0]])
    res = adora_weights(rewards, torch.tensor([[1, 1]]), dataclasses.replace(KK, enabled=False))
    assert res.weights.tolist() == [1.0] and res.group_class.tolist() == [TDS]


def test_reference_path_after_group_norm():
    """ADORA after group_norm equals the hand-computed reference: A = w * (r - mean) / (std + eps)."""
    rewards = torch.tensor([[3.0, -1.0, 3.0, -0.5], [3.0, 3.0, -1.0, -1.0]])
    lengths = torch.tensor([[10, 5, 8, 7], [4, 5, 6, 8]])
    out = compute_step_advantages(GroupBatch(rewards, lengths), AdvantageConfig("group_norm"), KK)
    for g in range(2):
        r = rewards[g].tolist()
        mean = sum(r) / 4
        std = (sum((x - mean) ** 2 for x in r) / 3) ** 0.5
        w = reference_length_weight(r, lengths[g].tolist(), [False] * 4)
        expected = torch.tensor([w * (x - mean) / (std + 1e-9) for x in r])
        assert torch.allclose(out.advantages[g], expected, atol=1e-6)
    assert out.metrics["adora/mean_weight"] == pytest.approx(0.55)


def test_length_shaping_hand_case():
    cfg = dataclasses.replace(KK, length_shaping=True, shaping_beta=0.5, shaping_p=0.5)
    # hard TAS group: 1 of 4 correct (< 4*0.5) -> single correct: u = 0 / clamp(0, 1e-6) = 0 -> +0.5*(2*0-1) = -0.5
    # easy TAS group: 3 correct lengths 2, 6, 10 (u 0, .5, 1), wrong length 1 -> shift -0.5*(2u-1) = +.5, 0, -.5
    rewards = torch.tensor([[3.0, -1.0, -1.0, -1.0], [3.0, 3.0, 3.0, -1.0]])
    lengths = torch.tensor([[9, 2, 2, 2], [2, 6, 10, 1]])
    shaped = length_shaped_rewards(rewards, lengths, cfg)
    assert torch.allclose(shaped, torch.tensor([[2.5, -1.0, -1.0, -1.0], [3.5, 3.0, 2.5, -1.0]]))
    # easy TAS group whose correct responses all have one length: u = 0 -> -0.5*(2*0-1) = +0.5 each
    rewards = torch.tensor([[3.0, 3.0, 3.0, -1.0]])
    assert torch.allclose(
        length_shaped_rewards(rewards, torch.tensor([[6, 6, 6, 1]]), cfg), torch.tensor([[3.5, 3.5, 3.5, -1.0]])
    )
    # hard group with two correct of five: lengths 4 and 8 -> u 0, 1 -> +0.5*(2u-1) = -.5, +.5
    rewards = torch.tensor([[3.0, 3.0, -1.0, -1.0, -1.0]])
    lengths = torch.tensor([[4, 8, 1, 1, 1]])
    assert torch.allclose(length_shaped_rewards(rewards, lengths, cfg), torch.tensor([[2.5, 3.5, -1.0, -1.0, -1.0]]))
    # TDS groups are not shaped
    rewards = torch.tensor([[3.0, 3.0, -1.0, -1.0]])
    lengths = torch.tensor([[1, 2, 9, 9]])
    assert torch.equal(length_shaped_rewards(rewards, lengths, cfg), rewards)


def test_bad_inputs():
    with pytest.raises(ValueError, match="lengths"):
        adora_weights(torch.zeros(2, 3), torch.zeros(2, 4), KK)
    with pytest.raises(ValueError, match="truncated"):
        adora_weights(torch.zeros(2, 3), torch.zeros(2, 3), KK, truncated=torch.zeros(3, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="empty"):
        adora_weights(torch.zeros(2, 0), torch.zeros(2, 0), KK)
    with pytest.raises(ConfigError, match="adora.rule"):
        AdoraConfig(rule="lenght")
    with pytest.raises(ConfigError, match="adora.lambda_att"):
        AdoraConfig(lambda_att=0.0)
    with pytest.raises(ConfigError, match="adora.lambda_amp"):
        AdoraConfig(lambda_amp=0.5)
    with pytest.raises(ConfigError, match="adora.mode"):
        AdoraConfig(mode="boost")
    with pytest.raises(ValueError, match="> 0"):
        apply_group_weights(torch.ones(1, 2), torch.tensor([-1.0]))


@settings(max_examples=80, deadline=None)
@given(
    data=st.data(),
    num_groups=st.integers(1, 6),
    n=st.integers(1, 8),
    rule=st.sampled_from(["length", "difficulty"]),
    mode=st.sampled_from(["attenuate", "amplify"]),
    estimator=st.sampled_from(["group_norm", "dr_grpo", "rloo", "reinforce_baseline"]),
)
def test_weights_only_scale_never_flip_sign(data, num_groups, n, rule, mode, estimator):
    rewards = torch.tensor(
        data.draw(
            st.lists(
                st.lists(st.sampled_from([-2.0, -1.0, 0.0, 0.5, 1.0, 2.0, 3.0]), min_size=n, max_size=n),
                min_size=num_groups,
                max_size=num_groups,
            )
        )
    )
    lengths = torch.tensor(
        data.draw(
            st.lists(st.lists(st.integers(1, 50), min_size=n, max_size=n), min_size=num_groups, max_size=num_groups)
        )
    )
    truncated = torch.tensor(
        data.draw(st.lists(st.lists(st.booleans(), min_size=n, max_size=n), min_size=num_groups, max_size=num_groups))
    )
    cfg = AdoraConfig(enabled=True, rule=rule, mode=mode, correct_threshold=0.75, lambda_att=0.2, lambda_amp=2.5)
    plain, _ = compute_group_advantages(rewards, estimator)
    out = compute_step_advantages(GroupBatch(rewards, lengths, truncated=truncated), AdvantageConfig(estimator), cfg)
    assert torch.isfinite(out.advantages).all()
    assert torch.equal(torch.sign(out.advantages), torch.sign(plain))
    ratio_ok = torch.isclose(out.advantages, plain * out.adora.weights.unsqueeze(-1), atol=1e-6)
    assert ratio_ok.all()
    assert all(min(abs(w - v) for v in (1.0, 0.2, 2.5)) < 1e-6 for w in out.adora.weights.tolist())
    classes, _ = classify_groups(rewards, lengths, cfg, truncated=truncated)
    assert torch.equal(classes, out.adora.group_class)
