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

Two numerics (:data:`NUMERICS`, the ``numerics`` argument): ``exact`` (the trainer's rollouts) computes everything as
above, bitwise ``model.generate``'s logits and processors; ``fast`` (``eval.run``'s default) takes the one-token
steps through ``decode_step.py``'s fast step (grouped-query attention, fewer operations), finds the top-p tokens
from ``torch.topk`` candidates instead of sorting the vocabulary (:func:`candidate_top_p_warper`) and prefills
identical prompts once (:func:`prefill`): the same rules, with logits within float rounding of the exact ones.

The logits processors are ``generate``'s for these settings, in its order: repetition penalty, then (sampling
only) temperature, top-k, top-p and min-p (:func:`logits_processors`). Position ids follow ``generate``'s rule
for left padding: ``cumsum(attention_mask) - 1`` (0 on padding), then one more per new token.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from adora_openrlhf.config import SamplingParams
from adora_openrlhf.engine.decode_step import decode_step_for

COMPACT_RATIO = 0.75  # compact when at most this share of the batch's rows is unfinished


@dataclass(frozen=True)
class Numerics:
    """How compact decoding computes a step (:data:`NUMERICS`)."""

    step: str  # the one-token step: a key of decode_step.STEPS ("fast" reads a cache with one entry per key/value head)
    top_p: str  # the top-p rule's implementation: "sort" (transformers' TopPLogitsWarper) or "candidates"
    share_prompts: bool  # prefill identical prompts once (prefill)


NUMERICS = {
    # bitwise model.generate's logits and transformers' processors: rollouts of the trainer
    "exact": Numerics(step="exact", top_p="sort", share_prompts=False),
    # the same rules within float rounding, faster on CPU: eval.run's transformers engine
    "fast": Numerics(step="fast", top_p="candidates", share_prompts=True),
}


def numerics_of(name: str) -> Numerics:
    """The :data:`NUMERICS` entry ``name``; ValueError naming the choices for any other."""
    if name not in NUMERICS:
        raise ValueError(f"numerics: unknown {name!r}; choose one of {', '.join(NUMERICS)}")
    return NUMERICS[name]


@functools.cache
def _candidate_top_p_class():
    """The warper class of :func:`candidate_top_p_warper`, made once (``transformers`` is imported lazily)."""
    from transformers import TopPLogitsWarper

    class CandidateTopPWarper(TopPLogitsWarper):
        def __call__(self, input_ids, scores: torch.Tensor) -> torch.Tensor:
            vocab = scores.shape[-1]
            probs = scores.softmax(dim=-1)
            candidates = max(int((probs >= (1 - self.top_p) / vocab).sum(dim=-1).max()), self.min_tokens_to_keep)
            if 4 * candidates > vocab:
                return super().__call__(input_ids, scores)
            top, index = torch.topk(scores, candidates, dim=-1)
            top, index = top.flip(-1), index.flip(-1)  # ascending, as the rule reads them
            top_probs = probs.gather(-1, index)
            below = probs.sum(dim=-1, keepdim=True) - top_probs.sum(dim=-1, keepdim=True)
            remove = (below + top_probs.cumsum(dim=-1)) <= (1 - self.top_p)
            remove[..., -self.min_tokens_to_keep :] = False
            kept = top.masked_fill(remove, self.filter_value)
            return torch.full_like(scores, self.filter_value).scatter_(-1, index, kept)

    return CandidateTopPWarper


def candidate_top_p_warper(top_p: float, min_tokens_to_keep: int = 1):
    """A ``transformers`` ``TopPLogitsWarper`` that finds the same tokens without sorting the whole vocabulary.

    The rule (``TopPLogitsWarper``): sort the probabilities ``p`` ascending and remove every token whose
    cumulative probability (itself included) is at most ``1 - top_p``, keeping the ``min_tokens_to_keep`` most
    likely. A token with ``p < (1 - top_p) / V`` (V tokens) is always removed: every token at or below it in
    that order has less, so their sum is under ``1 - top_p``. Only the ``m`` tokens at or above that floor
    (``m`` = the most of any row) can be kept; they come from ``torch.topk`` and the cumulative sum starts from
    the mass of all the others. Where ``m`` exceeds a quarter of the vocabulary the full sort is cheaper and
    is used. Same kept tokens as the sort up to float rounding of the cumulative sums."""
    return _candidate_top_p_class()(top_p=top_p, min_tokens_to_keep=min_tokens_to_keep)


def logits_processors(params: SamplingParams, greedy: bool, top_p: str = "sort"):
    """The ``transformers`` logits processors ``model.generate`` applies for ``params``, in its order; ``top_p``
    "candidates" swaps its top-p warper for :func:`candidate_top_p_warper` (the same rule, no full sort)."""
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
        warper = candidate_top_p_warper if top_p == "candidates" else TopPLogitsWarper
        processors.append(warper(top_p=params.top_p, min_tokens_to_keep=1))
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


def _next_tokens(
    processors, seqs: torch.Tensor, logits: torch.Tensor, greedy: bool, uniforms: torch.Tensor | None
) -> torch.Tensor:
    """Each row's next token [B]: ``processors`` applied to ``logits`` [B, V] (``seqs``: the rows' tokens so far), then
    argmax (greedy), inverse-CDF sampling with each row's uniform [B], or ``torch.multinomial`` (no uniforms)."""
    scores = logits
    for processor in processors:  # LogitsProcessorList's order, without its per-call signature inspection
        scores = processor(seqs, scores)
    if greedy:
        return torch.argmax(scores, dim=-1)
    if uniforms is not None:
        return inverse_cdf_sample(torch.softmax(scores, dim=-1), uniforms)
    return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)


def _select_rows(cache, keep: torch.Tensor) -> None:
    """Keep only the batch rows ``keep`` in every layer of ``cache`` (an index may repeat: that row is copied)."""
    for layer in cache.layers:
        layer.batch_select_indices(keep)


def prefill(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    positions: torch.Tensor,
    cache,
    share_prompts: bool = False,
) -> torch.Tensor:
    """The last position's logits [B, V] (float32) of each row of the left-padded prompts, their keys and values
    written into the empty ``cache``. ``share_prompts``: rows with the same ids and mask (the k samples of one
    problem) are run through the model once, then their logits and cache entries are copied to every such row."""
    owner = None
    if share_prompts:
        unique, owner = torch.unique(torch.cat([input_ids, attention_mask], dim=-1), dim=0, return_inverse=True)
        if unique.shape[0] == input_ids.shape[0]:
            owner = None
        else:
            first = torch.full((unique.shape[0],), input_ids.shape[0], dtype=torch.long, device=input_ids.device)
            first = first.scatter_reduce_(
                0, owner, torch.arange(input_ids.shape[0], device=input_ids.device), reduce="amin"
            )
            input_ids, attention_mask, positions = input_ids[first], attention_mask[first], positions[first]
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
    if owner is None:
        return logits
    _select_rows(cache, owner)
    return logits[owner]


def _next_logits(
    model, one_token_step, step_ids: torch.Tensor, step_positions: torch.Tensor, mask: torch.Tensor, cache
) -> torch.Tensor:
    """Float32 logits of the next token of every row after the first step: the one-token step where the model has
    one (``decode_step.py``), else the model's forward with the cache."""
    if one_token_step is not None:
        return one_token_step(step_ids, step_positions, mask).to(copy=True, dtype=torch.float32)
    out = model(
        input_ids=step_ids,
        attention_mask=mask,
        position_ids=step_positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[:, -1].to(copy=True, dtype=torch.float32)


def _record_tokens(
    rows: torch.Tensor,
    tokens: torch.Tensor,
    unfinished: torch.Tensor,
    generated: list[list[int]],
    ended: list[bool],
    eos: int,
    on_finish: Callable[[int], None] | None,
) -> torch.Tensor:
    """Append each live row's token to its response (rows are original indices); a row that drew ``eos`` has ended
    (``on_finish`` hears how many did). Returns which rows are still unfinished."""
    for row, token, live in zip(rows.tolist(), tokens.tolist(), unfinished.tolist(), strict=True):
        if live:
            generated[row].append(token)
            if token == eos:
                ended[row] = True
    ended_now = int((unfinished & (tokens == eos)).sum())
    if on_finish is not None and ended_now:
        on_finish(ended_now)
    return unfinished & (tokens != eos)


@torch.no_grad()
def _still_sampling(cache, unfinished: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The rows of ``tensors``, then of ``unfinished``, whose sequences are unfinished; ``cache`` keeps those rows."""
    keep = unfinished.nonzero().squeeze(1)
    _select_rows(cache, keep)
    return tuple(t[keep] for t in (*tensors, unfinished))


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
    numerics: str = "exact",
) -> list[tuple[list[int], bool]]:
    """``(response ids, truncated)`` for each row of the left-padded ``input_ids`` [B, W], in order.

    A response ends at (and includes) its first ``eos_token_id``; ``truncated`` is True when it reached
    ``params.max_new_tokens`` without one. ``cache``: an empty ``transformers`` cache (``DynamicCache`` or the
    growing cache of ``kv_cache.py``). ``compact_ratio`` (default :data:`COMPACT_RATIO`) 0 never compacts (then
    sampled tokens equal ``model.generate``'s under the same torch seed). ``uniforms`` [B, max_new_tokens]: each
    row's own random stream (module docstring); without it rows draw with ``torch.multinomial``. ``on_finish(n)``
    is called whenever ``n`` rows have ended (eos, or the token limit for the rest), for progress reports.
    ``fast_step`` False calls the model for every step even where ``decode_step_for`` has a step (same tokens).
    ``numerics``: a key of :data:`NUMERICS`: ``exact`` (the model's logits bitwise, transformers' processors) or
    ``fast`` (grouped-query attention, which needs a cache with one entry per key/value head, top-p without a full
    sort, identical prompts prefilled once: the same rules within float rounding)."""
    how, ratio = numerics_of(numerics), (COMPACT_RATIO if compact_ratio is None else compact_ratio)
    processors = logits_processors(params, greedy, how.top_p)
    batch, device = input_ids.shape[0], input_ids.device
    seqs, mask = input_ids, attention_mask  # prompt + generated tokens of the rows (the repetition penalty reads them)
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
    # each row's index in the input, and whether it is still sampling
    rows, unfinished = torch.arange(batch, device=device), torch.ones(batch, dtype=torch.bool, device=device)
    generated, ended = [[] for _ in range(batch)], [False] * batch  # each row's tokens; whether it drew eos
    step_ids = input_ids  # the tokens of the next forward pass (the prompts, then each row's last token)
    one_token_step = decode_step_for(model, cache, how.step) if fast_step else None
    for step in range(params.max_new_tokens):
        if step == 0:
            logits = prefill(model, step_ids, mask, positions, cache, how.share_prompts)
        else:
            logits = _next_logits(model, one_token_step, step_ids, positions, mask, cache)
        tokens = _next_tokens(processors, seqs, logits, greedy, None if uniforms is None else uniforms[rows, step])
        tokens = torch.where(unfinished, tokens, torch.full_like(tokens, pad_token_id))
        unfinished = _record_tokens(rows, tokens, unfinished, generated, ended, eos_token_id, on_finish)
        seqs = torch.cat([seqs, tokens[:, None]], dim=-1)
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
        step_ids, positions = tokens[:, None], positions[:, -1:] + 1
        live = int(unfinished.sum())
        if live == 0:
            break
        if step == params.max_new_tokens - 1 and on_finish is not None:
            on_finish(live)  # truncated at the token limit
        if live <= ratio * unfinished.shape[0]:  # drop the finished rows from the batch and the cache
            seqs, mask, positions, rows, step_ids, unfinished = _still_sampling(
                cache, unfinished, seqs, mask, positions, rows, step_ids
            )
    return [(ids, not done) for ids, done in zip(generated, ended, strict=True)]
