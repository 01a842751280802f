"""The growing KV cache (engine/kv_cache.py): same states as transformers' DynamicLayer, the default
cache for models it does not cover, and the model.kv_cache setting. Same tokens from model.generate:
tests/test_local_units.py (text) and tests/test_vlm.py (images)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from adora_openrlhf.config import ConfigError, ModelConfig
from adora_openrlhf.engine.kv_cache import MIN_CAPACITY, growing_cache_for


@settings(max_examples=30, deadline=None)
@given(chunks=st.lists(st.integers(1, 70), min_size=1, max_size=8), batch=st.integers(1, 3))
def test_layer_holds_what_concatenation_holds(chunks, batch):
    from transformers.cache_utils import DynamicLayer

    growing = new_layer()
    reference = DynamicLayer()
    for n in chunks:
        k, v = torch.randn(batch, 2, n, 4), torch.randn(batch, 2, n, 4)
        got_k, got_v = growing.update(k, v)
        want_k, want_v = reference.update(k, v)
        assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
        assert growing.get_seq_length() == reference.get_seq_length()
    assert growing.get_seq_length() == sum(chunks)
    assert growing._key_buffer.shape[-2] >= max(MIN_CAPACITY, sum(chunks))


def new_layer():
    """One layer of the growing cache, as the cache makes it at a model's first update."""
    return growing_cache_for(_FullAttentionStub()).layer_class_to_replicate()


class _FullAttentionStub:
    class config:
        layer_types = ["full_attention"]

        @classmethod
        def get_text_config(cls, decoder=True):
            return cls


def test_layer_resyncs_after_its_keys_are_replaced():
    """crop / batch selection assign new tensors to keys and values; the next update must start from those."""
    layer = new_layer()
    k, v = torch.randn(2, 1, 10, 4), torch.randn(2, 1, 10, 4)
    layer.update(k, v)
    layer.crop(-3)  # drop the last 3 positions
    layer.batch_select_indices(torch.tensor([1]))
    k2, v2 = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4)
    got_k, got_v = layer.update(k2, v2)
    assert torch.equal(got_k, torch.cat([k[1:, :, :7], k2], dim=-2))
    assert torch.equal(got_v, torch.cat([v[1:, :, :7], v2], dim=-2))


def test_kv_cache_setting_is_validated():
    assert ModelConfig().kv_cache == "growing"
    with pytest.raises(ConfigError, match=r"model\.kv_cache.*growing"):
        ModelConfig(kv_cache="static")


def _gqa_model():
    from adora_openrlhf.config import TinyModelConfig
    from adora_openrlhf.engine.model import build_tiny_model
    from adora_openrlhf.engine.tokenization import train_bpe_tokenizer

    tok = train_bpe_tokenizer(["Knights always tell the truth. Alice says: Bob is a knave."] * 4, 300)
    tiny = TinyModelConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
    )
    return build_tiny_model(tiny, tok, seed=0).eval()


def test_grouped_query_heads_are_stored_repeated_and_read_as_they_are():
    """On CPU the cache of a grouped-query model holds each key/value head once per query head and attention reads it
    without transformers' repeat_kv copy: the logits of a padded batch over many steps are bit for bit those of
    transformers' DynamicCache, and the attention modules get their grouping back afterwards."""
    from transformers import DynamicCache

    from adora_openrlhf.engine.kv_cache import attention_reads_cache, kv_head_repeats

    model = _gqa_model()
    assert kv_head_repeats(model) == 4
    assert growing_cache_for(model).kv_repeats == 1  # size unknown: one entry per key/value head
    ids = torch.randint(0, 300, (6, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[:3, :4] = 0  # left padding
    logits = {}
    for name, cache in (("repeated", growing_cache_for(model, tokens=6 * 80)), ("dynamic", DynamicCache())):
        step_ids, step_mask, got = ids, mask, []
        with torch.no_grad(), attention_reads_cache(model, cache):
            for _ in range(MIN_CAPACITY + 3):  # the buffer grows once
                out = model(input_ids=step_ids, attention_mask=step_mask, past_key_values=cache, use_cache=True)
                got.append(out.logits[:, -1])
                step_ids = out.logits[:, -1].argmax(-1, keepdim=True)
                step_mask = torch.cat([step_mask, torch.ones_like(step_ids)], -1)
        logits[name] = torch.stack(got)
        if name == "repeated":
            assert cache.kv_repeats == 4 and cache.layers[0].keys.shape[1] == 4  # one entry per query head
    assert torch.equal(logits["repeated"], logits["dynamic"])
    assert {m.num_key_value_groups for m in model.modules() if hasattr(m, "num_key_value_groups")} == {4}


def test_attention_grouping_is_restored_when_decoding_fails():
    from adora_openrlhf.engine.kv_cache import attention_reads_cache

    model = _gqa_model()
    with pytest.raises(RuntimeError, match="boom"), attention_reads_cache(model, growing_cache_for(model, tokens=100)):
        assert {m.num_key_value_groups for m in model.modules() if hasattr(m, "num_key_value_groups")} == {1}
        raise RuntimeError("boom")
    assert {m.num_key_value_groups for m in model.modules() if hasattr(m, "num_key_value_groups")} == {4}
    with attention_reads_cache(model, None):  # the default cache: nothing changes
        assert {m.num_key_value_groups for m in model.modules() if hasattr(m, "num_key_value_groups")} == {4}


def test_heads_are_repeated_only_while_the_cache_stays_small(monkeypatch):
    from adora_openrlhf.engine import kv_cache

    model = _gqa_model()
    per_token = kv_cache.cache_bytes_per_token(model)
    assert per_token == 2 * 2 * 1 * 16 * 4  # keys and values, 2 layers, 1 key/value head of 64 / 4, float32
    limit = 2 * 1000 * 4 * per_token  # 1000 tokens with 4 repeats, doubled for the spare capacity
    monkeypatch.setattr(kv_cache, "REPEATED_CACHE_LIMIT", limit)
    assert growing_cache_for(model, tokens=1000).kv_repeats == 4
    assert growing_cache_for(model, tokens=1001).kv_repeats == 1
