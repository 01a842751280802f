"""Supervised warm-up: next-token loss on task demonstrations, response tokens only.

A random-init model scores the minimum reward on every response, so GRPO would see only zero-signal
groups. A short supervised phase on demonstrations teaches the answer format and some of the task, which
gives RL groups with mixed rewards to learn from.

Demonstrations come from a registry keyed by (row source, style) (``tasks/behaviours.py``, :data:`DEMONSTRATIONS`;
the K&K ones are declared in ``tasks/kk_demonstrations.py``). The K&K styles:

- ``direct``: ``<think>`` the roles in one line ``</think>`` then the answer (no reasoning shown);
- ``thorough``: guess-and-check reasoning that tests candidates against every statement step by step
  (``tasks.kk.thorough_trace``); long, and right whenever it is executed correctly;
- ``shortcut``: ``<think>guess.</think>`` and a random answer; short, and right only by luck;
- ``restate``: the whole quiz read back, then a guess and a random answer (``tasks.kk.restate_think``);
  right only by luck, but about as long as a short thorough trace, so that response length alone does not
  tell a checked answer from a guess.

The warm-up has two phases (:class:`~adora_openrlhf.config.WarmupConfig`): ``steps`` on one style, then
``mix_steps`` on a mixture of styles (``mix``: style -> share). The K&K testbed first teaches the thorough
trace alone, so that it is executed reliably, then mixes in shortcuts so that the warmed-up policy mostly
guesses: RL then has a behaviour to select (thorough reasoning, which is longer and right more often).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from adora_openrlhf.backends.local.update import pack, token_log_probs
from adora_openrlhf.config import WarmupConfig
from adora_openrlhf.tasks.behaviours import RANDOMISED_DEMONSTRATIONS, demonstration_for


def warmup_styles(cfg: WarmupConfig) -> list[str]:
    """Styles the warm-up uses (phase 1 style, then the mixture's styles with a positive share)."""
    styles: list[str] = []
    if cfg.steps > 0:
        styles = _mix_weights(cfg.style_shares)[0] if cfg.style_shares else [cfg.style]
    if cfg.mix_steps > 0:
        styles += [s for s, share in cfg.mix.items() if share > 0 and s not in styles]
    return styles


def warmup_lr_factor(step: int, steps: int, ramp: float) -> float:
    """The learning-rate multiplier of optimiser step ``step`` (0-based) of ``steps``: a linear rise over the
    first ``r = ceil(ramp * steps)`` steps, ``(step + 1) / r``, then a linear decay, ``(steps - step) / (steps - r)``,
    reaching ``1 / (steps - r)`` at the last step (``r = 0``: the decay alone, ``1 - step / steps``). When the rise
    takes every step (``r = steps``, e.g. one step with any ramp) there is no decay; 0 after the last step."""
    rise = math.ceil(ramp * steps)
    if step < rise:
        return (step + 1) / rise
    if rise == 0:
        return max(0.0, 1.0 - step / steps)
    return max(0.0, (steps - step) / max(1, steps - rise))


def _accumulate_gradients(model, batch, size: int, micro_batch_size: int, device) -> float:
    """Backpropagate the batch's negative log-likelihood of its response tokens, summed over tokens and divided by
    the batch's token count, micro-batch by micro-batch (each cut to its longest row); returns the loss."""
    total_tokens = float(batch.action_mask.sum())
    step_loss = 0.0
    for start in range(0, size, micro_batch_size):
        rows_slice = slice(start, start + micro_batch_size)
        mask = batch.action_mask[rows_slice].to(device)
        width = int(batch.attention_mask[rows_slice].sum(-1).max())
        sub = type(batch)(
            batch.input_ids[rows_slice, :width].to(device),
            batch.attention_mask[rows_slice, :width].to(device),
            mask[:, : width - 1],
            batch.extras[rows_slice] if batch.extras is not None else None,
        )
        lp = token_log_probs(model, sub)
        loss = -(lp * sub.action_mask).sum() / total_tokens
        loss.backward()
        step_loss += float(loss.detach())
    return step_loss


def _phase(
    model,
    tokenizer,
    prompt_ids,
    rows,
    steps: int,
    lr: float,
    batch_size: int,
    pick_style,
    rng: random.Random,
    micro_batch_size: int,
    desc: str,
    extras: Sequence[Any] | None = None,
    ramp: float = 0.0,
) -> list[float]:
    """``steps`` AdamW steps (lr schedule :func:`warmup_lr_factor`) on random batches of demonstrations; returns the
    losses. ``extras`` holds each row's extra model inputs (images) or is None for text rows."""
    device = next(model.parameters()).device
    cache: dict[tuple[int, str], list[int]] = {}  # deterministic styles are tokenized once per row

    def response_ids(i: int, style: str) -> list[int]:
        key = (i, style)
        if key in cache:
            return cache[key]
        ids = tokenizer(demonstration_for(rows[i], style, rng), add_special_tokens=False)["input_ids"] + [
            tokenizer.eos_token_id
        ]
        if (rows[i].source, style) not in RANDOMISED_DEMONSTRATIONS:
            cache[key] = ids
        return ids

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_lr_factor(s, steps, ramp))
    losses: list[float] = []
    model.train()
    bar = tqdm(range(steps), desc=desc, unit="step", dynamic_ncols=True)
    for _ in bar:
        chosen = [rng.randrange(len(rows)) for _ in range(batch_size)]
        responses = [response_ids(i, pick_style()) for i in chosen]
        # micro-batches of similar length waste less compute on padding (the loss is a sum over tokens)
        order = sorted(range(len(chosen)), key=lambda j: len(prompt_ids[chosen[j]]) + len(responses[j]))
        chosen, responses = [chosen[j] for j in order], [responses[j] for j in order]
        batch = pack(
            [prompt_ids[i] for i in chosen],
            responses,
            tokenizer.pad_token_id,
            [extras[i] for i in chosen] if extras is not None else None,
        )
        optimizer.zero_grad(set_to_none=True)
        step_loss = _accumulate_gradients(model, batch, len(chosen), micro_batch_size, device)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        if not math.isfinite(step_loss):
            raise FloatingPointError(f"warm-up loss is not finite ({step_loss}); lower --warmup.lr")
        losses.append(step_loss)
        bar.set_postfix(loss=f"{step_loss:.3f}")
    return losses


def supervised_warmup(
    model,
    tokenizer,
    prompt_ids: Sequence[Sequence[int]],
    rows: Sequence[Any],
    cfg: WarmupConfig,
    seed: int,
    micro_batch_size: int,
    extras: Sequence[dict[str, torch.Tensor] | None] | None = None,
) -> list[float]:
    """Both warm-up phases; returns the per-step losses (phase 1 then phase 2).

    Loss = mean over response tokens of ``-log p(token)`` (the eos token included, so the model learns to stop).
    Phase 1: ``cfg.steps`` steps on style ``cfg.style`` (or styles drawn from ``cfg.style_shares``). Phase 2: ``cfg.mix_steps`` steps where each
    demonstration's style is drawn from ``cfg.mix`` (shares normalised to sum to 1).
    """
    rng = random.Random(f"warmup:{seed}")
    losses: list[float] = []
    if cfg.steps > 0:
        if cfg.style_shares:
            first, first_weights = _mix_weights(cfg.style_shares)
            pick, name = (lambda: rng.choices(first, first_weights)[0]), "+".join(first)
        else:
            pick, name = (lambda: cfg.style), cfg.style
        losses += _phase(
            model,
            tokenizer,
            prompt_ids,
            rows,
            cfg.steps,
            cfg.lr,
            cfg.batch_size,
            pick,
            rng,
            micro_batch_size,
            f"warm-up (SFT, {name})",
            extras,
            cfg.lr_ramp,
        )
    if cfg.mix_steps > 0:
        styles, weights = _mix_weights(cfg.mix)
        losses += _phase(
            model,
            tokenizer,
            prompt_ids,
            rows,
            cfg.mix_steps,
            cfg.mix_lr,
            cfg.batch_size,
            lambda: rng.choices(styles, weights)[0],
            rng,
            micro_batch_size,
            "warm-up (SFT, mixed)",
            extras,
            cfg.lr_ramp,
        )
    return losses


def _mix_weights(mix: Mapping[str, float]) -> tuple[list[str], list[float]]:
    styles = [s for s, w in mix.items() if w > 0]
    return styles, [float(mix[s]) for s in styles]
