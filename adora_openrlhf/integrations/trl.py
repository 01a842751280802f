"""``AdoraGRPOTrainer``: TRL's ``GRPOTrainer`` whose advantages, sampling and filtering come from the core.

``pip install adora_openrlhf[trl]`` (tested with trl 1.16.0)::

    from adora_openrlhf.integrations.trl import AdoraGRPOConfig, AdoraGRPOTrainer
    args = AdoraGRPOConfig(output_dir="out", num_generations=8, correct_threshold=1.0,
                           adora_enabled=True, sampling_enabled=True, sampling_exit_rule="balance")
    AdoraGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data).train()

One generation batch of TRL (``_generate_and_score_completions``) becomes:

1. **Sampling.** Plain: TRL generates and scores ``num_generations`` completions per prompt, as always. With
   ``sampling_enabled``: the core's :class:`AdaptiveSampler` runs rounds over the batch's prompts; each round calls
   TRL's own ``_generate`` (with the round's sampling parameters: ``sampling_escalation`` from round 1 on) and
   ``_calculate_rewards`` on the still-active prompts, retires prompts by the exit rule, and down-samples each pool
   to ``num_generations``. With ``dynamic_filtering_enabled``: :func:`filter_and_refill` drops the groups whose share
   of correct completions lies outside ``dynamic_filtering_score_range`` and samples as many new prompts of
   ``train_dataset`` (a seeded order of its own) in their place, at most ``dynamic_filtering_max_refills`` times.
   With ``allocation_method`` ``skip`` or ``difficulty`` (``algorithms/allocation.py``): before each sampling, the
   core's :class:`RolloutAllocator` picks the prompts from the batch's own and ``allocation_candidates`` x as many in
   all (the extra ones drawn from ``train_dataset`` as refills are), from its per-prompt store of pass rates; the
   store learns every sampled group and is saved in each checkpoint (``adora_allocation_state.json``).
2. **TRL's pipeline** then runs on the kept completions, unchanged (padding, old and reference log-probs, TRL's
   metrics): the kept completions and their rewards are handed back through ``_generate`` and
   ``_calculate_rewards``, so nothing is generated or scored twice.
3. **Advantages.** The summed reward ``r = sum_k w_k r_k`` (``reward_weights``), the completion lengths (model
   tokens) and truncation flags (no eos at the end) of the batch, as ``[G, num_generations]`` tensors, go through
   :func:`compute_step_advantages`: estimator (with the whole pool's statistics under adaptive sampling), then
   ADORA's weights. Its advantages replace TRL's in the batch the loss receives; ``adora/*``, ``advantage/*``,
   ``sampling/*`` and ``filter/*`` join TRL's metrics.

With everything off the advantages are TRL's (``(r - mean) / (std + 1e-4)`` per group for
``scale_rewards="group"``), except a group whose rewards are all equal: 0 exactly.

A step whose filter (or whose sampler, with ``sampling_drop_unfinished``) keeps no group trains on the first
``num_generations`` completions of each of its first prompts with advantage 0 (TRL's step always runs; AdamW's
moments still move the weights). Groups kept beyond a multiple of ``steps_per_generation`` completions are left out
(``sampling/trimmed_groups``). The multi-round modes run on one process, without tools, environments, a
``rollout_func`` or images; the plain mode (ADORA on TRL's own sampling) has none of these limits.
"""

import contextlib
import copy
import json
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

try:
    import trl
    from trl import GRPOTrainer
except ImportError as err:  # pragma: no cover - the extra is missing
    raise ImportError(
        "adora_openrlhf.integrations.trl needs TRL: pip install 'adora_openrlhf[trl]' (tested with trl==1.16.0)"
    ) from err

from adora_openrlhf.algorithms.advantages import PoolStats
from adora_openrlhf.algorithms.allocation import RolloutAllocator
from adora_openrlhf.algorithms.dynamic_filtering import filter_and_refill
from adora_openrlhf.algorithms.pipeline import AdvantageOutput, GroupBatch, compute_step_advantages
from adora_openrlhf.algorithms.sampling import AdaptiveSampler, GenerationRequest, SamplingResult, ScoredResponse
from adora_openrlhf.config import SamplingParams
from adora_openrlhf.errors import ConfigError
from adora_openrlhf.integrations.trl_config import AdoraGRPOConfig

__all__ = ["AdoraGRPOConfig", "AdoraGRPOTrainer"]

TESTED_TRL_VERSION = "1.16.0"
SAMPLER_STATE_FILE = (
    "adora_sampler_state.json"  # the sampler's reward history (pool_scope="history") in each checkpoint
)
ALLOCATION_STATE_FILE = "adora_allocation_state.json"  # the allocator's per-prompt store in each checkpoint

if trl.__version__ != TESTED_TRL_VERSION:
    warnings.warn(
        f"adora_openrlhf.integrations.trl hooks into GRPOTrainer's generation methods as trl {TESTED_TRL_VERSION} has them; trl {trl.__version__} is installed",
        stacklevel=2,
    )


@dataclass
class _Completion:
    """One completion as TRL's ``_generate`` returned it, with its row and its rewards (the sampler's payload)."""

    row: dict[str, Any]  # the dataset row of its prompt
    prompt_ids: list[int]
    completion_ids: list[int]
    completion: Any  # decoded text, or the assistant messages of a conversational prompt
    logprobs: list[float] | None  # the engine's per-token log-probs (vLLM), else None
    rewards_per_func: torch.Tensor  # [number of reward functions]


@dataclass
class _Step:
    """What one generation batch trains on: completions prompt-major, ``num_generations`` per prompt."""

    completions: list[_Completion]
    pool_stats: PoolStats | None
    metrics: dict[str, float]
    zero_advantages: bool = False  # nothing was kept: these completions carry no learning signal


class AdoraGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` with ADORA, adaptive multi-round sampling and DAPO filtering from ``adora_openrlhf``
    (module docstring). Takes the same arguments; ``args`` must be an :class:`AdoraGRPOConfig`."""

    def __init__(self, model, reward_funcs=None, args: AdoraGRPOConfig | None = None, *more, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model") or "model"
            args = AdoraGRPOConfig(f"{str(name).split('/')[-1]}-AdoraGRPO")
        if not isinstance(args, AdoraGRPOConfig):
            raise ConfigError(
                f"args: AdoraGRPOTrainer needs an AdoraGRPOConfig (GRPOConfig plus the ADORA fields), got {type(args).__name__}"
            )
        super().__init__(model, reward_funcs, args, *more, **kwargs)
        self._advantage_cfg = args.advantage_config()
        self._adora_cfg = args.adora_config()
        self._sampling_cfg = args.sampling_config()
        self._filter_cfg = args.filtering_config()
        self._base_params = args.base_sampling_params()
        self._sampler = AdaptiveSampler(self._sampling_cfg, self._base_params, seed=args.seed)
        allocation = args.allocation_config()
        self._allocator = RolloutAllocator(allocation, args.seed) if allocation.enabled else None
        self._allocation_calls = 0  # allocations made (each one's random stream)
        self._in_rounds = self._sampling_cfg.enabled or self._filter_cfg.enabled or self._allocator is not None
        self._captured: dict[str, Any] | None = None  # plain mode: what TRL generated and scored this batch
        self._replay: _Step | None = None  # multi-round modes: the kept completions, handed back to TRL's pipeline
        self._refill_order: list[int] = []
        self._refill_epoch = 0
        if self._in_rounds:
            self._check_multi_round_support()

    def _check_multi_round_support(self) -> None:
        which = "sampling_enabled" if self._sampling_cfg.enabled else "dynamic_filtering_enabled"
        if not (self._sampling_cfg.enabled or self._filter_cfg.enabled):
            which = "allocation_method"
        if self.accelerator.num_processes > 1:
            raise ConfigError(
                f"{which}: the multi-round modes of AdoraGRPOTrainer run on one process, got {self.accelerator.num_processes}"
            )
        unsupported = {
            "tools": self.tools,
            "rollout_func": self.rollout_func,
            "environment_factory": self.environment_factories,
        }
        for name, value in unsupported.items():
            if value:
                raise ConfigError(
                    f"{which}: AdoraGRPOTrainer's multi-round modes do not support {name}; use ADORA alone (adora_enabled) with it"
                )
        if self._filter_cfg.enabled and not hasattr(self.train_dataset, "__getitem__"):
            raise ConfigError(
                "dynamic_filtering_enabled: refills draw new prompts by index; pass a map-style train_dataset (datasets.Dataset)"
            )
        if (
            self._allocator is not None
            and self._allocator.cfg.candidates > 1
            and not hasattr(self.train_dataset, "__getitem__")
        ):
            raise ConfigError(
                "allocation_candidates: the extra candidates are drawn from train_dataset by index; pass a map-style "
                "train_dataset (datasets.Dataset) or set allocation_candidates 1"
            )

    # ---------------------------------------------------------------------------------------------------
    # TRL's hooks
    # ---------------------------------------------------------------------------------------------------
    def _generate(self, prompts: list):
        if self._replay is not None:
            return self._replayed(len(prompts))
        out = super()._generate(prompts)
        if self._captured is not None:
            self._captured["completion_ids"], self._captured["tool_mask"] = out[1], out[2]
        return out

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        if self._replay is not None:
            return torch.stack([c.rewards_per_func for c in self._replay.completions]).to(self.accelerator.device)
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self._captured is not None:
            self._captured["rewards_per_func"] = rewards_per_func
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        mode = "train" if self.model.training else "eval"
        if mode == "train" and self._in_rounds:
            step = self._sample_step(inputs)
            self._replay = step
            try:
                output = super()._generate_and_score_completions([c.row for c in step.completions])
            finally:
                self._replay = None
            rewards_per_func = torch.stack([c.rewards_per_func for c in step.completions])
            lengths = torch.tensor([len(c.completion_ids) for c in step.completions])
            truncated = torch.tensor([self._is_truncated(c.completion_ids) for c in step.completions])
            group_size, pool_stats, metrics, zero = (
                self.num_generations,
                step.pool_stats,
                step.metrics,
                step.zero_advantages,
            )
        else:
            self._captured = {}
            try:
                output = super()._generate_and_score_completions(inputs)
            finally:
                captured, self._captured = self._captured, None
            rewards_per_func = captured["rewards_per_func"]
            lengths, truncated = self._gathered_lengths(captured["completion_ids"], captured["tool_mask"])
            group_size = self.num_generations if mode == "train" else self.num_generations_eval
            pool_stats, metrics, zero = None, {}, False
        result = self.core_advantages(rewards_per_func, lengths, truncated, group_size, pool_stats)
        advantages = torch.zeros_like(result.advantages) if zero else result.advantages
        self._use_advantages(output, advantages.reshape(-1), mode)
        for name, value in {**metrics, **result.metrics}.items():
            self._metrics[mode][name].append(float(value))
        return output

    # ---------------------------------------------------------------------------------------------------
    # Advantages
    # ---------------------------------------------------------------------------------------------------
    def core_advantages(
        self,
        rewards_per_func: torch.Tensor,
        lengths: torch.Tensor,
        truncated: torch.Tensor,
        group_size: int,
        pool_stats: PoolStats | None = None,
    ) -> AdvantageOutput:
        """The core's advantages of one batch (every process's completions, prompt-major, ``group_size`` per prompt).

        rewards_per_func: [B, number of reward functions] as TRL's ``_calculate_rewards`` returns them; the reward is
        ``sum_k w_k r_k`` over the functions that scored the completion (TRL's ``nansum`` with ``reward_weights``).
        """
        rewards_per_func = rewards_per_func.detach().cpu()
        unscorable = torch.isnan(rewards_per_func).all(dim=1)
        if bool(unscorable.any()):
            index = int(unscorable.nonzero()[0, 0])
            raise ValueError(
                f"reward_funcs: every reward function returned None for completion {index}; AdoraGRPOTrainer needs a reward for each completion"
            )
        rewards = (rewards_per_func * self.reward_weights.cpu().unsqueeze(0)).nansum(dim=1)
        batch = GroupBatch(
            rewards=rewards.view(-1, group_size),
            lengths=lengths.detach().cpu().to(torch.float32).view(-1, group_size),
            truncated=truncated.detach().cpu().bool().view(-1, group_size),
        )
        return compute_step_advantages(batch, self._advantage_cfg, self._adora_cfg, pool_stats)

    def _use_advantages(self, output: dict[str, Any], advantages: torch.Tensor, mode: str) -> None:
        """Put this process's slice of ``advantages`` (every process's, prompt-major) into TRL's batch and its log."""
        local = output["completion_ids"].shape[0]
        start = self.accelerator.process_index * local
        output["advantages"] = advantages[start : start + local].to(
            device=output["advantages"].device, dtype=output["advantages"].dtype
        )
        logged = self._logs["advantages"]  # the completions table: TRL's advantages of this batch were just appended
        for _ in range(min(advantages.numel(), len(logged))):
            logged.pop()
        logged.extend(advantages.tolist())

    def _is_truncated(self, completion_ids: Sequence[int]) -> bool:
        """TRL's rule: a completion is truncated when its last token is neither an eos nor the pad token."""
        return bool(completion_ids) and completion_ids[-1] not in {*self.eos_token_ids, self._tokenizer.pad_token_id}

    def _gathered_lengths(
        self, completion_ids: list[list[int]], tool_mask: list[list[int]] | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Lengths (model tokens, as TRL counts them) and truncation flags of every process's completions."""
        device = self.accelerator.device
        counts = [sum(m) for m in tool_mask] if tool_mask is not None else [len(ids) for ids in completion_ids]
        lengths = self.accelerator.gather(torch.tensor(counts, device=device))
        truncated = self.accelerator.gather(
            torch.tensor([self._is_truncated(ids) for ids in completion_ids], device=device)
        )
        return lengths, truncated

    # ---------------------------------------------------------------------------------------------------
    # Multi-round sampling and filtering
    # ---------------------------------------------------------------------------------------------------
    def _sample_step(self, inputs: list[dict[str, Any]]) -> _Step:
        """The completions this generation batch trains on (adaptive sampler, or DAPO filter and refills)."""
        n = self.num_generations
        if len(inputs) % n != 0 or any(inputs[i]["prompt"] != inputs[i - i % n]["prompt"] for i in range(len(inputs))):
            raise ValueError(
                f"inputs: expected each prompt repeated num_generations={n} times in a row (TRL's RepeatSampler)"
            )
        rows = [inputs[i] for i in range(0, len(inputs), n)]
        step = self.state.global_step
        first_pools: list[list[ScoredResponse]] = []  # every completion generated for the first batch's prompts

        def sample(batch_rows: list[dict[str, Any]]) -> SamplingResult:
            if self._allocator is not None:
                batch_rows = self._allocated_rows(batch_rows, step)
            pools: list[list[ScoredResponse]] = [[] for _ in batch_rows]
            if not first_pools:
                first_pools.extend(pools)
            keys = [_prompt_key(r["prompt"]) for r in batch_rows]
            result = self._sampler.sample(
                len(batch_rows), self._generate_fn(batch_rows, pools), step=step, prompt_keys=keys
            )
            if self._allocator is not None:
                self._allocator.observe(keys, result)
            return result

        if self._filter_cfg.enabled:
            low, high = self._filter_cfg.score_range
            threshold = self.args.correct_threshold
            filtered = filter_and_refill(
                lambda count: sample(rows if not first_pools else self._refill_rows(count)),
                len(rows),
                lambda response: float(response.reward > threshold),
                low,
                high,
                self._filter_cfg.max_refills,
            )
            result = filtered.result
        else:
            result = sample(rows)
        trained = self._trained_on(result, first_pools)
        if self._allocator is not None:
            trained.metrics.update(self._allocator.pop_metrics())
        return trained

    def _allocated_rows(self, rows: list[dict[str, Any]], step: int) -> list[dict[str, Any]]:
        """The rows the allocator samples among ``rows`` and ``allocation_candidates`` x as many candidates in all (the
        extra ones from train_dataset, as refills are drawn), each with ``num_generations`` completions."""
        n = self.num_generations
        candidates = rows + self._refill_rows(self._allocator.cfg.candidate_count(len(rows)) - len(rows))
        keys = [_prompt_key(r["prompt"]) for r in candidates]
        self._allocation_calls += 1
        allocation = self._allocator.choose(keys, len(rows), n, step, self._allocation_calls)
        if any(count not in (0, n) for count in allocation.counts):
            raise ValueError(
                f"allocation_method {self._allocator.cfg.method!r}: counts {allocation.counts}; TRL's batches need "
                f"0 or num_generations={n} completions per prompt"
            )
        return [row for row, count in zip(candidates, allocation.counts, strict=True) if count]

    def _trained_on(self, result: SamplingResult, first_pools: list[list[ScoredResponse]]) -> _Step:
        """The kept groups, trimmed to a multiple of ``steps_per_generation`` completions; no group left -> the first
        ``num_generations`` completions of each prompt of the first batch, at advantage 0."""
        n, chunks = self.num_generations, self.args.steps_per_generation
        groups = result.groups
        keep = len(groups)
        while keep > 0 and (keep * n) % chunks != 0:
            keep -= 1
        metrics = {
            **result.metrics,
            "sampling/trimmed_groups": float(len(groups) - keep),
            "sampling/empty_step": float(keep == 0),
        }
        if keep == 0:
            completions = [r.payload for pool in first_pools for r in pool[:n]]
            return _Step(completions=completions, pool_stats=None, metrics=metrics, zero_advantages=True)
        stats = result.pool_stats
        pool_stats = PoolStats(count=stats.count[:keep], mean=stats.mean[:keep], std=stats.std[:keep])
        return _Step(
            completions=[r.payload for g in groups[:keep] for r in g.kept], pool_stats=pool_stats, metrics=metrics
        )

    def _generate_fn(self, rows: list[dict[str, Any]], pools: list[list[ScoredResponse]]):
        """The sampler's ``generate(requests)`` over ``rows``: one TRL generation call per (parameters, count) set;
        every response is also appended to ``pools[prompt index]``."""

        def generate(requests: Sequence[GenerationRequest]) -> list[list[ScoredResponse]]:
            outputs: list[list[ScoredResponse]] = [[] for _ in requests]
            calls: dict[tuple[SamplingParams, int], list[int]] = {}
            for i, request in enumerate(requests):
                calls.setdefault((request.params, request.num_samples), []).append(i)
            for (params, count), indices in calls.items():
                call_rows = [rows[requests[i].prompt_index] for i in indices for _ in range(count)]
                for k, response in enumerate(self._generate_round(call_rows, params, count)):
                    outputs[indices[k // count]].append(response)
                    pools[requests[indices[k // count]].prompt_index].append(response)
            return outputs

        return generate

    def _generate_round(self, rows: list[dict[str, Any]], params: SamplingParams, count: int) -> list[ScoredResponse]:
        """Generate one completion per row (each prompt ``count`` times in a row) with ``params`` through TRL's own
        ``_generate``, and score them with TRL's ``_calculate_rewards``."""
        prompts = [r["prompt"] for r in rows]
        with self._sampling_params(params), self._group_size(count):
            prompt_ids, completion_ids, _, completions, logprobs, *_ = GRPOTrainer._generate(self, prompts)
        rewards_per_func = (
            GRPOTrainer._calculate_rewards(self, rows, prompts, completions, completion_ids).detach().cpu()
        )
        rewards = (rewards_per_func * self.reward_weights.cpu().unsqueeze(0)).nansum(dim=1)
        threshold = self.args.positive_threshold()
        responses = []
        for i, row in enumerate(rows):
            if bool(torch.isnan(rewards_per_func[i]).all()):
                raise ValueError(
                    f"reward_funcs: every reward function returned None for a completion of prompt {prompts[i]!r}; a reward is needed for each"
                )
            completion = _Completion(
                row,
                list(prompt_ids[i]),
                list(completion_ids[i]),
                completions[i],
                logprobs[i] if logprobs else None,
                rewards_per_func[i],
            )
            reward = float(rewards[i])
            ids = completion_ids[i]
            responses.append(
                ScoredResponse(
                    reward=reward,
                    positive=reward > threshold,
                    length=len(ids),
                    truncated=self._is_truncated(ids),
                    payload=completion,
                )
            )
        self._pending_extra_logs.clear()  # per-completion columns of reward functions would not line up with the kept batch
        return responses

    @contextlib.contextmanager
    def _sampling_params(self, params: SamplingParams) -> Iterator[None]:
        """TRL's generation settings (transformers and vLLM paths) set to ``params`` for one call, then restored."""
        if params == self._base_params:
            yield
            return
        changes = {
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": 0 if params.top_k == -1 else params.top_k,  # TRL: 0 = off
            "min_p": None if params.min_p == 0 else params.min_p,
            "repetition_penalty": params.repetition_penalty,
        }
        saved_config, saved_kwargs = getattr(self, "generation_config", None), getattr(self, "generation_kwargs", None)
        engine = getattr(self, "vllm_generation", None) if self.use_vllm else None
        saved_engine = {k: getattr(engine, k) for k in changes} if engine is not None else {}
        try:
            if saved_config is not None:
                config = copy.deepcopy(saved_config)
                for key, value in changes.items():
                    setattr(config, key, value)
                self.generation_config = config
            if saved_kwargs is not None:
                self.generation_kwargs = {**saved_kwargs, **changes}
            for key, value in changes.items() if engine is not None else ():
                setattr(engine, key, value)
            yield
        finally:
            if saved_config is not None:
                self.generation_config = saved_config
            if saved_kwargs is not None:
                self.generation_kwargs = saved_kwargs
            for key, value in saved_engine.items():
                setattr(engine, key, value)

    @contextlib.contextmanager
    def _group_size(self, count: int) -> Iterator[None]:
        """``num_generations`` set to the call's repeat count (vLLM's server mode generates for every count-th prompt)."""
        saved = self.num_generations
        self.num_generations = count
        try:
            yield
        finally:
            self.num_generations = saved

    def _replayed(self, expected: int):
        """``_generate``'s return value for the kept completions (the generation batch being processed)."""
        completions = self._replay.completions
        if expected != len(completions):
            raise RuntimeError(f"AdoraGRPOTrainer: TRL asked for {expected} completions, {len(completions)} were kept")
        logprobs = [c.logprobs for c in completions]
        return (
            [c.prompt_ids for c in completions],
            [c.completion_ids for c in completions],
            None,  # tool mask
            [c.completion for c in completions],
            logprobs if all(lp is not None for lp in logprobs) else None,
            {},  # extra fields of a rollout_func
            None,  # images
            [],  # tool images
        )

    def _refill_rows(self, count: int) -> list[dict[str, Any]]:
        """``count`` new prompts of ``train_dataset`` for the filter's refills: a seeded shuffled order of the whole
        dataset, reshuffled (next seed) each time it is used up."""
        rows = []
        while len(rows) < count:
            if not self._refill_order:
                generator = torch.Generator().manual_seed(self.args.seed * 1_000_003 + self._refill_epoch)
                self._refill_order = torch.randperm(len(self.train_dataset), generator=generator).tolist()
                self._refill_epoch += 1
            rows.append(dict(self.train_dataset[self._refill_order.pop(0)]))
        return rows

    # ---------------------------------------------------------------------------------------------------
    # Checkpoints: the sampler's reward history (pool_scope="history"), the allocator's store
    # ---------------------------------------------------------------------------------------------------
    def _saved_states(self) -> dict[str, Any]:
        """What goes into each checkpoint beside TRL's, by file name: the sampler's history, the allocator's store."""
        states = {}
        if self._sampling_cfg.enabled and self._sampling_cfg.pool_scope == "history":
            states[SAMPLER_STATE_FILE] = self._sampler
        if self._allocator is not None:
            states[ALLOCATION_STATE_FILE] = self._allocator
        return states

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if not self.args.should_save:
            return
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        for name, holder in self._saved_states().items():
            with open(os.path.join(folder, name), "w") as f:
                json.dump(holder.state_dict(), f)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        for name, holder in self._saved_states().items():
            path = os.path.join(checkpoint, name)
            if not os.path.exists(path):
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    state = json.load(f)
                holder.load_state_dict(state)
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, TypeError, ValueError) as err:
                why = f"{type(err).__name__}: {err}"
                raise ValueError(
                    f"{path}: not the state this trainer writes ({why}); delete it to resume with an empty one"
                ) from None


def _prompt_key(prompt: Any) -> str:
    """A prompt's identity across steps (the sampler's history pool): its text, or its messages as JSON."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)
