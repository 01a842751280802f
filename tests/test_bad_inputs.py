"""Every entry point with bad inputs of each class: bad values, bad data files, bad output locations, a
previous run in the way, full disks, Ctrl-C. Each must exit non-zero with one line on stderr that names the
field (or file:line), print no traceback, and write or delete nothing.

Entry points are called in-process through their ``main(argv)`` (what ``python -m`` runs); a few subprocess
checks confirm exit codes and the absence of tracebacks for real process starts."""

import errno
import json
import logging
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from adora_openrlhf import demo
from adora_openrlhf import train as train_cli
from adora_openrlhf.data_prep import dapo_math, geometry3k, kk, math_eval
from adora_openrlhf.evaluation import run as eval_run

ROOT = Path(__file__).resolve().parents[1]
FAST = [
    "--recipe",
    "kk-tiny",
    "--warmup.steps",
    "0",
    "--steps",
    "1",
    "--prompts_per_step",
    "1",
    "--sampling.n_keep",
    "2",
    "--data.num_train",
    "8",
    "--data.num_eval",
    "2",
    "--data.kk.num_people",
    "[2]",
    "--rollout.max_new_tokens",
    "4",
    "--eval_samples",
    "0",
    "--model.tiny.hidden_size",
    "16",
    "--model.tiny.intermediate_size",
    "32",
    "--model.tiny.num_hidden_layers",
    "1",
    "--model.tiny.num_attention_heads",
    "2",
    "--model.tiny.num_key_value_heads",
    "1",
    "--model.tiny.vocab_size",
    "300",
]
KK_LABEL = "(1) Alice is a knight\n(2) Bob is a knave"


def call(main, argv):
    """(exit status, captured by the caller) of ``main(argv)`` as ``python -m`` would exit."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return exit_.code


def snapshot(root: Path):
    return {str(p.relative_to(root)): (p.is_dir(), p.stat().st_size if p.is_file() else 0) for p in root.rglob("*")}


def assert_one_line(err: str, *needles: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def write_rows(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def kk_row(i: int = 0):
    return {
        "prompt": f"Puzzle {i}: Alice and Bob.",
        "label": KK_LABEL,
        "source": "kk",
        "meta": {"names": ["Alice", "Bob"], "id": str(i)},
    }


@pytest.fixture
def bad_files(tmp_path):
    """One data file per class of damage; value: (path, the text the error must contain)."""
    d = tmp_path / "data"
    d.mkdir()
    files = {
        "missing": (d / "nope.jsonl", "nope.jsonl: "),
        "directory": (d / "adir.jsonl", "adir.jsonl: is a directory"),
        "empty": (d / "empty.jsonl", "empty.jsonl: "),
        "bad_json": (
            write_rows(d / "badjson.jsonl", [kk_row(0), '{"prompt": "x", "label"']),
            "badjson.jsonl:2: not valid JSON",
        ),
        "not_utf8": (d / "latin1.jsonl", "latin1.jsonl:2: not UTF-8"),
        "not_object": (write_rows(d / "list.jsonl", [kk_row(0), "[1, 2]"]), "list.jsonl:2: expected a JSON object"),
        "blank_only": (d / "blank.jsonl", "blank.jsonl: "),
    }
    (d / "adir.jsonl").mkdir()
    (d / "empty.jsonl").write_text("")
    (d / "blank.jsonl").write_text("\n\n")
    (d / "latin1.jsonl").write_bytes((json.dumps(kk_row(0)) + "\n").encode() + b'{"prompt": "caf\xe9", "label": "1"}\n')
    return files


# ---------------------------------------------------------------------------------------------------------
# train
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--train.max_grad_norm", "-1"], "train.max_grad_norm: must be a finite number > 0, got -1.0"),
        (["--train.max_grad_norm", "0"], "train.max_grad_norm"),
        (["--rollout.temperature", "nan"], "rollout.temperature"),
        (["--train.lr", "inf"], "train.lr"),
        (["--sampling.escalation", '[{"temperature": 1.2}, {"top_p": 1.5}]'], "sampling.escalation[1].top_p"),
        (["--sampling.escalation", '[{"top_k": "x"}]'], "sampling.escalation[0].top_k"),
        (["--data.kk.num_people", "[2, 9]"], "data.kk.num_people[1]"),
        (["--model.tiny.num_attention_heads", "0"], "model.tiny.num_attention_heads"),
        (["--seed", "-1"], "seed:"),
        (["--steps", "1.5"], "--steps: cannot parse"),
        (["--save_every", "-2"], "save_every"),
        (["--train.clip_eps_low", "1.5"], "train.clip_eps_low"),
        (["--sampling.max_responses_per_prompt", "0"], "sampling.max_responses_per_prompt"),
        (["--recipe", "nope"], "unknown recipe"),
        (["--frobnicate", "1"], "unknown flag"),
        (["--resume", "--overwrite"], "--overwrite: cannot be combined with --resume"),
    ],
)
def test_train_bad_values(tmp_path, capsys, argv, needle):
    code = call(train_cli.main, ["--output-dir", str(tmp_path / "run")] + argv)
    assert code == 2
    assert_one_line(capsys.readouterr().err, needle)
    assert not (tmp_path / "run").exists()


# ---- every config field's type, wherever the value comes from ----------------------------------------------


def _leaves_of(kind):
    from adora_openrlhf.cli_args import LEAF_TYPES, _strip_optional

    return [dotted for dotted, hint in LEAF_TYPES.items() if _strip_optional(hint) is kind]


BOOL_FIELDS = _leaves_of(bool)
NOT_BOOLEANS = ["false", "true", "False", "no", None, 2, 0, 1, 1.0, [], {}]


def test_every_boolean_field_is_covered():
    assert {
        "adora.enabled",
        "sampling.enabled",
        "dynamic_filtering.enabled",
        "adora.length_shaping",
        "sampling.drop_unfinished",
    } <= set(BOOL_FIELDS)
    assert {"adora.drop_truncated_negatives", "model.merge_lora_on_save", "model.freeze_visual_encoder"} <= set(
        BOOL_FIELDS
    )


@pytest.mark.parametrize("field", BOOL_FIELDS)
@pytest.mark.parametrize("value", NOT_BOOLEANS, ids=repr)
def test_config_file_booleans_must_be_true_or_false(tmp_path, capsys, field, value):
    """{"dynamic_filtering": {"enabled": "false"}} ran DAPO filtering: "false" is a truthy string."""
    from adora_openrlhf.dotted import nest

    config = tmp_path / "run.json"
    config.write_text(json.dumps(nest({field: value})))
    code = call(train_cli.main, ["--output-dir", str(tmp_path / "run"), "--config", str(config), *FAST])
    assert code == 2
    line = assert_one_line(capsys.readouterr().err, f"error: {field}: must be true or false, got {value!r}")
    assert ("without quotes" in line) is isinstance(value, str)
    assert not (tmp_path / "run").exists()


def _wrong_values(hint):
    """Values of another type than ``hint`` (a field's annotation), each of which must be refused."""
    import typing

    from adora_openrlhf.cli_args import _strip_optional

    optional = type(None) in typing.get_args(hint)
    base = _strip_optional(hint)
    origin = typing.get_origin(base) or base
    values = {
        bool: ["false", 2, 0, 1.5, [], {}],
        int: ["3", True, 2.5, [], {}, float("nan")],
        float: ["0.5", True, [], {}, float("inf")],
        str: [1, True, 0.5, [], {}],
        list: [5, True, {}],
        dict: [5, True, [], "x"],
    }[origin]
    return values + ([] if optional else [None])


def _all_wrong_values():
    from adora_openrlhf.cli_args import LEAF_TYPES

    for dotted, hint in LEAF_TYPES.items():
        for value in _wrong_values(hint):
            yield dotted, value


@pytest.mark.parametrize("field, value", list(_all_wrong_values()), ids=lambda v: repr(v)[:30])
def test_every_field_refuses_a_value_of_another_type(field, value):
    """Every RunConfig leaf, whatever its type: one ConfigError that names it (the recipes, --config files,
    bench --set and Python callers all build configs through here)."""
    from adora_openrlhf.config import ConfigError
    from adora_openrlhf.recipes import build_run_config

    with pytest.raises(ConfigError) as err:
        build_run_config("kk-tiny", {field: value})
    message = str(err.value)
    assert message.startswith((f"{field}:", f"{field}[", f"{field}.")), message
    assert "\n" not in message


def test_recipes_and_bench_set_values_are_type_checked(tmp_path, capsys, monkeypatch):
    from adora_openrlhf import recipes
    from bench import sample_efficiency

    bad = recipes.Recipe(
        "kk-bad-type", "a recipe with a string for a boolean", ("local",), {"sampling": {"enabled": "false"}}
    )
    monkeypatch.setitem(recipes.RECIPES._entries, bad.name, bad)
    assert call(train_cli.main, ["--output-dir", str(tmp_path / "run"), "--recipe", bad.name]) == 2
    assert_one_line(capsys.readouterr().err, "sampling.enabled: must be true or false, got 'false'")
    for item, needle in (
        ("adora.enabled=maybe", "--set adora.enabled: cannot parse 'maybe'"),
        ('adora.enabled="false"', "--set adora.enabled: cannot parse"),
        ("adora.enabled=null", "--set adora.enabled: cannot parse"),
        ("dynamic_filtering.enabled=2", "--set dynamic_filtering.enabled: cannot parse '2'"),
        ("steps=1.5", "--set steps: cannot parse '1.5'"),
    ):
        code = sample_efficiency.main(["--quick", "--set", item, "--out", str(tmp_path / "bench")])
        assert code == 2
        assert_one_line(capsys.readouterr().err, needle)
    assert sample_efficiency._parse_set(["adora.enabled=false", "sampling.enabled=no"]) == {
        "adora.enabled": False,
        "sampling.enabled": False,
    }
    assert not (tmp_path / "bench").exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", ["null", "2", "maybe", '"false"'])
def test_boolean_flags_refuse_anything_but_a_boolean_word(tmp_path, capsys, value):
    assert call(train_cli.main, ["--output-dir", str(tmp_path / "run"), "--adora.enabled", value, *FAST]) == 2
    assert_one_line(capsys.readouterr().err, "--adora.enabled: cannot parse")


# ---- the small values a user tries first ------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        ["--warmup.steps", "1", "--warmup.lr_ramp", "0.5"],  # "error: ZeroDivisionError: division by zero"
        ["--warmup.mix_steps", "1", "--warmup.mix", '{"direct": 1.0}', "--warmup.lr_ramp", "0.1"],
        [
            "--warmup.steps",
            "2",
            "--warmup.lr_ramp",
            "0.9",
            "--eval_every",
            "1",
            "--save_every",
            "1",
            "--sampling.n_keep",
            "2",
        ],
        [
            "--recipe",
            "kk-testbed",
            "--warmup.steps",
            "1",
            "--warmup.mix_steps",
            "1",
            "--data.num_eval",
            "1",
            "--data.num_train",
            "1",
        ],
        [
            "--sampling.enabled",
            "true",
            "--sampling.samples_per_round",
            "2",  # a pool of one response gives n_keep 1 no baseline: refused (test_groups_of_one_response_...)
            "--sampling.max_rounds",
            "1",
            "--sampling.n_keep",
            "1",
            "--adora.enabled",
            "true",
        ],
        [
            "--train.lr_scheduler",
            "cosine_with_min_lr",
            "--train.lr_warmup_ratio",
            "0.99",
            "--train.micro_batch_size",
            "1",
            "--rollout.max_new_tokens",
            "1",
        ],
    ],
    ids=["warmup-1", "mix-1", "warmup-2-n-2", "testbed-1", "adaptive-1", "schedule-1"],
)
def test_one_step_runs_and_the_smallest_settings_work(tmp_path, capsys, extra):
    out = tmp_path / "run"
    assert call(train_cli.main, ["--output-dir", str(out), *FAST, "--report_to", "none", *extra]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 1 and (out / "final_model").is_dir()


# ---- --config files: bounded expansion, no duplicate keys ----------------------------------------------------


def _alias_bomb(levels: int = 8, fan_out: int = 10, section: str = "extra") -> str:
    """``fan_out ** levels`` values from a few hundred bytes (a YAML "billion laughs")."""
    lines = [f"{section}:", "  a0: &a0 [" + ", ".join(['"lol"'] * fan_out) + "]"]
    lines += [f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fan_out) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "text, needle",
    [
        (_alias_bomb(), "the file expands to more than 100,000 values once its YAML aliases"),  # 10^8 values
        (_alias_bomb(levels=30, fan_out=2), "the file expands to more than 100,000 values"),  # 2^30
        (_alias_bomb(section="model:\n  init_kwargs"), "the file expands to more than"),
        ("extra: &a {x: [*a]}\n", "a YAML alias refers to a value that contains it"),
        ("train:\n  lr: 0.001\n  lr: 0.0001\n", ":3: duplicate key 'lr' (first given on line 2)"),
        ("steps: 2\nseed: 1\nsteps: 3\n", ":3: duplicate key 'steps' (first given on line 1)"),
        ('{"adora": {"enabled": true, "enabled": false}}', ":1: duplicate key 'enabled'"),
        ("extra:\n  a: 1\n  b: {c: 1, c: 2}\n", ":3: duplicate key 'c'"),
        ("extra: [" * 5000 + "]" * 5000 + "\n", "config"),  # deep nesting: a clean error either way
    ],
    ids=[
        "bomb-10^8",
        "bomb-2^30",
        "bomb-in-init-kwargs",
        "recursive",
        "dup-yaml",
        "dup-top",
        "dup-json",
        "dup-nested",
        "deep",
    ],
)
def test_config_file_bombs_and_duplicate_keys_are_refused(tmp_path, capsys, text, needle):
    import time

    config = tmp_path / "run.yaml"
    config.write_text(text)
    start = time.monotonic()
    code = call(train_cli.main, ["--output-dir", str(tmp_path / "run"), "--config", str(config), *FAST])
    assert time.monotonic() - start < 10
    assert code == 2
    line = assert_one_line(capsys.readouterr().err, needle)
    assert str(config) in line
    assert not (tmp_path / "run").exists()


def test_config_file_size_is_bounded_and_merge_keys_may_override(tmp_path, capsys):
    from adora_openrlhf.cli_args import load_config_file

    big = tmp_path / "big.yaml"
    big.write_text("extra:\n  blob: '" + "x" * (2 << 20) + "'\n")
    assert call(train_cli.main, ["--output-dir", str(tmp_path / "run"), "--config", str(big), *FAST]) == 2
    assert_one_line(capsys.readouterr().err, f"{big}: larger than 1024 KiB")
    merged = tmp_path / "merge.yaml"
    merged.write_text("extra:\n  base: &b {lr: 0.001, seed: 1}\n  run:\n    <<: *b\n    lr: 0.002\n")
    assert load_config_file(str(merged))["extra"]["run"] == {"lr": 0.002, "seed": 1}
    fine = tmp_path / "fine.yaml"
    fine.write_text("extra:\n  a: &a [1, 2]\n  b: [*a, *a]\n")  # a few aliases stay allowed
    assert load_config_file(str(fine))["extra"]["b"] == [[1, 2], [1, 2]]


@pytest.mark.parametrize("kind", ["missing", "directory", "empty", "bad_json", "not_utf8", "not_object", "blank_only"])
@pytest.mark.parametrize("option", ["--data.train_path", "--data.eval_path"])
def test_train_bad_data_files(tmp_path, capsys, bad_files, kind, option):
    path, needle = bad_files[kind]
    before = snapshot(tmp_path)
    code = call(train_cli.main, ["--output-dir", str(tmp_path / "run"), option, str(path), *FAST])
    assert code == 2
    assert_one_line(capsys.readouterr().err, needle)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "row, needle",
    [
        ({"prompt": "p", "label": "Alice is a knight"}, ":2: field 'label': the 'kk' reward cannot parse it"),
        ({"prompt": "p", "label": "(1) Carol is a knight", "meta": {"names": ["Alice"]}}, ":2: field 'label'"),
        ({"label": KK_LABEL}, ":2: field 'prompt'"),
        ({"prompt": "p", "label": ""}, ":2: field 'label'"),
        ({"prompt": "p", "label": KK_LABEL, "meta": [1]}, ":2: field 'meta'"),
        ({"prompt": "p", "label": KK_LABEL, "source": "chess"}, ":2: field 'source'"),
        (
            {"prompt": "p", "label": "7" * 100_000, "source": "math500"},
            ":2: field 'label': 100000 characters, more than the 4096",
        ),
        ({"prompt": "p", "label": "x" * 4097, "source": "geo_synth"}, ":2: field 'label': 4097 characters"),
    ],
)
def test_train_bad_rows_name_file_line_and_field(tmp_path, capsys, row, needle):
    data = write_rows(tmp_path / "train.jsonl", [kk_row(0), row, kk_row(2)])
    code = call(train_cli.main, ["--output-dir", str(tmp_path / "run"), "--data.train_path", str(data), *FAST])
    assert code == 2
    assert_one_line(capsys.readouterr().err, f"{data}{needle}")
    assert not (tmp_path / "run").exists()


def test_train_refuses_output_locations(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("keep")
    for out, needle in ((blocker, "output_dir: "), (blocker / "sub", "is a file")):
        assert call(train_cli.main, ["--output-dir", str(out), *FAST]) == 2
        assert_one_line(capsys.readouterr().err, needle)
    assert blocker.read_text() == "keep"


def test_train_never_deletes_a_previous_run_on_a_bad_start(tmp_path, capsys, bad_files):
    out = tmp_path / "run"
    (out / "checkpoints" / "step_000005").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 5}\n')
    (out / "config.json").write_text("{}")
    before = snapshot(tmp_path)
    assert call(train_cli.main, ["--output-dir", str(out), *FAST]) == 2  # no --overwrite
    assert_one_line(
        capsys.readouterr().err, f"output_dir: '{out}' holds a run with checkpoints (up to step 5)", "--overwrite"
    )
    path, needle = bad_files["missing"]
    assert call(train_cli.main, ["--output-dir", str(out), "--overwrite", "--data.train_path", str(path), *FAST]) == 2
    assert_one_line(capsys.readouterr().err, needle)
    assert call(train_cli.main, ["--output-dir", str(tmp_path / "fresh"), "--resume", *FAST]) == 2
    assert_one_line(capsys.readouterr().err, "--resume: no checkpoint")
    assert snapshot(tmp_path) == before


def test_train_ctrl_c_and_full_disk_give_one_line(tmp_path, capsys, monkeypatch):
    from adora_openrlhf.backends.local import trainer

    out = tmp_path / "run"
    (out / "checkpoints" / "step_000003").mkdir(parents=True)

    def interrupted(cfg, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "train", interrupted)
    assert call(train_cli.main, ["--output-dir", str(out), *FAST]) == 130
    line = assert_one_line(
        capsys.readouterr().err, "interrupted; continue from step 3 with: python -m adora_openrlhf.train"
    )
    assert line.endswith("--resume") and f"--output-dir {out}" in line

    def full(cfg, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / "checkpoints" / "step_000004.tmp"))

    monkeypatch.setattr(trainer, "train", full)
    assert call(train_cli.main, ["--output-dir", str(out), *FAST]) == 1
    assert_one_line(capsys.readouterr().err, "step_000004.tmp: No space left on device (free some space)")

    def full_in_a_library(cfg, **kwargs):  # safetensors / tokenizers word a full disk their own way
        raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(trainer, "train", full_in_a_library)
    assert call(train_cli.main, ["--output-dir", str(out), *FAST]) == 1
    assert_one_line(
        capsys.readouterr().err,
        "error: No space left on device (free some space): RuntimeError: Error while serializing",
    )


def test_train_bad_model_and_checkpoint(tmp_path, capsys):
    not_a_model = tmp_path / "empty_model"
    not_a_model.mkdir()
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"\0" * 10)
    for path in (not_a_model, weights):
        assert call(train_cli.main, ["--output-dir", str(tmp_path / "run"), "--model", str(path), *FAST]) == 2
        assert_one_line(capsys.readouterr().err, f"model.path: '{path}' cannot be loaded")
    broken = tmp_path / "run" / "checkpoints" / "step_000001"
    broken.mkdir(parents=True)
    (broken / "model.safetensors").write_bytes(b"torn")
    before = snapshot(tmp_path)
    assert call(train_cli.main, ["--output-dir", str(tmp_path / "run"), "--resume", *FAST]) == 2
    assert_one_line(
        capsys.readouterr().err,
        f"--resume: checkpoint '{broken}' is broken: trainer_state/manifest.json is missing; no earlier checkpoint is complete",
    )
    assert snapshot(tmp_path) == before


def test_train_resume_refusals_are_one_line_and_write_nothing(tmp_path, capsys):
    """A broken last checkpoint, a changed config without config.json, data edited in place, --steps below the
    checkpoint's step, a bad --resume-from: exit 2, one line naming what and what to do, nothing changed."""
    import shutil

    data = write_rows(tmp_path / "train.jsonl", [kk_row(i) for i in range(6)])
    base = tmp_path / "base"
    argv = ["--output-dir", str(base), "--data.train_path", str(data), *FAST, "--steps", "2", "--save_every", "1"]
    assert call(train_cli.main, argv) == 0
    capsys.readouterr()
    cases = [
        (
            lambda out: (out / "checkpoints" / "step_000002" / "model.safetensors").write_bytes(b"\0" * 12),
            [],
            "is broken: model.safetensors is truncated (12 of",
        ),
        (
            lambda out: (out / "config.json").unlink(),
            ["--train.lr", "0.5"],
            "--resume: the config differs from the config saved in checkpoint step_000002 in train.lr",
        ),
        (lambda out: None, ["--steps", "1"], "steps: 1 is below step 2 of checkpoint"),
        (lambda out: None, ["--resume-from", "step_000009"], "--resume-from: no checkpoint 'step_000009'"),
    ]
    for harm, extra, needle in cases:
        out = tmp_path / "copy"
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(base, out)
        harm(out)
        before = snapshot(out)
        run_argv = ["--output-dir", str(out), "--data.train_path", str(data), *FAST, "--steps", "3", "--resume", *extra]
        assert call(train_cli.main, run_argv) == 2
        line = assert_one_line(capsys.readouterr().err, needle)
        assert line.startswith("error: ")
        assert snapshot(out) == before
    out = tmp_path / "copy"
    shutil.rmtree(out)
    shutil.copytree(base, out)
    data.write_text(data.read_text().replace("Puzzle 1:", "Puzzle one:"))  # edited in place
    assert (
        call(
            train_cli.main,
            ["--output-dir", str(out), "--data.train_path", str(data), *FAST, "--steps", "3", "--resume"],
        )
        == 2
    )
    assert_one_line(
        capsys.readouterr().err,
        "--resume: the training rows differ from those checkpoint step_000002 was trained on",
        f"data.train_path '{data}'",
    )


def test_resume_from_is_a_local_backend_option_and_leaves_the_interrupt_hint(tmp_path, capsys, monkeypatch):
    from adora_openrlhf.backends.local import trainer

    argv = [
        "--output-dir",
        str(tmp_path / "run"),
        "--backend",
        "openrlhf",
        "--recipe",
        "dapo-math-adora",
        "--resume-from",
        "3",
    ]
    assert call(train_cli.main, argv) == 2
    assert_one_line(
        capsys.readouterr().err, "--resume-from: only the local backend resumes from a chosen checkpoint; use --resume"
    )
    (tmp_path / "run" / "checkpoints" / "step_000003").mkdir(parents=True)

    def interrupted(cfg, **kwargs):
        assert kwargs == {"resume": False, "overwrite": False, "resume_from": "step_000001", "resume_changes": []}
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "train", interrupted)
    assert call(train_cli.main, ["--output-dir", str(tmp_path / "run"), *FAST, "--resume-from", "step_000001"]) == 130
    line = assert_one_line(capsys.readouterr().err, "interrupted; continue from step 3 with:")
    assert line.endswith("--resume") and "--resume-from" not in line and "step_000001" not in line


def test_train_chat_prompt_rows_are_checked(tmp_path, capsys):
    data = write_rows(tmp_path / "train.jsonl", [kk_row(0), {"prompt": [{"role": "user"}], "label": KK_LABEL}])
    assert call(train_cli.main, ["--output-dir", str(tmp_path / "run"), "--data.train_path", str(data), *FAST]) == 2
    assert_one_line(capsys.readouterr().err, f"{data}:2: field 'prompt': a list prompt must hold chat messages")


def test_unexpected_errors_are_one_line_too(tmp_path, capsys, monkeypatch):
    from adora_openrlhf.backends.local import trainer

    def bug(cfg, **kwargs):
        raise TypeError("unsupported operand")

    monkeypatch.setattr(trainer, "train", bug)
    assert call(train_cli.main, ["--output-dir", str(tmp_path / "run"), *FAST]) == 1
    assert_one_line(
        capsys.readouterr().err, "error: TypeError: unsupported operand (run again with --debug for the traceback)"
    )
    with pytest.raises(TypeError):
        train_cli.main(["--output-dir", str(tmp_path / "run"), "--debug", *FAST])


# ---------------------------------------------------------------------------------------------------------
# eval.run
# ---------------------------------------------------------------------------------------------------------


def _eval_argv(tmp_path, bench_file, *extra):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")  # a directory that looks like a model but does not load
    return [
        "--model",
        str(model),
        "--bench",
        "kk",
        "--bench-file",
        f"kk={bench_file}",
        "--k",
        "2",
        "--engine",
        "hf",
        "--out",
        str(tmp_path / "eval"),
        *extra,
    ]


@pytest.mark.parametrize("kind", ["missing", "directory", "empty", "bad_json", "not_utf8", "not_object", "blank_only"])
def test_eval_bad_bench_files(tmp_path, capsys, bad_files, kind):
    path, needle = bad_files[kind]
    before = snapshot(tmp_path)
    assert call(eval_run.main, _eval_argv(tmp_path, path)) == 2
    assert_one_line(capsys.readouterr().err, needle if kind != "missing" else "--bench-file kk")
    assert snapshot(tmp_path) == {**before, "model": (True, 0), "model/config.json": (False, 2)}


def test_eval_refuses_an_oversized_label_with_file_and_line(tmp_path, capsys):
    bench = write_rows(tmp_path / "kk.jsonl", [kk_row(0), {**kk_row(1), "label": KK_LABEL + " " * 5000}])
    assert call(eval_run.main, _eval_argv(tmp_path, bench)) == 2
    assert_one_line(
        capsys.readouterr().err, f"{bench}:2: field 'label': {len(KK_LABEL) + 5000} characters, more than the 4096"
    )


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--k", "0"], "--k: must be between 1 and 1024, got 0"),
        (["--k", "two"], "argument --k: invalid int value"),
        (["--top-p", "1.5"], "--top-p"),
        (["--temperature", "-1"], "--temperature"),
        (["--temperature", "nan"], "--temperature"),
        (["--limit", "0"], "--limit"),
        (["--batch-size", "0"], "--batch-size"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--bench", "kk,gsm9k"], "unknown benchmark 'gsm9k'"),
        (["--engine", "tgi"], "--engine"),
        (["--data-dir", "/no/such/dir"], "--data-dir"),
    ],
)
def test_eval_bad_arguments(tmp_path, capsys, extra, needle):
    bench = write_rows(tmp_path / "kk.jsonl", [kk_row(0)])
    assert call(eval_run.main, _eval_argv(tmp_path, bench, *extra)) == 2
    assert_one_line(capsys.readouterr().err, needle)
    assert not (tmp_path / "eval").exists()


def test_eval_bad_model_out_and_ids(tmp_path, capsys):
    bench = write_rows(tmp_path / "kk.jsonl", [kk_row(0), kk_row(1), kk_row(0)])
    assert call(eval_run.main, _eval_argv(tmp_path, bench)) == 2
    assert_one_line(capsys.readouterr().err, f"{bench}:3: problem id '0' of --bench kk repeats {bench}:1")
    unparsable = write_rows(tmp_path / "label.jsonl", [kk_row(0), {**kk_row(1), "label": "Alice is honest"}])
    assert call(eval_run.main, _eval_argv(tmp_path, unparsable)) == 2
    assert_one_line(capsys.readouterr().err, f"{unparsable}:2: field 'label': the 'kk' reward cannot parse it")
    strangers = write_rows(
        tmp_path / "strangers.jsonl", [kk_row(0), {**kk_row(1), "prompt": "Puzzle 1: Carol and Dave."}]
    )
    assert call(eval_run.main, _eval_argv(tmp_path, strangers)) == 2  # the trainer's row checks (the task's row_check)
    assert_one_line(
        capsys.readouterr().err,
        f"{strangers}:2: field 'label': names ['Alice', 'Bob'], whom the prompt does not mention",
    )
    math_row = {"prompt": "What is 6 * 7?", "label": "42", "meta": {"id": "m", "reward_style": "lenient"}}
    math_file = write_rows(tmp_path / "math.jsonl", [math_row])
    argv = [*_eval_argv(tmp_path, math_file)]
    argv[argv.index("--bench") + 1], argv[argv.index("--bench-file") + 1] = "math500", f"math500={math_file}"
    assert call(eval_run.main, argv) == 2
    assert_one_line(capsys.readouterr().err, f"{math_file}:1: field 'meta.reward_style': expected one of")
    not_object = write_rows(tmp_path / "meta.jsonl", [{**kk_row(0), "meta": ["Alice", "Bob"]}])
    assert call(eval_run.main, _eval_argv(tmp_path, not_object)) == 2
    assert_one_line(capsys.readouterr().err, f"{not_object}:1: field 'meta': expected an object, got list")
    good = write_rows(tmp_path / "good.jsonl", [kk_row(0)])
    argv = _eval_argv(tmp_path, good)
    argv[argv.index("--model") + 1] = "./no/such/model"
    assert call(eval_run.main, argv) == 2
    assert_one_line(capsys.readouterr().err, "--model: ./no/such/model")
    assert call(eval_run.main, _eval_argv(tmp_path, good)) == 2  # --model: a directory that does not load
    assert_one_line(capsys.readouterr().err, f"--model: cannot load {tmp_path / 'model'}")
    argv = _eval_argv(tmp_path, good)
    (tmp_path / "model" / "config.json").unlink()
    assert call(eval_run.main, argv) == 2
    assert_one_line(capsys.readouterr().err, "has no config.json")
    assert not (tmp_path / "eval").exists()
    (tmp_path / "eval").write_text("a file")
    assert call(eval_run.main, _eval_argv(tmp_path, good)) == 2
    assert_one_line(capsys.readouterr().err, "--out: ")
    assert (tmp_path / "eval").read_text() == "a file"


def test_eval_ctrl_c_hint(tmp_path, capsys, monkeypatch):
    good = write_rows(tmp_path / "good.jsonl", [kk_row(0)])

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(eval_run, "GENERATORS", {"hf": interrupted})
    assert call(eval_run.main, _eval_argv(tmp_path, good)) == 130
    assert_one_line(capsys.readouterr().err, "interrupted; finished samples are kept in", "rerun the same command")


# ---------------------------------------------------------------------------------------------------------
# demo and the data_prep converters
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--n", "0"], "--n: must be >= 1"),
        (["--steps", "x"], "argument --steps"),
        (["--prompts", "-3"], "--prompts"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_demo_bad_arguments(capsys, argv, needle):
    assert call(demo.main, argv) == 2
    assert_one_line(capsys.readouterr().err, needle)


CONVERTERS = {
    "kk": (kk.main, "--from-jsonl"),
    "dapo_math": (dapo_math.main, "--dataset"),
    "math_eval": (lambda argv: math_eval.main(["--benchmark", "aime24", *argv]), "--dataset"),
    "geometry3k": (geometry3k.main, "--dataset"),
}


@pytest.mark.parametrize("kind", ["missing", "directory", "empty", "blank_only"])
@pytest.mark.parametrize("converter", sorted(CONVERTERS))
def test_converters_refuse_unusable_inputs(tmp_path, capsys, bad_files, converter, kind):
    main, flag = CONVERTERS[converter]
    path, needle = bad_files[kind]
    before = snapshot(tmp_path)
    code = call(main, ["--out", str(tmp_path / "out"), flag, str(path)])
    assert code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(path) in err.splitlines()[-1]
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("converter", sorted(CONVERTERS))
def test_converters_skip_bad_lines_and_fail_when_no_row_is_left(tmp_path, capsys, converter):
    main, flag = CONVERTERS[converter]
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"broken": \n' + b"[1]\n" + b"\xff\xfe\n")
    before = snapshot(tmp_path)
    assert call(main, ["--out", str(tmp_path / "out"), flag, str(src)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("warning: rejected", "error"))]
    assert err[:3] == [
        f"warning: rejected {src}:1: not valid JSON (Expecting value at column 12)",
        f"warning: rejected {src}:2: expected a JSON object per line, got list",
        f"warning: rejected {src}:3: not UTF-8 text (byte 1 of the line); re-save the file as UTF-8",
    ]
    assert err[-1].startswith("error: ") and "nothing was written" in err[-1]
    assert snapshot(tmp_path) == before


def test_converter_keeps_good_lines_around_a_torn_one(tmp_path, capsys):
    src = tmp_path / "aime.jsonl"
    src.write_text(
        '{"problem": "1+1?", "answer": "2"}\n\n{"problem": "2+2?", "ans\n{"problem": "3+3?", "answer": "6"}\n'
    )
    assert math_eval.main(["--benchmark", "aime24", "--out", str(tmp_path / "out"), "--dataset", str(src)]) == 0
    assert [json.loads(line)["label"] for line in (tmp_path / "out" / "aime24.jsonl").read_text().splitlines()] == [
        "2",
        "6",
    ]
    captured = capsys.readouterr()
    assert f"warning: rejected {src}:3: not valid JSON" in captured.err and "rejected 1 malformed rows" in captured.err


def test_converter_bad_arguments_and_output_locations(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("keep")
    assert call(kk.main, ["--out", str(blocker), "--num-train", "4"]) == 2
    assert_one_line(capsys.readouterr().err, "--out: ")
    assert call(kk.main, ["--out", str(tmp_path / "o"), "--num-train", "0"]) == 2
    assert_one_line(capsys.readouterr().err, "--num-train: must be >= 1")
    assert call(kk.main, ["--out", str(tmp_path / "o"), "--people", "1-9"]) == 2
    assert_one_line(capsys.readouterr().err, "--people")
    assert call(math_eval.main, ["--out", str(tmp_path / "o"), "--benchmark", "aime99"]) == 2
    assert_one_line(capsys.readouterr().err, "argument --benchmark: invalid choice")
    assert call(dapo_math.main, ["--out", str(tmp_path / "o"), "--max-rows", "0"]) == 2
    assert_one_line(capsys.readouterr().err, "--max-rows")
    assert blocker.read_text() == "keep" and not (tmp_path / "o").exists()


@pytest.mark.skipif(
    not (os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode)),
    reason="needs the /dev/full device",
)
def test_converter_on_a_full_disk_leaves_no_partial_file(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.jsonl.tmp").symlink_to("/dev/full")  # every write to the output fails: No space left on device
    assert call(kk.main, ["--out", str(out), "--num-train", "300", "--num-eval", "2", "--people", "2"]) == 1
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("error: ") and "No space left on device (free some space)" in err
    assert sorted(p.name for p in out.iterdir()) == []


def test_converter_whose_writes_fail_with_enospc_leaves_no_partial_file(tmp_path, capsys, monkeypatch):
    """The same as on /dev/full, where there is no such device: the output file's writes fail with ENOSPC after
    some rows reached the temporary file."""
    from adora_openrlhf import datafiles

    real_open = open

    class FillingFile:
        def __init__(self, handle):
            self.handle, self.writes = handle, 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, text):
            self.writes += 1
            if self.writes > 10:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.handle.write(text)

    def filling_open(path, mode="r", **kwargs):
        handle = real_open(path, mode, **kwargs)
        return FillingFile(handle) if "w" in mode and str(path).endswith("train.jsonl.tmp") else handle

    monkeypatch.setattr(datafiles, "open", filling_open, raising=False)
    out = tmp_path / "out"
    assert call(kk.main, ["--out", str(out), "--num-train", "300", "--num-eval", "2", "--people", "2"]) == 1
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("error: ") and "No space left on device (free some space)" in err
    assert not (out / "train.jsonl").exists() and not (out / "train.jsonl.tmp").exists()


# ---------------------------------------------------------------------------------------------------------
# real processes: exit codes and no tracebacks
# ---------------------------------------------------------------------------------------------------------


def _run(module, *argv, **kwargs):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("ADORA_DEBUG", None)
    kwargs.setdefault("timeout", 120)
    return subprocess.run(
        [sys.executable, "-m", module, *argv], cwd=ROOT, env=env, capture_output=True, text=True, **kwargs
    )


def test_processes_exit_with_one_line_and_debug_shows_the_traceback(tmp_path):
    missing = tmp_path / "missing.jsonl"
    result = _run(
        "adora_openrlhf.train",
        "--output-dir",
        str(tmp_path / "run"),
        "--data.train_path",
        str(missing),
        "--train.max_grad_norm",
        "-1",
    )
    assert result.returncode == 2
    assert_one_line(result.stderr, "train.max_grad_norm")
    result = _run(
        "adora_openrlhf.train", "--output-dir", str(tmp_path / "run"), "--data.train_path", str(missing), "--debug"
    )
    assert result.returncode != 0 and "Traceback" in result.stderr and str(missing) in result.stderr
    result = _run("eval.run", "--model", str(tmp_path), "--out", str(tmp_path / "e"), "--bench-file", f"kk={missing}")
    assert result.returncode == 2
    assert_one_line(result.stderr, str(missing))
    assert not (tmp_path / "run").exists() and not (tmp_path / "e").exists()


def test_stdout_of_a_real_training_is_the_json_summary_alone(tmp_path):
    """`python -m adora_openrlhf.train > summary.json`: deepspeed (installed here) prints an accelerator warning
    to stdout when a library imports it mid-run; it must land on stderr."""
    import importlib.util

    out = tmp_path / "run"
    result = _run("adora_openrlhf.train", "--output-dir", str(out), *FAST, "--report_to", "none", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)  # nothing but the summary
    assert summary == json.loads((out / "summary.json").read_text())
    if importlib.util.find_spec("deepspeed") is not None:
        assert "accelerator" in result.stderr.lower()  # the warning still reaches the user, on stderr


@pytest.mark.slow
def test_ctrl_c_in_a_real_training_prints_how_to_resume(tmp_path):
    import signal
    import time

    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    argv = [
        sys.executable,
        "-m",
        "adora_openrlhf.train",
        "--output-dir",
        str(out),
        *FAST,
        "--steps",
        "100000",
        "--save_every",
        "1",
    ]

    from adora_openrlhf.rundir.checkpoints import list_checkpoints

    # a complete checkpoint after step 0; older ones are rotated away, so no fixed name
    def rl_checkpoint_written() -> bool:
        return (out / "checkpoints").is_dir() and any(step > 0 for step, _ in list_checkpoints(out))

    # stderr goes to a file, not a pipe: the run logs every step, and a pipe nobody reads would fill and block it
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err_file:
        # Ctrl-C in a terminal: SIGINT at its default disposition in the child even when this test runs from a
        # background job (a non-interactive shell starts those with SIGINT ignored, and a child inherits that)
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err_file,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        deadline = time.time() + 120
        while not rl_checkpoint_written() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert rl_checkpoint_written(), "no RL checkpoint within 120 s"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=180)  # a loaded machine may take a while to write the interrupted step
    err = err_path.read_text()
    assert proc.returncode == 130, err[-4000:]  # the run's own last lines say where the interrupt landed
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted; continue from step") and last.endswith("--resume") and "Traceback" not in err


def test_groups_of_one_response_that_train_nothing_are_refused():
    from adora_openrlhf.config import ConfigError
    from adora_openrlhf.recipes import build_run_config

    with pytest.raises(
        ConfigError,
        match=r"^sampling.n_keep: groups of one response .* advantage 0 under every group-relative estimator",
    ):
        build_run_config("kk-tiny", {"sampling.n_keep": 1})
    with pytest.raises(ConfigError, match="sampling.n_keep"):
        build_run_config("kk-tiny", {"sampling.n_keep": 1, "advantage.estimator": "rloo"})
    # the pool of adaptive sampling gives a single kept response a baseline: allowed
    assert build_run_config("kk-tiny", {"sampling.n_keep": 1, "sampling.enabled": True}).sampling.n_keep == 1
    # ... unless the pool itself holds one response: nothing trains, whatever produces the groups of one
    one = {"sampling.n_keep": 1, "sampling.enabled": True, "sampling.samples_per_round": 1, "sampling.max_rounds": 1}
    with pytest.raises(
        ConfigError, match=r"^sampling.max_rounds: with sampling.n_keep = 1 .* holds at most 1 response"
    ):
        build_run_config("kk-tiny", one)
    with pytest.raises(ConfigError, match=r"^sampling.max_rounds: with sampling.n_keep = 1"):
        build_run_config("kk-tiny", {**one, "sampling.max_rounds": 4, "sampling.max_responses_per_prompt": 1})
    assert build_run_config("kk-tiny", {**one, "sampling.max_rounds": 2}).sampling.response_budget == 2
    assert build_run_config("kk-tiny", {**one, "sampling.pool_scope": "history"}).sampling.pool_scope == "history"


def test_a_diverging_policy_stops_with_the_step_the_field_and_the_last_good_checkpoint(tmp_path):
    from adora_openrlhf.backends.local.trainer import train

    sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
    from tiny_runs import tiny_kk_config

    learns = {
        "warmup.steps": 150,
        "warmup.lr": 1e-2,
        "warmup.batch_size": 8,
        "rollout.max_new_tokens": 40,
        "prompts_per_step": 2,
        "sampling.n_keep": 4,
    }
    cfg = tiny_kk_config(
        tmp_path / "run",
        steps=4,
        save_every=1,
        **{"train.lr": 1e30, "model.tiny.hidden_size": 32, "model.tiny.intermediate_size": 64, **learns},
    )
    with pytest.raises(
        FloatingPointError,
        match=r"^the policy diverged at step \d \(.*\); lower train.lr \(now 1e\+30\); the last good checkpoint is step_",
    ):
        train(cfg)


def test_a_run_whose_advantages_stay_zero_says_so_once(tmp_path, caplog):
    from adora_openrlhf.backends.local.trainer import train

    sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
    from tiny_runs import tiny_kk_config

    with caplog.at_level(logging.WARNING):
        train(tiny_kk_config(tmp_path / "run", steps=6))  # no warm-up, 4 new tokens: every response fails the format
    warnings = [r.getMessage() for r in caplog.records if "every advantage was zero" in r.getMessage()]
    assert warnings == [
        "steps 1-5: every advantage was zero (each group's responses got equal rewards), so the policy is not being updated; "
        "check the reward and the warm-up, or raise sampling.n_keep / rollout.temperature"
    ]


def test_a_plugin_that_raises_on_import_is_named_with_its_line(tmp_path, monkeypatch):
    from adora_openrlhf.config import ConfigError
    from adora_openrlhf.plugins import import_plugins

    (tmp_path / "boom_plugin.py").write_text("x = 1\nraise RuntimeError('plugin boom at import')\n")
    (tmp_path / "typo_plugin.py").write_text("import json\njson.loads('{')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as err:
        import_plugins(["boom_plugin"])
    message = str(err.value)
    assert message.startswith("plugins[0]: plugin module 'boom_plugin' raised RuntimeError while it was imported (")
    assert f"{tmp_path / 'boom_plugin.py'}:2): plugin boom at import" in message
    with pytest.raises(
        ConfigError, match=r"^plugins\[1\]: plugin module 'typo_plugin' raised JSONDecodeError .*typo_plugin.py:2\)"
    ):
        import_plugins(["json", "typo_plugin"])


def test_eval_model_with_a_truncated_weight_file_names_the_path(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (model / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")  # a header cut short
    rows = tmp_path / "kk.jsonl"
    from adora_openrlhf.tasks.kk import generate_rows

    rows.write_text("".join(json.dumps(r) + "\n" for r in generate_rows(2, [2], seed=1)))
    argv = [
        "--model",
        str(model),
        "--bench",
        "kk",
        "--bench-file",
        f"kk={rows}",
        "--engine",
        "hf",
        "--out",
        str(tmp_path / "out"),
    ]
    assert call(eval_run.main, argv) == 2
    err = capsys.readouterr().err
    assert_one_line(err, f"--model: {model}: model.safetensors")
    assert "re-export or re-download the model" in err


def test_eval_model_pruned_while_it_loads_is_named_as_removed_not_as_a_hub_name(tmp_path, capsys, monkeypatch):
    """A training still running prunes its older checkpoints: the directory eval.run checked is gone when the engine
    loads it, and transformers would then read the path as a hub repository name."""
    import shutil

    from adora_openrlhf.evaluation import generation

    model = tmp_path / "run" / "checkpoints" / "step_000002"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    rows = tmp_path / "kk.jsonl"
    from adora_openrlhf.tasks.kk import generate_rows

    rows.write_text("".join(json.dumps(r) + "\n" for r in generate_rows(2, [2], seed=1)))
    real = generation.GENERATORS["hf"]

    def pruned_first(model_path, *args, **kwargs):
        shutil.rmtree(model_path)  # the training's pruning wins the race
        return real(model_path, *args, **kwargs)

    monkeypatch.setitem(eval_run.GENERATORS, "hf", pruned_first)
    argv = [
        "--model",
        str(model),
        "--bench",
        "kk",
        "--bench-file",
        f"kk={rows}",
        "--engine",
        "hf",
        "--out",
        str(tmp_path / "out"),
    ]
    assert call(eval_run.main, argv) == 2
    assert_one_line(
        capsys.readouterr().err,
        f"--model: {model} was removed while it was being loaded (a training still running prunes",
    )


def test_finite_but_exploded_weights_stop_the_run_before_any_save_and_the_advice_resumes(tmp_path):
    """An update that leaves finite weights orders of magnitude larger (train.lr 1e10: Adam moves every weight by
    about lr) stops the run at that step, before its evaluation, checkpoint or final_model; the message names the
    checkpoint before it, whose weights are the good ones, and its advice is a command --resume accepts."""
    import torch

    from adora_openrlhf.backends.local.rl_step import WEIGHT_FLOOR
    from adora_openrlhf.backends.local.trainer import train
    from adora_openrlhf.config import ConfigError
    from adora_openrlhf.rundir import checkpoints as ckpt

    sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
    from tiny_runs import tiny_kk_config

    learns = {"warmup.steps": 150, "warmup.lr": 1e-2, "warmup.batch_size": 8, "rollout.max_new_tokens": 40}
    shape = {
        "model.tiny.hidden_size": 32,
        "model.tiny.intermediate_size": 64,
        "prompts_per_step": 2,
        "sampling.n_keep": 4,
    }
    out = tmp_path / "run"
    cfg = tiny_kk_config(out, steps=3, save_every=1, **{"train.lr": 1e10, **shape, **learns})
    with pytest.raises(FloatingPointError) as caught:
        train(cfg)
    message = str(caught.value)
    assert re.match(
        r"^the policy diverged at step \d \(the largest weight is .* above the bound .*\); lower train.lr", message
    )
    last = ckpt.latest_checkpoint(out)
    assert (
        f"the last good checkpoint is {last.name}: continue from it with --resume-from {last.name} --resume-changes train.lr --train.lr NEW_LR"
        in message
    )
    assert not (out / "final_model").exists()
    from safetensors.torch import load_file

    weights = load_file(str(last / "model.safetensors"))
    assert max(float(t.abs().max()) for t in weights.values()) < WEIGHT_FLOOR  # the named checkpoint is good
    with pytest.raises(ConfigError, match=r"train.lr: 10000000000.0 -> 0.001.*add --resume-changes train.lr"):
        train(
            tiny_kk_config(out, steps=3, save_every=1, **{"train.lr": 1e-3, **shape, **learns}), resume_from=last.name
        )
    with pytest.raises(ConfigError, match=r"^--resume-changes: \['train.kl_coef'\] cannot change on resume"):
        train(cfg, resume_from=last.name, resume_changes=["train.kl_coef"])
    resumed = tiny_kk_config(out, steps=3, save_every=1, **{"train.lr": 1e-3, **shape, **learns})
    summary = train(resumed, resume_from=last.name, resume_changes=["train.lr"])
    assert summary["steps"] == 3 and (out / "final_model" / "model.safetensors").is_file()
    assert torch.isfinite(torch.tensor(summary["eval_final"]["eval/greedy_accuracy"]))
