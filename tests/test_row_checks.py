"""Rows are checked whole at load time, before a run writes anything: K&K labels against the prompt's names and
``meta.statements``, the meta fields the math and visual rewards read, images decoded (relative paths from the
data file's folder); a vision row is identified by its prompt and the content of its images."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from adora_openrlhf.config import ConfigError, DataConfig
from adora_openrlhf.data_prep import geo_synth as geo_synth_files
from adora_openrlhf.rows import image_digest, load_run_rows, row_key, rows_fingerprint, validate_rows
from adora_openrlhf.tasks import geo_synth
from adora_openrlhf.tasks.kk import generate_rows as kk_rows

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from tiny_runs import TINY_KK, tiny_kk_config

KK_PROMPT = "Knights always tell the truth and knaves always lie. You meet 2 inhabitants: Alice and Bob."
ALICE_BOB = "(1) Alice is a knight\n(2) Bob is a knave"


def _one(row, source="kk"):
    return validate_rows([row], "f.jsonl", source, lines=[3])


def _refused(row, needle, source="kk"):
    with pytest.raises(ConfigError) as err:
        _one(row, source)
    assert str(err.value).startswith("f.jsonl:3: field "), str(err.value)
    assert needle in str(err.value), str(err.value)
    return str(err.value)


# ---------------------------------------------------------------------------------------------------------
# K&K labels
# ---------------------------------------------------------------------------------------------------------

# Alice says "Bob is a knave", Bob says "Alice is a knave": solutions (knight, knave) and (knave, knight)
STATEMENTS = [["lying", 1], ["lying", 0]]


@pytest.mark.parametrize(
    "row, needle",
    [
        (
            {"prompt": "You meet Alice and Dave.", "label": ALICE_BOB},
            "field 'label': names ['Bob'], whom the prompt does not mention",
        ),
        (
            {
                "prompt": [{"role": "system", "content": ALICE_BOB}, {"role": "user", "content": "You meet Carol."}],
                "label": ALICE_BOB,
            },
            "names ['Alice', 'Bob']",
        ),
        ({"prompt": "Alicebob and Bobby.", "label": ALICE_BOB}, "names ['Alice', 'Bob']"),  # whole names only
        (
            {"prompt": KK_PROMPT, "label": ALICE_BOB, "meta": {"names": ["Alice", "Carol"]}},
            "field 'label': the 'kk' reward cannot parse it",
        ),
        (
            {
                "prompt": KK_PROMPT + " Carol",
                "label": ALICE_BOB + "\n(3) Carol is a knave",
                "meta": {"names": ["Alice", "Bob"]},
            },
            "gives roles to ['Carol']",
        ),
        (
            {"prompt": KK_PROMPT, "label": ALICE_BOB, "meta": {"names": ["Alice", "Alice"]}},
            "field 'meta.names': expected a list of distinct names",
        ),
        ({"prompt": KK_PROMPT, "label": ALICE_BOB, "meta": {"names": "Alice,Bob"}}, "field 'meta.names'"),
        (
            {"prompt": KK_PROMPT, "label": ALICE_BOB, "meta": {"num_people": 3}},
            "field 'meta.num_people': 3, but the label has 2 people",
        ),
        (
            {"prompt": KK_PROMPT, "label": ALICE_BOB, "meta": {"solution": [False, True]}},
            "field 'meta.solution': [False, True] disagrees with the label",
        ),
        (
            {"prompt": KK_PROMPT, "label": ALICE_BOB, "meta": {"solution": [1, 0]}},
            "field 'meta.solution': expected 2 booleans",
        ),
        (
            {
                "prompt": KK_PROMPT,
                "label": "(1) Alice is a knight\n(2) Bob is a knight",
                "meta": {"statements": STATEMENTS},
            },
            "field 'label': contradicts meta.statements: under its roles Alice (knight) says something false; Bob (knight) says something false",
        ),
        (
            {"prompt": KK_PROMPT, "label": ALICE_BOB, "meta": {"statements": [["lying", 1]]}},
            "field 'meta.statements': expected one statement per person (2)",
        ),
        (
            {"prompt": KK_PROMPT, "label": ALICE_BOB, "meta": {"statements": [["lying", 5], ["lying", 0]]}},
            "field 'meta.statements': not a statement list",
        ),
        (
            {"prompt": KK_PROMPT, "label": ALICE_BOB, "meta": {"statements": [["maybe", 1], ["lying", 0]]}},
            "unknown operator 'maybe'",
        ),
        (
            {"prompt": KK_PROMPT, "label": ALICE_BOB, "meta": {"kk_parser": "strict"}},
            "field 'meta.kk_parser': unknown K&K answer parser 'strict'",
        ),
        (
            {"prompt": KK_PROMPT, "label": ALICE_BOB, "meta": {"think_opened_in_prompt": "false"}},
            "field 'meta.think_opened_in_prompt': expected true or false",
        ),
    ],
)
def test_kk_labels_that_do_not_grade_the_prompts_puzzle_are_refused(row, needle):
    _refused({"source": "kk", **row}, needle)


def test_kk_labels_consistent_with_the_puzzle_pass():
    for label in (ALICE_BOB, "(1) Alice is a knave\n(2) Bob is a knight"):  # both solutions of STATEMENTS
        (row,) = _one(
            {"prompt": KK_PROMPT, "label": label, "meta": {"names": ["Alice", "Bob"], "statements": STATEMENTS}}
        )
        assert row.label == label
    _one(
        {
            "prompt": [{"role": "user", "content": KK_PROMPT}],
            "label": "Alice: knight. Bob: knave.",
            "meta": {"names": ["Alice", "Bob"]},
        }
    )


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), people=st.integers(2, 5), data=st.data())
def test_property_generated_puzzles_pass_and_any_other_roles_are_refused(seed, people, data):
    """Property: a generated puzzle's row passes; flipping any set of roles in its label (and solution) is refused,
    because a generated puzzle has exactly one consistent assignment."""
    (row,) = kk_rows(1, [people], seed)
    _one(row)
    flips = data.draw(st.sets(st.integers(0, people - 1), min_size=1))
    roles = [not r if i in flips else r for i, r in enumerate(row["meta"]["solution"])]
    label = "\n".join(
        f"({i + 1}) {n} is a {'knight' if r else 'knave'}"
        for i, (n, r) in enumerate(zip(row["meta"]["names"], roles, strict=True))
    )
    _refused(
        {**row, "label": label, "meta": {**row["meta"], "solution": roles}},
        "field 'label': contradicts meta.statements",
    )


# ---------------------------------------------------------------------------------------------------------
# math and visual rows: the meta their rewards read
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "meta, needle",
    [
        ({"reward_style": "dapo2"}, "field 'meta.reward_style': expected one of ["),
        ({"reward_style": None}, "field 'meta.reward_style'"),
        ({"answer_scope": "final"}, "field 'meta.answer_scope': expected one of ["),
        ({"grader_timeout_s": "1"}, "field 'meta.grader_timeout_s': must be a finite number of seconds > 0, got '1'"),
        ({"grader_timeout_s": 0}, "field 'meta.grader_timeout_s'"),
        ({"grader_timeout_s": -2.5}, "field 'meta.grader_timeout_s'"),
        ({"grader_timeout_s": float("nan")}, "field 'meta.grader_timeout_s'"),
        ({"grader_timeout_s": float("inf")}, "field 'meta.grader_timeout_s'"),
        ({"grader_timeout_s": True}, "field 'meta.grader_timeout_s'"),
        ({"grader_timeout_s": None}, "field 'meta.grader_timeout_s'"),
    ],
)
@pytest.mark.parametrize("source", ["dapo_math", "math500", "aime24"])
def test_math_meta_is_checked_at_load(meta, needle, source):
    _refused({"prompt": "1+1?", "label": "2", "meta": meta}, needle, source)


def test_good_math_meta_passes():
    for meta in (
        {},
        {"reward_style": "dapo", "answer_scope": "whole", "grader_timeout_s": 2},
        {"grader_timeout_s": 0.5},
    ):
        _one({"prompt": "1+1?", "label": "2", "meta": meta}, "dapo_math")


@pytest.mark.parametrize(
    "meta, label, needle",
    [
        (
            {"question_type": "mc"},
            "2",
            "field 'meta.question_type': expected one of ['free_form', 'multi_choice'], got 'mc'",
        ),
        ({"answer_type": "number"}, "2", "field 'meta.answer_type'"),
        ({"choices": "A,B"}, "2", "field 'meta.choices': expected a list of option texts"),
        (
            {"question_type": "multi_choice", "choices": ["red", "blue"]},
            "green",
            "field 'label': 'green' is none of meta.choices ['red', 'blue']",
        ),
        ({"answer_type": "float", "precision": -1}, "2.5", "field 'meta.precision'"),
        ({"answer_type": "float", "precision": 1.5}, "2.5", "field 'meta.precision'"),
        ({"answer_type": "float", "precision": "2"}, "2.5", "field 'meta.precision'"),
        (
            {"answer_type": "integer"},
            "five",
            "field 'label': 'five' holds no number, but meta.answer_type is 'integer'",
        ),
        ({"think_opened_in_prompt": 1}, "2", "field 'meta.think_opened_in_prompt'"),
    ],
)
@pytest.mark.parametrize("source", ["geometry3k", "mathvista", "geo_synth"])
def test_visual_meta_is_checked_at_load(meta, label, needle, source):
    _refused({"prompt": "What is x?", "label": label, "meta": meta}, needle, source)


def test_good_visual_meta_passes():
    # a letter names an option
    _one({"prompt": "x?", "label": "B", "meta": {"question_type": "multi_choice", "choices": ["1", "2"]}}, "mathvista")
    _one({"prompt": "x?", "label": "2.50", "meta": {"answer_type": "float", "precision": 2.0}}, "mathvista")
    for raw in geo_synth.generate_rows(8, 0):
        _one(raw, "geo_synth")


def test_bad_meta_with_overwrite_leaves_the_previous_run(tmp_path, capsys):
    """The meta of every row is validated before --overwrite clears anything (it used to fail at the first scoring)."""
    from adora_openrlhf import train as train_cli

    out = tmp_path / "run"
    (out / "checkpoints" / "step_000003").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 3}\n')
    data = tmp_path / "math.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": f"{i}+1?", "label": str(i + 1), "source": "dapo_math", "meta": m}) + "\n"
            for i, m in enumerate([{}, {"answer_scope": "last"}])
        )
    )
    before = sorted((str(p), p.stat().st_mtime_ns) for p in out.rglob("*"))
    argv = [
        "--recipe",
        "kk-tiny",
        "--output-dir",
        str(out),
        "--overwrite",
        "--data.train_path",
        str(data),
        "--data.task",
        "math",
    ]
    with pytest.raises(SystemExit) as exit_:
        train_cli.main(argv)
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"error: {data}:2: field 'meta.answer_scope': expected one of ['after_think', 'whole'], got 'last'"
    assert sorted((str(p), p.stat().st_mtime_ns) for p in out.rglob("*")) == before


def test_a_row_without_a_demonstration_is_named_before_anything_is_written(tmp_path):
    """With --model and a warm-up, each row's demonstration is built before the run directory is touched."""
    from adora_openrlhf.backends.local.trainer import train
    from adora_openrlhf.recipes import build_run_config

    model_run = tmp_path / "model_run"
    train(tiny_kk_config(model_run, steps=1))
    data = tmp_path / "math.jsonl"
    rows = [
        {"prompt": "Alice? 1+1", "label": "2", "source": "dapo_math", "meta": {"solution_text": "<answer>2</answer>"}}
    ] * 2
    data.write_text(
        "".join(json.dumps(r) + "\n" for r in [rows[0], {"prompt": "2+2?", "label": "4", "source": "dapo_math"}, *rows])
    )
    out = tmp_path / "run"
    cfg = build_run_config(
        "kk-tiny",
        {
            **TINY_KK,
            "warmup.steps": 2,
            "output_dir": str(out),
            "model.path": str(model_run / "final_model"),
            "data.train_path": str(data),
        },
    )
    with pytest.raises(ConfigError, match=rf"^{data}:2: warmup.steps: no demonstration for rows of source 'dapo_math'"):
        train(cfg)
    assert not out.exists()


# ---------------------------------------------------------------------------------------------------------
# images: identity, relative paths, damaged files
# ---------------------------------------------------------------------------------------------------------


def _png(path, colour, size=(16, 16)):
    Image.new("RGB", size, colour).save(path)
    return path


def test_image_rows_are_identified_by_prompt_and_image_content(tmp_path):
    a, b, a_copy = _png(tmp_path / "a.png", "red"), _png(tmp_path / "b.png", "blue"), _png(tmp_path / "a2.png", "red")
    rows = validate_rows(
        [
            {"prompt": "<image>How many?", "label": "1", "images": [p]}
            for p in (str(a), str(b), str(a_copy), Image.new("RGB", (16, 16), "red"))
        ],
        "f.jsonl",
        "geo_synth",
    )
    keys = [row_key(r) for r in rows]
    assert keys[0] != keys[1]  # same prompt, other picture: another problem
    assert keys[0] == keys[2] == keys[3]  # same picture in another file or in memory: the same problem
    # text rows: as before
    assert row_key(validate_rows([{"prompt": "Alice?", "label": ALICE_BOB.split("\n")[0]}], "f", "kk")[0]) == repr(
        "Alice?"
    )


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 1000))
def test_property_image_digest_is_the_pixels(tmp_path, seed):
    """Property: the digest of a generated image equals that of its PNG file, and two images differ in digest
    exactly when their pixels differ."""
    first, second = (r["images"][0] for r in geo_synth.generate_rows(2, seed))
    path = tmp_path / f"{seed}.png"
    first.save(path)
    assert image_digest(first) == image_digest(str(path))
    assert (image_digest(first) == image_digest(second)) == (
        first.convert("RGB").tobytes() == second.convert("RGB").tobytes()
    )


@pytest.mark.parametrize("num_train, num_eval", [(40, 8), (6, 2)])
def test_the_documented_geo_synth_file_workflow_trains_and_keeps_every_held_out_row(
    tmp_path, monkeypatch, num_train, num_eval
):
    """``python -m data_prep.geo_synth --out DIR`` then --data.train_path/eval_path: the prompts repeat (a few
    question templates) but the images differ, so no held-out row is dropped and nothing is refused."""
    monkeypatch.chdir(tmp_path)
    assert (
        geo_synth_files.main(
            ["--out", "data/geo", "--num-train", str(num_train), "--num-eval", str(num_eval), "--seed", "0"]
        )
        == 0
    )
    cfg = DataConfig(
        task="geometry", train_path="data/geo/train.jsonl", eval_path="data/geo/test.jsonl", num_eval=num_eval
    )
    train, held = load_run_rows(cfg, seed=0)
    assert len(train) == num_train and len(held) == num_eval
    assert num_train < 10 or {r.prompt for r in held} & {r.prompt for r in train}  # shared prompt texts ...
    assert not {row_key(r) for r in held} & {row_key(r) for r in train}  # ... of different problems
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the file works from any directory
    assert (
        len(
            load_run_rows(
                DataConfig(task="geometry", train_path=str(tmp_path / "data/geo/train.jsonl"), num_eval=2), seed=0
            )[1]
        )
        == 2
    )


def test_a_true_duplicate_image_row_is_still_dropped_from_the_held_out_rows(tmp_path, caplog):
    red, blue = _png(tmp_path / "r.png", "red"), _png(tmp_path / "b.png", "blue")
    row = {"prompt": "<image>Colour?", "label": "red", "source": "geo_synth"}
    train_file, eval_file = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    train_file.write_text("".join(json.dumps({**row, "images": [str(p)]}) + "\n" for p in (red, blue)))
    eval_file.write_text(
        json.dumps({**row, "images": [str(red)]})
        + "\n"
        + json.dumps({**row, "images": [str(_png(tmp_path / "g.png", "green"))]})
        + "\n"
    )
    train, held = load_run_rows(
        DataConfig(task="geometry", train_path=str(train_file), eval_path=str(eval_file)), seed=0
    )
    assert [r.images for r in held] == [(str(tmp_path / "g.png"),)]
    assert "dropped 1 held-out rows that are also training rows (same prompt and images)" in caplog.text


def test_relative_image_paths_resolve_against_the_data_files_folder(tmp_path, monkeypatch):
    folder = tmp_path / "data" / "set"
    (folder / "img").mkdir(parents=True)
    _png(folder / "img" / "a.png", "red")
    data = folder / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {"prompt": f"<image>Colour {i}?", "label": "red", "source": "geo_synth", "images": ["img/a.png"]}
            )
            + "\n"
            for i in range(4)
        )
    )
    for cwd in (tmp_path, folder / "img"):
        monkeypatch.chdir(cwd)
        train, _ = load_run_rows(DataConfig(task="geometry", train_path=os.path.relpath(data, cwd), num_eval=1), seed=0)
        assert train[0].images == (str(folder.resolve() / "img" / "a.png"),)
    moved = tmp_path / "moved"
    shutil.move(str(folder), str(moved))  # the folder moves with its images
    moved_rows, _ = load_run_rows(
        DataConfig(task="geometry", train_path=str(moved / "train.jsonl"), num_eval=1), seed=0
    )
    assert moved_rows[0].images[0].startswith(str(moved.resolve()))
    (moved / "img" / "a.png").unlink()
    missing = rf"{moved}/train.jsonl:1: field 'images\[0\]': no image file at '{moved.resolve()}/img/a.png'"
    with pytest.raises(ConfigError, match=missing + r" \(a relative path is read from the data file's folder\)"):
        load_run_rows(DataConfig(task="geometry", train_path=str(moved / "train.jsonl"), num_eval=1), seed=0)


@pytest.mark.parametrize(
    "damage, needle",
    [
        (lambda raw: raw[: len(raw) - 30], "cannot be decoded"),
        (lambda raw: raw[:40], "cannot be decoded"),
        (lambda raw: b"not a png at all", "cannot be decoded"),
        (lambda raw: b"", "cannot be decoded"),
    ],
)
def test_a_damaged_image_names_the_file_line_and_field(tmp_path, damage, needle):
    image = Image.effect_noise((64, 64), 50).convert("RGB")
    good, bad = tmp_path / "good.png", tmp_path / "bad.png"
    image.save(good)
    bad.write_bytes(damage(good.read_bytes()))
    data = tmp_path / "rows.jsonl"
    data.write_text(
        "\n".join(
            json.dumps({"prompt": "<image>x?", "label": "1", "source": "geo_synth", "images": [p]})
            for p in ("good.png", "good.png", "bad.png")
        )
        + "\n"
    )
    with pytest.raises(ConfigError) as err:
        load_run_rows(DataConfig(task="geometry", train_path=str(data), num_eval=1), seed=0)
    message = str(err.value)
    assert message.startswith(f"{data}:3: field 'images[0]': the image file '{bad}' {needle} (") and message.endswith(
        "it is damaged or not an image: replace it"
    )


def test_vision_encoding_errors_name_file_lines(tmp_path):
    from adora_openrlhf.config import TinyVisionConfig
    from adora_openrlhf.engine import vlm
    from adora_openrlhf.engine.tokenization import train_bpe_tokenizer

    processor = vlm.build_tiny_processor(
        train_bpe_tokenizer(["a b c"], 300),
        TinyVisionConfig(image_size=32, depth=1, hidden_size=16, intermediate_size=32),
    )
    red = _png(tmp_path / "r.png", "red")
    text = vlm.render_vlm_prompt("<image>x?", processor, "compact")
    with pytest.raises(ConfigError, match=r"^train.jsonl:7: field 'images': 2 image\(s\) for 1 image slot"):
        vlm.encode_vlm_prompts(
            processor, [text, text], [[str(red)], [str(red)] * 2], 256, ["train.jsonl:5", "train.jsonl:7"]
        )
    with pytest.raises(
        ConfigError,
        match=r"^eval:2: field 'prompt': \d+ tokens \(image tokens included\), more than data.max_prompt_tokens=3",
    ):
        vlm.encode_vlm_prompts(processor, ["x\n", text], [[], [str(red)]], 3, "eval")
    Image.effect_noise((32, 32), 50).convert("RGB").save(tmp_path / "noise.png")
    (tmp_path / "t.png").write_bytes((tmp_path / "noise.png").read_bytes()[:500])
    with pytest.raises(
        ConfigError, match=r"^f.jsonl:1: field 'images\[0\]': the image file .*t.png' cannot be decoded"
    ):
        vlm.encode_vlm_prompts(processor, [text], [[str(tmp_path / "t.png")]], 256, ["f.jsonl:1"])


def test_rows_fingerprint_hand_case():
    """Same rows, same fingerprint; any label, meta or order change, another one."""
    rows = validate_rows(
        [{"prompt": KK_PROMPT, "label": ALICE_BOB}, {"prompt": KK_PROMPT + " ", "label": ALICE_BOB}], "f", "kk"
    )
    again = validate_rows(
        [{"label": ALICE_BOB, "prompt": KK_PROMPT}, {"prompt": KK_PROMPT + " ", "label": ALICE_BOB}], "g", "kk"
    )
    assert rows_fingerprint(rows) == rows_fingerprint(again) and rows_fingerprint(rows)["rows"] == 2
    assert rows_fingerprint(rows) != rows_fingerprint(rows[::-1])
    changed = validate_rows(
        [
            {"prompt": KK_PROMPT, "label": ALICE_BOB, "meta": {"id": "1"}},
            {"prompt": KK_PROMPT + " ", "label": ALICE_BOB},
        ],
        "f",
        "kk",
    )
    assert rows_fingerprint(changed) != rows_fingerprint(rows)
