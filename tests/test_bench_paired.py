"""Paired statistics, generation budget and the paired report of the sample-efficiency benchmark, on hand-computed
cases and properties (the benchmark itself is run by hand, not in CI)."""

import json
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bench.budget import (
    cost_to_reach,
    token_curve,
    with_tokens,
)
from bench.paired_analysis import differences_by_step, eval_noise_bound, paired_records, paired_table, power_rows
from bench.paired_stats import holm, paired_t, paired_t_power, seeds_for_power, sign_flip_p, wins_ties_losses
from bench.sample_efficiency import main

# -- paired_stats --------------------------------------------------------------------------------------------


def test_paired_t_hand_computed():
    # [1, 2, 3]: mean 2, s = 1, se = 1/sqrt(3), t = 2 sqrt(3) = 3.464102; df = 2, where the t CDF is
    # 1/2 + t / (2 sqrt(2 + t^2)): p = 1 - t / sqrt(2 + t^2) = 1 - 3.464102 / sqrt(14) = 0.074180;
    # half-width t(0.975, 2) / sqrt(3) = 4.302653 / 1.732051 = 2.484138
    r = paired_t([1.0, 2.0, 3.0])
    assert (r.n, r.mean, r.sd) == (3, 2.0, 1.0)
    assert r.t == pytest.approx(3.464102, abs=1e-6) and r.p_value == pytest.approx(
        1 - 3.464102 / math.sqrt(14), abs=1e-6
    )
    assert (r.ci_low, r.ci_high) == (pytest.approx(2 - 2.484138, abs=1e-6), pytest.approx(2 + 2.484138, abs=1e-6))
    # [1, 3]: mean 2, s = sqrt(2), se = 1, t = 2; df = 1 (Cauchy): p = 1 - 2 atan(2) / pi = 0.295167
    r = paired_t([1.0, 3.0])
    assert r.t == pytest.approx(2.0) and r.p_value == pytest.approx(1 - 2 * math.atan(2) / math.pi, abs=1e-9)
    assert r.ci_high - r.mean == pytest.approx(12.706205, abs=1e-5)  # t(0.975, 1) * se


def test_paired_t_degenerate_cases():
    assert paired_t([]).n == 0 and paired_t([]).p_value is None
    one = paired_t([0.3])
    assert (one.n, one.mean, one.ci_low, one.p_value) == (1, 0.3, None, None)
    same = paired_t([0.02, 0.02, 0.02])
    assert (same.ci_low, same.ci_high, same.p_value, same.t) == (
        pytest.approx(0.02),
        pytest.approx(0.02),
        0.0,
        math.inf,
    )
    zero = paired_t([0.0, 0.0])
    assert (zero.p_value, zero.t, zero.ci_low) == (1.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="level"):
        paired_t([1.0, 2.0], level=1.0)


def test_sign_flip_hand_computed():
    # [1, 2, 3]: |sum| = 6 only for all + and all -: 2 / 8
    assert sign_flip_p([1.0, 2.0, 3.0]) == 0.25
    assert sign_flip_p([0.01] * 5) == 2 / 32  # the smallest p with 5 pairs
    # [3, 1, -1]: |3 +- 1 +- 1| over the 8 vectors = 3, 5, 1, 3 twice each; >= 3: 6 of 8
    assert sign_flip_p([3.0, 1.0, -1.0]) == 0.75
    assert sign_flip_p([1.0, -1.0]) == 1.0 and sign_flip_p([0.0, 0.0]) == 1.0 and sign_flip_p([]) == 1.0
    # float sums that are equal up to rounding count as equal: 0.1 + 0.2 vs 0.3
    assert sign_flip_p([0.1, 0.2, -0.3 + 0.6]) == sign_flip_p([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="at most 40"):
        sign_flip_p([1.0] * 41)


def test_sign_flip_beyond_twenty_pairs_is_still_exact():
    # 22 equal differences: only all + and all - reach |sum| = 22
    assert sign_flip_p([1.0] * 22) == 2 / 2**22
    # 21 ones and a -1, sum 20: with k ones flipped and the -1 kept, 21 - 2k - 1 >= 20 needs k = 0 (1 vector);
    # with the -1 flipped, 21 - 2k + 1 >= 20 needs k <= 1 (22 vectors); the mirror images too: 2 * 23 = 46
    assert sign_flip_p([1.0] * 21 + [-1.0]) == 46 / 2**22
    assert sign_flip_p([0.0] * 25) == 1.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-6, 6).map(float), min_size=1, max_size=12))
def test_sign_flip_counts_what_listing_every_sign_vector_counts(diffs):
    n = len(diffs)
    signs = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1)
    listed = np.count_nonzero(np.abs(signs @ np.asarray(diffs)) >= abs(sum(diffs))) / 2**n
    assert sign_flip_p(diffs) == listed


def test_holm_hand_computed():
    # sorted 0.01, 0.03, 0.04, 0.2 -> 4 x 0.01, 3 x 0.03, max(0.09, 2 x 0.04), max(0.09, 0.2)
    assert holm([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert holm([None, 0.5, 0.01]) == [None, pytest.approx(0.5), pytest.approx(0.02)]  # m = 2: None not counted
    assert holm([0.6, 0.7]) == [1.0, 1.0] and holm([]) == []
    with pytest.raises(ValueError, match="\\[0, 1\\]"):
        holm([1.5])


def test_wins_ties_losses_direction():
    assert wins_ties_losses([0.1, 0.0, -0.2, 0.3]) == (2, 1, 1)
    assert wins_ties_losses([0.1, 0.0, -0.2, 0.3], better="lower") == (1, 1, 2)
    assert wins_ties_losses([1e-12, -1e-12]) == (0, 2, 0)  # rounding noise is a tie
    with pytest.raises(ValueError, match="better"):
        wins_ties_losses([1.0], better="up")


def test_power_matches_the_tables():
    # one-sample / paired t, two-sided alpha 0.05, effect size 1: n = 10 gives power 0.8031 (G*Power), and 10 is the least n with 0.8
    assert paired_t_power(10, 1.0, 1.0) == pytest.approx(0.8031, abs=1e-4)
    assert seeds_for_power(1.0, 1.0) == 10 and paired_t_power(9, 1.0, 1.0) < 0.8
    assert paired_t_power(7, 0.0, 1.0, alpha=0.05) == pytest.approx(0.05)  # no effect: the test's level
    assert seeds_for_power(0.0, 1.0) is None and seeds_for_power(0.001, 1.0, max_n=50) is None
    with pytest.raises(ValueError, match="sigma"):
        paired_t_power(5, 1.0, 0.0)


# accuracy steps of 1/200
diffs_strategy = st.lists(st.integers(-40, 40).map(lambda k: k / 200), min_size=2, max_size=10)


@settings(max_examples=80, deadline=None)
@given(diffs_strategy)
def test_paired_t_properties(diffs):
    r = paired_t(diffs)
    assert r.ci_low <= r.mean <= r.ci_high and 0.0 <= r.p_value <= 1.0
    flipped = paired_t([-d for d in diffs])
    assert flipped.mean == pytest.approx(-r.mean) and flipped.p_value == pytest.approx(r.p_value)
    if r.sd and r.sd > 1e-9:  # the test and the interval agree: p < 0.05 exactly when 0 is outside the 95% interval
        assume(abs(r.p_value - 0.05) > 1e-9)
        assert (r.p_value < 0.05) == (r.ci_low > 0 or r.ci_high < 0)


@settings(max_examples=80, deadline=None)
@given(diffs_strategy, st.randoms())
def test_sign_flip_properties(diffs, rnd):
    p = sign_flip_p(diffs)
    n = len(diffs)
    assert 0 < p <= 1 and (p * 2**n) == int(p * 2**n)
    if any(d != 0 for d in diffs):
        assert p >= 2 / 2**n
    shuffled = list(diffs)
    rnd.shuffle(shuffled)
    assert sign_flip_p(shuffled) == p and sign_flip_p([-d for d in diffs]) == p


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(0, 1)), max_size=9))
def test_holm_properties(ps):
    adjusted = holm(ps)
    assert [a is None for a in adjusted] == [p is None for p in ps]
    pairs = [(p, a) for p, a in zip(ps, adjusted, strict=True) if p is not None]
    assert all(p <= a + 1e-12 and a <= 1.0 for p, a in pairs)
    assert all(a1 <= a2 + 1e-12 for (p1, a1) in pairs for (p2, a2) in pairs if p1 <= p2)  # order kept
    if len(pairs) == 1:
        assert pairs[0][1] == pairs[0][0]


@settings(max_examples=30, deadline=None)
@given(st.floats(0.05, 2.0), st.integers(2, 40))
def test_power_grows_with_seeds_and_effect(effect, n):
    assert paired_t_power(n + 1, effect, 1.0) >= paired_t_power(n, effect, 1.0) - 1e-12
    assert paired_t_power(n, effect * 1.5, 1.0) >= paired_t_power(n, effect, 1.0) - 1e-12
    needed = seeds_for_power(effect, 1.0)
    assert paired_t_power(needed, effect, 1.0) >= 0.8 and (needed == 2 or paired_t_power(needed - 1, effect, 1.0) < 0.8)


# -- budget ----------------------------------------------------------------------------------------------------


def _record(variant, seed, accs, responses_per_step, lengths, tokens_per_step=None, every=1, subsets=None):
    """A results.json record with its series, evaluations every ``every`` steps over len(accs) - 1 intervals; its
    token count per step ``tokens_per_step`` (default: every response of that step's mean length)."""
    steps = (len(accs) - 1) * every
    acc_curve = [[i * every, a] for i, a in enumerate(accs)]
    cum = [sum(responses_per_step[:s]) for s in range(steps + 1)]
    series = {
        "acc_vs_responses": [[float(cum[s]), a] for s, a in acc_curve],
        "length": [[s, lengths[s - 1]] for s in range(1, steps + 1)],
        "zero_signal": [],
    }
    if tokens_per_step is None:
        tokens_per_step = [n * length for n, length in zip(responses_per_step, lengths, strict=True)]
    tok = [sum(tokens_per_step[:s]) for s in range(steps + 1)]
    series["acc_vs_tokens"] = [[float(tok[s]), a] for s, a in acc_curve]
    return {
        "variant": variant,
        "seed": seed,
        "acc_step0": accs[0],
        "acc_final": accs[-1],
        "auc": sum((a + b) / 2 for a, b in zip(accs, accs[1:], strict=False)) / (len(accs) - 1),
        "acc_curve": acc_curve,
        "acc_final_by_subset": subsets or {},
        "responses": float(cum[-1]),
        "series": series,
    }


def test_token_curve_and_cost_to_reach():
    logged = _record("Ada-pos", 0, [0.2, 0.5, 0.7], [6, 8], [10.0, 20.0], tokens_per_step=[66, 150])
    curve = token_curve(logged)
    assert curve == [[0.0, 0.2], [66.0, 0.5], [216.0, 0.7]]
    assert with_tokens(logged)["tokens"] == 216.0 and with_tokens(logged)["tokens_source"] == "logged"
    # a record of the kk-testbed's first seeds: its curve computed from kept lengths, its source named
    assert with_tokens({**logged, "tokens_source": "estimate"})["tokens_source"] == "estimate"
    assert token_curve({**logged, "series": {}}) is None and with_tokens({**logged, "series": {}})["tokens"] is None
    assert cost_to_reach(curve, 0.5) == (66.0, True) and cost_to_reach(curve, 0.7) == (216.0, True)
    assert cost_to_reach(curve, 0.71) == (216.0, False)  # never reached: its whole budget, censored


# -- paired analysis -------------------------------------------------------------------------------------------


def _seeds(variant, finals, reach_index, responses_per_step=4, subsets=None):
    """Records of ``variant`` over seeds: accuracy 0.2 at step 0, then rising to finals[s] at step 3; the curve
    first reaches 0.6 at evaluation reach_index[s]."""
    out = []
    for seed, (final, k) in enumerate(zip(finals, reach_index, strict=True)):
        accs = [0.2] + [0.6 if i >= k else 0.4 for i in (1, 2)] + [final]
        out.append(
            _record(
                variant, seed, accs, [responses_per_step] * 3, [10.0] * 3, subsets=(subsets or [{}] * len(finals))[seed]
            )
        )
    return out


def test_paired_records_hand_computed():
    grpo = _seeds("GRPO", [0.6, 0.6, 0.6], [3, 3, 3])  # reaches its final 0.6 at step 3 in every seed
    # 0.6 at step 1 with twice the responses
    ada = _seeds("Ada-pos", [0.65, 0.62, 0.6], [1, 1, 1], responses_per_step=8)
    flat = _seeds("GRPO+ADORA", [0.55, 0.5, 0.58], [9, 9, 9], responses_per_step=8)  # never reaches 0.6
    paired = {(r["variant"], r["metric"]): r for r in paired_records(grpo + ada + flat, "GRPO")}
    acc = paired[("Ada-pos", "acc_final")]
    assert acc["per_seed"] == {"0": pytest.approx(0.05), "1": pytest.approx(0.02), "2": 0.0}
    assert (acc["n"], acc["wins"], acc["ties"], acc["losses"]) == (3, 2, 1, 0)
    # [0.05, 0.02, 0]: (+, +, +-), (-, -, +-): 4 of 8
    assert acc["mean_diff"] == pytest.approx(0.07 / 3) and acc["p_sign_flip"] == 0.5
    assert acc["p_value"] == pytest.approx(paired_t([0.05, 0.02, 0.0]).p_value)
    # responses to GRPO's final 0.6: GRPO 3 x 4 = 12, Ada-pos 1 x 8 = 8 in every seed -> ratio 2/3 exactly, no spread
    cost = paired[("Ada-pos", "responses_to_ref_final")]
    assert (
        cost["ratio"] == pytest.approx(2 / 3)
        and cost["ratio_ci_low"] == pytest.approx(2 / 3)
        and cost["p_value"] == 0.0
    )
    assert (cost["wins"], cost["losses"], cost["not_reached"]) == (3, 0, 0)
    tokens = paired[("Ada-pos", "tokens_to_ref_final")]  # 80 tokens against GRPO's 120
    assert tokens["ratio"] == pytest.approx(80 / 120)
    # GRPO+ADORA never reaches 0.6: counted at its whole budget, 3 x 8 = 24 responses against GRPO's 12, a known
    # loss of at least ln 2 on every seed (not dropped)
    never = paired[("GRPO+ADORA", "responses_to_ref_final")]
    assert (never["n"], never["not_reached"], never["undetermined"], never["losses"]) == (3, 3, 0, 3)
    assert never["ratio"] == pytest.approx(2.0) and never["per_seed"] == {s: pytest.approx(math.log(2)) for s in "012"}
    assert never["p_sign_flip"] == 0.25  # all three the same sign: 2 of 8 sign vectors as extreme
    # Holm over the two variants of each metric
    for metric in ("acc_final", "auc"):
        block = [paired[(v, metric)] for v in ("Ada-pos", "GRPO+ADORA")]
        assert [r["p_holm"] for r in block] == pytest.approx(holm([r["p_value"] for r in block]))
        assert [r["p_sign_flip_holm"] for r in block] == pytest.approx(holm([r["p_sign_flip"] for r in block]))
    required = {
        "variant",
        "metric",
        "n",
        "mean_diff",
        "ci_low",
        "ci_high",
        "wins",
        "ties",
        "losses",
        "p_value",
        "p_holm",
    }
    assert all(required <= set(r) for r in paired.values())
    table = paired_table(list(paired.values()))
    assert (
        "| acc_final | Ada-pos | 3 | +0.023 [" in table
        and "| responses_to_ref_final | Ada-pos | 3 | 0.67x [0.67, 0.67] |" in table
    )


def test_a_run_that_stops_short_of_the_target_below_the_references_cost_is_undetermined():
    """Seed 0: the variant never reaches GRPO's final 0.6 within its 3 x 2 = 6 responses, GRPO needs 12: the true cost
    could be above or below 12, so the seed counts as 0 in the tests and in no win, tie or loss. Seed 1: it reaches
    0.6 at step 1 with 2 responses, a win of ln(2 / 12)."""
    grpo = _seeds("GRPO", [0.6, 0.6], [3, 3])
    short = _seeds("Ada-pos", [0.5, 0.6], [9, 1], responses_per_step=2)
    cost = {r["metric"]: r for r in paired_records(grpo + short)}["responses_to_ref_final"]
    assert (cost["n"], cost["not_reached"], cost["undetermined"]) == (2, 1, 1)
    assert (cost["wins"], cost["ties"], cost["losses"]) == (1, 0, 0)
    assert cost["per_seed"] == {"0": 0.0, "1": pytest.approx(math.log(2 / 12))}
    assert cost["mean_diff"] == pytest.approx(math.log(2 / 12) / 2)
    assert "| responses_to_ref_final | Ada-pos | 2 |" in paired_table(
        [cost]
    ) and "| 1 (1 undetermined) |" in paired_table([cost])


def test_subset_metrics_and_differences_by_step():
    subsets = [{"ppl_2": 0.7, "ppl_3": 0.5}, {"ppl_2": 0.8, "ppl_3": 0.4}]
    grpo = _seeds("GRPO", [0.6, 0.6], [3, 3], subsets=subsets)
    var = _seeds(
        "DAPO-filter", [0.7, 0.5], [1, 3], subsets=[{"ppl_2": 0.75, "ppl_3": 0.55}, {"ppl_2": 0.8, "ppl_3": 0.3}]
    )
    paired = {(r["variant"], r["metric"]): r for r in paired_records(grpo + var)}
    assert paired[("DAPO-filter", "acc_final_ppl_2")]["per_seed"] == {"0": pytest.approx(0.05), "1": 0.0}
    assert paired[("DAPO-filter", "acc_final_ppl_3")]["per_seed"] == {
        "0": pytest.approx(0.05),
        "1": pytest.approx(-0.1),
    }
    # seed 1 ends at 0.5 < 0.6 after 0.4, 0.4
    assert paired[("DAPO-filter", "responses_to_ref_final")]["not_reached"] == 1
    header, rows = differences_by_step(grpo + var)
    assert header == ["variant", "step 0", "step 1", "step 2", "step 3"]
    # step 1: [+0.2, 0] -> 0.1 ± 12.706 x 0.1414 / sqrt 2
    assert rows[0][:3] == [
        "DAPO-filter",
        "+0.000 ± 0.000",
        "+0.100 ± 1.271",
    ]


def test_power_rows_and_eval_noise_bound():
    paired = [
        {"variant": "A", "metric": "acc_final", "n": 5, "mean_diff": 1.0, "sd_diff": 1.0},
        {"variant": "B", "metric": "acc_final", "n": 5, "mean_diff": 0.0, "sd_diff": 1.0},
        {"variant": "C", "metric": "acc_final", "n": 5, "mean_diff": 0.5, "sd_diff": 0.0},  # no spread: left out
        {"variant": "A", "metric": "auc", "n": 5, "mean_diff": 1.0, "sd_diff": 1.0},
    ]
    rows = power_rows(paired, ["acc_final"])
    assert [(r["variant"], r["seeds_needed"]) for r in rows] == [
        ("A", seeds_for_power(1.0, 1.0, 0.05 / 3)),
        ("B", None),
    ]
    assert rows[0]["alpha"] == pytest.approx(0.05 / 3)  # three variants in the acc_final family
    assert eval_noise_bound(0.8, 200) == pytest.approx(2 * 0.8 * 0.2 / 200)
    with pytest.raises(ValueError, match="num_eval"):
        eval_noise_bound(0.5, 0)


def _fake_run_dir(path, accs, responses_per_step, tokens_per_step):
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({"wall_time_s": 10.0}))
    lines = [{"step": 0, "eval/greedy_accuracy": accs[0]}]
    for step in range(1, len(accs)):
        lines.append(
            {
                "step": step,
                "eval/greedy_accuracy": accs[step],
                "sampling/responses_generated": responses_per_step,
                "sampling/tokens_generated": tokens_per_step,
                "response/length_mean": tokens_per_step / responses_per_step,
                "advantage/zero_signal_fraction": 0.5,
            }
        )
    (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_report_only_writes_the_paired_records(tmp_path):
    out = tmp_path / "bench"
    for seed, (g, a) in enumerate(
        [([0.1, 0.3, 0.5], [0.1, 0.5, 0.55]), ([0.2, 0.3, 0.4], [0.2, 0.4, 0.45]), ([0.1, 0.2, 0.5], [0.1, 0.4, 0.5])]
    ):
        _fake_run_dir(out / "runs" / f"GRPO_seed{seed}", g, 4, 40)
        _fake_run_dir(out / "runs" / f"Ada-pos_seed{seed}", a, 8, 100)
    argv = [
        "--recipe",
        "kk-tiny",
        "--variants",
        "GRPO",
        "Ada-pos",
        "--seeds",
        "0",
        "1",
        "2",
        "--report-only",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    acc = next(r for r in results["paired"] if r["metric"] == "acc_final")
    assert acc["variant"] == "Ada-pos" and acc["per_seed"] == {
        "0": pytest.approx(0.05),
        "1": pytest.approx(0.05),
        "2": 0.0,
    }
    assert acc["p_holm"] == acc["p_value"]  # one variant: Holm changes nothing
    tokens = next(r for r in results["paired"] if r["metric"] == "tokens_to_ref_final")
    # GRPO reaches its final accuracy at step 2 (80 tokens) in every seed; Ada-pos at step 1 (100 tokens) in seeds 0 and 1, step 2 (200) in seed 2
    assert tokens["per_seed"] == {
        "0": pytest.approx(math.log(100 / 80)),
        "1": pytest.approx(math.log(100 / 80)),
        "2": pytest.approx(math.log(200 / 80)),
    }
    assert {r["tokens_source"] for r in results["runs"]} == {"logged"} and "tokens_estimate_check" not in results
    assert results["power"]["rows"] and "Paired comparison with GRPO" in (out / "table.md").read_text()
    assert (out / "curves.png").exists()  # and bench/plots.py's two, drawn from these records
    assert (out / "accuracy.png").stat().st_size > 1000 and (out / "target.png").stat().st_size > 1000


def test_report_of_a_merged_file_alone_reproduces_its_paired_records(tmp_path, capsys):
    out = tmp_path / "bench"
    for seed, (g, a) in enumerate(
        [([0.1, 0.3, 0.5], [0.1, 0.5, 0.55]), ([0.2, 0.3, 0.4], [0.2, 0.4, 0.45]), ([0.1, 0.2, 0.5], [0.1, 0.4, 0.5])]
    ):
        _fake_run_dir(out / "runs" / f"GRPO_seed{seed}", g, 4, 40)
        _fake_run_dir(out / "runs" / f"Ada-pos_seed{seed}", a, 8, 100)
    common = ["--recipe", "kk-tiny", "--variants", "GRPO", "Ada-pos", "--report-only"]
    assert main([*common, "--seeds", "0", "1", "2", "--out", str(out)]) == 0
    first = json.loads((out / "results.json").read_text())
    again = tmp_path / "again"
    again.mkdir()
    # no seed run now: every record comes from the merged file, and the analysis is rebuilt from those records
    assert main([*common, "--seeds", "--merge", str(out / "results.json"), "--out", str(again)]) == 0
    rebuilt = json.loads((again / "results.json").read_text())
    assert rebuilt["settings"]["merged_from"]["seeds"] == [0, 1, 2] and rebuilt["settings"]["seeds"] == [0, 1, 2]
    assert rebuilt["paired"] == first["paired"] and (again / "accuracy.png").exists()
    capsys.readouterr()
    # no seed without --report-only --merge: nothing to do
    assert main([*common[:-1], "--seeds", "--out", str(again)]) == 2
    assert "--seeds" in capsys.readouterr().err
