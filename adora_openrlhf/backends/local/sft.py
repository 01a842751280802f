"""Supervised warm-up: next-token loss on task demonstrations, response tokens only.

A random-init model scores the minimum reward on every response, so GRPO would see only zero-signal
groups. A short supervised phase on demonstrations (registry :data:`DEMONSTRATIONS`, keyed by row source)
teaches the answer format and some of the task, which gives RL groups with mixed rewards to learn from.

K&K demonstration: ``<think>`` a one-line check naming every role ``</think>`` then the canonical solution
in the Logic-RL answer block, e.g.::

    <think>Alice knight, Bob knave.</think>
    <answer>(1) Alice is a knight
    (2) Bob is a knave</answer>
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable, Optional, Sequence

import torch
from tqdm.auto import tqdm

from adora_openrlhf.backends.local.update import pack, token_log_probs
from adora_openrlhf.config import ConfigError, WarmupConfig

Demonstration = Callable[[Any], str]  # row -> response text (without the eos token)
DEMONSTRATIONS: dict[str, Demonstration] = {}


def register_demonstration(source: str) -> Callable[[Demonstration], Demonstration]:
    def wrap(fn: Demonstration) -> Demonstration:
        DEMONSTRATIONS[source] = fn
        return fn

    return wrap


@register_demonstration("kk")
def kk_demonstration(row: Any) -> str:
    """Logic-RL format answer for a K&K row, from ``meta`` names/solution (or the label alone)."""
    names, solution = row.meta.get("names"), row.meta.get("solution")
    if names and solution is not None and len(names) == len(solution):
        check = ", ".join(f"{n} {'knight' if s else 'knave'}" for n, s in zip(names, solution))
    else:
        check = row.label.replace("\n", ", ")
    return f"<think>{check}.</think>\n<answer>{row.label}</answer>"


def demonstration_for(row: Any) -> str:
    if row.source in DEMONSTRATIONS:
        return DEMONSTRATIONS[row.source](row)
    solution = row.meta.get("solution_text") if isinstance(row.meta, dict) else None
    if isinstance(solution, str) and solution.strip():
        return solution
    raise ConfigError(
        f"warmup.steps: no demonstration for rows of source {row.source!r} (no registered builder and no meta.solution_text); "
        "set --warmup.steps 0 for a model that already follows the answer format"
    )


def supervised_warmup(
    model,
    tokenizer,
    prompt_ids: Sequence[Sequence[int]],
    rows: Sequence[Any],
    cfg: WarmupConfig,
    seed: int,
    micro_batch_size: int,
    extras: Optional[Sequence[Optional[dict[str, torch.Tensor]]]] = None,
) -> list[float]:
    """``cfg.steps`` AdamW steps (linear lr decay) on random batches of demonstrations; returns the losses.

    Loss = mean over response tokens of ``-log p(token)`` (the eos token included, so the model learns to stop).
    """
    if cfg.steps == 0:
        return []
    device = next(model.parameters()).device
    responses = [tokenizer(demonstration_for(r), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for r in rows]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1.0 - s / cfg.steps))
    rng = random.Random(f"warmup:{seed}")
    losses: list[float] = []
    model.train()
    bar = tqdm(range(cfg.steps), desc="warm-up (SFT)", unit="step", dynamic_ncols=True)
    for _ in bar:
        chosen = [rng.randrange(len(rows)) for _ in range(cfg.batch_size)]
        batch = pack([prompt_ids[i] for i in chosen], [responses[i] for i in chosen], tokenizer.pad_token_id,
                     [extras[i] for i in chosen] if extras is not None else None)
        optimizer.zero_grad(set_to_none=True)
        total_tokens = float(batch.action_mask.sum())
        step_loss = 0.0
        for start in range(0, len(chosen), micro_batch_size):
            rows_slice = slice(start, start + micro_batch_size)
            mask = batch.action_mask[rows_slice].to(device)
            width = int(batch.attention_mask[rows_slice].sum(-1).max())
            sub = type(batch)(batch.input_ids[rows_slice, :width].to(device), batch.attention_mask[rows_slice, :width].to(device), mask[:, : width - 1],
                              batch.extras[rows_slice] if batch.extras is not None else None)
            lp = token_log_probs(model, sub)
            loss = -(lp * sub.action_mask).sum() / total_tokens
            loss.backward()
            step_loss += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        if not math.isfinite(step_loss):
            raise FloatingPointError(f"warm-up loss is not finite ({step_loss}); lower --warmup.lr")
        losses.append(step_loss)
        bar.set_postfix(loss=f"{step_loss:.3f}")
    return losses
