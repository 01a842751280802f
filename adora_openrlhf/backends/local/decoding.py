"""A decoding loop that drops finished sequences from the batch ("compact" decoding).

``model.generate`` keeps every sequence of a batch in every forward pass until the last one ends: in a batch of
128 where most responses stop after 23 tokens and a few run to 300, it computes 128 x 300 token positions.
:func:`compact_decode` takes the same steps as ``generate``'s sampling loop (prefill with the left-padded prompt,
one token per step, logits processors, softmax sampling or argmax, pad after eos) and, whenever the unfinished
sequences have fallen to at most ``compact_ratio`` of the rows in the batch, removes the finished rows from the
batch, their KV-cache entries with them. A finished sequence no longer influences any other row, so each
response keeps its distribution; the work becomes about the sum of the response lengths instead of the batch
size times the longest one.

Same tokens as ``generate``: with greedy decoding always (a row's logits do not depend on the other rows);
with sampling, until the first compaction (both draw ``torch.multinomial`` over the same rows; after a
compaction fewer rows draw, so later draws differ while every row's sampling distribution stays the same).
``tests/test_decoding.py`` checks both against ``model.generate``.

After the prefill, a plain Qwen2 decoder takes its one-token steps through ``decode_step.decode_step_for`` (the
same operations as its forward without the module machinery: bitwise the same logits); other models are called
as they are.

Per-row random streams (``uniforms``, used by ``eval.run``): row ``i`` draws its ``t``-th token by inverse-CDF
sampling with the ``t``-th number of its own row of uniforms (:func:`inverse_cdf_sample`), instead of one
``torch.multinomial`` call over the batch. A row's tokens are then a function of its own stream and its own
logits only: the same whichever rows share its batch, and unchanged by compaction.

The logits processors are ``generate``'s for these settings, in its order: repetition penalty, then (sampling
only) temperature, top-k, top-p and min-p (:func:`logits_processors`). Position ids follow ``generate``'s rule
for left padding: ``cumsum(attention_mask) - 1`` (0 on padding), then one more per new token.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from adora_openrlhf.backends.local.decode_step import decode_step_for
from adora_openrlhf.config import SamplingParams

COMPACT_RATIO = 0.75  # compact when at most this share of the batch's rows is unfinished


def logits_processors(params: SamplingParams, greedy: bool):
    """The ``transformers`` logits processors ``model.generate`` applies for ``params``, in its order."""
    from transformers import (
        LogitsProcessorList,
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    processors = LogitsProcessorList()
    if params.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(penalty=params.repetition_penalty))
    if greedy:
        return processors
    if params.temperature != 1.0:
        processors.append(TemperatureLogitsWarper(params.temperature))
    top_k = 0 if params.top_k == -1 else params.top_k
    if top_k != 0:
        processors.append(TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1))
    if params.top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p=params.top_p, min_tokens_to_keep=1))
    if params.min_p > 0:
        processors.append(MinPLogitsWarper(min_p=params.min_p, min_tokens_to_keep=1))
    return processors


def inverse_cdf_sample(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Token ``j`` of each row of ``probs`` [B, V] (rows sum to 1 up to rounding) for its uniform ``u`` in [0, 1)
    [B]: the smallest ``j`` with ``cdf[j] > u * cdf[V-1]``, ``cdf = cumsum(probs)``. Token ``j`` is drawn with
    probability ``probs[j] / sum(probs)``; a token of probability 0 is never drawn (its cdf step is empty)."""
    cdf = probs.cumsum(-1)
    scaled = (uniforms.to(cdf.dtype) * cdf[:, -1]).unsqueeze(-1)
    tokens = torch.searchsorted(cdf, scaled, right=True).squeeze(-1)
    return tokens.clamp_(max=probs.shape[-1] - 1)


def _select_rows(cache, keep: torch.Tensor) -> None:
    """Keep only the batch rows ``keep`` in every layer of ``cache``."""
    for layer in cache.layers:
        layer.batch_select_indices(keep)


@torch.no_grad()
def compact_decode(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    params: SamplingParams,
    eos_token_id: int,
    pad_token_id: int,
    cache,
    greedy: bool = False,
    compact_ratio: float | None = None,
    uniforms: torch.Tensor | None = None,
    on_finish: Callable[[int], None] | None = None,
    fast_step: bool = True,
) -> list[tuple[list[int], bool]]:
    """``(response ids, truncated)`` for each row of the left-padded ``input_ids`` [B, W], in order.

    A response ends at (and includes) its first ``eos_token_id``; ``truncated`` is True when it reached
    ``params.max_new_tokens`` without one. ``cache``: an empty ``transformers`` cache (``DynamicCache`` or the
    growing cache of ``kv_cache.py``). ``compact_ratio`` (default :data:`COMPACT_RATIO`) 0 never compacts (then
    sampled tokens equal ``model.generate``'s under the same torch seed). ``uniforms`` [B, max_new_tokens]: each
    row's own random stream (module docstring); without it rows draw with ``torch.multinomial``. ``on_finish(n)``
    is called whenever ``n`` rows have ended (eos, or the token limit for the rest), for progress reports.
    ``fast_step`` False calls the model for every step even where ``decode_step_for`` has a step (same tokens).
    """
    compact_ratio = COMPACT_RATIO if compact_ratio is None else compact_ratio
    processors = logits_processors(params, greedy)
    batch = input_ids.shape[0]
    seqs = input_ids  # prompt + generated tokens of the rows still in the batch (the repetition penalty reads them)
    mask = attention_mask
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
    rows = torch.arange(batch, device=input_ids.device)  # original index of each row still in the batch
    unfinished = torch.ones(batch, dtype=torch.bool, device=input_ids.device)
    generated: list[list[int]] = [[] for _ in range(batch)]
    ended = [False] * batch
    step_ids, step_positions = input_ids, positions
    one_token_step = decode_step_for(model, cache) if fast_step else None
    for step in range(params.max_new_tokens):
        if step > 0 and one_token_step is not None:
            logits = one_token_step(step_ids, step_positions, mask).to(copy=True, dtype=torch.float32)
        else:
            out = model(input_ids=step_ids, attention_mask=mask, position_ids=step_positions, past_key_values=cache, use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
        scores = processors(seqs, logits)
        if greedy:
            tokens = torch.argmax(scores, dim=-1)
        elif uniforms is not None:
            tokens = inverse_cdf_sample(torch.softmax(scores, dim=-1), uniforms[rows, step])
        else:
            tokens = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
        tokens = torch.where(unfinished, tokens, torch.full_like(tokens, pad_token_id))
        for row, token, live in zip(rows.tolist(), tokens.tolist(), unfinished.tolist(), strict=True):
            if live:
                generated[row].append(token)
                if token == eos_token_id:
                    ended[row] = True
        ended_now = int((unfinished & (tokens == eos_token_id)).sum())
        unfinished = unfinished & (tokens != eos_token_id)
        if on_finish is not None and ended_now:
            on_finish(ended_now)
        seqs = torch.cat([seqs, tokens[:, None]], dim=-1)
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
        step_ids, step_positions = tokens[:, None], positions[:, -1:] + 1
        positions = step_positions
        live = int(unfinished.sum())
        if live == 0:
            break
        if step == params.max_new_tokens - 1 and on_finish is not None:
            on_finish(live)  # truncated at the token limit
        if live <= compact_ratio * unfinished.shape[0]:
            keep = unfinished.nonzero().squeeze(1)
            _select_rows(cache, keep)
            seqs, mask, positions, rows = seqs[keep], mask[keep], positions[keep], rows[keep]
            step_ids, step_positions, unfinished = step_ids[keep], step_positions[keep], unfinished[keep]
    return [(ids, not done) for ids, done in zip(generated, ended, strict=True)]
