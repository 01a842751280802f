"""bench/allocation.py's analysis on hand-made records: censoring at the whole budget, interpolation at matched
budgets, the paired records (sign-flip and t, Holm, "established" only where both hold)."""

import math

import pytest

from bench.allocation import accuracy_at, goal_records, paired_metric_records, reaches_goal, run_record, tokens_to_reach

CURVE = [[0.0, 0.2], [100.0, 0.6], [200.0, 0.8], [300.0, 0.85]]


def test_tokens_to_reach_counts_a_run_that_never_gets_there_at_its_whole_budget():
    assert tokens_to_reach(CURVE, 0.6) == (100.0, True)
    assert tokens_to_reach(CURVE, 0.8) == (200.0, True)
    assert tokens_to_reach(CURVE, 0.9) == (300.0, False)  # censored: at least 300


def test_accuracy_at_interpolates_and_holds_the_last_value():
    assert accuracy_at(CURVE, 50.0) == pytest.approx(0.4)
    assert accuracy_at(CURVE, 250.0) == pytest.approx(0.825)
    assert accuracy_at(CURVE, 1000.0) == 0.85  # the run stopped: its last accuracy


def _rec(variant, seed, curve):
    return {"variant": variant, "seed": seed, "curve": curve, "acc_final": curve[-1][1], "tokens_total": curve[-1][0]}


def test_paired_records_by_hand():
    records = []
    for seed in range(6):
        records.append(_rec("GRPO", seed, [[0.0, 0.2], [100.0, 0.7], [200.0, 0.8]]))
        records.append(_rec("Half", seed, [[0.0, 0.2], [50.0, 0.8], [100.0, 0.8 + 0.01 * seed]]))
        records.append(_rec("Never", seed, [[0.0, 0.2], [100.0, 0.5], [200.0, 0.6]]))
    paired = {(r["metric"], r["variant"]): r for r in paired_metric_records(records)}
    half = paired[("tokens_to_ref_final", "Half")]
    assert half["ratio"] == pytest.approx(0.25) and half["censored_variant"] == 0  # 50 tokens against GRPO's 200
    assert half["p_sign_flip"] == pytest.approx(2 / 64) and half["p_sign_flip_holm"] == pytest.approx(2 * 2 / 64)
    never = paired[("tokens_to_ref_final", "Never")]
    assert never["censored_variant"] == 6 and never["ratio"] == pytest.approx(1.0)  # counted at its budget, not dropped
    at_half = paired[("acc_at_50pct", "Half")]  # 100 tokens: Half at 0.8 + 0.01 s, GRPO at 0.7
    assert at_half["mean_diff"] == pytest.approx(0.1 + 0.01 * 2.5)
    assert paired[("tokens_total", "Half")]["ratio"] == pytest.approx(0.5)
    assert half["established"] is False  # every log ratio equal: the t test's p is 0, but Holm's sign-flip is 0.0625
    assert paired[("acc_final", "Never")]["mean_diff"] == pytest.approx(-0.2)
    assert all(math.isfinite(r["p_sign_flip"]) for r in paired.values())


def test_the_goal_counts_grpos_final_accuracy_reached_within_half_of_grpos_tokens():
    grpo = _rec("GRPO", 0, [[0.0, 0.2], [100.0, 0.8], [200.0, 0.85]])
    early = _rec("Early", 0, [[0.0, 0.2], [50.0, 0.7], [100.0, 0.86]])  # 0.86 at 100 tokens = 0.5x: reached
    late = _rec("Late", 0, [[0.0, 0.2], [100.0, 0.8], [110.0, 0.9]])  # 0.9 only at 110 tokens > 0.5 x 200
    assert reaches_goal(early, grpo) and not reaches_goal(late, grpo)
    second = [_rec("GRPO", 1, grpo["curve"]), _rec("Early", 1, late["curve"]), _rec("Late", 1, late["curve"])]
    goal = {g["variant"]: g for g in goal_records([grpo, early, late, *second])}
    assert goal["Early"] == {"variant": "Early", "fraction": 0.5, "n": 2, "reached": 1, "seeds_reached": [0]}
    assert goal["Late"]["reached"] == 0
    assert goal["GRPO"]["seeds_reached"] == []  # GRPO's own 0.85 comes at its last evaluation, 200 tokens
    paired = {(r["metric"], r["variant"]): r for r in paired_metric_records([grpo, early, late, *second])}
    # at 100 tokens Early is at 0.86 on seed 0 and 0.8 on seed 1 (the late curve), against GRPO's final 0.85
    assert paired[("acc_at_50pct_vs_ref_final", "Early")]["per_seed"] == pytest.approx({"0": 0.01, "1": -0.05})


def test_run_record_reads_tokens_and_zero_signal_from_metrics():
    metrics = [{"step": 0, "eval/greedy_accuracy": 0.2, "time/eval_s": 1.0}]
    for step in range(1, 5):
        metrics.append(
            {
                "step": step,
                "sampling/responses_generated": 8.0,
                "sampling/tokens_generated": 100.0,
                "advantage/zero_signal_fraction": step / 10,
                "time/step_s": 2.0,
            }
        )
    metrics[-1].update({"eval/greedy_accuracy": 0.5, "time/eval_s": 1.5})
    rec = run_record({"variant": "GRPO", "seed": 0, "metrics": metrics})
    assert (
        rec["curve"] == [[0.0, 0.2], [400.0, 0.5]] and rec["tokens_total"] == 400.0 and rec["responses_total"] == 32.0
    )
    assert rec["zero_signal_second_half"] == pytest.approx(0.35) and rec["eval_s"] == 2.5 and rec["train_s"] == 8.0


def test_every_variant_builds_a_valid_run_on_the_regime_and_the_long_knapsack_spends_grpos_budget():
    """Each variant's overrides give a valid RunConfig of kk-revisit (checked where the config is parsed); the
    equal-budget knapsack runs twice GRPO's steps at half its responses per step and is evaluated at the same
    responses as GRPO (every 640 responses)."""
    from adora_openrlhf.recipes import build_run_config
    from bench.allocation import VARIANTS

    configs = {name: build_run_config("kk-revisit", dict(overrides)) for name, overrides in VARIANTS.items()}
    grpo, long = configs["GRPO"], configs["Knapsack-0.5-long"]
    grpo_responses = grpo.prompts_per_step * grpo.sampling.n_keep
    long_responses = long.allocation.knapsack_budget(long.prompts_per_step, long.sampling.n_keep)
    assert long.steps * long_responses == grpo.steps * grpo_responses
    assert long.eval_every * long_responses == grpo.eval_every * grpo_responses == 640
