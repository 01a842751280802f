"""Dataset converters on small local files read through ``datasets.load_dataset`` (no network)."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from PIL import Image

from adora_openrlhf.data_prep import dapo_math, geometry3k, math_eval, mathvista
from adora_openrlhf.data_prep.common import RowError, answer_text, last_boxed, load_split_rows


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _image(color=(255, 0, 0)) -> Image.Image:
    return Image.new("RGB", (8, 6), color)


# ---------------------------------------------------------------- helpers


def test_helpers(tmp_path):
    assert answer_text(27.0) == "27" and answer_text(3) == "3" and answer_text(" 1/2 ") == "1/2"
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("no box") is None
    odd = tmp_path / "rows.xyz"
    odd.write_text("{}")
    with pytest.raises(ValueError, match="--dataset: unsupported file type"):
        load_split_rows(str(odd), "train")


# ---------------------------------------------------------------- DAPO-Math

DAPO_PROMPT = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\nWhat is 2+3?\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


def _dapo_row(truth="5", index="a1", prompt=DAPO_PROMPT):
    return {
        "data_source": "math_dapo",
        "prompt": [{"content": prompt, "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": truth, "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": index},
    }


def test_dapo_converter_parquet_dedup_and_rejects(tmp_path, capsys):
    rows = [
        _dapo_row(),
        _dapo_row(),
        _dapo_row("7", "b2", DAPO_PROMPT.replace("2+3", "3+4")),
        {"prompt": [{"content": "x", "role": "user"}], "reward_model": {"ground_truth": "", "style": "rule"}},
        {"prompt": "", "reward_model": {"ground_truth": "1", "style": "rule"}},
    ]
    src = tmp_path / "dapo.jsonl"
    _jsonl(src, rows)
    assert dapo_math.main(["--out", str(tmp_path / "out"), "--dataset", str(src)]) == 0
    out = _read(tmp_path / "out" / "train.jsonl")
    assert [r["label"] for r in out] == ["5", "7"]
    assert out[0]["source"] == "dapo_math"
    assert out[0]["meta"] == {"reward_style": "dapo", "index": "a1", "data_source": "math_dapo"}
    assert out[0]["prompt"] == [{"role": "user", "content": DAPO_PROMPT}]
    assert json.loads(out[0]["reward_label"]) == {"source": "dapo_math", "label": "5", "meta": out[0]["meta"]}
    captured = capsys.readouterr()
    assert "wrote 2 rows" in captured.err and "rejected 2 malformed rows" in captured.err  # log lines go to stderr
    assert "dropped 1 duplicates" in captured.err
    assert f"{src}:4: field 'reward_model.ground_truth'" in captured.err and f"{src}:5: field 'prompt'" in captured.err


def test_dapo_row_errors_name_row_and_field():
    with pytest.raises(RowError, match=r"row 3: field 'prompt\[0\]'"):
        dapo_math.convert_dapo_row({"prompt": [{"text": "x"}], "reward_model": {"ground_truth": "1"}}, 3)


def test_dapo_converter_reads_parquet(tmp_path):
    src = tmp_path / "dapo.parquet"
    datasets.Dataset.from_list([_dapo_row(), _dapo_row("9", "c", "Another?")]).to_parquet(str(src))
    assert dapo_math.main(["--out", str(tmp_path / "o"), "--dataset", str(src), "--reward-style", "math_verify"]) == 0
    out = _read(tmp_path / "o" / "train.jsonl")
    assert [r["meta"]["reward_style"] for r in out] == ["math_verify"] * 2


# ---------------------------------------------------------------- math eval sets


def test_math_eval_field_variants(tmp_path, capsys):
    rows = [
        {
            "problem": "What is 1/2+1/2?",
            "solution": "...",
            "answer": "1",
            "subject": "Algebra",
            "level": 1,
            "unique_id": "u1",
        },
        {"question": "AMC question", "answer": 27.0, "id": 3, "url": "https://x"},  # amc23-style float answer
        {"problem": "AIME style", "solution": "so the answer is \\boxed{204}.", "id": 60},  # answer only in solution
        {"problem": "no answer here", "solution": "none"},
        {"answer": "3"},
    ]
    src = _jsonl(tmp_path / "eval.jsonl", rows)
    assert math_eval.main(["--out", str(tmp_path / "out"), "--benchmark", "aime24", "--dataset", str(src)]) == 0
    out = _read(tmp_path / "out" / "aime24.jsonl")
    assert [r["label"] for r in out] == ["1", "27", "204"]
    assert all(r["source"] == "aime24" and r["meta"]["reward_style"] == "math_verify" for r in out)
    assert out[0]["meta"]["subject"] == "Algebra" and out[0]["meta"]["unique_id"] == "u1"
    assert out[0]["prompt"][0]["content"].endswith(math_eval.BOXED_INSTRUCTION)
    err = capsys.readouterr().err
    assert ":4: field 'answer'" in err and ":5: field 'problem'" in err


def test_math_eval_benchmarks_registry():
    assert set(math_eval.BENCHMARKS) == {"math500", "aime24", "aime25", "amc23"}
    assert math_eval.BENCHMARKS["math500"].dataset == "HuggingFaceH4/MATH-500"


def test_math_eval_rows_grade_with_their_reward(tmp_path):
    from adora_openrlhf.rewards.base import get_reward_fn

    row = math_eval.convert_math_row({"problem": "p", "answer": "\\frac{1}{2}"}, 1, "math500")
    fn = get_reward_fn(row["source"])
    assert fn("<think>..</think> so \\boxed{0.5}", row["label"], row["meta"]).correct


# ---------------------------------------------------------------- Geometry3K


def test_geometry3k_parquet_with_images(tmp_path, capsys):
    features = datasets.Features(
        {
            "images": datasets.Sequence(datasets.Image()),
            "problem": datasets.Value("string"),
            "answer": datasets.Value("string"),
            "id": datasets.Value("int64"),
            "choices": datasets.Sequence(datasets.Value("string")),
            "ground_truth": datasets.Value("string"),
        }
    )
    data = {
        "images": [[_image()], [_image((0, 255, 0))], []],
        "problem": ["<image>Find x.", "Find the area.", "Find y."],
        "answer": ["3", "2\\sqrt{3}", "4"],
        "id": [10, 11, 12],
        "choices": [["1", "3", "5", "7"], ["2\\sqrt{3}", "4", "6", "8"], ["1", "2", "3", "4"]],
        "ground_truth": ["B", "A", "D"],
    }
    src = tmp_path / "geo.parquet"
    datasets.Dataset.from_dict(data, features=features).to_parquet(str(src))
    assert geometry3k.main(["--out", str(tmp_path / "out"), "--dataset", str(src)]) == 0
    out = _read(tmp_path / "out" / "train.jsonl")
    assert len(out) == 2
    first = out[0]
    assert first["source"] == "geometry3k" and first["label"] == "3"
    assert first["prompt"][0]["content"].startswith("<image>Find x.")
    assert out[1]["prompt"][0]["content"].startswith("<image>Find the area.")  # tag added
    assert first["meta"] == {
        "question_type": "free_form",
        "choices": ["1", "3", "5", "7"],
        "answer_letter": "B",
        "id": 10,
    }
    for row in out:
        assert len(row["images"]) == 1 and Path(row["images"][0]).is_file()
        assert Image.open(row["images"][0]).size == (8, 6)
    assert ":3: field 'images'" in capsys.readouterr().err


def test_geometry3k_jsonl_relative_paths_and_bad_image(tmp_path):
    (tmp_path / "img").mkdir()
    _image().save(tmp_path / "img" / "a.png")
    (tmp_path / "img" / "broken.png").write_bytes(b"not a png")
    rows = [
        {"images": ["img/a.png"], "problem": "Find x.", "answer": "3"},
        {"images": ["img/broken.png"], "problem": "Find x.", "answer": "3"},
        {"images": ["img/a.png"], "problem": "Find x.", "answer": ""},
    ]
    src = _jsonl(tmp_path / "geo.jsonl", rows)
    raw = load_split_rows(str(src), "train")
    ok = geometry3k.convert_geometry_row(raw[0], 1, tmp_path / "out", base_dir=tmp_path)
    assert Path(ok["images"][0]).is_file() and ok["meta"]["id"] == 1
    with pytest.raises(RowError, match=r"row 2: field 'images\[0\]': cannot read the image"):
        geometry3k.convert_geometry_row(raw[1], 2, tmp_path / "out", base_dir=tmp_path)
    with pytest.raises(RowError, match=r"row 3: field 'answer'"):
        geometry3k.convert_geometry_row(raw[2], 3, tmp_path / "out", base_dir=tmp_path)


# ---------------------------------------------------------------- MathVista


def _mathvista_rows():
    return [
        {
            "pid": "1",
            "question": "Which bar is tallest?",
            "image": "images/1.png",
            "choices": ["red", "blue"],
            "unit": None,
            "precision": None,
            "answer": "blue",
            "question_type": "multi_choice",
            "answer_type": "text",
            "metadata": {"category": "math-targeted-vqa", "task": "figure question answering"},
            "query": "Hint: Please answer the question and provide the correct option letter.\nQuestion: Which bar?\nChoices:\n(A) red\n(B) blue",
        },
        {
            "pid": "2",
            "question": "What is the length?",
            "image": "images/2.png",
            "choices": None,
            "unit": "cm",
            "precision": 1.0,
            "answer": "1.2",
            "question_type": "free_form",
            "answer_type": "float",
            "metadata": {},
            "query": None,
        },
        {
            "pid": "3",
            "question": "Pick one",
            "image": "images/1.png",
            "choices": ["a", "b"],
            "precision": None,
            "answer": "c",
            "question_type": "multi_choice",
            "answer_type": "text",
        },
        {
            "pid": "4",
            "question": "How many?",
            "image": "images/1.png",
            "answer": "2",
            "question_type": "free_form",
            "answer_type": "number",
        },
        {
            "pid": "5",
            "question": "Float?",
            "image": "images/1.png",
            "answer": "2.5",
            "question_type": "free_form",
            "answer_type": "float",
            "precision": None,
        },
    ]


def test_mathvista_jsonl(tmp_path, capsys):
    (tmp_path / "images").mkdir()
    _image().save(tmp_path / "images" / "1.png")
    _image((0, 0, 255)).save(tmp_path / "images" / "2.png")
    src = _jsonl(tmp_path / "testmini.jsonl", _mathvista_rows())
    assert mathvista.main(["--out", str(tmp_path / "out"), "--dataset", str(src)]) == 0
    out = _read(tmp_path / "out" / "testmini.jsonl")
    assert [r["meta"]["pid"] for r in out] == ["1", "2"]
    mc, fl = out
    assert mc["meta"]["question_type"] == "multi_choice" and mc["meta"]["choices"] == ["red", "blue"]
    assert mc["prompt"][0]["content"].startswith("<image>Hint:")
    assert fl["meta"]["precision"] == 1 and fl["meta"]["unit"] == "cm"
    assert "Question" not in fl["prompt"][0]["content"] and "What is the length?" in fl["prompt"][0]["content"]
    assert all(Path(r["images"][0]).is_file() for r in out)
    err = capsys.readouterr().err
    assert ":3: field 'answer'" in err and ":4: field 'answer_type'" in err and ":5: field 'precision'" in err

    from adora_openrlhf.rewards.base import get_reward_fn

    fn = get_reward_fn("mathvista")
    assert fn("<think>r</think>\\boxed{B}", mc["label"], mc["meta"]).correct
    assert fn("<think>r</think>\\boxed{1.24}", fl["label"], fl["meta"]).correct


def test_mathvista_decoded_image_from_parquet(tmp_path):
    features = datasets.Features(
        {
            "pid": datasets.Value("string"),
            "question": datasets.Value("string"),
            "decoded_image": datasets.Image(),
            "choices": datasets.Sequence(datasets.Value("string")),
            "precision": datasets.Value("float64"),
            "answer": datasets.Value("string"),
            "question_type": datasets.Value("string"),
            "answer_type": datasets.Value("string"),
        }
    )
    data = {
        "pid": ["7"],
        "question": ["How many?"],
        "decoded_image": [_image()],
        "choices": [None],
        "precision": [None],
        "answer": ["3"],
        "question_type": ["free_form"],
        "answer_type": ["integer"],
    }
    src = tmp_path / "mv.parquet"
    datasets.Dataset.from_dict(data, features=features).to_parquet(str(src))
    raw = load_split_rows(str(src), "testmini")
    row = mathvista.convert_mathvista_row(raw[0], 1, tmp_path / "imgs")
    assert row["label"] == "3" and Path(row["images"][0]).name == "7.png"


def test_load_error_names_the_dataset_and_split(tmp_path, capsys):
    folder = tmp_path / "local_ds"
    folder.mkdir()
    _jsonl(folder / "train.jsonl", [{"problem": "p", "answer": "1"}])
    assert len(load_split_rows(str(folder), "train")) == 1
    argv = ["--out", str(tmp_path / "o"), "--benchmark", "amc23", "--dataset", str(folder), "--split", "nope"]
    assert math_eval.main(argv) == 2
    assert "split 'nope'" in capsys.readouterr().err
