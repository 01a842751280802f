"""evaluation/fit.py: each check speaks exactly when a benchmark does not fit the model; evaluation/metrics.py: the sampling
noise of avg@k on a hand-computed case and its invariants."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adora_openrlhf.evaluation.fit import (
    MISFIT_SHARE,
    FitContext,
    ModelOrigin,
    PromptFit,
    fit_notes,
    prompt_fit,
    stated_people,
)
from adora_openrlhf.evaluation.metrics import sampling_se, score_records

LABEL = "(1) Yara is a knight\n(2) Henry is a knave"


def _ctx(records=(), prompts=None, origin=None, heldout=False, max_new_tokens=100, context=None):
    return FitContext("kk", [], list(records), prompts, max_new_tokens, context, origin, heldout)


def _record(extracted, label=LABEL, truncated=False, source="kk"):
    return {
        "source": source,
        "label": label,
        "extracted": extracted,
        "response": f"<answer>{extracted}</answer>",
        "truncated": truncated,
    }


def test_stated_people():
    assert stated_people("(1) Alice is a knight\n(2) Bob is not a knave\nCarol: knight") == {"Alice", "Bob"}
    assert stated_people(None) == set()


def test_foreign_names_speaks_when_half_the_answers_name_strangers():
    stranger, own = (
        _record("(1) Alice is a knight\n(2) Bob is a knave"),
        _record("(1) Yara is a knave\n(2) Henry is a knave"),
    )
    (note,) = fit_notes(_ctx([stranger, own, _record(None)]))  # one answerless response is not counted as answered
    assert note.startswith(
        "kk: 1 of 2 answered responses name people the puzzle does not contain (e.g. 'Alice' in a puzzle about Henry, Yara)"
    )
    assert [n for n in fit_notes(_ctx([stranger, own, own])) if "name people" in n] == []  # 1 of 3 < MISFIT_SHARE
    assert MISFIT_SHARE == 0.5
    assert [
        n
        for n in fit_notes(_ctx([_record("Alice is a knight", source="math500", label="2")] * 2))
        if "name people" in n
    ] == []


def test_no_answer_and_truncation_notes():
    records = [
        _record(None, truncated=True),
        _record("", truncated=True),
        _record("(1) Yara is a knight\n(2) Henry is a knave"),
    ]
    notes = fit_notes(_ctx(records, max_new_tokens=64))
    assert "kk: 2 of 3 responses give no answer the grader can read (e.g. '<answer>None</answer>')" in notes
    assert "kk: 2 of 3 responses reached --max-new-tokens 64 without ending" in notes
    assert fit_notes(_ctx(records[2:])) == []


def test_prompt_level_notes():
    fit = PromptFit(prompts=10, max_tokens=300, unencodable=("b.jsonl:4", "b.jsonl:7"), system_dropped=10)
    notes = fit_notes(_ctx(prompts=fit, max_new_tokens=1024, context=1024))
    assert notes == [
        "kk: the tokenizer cannot encode 2 of 10 prompts (they do not decode back to their text, e.g. b.jsonl:4)",
        "kk: prompts of up to 300 tokens plus --max-new-tokens 1024 exceed the model's context of 1024 positions (--max-new-tokens 724 fits)",
        "kk: the model's prompt template leaves out the system message of 10 of 10 prompts (it gets the user message only)",
    ]
    fits = PromptFit(prompts=10, max_tokens=300, unencodable=(), system_dropped=0)
    assert fit_notes(_ctx(prompts=fits, max_new_tokens=724, context=1024)) == []
    assert [
        n for n in fit_notes(_ctx(prompts=fit, max_new_tokens=10, context=1024, heldout=True)) if "system message" in n
    ] == []


def test_a_local_runs_model_on_another_distribution():
    generated = ModelOrigin("runs/kk-testbed", "kk-testbed", generated_data=True)
    (note,) = fit_notes(_ctx(origin=generated))
    assert "trained by the local run runs/kk-testbed (recipe 'kk-testbed')" in note and note.endswith(
        "python -m eval.run --run runs/kk-testbed)"
    )
    assert fit_notes(_ctx(origin=generated, heldout=True)) == []
    # trained on data files: maybe this very benchmark
    assert fit_notes(_ctx(origin=ModelOrigin("runs/x", None, generated_data=False))) == []


class CharTokenizer:
    """A vocabulary of the lowercase letters, space and newline: any other character encodes to the unknown token."""

    vocab = {c: i for i, c in enumerate(" \nabcdefghijklmnopqrstuvwxyz")}

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [self.vocab.get(c, 99) for c in text]}

    def decode(self, ids, skip_special_tokens=False):
        inverse = {i: c for c, i in self.vocab.items()}
        return "".join(inverse.get(i, "<unk>") for i in ids)


def test_prompt_fit_finds_unencodable_prompts_and_dropped_system_messages():
    rows = [
        {"prompt": [{"role": "system", "content": "Think first."}, {"role": "user", "content": "who is a knight"}]},
        {"prompt": "who is a knight"},
        {"prompt": "Qui est chevalier?"},
    ]
    texts = ["who is a knight\n", "who is a knight\n", "Qui est chevalier?\n"]
    fit = prompt_fit(CharTokenizer(), texts, ["f:1", "f:2", "f:3"], rows)
    assert fit == PromptFit(prompts=3, max_tokens=19, unencodable=("f:3",), system_dropped=1)


def test_sampling_se_hand_case():
    # k = 4: c = 1 gives 1 * 3 / (16 * 3) = 1/16; c = 4 gives 0; se = sqrt(1/16) / 2 = 0.125
    assert sampling_se([(4, 1), (4, 4)]) == pytest.approx(0.125)
    assert sampling_se([(2, 1)]) == pytest.approx(0.5)  # 1 * 1 / (4 * 1) = 1/4 -> sqrt / 1
    assert sampling_se([(1, 1), (1, 0)]) is None  # k = 1: no within-problem variance to estimate
    records = [
        {"benchmark": "b", "problem_id": str(p), "subsets": [], "sample_index": i, "correct": i < c}
        for p, c in enumerate((1, 4))
        for i in range(4)
    ]
    (row,) = score_records(records, 4)
    assert row.avg_at_k == pytest.approx(0.625) and row.sampling_se == pytest.approx(0.125)


@given(st.integers(2, 16).flatmap(lambda k: st.lists(st.integers(0, k).map(lambda c: (k, c)), min_size=1, max_size=30)))
def test_sampling_se_invariants(counts):
    se = sampling_se(counts)
    assert se >= 0
    # no noise exactly when every problem is all right or all wrong
    assert (se == 0) == all(c in (0, n) for n, c in counts)
    assert sampling_se(counts * 4) == pytest.approx(se / 2, abs=1e-12)  # 4x the problems: half the noise
    k = counts[0][0]
    assert se <= math.sqrt(k / (4 * (k - 1)) / k) / math.sqrt(len(counts)) + 1e-12  # p(1-p) <= 1/4 per problem
