"""The local backend's adapter of rollout allocation (``algorithms/allocation.py``): the step's candidate prompts
from the data order, the per-prompt statistics store (saved in every checkpoint), and what it learns from each
sampled group (the positives among every response generated for the prompt)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from adora_openrlhf.algorithms.allocation import Allocation, AllocationConfig, PromptStatsStore, allocate
from adora_openrlhf.algorithms.sampling import SamplingResult


class RolloutAllocator:
    """Chooses, per sampler call, which of its candidate prompts are sampled and with how many responses; holds the
    store and the step's allocation metrics (summed over the calls of a step, :meth:`pop_metrics`)."""

    def __init__(self, cfg: AllocationConfig, seed: int) -> None:
        self.cfg, self.seed = cfg, seed
        self.store = PromptStatsStore(cfg.prior, cfg.decay, cfg.max_prompts)
        self._metrics: dict[str, float] = {}
        self._predicted: list[float] = []  # predicted signal fraction of each sampler call of the step

    def num_candidates(self, prompts: int) -> int:
        """Prompts of the data order examined for ``prompts`` sampled ones: round(candidates * prompts), at least ``prompts``."""
        return max(prompts, round(self.cfg.candidates * prompts))

    def choose(self, keys: Sequence[str], prompts: int, group_size: int, step: int, position: int) -> Allocation:
        """The counts of the candidates ``keys`` (data positions ``position`` on) for a call that wants ``prompts`` groups."""
        rng = random.Random(f"allocation:{self.seed}:{step}:{position}")
        allocation = allocate(self.store, keys, prompts, group_size, self.cfg, rng)
        for name, value in allocation.metrics.items():
            if name == "allocation/store_size":
                self._metrics[name] = value
            elif name != "allocation/predicted_signal_fraction":
                self._metrics[name] = self._metrics.get(name, 0.0) + value
        self._predicted.append(allocation.metrics["allocation/predicted_signal_fraction"])
        return allocation

    def observe(self, keys: Sequence[str], result: SamplingResult) -> None:
        """Add each sampled group's pool (positives of every response generated for it) to the store; ``keys`` are the
        sampled prompts' keys in the sampler's prompt order."""
        for group in result.groups:
            self.store.observe(keys[group.prompt_index], group.pool_positives, len(group.pool_rewards))

    def pop_metrics(self) -> dict[str, float]:
        """The step's allocation metrics (counts summed over its sampler calls), then reset."""
        out = dict(self._metrics)
        if self._predicted:
            out["allocation/predicted_signal_fraction"] = sum(self._predicted) / len(self._predicted)
        self._metrics, self._predicted = {}, []
        return out

    def state_dict(self) -> dict[str, Any]:
        return self.store.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.store.load_state_dict(state)
