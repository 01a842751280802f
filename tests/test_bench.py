"""Benchmark bookkeeping on hand-made metrics (the benchmarks themselves are run by hand, not in CI)."""

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.common import (
    FROM_WARM_START,
    GROUP_VARIANTS,
    VARIANTS,
    band,
    first_step_reaching,
    mean_ci,
    t_quantile,
    trapezoid_auc,
)
from bench.sample_efficiency import (
    HEADER,
    base_overrides,
    choose_target,
    curves,
    earlier_records,
    main,
    plot,
    retarget,
    run_record,
    subset_rows,
    summarise,
)


def fake_run(variant, seed, accs, responses_per_step, zero=0.5, eval_every=1, wall=10.0, tas=None):
    """metrics.jsonl records as the local trainer writes them: step 0 (warm-up + eval), then one per RL step."""
    metrics = [{"step": 0, "eval/greedy_accuracy": accs[0]}]
    for step in range(1, (len(accs) - 1) * eval_every + 1):
        record = {
            "step": step,
            "sampling/responses_generated": responses_per_step,
            "advantage/zero_signal_fraction": zero,
            "response/length_mean": 10.0 + step,
            "response/length_std_over_mean": 0.1 * step,
            "adora/tas_fraction": tas(step) if tas else 0.0,
        }
        if step % eval_every == 0:
            record["eval/greedy_accuracy"] = accs[step // eval_every]
        metrics.append(record)
    return {"variant": variant, "seed": seed, "summary": {"wall_time_s": wall}, "metrics": metrics}


def test_curves_accumulate_responses():
    c = curves(fake_run("GRPO", 0, [0.1, 0.2, 0.4], 32)["metrics"])
    assert c["acc_vs_step"] == [(0, 0.1), (1, 0.2), (2, 0.4)]
    assert c["acc_vs_responses"] == [(0.0, 0.1), (32, 0.2), (64, 0.4)]
    assert c["total_responses"] == 64 and c["length"] == [(1, 11.0), (2, 12.0)]


def test_t_quantile_matches_the_tables():
    # two-sided 95% critical values of Student's t (any statistics table)
    for df, t in [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (9, 2.2622), (30, 2.0423)]:
        assert t_quantile(0.975, df) == pytest.approx(t, abs=1e-4)
    assert t_quantile(0.5, 3) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError):
        t_quantile(0.975, 0)


def test_mean_ci_hand_computed():
    # [1, 2, 3]: mean 2, s = 1, half-width = t(0.975, 2) * 1 / sqrt(3) = 4.302653 / 1.732051 = 2.484138
    m, h = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(2.484138, abs=1e-6)
    # [0.2, 0.4]: mean 0.3, s = 0.141421, half-width = 12.706205 * 0.141421 / sqrt(2) = 1.270620
    m, h = mean_ci([0.2, None, 0.4])
    assert m == pytest.approx(0.3) and h == pytest.approx(1.270620, abs=1e-6)
    assert mean_ci([0.7]) == (0.7, 0.0)
    assert all(math.isnan(x) for x in mean_ci([None]))


def test_trapezoid_auc_hand_computed():
    assert trapezoid_auc([(0, 0.2), (10, 0.4), (20, 0.4)]) == pytest.approx((10 * 0.3 + 10 * 0.4) / 20)  # 0.35
    # uneven steps: 0.875
    assert trapezoid_auc([(0, 0.0), (5, 1.0), (20, 1.0)]) == pytest.approx((5 * 0.5 + 15 * 1.0) / 20)
    assert trapezoid_auc([(0, 0.3)]) == 0.3 and trapezoid_auc([]) is None


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=12), st.lists(st.integers(1, 20), min_size=11, max_size=11))
def test_auc_is_a_mean_height(ys, gaps):
    xs = [0] + [sum(gaps[:i]) for i in range(1, len(ys))]
    auc = trapezoid_auc(list(zip(xs, ys, strict=True)))
    assert min(ys) - 1e-12 <= auc <= max(ys) + 1e-12


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-10, 10), min_size=2, max_size=8))
def test_ci_contains_the_mean_and_shrinks_with_more_confidence_in_t(values):
    m, h = mean_ci(values)
    assert h >= 0 and min(values) - 1e-9 <= m <= max(values) + 1e-9
    assert h == pytest.approx(t_quantile(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values)))


def test_target_is_above_every_step0_accuracy():
    assert choose_target([0.3, 0.45, 0.4], 0.05) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="target-margin"):
        choose_target([0.3], 0.0)


def test_run_record_fields():
    tas = lambda step: 0.25 if step <= 20 else 1.0  # noqa: E731
    run = fake_run("GRPO+ADORA", 3, [0.2, 0.3, 0.5, 0.6], 32, eval_every=10, wall=42.0, tas=tas)
    rec = run_record(run, target=0.45, adora_on=True)
    assert rec["variant"] == "GRPO+ADORA" and rec["seed"] == 3
    assert rec["acc_step0"] == 0.2 and rec["acc_final"] == 0.6
    assert rec["auc"] == pytest.approx((10 * 0.25 + 10 * 0.4 + 10 * 0.55) / 30)
    assert rec["steps_to_target"] == 20 and rec["responses_to_target"] == 20 * 32
    assert rec["responses"] == 30 * 32 and rec["wall_s"] == 42.0
    assert rec["tas_fraction_first20"] == pytest.approx(0.25)  # steps 1..20 only
    assert rec["length_std_over_mean_step0"] == pytest.approx(0.1)  # the first RL step's value
    assert rec["length_first_step"] == 11.0 and rec["length_final_step"] == 40.0
    assert rec["zero_signal"] == 0.5 and rec["length_mean"] == pytest.approx(sum(10.0 + s for s in range(1, 31)) / 30)
    assert run_record(run, target=0.9, adora_on=False)["tas_fraction_first20"] is None
    assert run_record(run, target=0.9, adora_on=False)["steps_to_target"] is None
    resumed = {**run, "summary": {"wall_time_s": 5.0, "resumed_from_step": 12}}
    assert run_record(resumed, target=0.45, adora_on=True)["wall_s"] is None  # times only its last invocation
    assert run_record(resumed, target=0.45, adora_on=True)["resumed_from_step"] == 12


def test_summarise_means_cis_and_reached_counts():
    runs = [
        fake_run("GRPO", 0, [0.1, 0.2, 0.4], 32, wall=10.0),
        fake_run("GRPO", 1, [0.1, 0.35, 0.2], 32, wall=20.0),
        fake_run("Ada-pos", 0, [0.1, 0.35, 0.5], 64, wall=30.0),
        fake_run("Ada-pos", 1, [0.1, 0.1, 0.1], 64, wall=30.0),
    ]
    records = [run_record(r, target=0.3, adora_on=False) for r in runs]
    rows, stats = summarise(records)
    assert [r[0] for r in rows] == ["GRPO", "Ada-pos"] and all(len(r) == len(HEADER) for r in rows)
    assert stats["GRPO"]["steps_to_target"]["mean"] == 1.5 and stats["GRPO"]["reached_target"] == "2/2"
    assert stats["Ada-pos"]["reached_target"] == "1/2" and stats["Ada-pos"]["steps_to_target"] == {
        "mean": 1.0,
        "ci95": 0.0,
        "n": 1,
    }
    # GRPO final accuracy [0.4, 0.2]: mean 0.3, half-width 12.706205 * 0.141421 / sqrt(2) = 1.270620
    assert stats["GRPO"]["acc_final"]["mean"] == pytest.approx(0.3) and stats["GRPO"]["acc_final"][
        "ci95"
    ] == pytest.approx(1.270620, abs=1e-6)
    ada = dict(zip(HEADER, rows[1], strict=True))
    assert ada["reached target"] == "1/2" and ada["gain"] == "0.200 ± 2.541"
    assert ada["responses (vs GRPO)"].endswith("(2.00x)") and ada["wall s (vs GRPO)"].endswith("(2.00x)")
    assert ada["TAS frac (first 20)"] == "n/a"


def test_accuracy_per_subset_from_the_first_and_last_evaluation():
    runs = [fake_run("GRPO", seed, [0.1, 0.5], 32) for seed in (0, 1)]
    for run, (two, three) in zip(runs, [(0.2, 0.6), (0.4, 0.8)], strict=True):
        run["metrics"][0].update({"eval/greedy_accuracy/ppl_2": 0.3, "eval/greedy_accuracy/ppl_3": 0.1})
        run["metrics"][-1].update({"eval/greedy_accuracy/ppl_2": three, "eval/greedy_accuracy/ppl_3": two})
    records = [run_record(r, target=0.3, adora_on=False) for r in runs]
    assert records[0]["acc_step0_by_subset"] == {"ppl_2": 0.3, "ppl_3": 0.1} and records[1]["acc_final_by_subset"] == {
        "ppl_2": 0.8,
        "ppl_3": 0.4,
    }
    header, rows = subset_rows(records)
    assert header == ["variant", "acc ppl_2 (step 0 -> final)", "acc ppl_3 (step 0 -> final)"]
    assert rows == [["GRPO", "0.300 -> 0.700", "0.100 -> 0.300"]]
    assert subset_rows([run_record(fake_run("GRPO", 0, [0.1, 0.5], 32), target=0.3, adora_on=False)]) == ([], [])


def test_band_and_plot(tmp_path):
    xs, ys, hs = band([[(0, 0.1), (10, 0.3)], [(0, 0.3), (20, 0.5), (30, 0.9)]])
    assert (
        xs == [0, 15]
        and ys == pytest.approx([0.2, 0.4])
        and hs[0] == pytest.approx(12.706205 * math.sqrt(0.02) / math.sqrt(2))
    )
    records = [
        run_record(fake_run(v, s, [0.1, 0.2 + 0.1 * s, 0.4], 32), 0.3, False)
        for v in ("GRPO", "adaGRPO")
        for s in (0, 1)
    ]
    merged = {
        **records[0],
        "seed": 2,
        "series": {"acc_vs_responses": [[0, 0.1], [32, 0.3]], "zero_signal": [], "length": []},
    }
    # a merged record without per-step panels
    plot([*records, merged], ["GRPO", "adaGRPO"], tmp_path / "curves.png", "test")
    assert (tmp_path / "curves.png").stat().st_size > 1000


def test_records_keep_the_series_that_merging_needs():
    rec = run_record(fake_run("GRPO", 0, [0.1, 0.2, 0.4], 32), target=0.3, adora_on=False)
    assert rec["series"]["acc_vs_responses"] == [[0.0, 0.1], [32, 0.2], [64, 0.4]] and rec["series"]["length"] == [
        [1, 11.0],
        [2, 12.0],
    ]
    assert rec["steps_to_target"] == 2 and rec["responses_to_target"] == 64
    lower = retarget(rec, 0.15)  # a lower target, as when merged seeds start lower
    assert lower["target"] == 0.15 and lower["steps_to_target"] == 1 and lower["responses_to_target"] == 32
    assert retarget(rec, 0.5)["steps_to_target"] is None and retarget(rec, 0.5)["responses_to_target"] is None


def test_run_record_keeps_the_logged_token_curve():
    run = fake_run("GRPO", 0, [0.1, 0.2, 0.4], 32)
    assert run_record(run, 0.3, False)["series"]["acc_vs_tokens"] == []  # no step logged sampling/tokens_generated
    for i, m in enumerate(run["metrics"][1:], start=1):
        m["sampling/tokens_generated"] = 100.0 * i
    assert run_record(run, 0.3, False)["series"]["acc_vs_tokens"] == [[0.0, 0.1], [100.0, 0.2], [300.0, 0.4]]


def test_merge_pools_earlier_seeds_of_the_same_settings(tmp_path, capsys):
    import json

    settings = {
        "recipe": "kk-tiny",
        "steps": 40,
        "overrides": {"save_every": 0},
        "variants": {"GRPO": {}},
        "target_margin": 0.05,
    }
    new = run_record(fake_run("GRPO", 3, [0.1, 0.2, 0.4], 32), target=0.3, adora_on=False)
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"settings": settings, "runs": [{**new, "seed": 0}, {**new, "seed": 3}]}))
    got = earlier_records(path, settings, seeds_now=[3])
    assert [r["seed"] for r in got] == [0]  # seed 3 is being run now: its old record is dropped
    assert got[0]["series"] == new["series"]  # taken as it is
    with pytest.raises(ValueError, match="steps=40 but this run has 30"):
        earlier_records(path, {**settings, "steps": 30}, seeds_now=[3])
    assert main(["--recipe", "kk-tiny", "--report-only", "--merge", str(tmp_path / "missing.json")]) == 2
    assert "--merge" in capsys.readouterr().err


def test_variants_change_only_the_method():
    from adora_openrlhf.recipes import build_run_config

    base = build_run_config("kk-testbed", FROM_WARM_START).to_dict()
    assert base["warmup"]["steps"] == 0 and base["warmup"]["mix_steps"] == 0
    for name, overrides in VARIANTS.items():
        cfg = build_run_config("kk-testbed", {**FROM_WARM_START, **overrides}).to_dict()
        changed = {k for k in cfg if cfg[k] != base[k]}
        method = {"adora", "sampling", "dynamic_filtering"} | (
            {"advantage", "critic"} if name.startswith("PPO") else set()
        )
        assert changed <= method, (name, changed)
        assert (name in GROUP_VARIANTS) == (cfg["advantage"]["estimator"] == base["advantage"]["estimator"]), name
        if cfg["adora"]["enabled"]:
            assert cfg["adora"]["edge_policy"] == "llm"
    assert build_run_config("kk-testbed", VARIANTS["GRPO+ADORA-amp"]).adora.mode == "amplify"
    assert build_run_config("kk-testbed", VARIANTS["adaGRPO"]).sampling.escalation == [{"temperature": 1.3}]
    assert build_run_config("kk-testbed", VARIANTS["DAPO-filter"]).dynamic_filtering.enabled
    assert list(VARIANTS).index("DAPO-filter") == list(VARIANTS).index("Ada-balance+ADORA") + 1


def test_quick_overrides_build_for_both_kk_recipes():
    from adora_openrlhf.recipes import build_run_config

    tiny = build_run_config("kk-tiny", base_overrides("kk-tiny", True, {}, {}))  # kk-tiny has no mixed warm-up phase
    assert (tiny.warmup.steps, tiny.warmup.mix_steps, tiny.steps, tiny.eval_samples) == (40, 0, 10, 0)
    testbed = build_run_config("kk-testbed", base_overrides("kk-testbed", True, {"steps": 4}, {"warmup.steps": 7}))
    assert (testbed.warmup.steps, testbed.warmup.mix_steps, testbed.steps) == (7, 10, 4)
    assert base_overrides("kk-testbed", False, {}, {}) == {"save_every": 0, "eval_samples": 0}


def test_bad_input_is_one_error_line(capsys):
    assert main(["--recipe", "kk-tiny", "--set", "train.lrr=1", "--report-only"]) == 2
    assert main(["--recipe", "kk-tiny", "--target-margin", "0", "--report-only"]) == 2
    assert main(["--recipe", "kk-qwen2.5-7b-grpo", "--report-only"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 3
        and "train.lrr" not in err[0]
        and "lrr" in err[0]
        and "target-margin" in err[1]
        and "local recipe" in err[2]
    )


def test_helpers():
    assert first_step_reaching([(0, 0.1), (5, 0.3), (9, 0.5)], 0.3) == 5
    assert first_step_reaching([(0, 0.1)], 0.3) is None


def test_finished_runs_with_the_same_config_are_reused(tmp_path, monkeypatch):
    """A rerun of the benchmark reads back a finished run holding the same config instead of recomputing it;
    a changed setting or --fresh recomputes it."""
    from adora_openrlhf import train
    from bench.common import RunSpec, run_training

    overrides = {
        **base_overrides("kk-tiny", True, {"steps": 2, "eval_every": 2, "data.num_eval": 8}, {"warmup.steps": 2}),
        "data.num_train": 32,
        "prompts_per_step": 2,
        "sampling.n_keep": 2,
        "rollout.max_new_tokens": 16,
    }
    spec = RunSpec("GRPO", 0, "kk-tiny", overrides, str(tmp_path / "run"), reuse=True)
    first = run_training(spec)
    assert first["summary"]["steps"] == 2 and (tmp_path / "run" / "summary.json").exists()

    calls = []
    monkeypatch.setattr(train, "train_local", lambda cfg, **kw: calls.append((cfg.train.lr, kw)))
    monkeypatch.setattr("bench.common.load_run", lambda variant, seed, out: "read back")
    again = run_training(spec)
    assert calls == [] and again == "read back"

    other = RunSpec("GRPO", 0, "kk-tiny", {**overrides, "train.lr": 1e-4}, spec.output_dir, reuse=True)
    with pytest.raises(SystemExit, match=r"holds a run of other settings \(train\.lr: .* -> 0\.0001\)"):
        run_training(other)  # another config: the finished run is kept, not replaced
    assert calls == [] and (tmp_path / "run" / "summary.json").exists()
    run_training(RunSpec("GRPO", 0, "kk-tiny", overrides, spec.output_dir, reuse=False))
    assert len(calls) == 1 and calls[0][1] == {"resume": False, "overwrite": True}  # --fresh recomputes it


def test_a_finished_run_made_before_a_field_existed_is_the_same_run_while_the_field_holds_its_default():
    from bench.common import setting_differences

    defaults = {"steps": 40, "grading": {"deadline_s": 60.0, "workers": 8}, "extra": {}}
    now = {"steps": 80, "grading": {"deadline_s": 60.0, "workers": 8}, "extra": {}}
    assert not setting_differences({"steps": 80, "extra": {}}, now, defaults)  # grading added since, at its defaults
    assert setting_differences({"steps": 40, "extra": {}}, now, defaults)  # a saved field differs
    changed = {**now, "grading": {"deadline_s": 5.0, "workers": 8}}
    assert setting_differences({"steps": 80, "extra": {}}, changed, defaults)  # the added field is not its default
    assert setting_differences({**now, "removed": 1}, now, defaults)  # a field removed since
    assert not setting_differences(now, now, defaults)


def test_a_run_config_names_its_paths_by_location(tmp_path, monkeypatch):
    from bench.common import setting_differences

    monkeypatch.chdir(tmp_path)
    relative = {"output_dir": "bench/runs/GRPO_seed0", "model": {"path": "bench/warm"}}
    absolute = {"output_dir": str(tmp_path / "bench/runs/GRPO_seed0"), "model": {"path": str(tmp_path / "bench/warm")}}
    assert not setting_differences(relative, absolute, relative)
    assert setting_differences(relative, {**absolute, "output_dir": str(tmp_path / "elsewhere")}, relative)


def test_a_run_made_from_another_folder_is_read_from_that_folder(tmp_path, monkeypatch):
    """A config saved with relative paths by a run started in ``tmp_path`` describes the same run when the
    benchmark is later run from elsewhere with absolute paths: the saved output_dir names the folder the config
    sits in, which tells the folder the run was started from."""
    from bench.common import setting_differences

    run_dir = tmp_path / "bench/runs/GRPO_seed0"
    run_dir.mkdir(parents=True)
    saved = {"output_dir": "bench/runs/GRPO_seed0", "model": {"path": "bench/warm"}, "steps": 80}
    now = {"output_dir": str(run_dir), "model": {"path": str(tmp_path / "bench/warm")}, "steps": 80}
    monkeypatch.chdir(tmp_path / "bench")  # another folder than the one the run was started from
    assert not setting_differences(saved, now, saved, run_dir)
    assert setting_differences(saved, now, saved)  # without the run's folder: read from the current one
    moved = {**now, "model": {"path": str(tmp_path / "other_warm")}, "steps": 40}
    assert setting_differences(saved, moved, saved, run_dir) == [
        f"model.path: {str(tmp_path / 'bench/warm')!r} -> {str(tmp_path / 'other_warm')!r}",
        "steps: 80 -> 40",
    ]
