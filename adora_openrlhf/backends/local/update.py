"""The policy update of one RL step: pack responses, token log-probs, PPO-clip loss, AdamW step.

Sequences are ``prompt + response`` right-padded into ``[B, L]``; ``action_mask[b, t] = 1`` when token
``t + 1`` of sequence ``b`` is a response token, so it lines up with the next-token log-probs
``log p(x_{t+1} | x_{<=t})`` of shape ``[B, L - 1]``.

Old log-probs: with one PPO epoch the rollout policy equals the current one, so ``old = log_probs.detach()``
(ratio 1, the plain policy gradient, no extra forward pass); with more epochs they come from a no-grad pass
before the first update. The loss of each micro-batch is weighted by its share of the step
(:data:`MICRO_BATCH_SHARES`): for ``token_mean`` its response tokens over the step's response tokens, so the
accumulated loss is DAPO's token mean over the whole step; for the per-sequence modes its sequences over the
step's sequences. The gradient therefore does not depend on ``micro_batch_size``. The gradients of all
micro-batches are accumulated into one optimiser step per epoch, after clipping their global norm to
``max_grad_norm``.

``train/entropy`` is the mean next-token entropy ``H_t = -sum_v p(v | x_{<=t}) log p(v | x_{<=t})`` of the policy
(softmax at temperature 1) over every response token of the step, computed from the first epoch's forward pass
(the policy that sampled the responses), so it costs no extra forward pass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from adora_openrlhf.algorithms.policy_loss import policy_loss
from adora_openrlhf.config import PolicyLossConfig


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    action_mask: torch.Tensor  # [B, L - 1], 1 where the predicted token is a response token
    extras: list[dict[str, torch.Tensor] | None] | None = (
        None  # per sequence: its prompt's extra model inputs (vision rows)
    )


def pack(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_id: int,
    extras: Sequence[dict[str, torch.Tensor] | None] | None = None,
) -> PackedBatch:
    """Right-padded ``prompt + response`` sequences with the response (action) mask; ``extras[b]`` are the
    extra model inputs of sequence ``b``'s prompt (pixel values of a vision row), kept for the forward pass."""
    if len(prompts) != len(responses):
        raise ValueError(f"responses: {len(responses)} responses for {len(prompts)} prompts")
    width = max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(prompts), width), dtype=torch.long)
    action = torch.zeros((len(prompts), width - 1), dtype=torch.float32)
    for b, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        seq = list(p) + list(r)
        ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attn[b, : len(seq)] = 1
        action[b, len(p) - 1 : len(seq) - 1] = 1.0
    return PackedBatch(ids, attn, action, list(extras) if extras is not None else None)


def _next_token_log_softmax(model, batch: PackedBatch) -> torch.Tensor:
    """``log p(. | x_{<=t})`` over the vocabulary for every position, ``[B, L - 1, V]``."""
    more = {}
    if batch.extras is not None:
        from adora_openrlhf.engine.vlm import extra_model_inputs

        more = extra_model_inputs(model, batch.input_ids, batch.extras)
    logits = (
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False, **more)
        .logits[:, :-1]
        .float()
    )
    return torch.log_softmax(logits, dim=-1)


def _gather_targets(log_probs: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    return log_probs.gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def token_log_probs(model, batch: PackedBatch) -> torch.Tensor:
    """``log p(x_{t+1} | x_{<=t})`` for every position, ``[B, L - 1]``."""
    return _gather_targets(_next_token_log_softmax(model, batch), batch)


def token_log_probs_and_entropy(model, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Token log-probs (as :func:`token_log_probs`) and the policy's next-token entropy ``[B, L - 1]`` from the
    same forward pass; the entropy is detached (a metric, no gradient)."""
    log_probs = _next_token_log_softmax(model, batch)
    with torch.no_grad():
        entropy = entropy_from_log_probs(log_probs.detach())
    return _gather_targets(log_probs, batch), entropy


def entropy_from_log_probs(log_probs: torch.Tensor) -> torch.Tensor:
    """Entropy of each distribution along the last axis, ``H = -sum_v p_v log p_v`` with ``p = exp(log_probs)``;
    a zero-probability entry contributes 0 (not ``0 * -inf``). Uniform over V gives ``log V``, one-hot gives 0."""
    probs = log_probs.exp()
    return -(probs * log_probs.masked_fill(probs == 0, 0.0)).sum(-1)


def _slice(batch: PackedBatch, rows: slice, device) -> PackedBatch:
    ids = batch.input_ids[rows]
    width = int(batch.attention_mask[rows].sum(-1).max())  # drop columns that are padding for the whole slice
    extras = batch.extras[rows] if batch.extras is not None else None
    return PackedBatch(
        ids[:, :width].to(device),
        batch.attention_mask[rows, :width].to(device),
        batch.action_mask[rows, : width - 1].to(device),
        extras,
    )


# loss_agg -> share of one micro-batch in the step: fn(rows, total rows, response tokens, total response tokens)
MICRO_BATCH_SHARES: dict[str, Any] = {
    "token_mean": lambda rows, total_rows, tokens, total_tokens: tokens / max(total_tokens, 1.0),
    "seq_mean_token_mean": lambda rows, total_rows, tokens, total_tokens: rows / total_rows,
    "seq_mean_token_sum_norm": lambda rows, total_rows, tokens, total_tokens: rows / total_rows,
}


def reference_context(ref_model, policy):
    """Context in which ``model`` computes reference log-probs: a frozen copy, or the LoRA base (adapters off)."""
    if ref_model is not None:
        return ref_model, contextlib.nullcontext()
    return policy, policy.disable_adapter()


def _fixed_log_probs(
    model, batch: PackedBatch, slices: Sequence[slice], cfg: PolicyLossConfig, ref_model: Any | None, device
) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
    """Per micro-batch, the log-probs that stay fixed over the PPO epochs: the reference's (when ``kl_coef > 0``;
    ``ref_model`` None = the LoRA policy with its adapters off) and the sampling policy's (when ``ppo_epochs > 1``)."""
    ref_lp: list[torch.Tensor | None] = [None] * len(slices)
    old_lp: list[torch.Tensor | None] = [None] * len(slices)
    with torch.no_grad():
        for i, rows in enumerate(slices):
            mb = _slice(batch, rows, device)
            if cfg.kl_coef > 0:
                ref, ctx = reference_context(ref_model, model)
                with ctx:
                    ref_lp[i] = token_log_probs(ref, mb)
            if cfg.ppo_epochs > 1:
                old_lp[i] = token_log_probs(model, mb)
    return ref_lp, old_lp


def policy_update(
    model,
    optimizer: torch.optim.Optimizer,
    batch: PackedBatch,
    advantages: torch.Tensor,
    cfg: PolicyLossConfig,
    norm_length: int,
    ref_model: Any | None = None,
    use_lora_reference: bool = False,
    lrs: Sequence[float] | None = None,
) -> dict[str, float]:
    """One or more PPO epochs over ``batch`` with per-sequence ``advantages`` [B] (or per-token [B, L - 1]); returns metrics. ``lrs``: the
    learning rate of each epoch's optimiser step (the schedule's values); None keeps the optimiser's."""
    device = next(model.parameters()).device
    size = batch.input_ids.shape[0]
    slices = [slice(s, min(s + cfg.micro_batch_size, size)) for s in range(0, size, cfg.micro_batch_size)]
    params = [p for p in model.parameters() if p.requires_grad]
    ref_lp, old_lp = _fixed_log_probs(model, batch, slices, cfg, None if use_lora_reference else ref_model, device)
    share_of = MICRO_BATCH_SHARES[cfg.loss_agg]
    total_tokens = float(batch.action_mask.sum())
    sums = dict.fromkeys(("loss", "pg_loss", "kl", "clip_fraction", "ratio_mean", "grad_norm", "lr"), 0.0)
    model.train()
    entropy_sum = 0.0
    for epoch in range(cfg.ppo_epochs):
        optimizer.zero_grad(set_to_none=True)
        for i, rows in enumerate(slices):
            mb = _slice(batch, rows, device)
            share = share_of(rows.stop - rows.start, size, float(batch.action_mask[rows].sum()), total_tokens)
            if epoch == 0:  # the policy that sampled the responses: its entropy, from the loss's own forward pass
                lp, entropy = token_log_probs_and_entropy(model, mb)
                entropy_sum += float((entropy * mb.action_mask).sum())
            else:
                lp = token_log_probs(model, mb)
            adv = advantages[rows]  # [b] per sequence, or [b, L - 1] per token (gae, reinforce)
            adv = adv[:, : lp.shape[1]] if adv.dim() == 2 else adv
            out = policy_loss(
                lp,
                old_lp[i] if old_lp[i] is not None else lp.detach(),
                adv.to(device=device, dtype=lp.dtype),
                mb.action_mask,
                clip_eps_low=cfg.clip_eps_low,
                clip_eps_high=cfg.clip_eps_high,
                loss_agg=cfg.loss_agg,
                kl_coef=cfg.kl_coef,
                ref_log_probs=ref_lp[i],
                norm_length=norm_length,
            )
            (out.loss * share).backward()
            for key in ("loss", "pg_loss", "kl", "clip_fraction", "ratio_mean"):
                sums[key] += float(getattr(out, key).detach()) * share / cfg.ppo_epochs
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        sums["grad_norm"] += float(grad_norm) / cfg.ppo_epochs
        if lrs is not None:
            for group in optimizer.param_groups:
                group["lr"] = lrs[epoch]
        sums["lr"] += optimizer.param_groups[0]["lr"] / cfg.ppo_epochs
        optimizer.step()
    sums["entropy"] = entropy_sum / max(total_tokens, 1.0)
    return {f"train/{k}": v for k, v in sums.items()}
