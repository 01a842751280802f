"""RL learning-rate schedules: the same factors as transformers' ``get_scheduler`` (what OpenRLHF's
``--actor.lr_scheduler`` builds), per-epoch learning rates of the local trainer, and the OpenRLHF mapping."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from adora_openrlhf.algorithms.lr_schedules import LR_SCHEDULES, lr_factor, warmup_steps
from adora_openrlhf.backends.local.rl_step import scheduled_lrs
from adora_openrlhf.config import ConfigError, PolicyLossConfig


def transformers_factors(name: str, total: int, ratio: float, min_ratio: float) -> list[float]:
    """The factor at each optimiser step as OpenRLHF builds the scheduler (deepspeed.py: get_scheduler with
    ceil(total * ratio) warm-up steps, min_lr_rate for cosine_with_min_lr)."""
    from transformers import get_scheduler

    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=1.0)
    kwargs = {"min_lr_rate": min_ratio} if name == "cosine_with_min_lr" else {}
    scheduler = get_scheduler(
        name,
        optimizer,
        num_warmup_steps=math.ceil(total * ratio),
        num_training_steps=total,
        scheduler_specific_kwargs=kwargs,
    )
    factors = []
    for _ in range(total):
        factors.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return factors


@pytest.mark.parametrize("name", list(LR_SCHEDULES.names()))
@pytest.mark.parametrize("total, ratio, min_ratio", [(40, 0.0, 0.1), (40, 0.05, 0.1), (17, 0.2, 0.3), (1, 0.0, 0.1)])
def test_factors_match_transformers(name, total, ratio, min_ratio):
    ours = [lr_factor(name, k, total, ratio, min_ratio) for k in range(total)]
    assert ours == pytest.approx(transformers_factors(name, total, ratio, min_ratio), abs=1e-12)


def test_hand_computed_cosine_with_min_lr():
    # K = 10, w = ceil(10 * 0.2) = 2: k=0 -> 0, k=1 -> 1/2, k=2 -> 1, k=6 -> p = 4/8 -> 0.1 + 0.9 * 0.5 = 0.55
    assert warmup_steps(10, 0.2) == 2
    assert [lr_factor("cosine_with_min_lr", k, 10, 0.2, 0.1) for k in (0, 1, 2, 6)] == pytest.approx(
        [0.0, 0.5, 1.0, 0.55]
    )
    assert lr_factor("constant", 0, 10, 0.2, 0.1) == 1.0  # constant has no warm-up


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["constant", "constant_with_warmup", "linear", "cosine", "cosine_with_min_lr"]),
    st.integers(1, 200),
    st.floats(0, 0.5),
    st.floats(0, 1),
)
def test_factors_stay_in_range(name, total, ratio, min_ratio):
    factors = [lr_factor(name, k, total, ratio, min_ratio) for k in range(total)]
    assert all(0.0 <= f <= 1.0 and math.isfinite(f) for f in factors)
    after = factors[warmup_steps(total, ratio) :]
    assert all(a >= b - 1e-12 for a, b in zip(after, after[1:], strict=False))  # never rises after the warm-up
    if name == "cosine_with_min_lr" and after:
        assert min(after) >= min_ratio - 1e-12


def test_local_trainer_rates_per_epoch():
    train = PolicyLossConfig(lr=1e-3, lr_scheduler="linear", ppo_epochs=2)
    # optimiser steps k = 2 * step + epoch of K = 2 * 5 = 10, linear decay (10 - k) / 10
    assert scheduled_lrs(train, 0, 5) == pytest.approx([1e-3, 0.9e-3])
    assert scheduled_lrs(train, 4, 5) == pytest.approx([0.2e-3, 0.1e-3])
    assert scheduled_lrs(PolicyLossConfig(lr=1e-3), 3, 5) == [1e-3]  # constant


def test_policy_update_applies_the_rates():
    from adora_openrlhf.backends.local.update import pack, policy_update
    from adora_openrlhf.config import TinyModelConfig
    from adora_openrlhf.engine.model import build_tiny_model
    from adora_openrlhf.engine.tokenization import train_bpe_tokenizer

    tok = train_bpe_tokenizer(["Alice says Bob is a knave.", "<think>x</think><answer>y</answer>"] * 4, 300)
    tiny = TinyModelConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    model = build_tiny_model(tiny, tok, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0)
    batch = pack([[1, 2], [3]], [[4, 5, 6], [7, 8]], tok.pad_token_id)
    cfg = PolicyLossConfig(lr=1.0, ppo_epochs=2, micro_batch_size=2)
    out = policy_update(model, optimizer, batch, torch.tensor([1.0, -1.0]), cfg, norm_length=4, lrs=[2e-3, 1e-3])
    assert optimizer.param_groups[0]["lr"] == 1e-3 and out["train/lr"] == pytest.approx(1.5e-3)  # the epochs' mean


def test_config_validation_names_the_field():
    with pytest.raises(ConfigError, match="train.lr_scheduler"):
        PolicyLossConfig(lr_scheduler="polynomial")
    with pytest.raises(ConfigError, match="train.lr_warmup_ratio"):
        PolicyLossConfig(lr_warmup_ratio=1.0)
    with pytest.raises(ConfigError, match="train.min_lr_ratio"):
        PolicyLossConfig(min_lr_ratio=-0.1)
