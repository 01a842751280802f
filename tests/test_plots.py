"""bench/plots.py on a tiny synthetic record: the plots are drawn, costs to the target and not-reached runs counted."""

from __future__ import annotations

import json
import math
import re

import pytest

from bench import plots

pytest.importorskip("matplotlib")


def _record(variant: str, seed: int, accs: list[float], tokens_per_eval: float) -> dict:
    return {
        "variant": variant,
        "seed": seed,
        "warm_start": "abc",
        "curve": [[k * tokens_per_eval, a] for k, a in enumerate(accs)],
    }


def test_tiny_record_draws_both_plots(tmp_path):
    records = [
        _record("GRPO", 0, [0.2, 0.85, 0.9], 100.0),
        _record("GRPO", 1, [0.2, 0.7, 0.82], 100.0),
        _record("Knapsack-0.5", 0, [0.2, 0.81, 0.86], 50.0),
        _record("Knapsack-0.5", 1, [0.2, 0.5, 0.6], 50.0),  # never reaches 0.80
        _record("Skip", 0, [0.2, 0.3, 0.4], 100.0),  # no run reaches it
    ]
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "results.json").write_text(json.dumps({"records": records}))
    plots.READERS["tiny"] = plots.READERS["allocation"]
    bench = plots.Benchmark("tiny", "tiny", 0.80, (("GRPO", "Knapsack-0.5", "Skip"),))
    try:
        written = plots.draw(bench, tmp_path)
    finally:
        del plots.READERS["tiny"]
    assert [p.name for p in written] == ["accuracy.png", "target.png"]
    assert all(p.stat().st_size > 1000 for p in written)

    runs = plots.allocation_runs({"records": records})
    bars = {b.method: b for b in plots.target_bars(runs, ["GRPO", "Knapsack-0.5", "Skip"], 0.80)}
    assert (bars["GRPO"].reached, bars["GRPO"].seeds) == (2, 2)
    assert bars["GRPO"].mean == pytest.approx(math.sqrt(100.0 * 200.0))  # geometric mean of 100 and 200 tokens
    assert (bars["Knapsack-0.5"].reached, bars["Knapsack-0.5"].mean) == (1, pytest.approx(50.0))
    assert bars["Skip"].mean is None and bars["Skip"].seeds == 1


def test_mean_curve_and_cost_to_target():
    assert plots.mean_curve([[(0, 0.2), (10, 0.8)], [(0, 0.4)]]) == [(0, pytest.approx(0.3)), (10, 0.8)]
    assert plots.cost_to_target([(0, 0.2), (10, 0.8)], 0.80) == 10
    assert plots.cost_to_target([(0, 0.2), (10, 0.79)], 0.80) is None


def test_claims_table_matches_docs():
    """docs/results.md opens with the claims table that ``python -m bench.plots --claims`` prints from the records."""
    text = (plots.RESULTS.parent.parent / "docs" / "results.md").read_text()
    assert plots.claims_markdown() in text
    for bench in plots.BENCHMARKS:  # and every benchmark's table, plots beside the records
        assert plots.summary_markdown(bench, plots.load_runs(bench)) in text, bench.name
        assert f"../bench/results/{bench.name}/accuracy.png" in text, bench.name


def test_each_benchmark_section_has_one_plot_and_at_most_five_lines_of_reading():
    """docs/results.md is a summary: per benchmark its table, one plot and a short reading; provenance, pilots and
    the other plots stay beside the records (bench/results/NAME/)."""
    text = (plots.RESULTS.parent.parent / "docs" / "results.md").read_text()
    sections = [s for s in re.split(r"^## ", text, flags=re.M)[1:] if "![" in s]
    frozen = [folder for _, folder, _, how in plots.CLAIMS if how == "frozen"]  # removed benchmarks' sections stay
    assert len(sections) == len(plots.BENCHMARKS) + len(frozen)
    for section in sections:
        images = [line for line in section.splitlines() if line.startswith("![")]
        reading = section.split(images[-1], 1)[1].strip().splitlines()
        assert len(images) == 1 and len(reading) <= 5, section.splitlines()[0]


def test_records_that_store_their_curve_by_method_are_read():
    """ppo_kk_testbed's records name their method and store [cumulative tokens, accuracy] per evaluation."""
    data = {"records": [{"method": "PPO", "seed": 2, "curve": [[0, 0.2], [150.0, 0.8]]}]}
    (run,) = plots._curve_runs(data)
    assert (run.method, run.seed, run.curve) == ("PPO", "2", [(0.0, 0.2), (150.0, 0.8)])
    bench = next(b for b in plots.BENCHMARKS if b.name == "ppo_kk_testbed")
    assert {r.method for r in plots.load_runs(bench)} == {"GRPO", "PPO", "PPO+ADORA"}
