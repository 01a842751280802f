"""Token estimators gae (PPO with a critic) and reinforce (REINFORCE++): hand computations, ADORA's place, the
critic's loss, OpenRLHF 0.11.2 parity, properties, and the config's refusals."""

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from adora_openrlhf.algorithms.critic import value_loss
from adora_openrlhf.algorithms.pipeline import GroupBatch, response_weights
from adora_openrlhf.algorithms.token_advantages import (
    TOKEN_ESTIMATORS,
    TokenParams,
    compute_token_advantages,
    discounted_returns,
    gae_advantages_and_returns,
    token_rewards,
    whiten,
)
from adora_openrlhf.config import AdoraConfig, ConfigError
from adora_openrlhf.recipes import build_run_config

# two responses of 3 tokens: the first uses all 3 (reward 1), the second 2 (reward 0, its third token is padding)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
REWARDS = torch.tensor([1.0, 0.0])
VALUES = torch.tensor([[0.5, 0.6, 0.8], [0.2, 0.4, 9.9]])  # 9.9 sits on padding: ignored
PARAMS = TokenParams(gamma=0.9, lambd=0.5)

# GAE by hand, gamma 0.9, lambda 0.5 (gamma * lambda = 0.45):
# response 0, r = [0, 0, 1]: delta_2 = 1 - 0.8 = 0.2, A_2 = 0.2
#   delta_1 = 0.9*0.8 - 0.6 = 0.12, A_1 = 0.12 + 0.45*0.2 = 0.21
#   delta_0 = 0.9*0.6 - 0.5 = 0.04, A_0 = 0.04 + 0.45*0.21 = 0.1345; R = A + V = [0.6345, 0.81, 1.0]
# response 1, r = [0, 0]: delta_1 = 0 - 0.4 = -0.4, A_1 = -0.4
#   delta_0 = 0.9*0.4 - 0.2 = 0.16, A_0 = 0.16 + 0.45*(-0.4) = -0.02; R = [0.18, 0.0]
GAE_RAW = [[0.1345, 0.21, 0.2], [-0.02, -0.4, 0.0]]
GAE_RETURNS = [[0.6345, 0.81, 1.0], [0.18, 0.0, 0.0]]
# REINFORCE++ returns, gamma 0.9: [0.81, 0.9, 1.0] and [0, 0]
REINFORCE_RETURNS = [[0.81, 0.9, 1.0], [0.0, 0.0, 0.0]]


def _whitened_by_hand(rows):
    """(x - mean) / sqrt(biased var) over the 5 valid tokens, 0 on the padding token."""
    valid = rows[0] + rows[1][:2]
    mean = sum(valid) / 5
    std = (sum((x - mean) ** 2 for x in valid) / 5) ** 0.5
    return torch.tensor([[(x - mean) / std for x in rows[0]], [(x - mean) / std for x in rows[1][:2]] + [0.0]])


def test_gae_by_hand():
    advantages, returns = gae_advantages_and_returns(VALUES, token_rewards(REWARDS, MASK), MASK, 0.9, 0.5)
    torch.testing.assert_close(advantages, torch.tensor(GAE_RAW))
    torch.testing.assert_close(returns, torch.tensor(GAE_RETURNS))
    out = compute_token_advantages("gae", REWARDS, MASK, values=VALUES, params=PARAMS)
    torch.testing.assert_close(out.advantages, _whitened_by_hand(GAE_RAW))
    torch.testing.assert_close(out.returns, torch.tensor(GAE_RETURNS))


def test_reinforce_by_hand():
    torch.testing.assert_close(
        discounted_returns(token_rewards(REWARDS, MASK), MASK, 0.9), torch.tensor(REINFORCE_RETURNS)
    )
    out = compute_token_advantages("reinforce", REWARDS, MASK, params=PARAMS)
    torch.testing.assert_close(out.advantages, _whitened_by_hand(REINFORCE_RETURNS))
    torch.testing.assert_close(out.returns, torch.tensor(REINFORCE_RETURNS))


def test_adora_weight_before_whitening_for_gae_and_after_normalisation_for_reinforce():
    weights = torch.tensor([1.0, 0.1])  # the second response's group is attenuated
    gae = compute_token_advantages("gae", REWARDS, MASK, values=VALUES, weights=weights, params=PARAMS)
    weighted = [GAE_RAW[0], [0.1 * x for x in GAE_RAW[1]]]
    torch.testing.assert_close(gae.advantages, _whitened_by_hand(weighted))
    torch.testing.assert_close(gae.returns, torch.tensor(GAE_RETURNS))  # the critic's targets: never weighted
    reinforce = compute_token_advantages("reinforce", REWARDS, MASK, weights=weights, params=PARAMS)
    torch.testing.assert_close(reinforce.advantages, _whitened_by_hand(REINFORCE_RETURNS) * weights.unsqueeze(1))
    torch.testing.assert_close(reinforce.returns, torch.tensor(REINFORCE_RETURNS))


def test_kl_penalty_enters_the_token_rewards():
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    expected = torch.tensor([[-0.05, -0.1, 1.0 - 0.15], [-0.2, -0.25, 0.0]])
    torch.testing.assert_close(token_rewards(REWARDS, MASK, kl, kl_coef=0.5), expected)


def test_value_loss_clips_as_openrlhf():
    values, old, returns = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 0.0]]), torch.tensor([[2.0, -1.0]])
    mask = torch.ones(1, 2)
    # token 0: clipped value 0.5 -> (0.5 - 2)^2 = 2.25 > (1 - 2)^2 = 1; token 1: 1 both -> 0.5 * mean(2.25, 1)
    assert float(value_loss(values, old, returns, mask, 0.5)) == pytest.approx(0.5 * (2.25 + 1.0) / 2)
    assert float(value_loss(values, old, returns, mask, None)) == pytest.approx(0.5 * (1.0 + 1.0) / 2)


def test_response_weights_class_groups_as_for_group_estimators():
    cfg = AdoraConfig(enabled=True, correct_threshold=0.5)
    # group 0: correct response longer than the wrong one -> TAS (1); group 1: correct shorter -> TDS (0.1)
    batch = GroupBatch(rewards=torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0]), lengths=torch.tensor([9.0, 3.0, 2.0, 8.0, 8.0]))
    weights, result, metrics = response_weights(batch, [2, 3], cfg)
    torch.testing.assert_close(weights, torch.tensor([1.0, 1.0, 0.1, 0.1, 0.1]))
    assert result.group_class.tolist() == [1, -1]
    assert metrics["adora/tds_fraction"] == 0.5 and metrics["advantage/zero_signal_fraction"] == 0.0
    off, _, _ = response_weights(batch, [2, 3], AdoraConfig(enabled=False))
    assert torch.equal(off, torch.ones(5))


def test_matches_openrlhf_0_11_2():
    """Our gae / reinforce / whitening / value loss against OpenRLHF's own functions on random batches."""
    pytest.importorskip("openrlhf", reason="needs requirements/openrlhf-cpu-test.txt")
    sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "openrlhf"))
    from gpu_stubs import import_openrlhf

    em, loss_mod = import_openrlhf("openrlhf.trainer.ppo_utils.experience_maker", "openrlhf.models.loss")
    maker = em.RemoteExperienceMaker
    gen = torch.Generator().manual_seed(0)
    mask = (torch.arange(7).unsqueeze(0) < torch.tensor([[7], [3], [5], [1]])).float()
    rewards, values = torch.randn(4, generator=gen), torch.randn(4, 7, generator=gen)
    per_token = em.compute_reward(rewards, 0.0, torch.zeros(4, 7), action_mask=mask)
    theirs_adv, theirs_ret = maker.get_advantages_and_returns(None, values, per_token, mask, 0.95, 0.9)
    ours = compute_token_advantages("gae", rewards, mask, values=values, params=TokenParams(0.95, 0.9))
    torch.testing.assert_close(ours.returns, theirs_ret * mask)
    torch.testing.assert_close(ours.advantages, _openrlhf_whiten(theirs_adv, mask))
    theirs_cum = maker.get_cumulative_returns(None, per_token, mask, 0.95)
    ours = compute_token_advantages("reinforce", rewards, mask, params=TokenParams(0.95))
    torch.testing.assert_close(ours.advantages, _openrlhf_whiten(theirs_cum, mask))
    new, old, ret = torch.randn(3, 4, 7, generator=gen)
    torch.testing.assert_close(value_loss(new, old, ret, mask, 0.2), loss_mod.ValueLoss(0.2)(new, old, ret, mask))


def _openrlhf_whiten(adv, mask):
    """OpenRLHF 0.11.2's whitening lines of compute_advantages_and_returns (then padding set to 0, as ours)."""
    flat, m = adv.flatten().float(), mask.flatten()
    mean = (flat * m).sum() / m.sum()
    rstd = (((flat - mean).pow(2) * m).sum() / m.sum()).clamp(min=1e-8).rsqrt()
    return (adv - mean) * rstd * mask


@st.composite
def _batches(draw):
    batch, width = draw(st.integers(1, 5)), draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(0, width), min_size=batch, max_size=batch))
    number = st.floats(-3, 3, allow_nan=False, width=32)
    rewards = torch.tensor(draw(st.lists(number, min_size=batch, max_size=batch)))
    if draw(st.booleans()):
        rewards = torch.full_like(rewards, float(rewards[0]))  # every reward equal: zero variance for reinforce
    values = torch.tensor(
        draw(st.lists(st.lists(number, min_size=width, max_size=width), min_size=batch, max_size=batch))
    )
    weights = torch.tensor(draw(st.lists(st.sampled_from([0.1, 1.0, 2.0]), min_size=batch, max_size=batch)))
    mask = (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).float()
    return rewards, mask, values, weights, draw(st.floats(0, 1)), draw(st.floats(0, 1))


@settings(max_examples=60, deadline=None)
@given(_batches(), st.sampled_from(sorted(TOKEN_ESTIMATORS)))
def test_properties(batch, estimator):
    rewards, mask, values, weights, gamma, lambd = batch
    out = compute_token_advantages(
        estimator, rewards, mask, values=values, weights=weights, params=TokenParams(gamma, lambd)
    )
    assert out.advantages.shape == out.returns.shape == mask.shape
    assert torch.isfinite(out.advantages).all() and torch.isfinite(out.returns).all()
    assert torch.all(out.advantages[mask == 0] == 0) and torch.all(out.returns[mask == 0] == 0)
    plain = compute_token_advantages(estimator, rewards, mask, values=values, params=TokenParams(gamma, lambd))
    torch.testing.assert_close(out.returns, plain.returns)  # ADORA never touches the returns
    if estimator == "reinforce":  # weights scale each response's normalised advantages
        torch.testing.assert_close(out.advantages, plain.advantages * weights.unsqueeze(1))


def test_zero_variance_batch_gives_zero_not_nan():
    mask = torch.ones(3, 4)
    out = compute_token_advantages("reinforce", torch.ones(3), mask)
    assert torch.all(out.advantages == 0)
    assert torch.all(whiten(torch.zeros(2, 2), torch.zeros(2, 2)) == 0)


def test_bad_inputs():
    with pytest.raises(ValueError, match="needs the critic's values"):
        compute_token_advantages("gae", REWARDS, MASK)
    with pytest.raises(ValueError, match="must be > 0"):
        compute_token_advantages("reinforce", REWARDS, MASK, weights=torch.tensor([1.0, 0.0]))
    with pytest.raises(ConfigError, match="unknown token-level advantage estimator"):
        compute_token_advantages("nope", REWARDS, MASK)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"advantage.estimator": "bogus"},
            r"^advantage.estimator: unknown advantage estimator 'bogus'; choose one of \[.*'gae'",
        ),
        ({"advantage.gamma": 0.9}, r"^advantage.gamma: the group estimator 'group_norm' uses undiscounted rewards"),
        ({"advantage.estimator": "reinforce", "advantage.lambd": 0.95}, r"^advantage.lambd: GAE's lambda applies"),
        ({"advantage.estimator": "gae", "advantage.gamma": 1.5}, r"^advantage.gamma"),
        (
            {"advantage.estimator": "gae", "sampling.n_keep": 1, "adora.enabled": True},
            r"^adora.enabled: advantage.estimator 'gae' with sampling.n_keep 1",
        ),
        (
            {"advantage.estimator": "reinforce", "sampling.n_keep": 1, "sampling.enabled": True},
            r"^sampling.enabled: advantage.estimator 'reinforce'",
        ),
        ({"advantage.estimator": "gae", "adora.enabled": True, "adora.length_shaping": True}, r"^adora.length_shaping"),
        ({"critic.value_clip": 0.0}, r"^critic.value_clip"),
    ],
)
def test_config_refusals(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_run_config("kk-tiny", overrides)


def test_config_accepts_token_estimators_without_a_group():
    cfg = build_run_config("kk-tiny", {"advantage.estimator": "gae", "sampling.n_keep": 1, "advantage.lambd": 0.95})
    assert cfg.advantage.token_level and cfg.advantage.lambd == 0.95
    with pytest.raises(ConfigError, match="n_keep = 1"):  # a group estimator still needs a group
        build_run_config("kk-tiny", {"sampling.n_keep": 1})


def test_the_openrlhf_backend_maps_token_estimators_to_openrlhfs_flags():
    flags = pytest.importorskip("adora_openrlhf.backends.openrlhf.flags")
    gae = {"advantage.estimator": "gae", "sampling.enabled": False, "advantage.lambd": 0.95, "critic.lr": 2e-5}
    derived = flags.derived_flags(build_run_config("dapo-math-adora", gae))
    assert derived["algo.advantage.estimator"] == "gae" and derived["algo.advantage.lambd"] == 0.95
    assert derived["critic.adam.lr"] == 2e-5 and derived["critic.value_clip"] == 0.5
    assert derived["critic.lr_scheduler"] == "constant"  # as the local backend's critic
    derived = flags.derived_flags(build_run_config("dapo-math-adora", {"advantage.estimator": "reinforce"}))
    assert derived["algo.advantage.gamma"] == 1.0 and "critic.adam.lr" not in derived
    assert "algo.advantage.lambd" not in derived
    with pytest.raises(ConfigError, match=r"^critic.value_clip: OpenRLHF's critic always clips"):
        flags.derived_flags(build_run_config("dapo-math-adora", {**gae, "critic.value_clip": None}))
    with pytest.raises(ConfigError, match=r"^critic.epochs: not supported by the openrlhf backend"):
        flags.derived_flags(build_run_config("dapo-math-adora", {**gae, "critic.epochs": 2}))


def test_openrlhf_dry_run_with_a_critic_and_a_passed_through_estimator(capsys):
    """gae with ADORA and the sampler: OpenRLHF's parser names its critic (the policy's model) and takes the critic's
    settings; OpenRLHF's own flags passed through (estimator, gamma, critic lr) are read back into the config."""
    pytest.importorskip("openrlhf", reason="needs requirements/openrlhf-cpu-test.txt")
    import json

    from adora_openrlhf.train import main

    argv = ["--backend", "openrlhf", "--recipe", "dapo-math-adora", "--print-args"]
    gae = ["--advantage.estimator", "gae", "--advantage.lambd", "0.95", "--critic.lr", "2e-5"]
    assert main([*argv, *gae, "--critic.num_gpus_per_node", "128"]) == 2  # 128 ranks x micro-batches of 8 > 512
    assert "critic.num_gpus_per_node: OpenRLHF's critic runs on 128 ranks" in capsys.readouterr().err
    assert main([*argv, *gae]) == 0
    report = json.loads(capsys.readouterr().out)
    args, cfg = report["openrlhf_args"], report["run_config"]
    assert args["critic"]["model_name_or_path"] == args["actor"]["model_name_or_path"]
    assert args["critic"]["adam"]["lr"] == 2e-5 and args["algo"]["advantage"]["lambd"] == 0.95
    assert cfg["adora"]["enabled"] and cfg["sampling"]["enabled"]
    flags = ["--algo.advantage.estimator", "reinforce", "--algo.advantage.gamma", "0.9", "--critic.adam.lr", "3e-6"]
    assert main([*argv, *flags]) == 0
    report = json.loads(capsys.readouterr().out)
    args, cfg = report["openrlhf_args"], report["run_config"]
    assert cfg["advantage"]["estimator"] == "reinforce" and cfg["advantage"]["gamma"] == 0.9
    assert args["critic"]["model_name_or_path"] is None and cfg["critic"]["lr"] == 1e-5  # no critic: not read back
