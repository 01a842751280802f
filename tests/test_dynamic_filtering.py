"""DAPO dynamic filtering: the keep rule, the refill loop, its config, the OpenRLHF flags, and a local run."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adora_openrlhf.algorithms.dynamic_filtering import classify_group, filter_and_refill, keeps_group
from adora_openrlhf.algorithms.sampling import AdaptiveSampler, SamplingResult, ScoredResponse
from adora_openrlhf.config import AdaptiveSamplingConfig, ConfigError, DynamicFilteringConfig, SamplingParams
from adora_openrlhf.recipes import build_run_config


def score_of(response: ScoredResponse) -> float:
    return float(response.payload.correct)


def stream(pattern: list[int], n: int = 4):
    """``sample_batch`` over a data stream whose prompt i has ``pattern[i % len]`` correct responses of ``n``,
    sampled by the real plain (one-round) sampler; also returns the list of batch sizes asked for."""
    sampler = AdaptiveSampler(AdaptiveSamplingConfig(n_keep=n), SamplingParams())
    calls: list[int] = []

    def sample_batch(count: int) -> SamplingResult:
        start = sum(calls)
        calls.append(count)

        def generate(requests):
            out = []
            for req in requests:
                position = start + req.prompt_index
                k = pattern[position % len(pattern)]
                out.append(
                    [
                        ScoredResponse(
                            reward=2.0 if i < k else -1.0,
                            positive=i < k,
                            length=i + 1,
                            payload=SimpleNamespace(correct=i < k, position=position),
                        )
                        for i in range(req.num_samples)
                    ]
                )
            return out

        return sampler.sample(count, generate)

    return sample_batch, calls


# ---- the rule -------------------------------------------------------------------------------------------


def test_keeps_group_hand_cases():
    assert not keeps_group([0, 0, 0, 0], 0, 1)  # all wrong: no signal
    assert not keeps_group([1, 1, 1, 1], 0, 1)  # all correct: no signal
    assert keeps_group([1, 0, 0, 0], 0, 1) and keeps_group([1, 1, 1, 0], 0, 1)
    assert not keeps_group([1, 0, 0, 0], 0.25, 0.75)  # the bounds are strict: mean 0.25 is not > 0.25
    assert keeps_group([1, 1, 0, 0], 0.25, 0.75)
    assert keeps_group([0, 0], -0.5, 0.5)  # a custom range may keep all-wrong groups
    assert keeps_group([0.3, 0.3], 0, 1)  # non-binary scores: only the mean counts
    assert not keeps_group([2.0, 3.0], 0, 1) and not keeps_group([-0.5, 0.25], 0, 1)
    with pytest.raises(ValueError, match="at least one score"):
        keeps_group([], 0, 1)
    assert [classify_group(s, 0.25, 0.75) for s in ([1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [2.0, 3.0])] == [
        "low",
        "keep",
        "high",
        "high",
    ]


# ---- the refill loop -------------------------------------------------------------------------------------


def test_refills_replace_exactly_the_dropped_prompts():
    # prompts 0, 1 dropped (all wrong, all correct), 2, 3 kept; refill 2: prompts 4, 5 dropped; refill 2: 6, 7 kept
    sample_batch, calls = stream([0, 4, 2, 1])
    out = filter_and_refill(sample_batch, 4, score_of, 0.0, 1.0, max_refills=4)
    assert calls == [4, 2, 2] and out.refills == 2 and out.prompts_consumed == 8
    groups = out.result.groups
    assert [g.prompt_index for g in groups] == [0, 1, 2, 3]  # re-numbered, unique
    assert out.stream_indices == [2, 3, 6, 7] == [g.kept[0].payload.position for g in groups]
    # rewards 2 / -1, aligned with groups
    assert out.result.pool_stats.mean.tolist() == pytest.approx([0.5, -0.25, 0.5, -0.25])
    assert out.result.pool_stats.count.tolist() == [4, 4, 4, 4] and out.result.dropped == []
    m = out.result.metrics
    assert m["sampling/responses_generated"] == 32  # every batch, refills included
    # response i of a group has i + 1 tokens, every batch counted
    assert m["sampling/tokens_generated"] == 8 * (1 + 2 + 3 + 4)
    assert (m["filter/prompts_consumed"], m["filter/kept_groups"], m["filter/pass_rate"]) == (8, 4, 0.5)
    assert (m["filter/refills"], m["filter/short_groups"], m["filter/dropped_low"], m["filter/dropped_high"]) == (
        2,
        0,
        2,
        2,
    )
    assert m["sampling/zero_signal_groups"] == 0 and m["sampling/uniform_kept_groups"] == 0
    assert m["sampling/pool_mean_reward"] == pytest.approx(0.125)
    every = [2.0 if i < k else -1.0 for k in [0, 4, 2, 1, 0, 4, 2, 1] for i in range(4)]  # the 8 prompts consumed
    assert m["sampling/first_round_mean_reward"] == pytest.approx(sum(every) / len(every))
    assert m["sampling/rounds_used"] == 1


def test_stops_after_max_refills_with_fewer_groups():
    sample_batch, calls = stream([0, 0, 0, 3, 0, 4])  # one prompt in six has a signal
    out = filter_and_refill(sample_batch, 4, score_of, 0.0, 1.0, max_refills=2)
    # batch 0..3 keeps prompt 3; refill 3 (4, 5, 6) keeps none; refill 3 (7, 8, 9) keeps prompt 9
    assert calls == [4, 3, 3] and out.refills == 2 and out.prompts_consumed == 10
    assert out.stream_indices == [3, 9] and len(out.result.pool_stats.mean) == 2
    assert out.result.metrics["filter/short_groups"] == 2 and out.result.metrics["filter/pass_rate"] == pytest.approx(
        0.2
    )


def test_no_group_kept_and_no_refills():
    sample_batch, calls = stream([4])
    out = filter_and_refill(sample_batch, 3, score_of, max_refills=0)
    assert calls == [3] and out.result.groups == [] and out.prompts_consumed == 3
    assert out.result.pool_stats.mean.numel() == 0 and out.result.kept_rewards().numel() == 0
    m = out.result.metrics
    assert (
        m["filter/kept_groups"],
        m["filter/short_groups"],
        m["filter/dropped_high"],
        m["sampling/responses_generated"],
    ) == (0, 3, 3, 12)
    sample_batch, calls = stream([0])
    assert filter_and_refill(sample_batch, 2, score_of, max_refills=3).refills == 3 and calls == [2, 2, 2, 2]


def test_a_bad_sample_batch_is_an_error():
    sampler = AdaptiveSampler(AdaptiveSamplingConfig(n_keep=2), SamplingParams())

    def too_many(count):  # ignores count
        return sampler.sample(
            count + 1,
            lambda reqs: [
                [ScoredResponse(1.0, True, payload=SimpleNamespace(correct=i == 0)) for i in range(r.num_samples)]
                for r in reqs
            ],
        )

    with pytest.raises(ValueError, match="asked for 2 prompts"):
        filter_and_refill(too_many, 2, score_of)
    with pytest.raises(ValueError, match="num_prompts"):
        filter_and_refill(too_many, 0, score_of)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 5),
    pattern=st.lists(st.integers(0, 5), min_size=1, max_size=12),
    num_prompts=st.integers(1, 6),
    max_refills=st.integers(0, 4),
    bounds=st.sampled_from([(0.0, 1.0), (0.2, 0.8), (-0.5, 0.5), (0.5, 1.5)]),
)
def test_property_kept_groups_follow_the_rule(n, pattern, num_prompts, max_refills, bounds):
    pattern = [min(k, n) for k in pattern]
    low, high = bounds
    sample_batch, calls = stream(pattern, n)
    out = filter_and_refill(sample_batch, num_prompts, score_of, low, high, max_refills)
    groups = out.result.groups
    assert all(keeps_group([score_of(r) for r in g.kept], low, high) for g in groups)
    assert len(groups) <= num_prompts and out.prompts_consumed >= len(groups)
    assert out.prompts_consumed == sum(calls) and len(calls) == out.refills + 1 and out.refills <= max_refills
    assert len(groups) == num_prompts or out.refills == max_refills  # stops only when full or capped
    passing = [i for i in range(out.prompts_consumed) if low < pattern[i % len(pattern)] / n < high]
    assert out.stream_indices == passing  # every passing prompt consumed is kept, in stream order
    assert [g.prompt_index for g in groups] == list(range(len(groups)))
    assert len(out.result.pool_stats.count) == len(groups)
    m = out.result.metrics
    assert m["sampling/responses_generated"] == n * out.prompts_consumed
    assert m["filter/kept_groups"] + m["filter/dropped_low"] + m["filter/dropped_high"] == out.prompts_consumed
    assert m["filter/short_groups"] == num_prompts - len(groups)


# ---- config ----------------------------------------------------------------------------------------------


def test_config_checks():
    assert DynamicFilteringConfig().score_range == [0.0, 1.0] and DynamicFilteringConfig(
        score_range=(0.1, 0.9)
    ).score_range == [0.1, 0.9]
    with pytest.raises(ConfigError, match=r"^dynamic_filtering.score_range: low must be below high"):
        DynamicFilteringConfig(score_range=[0.8, 0.2])
    with pytest.raises(ConfigError, match=r"^dynamic_filtering.score_range: must be two numbers"):
        DynamicFilteringConfig(score_range=[0.5])
    with pytest.raises(ConfigError, match=r"^dynamic_filtering.score_range\[1\]: must be a finite number"):
        DynamicFilteringConfig(score_range=[0, "high"])
    with pytest.raises(ConfigError, match=r"^dynamic_filtering.score_range: no group could ever be kept"):
        DynamicFilteringConfig(score_range=[1.0, 2.0])
    with pytest.raises(ConfigError, match=r"^dynamic_filtering.max_refills: must be an integer >= 0"):
        DynamicFilteringConfig(max_refills=-1)
    with pytest.raises(
        ConfigError,
        match=r"^dynamic_filtering.enabled: DAPO dynamic filtering and adaptive sampling .* are alternatives; use one",
    ):
        build_run_config("kk-tiny", {"dynamic_filtering.enabled": True, "sampling.enabled": True})
    with pytest.raises(ConfigError, match=r"^dynamic_filtering.enabled: needs groups of 2 or more responses"):
        build_run_config("kk-tiny", {"dynamic_filtering.enabled": True, "sampling.n_keep": 1})
    build_run_config("kk-tiny", {"dynamic_filtering.enabled": False, "sampling.enabled": True})  # off: no conflict


def test_openrlhf_flags():
    flags = pytest.importorskip("adora_openrlhf.backends.openrlhf.flags")
    on = flags.derived_flags(
        build_run_config(
            "dapo-math-grpo", {"dynamic_filtering.enabled": True, "dynamic_filtering.score_range": [0.0, 0.75]}
        )
    )
    assert on["algo.dynamic_filtering_enable"] is True and on["algo.dynamic_filtering_range"] == (0.0, 0.75)
    argv = flags.build_argv(build_run_config("dapo-math-grpo", {"dynamic_filtering.enabled": True}))
    i = argv.index("--algo.dynamic_filtering_enable")
    assert argv[i + 1 : i + 4] == ["--algo.dynamic_filtering_range", "0.0", "1.0"]
    off = flags.derived_flags(build_run_config("dapo-math-grpo"))
    assert "algo.dynamic_filtering_enable" not in off and "algo.dynamic_filtering_range" not in off
    with pytest.raises(ConfigError, match=r"^dynamic_filtering.max_refills: not supported by the openrlhf backend"):
        flags.derived_flags(
            build_run_config("dapo-math-grpo", {"dynamic_filtering.enabled": True, "dynamic_filtering.max_refills": 8})
        )


def test_openrlhf_namespace_and_config_agree():
    pytest.importorskip("openrlhf")
    from adora_openrlhf.backends.openrlhf import launcher

    _, args, cfg = launcher.prepare(
        build_run_config(
            "dapo-math-grpo", {"dynamic_filtering.enabled": True, "dynamic_filtering.score_range": [0.1, 0.9]}
        )
    )
    assert args.algo.dynamic_filtering_enable and list(args.algo.dynamic_filtering_range) == [0.1, 0.9]
    assert cfg.dynamic_filtering.enabled and cfg.dynamic_filtering.score_range == [0.1, 0.9]
    # OpenRLHF's own flags typed on the command line flow back into the config
    _, args, cfg = launcher.prepare(
        build_run_config("dapo-math-grpo"),
        ["--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0.2", "0.8"],
    )
    assert cfg.dynamic_filtering.enabled and cfg.dynamic_filtering.score_range == [0.2, 0.8]


# ---- a local run -----------------------------------------------------------------------------------------


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_local_training_with_dynamic_filtering_and_resume(tmp_path):
    from test_local_e2e import TINY

    from adora_openrlhf.backends.local.trainer import train
    from adora_openrlhf.rundir.checkpoints import load_trainer_state

    # warmed up on four puzzles, the tiny model answers them right about a third of the time (test_testbed_rl.py):
    # most groups of 4 are mixed, some all wrong
    settings_ = {
        **TINY,
        "data.num_train": 4,
        "dynamic_filtering.enabled": True,
        "dynamic_filtering.max_refills": 2,
        "prompts_per_step": 3,
    }
    train(build_run_config("kk-tiny", {**settings_, "steps": 3, "output_dir": str(tmp_path / "full")}))
    steps = [r for r in _records(tmp_path / "full") if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert any(r["filter/kept_groups"] > 0 for r in steps), "no step kept a group: nothing trained"
    for r in steps:
        for key in (
            "filter/prompts_consumed",
            "filter/kept_groups",
            "filter/pass_rate",
            "filter/refills",
            "filter/short_groups",
            "sampling/responses_generated",
        ):
            assert key in r, key
        assert r["filter/kept_groups"] + r["filter/short_groups"] == 3 and r["filter/refills"] <= 2
        assert r["sampling/responses_generated"] == 4 * r["filter/prompts_consumed"]
        assert r["filter/pass_rate"] == pytest.approx(r["filter/kept_groups"] / r["filter/prompts_consumed"])
        if r["filter/kept_groups"] > 0:  # every kept group has correct and wrong responses: a learning signal
            assert r["advantage/zero_signal_fraction"] == 0.0 and math.isfinite(r["train/loss"])
            assert 0.0 < r["reward/accuracy"] < 1.0
        else:
            assert "train/loss" not in r
    consumed = [r["filter/prompts_consumed"] for r in steps]
    assert load_trainer_state(tmp_path / "full" / "checkpoints" / "step_000003").data_position == sum(consumed)

    train(build_run_config("kk-tiny", {**settings_, "steps": 2, "output_dir": str(tmp_path / "part")}))
    assert load_trainer_state(tmp_path / "part" / "checkpoints" / "step_000002").data_position == sum(consumed[:2])
    summary = train(
        build_run_config("kk-tiny", {**settings_, "steps": 3, "output_dir": str(tmp_path / "part")}), resume=True
    )
    assert summary["resumed_from_step"] == 2
    full, part = steps[-1], _records(tmp_path / "part")[-1]
    assert part["step"] == 3
    for key in (
        "filter/prompts_consumed",
        "filter/kept_groups",
        "sampling/first_round_mean_reward",
        "sampling/responses_generated",
    ):
        assert part[key] == pytest.approx(full[key]), key  # the same prompts and samples after resume
    assert load_trainer_state(tmp_path / "part" / "checkpoints" / "step_000003").data_position == sum(consumed)
