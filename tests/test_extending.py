"""Adding a task and an estimator is one file: a plugin module, named by ``--plugins``, that registers a task (its
reward for a new row ``source``, its row generator, row check, warm-up demonstration, response probe and benchmark
subsets) and an advantage estimator. The local backend
trains with both and ``eval.run --run`` evaluates the run; the openrlhf backend
passes the estimator to OpenRLHF as its stand-in and keeps the name, and OpenRLHF's reward worker (the reward
file, in a fresh process with the run's ``ADORA_PLUGINS``) scores the new source."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from adora_openrlhf.config import ConfigError, RunConfig
from adora_openrlhf.plugins import PLUGINS_ENV, plugins_from_env
from adora_openrlhf.recipes import build_run_config

PLUGIN = textwrap.dedent(
    '''
    """A toy task (is a number odd or even?: its reward, generator, row check, demonstration, probe and subsets) and
    a toy estimator, registered on import."""
    import random
    from dataclasses import dataclass

    from adora_openrlhf.algorithms.advantages import register_estimator
    from adora_openrlhf.config_checks import check_number
    from adora_openrlhf.rewards.base import RewardResult, register_reward
    from adora_openrlhf.tasks.behaviours import Probe
    from adora_openrlhf.tasks.registry import RowFieldError, Task, register_task

    ESTIMATOR_CALLS = []


    @register_estimator("toy_mean_baseline")
    def mean_baseline(rewards, mask, moments, eps):
        """A_i = r_i - mean (no division by the std)."""
        ESTIMATOR_CALLS.append(tuple(rewards.shape))
        return rewards - moments.mean


    @register_reward("toy_parity")
    def parity_reward(response, label, meta):
        """1 when the last word of the response is the label (odd or even)."""
        words = response.split()
        answer = words[-1].strip(".") if words else None
        return RewardResult(reward=float(answer == label), correct=answer == label, extracted=answer)


    @dataclass
    class ParityOptions:
        """the numbers it generates: below max_number."""

        max_number: int = 10_000

        def __post_init__(self):
            check_number(self.max_number, "data.parity.max_number", integer=True, ge=100)


    def parity_rows(data, seed):
        """data.num_train numbers below data.parity.max_number to train on and data.num_eval others held out."""
        numbers = random.Random(seed).sample(range(data.parity.max_number), data.num_train + data.num_eval)
        rows = [
            {"prompt": f"Is {n} odd or even?", "label": "odd" if n % 2 else "even", "source": "toy_parity",
             "meta": {"digits": len(str(n))}}
            for n in numbers
        ]
        return rows[: data.num_train], rows[data.num_train :]


    def parity_demonstration(row, rng):
        """The warm-up's answer: the label, said in words."""
        return f"It is {row.label}"


    def parity_probe(response):
        """worded: the answer comes in a sentence; bare: one word."""
        return "worded" if len(response.split()) > 1 else "bare"


    def parity_subsets(row):
        """Held-out accuracy by the number's count of digits."""
        return [f"digits={row['meta']['digits']}"] if "digits" in (row.get("meta") or {}) else []


    def parity_row_ok(prompt, label, meta):
        if label not in ("odd", "even"):
            raise RowFieldError("label", f"expected odd or even, got {label!r}")


    register_task(
        Task(
            "toy_parity",
            ("toy_parity",),
            generate=parity_rows,
            row_check=parity_row_ok,
            demonstrations={"toy_parity": {"direct": parity_demonstration}},
            probes={"toy_parity": Probe(parity_probe, ("worded", "bare"))},
            subsets={"toy_parity": parity_subsets},
            options=ParityOptions,
            options_key="parity",
        )
    )
    '''
)
MODULE = "toy_adora_plugin"  # one name for the whole test session: the registries are per process


@pytest.fixture
def plugin(tmp_path_factory, monkeypatch):
    folder = tmp_path_factory.getbasetemp() / "plugin"
    folder.mkdir(exist_ok=True)
    (folder / f"{MODULE}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(folder))
    return folder


def _toy_rows(path: Path, numbers: range) -> str:
    rows = [
        {
            "prompt": [{"role": "user", "content": f"Is {n} odd or even?"}],
            "label": "odd" if n % 2 else "even",
            "source": "toy_parity",
        }
        for n in numbers
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _tiny_run(tmp_path: Path, **changes: Any) -> RunConfig:
    """Two RL steps of the tiny model with the plugin, no warm-up, into tmp_path/run."""
    base = {
        "plugins": [MODULE],
        "warmup.steps": 0,
        "warmup.mix_steps": 0,
        "steps": 2,
        "prompts_per_step": 4,
        "eval_every": 0,
        "eval_samples": 0,
        "rollout.max_new_tokens": 8,
        "output_dir": str(tmp_path / "run"),
        "report_to": ["none"],
    }
    return build_run_config("kk-tiny", {**base, **changes})


def _tiny_parity(tmp_path: Path, **changes: Any) -> RunConfig:
    """:func:`_tiny_run` on the plugin's task: 24 generated numbers to train on, 6 held out."""
    return _tiny_run(tmp_path, **{"data.task": "toy_parity", "data.num_train": 24, "data.num_eval": 6, **changes})


def test_a_plugin_adds_a_task_and_an_estimator_to_the_local_backend(plugin, tmp_path):
    from adora_openrlhf.backends.local.trainer import train

    cfg = _tiny_run(
        tmp_path,
        **{
            "advantage.estimator": "toy_mean_baseline",
            "data.train_path": _toy_rows(tmp_path / "train.jsonl", range(40)),
            "data.eval_path": _toy_rows(tmp_path / "test.jsonl", range(100, 108)),
        },
    )
    summary = train(cfg)
    calls = importlib.import_module(MODULE).ESTIMATOR_CALLS
    assert calls and all(shape[0] == 4 for shape in calls)  # the toy estimator computed every step's advantages
    assert "eval/greedy_accuracy" in summary["eval_final"]  # the toy reward graded the held-out rows
    assert json.loads((tmp_path / "run" / "config.json").read_text())["plugins"] == [MODULE]


def test_a_plugin_task_generates_its_rows_is_trained_and_is_evaluated_from_the_run(plugin, tmp_path, capsys):
    from adora_openrlhf.evaluation.run import main as eval_main
    from adora_openrlhf.tasks.registry import TASKS
    from adora_openrlhf.train import train_local

    # a warm-up on the plugin's demonstrations (its rows have no meta.solution_text to fall back on), then RL; held-out numbers of 3 and 4 digits (two subsets)
    cfg = _tiny_parity(tmp_path, **{"warmup.steps": 2, "warmup.batch_size": 4, "data.num_eval": 60})
    assert "toy_parity" in TASKS.names()  # building the config imported the plugin
    summary = train_local(cfg)
    out = tmp_path / "run"
    held = [json.loads(line) for line in (out / "heldout.jsonl").read_text().splitlines()]
    assert len(held) == 60 and {r["source"] for r in held} == {"toy_parity"}  # the plugin's generator made them
    assert all(r["prompt"].endswith("odd or even?") for r in held)
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in steps if "response/worded_fraction" in r]  # the plugin's probe on every RL step
    assert len(trained) == 2 and all(r["response/worded_fraction"] + r["response/bare_fraction"] <= 1 for r in trained)
    final = summary["eval_final"]
    digits = {len(str(row["prompt"].split()[1])) for row in held}
    assert {f"eval/greedy_accuracy/digits_{d}" for d in digits} <= set(final) and len(digits) > 1  # its subsets
    assert eval_main(["--run", str(out), "--temperature", "0", "--k", "1", "--engine", "hf"]) != 0  # no --plugins
    assert f"pass --plugins {MODULE} if you trust" in capsys.readouterr().err  # the run's list never imports itself
    assert eval_main(["--run", str(out), "--temperature", "0", "--k", "1", "--engine", "hf", "--plugins", MODULE]) == 0
    (eval_dir,) = (out / "eval").glob("final_model-*")
    (line,) = json.loads((eval_dir / "report.json").read_text())["comparison"]
    assert f"eval/greedy_accuracy at step 2: {summary['eval_final']['eval/greedy_accuracy']:.3f}" in line
    assert "equal, as it must be" in line


def test_a_plugin_tasks_options_are_flags_config_file_keys_and_saved_with_the_run(plugin, tmp_path, capsys):
    """The task's own section, ``data.parity``: a flag once ``--plugins`` names the module, a key of a ``--config``
    file that names it, checked by its own ``__post_init__``, saved in the run's config and read back from it, and
    read by the task's generator."""
    from adora_openrlhf import config
    from adora_openrlhf.rows import load_run_rows
    from adora_openrlhf.train import main as train_main

    flags = ["--plugins", MODULE, "--data.task", "toy_parity", "--print-config"]
    assert train_main([*flags, "--data.parity.max_number", "500"]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["parity"] == {"max_number": 500}
    config_file = tmp_path / "run.yaml"
    config_file.write_text(f"plugins: [{MODULE}]\ndata:\n  task: toy_parity\n  parity:\n    max_number: 700\n")
    assert train_main(["--config", str(config_file), "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["parity"] == {"max_number": 700}
    with pytest.raises(SystemExit) as refused:
        train_main([*flags, "--data.parity.max_number", "5"])
    assert refused.value.code == 2
    assert "error: data.parity.max_number: must be an integer >= 100, got 5" in capsys.readouterr().err
    sections = {f.name: f.metadata["help"] for f in dataclasses.fields(config.DataConfig)}
    assert sections["parity"].startswith("task toy_parity: the numbers it generates") and "kk" in sections
    cfg = _tiny_parity(tmp_path, **{"data.parity.max_number": 300})
    saved = RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert saved == cfg and saved.data.parity.max_number == 300
    train, held = load_run_rows(saved.data, seed=0)
    assert all(int(row.prompt.split()[1]) < 300 for row in train + held)


def test_a_plugin_tasks_row_check_refuses_a_row_naming_the_file_and_line(plugin, tmp_path):
    bad = tmp_path / "train.jsonl"
    bad.write_text(
        json.dumps({"prompt": "Is 3 odd or even?", "label": "odd"})
        + "\n"
        + json.dumps({"prompt": "Is 4?", "label": "four"})
        + "\n"
    )
    from adora_openrlhf.train import train_local

    with pytest.raises(ConfigError, match=rf"^{bad}:2: field 'label': expected odd or even, got 'four'"):
        train_local(_tiny_parity(tmp_path, **{"data.train_path": str(bad)}))


def test_an_unknown_plugin_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"^plugins\[0\]: cannot import 'no_such_adora_plugin'"):
        RunConfig.from_dict({"plugins": ["no_such_adora_plugin"]})
    with pytest.raises(ConfigError, match=r"^plugins: must be a list of module names"):
        RunConfig.from_dict({"plugins": "one_module"})
    with pytest.raises(ConfigError, match=r"^advantage.estimator: unknown advantage estimator 'toy_never_registered'"):
        RunConfig.from_dict({"advantage": {"estimator": "toy_never_registered"}})


def test_the_train_commands_plugins_are_one_line_and_their_traceback_is_behind_debug(capsys):
    """``--plugins`` is imported before the flags are read (a plug-in task's options are flags): its error is one
    line, exit 2, like any other option's, and ``--debug`` shows the traceback instead."""
    from adora_openrlhf.train import main

    assert main(["--plugins", "no_such_adora_plugin"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: plugins[0]: cannot import 'no_such_adora_plugin'") and len(err.splitlines()) == 1
    with pytest.raises(ConfigError, match=r"^plugins\[0\]: cannot import"):
        main(["--plugins", "no_such_adora_plugin", "--debug"])


def test_the_openrlhf_backend_keeps_the_estimator_and_hands_the_plugins_to_every_worker(plugin):
    pytest.importorskip("openrlhf")
    from adora_openrlhf.backends.openrlhf import launcher

    cfg = build_run_config("dapo-math-adora", {"plugins": [MODULE], "advantage.estimator": "toy_mean_baseline"})
    _, args, final = launcher.prepare(cfg, [])
    assert (args.algo.advantage.estimator, final.advantage.estimator, final.plugins) == (
        "group_norm",
        "toy_mean_baseline",
        [MODULE],
    )
    env = launcher.ray_env_vars(final)
    assert plugins_from_env(env) == [MODULE]


def test_the_reward_worker_imports_the_plugins_and_scores_the_new_source(plugin):
    """OpenRLHF's reward worker loads the reward file in a process of its own: there the run's ADORA_PLUGINS are
    imported before the first lookup."""
    script = textwrap.dedent(
        """
        import json
        from adora_openrlhf.rewards.openrlhf_reward import encode_reward_label, reward_func
        label = encode_reward_label("toy_parity", "odd")
        out = reward_func(["Is 7 odd or even? It is odd", "Is 7 odd or even? It is even"], ["Is 7 odd or even?"] * 2, [label, label])
        print(json.dumps(out["scores"].tolist()))
        """
    )
    repo = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        PLUGINS_ENV: MODULE,
        "PYTHONPATH": os.pathsep.join([str(plugin), str(repo), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, cwd=plugin
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [1.0, 0.0]


def test_a_plugin_tasks_generator_or_check_that_fails_is_named(plugin, tmp_path):
    """A task generator that raises or returns the wrong shape, and a row check that raises something else than its
    refusal of a row, are each one ConfigError naming the task and the function (the check's with the row's place)."""
    from adora_openrlhf.rewards.base import RewardResult, register_reward
    from adora_openrlhf.tasks.registry import Task, register_task
    from adora_openrlhf.train import train_local

    @register_reward("toy_broken")
    def broken_reward(response, label, meta):
        return RewardResult(reward=0.0, correct=False)

    def raising_generator(data, seed):
        raise IndexError("list index out of range")

    def flat_generator(data, seed):
        return [{"prompt": "p", "label": "x", "source": "toy_broken"}]

    def crashing_check(prompt, label, meta):
        return meta["missing"]

    register_task(
        Task("toy_raising_gen", sources=("toy_broken",), generate=raising_generator, row_check=crashing_check)
    )
    register_task(Task("toy_flat_gen", sources=("toy_broken_2",), generate=flat_generator))
    with pytest.raises(
        ConfigError,
        match=r"^data.task: the generator of task 'toy_raising_gen' \(.*raising_generator\) raised IndexError",
    ):
        train_local(_tiny_run(tmp_path, **{"data.task": "toy_raising_gen"}))
    with pytest.raises(
        ConfigError, match=r"^data.task: the generator of task 'toy_flat_gen' \(.*flat_generator\) returned list"
    ):
        train_local(_tiny_run(tmp_path, **{"data.task": "toy_flat_gen"}))
    rows = tmp_path / "train.jsonl"
    rows.write_text(json.dumps({"prompt": "p", "label": "x", "source": "toy_broken"}) + "\n")
    with pytest.raises(
        ConfigError, match=rf"^{rows}:1: the row check of task 'toy_raising_gen' \(.*crashing_check\) raised KeyError"
    ):
        train_local(_tiny_run(tmp_path, **{"data.task": "toy_raising_gen", "data.train_path": str(rows)}))
    assert not (tmp_path / "run").exists()
