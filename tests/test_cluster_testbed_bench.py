"""bench.cluster_testbed's bookkeeping (the runs themselves need the real-engine venv and take hours)."""

from __future__ import annotations

import json

import pytest

from bench.cluster_testbed import cli_flags, parse_replicate, reuse, run_name, table
from bench.common import gain_cells


def record(backend: str, variant: str, seed: int, acc0: float, acc: float) -> dict:
    return {
        "backend": backend,
        "variant": variant,
        "seed": seed,
        "acc_step0": acc0,
        "acc_final": acc,
        "step_s": 2.0,
        "responses": 5120,
        "wall_s": 100.0,
        "curve": [[0, acc0], [40, acc]],
    }


def test_gain_cells_by_hand():
    # gains 0.6 and 0.7: mean 0.65, s = 0.0707, t_{0.975,1} = 12.706 -> half-width 12.706 * 0.0707 / sqrt(2) = 0.635
    cells = gain_cells([record("local", "GRPO", 1, 0.2, 0.9), record("local", "GRPO", 0, 0.2, 0.8)])
    assert cells == ["0 1", "0.200 0.200", "0.800 0.900", "+0.600 +0.700", "+0.650 ± 0.635"]
    assert gain_cells([record("local", "GRPO", 3, 0.25, 0.5)])[-1] == "+0.250 ± 0.000"  # one seed: no spread


def test_table_has_a_row_per_backend_and_variant_local_first():
    records = [
        record("openrlhf", "GRPO", 0, 0.17, 0.8),
        record("local", "GRPO", 0, 0.21, 0.88),
        record("openrlhf", "GRPO+ADORA", 0, 0.17, 0.85),
    ]
    lines = table(records).splitlines()
    assert lines[0].startswith("| backend | variant | seeds |") and len(lines) == 5
    assert lines[2].startswith("| local | GRPO | 0 | 0.210 | 0.880 | +0.670 |")
    assert lines[3].startswith("| openrlhf | GRPO | 0 |") and lines[4].startswith("| openrlhf | GRPO+ADORA | 0 |")


def test_variant_overrides_become_flags_and_finished_runs_are_reused_only_with_the_same_settings(tmp_path):
    assert cli_flags({"adora.enabled": True, "sampling.max_rounds": 4, "rollout.stop": ["a"]}) == [
        "--adora.enabled", "true", "--sampling.max_rounds", "4", "--rollout.stop", '["a"]',
    ]  # fmt: skip
    settings = {"backend": "openrlhf", "variant": "GRPO", "seed": 0}
    assert reuse(tmp_path, settings) is None
    (tmp_path / "record.json").write_text(json.dumps({"acc_final": 0.8, "settings": settings}))
    assert reuse(tmp_path, settings)["acc_final"] == 0.8
    assert reuse(tmp_path, {**settings, "seed": 1}) is None


def test_a_later_invocation_keeps_earlier_records_and_replaces_a_rerun(tmp_path, monkeypatch):
    import bench.cluster_testbed as bench

    results = tmp_path / "results"
    results.mkdir()
    earlier = [record("openrlhf", "GRPO", 0, 0.17, 0.825), record("openrlhf", "GRPO", 1, 0.2, 0.5)]
    (results / "results.json").write_text(json.dumps({"records": earlier}))
    monkeypatch.setattr(bench, "prepare", lambda seed, out: {"model": f"m{seed}", "train": "t", "test": "e"})
    monkeypatch.setattr(
        bench,
        "run_openrlhf",
        lambda variant, seed, inputs, out, rl_seed=None, **kw: record("openrlhf", variant, seed, 0.2, 0.9),
    )
    argv = [
        "--seeds",
        "1",
        "--variants",
        "GRPO",
        "--extra",
        "--backends",
        "openrlhf",
        "--out",
        str(tmp_path / "runs"),
        "--results",
        str(results),
    ]
    assert bench.main(argv) == 0
    kept = {(r["seed"], r["acc_final"]) for r in json.loads((results / "results.json").read_text())["records"]}
    assert kept == {(0, 0.825), (1, 0.9)}  # seed 0 kept, seed 1 replaced by the new run
    assert "| openrlhf | GRPO | 0 1 |" in (results / "table.md").read_text()


def test_replicates_are_parsed_named_and_refused_in_one_line():
    import argparse

    parser = argparse.ArgumentParser()
    assert parse_replicate("GRPO+ADORA:1:101", parser) == ("GRPO+ADORA", 1, 101)
    assert run_name("GRPO+ADORA", 1, 101) == "GRPO+ADORA_seed1_rl101" and run_name("GRPO", 1, None) == "GRPO_seed1"
    for bad in ("GRPO:1", "NOPE:1:2", "GRPO:1:x", "GRPO:1:1"):
        with pytest.raises(SystemExit):
            parse_replicate(bad, parser)


def test_replicates_are_tabled_apart_with_their_spread():
    main = [record("local", "GRPO+ADORA", 1, 0.17, 0.88), record("openrlhf", "GRPO+ADORA", 1, 0.17, 0.675)]
    reps = [{**record("local", "GRPO+ADORA", 1, 0.17, acc), "rl_seed": rl} for rl, acc in ((102, 0.70), (101, 0.82))]
    text = table(main + reps)
    first, second = text.split("Replicates")
    assert "| local | GRPO+ADORA | 1 | 0.170 | 0.880 | +0.710 |" in first  # the main table holds the main runs only
    # local runs in run-seed order 1 (main), 101, 102: finals 0.88 0.82 0.70, mean 0.8, sd sqrt(((0.08)^2+(0.02)^2+(0.1)^2)/2) = 0.0917
    assert "| local | GRPO+ADORA | 1 | 1 101 102 | 0.880 0.820 0.700 | 0.800 | 0.700-0.880 | 0.092 |" in second
    assert "| openrlhf | GRPO+ADORA | 1 | 1 | 0.675 | 0.675 | 0.675-0.675 | - |" in second
    assert "Replicates" not in table(main)
    assert table(reps).startswith("Replicates")  # no main runs: no empty main table


def test_replicate_runs_get_their_run_seed_and_do_not_replace_the_main_run(tmp_path, monkeypatch):
    import bench.cluster_testbed as bench

    results = tmp_path / "results"
    results.mkdir()
    (results / "results.json").write_text(json.dumps({"records": [record("local", "GRPO+ADORA", 1, 0.17, 0.88)]}))
    monkeypatch.setattr(bench, "prepare", lambda seed, out: {"model": f"m{seed}", "train": "t", "test": "e"})
    calls = []

    def fake_local(variant, seed, inputs, out, rl_seed=None):
        calls.append((variant, seed, rl_seed))
        return {**record("local", variant, seed, 0.17, 0.7), **({"rl_seed": rl_seed} if rl_seed is not None else {})}

    monkeypatch.setattr(bench, "run_local", fake_local)
    argv = ["--seeds", "1", "--variants", "GRPO", "--extra", "--backends", "local", "--replicates", "GRPO+ADORA:1:101"]
    assert bench.main([*argv, "--out", str(tmp_path / "runs"), "--results", str(results)]) == 0
    assert calls == [("GRPO", 1, None), ("GRPO+ADORA", 1, 101)]
    argv = ["--seeds", "--extra", "--backends", "local", "--replicates", "GRPO+ADORA:1:102"]  # replicates only
    assert bench.main([*argv, "--out", str(tmp_path / "runs"), "--results", str(results)]) == 0
    assert calls[2:] == [("GRPO+ADORA", 1, 102)]
    kept = {
        (r["variant"], r.get("rl_seed"), r["acc_final"])
        for r in json.loads((results / "results.json").read_text())["records"]
    }
    assert kept == {("GRPO+ADORA", None, 0.88), ("GRPO", None, 0.7), ("GRPO+ADORA", 101, 0.7), ("GRPO+ADORA", 102, 0.7)}


def test_kk_revisit_runs_the_allocation_regime_on_the_openrlhf_backend():
    """--regime kk-revisit: the openrlhf command takes kk-revisit's schedule and the allocation variant's settings,
    with enough passes over the 128 puzzles for 80 steps of 32 candidates (20), beside the recipe's own engine flags;
    its rows in the table are labelled with the regime."""
    from bench.cluster_testbed import revisit_flags

    flags = revisit_flags("Knapsack-0.5")
    values = dict(zip(flags[::2], flags[1::2], strict=True))
    assert values["--steps"] == "80" and values["--eval_every"] == "5" and values["--allocation.budget"] == "0.5"
    assert values["--allocation.method"] == "knapsack" and values["--allocation.candidates"] == "2"
    extra = json.loads(values["--extra"])["openrlhf"]
    assert extra["train.num_episodes"] == 20 and extra["vllm.num_engines"] == 1 and extra["ds.zero_stage"] == 2
    assert json.loads(revisit_flags("GRPO")[-1])["openrlhf"]["train.num_episodes"] == 10  # 80 x 16 / 128
    rows = table([{**record("openrlhf", "Knapsack-0.5", 0, 0.2, 0.8), "regime": "kk-revisit"}]).splitlines()
    assert "| openrlhf | Knapsack-0.5 (kk-revisit) |" in rows[2]


def test_modes_run_each_openrlhf_run_synchronously_and_asynchronously_side_by_side(tmp_path, monkeypatch):
    """``--modes sync async``: the same seed and variant in OpenRLHF's synchronous loop, then its asynchronous one;
    the asynchronous record is kept beside the synchronous one and tabled as its own row."""
    import bench.cluster_testbed as bench

    calls = []

    def fake_openrlhf(variant, seed, inputs, out, rl_seed=None, regime=None, mode="sync", is_correction="off"):
        calls.append(mode)
        made = record("openrlhf", variant, seed, 0.2, 0.9 if mode == "sync" else 0.85)
        made = {**made, "mode": mode} if mode == "async" else made
        return {**made, "is_correction": is_correction} if is_correction != "off" else made

    monkeypatch.setattr(bench, "prepare", lambda seed, out: {"model": f"m{seed}", "train": "t", "test": "e"})
    monkeypatch.setattr(bench, "run_openrlhf", fake_openrlhf)
    results = tmp_path / "results"
    argv = ["--seeds", "0", "--variants", "GRPO", "--extra", "--backends", "openrlhf", "--modes", "sync", "async",
            "--out", str(tmp_path / "runs"), "--results", str(results)]  # fmt: skip
    assert bench.main(argv) == 0 and calls == ["sync", "async"]
    saved = json.loads((results / "results.json").read_text())["records"]
    assert sorted((r.get("mode", "sync"), r["acc_final"]) for r in saved) == [("async", 0.85), ("sync", 0.9)]
    table = (results / "table.md").read_text()
    assert "| openrlhf | GRPO | 0 |" in table and "| openrlhf | GRPO (async) | 0 |" in table
    # the IS correction's asynchronous run is a record of its own, beside the uncorrected one
    assert bench.main([*argv[:-6], "async", "--is-correction", "token", *argv[-4:]]) == 0
    saved = json.loads((results / "results.json").read_text())["records"]
    assert sorted(r.get("is_correction", "off") for r in saved) == ["off", "off", "token"]
    assert "| openrlhf | GRPO (async, IS token) | 0 |" in (results / "table.md").read_text()


def test_step_profile_takes_medians_of_the_timings_and_the_largest_gradient_norm():
    from bench.cluster_testbed import step_profile

    steps = [
        {"timing/step_total": 10.0, "timing/generation": 4.0, "timing/ppo_train": 5.0, "actor_grad_norm": 0.2},
        {"timing/step_total": 30.0, "timing/generation": 6.0, "timing/ppo_train": 3.0, "actor_grad_norm": 1.5},
        {"timing/step_total": 12.0, "timing/generation": 5.0, "timing/ppo_train": 4.0, "actor_grad_norm": 0.3},
    ]
    assert step_profile(steps) == {"step_s_median": 12.0, "generation_s": 5.0, "update_s": 4.0, "grad_norm_max": 1.5}
    # a run whose metrics lack a timing: that cell is None, not a made-up 0
    assert step_profile([{"timing/step_total": 2.0}]) == {
        "step_s_median": 2.0,
        "generation_s": None,
        "update_s": None,
        "grad_norm_max": None,
    }


def test_mode_table_sets_each_seeds_runs_side_by_side_and_report_only_fills_old_records(tmp_path):
    """Synchronous first, then the IS-corrected and asynchronous runs of the same variant and seed; a record saved
    before the step profile was recorded gets it from its run folder's metrics on ``--report-only``."""
    import bench.cluster_testbed as bench

    def made(mode: str, correction: str, acc: float) -> dict:
        out = record("openrlhf", "GRPO", 0, 0.2, acc)
        out |= {"mode": "async", "staleness_mean": 0.9} if mode == "async" else {}
        return out | ({"is_correction": correction} if correction != "off" else {})

    runs = tmp_path / "runs"
    for mode, correction in (("sync", "off"), ("async", "off"), ("async", "token")):
        folder = bench.openrlhf_run_dir(runs, "GRPO", 0, mode=mode, is_correction=correction) / "run"
        folder.mkdir(parents=True)
        step = {"step": 1, "timing/step_total": 8.0 if mode == "sync" else 14.0, "timing/generation": 4.0}
        (folder / "metrics.jsonl").write_text(json.dumps({**step, "actor_grad_norm": 0.25}) + "\n")
    assert (
        bench.openrlhf_run_dir(runs, "GRPO", 0, mode="async", is_correction="token").name == "GRPO_seed0_async_is-token"
    )
    saved = [made("async", "token", 0.88), made("sync", "off", 0.9), made("async", "off", 0.6)]
    saved.append(record("local", "GRPO", 0, 0.2, 0.85))  # a local run has no mode row
    results = tmp_path / "results"
    results.mkdir()
    (results / "results.json").write_text(json.dumps({"records": saved}))
    assert bench.main(["--report-only", "--results", str(results), "--out", str(runs)]) == 0
    lines = (results / "table.md").read_text().split("Synchronous against asynchronous")[1].splitlines()
    rows = [line for line in lines if line.startswith("| GRPO |")]
    assert [row.split(" | ")[2] for row in rows] == ["synchronous", "asynchronous", "asynchronous, IS token"]
    assert rows[0] == "| GRPO | 0 | synchronous | 0.200, 0.900 | 8.0 | 4.0 | - | 100 | 0.00 | 0.25 |"
    assert rows[1].startswith("| GRPO | 0 | asynchronous | 0.200, 0.600 | 14.0 | 4.0 | - | 100 | 0.90 |")
    kept = json.loads((results / "results.json").read_text())["records"]
    assert [r.get("step_s_median") for r in kept] == [14.0, 8.0, 14.0, None]
    assert "Synchronous against asynchronous" not in bench.table([made("sync", "off", 0.9)])  # no async run: no table


def test_report_only_without_records_says_so(tmp_path):
    import bench.cluster_testbed as bench

    with pytest.raises(SystemExit, match="no records"):
        bench.main(["--report-only", "--results", str(tmp_path / "none"), "--out", str(tmp_path)])


def test_a_replicate_is_set_beside_the_runs_of_its_own_mode_only():
    """An asynchronous replicate joins the asynchronous main run of its seed, not the synchronous or the IS-corrected
    one (each mode and correction is a variant of its own)."""
    sync = record("openrlhf", "GRPO", 1, 0.17, 0.845)
    async_main = {**record("openrlhf", "GRPO", 1, 0.17, 0.0), "mode": "async"}
    corrected = {**async_main, "acc_final": 0.87, "is_correction": "token"}
    replicate = {**async_main, "acc_final": 0.8, "rl_seed": 101}
    second = table([sync, async_main, corrected, replicate]).split("Replicates")[1].split("Synchronous against")[0]
    assert "| openrlhf | GRPO (async) | 1 | 1 101 | 0.000 0.800 | 0.400 | 0.000-0.800 | 0.566 |" in second
    assert "| openrlhf | GRPO | 1 |" not in second and "IS token" not in second
