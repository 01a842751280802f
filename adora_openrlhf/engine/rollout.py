"""Batched generation with ``transformers`` and scoring into the sampler's :class:`ScoredResponse`.

:class:`RolloutEngine` adapts the model to the algorithm core: :meth:`RolloutEngine.generate_fn` returns
the ``generate(requests) -> list[list[ScoredResponse]]`` callable that :class:`AdaptiveSampler` drives.
All requests of a round that share sampling parameters go through as few ``model.generate`` calls as
possible (left-padded batches of ``generation_batch_size`` sequences, KV cache on); every request's
temperature, top_p, top_k, min_p, repetition_penalty and max_new_tokens are honoured. Each response is
decoded, scored by its row's reward function, and carried as a :class:`RolloutSample` payload (token ids
for the policy update).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from adora_openrlhf.algorithms.sampling import GenerationRequest, SamplingParams, ScoredResponse
from adora_openrlhf.engine.decoding import compact_decode, numerics_of
from adora_openrlhf.engine.kv_cache import attention_reads_cache, full_attention_only, growing_cache_for
from adora_openrlhf.engine.model_config import ModelConfig
from adora_openrlhf.rewards.grading import GradingJob, StepGrader


@dataclass
class RolloutSample:
    """One generated response with what the update and the metrics need."""

    row_index: int
    prompt_ids: list[int]
    response_ids: list[int]  # includes the eos token when the response finished
    text: str
    correct: bool
    info: dict[str, float] = field(default_factory=dict)


def generation_config(params: SamplingParams, tokenizer, greedy: bool = False):
    """A ``transformers.GenerationConfig`` for ``params`` (vLLM conventions mapped: top_k -1 -> 0 = off)."""
    from transformers import GenerationConfig

    common = dict(
        max_new_tokens=params.max_new_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        repetition_penalty=params.repetition_penalty,
        use_cache=True,
    )
    if greedy:
        return GenerationConfig(do_sample=False, **common)
    return GenerationConfig(
        do_sample=True,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=0 if params.top_k == -1 else params.top_k,
        min_p=params.min_p if params.min_p > 0 else None,
        **common,
    )


@dataclass(frozen=True)
class GenerationSettings:
    """How the local backend decodes, for rollouts and evaluation alike (the settings ``model.generation_batch_size``,
    ``model.kv_cache``, ``model.decoding`` and ``model.numerics``; see :func:`generate_responses`)."""

    batch_size: int  # sequences per decoding batch
    kv_cache: str = "growing"
    decoding: str = "compact"
    numerics: str = "exact"

    @classmethod
    def of(cls, model_cfg: ModelConfig) -> GenerationSettings:
        return cls(model_cfg.generation_batch_size, model_cfg.kv_cache, model_cfg.decoding, model_cfg.numerics)

    def generate(
        self,
        model,
        tokenizer,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        greedy: bool = False,
        extras=None,
    ):
        """:func:`generate_responses` with these settings."""
        return generate_responses(
            model,
            tokenizer,
            prompts,
            params,
            self.batch_size,
            greedy=greedy,
            extras=extras,
            kv_cache=self.kv_cache,
            decoding=self.decoding,
            numerics=self.numerics,
        )


def left_padded(prompts: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, attention mask)`` [len(prompts), longest prompt] of the token-id ``prompts``, padded on the left with ``pad``."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids, mask


def compact_decode_batch(
    model,
    ids,
    mask,
    params,
    eos_pad,
    kv_cache="growing",
    greedy=False,
    uniforms=None,
    on_finish=None,
    fast_step=True,
    numerics="exact",
) -> list[tuple[list[int], bool]]:
    """Compact decoding (``decoding.py``) of one left-padded batch (``ids``, ``mask`` [B, W]; ``eos_pad`` = (eos id,
    pad id)) with a fresh cache of kind ``kv_cache`` ("growing", else transformers' ``DynamicCache``, which is
    also taken when the model cannot use the growing one). ``numerics`` (``decoding.NUMERICS``): "exact" lets the
    growing cache repeat key/value heads on CPU; "fast" keeps one entry per head (its attention reads them grouped)."""
    tokens = ids.shape[0] * (ids.shape[1] + params.max_new_tokens) if numerics_of(numerics).step == "exact" else None
    cache = growing_cache_for(model, tokens) if kv_cache == "growing" else None
    if cache is None:
        from transformers import DynamicCache

        cache = DynamicCache()
    with attention_reads_cache(model, cache):
        return compact_decode(
            model,
            ids,
            mask,
            params,
            *eos_pad,
            cache,
            greedy=greedy,
            uniforms=uniforms,
            on_finish=on_finish,
            fast_step=fast_step,
            numerics=numerics,
        )


@torch.no_grad()
def _decoding_plan(
    model, tokenizer, params: SamplingParams, greedy: bool, extras, decoding: str, uniforms, numerics: str
):
    """(``generate``'s config, whether compact decoding runs) of :func:`generate_responses`; bad choices refused first."""
    numerics_of(numerics)  # an unknown name is refused before anything runs
    config = generation_config(params, tokenizer, greedy)
    with_images = extras is not None and any(extras)
    if with_images:
        from adora_openrlhf.engine.vlm import vision_token_ids

        config.suppress_tokens = vision_token_ids(model)
    compact = decoding == "compact" and not with_images and full_attention_only(model)
    if uniforms is not None and not compact:
        raise ValueError(
            "uniforms: per-row random streams need compact decoding (text prompts of a full-attention model)"
        )
    return config, compact


def generate_responses(
    model,
    tokenizer,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    batch_size: int,
    greedy: bool = False,
    extras: Sequence[dict[str, torch.Tensor] | None] | None = None,
    kv_cache: str = "growing",
    decoding: str = "compact",
    uniforms: torch.Tensor | None = None,
    on_finish: Callable[[int], None] | None = None,
    fast_step: bool = True,
    numerics: str = "exact",
) -> list[tuple[list[int], bool]]:
    """``(response ids, truncated)`` for each prompt (token ids), in order.

    A response ends at (and includes) the first eos; ``truncated`` is True when it hit ``max_new_tokens``
    without one. ``extras[i]``: prompt ``i``'s extra model inputs (a vision-language prompt's pixel values
    and image grid, see ``vlm.py``), passed to ``generate`` with its batch; vision special tokens are then
    never sampled. ``kv_cache``: "growing" (``kv_cache.py``, same tokens, faster) or "dynamic" (transformers'
    default). ``decoding``: "compact" (``decoding.py``: finished sequences leave the batch; text prompts of
    full-attention models, others fall back to ``model.generate``) or "generate" (``model.generate``).
    ``uniforms`` [len(prompts), max_new_tokens]: each prompt's own random stream for sampling (compact decoding
    only; see ``decoding.py``). ``on_finish(n)``: called as responses end (per batch with ``model.generate``).
    ``fast_step``: compact decoding takes its one-token steps through ``decode_step.py`` where the model allows
    (bitwise the same logits); False calls the model's forward for every step. ``numerics`` (compact
    decoding only): ``exact`` or ``fast`` (``decoding.NUMERICS``).
    """
    config, compact = _decoding_plan(model, tokenizer, params, greedy, extras, decoding, uniforms, numerics)
    device = next(model.parameters()).device
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    was_training = model.training
    model.eval()
    out: list[tuple[list[int], bool]] = []
    try:
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            ids, mask = (t.to(device) for t in left_padded(chunk, pad))
            if compact:
                rows_uniforms = uniforms[start : start + batch_size].to(device) if uniforms is not None else None
                options = dict(kv_cache=kv_cache, greedy=greedy, on_finish=on_finish, fast_step=fast_step)
                out.extend(
                    compact_decode_batch(
                        model, ids, mask, params, (eos, pad), uniforms=rows_uniforms, numerics=numerics, **options
                    )
                )
                continue
            chunk_extras = extras[start : start + batch_size] if extras is not None else None
            out.extend(_generate_batch(model, ids, mask, chunk_extras, config, params.max_new_tokens, kv_cache, eos))
            if on_finish is not None:
                on_finish(len(chunk))
    finally:
        model.train(was_training)
    return out


def _generate_batch(
    model, ids: torch.Tensor, mask: torch.Tensor, extras, config, max_new_tokens: int, kv_cache: str, eos: int
) -> list[tuple[list[int], bool]]:
    """One left-padded batch through ``model.generate`` (vision inputs ``extras`` when given; the growing KV cache
    with ``kv_cache="growing"``): ``(response ids up to and including the first eos, truncated)`` per row."""
    more = {}
    if extras is not None:
        from adora_openrlhf.engine.vlm import extra_model_inputs

        more = extra_model_inputs(model, ids, extras)
    width = ids.shape[1]
    cache = growing_cache_for(model, ids.shape[0] * (width + max_new_tokens)) if kv_cache == "growing" else None
    if cache is not None:
        more["past_key_values"] = cache
    with attention_reads_cache(model, cache):
        generated = model.generate(input_ids=ids, attention_mask=mask, generation_config=config, **more)
    return [(row[: row.index(eos) + 1], False) if eos in row else (row, True) for row in generated[:, width:].tolist()]


class RolloutEngine:
    """Generates and scores responses for one step's prompts; accumulates generate/score wall time."""

    def __init__(
        self,
        model,
        tokenizer,
        prompt_ids: Sequence[Sequence[int]],
        rows: Sequence[Any],
        reward_fns: Sequence[Any],
        positive_threshold: float,
        settings: GenerationSettings,
        extras: Sequence[dict[str, torch.Tensor] | None] | None = None,
        grader: StepGrader | None = None,
    ):
        self.model = model
        self.settings = settings
        self.extras = extras  # per training row: extra model inputs of its prompt (vision rows), or None
        self.tokenizer = tokenizer
        self.prompt_ids = prompt_ids  # token ids of every training row's rendered prompt
        self.rows = rows
        self.reward_fns = reward_fns
        self.positive_threshold = positive_threshold
        self.grader = grader or StepGrader()  # one grading deadline per step (rewards/grading.py)
        self.generate_seconds = 0.0
        self.score_seconds = 0.0

    def reset_timers(self) -> None:
        """A new step: its timers, and its grading deadline and late count."""
        self.generate_seconds = 0.0
        self.score_seconds = 0.0
        self.grader.start_step()

    def score(self, items: Sequence[tuple[int, list[int], list[int], bool]]) -> list[ScoredResponse]:
        """Decode and grade ``(row_index, prompt ids, response ids, truncated)`` items together, under the step's
        grading deadline (a response not graded by then scores its task's failure reward)."""
        from adora_openrlhf.rewards.base import failure_reward

        texts = [self.tokenizer.decode(response, skip_special_tokens=True) for _, _, response, _ in items]
        jobs = [
            GradingJob(
                self.reward_fns[row],
                text,
                self.rows[row].label,
                self.rows[row].meta,
                failure_reward(self.rows[row].source, self.rows[row].meta),
            )
            for (row, _, _, _), text in zip(items, texts, strict=True)
        ]
        scored = []
        for (row, prompt, response, truncated), text, result in zip(items, texts, self.grader.grade(jobs), strict=True):
            sample = RolloutSample(row, list(prompt), list(response), text, bool(result.correct), dict(result.info))
            scored.append(
                ScoredResponse(
                    reward=float(result.reward),
                    positive=float(result.reward) > self.positive_threshold,
                    length=len(response),
                    truncated=truncated,
                    payload=sample,
                )
            )
        return scored

    def generate_fn(self, batch_rows: Sequence[int]):
        """The sampler's ``generate`` callable for a step whose prompt ``i`` is training row ``batch_rows[i]``."""

        def generate(requests: Sequence[GenerationRequest]) -> list[list[ScoredResponse]]:
            by_params: dict[SamplingParams, list[tuple[int, int]]] = {}
            for r_index, req in enumerate(requests):
                by_params.setdefault(req.params, []).extend(
                    (r_index, batch_rows[req.prompt_index]) for _ in range(req.num_samples)
                )
            outputs: list[list[ScoredResponse]] = [[] for _ in requests]
            for params, items in by_params.items():
                t0 = time.perf_counter()
                prompts = [self.prompt_ids[row] for _, row in items]
                more = {"extras": [self.extras[row] for _, row in items]} if self.extras is not None else {}
                responses = self.settings.generate(self.model, self.tokenizer, prompts, params, **more)
                t1 = time.perf_counter()
                done = [
                    (row, prompt, response, truncated)
                    for (_, row), prompt, (response, truncated) in zip(items, prompts, responses, strict=True)
                ]
                graded = self.score(done)
                for (r_index, _), scored in zip(items, graded, strict=True):
                    outputs[r_index].append(scored)
                self.generate_seconds += t1 - t0
                self.score_seconds += time.perf_counter() - t1
            return outputs

        return generate


def encode_prompts(tokenizer, texts: Sequence[str], max_tokens: int, where: str | Sequence[str]) -> list[list[int]]:
    """Token ids of each prompt text; a prompt over ``max_tokens`` raises naming its row (``where``: one location
    such as ``train.jsonl:7`` per text, or a name for all, then rows are numbered from 1)."""
    from adora_openrlhf.config import ConfigError

    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    for i, p in enumerate(ids):
        at = where if isinstance(where, str) and where else None
        at = f"{at}:{i + 1}" if at is not None else where[i]
        if len(p) > max_tokens:
            raise ConfigError(
                f"{at}: field 'prompt': {len(p)} tokens, more than data.max_prompt_tokens={max_tokens}; raise it or shorten the prompt"
            )
        if not p:
            raise ConfigError(f"{at}: field 'prompt': encodes to no tokens")
    return ids


def make_reward_fns(rows: Sequence[Any]) -> list[Any]:
    from adora_openrlhf.rows import reward_fn_for

    cache: dict[str, Any] = {}
    return [cache.setdefault(r.source, reward_fn_for(r)) for r in rows]
