"""ADORA's verl estimators: the formula on hand-computed groups (no verl needed), and, marked ``verl``, against verl
0.9.1 itself: its GRPO estimator on the same inputs and its own ``compute_advantage`` on a ``DataProto``.

verl 0.9.1 pins transformers < 5.11, so it cannot share the test venv (transformers 5.15.0): the ``verl`` tests run
in a venv of their own (scripts/install_verl_test_env.sh; .ci/run runs them there) and are skipped where ``import verl``
fails, as in the main suite.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from adora_openrlhf.config import AdoraConfig, ConfigError
from adora_openrlhf.integrations.verl import DEFAULT_ESTIMATORS, adora_grpo_advantage, estimators_from_env

ATTENUATE = AdoraConfig(enabled=True, rule="length", mode="attenuate", edge_policy="llm", correct_threshold=0.5)
OFF = AdoraConfig(enabled=False)


def _batch(scores, lengths, width=10):
    """verl's inputs: the score on each response's last token, the response mask of its length."""
    mask = torch.zeros(len(scores), width)
    rewards = torch.zeros(len(scores), width)
    for i, (s, n) in enumerate(zip(scores, lengths, strict=True)):
        mask[i, :n] = 1
        rewards[i, n - 1] = s
    return rewards, mask


def test_hand_computed_groups_of_three_sizes():
    """group a: scores [1, 0, 1, 0], lengths [10, 4, 6, 8]: max correct length 10 > mean incorrect 6 -> TAS, weight 1,
    mean 0.5, std sqrt(1/3), A = +-0.5 / (sqrt(1/3) + 1e-6). group b: [1, 0, 0], lengths [3, 9, 7]: 3 < 8 -> TDS, weight
    0.1, mean 1/3, std sqrt(1/3), A = 0.1 * [2/3, -1/3, -1/3] / (sqrt(1/3) + 1e-6). group c: one response -> 0."""
    index = np.array(["a", "b", "a", "c", "b", "a", "b", "a"], dtype=object)
    scores = [1, 1, 0, 1, 0, 1, 0, 0]
    lengths = [10, 3, 4, 5, 9, 6, 7, 8]
    rewards, mask = _batch(scores, lengths)
    adv, returns = adora_grpo_advantage(rewards, mask, index, adora=ATTENUATE)
    s = math.sqrt(1 / 3) + 1e-6
    per_response = [
        0.5 / s,
        0.1 * (2 / 3) / s,
        -0.5 / s,
        0.0,
        0.1 * (-1 / 3) / s,
        0.5 / s,
        0.1 * (-1 / 3) / s,
        -0.5 / s,
    ]
    assert torch.equal(adv, returns)
    assert adv.sum(-1).div(mask.sum(-1)).tolist() == pytest.approx(per_response, rel=1e-6, abs=1e-9)
    assert bool((adv[mask == 0] == 0).all())  # padding gets no advantage


def test_dr_grpo_through_the_config_and_amplify():
    rewards, mask = _batch([2, 0, 0, 0], [3, 5, 6, 7])  # 3 < 6 -> TDS: amplify leaves it; TAS groups get 2x
    config = {"norm_adv_by_std_in_grpo": False}
    adv, _ = adora_grpo_advantage(
        rewards, mask, [0, 0, 0, 0], config=config, adora=AdoraConfig(enabled=True, mode="amplify", edge_policy="llm")
    )
    assert adv.sum(-1).div(mask.sum(-1)).tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5])
    rewards, mask = _batch([2, 0, 0, 0], [9, 5, 6, 7])  # 9 > 6 -> TAS: x 2
    adv, _ = adora_grpo_advantage(
        rewards, mask, [0, 0, 0, 0], config=config, adora=AdoraConfig(enabled=True, mode="amplify", edge_policy="llm")
    )
    assert adv.sum(-1).div(mask.sum(-1)).tolist() == pytest.approx([3.0, -1.0, -1.0, -1.0])


@settings(max_examples=50)
@given(
    scores=st.lists(st.sampled_from([0.0, 1.0, 3.0, -0.5]), min_size=2, max_size=12),
    lengths=st.lists(st.integers(1, 10), min_size=12, max_size=12),
    groups=st.lists(st.integers(0, 3), min_size=12, max_size=12),
)
def test_weights_keep_signs_and_attenuate_whole_groups(scores, lengths, groups):
    n = len(scores)
    rewards, mask = _batch(scores, lengths[:n])
    plain, _ = adora_grpo_advantage(rewards, mask, groups[:n], adora=OFF)
    weighted, _ = adora_grpo_advantage(rewards, mask, groups[:n], adora=ATTENUATE)
    a, b = plain.sum(-1), weighted.sum(-1)
    assert bool((torch.sign(a) == torch.sign(b)).all()) and bool((b.abs() <= a.abs() + 1e-6).all())
    for g in set(groups[:n]):
        rows = [i for i in range(n) if groups[i] == g and a[i] != 0]
        ratios = {round(float(b[i] / a[i]), 4) for i in rows}
        assert ratios <= {1.0} or ratios <= {0.1}


def test_estimators_from_the_environment():
    found = estimators_from_env(
        {"ADORA_VERL_ESTIMATORS": '{"adora_grpo": {"correct_threshold": 1.0}, "mine": {"lambda_att": 0.3}}'}
    )
    assert set(found) == {*DEFAULT_ESTIMATORS, "mine"}
    assert found["adora_grpo"].correct_threshold == 1.0 and found["adora_grpo"].edge_policy == "llm"
    assert found["mine"].lambda_att == 0.3 and found["mine"].mode == "attenuate"
    assert estimators_from_env({})["adora_grpo_amplify"].mode == "amplify"
    with pytest.raises(ConfigError, match="^ADORA_VERL_ESTIMATORS\\['adora_grpo'\\]: unknown ADORA field"):
        estimators_from_env({"ADORA_VERL_ESTIMATORS": '{"adora_grpo": {"lamda": 1}}'})
    with pytest.raises(ConfigError, match="^ADORA_VERL_ESTIMATORS: not valid JSON"):
        estimators_from_env({"ADORA_VERL_ESTIMATORS": "{"})
    with pytest.raises(ConfigError, match="^adora.lambda_att"):
        estimators_from_env({"ADORA_VERL_ESTIMATORS": '{"adora_grpo": {"lambda_att": 5}}'})


@pytest.mark.verl
def test_with_adora_off_it_is_verls_grpo_estimator():
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    gen = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 4, (24,), generator=gen).float().tolist()
    index = np.array([i // 6 for i in range(24)])
    rewards, mask = _batch(scores, torch.randint(1, 11, (24,), generator=gen).tolist())
    ours, _ = adora_grpo_advantage(rewards, mask, index, adora=OFF)
    theirs, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, index)
    uniform = torch.tensor([len(set(scores[g * 6 : g * 6 + 6])) == 1 for g in range(4)]).repeat_interleave(6)
    assert torch.allclose(ours[~uniform], theirs[~uniform], atol=1e-6)
    assert bool((ours[uniform] == 0).all())


@pytest.mark.verl
def test_verls_compute_advantage_on_a_dataproto_uses_the_registered_estimator():
    ray_trainer = pytest.importorskip("verl.trainer.ppo.ray_trainer")
    from verl import DataProto
    from verl.trainer.config import AlgoConfig

    from adora_openrlhf.integrations.verl import register_adora_estimators

    register_adora_estimators({"adora_grpo_test": ATTENUATE})
    index = np.array(["a", "b", "a", "c", "b", "a", "b", "a"], dtype=object)
    rewards, mask = _batch([1, 1, 0, 1, 0, 1, 0, 0], [10, 3, 4, 5, 9, 6, 7, 8])
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask}, non_tensors={"uid": index}
    )
    out = ray_trainer.compute_advantage(
        data, adv_estimator="adora_grpo_test", config=AlgoConfig(adv_estimator="adora_grpo_test")
    )
    expected, _ = adora_grpo_advantage(rewards, mask, index, adora=ATTENUATE)
    assert torch.equal(out.batch["advantages"], expected) and torch.equal(out.batch["returns"], expected)
    # the same data through verl's own GRPO: ADORA multiplied group b (TDS) by 0.1 and left group a (TAS)
    again = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask}, non_tensors={"uid": index}
    )
    grpo = ray_trainer.compute_advantage(again, "grpo")
    a, b = [0, 2, 5, 7], [1, 4, 6]
    assert torch.allclose(expected[a], grpo.batch["advantages"][a], atol=1e-6)
    assert torch.allclose(expected[b], 0.1 * grpo.batch["advantages"][b], atol=1e-6)


@pytest.mark.verl
def test_the_setup_hook_registers_the_estimators_from_the_environment(monkeypatch):
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    from adora_openrlhf.integrations.verl import setup_hook

    monkeypatch.setenv("ADORA_VERL_ESTIMATORS", '{"adora_grpo": {"correct_threshold": 1.0}}')
    setup_hook()
    for name in DEFAULT_ESTIMATORS:
        assert core_algos.get_adv_estimator_fn(name).adora == estimators_from_env()[name]
    assert core_algos.get_adv_estimator_fn("adora_grpo").adora.correct_threshold == 1.0
