"""``python -m adora_openrlhf.testbed_files``: the kk-testbed warm start and puzzles as files (the inputs of the
``kk-testbed-openrlhf`` recipe). The warm-up itself is replaced by a stand-in that saves a marker file: its own
tests are the local backend's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import adora_openrlhf.train as train
from adora_openrlhf import testbed_files


@pytest.fixture
def warm_ups(monkeypatch):
    """Record each warm-up the command runs; each "saves" a config.json in its target folder."""
    made: list[tuple[str, int, Path]] = []

    def fake_warm_start(cfg, target):
        made.append((cfg.recipe, cfg.seed, Path(target)))
        Path(target).mkdir(parents=True, exist_ok=True)
        (Path(target) / "config.json").write_text("{}")
        return Path(target)

    monkeypatch.setattr(train, "warm_start", fake_warm_start)
    return made


def test_warm_start_dir_builds_once_and_rebuilds_only_for_other_settings(tmp_path, warm_ups):
    first = testbed_files.warm_start_dir("kk-tiny", 3, {}, tmp_path)
    assert first == str(tmp_path / "warm_start_seed3")
    assert json.loads((tmp_path / "warm_start_seed3" / "warm_start.json").read_text()) == {
        "recipe": "kk-tiny",
        "seed": 3,
        "overrides": {},
    }
    testbed_files.warm_start_dir("kk-tiny", 3, {}, tmp_path)
    assert len(warm_ups) == 1  # reused
    testbed_files.warm_start_dir("kk-tiny", 3, {"warmup.steps": 5}, tmp_path)
    assert len(warm_ups) == 2  # other settings: rebuilt, never silently reused


def test_command_writes_the_recipes_puzzles_as_jsonl_and_prints_the_paths(tmp_path, warm_ups, capsys):
    assert testbed_files.main(["--seeds", "1", "--out", str(tmp_path)]) == 0
    paths = json.loads(capsys.readouterr().out)["1"]
    assert paths["model"] == str(tmp_path / "warm_start_seed1")
    assert warm_ups == [("kk-testbed", 1, tmp_path / "warm_start_seed1")]
    train_rows, held_rows = (
        [json.loads(line) for line in Path(paths[k]).read_text().splitlines()] for k in ("train", "test")
    )
    want_train, want_held = testbed_files.testbed_rows(1200, 200, seed=1)  # the recipe's sizes
    assert [r["prompt"] for r in train_rows] == [r.prompt for r in want_train]
    assert [r["prompt"] for r in held_rows] == [r.prompt for r in want_held]
    assert not {str(r["prompt"]) for r in train_rows} & {str(r["prompt"]) for r in held_rows}
    assert all(r["reward_label"] for r in train_rows)  # the column OpenRLHF's reward hook reads
    assert testbed_files.main(["--seeds", "1", "--out", str(tmp_path)]) == 0
    assert len(warm_ups) == 1  # a second call keeps what is there


def test_command_refuses_a_negative_seed_in_one_line(tmp_path, capsys):
    assert testbed_files.main(["--seeds", "-1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--seeds: must be >= 0" in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())
