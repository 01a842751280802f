"""Experiment trackers of the local backend (``report_to``): TensorBoard events with the config as hparams,
wandb offline runs, and the parse-time checks of the option."""

import importlib.util
import json

import pytest

from adora_openrlhf.cli_args import LEAF_TYPES, parse_value
from adora_openrlhf.config import ConfigError, RunConfig
from adora_openrlhf.rundir.metrics import MetricsLogger, flat_hparams, read_metrics
from adora_openrlhf.train import main


def _tb_events(folder):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    values = []
    for path in sorted(folder.glob("events.*")):
        for event in EventFileLoader(str(path)).Load():
            values += [(event.step, v) for v in event.summary.value]
    return values


def test_flat_hparams_hand_case():
    config = {
        "seed": 3,
        "model": {"path": None, "tiny": {"hidden_size": 32}},
        "data": {"kk": {"num_people": [2, 3]}},
        "extra": {},
    }
    assert flat_hparams(config) == {
        "seed": 3,
        "model.path": "null",
        "model.tiny.hidden_size": 32,
        "data.kk.num_people": "[2, 3]",
        "extra": "{}",
    }


def test_tensorboard_events_hold_the_config_as_hparams_and_text(tmp_path):
    from tensorboard.plugins.hparams import plugin_data_pb2

    cfg = RunConfig(output_dir=str(tmp_path), seed=7).to_dict()
    logger = MetricsLogger(tmp_path, report_to=["tensorboard"], config=cfg)
    logger.log(1, {"reward/mean": 0.5, "train/entropy": float("nan"), "note": "text"})
    logger.close()
    values = _tb_events(tmp_path / "tb")
    start = [v for _, v in values if v.tag == "_hparams_/session_start_info"]
    assert len(start) == 1
    hparams = plugin_data_pb2.HParamsPluginData.FromString(
        start[0].metadata.plugin_data.content
    ).session_start_info.hparams
    assert hparams["seed"].number_value == 7 and hparams["train.lr"].number_value == pytest.approx(1e-5)
    assert hparams["data.kk.num_people"].string_value == "[2, 3]" and hparams["model.path"].string_value == "null"
    assert hparams["report_to"].string_value == '["tensorboard"]'
    text = [v for _, v in values if v.tag.startswith("config")]
    assert text and '"lr": 1e-05' in text[0].tensor.string_val[0].decode()
    scalars = {(step, v.tag): v for step, v in values if v.tag in ("reward/mean", "train/entropy")}
    assert list(scalars) == [(1, "reward/mean")]  # non-finite values stay in the JSONL only
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["note"] == "text"


def test_report_none_writes_jsonl_only(tmp_path):
    logger = MetricsLogger(tmp_path, report_to=["none"], config={"seed": 0})
    logger.log(1, {"reward/mean": 1.0})
    logger.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


@pytest.mark.parametrize(
    "value, parsed",
    [("tensorboard", ["tensorboard"]), ("tensorboard, wandb", ["tensorboard", "wandb"]), ("none", ["none"]), ([], [])],
)
def test_report_to_accepts_lists_and_comma_lists(value, parsed, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "wandb" else real(name, *a))
    assert RunConfig(report_to=value).report_to == parsed


def test_report_to_flag_takes_a_comma_list():
    assert parse_value("report_to", LEAF_TYPES["report_to"], "tensorboard,wandb") == ["tensorboard", "wandb"]
    assert parse_value("report_to", LEAF_TYPES["report_to"], '["none"]') == ["none"]


@pytest.mark.parametrize(
    "value, needle",
    [
        ("tb", "report_to: unknown tracker(s) ['tb']; choose from ['tensorboard', 'wandb', 'none']"),
        ("none,tensorboard", "report_to: 'none' cannot be combined"),
        (3, "report_to: must be a list or comma list"),
    ],
)
def test_report_to_bad_values_name_the_field(value, needle):
    with pytest.raises(ConfigError) as err:
        RunConfig(report_to=value)
    assert str(err.value).startswith(needle)


def test_missing_wandb_is_one_error_at_parse_time(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(
        ConfigError, match=r"report_to: 'wandb' needs the wandb package.*pip install 'adora_openrlhf\[wandb\]'"
    ):
        RunConfig(report_to="tensorboard,wandb")
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        main(["--report_to", "wandb", "--output-dir", str(out), "--steps", "1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and err[0].startswith("error: report_to: 'wandb' needs the wandb package")
        and "pip install" in err[0]
    )
    assert not out.exists()  # refused before anything was built or written


def test_wandb_offline_writes_a_run_with_the_config(tmp_path, monkeypatch):
    """Runs where wandb is installed (``pip install 'adora_openrlhf[wandb]'``); WANDB_MODE=offline needs no network."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = RunConfig(output_dir=str(tmp_path), report_to=["wandb"]).to_dict()
    logger = MetricsLogger(tmp_path, report_to=["wandb"], config=cfg)
    run_config = logger.trackers[0].run.config  # the resolved config, as the run's config
    assert run_config["train"]["lr"] == pytest.approx(1e-5) and run_config["report_to"] == ["wandb"]
    logger.log(1, {"reward/mean": 0.25})
    logger.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    run_id = (tmp_path / "wandb" / "run_id").read_text().strip()
    assert len(runs) == 1 and runs[0].name.endswith(run_id) and list(runs[0].glob("*.wandb"))
    # a resumed training: the same run
    resumed = MetricsLogger(tmp_path, resume_step=1, report_to=["wandb"], config=cfg)
    resumed.log(2, {"reward/mean": 0.5})
    resumed.close()
    assert (tmp_path / "wandb" / "run_id").read_text().strip() == run_id
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["reward/mean"] == 0.5
