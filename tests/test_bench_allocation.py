"""The allocation benchmark (bench/allocation.py, its analysis and report) on hand-made records: censoring at the
whole budget, interpolation at matched budgets, the paired records (sign-flip and t, Holm, "established" only where both hold)."""

import json
import math

import pytest

from bench import allocation, allocation_analysis, allocation_report
from bench.allocation import run_record, stored_records
from bench.allocation_analysis import accuracy_at, goal_records, paired_metric_records, plateau, reaches_goal
from bench.budget import censored_log_ratio, cost_to_reach

CURVE = [[0.0, 0.2], [100.0, 0.6], [200.0, 0.8], [300.0, 0.85]]


def test_cost_to_reach_counts_a_run_that_never_gets_there_at_its_whole_budget():
    assert cost_to_reach(CURVE, 0.6) == (100.0, True)
    assert cost_to_reach(CURVE, 0.8) == (200.0, True)
    assert cost_to_reach(CURVE, 0.9) == (300.0, False)  # censored: at least 300
    assert cost_to_reach([[0, 0.2], [10, 0.1 + 0.2]], 0.3) == (10.0, True)  # 0.30000000000000004 vs 0.3: reached
    assert cost_to_reach(None, 0.1) is None and cost_to_reach([], 0.1) is None


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
    paired = {(r["metric"], r["variant"]): r for r in paired_metric_records(records, min_seeds=6)}
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
    counts = {"variant": "Early", "fraction": 0.5, "n": 2, "reached": 1, "seeds_reached": [0], "reached_plateau": 2,
              "seeds_reached_plateau": [0, 1]}  # fmt: skip
    assert {k: goal["Early"][k] for k in counts} == counts
    # GRPO's three evaluations average 0.617 (its plateau): the late curve's 0.8 at 100 tokens meets that too
    assert goal["Late"]["reached"] == 0
    assert goal["GRPO"]["seeds_reached"] == []  # GRPO's own 0.85 comes at its last evaluation, 200 tokens
    paired = {(r["metric"], r["variant"]): r for r in paired_metric_records([grpo, early, late, *second])}
    # at 100 tokens Early is at 0.86 on seed 0 and 0.8 on seed 1 (the late curve), against GRPO's final 0.85
    assert paired[("acc_at_50pct_vs_ref_final", "Early")]["per_seed"] == pytest.approx({"0": 0.01, "1": -0.05})


def test_the_goal_as_a_test_needs_below_half_established_and_no_loss_at_equal_budget():
    grpo = [[0.0, 0.2], [100.0, 0.7], [200.0, 0.8]]  # GRPO's final 0.8 at 200 tokens, its total
    records = []
    for seed in range(10):
        records.append(_rec("GRPO", seed, grpo))
        records.append(_rec("Quarter", seed, [[0.0, 0.2], [40.0 + 2 * seed, 0.8], [100.0, 0.8]]))  # 0.20x-0.29x
        records.append(_rec("AtHalf", seed, [[0.0, 0.2], [(90.0, 110.0)[seed % 2], 0.8], [200.0, 0.8]]))
        records.append(_rec("Fades", seed, [[0.0, 0.2], [50.0, 0.8], [100.0, 0.6]]))  # 0.25x, then 0.6 at 200
    paired = paired_metric_records(records)
    goal = {g["variant"]: g for g in goal_records(records, "GRPO", paired)}
    quarter = goal["Quarter"]
    g = [math.log((40 + 2 * s) / 100) for s in range(10)]  # ln(cost / GRPO's 200) - ln 0.5
    assert quarter["goal_total_ratio"] == pytest.approx(0.5 * math.exp(sum(g) / 10))
    assert quarter["goal_total_p_sign_flip"] == pytest.approx(2 / 1024)  # every g_i < 0: the identity and its mirror
    assert quarter["goal_total_p_sign_flip_holm"] == pytest.approx(3 * 2 / 1024)  # Holm over the three variants
    assert quarter["goal_total_met"] is True and quarter["loss_at_equal_budget"] is False
    # GRPO gets to its final accuracy only at its last evaluation: both readings divide by the same 200 tokens
    assert quarter["goal_reach_ratio"] == pytest.approx(quarter["goal_total_ratio"]) and quarter["goal_reach_met"]
    at_half = goal["AtHalf"]  # ln 0.9 and ln 1.1 about the goal: a ratio of 0.498x, nothing established
    assert at_half["goal_total_ratio"] == pytest.approx(0.5 * math.sqrt(0.9 * 1.1))
    assert at_half["goal_total_p_sign_flip"] > 0.05 and at_half["goal_total_met"] is False
    fades = goal["Fades"]  # 0.25x on every seed, but 0.2 below GRPO at 100% of its tokens
    assert fades["goal_total_ratio"] == pytest.approx(0.25) and fades["loss_at_equal_budget"] is True
    assert fades["goal_total_met"] is False
    assert goal["GRPO"]["goal_total_ratio"] == pytest.approx(1.0)  # its own final comes at its last evaluation
    assert "goal_total_met" not in goal["GRPO"] and "goal_reach_ratio" not in goal["GRPO"]  # no verdict for itself
    pilot = {g["variant"]: g for g in goal_records([r for r in records if r["seed"] < 5], "GRPO")}["Quarter"]
    assert pilot["goal_total_p_sign_flip_holm"] is None and pilot["goal_total_met"] is False  # five seeds: a pilot
    table = allocation_report._goal_test_table(list(goal.values()))
    assert "| Quarter | 0.24x" in table and "| no (loss at equal budget) |" in table


def test_the_goals_two_readings_differ_where_grpo_is_at_its_final_accuracy_early():
    records = []
    for seed in range(10):  # GRPO at its final 0.8 by 50 of its 200 tokens; the variant there at 40 + seed
        records.append(_rec("GRPO", seed, [[0.0, 0.2], [50.0, 0.8], [200.0, 0.8]]))
        records.append(_rec("Early", seed, [[0.0, 0.2], [40.0 + seed, 0.8], [100.0, 0.8]]))
    goal = {g["variant"]: g for g in goal_records(records)}
    assert goal["GRPO"]["goal_total_ratio"] == pytest.approx(0.25)  # GRPO's own curve meets the goal as worded
    early = goal["Early"]
    assert early["goal_total_ratio"] == pytest.approx(math.exp(sum(math.log((40 + s) / 200) for s in range(10)) / 10))
    assert early["goal_total_met"] is True
    assert early["goal_reach_ratio"] == pytest.approx(4 * early["goal_total_ratio"])  # 0.8x-0.98x of GRPO's 50
    assert early["goal_reach_met"] is False


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


def test_censoring_decides_a_sign_only_where_the_bound_does():
    assert censored_log_ratio(-0.7, False, False) == -0.7  # both reached: the measured log ratio
    assert censored_log_ratio(0.3, True, False) == 0.3  # variant spent more than GRPO's cost and never got there
    assert censored_log_ratio(-0.6, True, False) is None  # variant stopped below GRPO's cost: could be either
    assert censored_log_ratio(-0.2, False, True) == -0.2  # GRPO spent more than the variant's cost and never got there
    assert censored_log_ratio(0.4, False, True) is None
    assert censored_log_ratio(0.0, True, True) is None


def test_an_undetermined_seed_is_no_win_and_enters_the_tests_as_zero():
    """Seed 0: the variant stops at 100 tokens below 0.9 while GRPO reaches 0.9 at 200: sign unknown. Seeds 1-2:
    the variant reaches it at 50 tokens (ln 0.25). Seed 3: the variant never reaches it in 300 tokens (>= ln 1.5)."""
    grpo = [[0.0, 0.2], [100.0, 0.5], [200.0, 0.9]]
    short = [[0.0, 0.2], [100.0, 0.8]]
    fast = [[0.0, 0.2], [50.0, 0.9], [100.0, 0.9]]
    slow = [[0.0, 0.2], [300.0, 0.8]]
    records = [_rec("GRPO", s, grpo) for s in range(4)]
    records += [_rec("V", 0, short), _rec("V", 1, fast), _rec("V", 2, fast), _rec("V", 3, slow)]
    rec = {(r["metric"], r["variant"]): r for r in paired_metric_records(records)}[("tokens_to_ref_final", "V")]
    assert (rec["wins"], rec["ties"], rec["losses"], rec["undetermined"]) == (2, 0, 1, [0])
    assert rec["censored_variant"] == 2 and rec["per_seed"]["0"] == pytest.approx(math.log(0.5))  # the bound, kept
    assert rec["mean_diff"] == pytest.approx((0 + 2 * math.log(0.25) + math.log(1.5)) / 4)
    assert rec["p_sign_flip"] == pytest.approx(8 / 16)  # |sum| reached by 8 of the 16 sign vectors (the 0 twice each)


def test_plateau_is_the_mean_of_the_last_evaluations_and_a_target_of_its_own():
    """GRPO's last evaluation is a high draw (0.95): its own curve meets that only at the end, but its plateau
    (0.8525) already at 100 of its 500 tokens."""
    curve = [[0.0, 0.2], [100.0, 0.9], [200.0, 0.8], [300.0, 0.84], [400.0, 0.82], [500.0, 0.95]]
    assert plateau(curve) == pytest.approx((0.8 + 0.84 + 0.82 + 0.95) / 4)
    assert plateau(curve[:2]) == pytest.approx(0.55)  # fewer evaluations than the window: all of them
    grpo = _rec("GRPO", 0, curve)
    assert not reaches_goal(grpo, grpo) and reaches_goal(grpo, grpo, target=plateau(curve))
    goal = goal_records([grpo])[0]
    assert (goal["reached"], goal["reached_plateau"], goal["seeds_reached_plateau"]) == (0, 1, [0])
    short = _rec("V", 0, [[0.0, 0.2], [50.0, 0.86]])  # at the plateau after 50 tokens, then stops
    paired = {(r["metric"], r["variant"]): r for r in paired_metric_records([grpo, short])}
    assert paired[("tokens_to_ref_plateau", "V")]["per_seed"] == {"0": pytest.approx(math.log(0.5))}
    assert paired[("tokens_to_ref_final", "V")]["undetermined"] == [0]  # stopped at 50 < GRPO's 500: sign unknown


def _full(variant, seed, curve, step0=None):
    rec = _rec(variant, seed, curve)
    rec.update({"acc_step0": curve[0][1] if step0 is None else step0, "responses_total": 8.0 * len(curve),
                "zero_signal_second_half": 0.5, "eval_s": 1.0, "train_s": 2.0, "steps": list(range(len(curve)))})  # fmt: skip
    return rec


def _results(tmp_path, records, variants, recipe="kk-revisit"):
    settings = {"recipe": recipe, "seeds": sorted({r["seed"] for r in records}), "variants": variants}
    (tmp_path / "results.json").write_text(json.dumps({"settings": settings, "records": records}))


def test_stored_records_keep_only_what_todays_variants_would_reproduce(tmp_path, capsys):
    recs = [_full("GRPO", 0, CURVE), _full("Skip", 0, CURVE), _full("Difficulty", 0, CURVE), _full("Gone", 0, CURVE)]
    ran_with = {"GRPO": {}, "Skip": {"allocation.method": "skip"}, "Difficulty": {"allocation.method": "knapsack"}}
    _results(tmp_path, recs, {**ran_with, "Gone": {}})
    assert [allocation.run_key(r) for r in stored_records(tmp_path / "results.json", "kk-revisit")] == [
        ("GRPO", 0, None),
        ("Skip", 0, None),
    ]
    assert "['Difficulty', 'Gone'] ran with other settings" in capsys.readouterr().out
    assert stored_records(tmp_path / "results.json", "kk-testbed") == []  # another recipe's records
    assert stored_records(tmp_path / "missing.json", "kk-revisit") == []


def test_stored_records_of_a_recipe_changed_since_are_not_reused(tmp_path, capsys):
    recs = [_full("GRPO", 0, CURVE)]
    _results(tmp_path, recs, {"GRPO": {}})
    saved = json.loads((tmp_path / "results.json").read_text())
    saved["settings"]["recipe_config"] = allocation.recipe_config("kk-revisit")
    (tmp_path / "results.json").write_text(json.dumps(saved))
    assert [allocation.run_key(r) for r in stored_records(tmp_path / "results.json", "kk-revisit")] == [
        ("GRPO", 0, None)
    ]  # same recipe today
    saved["settings"]["recipe_config"]["steps"] = 40
    (tmp_path / "results.json").write_text(json.dumps(saved))
    assert stored_records(tmp_path / "results.json", "kk-revisit") == []
    assert "recipe kk-revisit has changed since its records (steps: 40 -> 80)" in capsys.readouterr().out


def test_a_fresh_checkout_reruns_nothing_whose_record_is_stored_and_adds_new_runs(tmp_path, monkeypatch):
    """Only results.json is committed: the report is rebuilt from it, the stored runs are not trained again, and a
    finished run folder of a new variant joins the records."""

    def refuse(*_):
        raise AssertionError("a stored run was trained again")

    monkeypatch.setattr(allocation, "warm_start_dir", refuse)
    monkeypatch.setattr(allocation, "run_training", refuse)
    grpo = [_full("GRPO", s, [[0.0, 0.2], [100.0, 0.8], [200.0, 0.85]]) for s in (0, 1)]
    _results(tmp_path, grpo, {"GRPO": {}})
    new = [_full("Skip", 1, [[0.0, 0.2], [60.0, 0.85], [120.0, 0.86]])]
    monkeypatch.setattr(allocation, "finished_runs", lambda runs: [("Skip", 1)])
    monkeypatch.setattr(allocation, "_record_of", lambda d, v, s: new[0])
    assert allocation.main(["--seeds", "0", "1", "--variants", "GRPO", "--workers", "1", "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [(r["variant"], r["seed"]) for r in saved["records"]] == [("GRPO", 0), ("GRPO", 1), ("Skip", 1)]
    assert saved["settings"]["variants"] == {"GRPO": {}, "Skip": {"allocation.method": "skip"}}


def test_a_variant_on_fewer_seeds_is_a_pilot_outside_the_holm_family():
    """Ten seeds of a clear saving and two of a pilot: Holm runs over the ten-seed variant alone (its adjusted p
    equals its raw p), the pilot keeps its raw p-values and is never established."""
    records = [_rec("GRPO", s, [[0.0, 0.2], [100.0, 0.7], [200.0, 0.8]]) for s in range(10)]
    records += [_rec("Half", s, [[0.0, 0.2], [50.0, 0.8 + 0.001 * s], [100.0, 0.8]]) for s in range(10)]
    records += [_rec("Pilot", s, [[0.0, 0.2], [50.0, 0.8], [100.0, 0.8]]) for s in range(2)]
    paired = {(r["metric"], r["variant"]): r for r in paired_metric_records(records)}
    half, pilot = paired[("tokens_to_0.80", "Half")], paired[("tokens_to_0.80", "Pilot")]
    assert half["p_sign_flip"] == pytest.approx(2 / 1024) and half["p_sign_flip_holm"] == half["p_sign_flip"]
    assert half["established"] and not half["pilot"]
    assert pilot["pilot"] and pilot["p_sign_flip"] == pytest.approx(0.5) and pilot["p_sign_flip_holm"] is None
    assert not pilot["established"]


def test_runs_pair_only_with_grpo_of_the_same_warm_start():
    """Seed 0 twice: the stored runs from one machine's warm start (no fingerprint) and new runs from another's
    ("abc"): Knapsack pairs with the first GRPO run, Skip with the second."""
    grpo_old = _full("GRPO", 0, [[0.0, 0.2], [100.0, 0.8]])
    grpo_new = {**_full("GRPO", 0, [[0.0, 0.19], [100.0, 0.6]]), "warm_start": "abc"}
    knap = _full("Knapsack-0.5", 0, [[0.0, 0.2], [50.0, 0.9]])
    skip = {**_full("Skip", 0, [[0.0, 0.19], [80.0, 0.7]]), "warm_start": "abc"}
    records = [grpo_old, grpo_new, knap, skip]
    units = allocation_analysis.paired_runs(records)
    assert units["Knapsack-0.5"] == {0: (knap, grpo_old)} and units["Skip"] == {"0/abc": (skip, grpo_new)}
    assert list(units["GRPO"]) == [0, "0/abc"]
    final = {r["variant"]: r for r in paired_metric_records(records, min_seeds=1) if r["metric"] == "acc_final"}
    assert final["Knapsack-0.5"]["per_seed"] == {"0": pytest.approx(0.1)}
    assert final["Skip"]["per_seed"] == {"0/abc": pytest.approx(0.1)}


def test_the_warm_start_fingerprint_follows_the_weights(tmp_path):
    assert allocation.warm_start_fingerprint(tmp_path) is None
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    first = allocation.warm_start_fingerprint(tmp_path)
    assert first is not None and len(first) == 12 and first == allocation.warm_start_fingerprint(str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"weights, rounded otherwise")
    assert allocation.warm_start_fingerprint(tmp_path) != first


@pytest.mark.parametrize(
    ("variant", "expected"),
    [
        ("Skip", [("GRPO", 0), ("Skip", 0)]),
        # its matched references too
        ("Knapsack-0.5-cosine", [("GRPO", 0), ("GRPO-40-cosine", 0), ("GRPO-cosine", 0), ("Knapsack-0.5-cosine", 0)]),
        # a cut reference (GRPO-first-40, GRPO-lr5e-5-first-40) is its variant's run, not a run of its own
        ("Knapsack-0.5", [("GRPO", 0), ("Knapsack-0.5", 0)]),
        ("Knapsack-0.5-lr5e-5", [("GRPO", 0), ("GRPO-lr5e-5", 0), ("Knapsack-0.5-lr5e-5", 0)]),
    ],
)
def test_a_new_warm_start_runs_grpo_again_beside_the_new_variant(tmp_path, monkeypatch, variant, expected):
    """GRPO seed 0 is stored from another machine's warm start: asking for a variant on seed 0 here also runs GRPO
    (and the variant's matched reference) on this warm start, and trains nothing else."""
    _results(tmp_path, [_full("GRPO", 0, CURVE)], {"GRPO": {}})
    trained = []
    monkeypatch.setattr(allocation, "_warm", lambda args: str(tmp_path / "ws"))
    monkeypatch.setattr(allocation, "warm_start_fingerprint", lambda path: "abc")
    monkeypatch.setattr(allocation, "run_training", lambda spec: trained.append((spec.variant, spec.seed)))
    monkeypatch.setattr(allocation, "finished_runs", lambda runs: [])
    allocation.main(["--seeds", "0", "--variants", variant, "--workers", "1", "--out", str(tmp_path)])
    assert sorted(trained) == expected


def test_a_matched_variant_is_also_paired_with_grpo_under_its_own_schedule():
    """Knapsack-0.5-cosine against GRPO (constant rate, which it beats), against GRPO-cosine (which it only
    matches) and against GRPO-40-cosine (the schedule alone at its budget, which it beats at equal tokens): each
    matched comparison holds that reference's runs as the reference and the matched variants alone."""
    records = []
    for s in range(3):
        records.append(_rec("GRPO", s, [[0.0, 0.2], [100.0, 0.8], [200.0, 0.8]]))
        records.append(_rec("GRPO-cosine", s, [[0.0, 0.2], [100.0, 0.8], [200.0, 0.9]]))
        records.append(_rec("Knapsack-0.5-cosine", s, [[0.0, 0.2], [50.0, 0.8], [100.0, 0.9]]))
        records.append(_rec("GRPO-40-cosine", s, [[0.0, 0.2], [50.0, 0.6], [100.0, 0.85]]))
        records.append(_rec("Skip", s, [[0.0, 0.2], [100.0, 0.8], [150.0, 0.8]]))
    matched = allocation_analysis.matched_comparisons(records, min_seeds=3)
    assert list(matched) == ["GRPO-cosine", "GRPO-40-cosine"]
    at_equal_budget = {(r["metric"], r["variant"]): r for r in matched["GRPO-40-cosine"]["paired"]}
    assert {v for _, v in at_equal_budget} == {"Knapsack-0.5-cosine"}
    assert at_equal_budget[("acc_at_100pct", "Knapsack-0.5-cosine")]["mean_diff"] == pytest.approx(0.05)
    assert at_equal_budget[("acc_at_50pct", "Knapsack-0.5-cosine")]["mean_diff"] == pytest.approx(0.2)
    paired = {(r["metric"], r["variant"]): r for r in matched["GRPO-cosine"]["paired"]}
    assert {v for _, v in paired} == {"Knapsack-0.5-cosine"}
    assert paired[("acc_final", "Knapsack-0.5-cosine")]["mean_diff"] == pytest.approx(0.0)
    assert paired[("tokens_to_ref_final", "Knapsack-0.5-cosine")]["ratio"] == pytest.approx(0.5)  # 100 vs 200
    goal = {g["variant"]: g for g in matched["GRPO-cosine"]["goal"]}
    assert goal["Knapsack-0.5-cosine"]["reached"] == 3 and goal["GRPO-cosine"]["reached"] == 0
    against_grpo = {(r["metric"], r["variant"]): r for r in paired_metric_records(records, min_seeds=3)}
    assert against_grpo[("acc_final", "Knapsack-0.5-cosine")]["mean_diff"] == pytest.approx(0.1)
    text = allocation_report.report([_full(r["variant"], r["seed"], r["curve"]) for r in records],
                             list(against_grpo.values()), goal_records(records), {"recipe": "r", "seeds": [0, 1, 2]},
                             matched)  # fmt: skip
    assert "## Against GRPO-cosine" in text and "censored (variant/GRPO-cosine)" in text
    assert "## Against GRPO-40-cosine" in text
    assert list(allocation_analysis.matched_comparisons([r for r in records if r["variant"] != "GRPO-cosine"])) == [
        "GRPO-40-cosine"
    ]
    no_matched_reference = [r for r in records if r["variant"] not in ("GRPO-cosine", "GRPO-40-cosine")]
    assert allocation_analysis.matched_comparisons(no_matched_reference) == {}


def _stepped(variant, seed, accuracies, tokens_per_step=10.0, eval_every=20):
    """A record evaluated every ``eval_every`` steps, each step generating ``tokens_per_step`` tokens (and 2 responses)."""
    steps = [i * eval_every for i in range(len(accuracies))]
    curve = [[tokens_per_step * s, a] for s, a in zip(steps, accuracies, strict=True)]
    return {**_rec(variant, seed, curve), "steps": steps, "responses_curve": [2.0 * s for s in steps],
            "responses_total": 2.0 * steps[-1], "warm_start": "abc", "acc_step0": accuracies[0],
            "zero_signal_second_half": 0.5, "eval_s": 1.0, "train_s": 2.0}  # fmt: skip


def test_a_reference_cut_after_a_step_is_its_run_stopped_there():
    """GRPO evaluated at steps 0, 20, 40, 60, 80 (10 tokens a step) cut after step 40: the first three evaluations,
    its accuracy at step 40 as the final one, 400 tokens and 80 responses in all; no cut between evaluations."""
    grpo = _stepped("GRPO", 0, [0.2, 0.8, 0.9, 0.85, 0.82])
    cut = allocation_analysis.truncated_record(grpo, 40, "GRPO-first-40")
    assert cut["variant"] == "GRPO-first-40" and cut["truncated_from"] == "GRPO" and cut["seed"] == 0
    assert cut["curve"] == [[0.0, 0.2], [200.0, 0.8], [400.0, 0.9]] and cut["steps"] == [0, 20, 40]
    assert (cut["acc_final"], cut["tokens_total"], cut["responses_total"]) == (0.9, 400.0, 80.0)
    assert cut["zero_signal_second_half"] is None and cut["warm_start"] == "abc"
    assert grpo["acc_final"] == 0.82 and len(grpo["curve"]) == 5  # the run's own record is left as it was
    with pytest.raises(ValueError, match="no evaluation at step 30"):
        allocation_analysis.truncated_record(grpo, 30, "GRPO-first-30")


def test_a_cut_reference_is_the_equal_budget_control_and_refuses_a_decaying_rate(monkeypatch):
    """Knapsack-0.5 (5 tokens a step, 80 steps: 400 tokens) against GRPO's runs cut at step 40 (400 tokens): at
    100% of the cut's tokens both are at their last evaluation, 0.88 against 0.9; against GRPO's whole run it is at
    0.88 against GRPO's final 0.82. A cut of a variant with a cosine rate is refused by name."""
    records = []
    for s in range(3):
        records.append(_stepped("GRPO", s, [0.2, 0.8, 0.9, 0.85, 0.82]))
        records.append(_stepped("Knapsack-0.5", s, [0.2, 0.7, 0.86, 0.87, 0.88], tokens_per_step=5.0))
    cuts = allocation_analysis.truncated_references(records, {"lr_scheduler": "constant", "lr_warmup_ratio": 0.0})
    assert [c["variant"] for c in cuts] == ["GRPO-first-40"] * 3  # no GRPO-lr5e-5 records to cut
    stopped = [allocation_analysis.truncated_record(r, 40, "GRPO") if r["variant"] == "GRPO" else r for r in records]
    assert allocation_analysis.truncated_references(stopped, {"lr_scheduler": "constant"}) == []  # 40-step runs: no cut
    matched = allocation_analysis.matched_comparisons([*records, *cuts], min_seeds=3)
    assert list(matched) == ["GRPO-first-40"]
    paired = {(r["metric"], r["variant"]): r for r in matched["GRPO-first-40"]["paired"]}
    assert paired[("acc_at_100pct", "Knapsack-0.5")]["mean_diff"] == pytest.approx(-0.02)
    assert paired[("tokens_total", "Knapsack-0.5")]["ratio"] == pytest.approx(1.0)
    against_grpo = {(r["metric"], r["variant"]): r for r in paired_metric_records(records, min_seeds=3)}
    assert against_grpo[("acc_final", "Knapsack-0.5")]["mean_diff"] == pytest.approx(0.06)
    text = allocation_report.report(records, list(against_grpo.values()), goal_records(records),
                             {"recipe": "r", "seeds": [0, 1, 2]}, matched)  # fmt: skip
    assert "## Against GRPO-first-40 (GRPO's runs up to step 40): Knapsack-0.5 paired with it" in text
    with pytest.raises(ValueError, match="'cosine' learning rate"):
        allocation_analysis.truncated_references(records, {"lr_scheduler": "cosine", "lr_warmup_ratio": 0.0})
    monkeypatch.setitem(allocation_analysis.TRUNCATED_REFERENCES, "GRPO-cosine-first-40", ("GRPO-cosine", 40))
    with pytest.raises(ValueError, match=r"GRPO-cosine-first-40.*cut only variants at a constant rate"):
        allocation_analysis.truncated_references(records, {"lr_scheduler": "constant", "lr_warmup_ratio": 0.0})


def test_benchmark_cost_sums_each_runs_timed_seconds_per_variant_and_in_all():
    grpo = [_full("GRPO", s, CURVE) for s in (0, 1)]  # eval_s 1 + train_s 2 each
    grpo[1].update({"eval_s": 1800.0, "train_s": 5397.0})
    cut = allocation_analysis.truncated_record(
        {**_full("GRPO", 2, CURVE), "responses_curve": [0, 8, 16, 24]}, 2, "GRPO-first-2"
    )
    rows = {r["variant"]: r for r in allocation_report.benchmark_cost([*grpo, _full("Skip", 0, CURVE), cut])}
    assert list(rows) == ["GRPO", "Skip", "GRPO-first-2", "all"]
    assert rows["GRPO"] == {"variant": "GRPO", "runs": 2, "timed": 2, "core_h": pytest.approx(2.0)}  # 7200 s
    assert rows["Skip"]["core_h"] == pytest.approx(3 / 3600)
    assert rows["GRPO-first-2"] == {"variant": "GRPO-first-2", "runs": 1, "timed": 0, "core_h": 0.0}
    assert rows["all"]["runs"] == 4 and rows["all"]["timed"] == 3
    assert rows["all"]["core_h"] == pytest.approx(2.0 + 3 / 3600)
    text = "\n".join(allocation_report._cost_table([*grpo, cut]))
    assert "2.0 core-hours of held-out evaluation and RL steps over 3 runs (1.0 h with 2 runs at a time" in text
    assert "| GRPO | 2 | 2.0 | 60 |" in text and "| GRPO-first-2 | 1 | 0.0 | n/a |" in text


def test_a_run_repeated_from_the_same_warm_start_is_one_unit_and_two_runs_of_cost(tmp_path):
    """The records made before fingerprints carry the fingerprint of the warm start whose GRPO run repeated theirs
    (``warm_start_inferred``): both GRPO records are kept and cost two runs, the analysis counts the unit once, with
    the record measured under its fingerprint."""
    other = [[0.0, 0.2], [100.0, 0.5], [200.0, 0.9]]
    old_grpo = {**_full("GRPO", 4, CURVE), "eval_s": 5.0, "warm_start": "aaa", "warm_start_inferred": True}
    old_knap = {**_full("Knapsack-0.5", 4, CURVE[:2]), "warm_start": "aaa", "warm_start_inferred": True}
    new_grpo = {**_full("GRPO", 4, CURVE), "warm_start": "aaa"}
    records = [old_grpo, new_grpo, old_knap, {**_full("GRPO", 4, other), "warm_start": "bbb"}]
    units = allocation_analysis.one_record_per_run(records)
    assert [(r["variant"], allocation_analysis.unit_label(r), r["eval_s"]) for r in units] == [
        ("GRPO", "4/aaa", 1.0),
        ("Knapsack-0.5", "4/aaa", 1.0),
        ("GRPO", "4/bbb", 1.0),
    ]
    assert list(allocation_analysis.paired_runs(units)["GRPO"]) == ["4/aaa", "4/bbb"]
    assert {r["variant"]: r["runs"] for r in allocation_report.benchmark_cost(records)}["GRPO"] == 3
    _results(tmp_path, records, {"GRPO": {}, "Knapsack-0.5": allocation.VARIANTS["Knapsack-0.5"]})
    assert len(stored_records(tmp_path / "results.json", "kk-revisit")) == 4  # a repeated run is not merged away
