"""The growing KV cache (backends/local/kv_cache.py): same states as transformers' DynamicLayer, the default
cache for models it does not cover, and the model.kv_cache setting. Same tokens from model.generate:
tests/test_local_units.py (text) and tests/test_vlm.py (images)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from adora_openrlhf.backends.local.kv_cache import MIN_CAPACITY, growing_cache_for
from adora_openrlhf.config import ConfigError, ModelConfig


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
