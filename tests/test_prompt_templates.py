"""The compact prompt template as a chat template (``tokenization.COMPACT_CHAT_TEMPLATE``).

A tiny tokenizer built for a text task whose prompts are rendered ``compact`` carries it, so whoever renders
prompts with the saved tokenizer's chat template (``auto`` on resume, OpenRLHF's ``--data.apply_chat_template``,
vLLM) gets the text the model was trained on."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adora_openrlhf.engine.tokenization import COMPACT_CHAT_TEMPLATE, train_bpe_tokenizer
from adora_openrlhf.prompt_templates import compact_template, render_prompt


@functools.lru_cache(maxsize=1)
def tokenizer():
    tok = train_bpe_tokenizer(["Knights always tell the truth and knaves always lie. " * 4], vocab_size=300)
    tok.chat_template = COMPACT_CHAT_TEMPLATE
    return tok


def chat(messages) -> str:
    return tokenizer().apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def test_hand_cases():
    assert chat([{"role": "user", "content": "  Who lies?\n"}]) == "Who lies?\n"
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": " second "},
    ]
    # the last user message; the system one is dropped
    assert chat(messages) == compact_template(messages) == "second\n"
    with pytest.raises(Exception, match="no user message"):
        chat([{"role": "system", "content": "only a system message"}])


text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), text), min_size=1, max_size=5))
def test_equals_the_compact_template(turns):
    """For any conversation with a user message, the chat template renders exactly what ``compact`` renders."""
    messages = [{"role": role, "content": content} for role, content in turns]
    if not any(role == "user" for role, _ in turns):
        return
    assert chat(messages) == compact_template(messages)
    assert render_prompt(messages, tokenizer(), "auto") == render_prompt(messages, None, "compact")


def test_a_text_run_saves_it_and_a_vision_run_does_not():
    from adora_openrlhf.backends.local.loading import build_tokenizer
    from adora_openrlhf.recipes import build_run_config
    from adora_openrlhf.rows import load_run_rows

    cfg = build_run_config("kk-tiny", {"data.num_train": 20, "data.num_eval": 5})
    rows, _ = load_run_rows(cfg.data, 0)
    tok, processor = build_tokenizer(cfg, rows, None)
    assert processor is None and tok.chat_template == COMPACT_CHAT_TEMPLATE
    assert render_prompt(rows[0].prompt, tok, "auto") == render_prompt(rows[0].prompt, None, "compact")
    geo = build_run_config("geo-tiny", {"data.num_train": 8, "data.num_eval": 4})
    geo_rows, _ = load_run_rows(geo.data, 0)
    geo_tok, _ = build_tokenizer(geo, geo_rows, None)
    assert not geo_tok.chat_template  # the processor's own prompt handling stays as it was
