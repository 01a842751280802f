"""A one-token decoding step for Qwen2 decoders that runs ``transformers``' tensor operations without its modules.

After the prefill, every step of :func:`~adora_openrlhf.engine.decoding.compact_decode` feeds one token
per row. The tiny models of the local backend need well under a millisecond of arithmetic for such a step at small
batch sizes, but ``Qwen2ForCausalLM.forward`` spends several milliseconds in Python around it: module calls and
their hooks, keyword plumbing, output dataclasses, the causal-mask builder, the attention-function registry. In the
tail of a decoding batch, where a few long responses are left, that overhead is nearly all of the time.

:func:`decode_step_for` returns, for a model it recognises, a function ``step(tokens [B, 1], positions [B, 1],
attention_mask [B, T]) -> logits [B, V]`` equal to ``model(input_ids=tokens, attention_mask=attention_mask,
position_ids=positions, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]``, and that updates
``cache`` the same way. It calls the same operations in the same order on the same tensors, so the logits are
bitwise identical (``tests/test_decode_step.py`` checks this with and without padding, with the growing cache's
heads repeated and not, and across compactions):

- embedding; rotary ``cos``/``sin`` from the model's own rotary module;
- per layer: ``h + o_proj(attn(rms(h)))`` then ``h + down(silu(gate(x)) * up(x))`` with ``x = rms(h)``, where
  ``rms(x) = w * (x / sqrt(mean(x^2) + eps))`` (computed in float32), ``q, k, v`` the projections with biases,
  rotated as ``x cos + rotate_half(x) sin``, the new ``k, v`` written with ``cache.layers[i].update``, and
  ``attn = softmax(q K^T * head_dim^-1/2 + mask) V`` through ``torch.nn.functional.scaled_dot_product_attention``;
- the final norm and ``lm_head``.

The attention mask follows ``transformers``' SDPA path for one query token: none when no position of the batch
is padding, else ``attention_mask[:, None, None, :]`` as the additive mask (0 where attended, -inf on padding)
that SDPA makes of the boolean one ``transformers`` passes (made once per step instead of once per layer); key/value heads shared by several query heads
go to SDPA with ``enable_gqa`` when there is no mask and are repeated (``repeat_kv``) when there is, unless the
attention modules read a cache whose heads are stored repeated (``num_key_value_groups == 1`` inside
``kv_cache.attention_reads_cache``).

Two steps (:data:`STEPS`, the ``numerics`` argument):

- ``exact`` (the default, used for rollouts): the operations above, bitwise the model's own logits;
- ``fast`` (used by ``eval.run``): the same arithmetic in fewer, larger operations, within float rounding of the
  model's logits (``tests/test_decode_step.py`` bounds the difference and checks the argmax). Attention is
  ``softmax(q K^T * head_dim^-1/2 + mask) V`` as two matrix products with the ``g`` query heads that share a
  key/value head stacked as ``g`` query rows against that head's keys (:func:`grouped_attention`), so each cached
  key and value is read once per step, never repeated (it needs a cache with one entry per key/value head); the
  norms are ``torch.nn.functional.rms_norm``; the rotation is ``x cos + roll(x, D/2) sin'`` with ``sin'`` the sine
  with its first half negated (equal to ``rotate_half``), from a table of ``cos``/``sin`` per position made by the
  model's rotary module once per decoding (for the default rotary type; others call the module every step);
  no transposes around attention (one query token). About 35 tensor operations per layer instead of 60: on the
  local backend's tiny models the fixed cost of a step, which is most of the time of a decoding batch's tail,
  falls by about a third (0.84 ms against 1.22 ms for one row; ``bench/results/eval_speed/`` measured the whole
  evaluation).

Anything else gets None, and decoding calls the model as before: another architecture, an attention
implementation other than ``sdpa``, attention dropout in training mode, sliding-window layers, a projection or
norm that is not the plain ``transformers`` module (LoRA adapters, quantised layers), an activation other than
SiLU.

The steps re-implement ``transformers``' Qwen2 layer, so they are used only under the releases they were checked
against (:data:`CHECKED_TRANSFORMERS`); under any other the decoding calls the model's forward, with one log line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

DecodeStep = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

logger = logging.getLogger(__name__)


def _rms_norm(hidden: torch.Tensor, norm) -> torch.Tensor:
    """``Qwen2RMSNorm.forward``: ``w * (x / sqrt(mean(x^2) + eps))`` in float32, back in the input dtype."""
    dtype = hidden.dtype
    hidden = hidden.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + norm.variance_epsilon)
    return norm.weight * hidden.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _repeat_kv(states: torch.Tensor, repeats: int) -> torch.Tensor:
    """``transformers``' ``repeat_kv``: [B, kv_heads, T, D] -> [B, kv_heads * repeats, T, D]."""
    batch, heads, length, dim = states.shape
    return states[:, :, None].expand(batch, heads, repeats, length, dim).reshape(batch, heads * repeats, length, dim)


# transformers releases (major.minor) whose Qwen2 decoding the steps were checked against
CHECKED_TRANSFORMERS = ("5.15",)
_version_logged: set[str] = set()


def transformers_version_problem() -> str | None:
    """Why the installed ``transformers`` is not one the steps re-implement (None when it is one of
    :data:`CHECKED_TRANSFORMERS`): another release may change what a Qwen2 layer computes."""
    import transformers

    version = transformers.__version__
    if ".".join(version.split(".")[:2]) in CHECKED_TRANSFORMERS:
        return None
    return f"transformers {version} is not a release the one-token step was checked against ({', '.join(CHECKED_TRANSFORMERS)})"


def _unsupported_reason(model) -> str | None:
    """Why :func:`decode_step_for` cannot stand in for ``model``'s forward (None when it can)."""
    from torch import nn
    from transformers.activations import ACT2FN
    from transformers.models.qwen2.modeling_qwen2 import Qwen2ForCausalLM, Qwen2MLP, Qwen2RMSNorm

    version = transformers_version_problem()
    if version is not None:
        if version not in _version_logged:
            _version_logged.add(version)
            logger.info("%s: decoding calls the model's forward for every token instead", version)
        return version

    silu = (nn.SiLU, type(ACT2FN["silu"]))  # transformers' SiLUActivation: forward = F.silu

    if type(model) is not Qwen2ForCausalLM:
        return f"{type(model).__name__} is not Qwen2ForCausalLM"
    config = model.config
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return f"attention implementation {getattr(config, '_attn_implementation', None)!r} (needs 'sdpa')"
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or []):
        return "sliding-window layers"
    if model.training and config.attention_dropout:
        return "attention dropout in training mode"
    if config.hidden_act != "silu":
        return f"activation {config.hidden_act!r}"
    plain = [model.lm_head]
    norms = [model.model.norm]
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if type(mlp) is not Qwen2MLP or type(mlp.act_fn) not in silu:
            return "a changed MLP"
        plain += [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
        norms += [layer.input_layernorm, layer.post_attention_layernorm]
    if any(type(module) is not nn.Linear for module in plain):
        return "a projection that is not a plain torch.nn.Linear (adapters or quantisation)"
    if any(type(module) is not Qwen2RMSNorm for module in norms):
        return "a norm that is not Qwen2RMSNorm"
    if type(model.model.embed_tokens) is not nn.Embedding:
        return "an embedding that is not a plain torch.nn.Embedding"
    if model.model._forward_hooks or model.model._forward_pre_hooks or model._forward_hooks or model._forward_pre_hooks:
        return "forward hooks on the model"
    return None


def grouped_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """``softmax(q K^T * scale + mask) V`` for one query token per row, the query heads of each key/value head
    stacked as query rows: ``query`` [B, kv_heads, g, D], ``keys``/``values`` [B, kv_heads, T, D], ``mask``
    [B, 1, 1, T] additive or None -> [B, kv_heads, g, D]."""
    scores = torch.matmul(query, keys.transpose(-1, -2)).mul_(scale)
    if mask is not None:
        scores = scores.add_(mask)
    return torch.matmul(torch.softmax(scores, dim=-1), values)


def _padding_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """None when no position is padding, else the additive mask [B, 1, 1, T] (0 where attended, -inf on padding)."""
    if bool(attention_mask.all()):
        return None
    mask = torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device)
    return mask.masked_fill_(attention_mask == 0, float("-inf"))[:, None, None, :]


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` with the first half of its last dimension negated: ``x cos + roll(x, D/2) _signed_sin(sin)`` is
    ``x cos + rotate_half(x) sin``."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


class _RotaryTable:
    """``cos``/``sin`` of the model's rotary module for positions 0..n-1, made by the module itself and grown (doubled)
    when a step needs a later position; ``sin`` has its first half negated, so that ``x cos + roll(x, D/2) sin``
    is ``x cos + rotate_half(x) sin``."""

    def __init__(self, rotary, dtype: torch.dtype, device: torch.device):
        self.rotary, self.dtype, self.device = rotary, dtype, device
        self.cos = self.sin = torch.empty(0, device=device)

    def _grow(self, needed: int) -> None:
        length = max(needed, 2 * self.cos.shape[0], 256)
        positions = torch.arange(length, device=self.device)[None]
        cos, sin = self.rotary(torch.empty(0, dtype=self.dtype, device=self.device), positions)
        self.cos, self.sin = cos[0], _signed_sin(sin[0])

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos``, ``sin'`` [B, 1, 1, D] of ``positions`` [B, 1]."""
        needed = int(positions.max()) + 1
        if needed > self.cos.shape[0]:
            self._grow(needed)
        index = positions.view(-1)
        shape = (index.shape[0], 1, 1, -1)
        return self.cos[index].view(shape), self.sin[index].view(shape)


def _exact_step(model, cache) -> DecodeStep:
    """The forward's operations in its order (module docstring): bitwise its logits."""
    decoder = model.model
    layers = list(decoder.layers)
    embedding = decoder.embed_tokens.weight

    def step(tokens: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        batch = tokens.shape[0]
        hidden = F.embedding(tokens, embedding, decoder.embed_tokens.padding_idx)
        cos, sin = decoder.rotary_emb(hidden, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        # SDPA makes this of the boolean mask in every call: once here
        mask = _padding_mask(attention_mask, hidden.dtype)
        for index, layer in enumerate(layers):
            attn, mlp = layer.self_attn, layer.mlp
            residual = hidden
            x = _rms_norm(hidden, layer.input_layernorm)
            shape = (batch, 1, -1, attn.head_dim)
            query = F.linear(x, attn.q_proj.weight, attn.q_proj.bias).view(shape).transpose(1, 2)
            key = F.linear(x, attn.k_proj.weight, attn.k_proj.bias).view(shape).transpose(1, 2)
            value = F.linear(x, attn.v_proj.weight, attn.v_proj.bias).view(shape).transpose(1, 2)
            query = (query * cos) + (_rotate_half(query) * sin)
            key = (key * cos) + (_rotate_half(key) * sin)
            keys, values = cache.layers[index].update(key, value)
            extra = {}
            groups = attn.num_key_value_groups
            if groups > 1:
                if mask is None and keys.shape[-1] == values.shape[-1] <= 256:
                    extra = {"enable_gqa": True}
                else:
                    keys, values = _repeat_kv(keys, groups), _repeat_kv(values, groups)
            out = F.scaled_dot_product_attention(
                query, keys, values, attn_mask=mask, dropout_p=0.0, scale=attn.scaling, is_causal=False, **extra
            )
            out = out.transpose(1, 2).contiguous().reshape(batch, 1, -1).contiguous()
            hidden = residual + F.linear(out, attn.o_proj.weight, attn.o_proj.bias)
            residual = hidden
            x = _rms_norm(hidden, layer.post_attention_layernorm)
            gate = F.linear(x, mlp.gate_proj.weight, mlp.gate_proj.bias)
            up = F.linear(x, mlp.up_proj.weight, mlp.up_proj.bias)
            hidden = residual + F.linear(F.silu(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
        hidden = _rms_norm(hidden, decoder.norm)
        return F.linear(hidden[:, -1], model.lm_head.weight, model.lm_head.bias)

    return step


def _fast_step(model, cache) -> DecodeStep:
    """The same arithmetic in fewer operations, grouped-query attention on a per-key/value-head cache (module
    docstring): the forward's logits within float rounding."""
    if getattr(cache, "kv_repeats", 1) > 1:
        raise ValueError("numerics 'fast' reads one cache entry per key/value head; this cache stores them repeated")
    decoder = model.model
    config = model.config
    hidden_size = config.hidden_size
    first = decoder.layers[0].self_attn
    dim, kv_heads = first.head_dim, config.num_key_value_heads
    groups = config.num_attention_heads // kv_heads
    embedding, padding_idx = decoder.embed_tokens.weight, decoder.embed_tokens.padding_idx
    table = (
        _RotaryTable(decoder.rotary_emb, embedding.dtype, embedding.device)
        if getattr(decoder.rotary_emb, "rope_type", None) == "default"
        else None
    )

    def weights(layer):
        attn, mlp = layer.self_attn, layer.mlp
        projections = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        return [(p.weight, p.bias) for p in projections], [(n.weight, n.variance_epsilon) for n in norms], attn.scaling

    layers = [weights(layer) for layer in decoder.layers]
    final_norm = (decoder.norm.weight, decoder.norm.variance_epsilon)

    def rotary(positions: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if table is not None:
            return table(positions)
        cos, sin = decoder.rotary_emb(like, positions)
        return cos.unsqueeze(1), _signed_sin(sin).unsqueeze(1)

    def step(tokens: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        batch = tokens.shape[0]
        hidden = F.embedding(tokens.view(batch), embedding, padding_idx)
        cos, sin = rotary(positions, hidden)
        mask = _padding_mask(attention_mask, hidden.dtype)
        for index, (
            ((wq, bq), (wk, bk), (wv, bv), (wo, bo), (wg, bg), (wu, bu), (wd, bd)),
            ((w1, eps1), (w2, eps2)),
            scale,
        ) in enumerate(layers):
            x = F.rms_norm(hidden, (hidden_size,), w1, eps1)
            query = F.linear(x, wq, bq).view(batch, kv_heads, groups, dim)
            key = F.linear(x, wk, bk).view(batch, kv_heads, 1, dim)
            query = torch.addcmul(query * cos, query.roll(dim // 2, -1), sin)
            key = torch.addcmul(key * cos, key.roll(dim // 2, -1), sin)
            keys, values = cache.layers[index].update(key, F.linear(x, wv, bv).view(batch, kv_heads, 1, dim))
            out = grouped_attention(query, keys, values, mask, scale).view(batch, -1)
            hidden = hidden + F.linear(out, wo, bo)
            x = F.rms_norm(hidden, (hidden_size,), w2, eps2)
            hidden = hidden + F.linear(F.silu(F.linear(x, wg, bg)) * F.linear(x, wu, bu), wd, bd)
        return F.linear(F.rms_norm(hidden, (hidden_size,), *final_norm), model.lm_head.weight, model.lm_head.bias)

    return step


STEPS: dict[str, Callable[..., DecodeStep]] = {"exact": _exact_step, "fast": _fast_step}


def decode_step_for(model, cache, numerics: str = "exact") -> DecodeStep | None:
    """A one-token step for ``model`` writing into ``cache`` (module docstring), or None when ``model`` is not a plain
    Qwen2 decoder with SDPA attention or ``cache`` is not a layered ``transformers`` cache. ``numerics``: a key of
    :data:`STEPS` (``fast`` needs a cache with one entry per key/value head)."""
    if numerics not in STEPS:
        raise ValueError(f"numerics: unknown step {numerics!r}; choose one of {', '.join(STEPS)}")
    if cache is None or not hasattr(cache, "layers") or _unsupported_reason(model) is not None:
        return None
    return STEPS[numerics](model, cache)
