"""A key/value cache for ``model.generate`` that grows a preallocated buffer instead of re-concatenating.

``transformers``' default :class:`~transformers.DynamicCache` appends each new token's keys and values with
``torch.cat``, which copies the whole cache of every layer at every decoding step: O(T^2) memory traffic for
T tokens, and about half of a decoding step's time for the local backend's tiny models on CPU. A
:class:`GrowingLayer` writes the new states into a buffer whose capacity doubles when it is full
(``capacity = max(needed, 2 * capacity, MIN_CAPACITY)``), so a token costs one slice copy and the total copy
work is O(T). The attention layers read ``keys[..., :length, :]``, a view of the same values the default
cache would hold, so generated tokens are identical (tests/test_local_units.py checks greedy and sampled
decoding against the default cache, tests/test_vlm.py decoding with images, tests/test_kv_cache.py the layer).

Only full-attention decoders use it (:func:`growing_cache_for`); a model with sliding-window or other layer
types keeps the default cache.
"""

from __future__ import annotations

import functools

import torch

MIN_CAPACITY = 64  # tokens; the first buffer of a layer holds at least this many


@functools.cache
def _growing_cache_class():
    """The cache classes, made on first use (``transformers`` is imported lazily)."""
    from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A :class:`DynamicLayer` whose ``keys``/``values`` are views of a buffer with spare capacity."""

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> None:
            super().lazy_initialization(key_states, value_states, *args, **kwargs)
            self._key_buffer: torch.Tensor | None = None
            self._value_buffer: torch.Tensor | None = None
            self._length = 0

        def _in_sync(self) -> bool:
            """False when another method (crop, batch selection, reordering) replaced ``keys`` with a new tensor."""
            return (
                self._key_buffer is not None
                and self.keys.data_ptr() == self._key_buffer.data_ptr()
                and self.keys.shape[-2] == self._length
                and self.keys.shape[:-2] == self._key_buffer.shape[:-2]
            )

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            if not self._in_sync():  # adopt whatever the layer holds now (empty at the first update)
                self._key_buffer = self.keys if self.keys.numel() else None
                self._value_buffer = self.values if self.values.numel() else None
                self._length = self.keys.shape[-2] if self.keys.numel() else 0
            needed = self._length + key_states.shape[-2]
            capacity = 0 if self._key_buffer is None else self._key_buffer.shape[-2]
            if needed > capacity:
                capacity = max(needed, 2 * capacity, MIN_CAPACITY)
                keys = key_states.new_empty((*key_states.shape[:-2], capacity, key_states.shape[-1]))
                values = value_states.new_empty((*value_states.shape[:-2], capacity, value_states.shape[-1]))
                if self._length:
                    keys[..., : self._length, :] = self._key_buffer[..., : self._length, :]
                    values[..., : self._length, :] = self._value_buffer[..., : self._length, :]
                self._key_buffer, self._value_buffer = keys, values
            self._key_buffer[..., self._length : needed, :] = key_states
            self._value_buffer[..., self._length : needed, :] = value_states
            self._length = needed
            self.keys = self._key_buffer[..., :needed, :]
            self.values = self._value_buffer[..., :needed, :]
            return self.keys, self.values

    class GrowingCache(DynamicCache):
        """A :class:`DynamicCache` of :class:`GrowingLayer`, one per decoder layer (replicated on first use)."""

        def __init__(self):
            Cache.__init__(self, layer_class_to_replicate=GrowingLayer)

    return GrowingCache


def full_attention_only(model) -> bool:
    """True when every decoder layer of ``model`` uses full attention (no sliding-window or other layer types)."""
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return all(kind == "full_attention" for kind in layer_types)
    return not getattr(config, "use_sliding_window", False)


def growing_cache_for(model):
    """A fresh growing cache for one ``model.generate`` call, or None (use the default cache) when the model has
    layers other than full attention or this ``transformers`` lacks the cache layer API."""
    if not full_attention_only(model):
        return None
    try:
        return _growing_cache_class()()
    except (ImportError, TypeError):  # pragma: no cover - a transformers without the layered cache API
        return None
