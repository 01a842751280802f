"""`python -m eval.run --run RUN`: a local training run saves its held-out rows and settings, and evaluating the
run greedily on them repeats the trainer's own held-out numbers for the same checkpoint (accuracy, mean reward
and mean response length, which only agree when every response is the same)."""

import hashlib
import json

import pytest

from adora_openrlhf.backends.local.trainer import train
from adora_openrlhf.evaluation.loop import SAMPLES_FILE, read_records
from adora_openrlhf.evaluation.run import main
from adora_openrlhf.recipes import build_run_config
from adora_openrlhf.rows import load_run_rows

TINY = {
    "model.tiny.vocab_size": 300,
    "model.tiny.hidden_size": 32,
    "model.tiny.intermediate_size": 64,
    "model.tiny.num_hidden_layers": 2,
    "model.tiny.num_attention_heads": 2,
    "model.tiny.num_key_value_heads": 1,
    "model.generation_batch_size": 8,  # several batches of held-out prompts, as in the testbed (128 of 200)
    "data.num_train": 24,
    "data.num_eval": 20,
    "data.kk.num_people": [2],
    "data.kk.name_pool": 3,  # a small name pool, as in kk-testbed: the tiny model learns to answer about the right people
    "data.kk.name_order": "pool",
    "warmup.steps": 150,
    "warmup.lr": 1e-2,
    "warmup.batch_size": 8,
    "steps": 2,
    "prompts_per_step": 2,
    "sampling.n_keep": 4,
    "rollout.max_new_tokens": 40,
    "eval_every": 0,
    "save_every": 0,
    "eval_samples": 0,
    "train.lr": 1e-3,
}


@pytest.fixture(scope="module", params=["exact", "fast"])
def tiny_run(tmp_path_factory, request):
    """A finished run of each ``model.numerics``: its rollouts and held-out evaluation decode with it."""
    out = tmp_path_factory.mktemp(f"eval_run_{request.param}") / "run"
    cfg = build_run_config("kk-tiny", {**TINY, "model.numerics": request.param, "output_dir": str(out)})
    summary = train(cfg)
    return cfg, out, summary


def test_the_run_saves_its_heldout_rows_and_settings(tiny_run):
    cfg, out, _ = tiny_run
    _, held = load_run_rows(cfg.data, cfg.seed)
    saved = [json.loads(line) for line in (out / "heldout.jsonl").read_text().splitlines()]
    assert [(r["prompt"], r["label"], r["source"], r["meta"]) for r in saved] == [
        (h.prompt, h.label, h.source, h.meta) for h in held
    ]
    assert all(r["meta"]["kk_parser"] == cfg.data.kk.parser for r in saved)  # graded with the run's parser
    settings = json.loads((out / "heldout.json").read_text())
    assert settings["count"] == 20 and settings["prompt_template"] == "auto" and settings["generation_batch_size"] == 8
    assert settings["rollout"]["max_new_tokens"] == 40 and settings["rollout"]["repetition_penalty"] == 1.0
    assert settings["numerics"] == cfg.model.numerics


def _greedy_numbers(records):
    n = len(records)
    return {
        "eval/greedy_accuracy": sum(r["correct"] for r in records) / n,
        "eval/greedy_reward": sum(r["reward"] for r in records) / n,
        "eval/greedy_length_mean": sum(r["response_tokens"] for r in records) / n,
    }


def test_greedy_evaluation_of_the_run_repeats_the_trainers_heldout_numbers(tiny_run, capsys):
    cfg, out, summary = tiny_run
    assert main(["--run", str(out), "--temperature", "0", "--k", "1", "--engine", "hf"]) == 0
    # the default --out: model and settings
    (eval_dir,) = (out / "eval").glob("final_model-*_hf_float32_t0_p0.95_n40_s0")
    records = read_records(eval_dir / SAMPLES_FILE)
    assert len(records) == 20 and len({r["response"] for r in records}) > 1
    final = summary["eval_final"]
    for key, value in _greedy_numbers(records).items():
        assert value == pytest.approx(final[key], abs=1e-9), key
    report = json.loads((eval_dir / "report.json").read_text())
    assert report["settings"]["max_new_tokens"] == 40 and report["settings"]["run"] == str(out)
    # the trainer's arithmetic and batches, in one process
    assert report["settings"]["numerics"] == cfg.model.numerics and report["settings"]["batch_size"] == 8
    # the run's own rows fit its model
    assert not [n for n in report["fit_notes"] if "local run" in n or "system message" in n]
    (line,) = report["comparison"]
    assert (
        f"eval/greedy_accuracy at step 2: {final['eval/greedy_accuracy']:.3f}" in line
        and "equal, as it must be" in line
    )
    assert line in capsys.readouterr().out


def test_the_default_out_names_the_model_files_and_the_settings(tmp_path):
    """A retrained final model (same path, other files) gets a folder of its own instead of a refused rerun."""
    from adora_openrlhf.evaluation.checks import model_identity
    from adora_openrlhf.evaluation.runs import RunTarget, default_out

    model = tmp_path / "run" / "final_model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    settings = {"engine": "hf", "dtype": "float32", "temperature": 0.0, "top_p": 0.95, "max_new_tokens": 40, "seed": 0}
    target = RunTarget(tmp_path / "run", tmp_path / "run" / "heldout.jsonl", {})
    first = default_out(target, model, {**model_identity(str(model)), **settings})
    assert (
        first.parent == tmp_path / "run" / "eval"
        and first.name.startswith("final_model-")
        and first.name.endswith("_hf_float32_t0_p0.95_n40_s0")
    )
    # the same files: the same folder
    assert default_out(target, model, {**model_identity(str(model)), **settings}) == first
    (model / "model.safetensors").write_bytes(b"retrained")
    assert default_out(target, model, {**model_identity(str(model)), **settings}) != first
    # a hub name
    assert (
        default_out(target, model, {"model": "owner/name", **settings}).name == "final_model_hf_float32_t0_p0.95_n40_s0"
    )


def test_fast_numerics_repeat_the_trainers_greedy_answers_on_the_tiny_run(tiny_run, tmp_path):
    """--numerics fast (grouped attention, top-p without a full sort, shared prefill) at temperature 0: on the tiny
    run every held-out response is the trainer's (arithmetic within float rounding of it changes no argmax here)."""
    _, out, summary = tiny_run
    argv = [
        "--run",
        str(out),
        "--temperature",
        "0",
        "--k",
        "1",
        "--engine",
        "hf",
        "--numerics",
        "fast",
        "--out",
        str(tmp_path / "e"),
    ]
    assert main(argv) == 0
    records = read_records(tmp_path / "e" / SAMPLES_FILE)
    assert len(records) == 20
    for key, value in _greedy_numbers(records).items():
        assert value == pytest.approx(summary["eval_final"][key], abs=1e-9), key
    assert json.loads((tmp_path / "e" / "report.json").read_text())["settings"]["numerics"] == "fast"


def test_a_checkpoint_of_the_run_is_compared_with_its_own_step(tiny_run, tmp_path):
    _, out, summary = tiny_run
    step0 = out / "checkpoints" / "step_000000"
    argv = [
        "--run",
        str(out),
        "--model",
        str(step0),
        "--temperature",
        "0",
        "--k",
        "1",
        "--engine",
        "hf",
        "--out",
        str(tmp_path / "e"),
    ]
    assert main(argv) == 0
    records = read_records(tmp_path / "e" / SAMPLES_FILE)
    for key, value in _greedy_numbers(records).items():
        assert value == pytest.approx(summary["eval_step0"][key], abs=1e-9), key
    assert "at step 0" in json.loads((tmp_path / "e" / "report.json").read_text())["comparison"][0]


def test_sampled_evaluation_states_its_noise_and_what_it_measures(tiny_run, tmp_path):
    _, out, _ = tiny_run
    argv = [
        "--run",
        str(out),
        "--k",
        "3",
        "--temperature",
        "1.0",
        "--limit",
        "6",
        "--engine",
        "hf",
        "--out",
        str(tmp_path / "e"),
    ]
    assert main(argv) == 0
    (line,) = json.loads((tmp_path / "e" / "report.json").read_text())["comparison"]
    assert "95% sampling noise ±" in line and "samples at temperature 1" in line and "--temperature 0 --k 1" in line
    report_md = (tmp_path / "e" / "report.md").read_text()
    head = report_md.split("## Scores")[0]
    for setting in ("| engine | hf |", "| temperature | 1.0 |", "| k | 3 |", "| max_new_tokens | 40 |"):
        assert setting in head  # the settings come first


def test_the_runs_model_on_another_benchmark_says_so(tiny_run, tmp_path):
    from adora_openrlhf.tasks.kk import generate_rows

    _, out, _ = tiny_run
    bench_file = tmp_path / "kk.jsonl"
    # Logic-RL format, 4 people, other names
    bench_file.write_text("".join(json.dumps(r) + "\n" for r in generate_rows(3, [4], seed=3)))
    argv = [
        "--model",
        str(out / "final_model"),
        "--bench",
        "kk",
        "--bench-file",
        f"kk={bench_file}",
        "--k",
        "1",
        "--temperature",
        "0",
    ]
    assert main([*argv, "--engine", "hf", "--out", str(tmp_path / "e")]) == 0
    notes = json.loads((tmp_path / "e" / "report.json").read_text())["fit_notes"]
    assert any(f"trained by the local run {out}" in n and f"python -m eval.run --run {out}" in n for n in notes), notes
    assert any("leaves out the system message of 3 of 3 prompts" in n for n in notes), notes
    assert all(n.startswith("kk: ") for n in notes)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--bench", "kk"], "--bench: not used with --run"),
        (["--bench-file", "kk=x.jsonl"], "--bench-file: not used with --run"),
    ],
)
def test_run_flag_errors(tiny_run, extra, message, capsys):
    _, out, _ = tiny_run
    assert main(["--run", str(out), *extra]) == 2
    assert message in capsys.readouterr().err


def test_a_directory_without_a_saved_heldout_set_is_refused(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    assert main(["--run", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--run:" in err and "heldout.json" in err and "Traceback" not in err
    assert main(["--bench", "kk"]) == 2 and "--model: required" in capsys.readouterr().err


SETTINGS = {  # the fields of heldout.json that --run reads, as the trainer writes them
    "prompt_template": "auto",
    "rollout": {"max_new_tokens": 8, "repetition_penalty": 1.0},
    "generation_batch_size": 4,
    "numerics": "exact",
    "rows_sha256": hashlib.sha256(b"").hexdigest(),
    "plugins": [],
}
SETTINGS_READ = [
    "prompt_template",
    "rollout.max_new_tokens",
    "rollout.repetition_penalty",
    "generation_batch_size",
    "numerics",
    "rows_sha256",
    "plugins",
]


@pytest.mark.parametrize(
    "field, value",
    [
        ("rollout.repetition_penalty", "high"),
        ("rollout.max_new_tokens", 0),
        ("rollout.max_new_tokens", [8]),  # a list where a number belongs: named as such, not as a missing field
        ("rollout.max_new_tokens", "8"),
        ("generation_batch_size", "128"),
        ("prompt_template", 3),
        ("numerics", "quick"),
        ("rows_sha256", None),
        ("plugins", "mine"),
    ],
)
def test_a_heldout_json_field_of_the_wrong_type_is_named_with_the_file(tmp_path, field, value, capsys):
    run = tmp_path / "run"
    run.mkdir()
    settings = json.loads(json.dumps(SETTINGS))
    section, _, key = field.rpartition(".")
    (settings[section] if section else settings)[key] = value
    (run / "heldout.json").write_text(json.dumps(settings))
    (run / "heldout.jsonl").write_text("")
    assert main(["--run", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{run / 'heldout.json'}: field {field} must be" in err and repr(value) in err


@pytest.mark.parametrize("field", [*SETTINGS_READ])
def test_a_heldout_json_without_a_field_the_trainer_writes_is_refused_naming_it(tmp_path, field, capsys):
    from adora_openrlhf.evaluation.runs import open_run, rows_changed

    run = tmp_path / "run"
    run.mkdir()
    settings = json.loads(json.dumps(SETTINGS))
    (run / "heldout.json").write_text(json.dumps(settings))
    (run / "heldout.jsonl").write_text("")
    assert rows_changed(open_run(run)) is None  # every field present: the run opens
    section, _, key = field.rpartition(".")
    del (settings[section] if section else settings)[key]
    (run / "heldout.json").write_text(json.dumps(settings))
    assert main(["--run", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{run / 'heldout.json'}: field {field} is missing; train the run again" in err


def test_rows_edited_after_training_are_not_set_against_the_trainers_number(tiny_run, tmp_path, capsys):
    import shutil

    _, out, _ = tiny_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("eval"))
    rows = [json.loads(line) for line in (copy / "heldout.jsonl").read_text().splitlines()]
    rows = rows[1:] + rows[:1]  # the same rows in another order: another file
    (copy / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert (
        main(["--run", str(copy), "--temperature", "0", "--k", "1", "--engine", "hf", "--out", str(tmp_path / "ev")])
        == 0
    )
    printed = capsys.readouterr()
    text = printed.out + printed.err
    assert "not comparable: " in text and "changed after training" in text and "equal, as it must be" not in text
