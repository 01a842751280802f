"""A run directory someone sends you never runs code: ``eval.run --run`` imports only the user's ``--plugins``,
compares them with the run's list, and never searches the run's folder for them (``adora_openrlhf/plugins.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from adora_openrlhf.errors import ConfigError
from adora_openrlhf.evaluation.runs import open_run
from adora_openrlhf.plugins import import_plugins

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {  # heldout.json as the trainer writes it (rundir/heldout.py), but for the plug-ins
    "prompt_template": "auto",
    "rollout": {"max_new_tokens": 8, "repetition_penalty": 1.0},
    "generation_batch_size": 4,
    "numerics": "exact",
    "rows_sha256": "0" * 64,
}


def received_run(folder: Path, module: str) -> Path:
    """A run directory whose heldout.json names ``module`` as a plug-in and that ships ``module.py``, which, if
    ever imported, writes ``ran.txt`` beside itself."""
    folder.mkdir(parents=True)
    (folder / "heldout.json").write_text(json.dumps({**SETTINGS, "plugins": [module]}))
    (folder / "heldout.jsonl").write_text(json.dumps({"prompt": "p", "label": "1", "source": "math"}) + "\n")
    (folder / f"{module}.py").write_text(
        "from pathlib import Path\n(Path(__file__).parent / 'ran.txt').write_text('ran')\n"
    )
    return folder


def test_eval_run_from_inside_a_received_run_refuses_and_imports_nothing(tmp_path):
    run = received_run(tmp_path / "received", "adora_evil_plugin_a")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "eval.run", "--run", ".", "--temperature", "0", "--k", "1"],
        cwd=run, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0 and not (run / "ran.txt").exists()
    message = result.stderr.strip().splitlines()[-1]
    assert "trained with plug-ins ['adora_evil_plugin_a'], but --plugins names []" in message
    assert "--plugins adora_evil_plugin_a" in message  # the fix, for a user who trusts the module


def test_naming_the_plugin_does_not_make_the_run_folder_searched(tmp_path, monkeypatch):
    run = received_run(tmp_path / "received", "adora_evil_plugin_b")
    monkeypatch.chdir(run)
    monkeypatch.syspath_prepend("")  # `python -m` from inside the folder: the current directory on sys.path
    monkeypatch.syspath_prepend(str(run))
    with pytest.raises(ValueError, match=r"^--plugins\[0\]: cannot import 'adora_evil_plugin_b'"):
        open_run(".", ["adora_evil_plugin_b"])
    assert not (run / "ran.txt").exists() and "adora_evil_plugin_b" not in sys.modules
    assert "" in sys.path and str(run) in sys.path  # sys.path is given back as it was


def test_a_plugin_imported_earlier_from_the_run_folder_is_refused(tmp_path, monkeypatch):
    run = received_run(tmp_path / "received", "adora_evil_plugin_c")
    monkeypatch.syspath_prepend(str(run))
    try:
        import_plugins(["adora_evil_plugin_c"])  # e.g. by the user's own earlier code, with the folder on sys.path
        with pytest.raises(
            ConfigError,
            match=r"^--plugins\[0\]: module 'adora_evil_plugin_c' comes from .*a folder whose files are never run",
        ):
            import_plugins(["adora_evil_plugin_c"], field="--plugins", untrusted=[run])
    finally:
        sys.modules.pop("adora_evil_plugin_c", None)


def test_the_users_plugins_are_compared_with_the_runs(tmp_path, monkeypatch, caplog):
    plugins = tmp_path / "mine"
    plugins.mkdir()
    (plugins / "adora_good_plugin.py").write_text("LOADED = True\n")
    (plugins / "adora_other_plugin.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(plugins))
    run = received_run(tmp_path / "run", "adora_good_plugin")
    (run / "adora_good_plugin.py").unlink()
    target = open_run(run, ["adora_good_plugin", "adora_other_plugin"])
    assert target.run_dir == run and sys.modules["adora_good_plugin"].LOADED
    assert "['adora_other_plugin']: not among the run's plug-ins ['adora_good_plugin']" in caplog.text
    (run / "heldout.json").write_text(json.dumps({**SETTINGS, "plugins": "adora_good_plugin"}))
    with pytest.raises(ValueError, match=r"field plugins must be a list of module names, got 'adora_good_plugin'"):
        open_run(run, ["adora_good_plugin"])


def test_a_plugin_that_calls_sys_exit_at_import_is_named(tmp_path, monkeypatch):
    (tmp_path / "adora_exiting_plugin.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"^plugins\[0\]: plugin module 'adora_exiting_plugin' called sys.exit\(3\)"):
        import_plugins(["adora_exiting_plugin"])
