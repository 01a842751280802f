"""bench.geo_diagnostics: the answer / think parsing and the shares it reports, on hand-made responses."""

from __future__ import annotations

import pytest

from bench.geo_diagnostics import answer_of, asked_kind, table, think_answer_counts, think_colour, view_metrics


def colour_row(kind: str, label: str) -> dict:
    return {
        "prompt": f"<image>What colour is the {kind}? Choices: red, green, blue, yellow.",
        "label": label,
        "meta": {"task": "colour", "choices": ["red", "green", "blue", "yellow"]},
    }


def larger_row(label: str, choices: list[str]) -> dict:
    return {"prompt": "<image>Which is larger?", "label": label, "meta": {"task": "larger", "choices": choices}}


def test_answer_and_think_parsing():
    text = "<think>green square, blue circle.</think>\n<answer>blue</answer>"
    assert answer_of(text) == "blue" and answer_of("no block") is None
    # the last block, as the reward reads it
    assert answer_of("<answer>red</answer> then <answer> green </answer>") == "green"
    assert think_colour(text, "circle") == "blue" and think_colour(text, "square") == "green"
    assert think_colour(text, "triangle") is None and think_colour("<answer>red</answer>", "circle") is None
    assert asked_kind(colour_row("triangle", "red")["prompt"]) == "triangle"
    with pytest.raises(ValueError):
        asked_kind("Which is larger?")


def test_think_answer_counts_by_hand():
    rows = [colour_row("circle", "blue"), colour_row("square", "red"), larger_row("red", ["red", "green"])]
    texts = [
        [
            "<think>blue circle.</think><answer>blue</answer>",  # think right, answer follows, right
            "<think>red circle.</think><answer>blue</answer>",  # think wrong, answer right, does not follow
            "<think>red square.</think><answer>red</answer>",  # think does not name the circle
        ],
        ["<think>green square.</think><answer>green</answer>"],  # think wrong, follows, answer wrong
        ["<answer>red</answer>"],  # a larger question: not counted
    ]
    got = think_answer_counts(rows, texts)
    # 4 colour responses; 3 name the shape; 1 right; follows: 2 of 3; right|think right 1/1; right|think wrong 1/2
    assert got == {
        "think names the shape": 0.75,
        "think right": 0.25,
        "answer follows think": pytest.approx(2 / 3),
        "answer right if think right": 1.0,
        "answer right if think wrong": 0.5,
    }
    assert think_answer_counts([larger_row("red", ["red"])], [["x"]])["think right"] == 0.0  # no colour question: zeros


def test_view_metrics_accuracy_top_answer_share_and_answers_outside_the_choices():
    rows = [colour_row("circle", "blue"), colour_row("square", "red"), larger_row("red", ["red", "green"])]
    texts = [
        ["<answer>red</answer>", "<answer>red</answer>"],
        ["<answer>red</answer>", "<answer>blue</answer>"],
        ["<answer>yellow</answer>", "<answer>red</answer>"],
    ]
    correct = [[False, False], [True, False], [False, True]]
    got = view_metrics(rows, texts, correct)
    assert got["accuracy"] == pytest.approx(2 / 6) and got["accuracy colour"] == 0.25 and got["accuracy larger"] == 0.5
    assert got["top answer share"] == 0.75  # red 3 of the 4 colour answers
    assert got["larger: answer not a choice"] == 0.5  # yellow is not a choice
    text = table([{"step": 0, "greedy": got, "sampled": got, "blank": {"accuracy": 0.1}}])
    assert text.splitlines()[0].startswith("| step | view | accuracy |") and "| 0 | blank | 0.100 | - |" in text
    assert len({line.count("|") for line in text.splitlines()}) == 1  # no metric name breaks the columns
