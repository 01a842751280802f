"""The one row loader (adora_openrlhf.datafiles.load_rows) behind the trainer, eval.run and data_prep."""

from __future__ import annotations

import json

import datasets
import pytest

from adora_openrlhf.config import ConfigError, DataConfig
from adora_openrlhf.datafiles import DataFileError, load_rows

ROWS = [
    {"question": "What is 2+3?", "answer": "5", "source": "dapo_math"},
    {"question": "What is 1+1?", "answer": "2", "source": "dapo_math"},
]


def write(tmp_path, suffix: str):
    path = tmp_path / f"rows{suffix}"
    if suffix == ".jsonl":
        # a blank line 2
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:1]) + "\n" + json.dumps(ROWS[1]) + "\n")
    elif suffix == ".json":
        path.write_text(json.dumps(ROWS))
    elif suffix == ".parquet":
        datasets.Dataset.from_list(ROWS).to_parquet(str(path))
    else:
        path.write_text(
            "question,answer,source\n" + "".join(f"{r['question']},{r['answer']},{r['source']}\n" for r in ROWS)
        )
    return path


@pytest.mark.parametrize(
    "suffix, numbers", [(".jsonl", [1, 3]), (".json", [1, 2]), (".parquet", [1, 2]), (".csv", [1, 2])]
)
def test_every_local_format_with_a_column_mapping(tmp_path, suffix, numbers):
    path = write(tmp_path, suffix)
    loaded = load_rows(path, prompt_key="question", label_key="answer")
    # jsonl: file lines, blank line 2 counted
    assert loaded.local and loaded.where == str(path) and loaded.numbers == numbers
    # csv: datasets reads the answers as numbers
    got = [(r["prompt"], str(r["label"]), r["source"]) for r in loaded.rows]
    assert got == [("What is 2+3?", "5", "dapo_math"), ("What is 1+1?", "2", "dapo_math")]
    assert all("question" not in r and "answer" not in r for r in loaded.rows)
    unmapped = load_rows(path)  # no mapping: the columns as they are
    assert set(unmapped.rows[0]) == {"question", "answer", "source"}


def test_a_missing_mapped_column_names_the_row_and_the_option(tmp_path):
    path = write(tmp_path, ".jsonl")
    with pytest.raises(
        DataFileError,
        match=r"rows.jsonl:1: no column 'problem' \(the prompt_key\); the row has \['answer', 'question', 'source'\]",
    ):
        load_rows(path, prompt_key="problem", label_key="answer")
    lenient = load_rows(path, prompt_key="problem", lenient=True)
    assert (
        lenient.rows == []
        and len(lenient.bad) == 2
        and lenient.bad[1].endswith("the row has ['answer', 'question', 'source']")
    )


def test_bad_lines_keep_file_line_errors(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "p", "label": "1"}) + "\n{torn\n")
    with pytest.raises(DataFileError, match=r"bad.jsonl:2: not valid JSON"):
        load_rows(path)
    lenient = load_rows(path, lenient=True)
    assert lenient.numbers == [1] and lenient.bad[0].startswith(f"{path}:2: not valid JSON")
    with pytest.raises(DataFileError, match="missing.jsonl: data file does not exist"):
        load_rows(tmp_path / "missing.jsonl")


def test_a_folder_goes_through_datasets_with_its_split(tmp_path):
    folder = tmp_path / "ds"
    folder.mkdir()
    write(folder, ".jsonl").rename(folder / "train.jsonl")
    loaded = load_rows(folder, split="train", label_key="answer", prompt_key="question")
    assert loaded.numbers == [1, 2] and loaded.rows[1]["label"] == "2" and loaded.local
    with pytest.raises(DataFileError, match=r"^data.train_path: cannot load '.*ds' split 'test', neither as a local"):
        load_rows(folder, split="test", option="data.train_path")


def test_the_three_callers_share_it(tmp_path):
    from adora_openrlhf.data_prep.common import load_numbered
    from adora_openrlhf.evaluation.benchmarks import read_located
    from adora_openrlhf.rows import load_run_rows as local_rows

    kk = tmp_path / "kk.jsonl"
    label = "(1) Alice is a knight\n(2) Bob is a knave"
    kk.write_text(
        "".join(
            json.dumps({"prompt": f"Puzzle {i}: Alice and Bob.", "label": label, "source": "kk"}) + "\n"
            for i in range(4)
        )
    )
    train, held = local_rows(DataConfig(task="kk", train_path=str(kk), num_eval=2), seed=0)
    assert [r.where for r in train + held] == [f"{kk}:1", f"{kk}:2", f"{kk}:3", f"{kk}:4"]
    assert [where for where, _ in read_located(kk)] == [f"{kk}:1", f"{kk}:2", f"{kk}:3", f"{kk}:4"]
    numbered = load_numbered(str(write(tmp_path, ".parquet")), "train")
    assert (
        numbered.numbers == [1, 2]
        and numbered.where.endswith("rows.parquet")
        and numbered.rows[0]["question"] == "What is 2+3?"
    )
    with pytest.raises(ConfigError, match="data.train_path file does not exist"):
        local_rows(DataConfig(task="kk", train_path=str(tmp_path / "nope.jsonl")), seed=0)
