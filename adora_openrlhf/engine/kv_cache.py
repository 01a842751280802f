"""A key/value cache for ``model.generate`` that grows a preallocated buffer instead of re-concatenating.

``transformers``' default :class:`~transformers.DynamicCache` appends each new token's keys and values with
``torch.cat``, which copies the whole cache of every layer at every decoding step: O(T^2) memory traffic for
T tokens, and about half of a decoding step's time for the local backend's tiny models on CPU. A
:class:`GrowingLayer` writes the new states into a buffer whose capacity doubles when it is full
(``capacity = max(needed, 2 * capacity, MIN_CAPACITY)``), so a token costs one slice copy and the total copy
work is O(T). The attention layers read ``keys[..., :length, :]``, a view of the same values the default
cache would hold, so generated tokens are identical (tests/test_local_units.py checks greedy and sampled
decoding against the default cache, tests/test_vlm.py decoding with images, tests/test_kv_cache.py the layer).

Grouped-query attention (fewer key/value heads than query heads) on CPU: ``transformers`` repeats every
key/value head for its query heads before each attention call (``repeat_kv``), a copy of the whole cache of
every layer at every decoding step, which made attention the largest cost of large decoding batches. There the
cache stores each head already repeated (``repeats`` = query heads per key/value head; the new token's states
are repeated once, when they are written), and while it is in use (:func:`attention_reads_cache`) the model's
attention modules are told that keys and values come one per query head (``num_key_value_groups = 1``), so
attention reads the cache as it is. The values attention sees are exactly those ``repeat_kv`` would make, so
the logits and tokens are the same (``tests/test_kv_cache.py``). The cache then takes ``repeats`` times the
memory, so it is only done when the repeated cache of the whole batch (``tokens`` = rows x (prompt width +
max new tokens), doubled for the buffer's spare capacity) stays under :data:`REPEATED_CACHE_LIMIT` bytes; GPUs,
where the copy is cheap and memory is not, keep one entry per key/value head.

Only full-attention decoders use it (:func:`growing_cache_for`); a model with sliding-window or other layer
types keeps the default cache.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch

MIN_CAPACITY = 64  # tokens; the first buffer of a layer holds at least this many
REPEATED_CACHE_LIMIT = 2 << 30  # bytes: the largest cache (spare capacity included) whose heads are stored repeated


@functools.cache
def _growing_layer_class():
    """The cache layer class, made on first use (``transformers`` is imported lazily)."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A :class:`DynamicLayer` whose ``keys``/``values`` are views of a buffer with spare capacity; with
        ``repeats > 1`` each key/value head is stored ``repeats`` times in a row (module docstring)."""

        repeats = 1

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

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if self.repeats > 1:
                key_states = key_states.repeat_interleave(self.repeats, dim=1)
                value_states = value_states.repeat_interleave(self.repeats, dim=1)
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

    return GrowingLayer


@functools.cache
def _growing_cache_class():
    """The cache class, made on first use (``transformers`` is imported lazily)."""
    from transformers.cache_utils import Cache, DynamicCache

    GrowingLayer = _growing_layer_class()

    class GrowingCache(DynamicCache):
        """A :class:`DynamicCache` of :class:`GrowingLayer`, one per decoder layer (replicated on first use)."""

        def __init__(self, repeats: int = 1):
            layer = (
                GrowingLayer if repeats == 1 else type("RepeatingGrowingLayer", (GrowingLayer,), {"repeats": repeats})
            )
            Cache.__init__(self, layer_class_to_replicate=layer)
            self.kv_repeats = repeats

    return GrowingCache


def kv_head_repeats(model) -> int:
    """Query heads per key/value head of ``model``'s attention modules (their ``num_key_value_groups``); 1 when
    they have none or do not all agree."""
    groups = {
        module.num_key_value_groups
        for module in model.modules()
        if isinstance(getattr(module, "num_key_value_groups", None), int)
    }
    return groups.pop() if len(groups) == 1 else 1


@contextlib.contextmanager
def attention_reads_cache(model, cache) -> Iterator[None]:
    """While the block runs, a ``cache`` whose heads are repeated (``kv_repeats > 1``) is read as it is: the model's
    attention modules get ``num_key_value_groups = 1`` (module docstring), restored afterwards, however the
    block ends. Any other cache (or None): nothing changes."""
    repeats = getattr(cache, "kv_repeats", 1)
    modules = [m for m in model.modules() if getattr(m, "num_key_value_groups", None) == repeats] if repeats > 1 else []
    for module in modules:
        module.num_key_value_groups = 1
    try:
        yield
    finally:
        for module in modules:
            module.num_key_value_groups = repeats


def full_attention_only(model) -> bool:
    """True when every decoder layer of ``model`` uses full attention (no sliding-window or other layer types)."""
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return all(kind == "full_attention" for kind in layer_types)
    return not getattr(config, "use_sliding_window", False)


def cache_bytes_per_token(model) -> int:
    """Bytes of keys and values one token takes in ``model``'s cache with one entry per key/value head."""
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * next(model.parameters()).element_size()


def growing_cache_for(model, tokens: int | None = None):
    """A fresh growing cache for one ``model.generate`` call, or None (use the default cache) when the model has
    layers other than full attention or this ``transformers`` lacks the cache layer API. On CPU, for grouped-query
    attention, and when the batch's ``tokens`` (rows x positions) repeated stay under :data:`REPEATED_CACHE_LIMIT`,
    its layers store the heads repeated (module docstring): use it inside :func:`attention_reads_cache`."""
    if not full_attention_only(model):
        return None
    repeats = 1
    if tokens is not None and all(p.device.type == "cpu" for p in model.parameters()):
        wanted = kv_head_repeats(model)
        repeats = wanted if 2 * tokens * wanted * cache_bytes_per_token(model) <= REPEATED_CACHE_LIMIT else 1
    try:
        return _growing_cache_class()(repeats)
    except (ImportError, TypeError):  # pragma: no cover - a transformers without the layered cache API
        return None
