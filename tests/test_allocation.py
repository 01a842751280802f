"""Rollout allocation: posterior predictions, the statistics store, each allocator on hand-computed cases, properties,
the sampler's per-prompt group sizes, advantages of groups of several sizes, and the local backend end to end
(the store checkpointed and restored on resume)."""

import json
import math
import random
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from adora_openrlhf.algorithms.advantages import compute_group_advantages
from adora_openrlhf.algorithms.allocation import (
    ALLOCATORS,
    AllocationConfig,
    AllocationRequest,
    PromptStatsStore,
    allocate,
    beta_mixed_moment,
    beta_moment,
    information_value,
    signal_probability,
    zero_variance_probability,
)
from adora_openrlhf.algorithms.sampling import AdaptiveSampler, SamplingResult, ScoredResponse
from adora_openrlhf.config import AdaptiveSamplingConfig, AdvantageConfig, ConfigError, SamplingParams

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from tiny_runs import tiny_kk_config

PRIOR = (0.5, 0.5)
SURE = (8.5, 0.5)  # Jeffreys prior after one group of 8 all positive


def _request(posteriors, prompts, n, **cfg):
    return AllocationRequest(posteriors, prompts, n, AllocationConfig(**cfg))


def test_beta_moments_by_hand():
    assert beta_moment(1, 1, 2) == pytest.approx(1 / 3)  # E[p^2] under the uniform prior
    assert beta_moment(0.5, 0.5, 2) == pytest.approx(0.5 * 1.5 / (1 * 2))
    assert beta_moment(3, 7, 0) == 1.0
    assert zero_variance_probability(1, 1, 2) == pytest.approx(2 / 3)
    assert signal_probability(1, 1, 2) == pytest.approx(1 / 3)
    assert signal_probability(1, 1, 1) == 0.0 and zero_variance_probability(2, 3, 1) == 1.0
    # Beta(8.5, 0.5), 4 responses: E[p^4] = 8.5*9.5*10.5*11.5 / (9*10*11*12), E[(1-p)^4] = 0.5*1.5*2.5*3.5 / (9*10*11*12)
    assert zero_variance_probability(*SURE, 4) == pytest.approx((9750.5625 + 6.5625) / 11880)


def test_information_value_by_hand():
    # uniform prior: M(1, 2) = B(2, 3) = 1/12, M(3, 2) = B(4, 3) = 1/60, M(1, 4) = B(2, 5) = 1/30, so
    # v(2) = 1/12 - 1/60 - 1/30 = 1/30, which is also 2 E[p^2 (1 - p)^3] = 2 B(3, 4) computed directly
    assert beta_mixed_moment(1, 1, 1, 2) == pytest.approx(1 / 12)
    assert beta_mixed_moment(1, 1, 3, 2) == pytest.approx(1 / 60)
    assert information_value(1, 1, 2) == pytest.approx(1 / 30)
    assert information_value(1, 1, 1) == 0.0 and information_value(3, 2, 0) == 0.0
    # Beta(2, 3), k = 4 against a midpoint rule over the density 12 p (1 - p)^2
    grid = [(i + 0.5) / 20000 for i in range(20000)]
    numeric = sum(12 * p * (1 - p) ** 2 * (1 - p**4 - (1 - p) ** 4) * p * (1 - p) ** 2 for p in grid) / len(grid)
    assert information_value(2, 3, 4) == pytest.approx(numeric, rel=1e-6)


@settings(max_examples=60, deadline=None)
@given(st.floats(0.05, 50), st.floats(0.05, 50), st.integers(1, 30))
def test_information_value_is_bounded_rising_and_concave(a, b, k):
    v = [information_value(a, b, j) for j in (k, k + 1, k + 2)]
    assert all(0.0 <= x <= beta_mixed_moment(a, b, 1, 2) + 1e-12 <= 4 / 27 + 1e-12 for x in v)
    assert v[1] >= v[0] - 1e-12 and v[2] - v[1] <= v[1] - v[0] + 1e-12


def test_knapsack_information_value_prefers_the_prompt_still_being_learned():
    # pass rates near 0.7 and 0.3 give the same signal probability, so "signal" keeps the data order; the information
    # gain p (1 - p)^2 is 0.063 against 0.147, so "information" takes the harder prompt
    posteriors = [(70.0, 30.0), (30.0, 70.0)]
    assert signal_probability(*posteriors[0], 2) == signal_probability(*posteriors[1], 2)
    assert ALLOCATORS.get("knapsack")(_request(posteriors, 1, 2, value="signal")) == [2, 0]
    assert ALLOCATORS.get("knapsack")(_request(posteriors, 1, 2, value="information")) == [0, 2]


def test_store_update_with_decay_and_bound():
    store = PromptStatsStore(prior=(1, 1), decay=0.5, max_prompts=2)
    assert store.posterior("a") == (1, 1) and store.observations("a") == 0
    store.observe("a", 3, 4)
    assert store.posterior("a") == (4, 2)
    store.observe("a", 0, 4)  # a = 1 + 0.5 * 3 + 0, b = 1 + 0.5 * 1 + 4
    assert store.posterior("a") == pytest.approx((2.5, 5.5)) and store.observations("a") == 2
    store.observe("b", 1, 2)
    store.observe("a", 1, 1)  # a becomes the most recently observed
    store.observe("c", 0, 2)  # over the bound: b, the least recently observed, is forgotten
    assert len(store) == 2 and store.observations("b") == 0 and store.observations("a") == 3
    with pytest.raises(ValueError, match="positives"):
        store.observe("a", 3, 2)


def test_store_state_is_plain_data_and_round_trips():
    store = PromptStatsStore(prior=(0.5, 0.5), decay=0.8, max_prompts=10)
    for i in range(5):
        store.observe(f"prompt {i}", i % 3, 4)
    state = json.loads(json.dumps(store.state_dict()))
    other = PromptStatsStore(prior=(0.5, 0.5), decay=0.8, max_prompts=10)
    other.load_state_dict(state)
    assert [other.posterior(f"prompt {i}") for i in range(5)] == [store.posterior(f"prompt {i}") for i in range(5)]
    assert other.state_dict() == store.state_dict()


def test_uniform_takes_the_first_prompts():
    assert ALLOCATORS.get("uniform")(_request([PRIOR] * 5, 3, 4)) == [4, 4, 4, 0, 0]


def test_skip_by_hand():
    # n = 4: z(SURE) = 0.8213 >= 0.7 is skipped; z(prior) = 2 * 0.2734 = 0.547 is kept
    counts = ALLOCATORS.get("skip")(_request([SURE, PRIOR, SURE, PRIOR, PRIOR], 2, 4, skip_threshold=0.7))
    assert counts == [0, 4, 0, 4, 0]  # two kept, then stop
    assert ALLOCATORS.get("skip")(_request([SURE, PRIOR], 2, 4, skip_threshold=0.9)) == [4, 4]


def test_difficulty_prefers_the_uncertain():
    posteriors = [SURE, (4.5, 4.5), (0.5, 8.5), PRIOR]
    assert ALLOCATORS.get("difficulty")(_request(posteriors, 2, 4, candidates=2)) == [0, 4, 0, 4]


def test_knapsack_by_hand():
    # B = 1.0 * 2 * 2 = 4. Gains per response: prior's first item s(2)/2 = 0.125, then s(3)-s(2) = 0.125, then
    # s(4)-s(3) = 0.078; SURE's first item s(2)/2 = 0.047. The prior's items win until the budget is spent.
    counts = ALLOCATORS.get("knapsack")(
        _request([PRIOR, SURE], 2, 2, candidates=1, budget=1.0, min_responses=2, max_responses=4)
    )
    assert counts == [4, 0]
    # with a cap of 2 per prompt the rest of the budget goes to SURE
    assert ALLOCATORS.get("knapsack")(_request([PRIOR, SURE], 2, 2, budget=1.0, min_responses=2, max_responses=2)) == [
        2,
        2,
    ]
    # at most P prompts are opened
    assert sum(c > 0 for c in ALLOCATORS.get("knapsack")(_request([PRIOR] * 6, 2, 4, budget=2.0))) == 2


def test_allocate_explores_and_never_samples_nothing():
    store = PromptStatsStore(prior=PRIOR)
    for key in "abcd":
        store.observe(key, 8, 8)
    cfg = AllocationConfig(method="skip", skip_threshold=0.5, explore=0.0)
    sampled = allocate(store, list("abcd"), 2, 8, cfg, random.Random(0))
    # the fallback
    assert sum(c > 0 for c in sampled.counts) == 1 and sampled.metrics["allocation/prompts_skipped"] == 3
    explored = allocate(
        store, list("abcd"), 2, 8, AllocationConfig(method="skip", skip_threshold=0.5, explore=1.0), random.Random(0)
    )
    assert explored.counts == [8, 8, 0, 0]  # every candidate scored with the prior


def knapsack_by_full_rescan(req: AllocationRequest) -> list[int]:
    """The knapsack greedy as its docstring states it, rescanning every candidate's next item each round."""
    cfg, value = req.cfg, {"signal": signal_probability, "information": information_value}[req.cfg.value]
    budget, counts, spent, opened = cfg.knapsack_budget(req.prompts, req.group_size), [0] * len(req.posteriors), 0, 0
    while True:
        best = None  # (gain per response, candidate, cost)
        for i, (a, b) in enumerate(req.posteriors):
            k = counts[i]
            if k >= cfg.max_responses or (k == 0 and opened >= req.prompts):
                continue
            step = cfg.min_responses if k == 0 else 1
            gain = (value(a, b, k + step) - value(a, b, k)) / step
            if step <= budget - spent and gain > 0 and (best is None or gain > best[0]):
                best = (gain, i, step)
        if best is None:
            return counts
        opened += counts[best[1]] == 0
        counts[best[1]] += best[2]
        spent += best[2]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([0.5, 1.5, 4.5, 8.5]), st.sampled_from([0.5, 1.5, 4.5, 8.5])), max_size=16)
    | st.lists(st.tuples(st.floats(0.05, 30), st.floats(0.05, 30)), min_size=1, max_size=16),
    st.integers(1, 6),
    st.integers(2, 8),
    st.floats(0.1, 2.0),
    st.integers(2, 4),
    st.integers(0, 6),
    st.sampled_from(["signal", "information"]),
)
def test_knapsack_properties(posteriors, prompts, n, budget, min_responses, extra, value):
    """Within the budget, group sizes and prompt count; and the same allocation as the round-by-round rescan, ties
    (repeated posteriors) included."""
    cfg = {"budget": budget, "min_responses": min_responses, "max_responses": min_responses + extra, "value": value}
    req = _request(posteriors, prompts, n, **cfg)
    counts = ALLOCATORS.get("knapsack")(req)
    assert counts == knapsack_by_full_rescan(req)
    limit = max(min_responses, round(budget * prompts * n))
    assert len(counts) == len(posteriors) and sum(counts) <= limit
    assert all(c == 0 or min_responses <= c <= min_responses + extra for c in counts)
    assert sum(c > 0 for c in counts) <= prompts


@settings(max_examples=60, deadline=None)
@given(st.floats(0.01, 50), st.floats(0.01, 50), st.integers(1, 30))
def test_signal_probability_is_a_probability_rising_with_k(a, b, k):
    s, s_next = signal_probability(a, b, k), signal_probability(a, b, k + 1)
    assert 0.0 <= s <= 1.0 and s_next >= s - 1e-12
    assert math.isclose(s + zero_variance_probability(a, b, k), 1.0, abs_tol=1e-9) or k == 1


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["uniform", "skip", "difficulty", "knapsack"]),
    st.integers(1, 5),
    st.integers(2, 6),
    st.integers(0, 2**16),
)
def test_allocate_properties(method, prompts, n, seed):
    rng = random.Random(seed)
    store = PromptStatsStore(prior=PRIOR)
    keys = [f"k{i}" for i in range(2 * prompts)]
    for key in keys:
        m = rng.randint(1, 8)
        store.observe(key, rng.randint(0, m), m)
    cfg = AllocationConfig(method=method, candidates=2.0, explore=0.2)
    out = allocate(store, keys, prompts, n, cfg, random.Random(seed))
    assert len(out.counts) == len(keys) and any(out.counts) and all(c >= 0 for c in out.counts)
    if method != "knapsack":
        assert all(c in (0, n) for c in out.counts) and sum(c > 0 for c in out.counts) <= prompts


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="allocation.method"):
        AllocationConfig(method="greedy")
    with pytest.raises(ConfigError, match="allocation.candidates"):
        AllocationConfig(method="difficulty", candidates=1.0)
    with pytest.raises(ConfigError, match="allocation.max_responses"):
        AllocationConfig(min_responses=4, max_responses=3)
    with pytest.raises(ConfigError, match="allocation.min_responses"):
        AllocationConfig(min_responses=1)
    with pytest.raises(ConfigError, match="allocation.value"):
        AllocationConfig(method="knapsack", value="gain")
    with pytest.raises(ConfigError, match=r"allocation.prior\[1\]"):
        AllocationConfig(prior=[1.0, 0.0])
    with pytest.raises(ConfigError, match="allocation.decay"):
        AllocationConfig(decay=0.0)


def _scripted(requests):
    return [
        [ScoredResponse(reward=float(i % 2), positive=bool(i % 2), length=3) for i in range(r.num_samples)]
        for r in requests
    ]


def test_sampler_gives_each_prompt_its_group_size():
    plain = AdaptiveSampler(AdaptiveSamplingConfig(n_keep=4), SamplingParams())
    result = plain.sample(3, _scripted, group_sizes=[2, 5, 3])
    assert [len(g.kept) for g in result.groups] == [2, 5, 3] and result.metrics["sampling/responses_generated"] == 10
    assert [g.pool_positives for g in result.groups] == [1, 2, 1]
    ada = AdaptiveSampler(
        AdaptiveSamplingConfig(enabled=True, n_keep=4, samples_per_round=4, max_rounds=2), SamplingParams()
    )
    result = ada.sample(2, _scripted, group_sizes=[2, 4])
    assert [len(g.kept) for g in result.groups] == [2, 4] and all(g.retired_round == 0 for g in result.groups)
    with pytest.raises(ValueError, match="group_sizes"):
        plain.sample(2, _scripted, group_sizes=[2])


def test_advantages_of_groups_of_several_sizes_equal_each_group_alone():
    from adora_openrlhf.backends.local.rl_step import step_advantages
    from adora_openrlhf.recipes import build_run_config

    sampler = AdaptiveSampler(AdaptiveSamplingConfig(n_keep=4), SamplingParams())
    rewards = {0: [1.0, 0.0], 1: [3.0, -0.5, -3.0, 3.0, 0.0], 2: [1.0, 1.0, 0.0]}

    def generate(requests):
        return [
            [ScoredResponse(reward=r, positive=r > 0.5, length=4) for r in rewards[q.prompt_index]] for q in requests
        ]

    result: SamplingResult = sampler.sample(3, generate, group_sizes=[2, 5, 3])
    cfg = build_run_config("kk-tiny", {})
    flat, metrics = step_advantages(cfg, result)
    expected = torch.cat(
        [
            compute_group_advantages(torch.tensor([rewards[p]]), "group_norm", AdvantageConfig().eps)[0][0]
            for p in range(3)
        ]
    )
    assert torch.allclose(flat, expected, atol=1e-6)
    assert metrics["advantage/zero_signal_fraction"] == 0.0
    assert metrics["advantage/mean_abs"] == pytest.approx(float(expected.abs().mean()), rel=1e-6)


@settings(max_examples=60, deadline=None)
@given(
    groups=st.lists(
        st.lists(st.sampled_from([-1.0, 0.0, 0.5, 1.0, 3.0]), min_size=1, max_size=5), min_size=1, max_size=6
    ),
    estimator=st.sampled_from(["group_norm", "dr_grpo", "rloo"]),
    adora_on=st.booleans(),
    pooled=st.booleans(),
)
def test_ragged_advantages_equal_each_group_alone(groups, estimator, adora_on, pooled):
    """Groups of several sizes: every group's advantages, ADORA weight and zero-signal flag are those of the group
    computed alone (with its own pool statistics), and nothing is NaN."""
    from adora_openrlhf.algorithms.advantages import PoolStats
    from adora_openrlhf.algorithms.pipeline import GroupBatch, compute_ragged_step_advantages, compute_step_advantages
    from adora_openrlhf.config import AdoraConfig

    adv_cfg, adora_cfg = AdvantageConfig(estimator=estimator), AdoraConfig(enabled=adora_on, lambda_att=0.1)
    lengths = [[float(4 + 3 * i + j) for j in range(len(g))] for i, g in enumerate(groups)]
    pool = None
    if pooled:  # a pool of 8 responses per group, mean and std of its own
        pool = PoolStats(
            count=torch.full((len(groups),), 8, dtype=torch.long),
            mean=torch.tensor([0.25 * i for i in range(len(groups))]),
            std=torch.tensor([0.5 + 0.1 * i for i in range(len(groups))]),
        )
    flat = GroupBatch(torch.tensor([r for g in groups for r in g]), torch.tensor([x for g in lengths for x in g]))
    out = compute_ragged_step_advantages(flat, [len(g) for g in groups], adv_cfg, adora_cfg, pool)
    assert out.advantages.shape == (sum(map(len, groups)),) and not out.advantages.isnan().any()
    start = 0
    for i, (rewards, lens) in enumerate(zip(groups, lengths, strict=True)):
        one_pool = None if pool is None else PoolStats(pool.count[i : i + 1], pool.mean[i : i + 1], pool.std[i : i + 1])
        alone = compute_step_advantages(
            GroupBatch(torch.tensor([rewards]), torch.tensor([lens])), adv_cfg, adora_cfg, one_pool
        )
        assert torch.allclose(out.advantages[start : start + len(rewards)], alone.advantages[0], atol=1e-6)
        assert float(out.weights[i]) == pytest.approx(float(alone.adora.weights[0]))
        assert bool(out.zero_signal[i]) == bool(alone.group_stats.zero_signal[0])
        start += len(rewards)


def test_ragged_advantages_of_one_size_are_the_step_advantages_hand_computed():
    """One size: exactly compute_step_advantages, metrics included. GRPO on [1, 0] and [1, 1]: the first group's
    advantages are +-(0.5 / std) with the unbiased std 0.7071 (+-0.7071), the second group's are 0 (zero signal)."""
    from adora_openrlhf.algorithms.pipeline import GroupBatch, compute_ragged_step_advantages, compute_step_advantages
    from adora_openrlhf.config import AdoraConfig

    rewards, lengths = torch.tensor([[1.0, 0.0], [1.0, 1.0]]), torch.tensor([[5.0, 7.0], [3.0, 3.0]])
    square = compute_step_advantages(GroupBatch(rewards, lengths), AdvantageConfig(), AdoraConfig())
    ragged = compute_ragged_step_advantages(
        GroupBatch(rewards.reshape(-1), lengths.reshape(-1)), [2, 2], AdvantageConfig(), AdoraConfig()
    )
    assert torch.equal(ragged.advantages, square.advantages.reshape(-1)) and ragged.metrics == square.metrics
    assert ragged.advantages.tolist() == pytest.approx([0.7071, -0.7071, 0.0, 0.0], abs=1e-4)
    assert ragged.zero_signal.tolist() == [False, True] and ragged.metrics["advantage/zero_signal_fraction"] == 0.5
    with pytest.raises(ValueError, match="group sizes"):
        compute_ragged_step_advantages(
            GroupBatch(rewards.reshape(-1), lengths.reshape(-1)), [2, 3], AdvantageConfig(), AdoraConfig()
        )


def test_local_run_with_an_allocator_saves_and_restores_its_store(tmp_path):
    from adora_openrlhf.backends.local.trainer import train
    from adora_openrlhf.rundir import checkpoints as ckpt

    extra = {
        "allocation.method": "knapsack",
        "allocation.candidates": 2.0,
        "allocation.budget": 1.0,
        "prompts_per_step": 2,
        "data.rl_prompts": 4,
        "sampling.n_keep": 2,
    }
    full = tiny_kk_config(tmp_path / "full", steps=4, **extra)
    train(full)
    records = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] > 0]
    assert all(r["allocation/candidates"] == 4 and r["allocation/responses_allocated"] <= 4 for r in steps)
    assert steps[0]["allocation/candidates_seen_before"] == 0 and steps[-1]["allocation/candidates_seen_before"] >= 2
    state = ckpt.load_trainer_state(ckpt.latest_checkpoint(tmp_path / "full"))
    assert state.data_position == 16 and 2 <= len(state.allocation["posteriors"]) <= 4  # 4 candidates examined per step
    part = tiny_kk_config(tmp_path / "part", steps=2, **extra)
    train(part)
    train(tiny_kk_config(tmp_path / "part", steps=4, **extra), resume=True)
    resumed = [json.loads(line) for line in (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
    for a, b in zip(records[3:], resumed[3:], strict=True):  # steps 3 and 4 allocate from the restored store
        assert a["allocation/responses_allocated"] == b["allocation/responses_allocated"]
        assert a["allocation/predicted_signal_fraction"] == pytest.approx(b["allocation/predicted_signal_fraction"])


def test_rl_prompts_larger_than_the_training_set_is_refused(tmp_path):
    from adora_openrlhf.backends.local.trainer import train

    with pytest.raises(ConfigError, match="data.rl_prompts"):
        train(tiny_kk_config(tmp_path / "run", **{"data.rl_prompts": 9}))
    assert not (tmp_path / "run").exists()


def test_openrlhf_backend_refuses_allocation():
    from adora_openrlhf.backends.support import check_backend_fields
    from adora_openrlhf.recipes import build_run_config

    cfg = build_run_config("kk-testbed-openrlhf", {"allocation.method": "skip"})
    with pytest.raises(ConfigError, match="allocation.method: not supported by the openrlhf backend"):
        check_backend_fields(cfg)


def test_step_sizes_of_each_method_by_hand():
    """What a backend sizes its step by: candidates examined and responses spent per allocation."""
    knapsack = AllocationConfig(method="knapsack", candidates=2.0, budget=0.5)
    assert knapsack.candidate_count(16) == 32 and knapsack.responses_per_step(16, 8) == 64
    assert AllocationConfig(method="knapsack", budget=0.01).responses_per_step(2, 4) == 2  # at least min_responses
    difficulty = AllocationConfig(method="difficulty", candidates=1.25)
    assert difficulty.candidate_count(4) == 5 and difficulty.responses_per_step(4, 4) == 16
    assert AllocationConfig(candidates=3.0).candidate_count(4) == 4  # uniform examines only what it samples


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(max_size=5),
            st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3)),
            st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3)),
            st.one_of(st.integers(-3, 10), st.floats(0, 5), st.booleans()),
        ),
        max_size=6,
    )
)
def test_a_store_loads_exactly_the_states_with_finite_positive_parameters_and_counts(entries):
    """Property: every entry with finite a, b > 0 and an integer count >= 0 loads and round-trips; any other is
    refused naming its index, and the store keeps nothing of a refused state."""

    def valid(a, b, n) -> bool:
        params = all(not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in (a, b))
        return params and isinstance(n, int) and not isinstance(n, bool) and n >= 0

    store = PromptStatsStore()
    state = {"posteriors": [list(entry) for entry in entries]}
    bad = [i for i, (_, a, b, n) in enumerate(entries) if not valid(a, b, n)]
    if bad:
        with pytest.raises(ValueError, match=rf"^allocation store: posteriors\[{bad[0]}\]: "):
            store.load_state_dict(state)
        assert len(store) == 0
    else:
        store.load_state_dict(state)
        assert store.state_dict() == {"posteriors": [[k, float(a), float(b), n] for k, a, b, n in dict(
            (k, (k, a, b, n)) for k, a, b, n in entries).values()]}  # fmt: skip
