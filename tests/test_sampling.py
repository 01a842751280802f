"""Adaptive multi-round sampler: hand-traced runs, exit rules, escalation, pool statistics, properties."""

import itertools
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from adora_openrlhf.algorithms.advantages import compute_group_advantages
from adora_openrlhf.algorithms.sampling import (
    EXIT_RULES,
    AdaptiveSampler,
    GenerationRequest,
    ScoredResponse,
    escalated_params,
)
from adora_openrlhf.config import AdaptiveSamplingConfig, ConfigError, SamplingParams

BASE = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=16)


class ScriptedEngine:
    """generate() that answers each prompt from a fixed outcome script (1 = positive) and logs requests."""

    def __init__(self, scripts):
        self.scripts = {p: itertools.cycle(s) for p, s in scripts.items()}
        self.requests: list[GenerationRequest] = []
        self.counter = itertools.count()

    def __call__(self, requests):
        self.requests.extend(requests)
        out = []
        for req in requests:
            group = []
            for _ in range(req.num_samples):
                ok = next(self.scripts[req.prompt_index])
                group.append(ScoredResponse(reward=float(ok), positive=bool(ok), length=5, payload=next(self.counter)))
            out.append(group)
        return out


def cfg(**kw):
    base = dict(enabled=True, exit_rule="balance", n_keep=4, samples_per_round=2, max_rounds=4, positive_threshold=0.5)
    base.update(kw)
    return AdaptiveSamplingConfig(**base)


def test_balance_hand_trace():
    # p0 always right, p1 always wrong, p2 alternates, p3: 0 0 | 0 1 | 1 0
    engine = ScriptedEngine({0: [1], 1: [0], 2: [1, 0], 3: [0, 0, 0, 1, 1, 0]})
    result = AdaptiveSampler(cfg(), BASE, seed=0).sample(4, engine, step=0)
    # round 0: 2 each (pool 2 < n=4, nobody retires); round 1: p2 has 2+/2- -> retires; p3 has 1+/3- and
    # needs floor(4/2) = 2 positives; round 2: p3 reaches 2+/4- -> retires; p0 and p1 run to max_rounds.
    groups = {g.prompt_index: g for g in result.groups}
    assert groups[2].retired_round == 1
    assert len(groups[3].pool_rewards) == 6 and groups[3].retired_round == 2  # 2+/4- after round 2
    assert groups[0].retired_round is None and groups[1].retired_round is None
    assert len(groups[0].pool_rewards) == 8  # budget 4 rounds x 2
    assert result.metrics["sampling/responses_generated"] == 8 + 8 + 4 + 6
    # every response has 5 tokens, kept or not
    assert result.metrics["sampling/tokens_generated"] == 5 * (8 + 8 + 4 + 6)
    assert result.metrics["sampling/rounds_used"] == 4
    assert [result.metrics[f"sampling/retired_round_{r}"] for r in range(4)] == [0, 1, 1, 0]
    assert result.metrics["sampling/unfinished_prompts"] == 2
    # balanced down-sampling: p3 keeps 2 positives + 2 negatives; fallback prompts keep 4 of their class
    assert sorted(r.reward for r in groups[3].kept) == [0.0, 0.0, 1.0, 1.0]
    assert [r.reward for r in groups[0].kept] == [1.0] * 4
    # only active prompts are asked in later rounds
    round_prompts = {r: sorted(q.prompt_index for q in engine.requests if q.round == r) for r in range(4)}
    assert round_prompts == {0: [0, 1, 2, 3], 1: [0, 1, 2, 3], 2: [0, 1, 3], 3: [0, 1]}
    # baseline from the whole pool: p3 pool = 2 of 6 positive
    assert result.pool_stats.mean[3].item() == pytest.approx(2 / 6)
    assert result.pool_stats.count.tolist() == [8, 8, 4, 6]


def test_pos_rule_hand_trace_and_kept_order():
    engine = ScriptedEngine({0: [0, 0, 0, 0, 0, 1], 1: [1, 0]})
    result = AdaptiveSampler(cfg(exit_rule="pos", samples_per_round=4, max_rounds=3), BASE, seed=0).sample(2, engine)
    g0, g1 = result.groups
    assert g1.retired_round == 0 and g0.retired_round == 1  # p0's first positive is its 6th response
    # pos keeps positives first: p0 keeps its one positive + 3 negatives, in generation order
    assert sum(r.positive for r in g0.kept) == 1 and len(g0.kept) == 4
    assert [r.payload for r in g0.kept] == sorted(r.payload for r in g0.kept)
    assert sum(r.positive for r in g1.kept) == 2


def test_retire_needs_n_responses_even_if_rule_holds():
    engine = ScriptedEngine({0: [1]})
    result = AdaptiveSampler(cfg(exit_rule="pos", samples_per_round=1, max_rounds=5), BASE).sample(1, engine)
    assert result.groups[0].retired_round == 3 and len(result.groups[0].pool_rewards) == 4


def test_drop_unfinished():
    engine = ScriptedEngine({0: [1], 1: [1, 0]})
    result = AdaptiveSampler(cfg(drop_unfinished=True), BASE).sample(2, engine)
    assert result.dropped == [0] and [g.prompt_index for g in result.groups] == [1]
    assert result.pool_stats.count.tolist() == [4]
    assert result.metrics["sampling/dropped_prompts"] == 1


def test_disabled_is_one_round_of_n_kept_in_order():
    engine = ScriptedEngine({0: [1, 1, 1, 1], 1: [0, 1, 0, 1]})
    sampler = AdaptiveSampler(AdaptiveSamplingConfig(enabled=False, n_keep=4, escalation=[{"temperature": 2.0}]), BASE)
    result = sampler.sample(2, engine)
    assert [q.num_samples for q in engine.requests] == [4, 4]
    assert all(q.params == BASE for q in engine.requests)
    assert [r.payload for r in result.groups[1].kept] == [4, 5, 6, 7]
    assert result.metrics["sampling/responses_generated"] == 8
    assert result.metrics["sampling/tokens_generated"] == 5 * 8
    adv, _ = compute_group_advantages(result.kept_rewards(), "group_norm", pool_stats=result.pool_stats)
    plain, _ = compute_group_advantages(result.kept_rewards(), "group_norm")
    assert torch.equal(adv, plain)


def test_budget_cap_on_responses_per_prompt():
    engine = ScriptedEngine({0: [0]})
    result = AdaptiveSampler(cfg(samples_per_round=3, max_rounds=4, max_responses_per_prompt=7), BASE).sample(1, engine)
    assert [q.num_samples for q in engine.requests] == [3, 3, 1]
    assert len(result.groups[0].pool_rewards) == 7


def test_escalation_schedule_and_trigger():
    c = cfg(escalation=[{"temperature": 1.2}, {"temperature": 1.5, "top_k": 50}], trigger_after_step=3)
    assert escalated_params(c, BASE, 0, step=5) == BASE
    assert escalated_params(c, BASE, 1, step=5).temperature == 1.2
    assert escalated_params(c, BASE, 2, step=5) == BASE.override({"temperature": 1.5, "top_k": 50})
    assert escalated_params(c, BASE, 3, step=5).temperature == 1.5  # last set repeats
    assert escalated_params(c, BASE, 2, step=2) == BASE  # before trigger_after_step
    engine = ScriptedEngine({0: [0]})
    AdaptiveSampler(c, BASE).sample(1, engine, step=3)
    assert [q.params.temperature for q in engine.requests] == [1.0, 1.2, 1.5, 1.5]


def test_history_pool_scope_accumulates_across_steps_and_checkpoints():
    c = cfg(pool_scope="history", samples_per_round=4, max_rounds=1, n_keep=4)
    sampler = AdaptiveSampler(c, BASE)
    sampler.sample(1, ScriptedEngine({0: [1]}), step=0, prompt_keys=["q"])
    result = sampler.sample(1, ScriptedEngine({0: [0]}), step=1, prompt_keys=["q"])
    assert result.pool_stats.count.tolist() == [8]
    assert result.pool_stats.mean.item() == pytest.approx(0.5)
    # std of four 1s and four 0s, unbiased: sqrt(8*0.25/7)
    assert result.pool_stats.std.item() == pytest.approx((2 / 7) ** 0.5, rel=1e-6)
    restored = AdaptiveSampler(c, BASE)
    restored.load_state_dict(sampler.state_dict())
    again = restored.sample(1, ScriptedEngine({0: [1]}), step=2, prompt_keys=["q"])
    assert again.pool_stats.count.tolist() == [12]


def test_generate_contract_errors():
    sampler = AdaptiveSampler(cfg(), BASE)
    with pytest.raises(ValueError, match="asked for 2 responses, got 1"):
        sampler.sample(1, lambda reqs: [[ScoredResponse(1.0, True)] for _ in reqs])
    with pytest.raises(ValueError, match="response lists"):
        sampler.sample(2, lambda reqs: [])
    with pytest.raises(ValueError, match="num_prompts"):
        sampler.sample(0, lambda reqs: [])
    with pytest.raises(ValueError, match="prompt_keys"):
        sampler.sample(2, lambda reqs: [], prompt_keys=["a"])


def test_config_errors():
    with pytest.raises(ConfigError, match="sampling.exit_rule"):
        AdaptiveSamplingConfig(exit_rule="balanced")
    with pytest.raises(ConfigError, match="smaller than n_keep"):
        AdaptiveSamplingConfig(enabled=True, n_keep=16, samples_per_round=4, max_rounds=2)
    with pytest.raises(ConfigError, match=r"sampling.escalation\[0\]"):
        AdaptiveSamplingConfig(escalation=[{"temprature": 1.2}])
    with pytest.raises(ConfigError, match="sampling.pool_scope"):
        AdaptiveSamplingConfig(pool_scope="epoch")
    with pytest.raises(ConfigError, match="rollout.temperature"):
        SamplingParams(temperature=0)


@settings(max_examples=60, deadline=None)
@given(
    probs=st.lists(st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]), min_size=1, max_size=6),
    n=st.integers(1, 6),
    per_round=st.integers(1, 6),
    rounds=st.integers(1, 4),
    rule=st.sampled_from(sorted(EXIT_RULES)),
    cap=st.one_of(st.none(), st.integers(1, 24)),
    seed=st.integers(0, 3),
    drop=st.booleans(),
)
def test_sampler_properties(probs, n, per_round, rounds, rule, cap, seed, drop):
    try:
        c = AdaptiveSamplingConfig(
            enabled=True,
            exit_rule=rule,
            n_keep=n,
            samples_per_round=per_round,
            max_rounds=rounds,
            max_responses_per_prompt=cap,
            drop_unfinished=drop,
        )
    except ConfigError:
        assert min(rounds * per_round, cap or 10**9) < n
        return

    def run():
        rng = random.Random(seed)
        ids = itertools.count()

        def generate(requests):
            return [
                [
                    ScoredResponse(
                        reward=float(ok), positive=ok, length=rng.randint(1, 9), payload=(q.prompt_index, next(ids))
                    )
                    for ok in (rng.random() < probs[q.prompt_index] for _ in range(q.num_samples))
                ]
                for q in requests
            ]

        return AdaptiveSampler(c, BASE, seed=seed).sample(len(probs), generate, step=1)

    result = run()
    total = 0
    for g in result.groups:
        pool_size = len(g.pool_rewards)
        total += pool_size
        assert pool_size <= c.response_budget  # budget never exceeded
        assert len(g.kept) == min(n, pool_size) == n  # budget >= n so every kept group is full
        assert all(r.payload[0] == g.prompt_index for r in g.kept)  # never invents or mixes responses
        assert len({r.payload for r in g.kept}) == len(g.kept)
        pos = sum(1 for r in g.pool_rewards if r > 0.5)
        kept_pos = sum(r.positive for r in g.kept)
        if rule == "balance" and 0 < pos < pool_size and n >= 2:
            assert 0 < kept_pos < n  # both classes kept when the pool has both
        if rule == "pos" and pos < n:
            assert kept_pos == pos  # positives first
        if g.retired_round is not None:
            assert EXIT_RULES[rule].is_done(pos, pool_size - pos, n)
    assert result.metrics["sampling/rounds_used"] <= rounds
    assert not drop or all(g.retired_round is not None for g in result.groups)
    # deterministic under a seed
    again = run()
    assert [[r.payload for r in g.kept] for g in again.groups] == [[r.payload for r in g.kept] for g in result.groups]
    if result.groups:
        adv, _ = compute_group_advantages(result.kept_rewards(), "group_norm", pool_stats=result.pool_stats)
        assert torch.isfinite(adv).all()
