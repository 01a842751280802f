"""The run directory: nothing is touched before every check passes, --overwrite, the lock, resume edge cases."""

import json
import os
import sys
from pathlib import Path

import pytest

from adora_openrlhf.backends.local.trainer import train
from adora_openrlhf.config import ConfigError
from adora_openrlhf.rundir import checks as rundir
from adora_openrlhf.rundir.metrics import MetricsLogger, read_metrics

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from tiny_runs import snapshot, tiny_kk_config

FAST = {"steps": 1, "save_every": 0}  # with tiny_runs.TINY_KK


def _cfg(out, **extra):
    return tiny_kk_config(out, **{**FAST, **extra})


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "run"
    train(_cfg(out))
    return out


def test_bad_data_path_leaves_a_resumable_run_untouched(finished_run):
    before = snapshot(finished_run)
    for extra in ({"data.train_path": "data/trian.jsonl"}, {"data.eval_path": str(finished_run / "missing.jsonl")}):
        with pytest.raises(ConfigError, match="does not exist"):
            train(_cfg(finished_run, **extra), overwrite=True)
    assert snapshot(finished_run) == before


def test_new_run_refuses_a_directory_with_checkpoints(finished_run):
    before = snapshot(finished_run)
    with pytest.raises(
        ConfigError, match=f"output_dir: '{finished_run}' holds a run with checkpoints .up to step 1.; .*--overwrite"
    ):
        train(_cfg(finished_run, seed=3))
    assert snapshot(finished_run) == before


def test_overwrite_replaces_every_artefact_of_the_previous_run(tmp_path):
    out = tmp_path / "run"
    train(_cfg(out, steps=2, save_every=1))
    (out / "notes.txt").write_text("mine")
    (out / "heldout_images").mkdir()  # as a vision run of the previous run left its held-out images
    (out / "heldout_images" / "000000_0.png").write_bytes(b"old")
    train(_cfg(out, steps=1), overwrite=True)
    assert not (out / "heldout_images").exists() and (out / "heldout.jsonl").is_file()  # the held-out set is this run's
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000000", "step_000001"]
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [0, 1]
    assert (out / "notes.txt").read_text() == "mine"  # only the run's own artefacts are removed
    with pytest.raises(ConfigError, match="--overwrite: cannot be combined with --resume"):
        train(_cfg(out), resume=True, overwrite=True)


def test_second_training_into_a_locked_directory_is_refused(tmp_path):
    out = tmp_path / "run"
    # a first training holds the directory
    with (
        rundir.RunDirLock(out),
        pytest.raises(ConfigError, match=r"is in use by another process \(pid \d+, a training run\)"),
    ):
        train(_cfg(out))
    assert sorted(p.name for p in out.iterdir()) == [".lock"]  # the refused run wrote nothing
    train(_cfg(out))  # once released, the directory is usable again
    assert (out / "checkpoints" / "step_000001").exists()


def test_lock_is_exclusive_across_processes(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "run"
    code = (
        "import sys, time; from pathlib import Path; from adora_openrlhf.rundir.checks import RunDirLock\n"
        "with RunDirLock(Path(sys.argv[1])):\n    print('locked', flush=True); time.sleep(30)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(out)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ConfigError, match=f"pid {holder.pid}"):
            rundir.RunDirLock(out).__enter__()
    finally:
        holder.kill()
        holder.wait()
    with rundir.RunDirLock(out):  # the kernel released the killed holder's lock
        pass


def test_output_dir_that_is_a_file_or_under_a_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for out, pattern in ((blocker, "is a file, not a directory"), (blocker / "run", "is a file; choose another")):
        with pytest.raises(ConfigError, match=pattern):
            train(_cfg(out))
    assert blocker.read_text() == "x"


def test_resume_with_a_torn_metrics_line_a_respelled_and_a_moved_directory(tmp_path, monkeypatch):
    out = tmp_path / "run"
    train(_cfg(out, steps=1))
    with open(out / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write('{"step": 2, "reward/me')  # killed mid-write
    moved = tmp_path / "elsewhere"
    out.rename(moved)
    monkeypatch.chdir(tmp_path)
    summary = train(_cfg("elsewhere/", steps=2), resume=True)  # moved, relative, trailing slash
    assert summary["resumed_from_step"] == 1
    assert [r["step"] for r in read_metrics(moved / "metrics.jsonl")] == [0, 1, 2]


def test_resume_compares_data_files_by_content(tmp_path, monkeypatch):
    from adora_openrlhf.tasks.kk import generate_rows

    data = tmp_path / "a" / "train.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps(r) + "\n" for r in generate_rows(6, [2], seed=1)))
    out = tmp_path / "run"
    train(_cfg(out, **{"data.train_path": str(data)}))
    monkeypatch.chdir(tmp_path)
    assert (
        rundir.config_differences(
            json.loads((out / "config.json").read_text()), _cfg(out, **{"data.train_path": "a/train.jsonl"}).to_dict()
        )
        == []
    )
    copy = tmp_path / "b.jsonl"
    copy.write_bytes(data.read_bytes())
    train(_cfg(out, steps=2, **{"data.train_path": str(copy)}), resume=True)  # a moved copy of the same file
    data.write_text(data.read_text().replace("knight", "knave", 1))  # another file: different bytes
    with pytest.raises(
        ConfigError, match="the config differs from the config saved in checkpoint step_000002 in data.train_path"
    ):
        train(_cfg(out, steps=3, **{"data.train_path": str(data)}), resume=True)


def test_metrics_logger_drops_a_torn_last_line_on_resume(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "a": 1.0}\n{"step": 1, "a": 2.0}\n{"step": 2, "a"')
    logger = MetricsLogger(tmp_path, resume_step=1, report_to=["none"])
    logger.log(2, {"a": 3.0})
    assert read_metrics(tmp_path / "metrics.jsonl") == [
        {"step": 0, "a": 1.0},
        {"step": 1, "a": 2.0},
        {"step": 2, "a": 3.0},
    ]
