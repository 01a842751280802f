"""The local backend's critic for ``advantage.estimator gae``: a value model, its optimiser, its update and its files.

The critic is the policy's architecture with a scalar head (``AutoModelForTokenClassification`` of the policy's
config, ``num_labels=1``, no dropout), built when the warm-up ends; with ``critic.warm_start`` its transformer starts
as a copy of the policy's (OpenRLHF starts its critic from a pretrained model too), the head at random with std
``1 / (hidden + 1)`` as OpenRLHF's ``init_value_head``. Like OpenRLHF's ``CriticModel``, the value of action token
``t + 1`` is the head's output at position ``t``: ``values [B, L - 1]`` lines up with the packed batch's
``action_mask`` (``update.py``).

Each step (:func:`critic_update`): ``critic.epochs`` passes over the step's responses in micro-batches, loss
``algorithms.critic.value_loss`` (clipped around the values the advantages were computed with, targets the GAE
returns, never ADORA-weighted), one AdamW step per pass after clipping the gradient norm to ``critic.max_grad_norm``.

Files: checkpoint ``step_N/critic/model.safetensors`` (the weights; safetensors, no pickle) and
``step_N/critic/optimizer.pt`` (tensors and numbers, read back with ``torch.load(weights_only=True)``); the checkpoint's
manifest covers both (``rundir/checkpoints.py``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from adora_openrlhf.algorithms.critic import CriticConfig, value_loss
from adora_openrlhf.backends.local.update import MICRO_BATCH_SHARES, PackedBatch, _slice
from adora_openrlhf.rundir import checkpoints as ckpt

CRITIC_DIR = "critic"  # in a checkpoint directory


@dataclass
class Critic:
    """The value model and its optimiser."""

    model: Any
    optimizer: torch.optim.Optimizer

    def save(self, directory: Path) -> None:
        """``directory/critic/``: the weights (safetensors) and the optimiser state."""
        from safetensors.torch import save_file

        out = directory / CRITIC_DIR
        out.mkdir()
        save_file(
            {k: v.detach().contiguous().cpu() for k, v in self.model.state_dict().items()}, out / "model.safetensors"
        )
        ckpt.save_tensors_file(self.optimizer.state_dict(), out / "optimizer.pt")

    def load(self, checkpoint: Path) -> None:
        """The weights and optimiser state saved in ``checkpoint``; a missing or unfit file is a ConfigError naming it."""
        from safetensors.torch import load_file

        weights = checkpoint / CRITIC_DIR / "model.safetensors"
        if not weights.is_file():
            raise ckpt.broken_checkpoint_error(
                checkpoint, f"{CRITIC_DIR}/model.safetensors is missing (the critic of advantage.estimator gae)"
            )
        try:
            self.model.load_state_dict(load_file(weights), strict=True)
            self.optimizer.load_state_dict(ckpt.read_tensors_file(checkpoint, f"{CRITIC_DIR}/optimizer.pt"))
        except (RuntimeError, ValueError, KeyError) as err:
            raise ckpt.broken_checkpoint_error(
                checkpoint, f"the critic's files do not fit this model ({' '.join(str(err).split())[:160]})"
            ) from None


def build_critic(policy, cfg: CriticConfig, seed: int, warm_start: bool) -> Critic:
    """A critic of ``policy``'s architecture (module docstring) on the policy's device, with its AdamW optimiser."""
    from transformers import AutoModelForTokenClassification

    config = copy.deepcopy(policy.config)
    config.num_labels, config.classifier_dropout = 1, 0.0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1_000_003)
        model = AutoModelForTokenClassification.from_config(config)
        torch.nn.init.normal_(model.score.weight, std=1.0 / (config.hidden_size + 1))
        if model.score.bias is not None:
            torch.nn.init.zeros_(model.score.bias)
    if warm_start:
        backbone = getattr(policy, policy.base_model_prefix)
        getattr(model, model.base_model_prefix).load_state_dict(backbone.state_dict())
    model.to(next(policy.parameters()).device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    return Critic(model, optimizer)


def _values(model, mb: PackedBatch) -> torch.Tensor:
    """``[b, l - 1]``: the head's output at position t is the value of action token t + 1."""
    out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False)
    return out.logits[..., 0][:, :-1].float()


def critic_values(critic: Critic, batch: PackedBatch, micro_batch_size: int) -> torch.Tensor:
    """The critic's values of every response token of ``batch``, ``[B, L - 1]``, 0 outside the action mask."""
    device = next(critic.model.parameters()).device
    width = batch.action_mask.shape[1]
    values = torch.zeros_like(batch.action_mask)
    critic.model.eval()
    with torch.no_grad():
        for start in range(0, batch.input_ids.shape[0], micro_batch_size):
            rows = slice(start, min(start + micro_batch_size, batch.input_ids.shape[0]))
            mb = _slice(batch, rows, device)
            part = _values(critic.model, mb).cpu() * mb.action_mask.cpu()
            values[rows, : min(part.shape[1], width)] = part
    return values


def critic_update(
    critic: Critic,
    batch: PackedBatch,
    returns: torch.Tensor,
    old_values: torch.Tensor,
    cfg: CriticConfig,
    micro_batch_size: int,
) -> dict[str, float]:
    """``cfg.epochs`` passes of the clipped value loss on ``batch`` (module docstring); the critic's metrics."""
    device = next(critic.model.parameters()).device
    size, total_tokens = batch.input_ids.shape[0], float(batch.action_mask.sum())
    share_of = MICRO_BATCH_SHARES["token_mean"]  # the token mean over the whole step, as OpenRLHF's ValueLoss
    params = [p for p in critic.model.parameters() if p.requires_grad]
    loss_sum = grad_sum = 0.0
    critic.model.train()
    for _ in range(cfg.epochs):
        critic.optimizer.zero_grad(set_to_none=True)
        for start in range(0, size, micro_batch_size):
            rows = slice(start, min(start + micro_batch_size, size))
            mb = _slice(batch, rows, device)
            width = mb.action_mask.shape[1]
            values = _values(critic.model, mb)
            loss = value_loss(
                values,
                old_values[rows, :width].to(device),
                returns[rows, :width].to(device=device, dtype=values.dtype),
                mb.action_mask,
                cfg.value_clip,
            )
            share = share_of(rows.stop - rows.start, size, float(mb.action_mask.sum()), total_tokens)
            (loss * share).backward()
            loss_sum += float(loss.detach()) * share / cfg.epochs
        grad_sum += float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)) / cfg.epochs
        critic.optimizer.step()
    mask = batch.action_mask
    count = float(mask.sum()) or 1.0
    return {
        "critic/value_loss": loss_sum,
        "critic/grad_norm": grad_sum,
        "critic/values_mean": float((old_values * mask).sum()) / count,
        "critic/returns_mean": float((returns * mask).sum()) / count,
        "critic/lr": cfg.lr,
    }
