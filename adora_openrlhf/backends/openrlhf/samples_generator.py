"""Adaptive multi-round sampling over OpenRLHF's vLLM engines: :class:`AdoraSamplesGenerator`.

A subclass of OpenRLHF's ``SamplesGenerator``. OpenRLHF's ``generate_samples`` (buffering, vLLM
sleep/wake) and ``generate_eval_samples`` stay as they are; only ``_generate_vllm`` (one batch of prompts
-> Experiences) changes, and only when ``sampling.enabled`` is on. Off, it is OpenRLHF's own method, so
DAPO dynamic filtering (``--algo.dynamic_filtering_enable``) keeps working unchanged; evaluation always
uses OpenRLHF's method.

On, one call runs :meth:`adora_openrlhf.algorithms.sampling.AdaptiveSampler.sample` for the batch:

- each round sends one request per still-active prompt to the engines, in OpenRLHF 0.11's request format
  ``engine.generate_responses.remote(prompt=, label=, sampling_params=, max_length=, hf_tokenizer=,
  num_samples=, images=)``, with vLLM ``SamplingParams`` built from the round's parameters (round 0: the
  rollout defaults; later rounds: the escalation table applied on top);
- each response dict is turned into an ``Experience`` by OpenRLHF's ``_process_response_into_experience``;
  once the round is complete, OpenRLHF's ``apply_length_penalties`` (DAPO overlong, stop-properly) runs on
  the round's Experiences, so every reward term that reaches the advantage is in the pool statistics;
  reward = the penalised reward; positive = the raw reward (before penalties, ``adora/raw_reward``) >
  ``sampling.positive_threshold``;
- the sampler retires prompts by its exit rule, down-samples each pool to ``n_samples_per_prompt`` and
  returns pool statistics, which are written on every kept Experience's ``info`` (``adora/pool_count``,
  ``adora/pool_mean``, ``adora/pool_std``) for :class:`~.experience_maker.AdoraExperienceMaker`, together
  with the step's sampler metrics (``sampling/...``) and the round that produced the sample.

Missing rewards (both paths): when OpenRLHF's executor could not score a rollout (its reward call failed),
the response comes back with ``reward = None``. Such a sample gets its task's failure reward (the lowest
reward of the task its ``reward_label`` names, so that a response cannot gain by making the reward call
fail; 0 for a label that names no task), score 0 and ``reward_missing = 1`` in its ``info`` (0 on every
other sample); a warning reports the count, and the batch fails with a clear error once the missing
fraction exceeds ``max_missing_reward_fraction``.

``sampling.drop_unfinished`` is refused for this backend at config time (see ``flags.reconcile``): a batch
must keep ``rollout.batch_size`` groups for OpenRLHF's even split across ranks.

Kept samples are returned prompt by prompt, n per prompt, which is the layout OpenRLHF's experience maker
expects. ``max_rounds * samples_per_round`` responses per prompt are the most one step can cost.
"""

from __future__ import annotations

import heapq
import json
import logging
from collections.abc import Sequence
from typing import Any

import ray
import torch
from openrlhf.trainer.ppo_utils.experience import Experience
from openrlhf.trainer.ppo_utils.length_penalty import apply_length_penalties
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator, _collect_prompt_batch

# the class OpenRLHF sends
from openrlhf.trainer.ppo_utils.samples_generator import (
    SamplingParams as VllmSamplingParams,
)
from openrlhf.trainer.ray.vllm_engine import batch_vllm_engine_call
from tqdm import tqdm

from adora_openrlhf.algorithms.allocation import RolloutAllocator
from adora_openrlhf.algorithms.sampling import AdaptiveSampler, GenerationRequest, SamplingResult, ScoredResponse
from adora_openrlhf.backends.openrlhf.experience_maker import (
    GROUP_SIZE,
    LENGTH_PENALIZED,
    POOL_COUNT,
    POOL_MEAN,
    POOL_STD,
    RAW_REWARD,
)
from adora_openrlhf.config import RunConfig, SamplingParams

logger = logging.getLogger(__name__)

ROUND_KEY = "sampling/response_round"
POLICY_VERSION = "adora/policy_version"  # optimiser steps behind the weights that generated the sample
REWARD_MISSING = "reward_missing"  # 1 when OpenRLHF's executor returned no reward for the sample (failure reward)


def check_missing_rewards(missing: int, total: int, max_fraction: float) -> None:
    """Warn about rollouts without a reward; raise once their fraction exceeds ``max_fraction``."""
    if not missing:
        return
    logger.warning(
        "rewards: %d of %d rollouts of this batch came back without a reward and got their task's failure reward",
        missing,
        total,
    )
    if missing > max_fraction * total:
        raise RuntimeError(
            f"rewards: {missing} of {total} rollouts of this batch came back without a reward (OpenRLHF's executor "
            f"could not call the reward source; see 'Failed to fetch reward' in the engine logs), more than "
            f"max_missing_reward_fraction={max_fraction}; fix the reward source or raise --max_missing_reward_fraction"
        )


def penalise_round(experiences: Sequence[Experience], args: Any) -> None:
    """OpenRLHF's length penalties on one round's Experiences (before the sampler sees the rewards), marked
    so that the experience maker does not apply them again."""
    experiences = [e for e in experiences if e.rewards is not None]  # unscored: scored_response explains
    for experience in experiences:
        experience.rewards = experience.rewards.to(torch.promote_types(experience.rewards.dtype, torch.float32))
    apply_length_penalties(experiences, args)
    for experience in experiences:
        experience.info[LENGTH_PENALIZED] = torch.ones(len(experience.rewards))


def align_info_keys(experiences: Sequence[Experience]) -> None:
    """Give every Experience every ``info`` key of the batch (0 where absent): OpenRLHF concatenates ``info``
    key by key, so a key missing on one sample would shift the values of the others."""
    keys = {key for e in experiences for key in e.info}
    for experience in experiences:
        size = len(experience.sequences)
        for key in keys - set(experience.info):
            experience.info[key] = torch.zeros(size)


def vllm_sampling_params(params: SamplingParams, generate_kwargs: dict[str, Any], logprobs: bool) -> Any:
    """vLLM ``SamplingParams`` for one round: our decoding parameters, OpenRLHF's length and token settings."""
    return VllmSamplingParams(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
        repetition_penalty=params.repetition_penalty,
        max_tokens=generate_kwargs.get("max_new_tokens"),  # None = up to max_len - prompt length (OpenRLHF)
        min_tokens=generate_kwargs.get("min_new_tokens", 1),
        skip_special_tokens=generate_kwargs.get("skip_special_tokens", False),
        logprobs=1 if logprobs else None,
    )


def scored_response(experience: Experience, positive_threshold: float) -> ScoredResponse:
    """The sampler's view of one generated sample (the Experience rides along as payload)."""
    if experience.rewards is None:
        raise ValueError(
            "rewards: a vLLM response came back without a reward; adaptive sampling needs the reward at rollout "
            "time, so pass --reward.remote_url (the reward file) or an agent with rewards"
        )
    reward = float(torch.as_tensor(experience.rewards).reshape(-1)[0])
    raw = experience.info.get(RAW_REWARD)
    raw_reward = float(torch.as_tensor(raw).reshape(-1)[0]) if raw is not None else reward
    return ScoredResponse(
        reward=reward,
        positive=raw_reward > positive_threshold,
        length=int(torch.as_tensor(experience.response_length).reshape(-1)[0])
        if experience.response_length is not None
        else 0,
        truncated=bool(torch.as_tensor(experience.truncated).reshape(-1)[0])
        if experience.truncated is not None
        else False,
        payload=experience,
    )


def kept_experiences(
    result: SamplingResult, extra_metrics: dict[str, float] | None = None, group_sizes: bool = False
) -> list[Experience]:
    """Kept Experiences, prompt by prompt, with pool statistics, sampler metrics (and ``extra_metrics``), round and,
    with ``group_sizes``, the size of the sample's group (``adora/group_size``) in ``info``."""
    out: list[Experience] = []
    metrics = {**result.metrics, **(extra_metrics or {})}
    for g, group in enumerate(result.groups):
        pool = {
            POOL_COUNT: float(result.pool_stats.count[g]),
            POOL_MEAN: float(result.pool_stats.mean[g]),
            POOL_STD: float(result.pool_stats.std[g]),
        }
        if group_sizes:
            pool[GROUP_SIZE] = float(len(group.kept))
        for response in group.kept:
            experience: Experience = response.payload
            for key, value in {**pool, **metrics, ROUND_KEY: float(response.round)}.items():
                experience.info[key] = torch.tensor([value])
            out.append(experience)
    return out


def check_allocated_responses(responses: int, train_batch_size: int) -> None:
    """An allocation's responses must fill whole training batches: OpenRLHF's actors take ``train.batch_size``
    samples per optimiser step (its gradient accumulation and dynamic batching count on it)."""
    if responses % train_batch_size:
        raise ValueError(
            f"allocation: this step's allocation has {responses} responses, not a multiple of train.batch_size "
            f"({train_batch_size}); set --allocation.budget so that budget x rollout.batch_size x n_samples_per_prompt "
            f"is a multiple of train.batch_size, and --allocation.max_responses high enough to spend it"
        )


def prompt_key(prompt: Any, label: Any) -> str:
    """Identity of a prompt across steps (``pool_scope="history"`` and the allocation store)."""
    return json.dumps([prompt, label], sort_keys=True, default=str)


class StepRollout(list):
    """A training batch of Experiences (a list, as OpenRLHF passes it on) with the samples generator's state after
    generating it (``sampler_state``)."""

    def __init__(self, experiences: Sequence[Experience] = (), sampler_state: dict[str, Any] | None = None):
        super().__init__(experiences)
        self.sampler_state = sampler_state


class AdoraSamplesGenerator(SamplesGenerator):
    """``SamplesGenerator`` running the adaptive multi-round sampler when ``sampling.enabled`` is on, and the rollout
    allocator when ``allocation.method`` is not ``uniform`` (:meth:`generate_samples`)."""

    def __init__(self, *args, run_config: RunConfig, **kwargs):
        super().__init__(*args, **kwargs)
        self.run_config = run_config
        self.sampler = AdaptiveSampler(run_config.sampling, run_config.rollout, seed=run_config.seed)
        self.allocator = (
            RolloutAllocator(run_config.allocation, run_config.seed) if run_config.allocation.enabled else None
        )
        self.sampling_step = 0  # training batches sampled so far (escalation trigger, sampler seed)
        self._evaluating = False
        self._reward_counts = [0, 0]  # (missing, total) rewards of the current batch

    # -- checkpointing (saved with OpenRLHF's checkpoints by the trainer) -----------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The cross-step state: step counter (escalation trigger, per-step seeds), the sampler's reward history and,
        with an allocator, its per-prompt statistics store."""
        state = {"sampling_step": self.sampling_step, "sampler": self.sampler.state_dict()}
        if self.allocator is not None:
            state["allocation"] = self.allocator.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampling_step = int(state["sampling_step"])
        if state.get("sampler") is None:  # a checkpoint without the sampler's state: the step counter only
            return
        self.sampler.load_state_dict(state["sampler"])
        if self.allocator is not None:
            self.allocator.load_state_dict(state["allocation"])

    def generate_samples(self, **generate_kwargs):
        """One training batch of rollouts (:meth:`generate_batch`) as a :class:`StepRollout`: each sample tagged with
        the engines' policy version (``adora/policy_version``), the list carrying, in asynchronous training, the generator's
        state after it (saved with the checkpoint of the step that trains on the batch)."""
        version = self.engine_policy_version()
        experiences, pass_rate, consumed, exhausted = self.generate_batch(**generate_kwargs)
        for experience in experiences if version is not None else ():
            experience.info[POLICY_VERSION] = torch.full((experience.sequences.size(0),), float(version))
        state = self.state_dict() if self.args.train.async_enable else None  # the synchronous trainer asks itself
        return StepRollout(experiences, sampler_state=state), pass_rate, consumed, exhausted

    def engine_policy_version(self) -> int | None:
        """The policy version the engines hold (``PolicyVersionBroadcast``): the oldest, should they differ; None
        without engines (OpenRLHF then generates with the policy actor itself)."""
        if not self.vllm_engines:
            return None
        return min(ray.get([engine.get_policy_version.remote() for engine in self.vllm_engines]))

    def generate_batch(self, **generate_kwargs):
        """OpenRLHF's ``generate_samples``; with an allocator, one allocation per training batch instead: every sample
        of the step's groups is returned at once (OpenRLHF's buffer would cut a batch at ``rollout.batch_size x
        n_samples_per_prompt`` samples, splitting groups whose sizes the allocator chose)."""
        if self.allocator is None:
            return super().generate_samples(**generate_kwargs)
        if getattr(self, "_dataloader_iter", None) is None:
            self._dataloader_iter = iter(self.prompts_dataloader)
        if self.args.vllm.enable_sleep:
            batch_vllm_engine_call(self.vllm_engines, "wake_up")
        try:
            experiences, consumed, exhausted = self._generate_vllm(
                self._dataloader_iter, self.args.rollout.batch_size, False, **generate_kwargs
            )
        finally:
            if self.args.vllm.enable_sleep:
                batch_vllm_engine_call(self.vllm_engines, "sleep")
        if exhausted:
            self._dataloader_iter = None
            logger.info("Prompt dataloader is exhausted.")
        return experiences, None, consumed, exhausted

    def _process_response_into_experience(self, response, **generate_kwargs) -> Experience:
        """OpenRLHF's conversion, plus the raw reward, and the task's failure reward (``reward_missing = 1``) when
        the executor could not score the rollout."""
        missing = response.get("reward") is None and bool(self.args.reward.remote_url)
        if missing:
            from adora_openrlhf.rewards.openrlhf_reward import failure_reward_of_label

            response = {**response, "reward": failure_reward_of_label(response.get("label")), "scores": 0.0}
        experience = super()._process_response_into_experience(response, **generate_kwargs)
        experience.info[REWARD_MISSING] = torch.tensor([float(missing)])
        if experience.rewards is not None:
            experience.info[RAW_REWARD] = experience.rewards.clone().float()
        self._reward_counts[0] += int(missing)
        self._reward_counts[1] += 1
        return experience

    def generate_eval_samples(self, **generate_kwargs) -> list[Experience]:
        """OpenRLHF's evaluation samples with ``rewards`` replaced by the 0/1 ``scores`` (the task's correctness),
        so that OpenRLHF's ``eval_*_pass1`` / ``pass@k`` (means / maxima of ``rewards``) are accuracies as in the
        local backend and ``eval.run``, not means of the K&K reward's -3..3; the reward stays in ``info``
        (``adora/raw_reward``). Samples without scores (a reward model instead of the reward file) keep theirs."""
        self._evaluating = True
        try:
            samples = super().generate_eval_samples(**generate_kwargs)
        finally:
            self._evaluating = False
        for experience in samples:
            if experience.scores is not None:
                experience.rewards = experience.scores.clone().float()
        return samples

    def _generate_vllm(self, dataloader_iter, num_prompts: int, dynamic_filtering, **generate_kwargs):
        self._reward_counts = [0, 0]
        if self._evaluating or not (self.run_config.sampling.enabled or self.allocator is not None):
            out = super()._generate_vllm(dataloader_iter, num_prompts, dynamic_filtering, **generate_kwargs)
        else:
            out = self._generate_adaptive(dataloader_iter, num_prompts, **generate_kwargs)
        check_missing_rewards(*self._reward_counts, self.run_config.max_missing_reward_fraction)
        align_info_keys(out[0])
        return out

    def _generate_adaptive(self, dataloader_iter, num_prompts: int, **generate_kwargs):
        """One batch through the sampler: ``num_prompts`` prompts, ``n_keep`` responses each; with an allocator, its
        candidates (``allocation.candidates`` x ``num_prompts`` prompts of the dataloader), the ones it gives
        responses to sampled with their own group sizes, and the store told what each sampled group showed."""
        candidates = self.run_config.allocation.candidate_count(num_prompts)
        prompts, labels, images, exhausted = _collect_prompt_batch(dataloader_iter, candidates)
        if not prompts:
            return [], 0, True
        drawn = len(prompts)
        keys = [prompt_key(p, label) for p, label in zip(prompts, labels, strict=True)]
        chosen, sizes = list(range(len(prompts))), None
        if self.allocator is not None:
            allocation = self.allocator.choose(
                keys, num_prompts, self.run_config.sampling.n_keep, self.sampling_step, 0
            )
            check_allocated_responses(sum(allocation.counts), self.args.train.batch_size)
            chosen = [i for i, count in enumerate(allocation.counts) if count > 0]
            sizes = [allocation.counts[i] for i in chosen]
        prompts, labels, keys = [prompts[i] for i in chosen], [labels[i] for i in chosen], [keys[i] for i in chosen]
        images = [images[i] for i in chosen] if images else images

        def generate(requests: Sequence[GenerationRequest]) -> list[list[ScoredResponse]]:
            return self.generate_round(requests, prompts, labels, images, generate_kwargs)

        result = self.sampler.sample(
            len(prompts), generate, step=self.sampling_step, prompt_keys=keys, group_sizes=sizes
        )
        extra = {}
        if self.allocator is not None:
            self.allocator.observe(keys, result)
            extra = self.allocator.pop_metrics()
        self.sampling_step += 1
        return kept_experiences(result, extra, group_sizes=self.allocator is not None), drawn, exhausted

    # -- one round over the engines ------------------------------------------------------------------------
    def _assign_engines(self, counts: Sequence[int]) -> list[int]:
        """Engine index per request: least loaded first (unfinished requests + samples assigned now)."""
        if not self.vllm_engines:
            raise ValueError("vllm_engines: adaptive sampling generates with vLLM; set --vllm.num_engines >= 1")
        pending = ray.get([engine.get_num_unfinished_requests.remote() for engine in self.vllm_engines])
        heap = [(int(load), index) for index, load in enumerate(pending)]
        heapq.heapify(heap)
        chosen = []
        for count in counts:
            load, index = heapq.heappop(heap)
            chosen.append(index)
            heapq.heappush(heap, (load + count, index))
        return chosen

    def generate_round(
        self,
        requests: Sequence[GenerationRequest],
        prompts: Sequence[Any],
        labels: Sequence[Any],
        images: Sequence[Any],
        generate_kwargs: dict[str, Any],
    ) -> list[list[ScoredResponse]]:
        """Send the round's requests to the engines and return scored responses per request."""
        logprobs = self.args.algo.advantage.is_correction_level != "off"
        max_length = generate_kwargs.get("max_len", 2048)
        engines = self._assign_engines([r.num_samples for r in requests])
        refs = []
        for request, engine_index in zip(requests, engines, strict=True):
            p = request.prompt_index
            refs.append(
                self.vllm_engines[engine_index].generate_responses.remote(
                    prompt=prompts[p],
                    label=labels[p],
                    sampling_params=vllm_sampling_params(request.params, generate_kwargs, logprobs),
                    max_length=max_length,
                    hf_tokenizer=self.tokenizer,
                    num_samples=request.num_samples,
                    images=images[p] if images else None,
                )
            )
        round_index = requests[0].round if requests else 0
        position = {ref: i for i, ref in enumerate(refs)}
        outputs: list[list[Experience]] = [[] for _ in refs]
        threshold = self.run_config.positive_threshold
        pending = list(refs)
        with tqdm(total=len(refs), desc=f"Adaptive sampling round {round_index}", disable=not refs) as bar:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1, timeout=10.0)
                for ref in ready:
                    outputs[position[ref]] = [
                        self._process_response_into_experience(r, **generate_kwargs) for r in ray.get(ref)
                    ]
                    bar.update()
        penalise_round([e for experiences in outputs for e in experiences], self.args)
        return [[scored_response(e, threshold) for e in experiences] for experiences in outputs]
