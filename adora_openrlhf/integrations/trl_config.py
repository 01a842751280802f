"""``AdoraGRPOConfig``: TRL's ``GRPOConfig`` plus the fields of ADORA, adaptive multi-round sampling and DAPO filtering.

Each new field mirrors one field of the core's configs (``adora_openrlhf.config``) under a prefix, with its default
and its help text: ``adora_<field>`` -> :class:`AdoraConfig`, ``sampling_<field>`` -> :class:`AdaptiveSamplingConfig`,
``dynamic_filtering_<field>`` -> :class:`DynamicFilteringConfig`, ``advantage_<field>`` -> :class:`AdvantageConfig`,
``allocation_<field>`` -> :class:`AllocationConfig` (``skip`` and ``difficulty``: TRL's batches hold
``num_generations`` completions per prompt, so the knapsack's groups of their own sizes are refused).
They are plain dataclass fields with ``metadata={"help": ...}``, so ``HfArgumentParser`` and ``trl``'s CLI show
them like TRL's own. ``__post_init__`` builds the core configs once, so a bad value fails when the config is made,
with one :class:`ConfigError` naming the field (``adora_lambda_att: must be ...``).

What TRL already has is taken from TRL: the group size ``n`` is ``num_generations``, the default sampling parameters
(round 0 of the sampler) are ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty`` and
``max_completion_length``, and the estimator follows ``scale_rewards`` ("group" -> ``group_norm``, "none" ->
``dr_grpo``) unless ``advantage_estimator`` names one.
"""

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trl import GRPOConfig

from adora_openrlhf.algorithms.allocation import AllocationConfig
from adora_openrlhf.config import (
    AdaptiveSamplingConfig,
    AdoraConfig,
    AdvantageConfig,
    DynamicFilteringConfig,
    SamplingParams,
)
from adora_openrlhf.config_checks import option
from adora_openrlhf.errors import ConfigError

# TRL's scale_rewards -> the core's estimator with the same formula ("batch" scaling has no core estimator)
ESTIMATOR_FOR_SCALE_REWARDS = {"group": "group_norm", "none": "dr_grpo"}
_PREFIXES = ("adora", "sampling", "dynamic_filtering", "advantage", "allocation")


_FROM_CORE: Any = object()


def _core_option(
    cls: type, name: str, default: Any = _FROM_CORE, *, factory: Callable[[], Any] | None = None, note: str = ""
) -> Any:
    """Core field ``cls.name`` as a field of this config: its help text (one source for both configs, with an
    optional note) and, unless ``default`` or ``factory`` is given, its default."""
    core = next(f for f in dataclasses.fields(cls) if f.name == name)
    if default is _FROM_CORE:
        default = core.default if factory is None else dataclasses.MISSING
    return option(default, f"{core.metadata['help']}{note}", factory=factory)


def _own_name(err: ConfigError, sources: Mapping[str, str] | None = None) -> ConfigError:
    """The core's error about field ``prefix.name`` (``adora.lambda_att``) as an error about this config's field
    ``prefix_name`` (``adora_lambda_att``), or about the field a value came from (``sources``: core path -> field)."""
    if err.field is None:
        return err
    if err.field in (sources or {}):
        return err.named(sources[err.field])
    prefix, _, name = err.field.partition(".")
    return err.named(f"{prefix}_{name}") if prefix in _PREFIXES and name else err


@dataclass
class AdoraGRPOConfig(GRPOConfig):
    """Configuration of :class:`~adora_openrlhf.integrations.trl.AdoraGRPOTrainer`: every ``GRPOConfig`` field, plus
    ADORA's rules, adaptive multi-round sampling and DAPO-style filtering (all off by default: then the trainer
    is TRL's GRPO with the core's advantages, which equal TRL's except that a group whose rewards are all equal
    gets advantage 0 exactly)."""

    correct_threshold: float = option(
        0.5,
        "a completion is correct when its reward (the weighted sum of the reward functions) > this: ADORA's rules, the "
        "filter's score and, unless sampling_positive_threshold is set, the sampler's positive label use it (1.0 for the "
        "Logic-RL K&K reward, 0.5 for 0/1 rewards)",
    )
    advantage_estimator: str | None = option(
        None,
        "group baseline, one of algorithms.advantages.ADVANTAGE_ESTIMATORS; None = from scale_rewards (group_norm or dr_grpo)",
    )
    advantage_eps: float = option(1e-4, "added to the group std by group_norm (TRL's 1e-4)")

    adora_enabled: bool = _core_option(AdoraConfig, "enabled", False)
    adora_rule: str = _core_option(AdoraConfig, "rule")
    adora_mode: str = _core_option(AdoraConfig, "mode")
    adora_lambda_att: float = _core_option(AdoraConfig, "lambda_att")
    adora_lambda_amp: float = _core_option(AdoraConfig, "lambda_amp")
    adora_tau: float = _core_option(AdoraConfig, "tau")
    adora_edge_policy: str = _core_option(AdoraConfig, "edge_policy")
    adora_drop_truncated_negatives: bool = _core_option(
        AdoraConfig, "drop_truncated_negatives", note=" (truncated: the completion ended without an eos token)"
    )
    adora_truncation_length: int | None = _core_option(AdoraConfig, "truncation_length", None)
    adora_length_shaping: bool = _core_option(AdoraConfig, "length_shaping", False)
    adora_shaping_beta: float = _core_option(AdoraConfig, "shaping_beta")
    adora_shaping_p: float = _core_option(AdoraConfig, "shaping_p")

    sampling_enabled: bool = option(
        False,
        "adaptive multi-round sampling: rounds of sampling_samples_per_round completions per active prompt, kept num_generations",
    )
    sampling_exit_rule: str = _core_option(AdaptiveSamplingConfig, "exit_rule")
    sampling_positive_threshold: float | None = option(
        None, "a completion is positive for the exit rule when its reward > this; None = correct_threshold"
    )
    sampling_samples_per_round: int = _core_option(AdaptiveSamplingConfig, "samples_per_round")
    sampling_max_rounds: int = _core_option(AdaptiveSamplingConfig, "max_rounds")
    sampling_max_responses_per_prompt: int | None = _core_option(
        AdaptiveSamplingConfig, "max_responses_per_prompt", None
    )
    sampling_pool_scope: str = _core_option(AdaptiveSamplingConfig, "pool_scope")
    sampling_drop_unfinished: bool = _core_option(AdaptiveSamplingConfig, "drop_unfinished", False)
    sampling_escalation: list[dict[str, float]] | str | None = option(
        None,
        "sampling parameters of the later rounds, a list (or its JSON text) such as [{'temperature': 1.2}]: round r >= 1 uses "
        "entry min(r-1, len-1) over the defaults; keys temperature, top_p, top_k, min_p, repetition_penalty",
    )
    sampling_trigger_after_step: int = _core_option(AdaptiveSamplingConfig, "trigger_after_step", 0)

    dynamic_filtering_enabled: bool = option(
        False,
        "DAPO dynamic sampling: drop groups whose share of correct completions is outside dynamic_filtering_score_range and "
        "sample as many new prompts of train_dataset in their place (an alternative to sampling_enabled)",
    )
    dynamic_filtering_score_range: list[float] = _core_option(
        DynamicFilteringConfig, "score_range", factory=lambda: [0.0, 1.0]
    )
    dynamic_filtering_max_refills: int = _core_option(DynamicFilteringConfig, "max_refills")

    allocation_method: str = option(
        "uniform",
        'rollout allocation (algorithms/allocation.py): "uniform" (TRL\'s prompts), "skip" (leave out the prompts '
        'predicted to give an all-equal group) or "difficulty" (the prompts most likely to give a mixed group, of '
        "allocation_candidates x the batch's prompts; the extra candidates come from train_dataset)",
    )
    allocation_candidates: float = _core_option(AllocationConfig, "candidates")
    allocation_skip_threshold: float = _core_option(AllocationConfig, "skip_threshold")
    allocation_explore: float = _core_option(AllocationConfig, "explore")
    allocation_prior: list[float] = _core_option(AllocationConfig, "prior", factory=lambda: [0.5, 0.5])
    allocation_decay: float = _core_option(AllocationConfig, "decay")
    allocation_max_prompts: int = _core_option(AllocationConfig, "max_prompts")

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.sampling_escalation, str):
            try:
                self.sampling_escalation = json.loads(self.sampling_escalation)
            except json.JSONDecodeError as err:
                raise ConfigError(
                    f"sampling_escalation: not valid JSON ({err.msg}); write a list such as '[{{\"temperature\": 1.2}}]'"
                ) from None
        if self.scale_rewards not in ESTIMATOR_FOR_SCALE_REWARDS and self.advantage_estimator is None:
            raise ConfigError(
                f"scale_rewards: {self.scale_rewards!r} has no group estimator in adora_openrlhf; use 'group' or 'none', or name one with advantage_estimator"
            )
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ConfigError(
                f"multi_objective_aggregation: AdoraGRPOTrainer computes group advantages of the summed reward; use 'sum_then_normalize', "
                f"got {self.multi_objective_aggregation!r}"
            )
        if self.sampling_enabled and self.dynamic_filtering_enabled:
            raise ConfigError(
                "dynamic_filtering_enabled: DAPO filtering and adaptive sampling (sampling_enabled) are alternatives; enable one of them"
            )
        if self.allocation_method == "knapsack":
            raise ConfigError(
                "allocation_method: 'knapsack' gives each prompt its own number of completions, and TRL's batches hold "
                "num_generations per prompt; use 'skip' or 'difficulty'"
            )
        # build every core config once: their checks run now, before a model is loaded
        (
            self.allocation_config(),
            self.advantage_config(),
            self.adora_config(),
            self.sampling_config(),
            self.filtering_config(),
            self.base_sampling_params(),
        )

    # -- the core's configs ---------------------------------------------------------------------------------
    def _build(self, cls: type, prefix: str, sources: Mapping[str, str] | None = None, **values: Any) -> Any:
        """``cls`` from this config's ``<prefix>_<field>`` fields and ``values``; an error names this config's field:
        ``prefix_field``, or for a value given here the field it came from (``sources``: core name -> field)."""
        names = [f.name for f in dataclasses.fields(cls)]
        kwargs = {name: getattr(self, f"{prefix}_{name}") for name in names if hasattr(self, f"{prefix}_{name}")}
        try:
            return cls(**{**kwargs, **values})
        except ConfigError as err:
            raise _own_name(err, {f"{prefix}.{core}": own for core, own in (sources or {}).items()}) from None

    def advantage_config(self) -> AdvantageConfig:
        estimator = self.advantage_estimator or ESTIMATOR_FOR_SCALE_REWARDS[self.scale_rewards]
        source = "advantage_estimator" if self.advantage_estimator else "scale_rewards"
        built = self._build(AdvantageConfig, "advantage", {"estimator": source}, estimator=estimator)
        if built.token_level:  # gae needs a value model; reinforce whitens over a batch TRL does not gather
            raise ConfigError(
                f"advantage_estimator: {estimator!r} is not available in AdoraGRPOTrainer (TRL's GRPOTrainer has no critic "
                "and normalises per group); use a group estimator (group_norm, dr_grpo, rloo, reinforce_baseline)"
            )
        return built

    def adora_config(self) -> AdoraConfig:
        return self._build(
            AdoraConfig, "adora", {"correct_threshold": "correct_threshold"}, correct_threshold=self.correct_threshold
        )

    def positive_threshold(self) -> float:
        return self.correct_threshold if self.sampling_positive_threshold is None else self.sampling_positive_threshold

    def sampling_config(self) -> AdaptiveSamplingConfig:
        positive = "correct_threshold" if self.sampling_positive_threshold is None else "sampling_positive_threshold"
        return self._build(
            AdaptiveSamplingConfig,
            "sampling",
            {"n_keep": "num_generations", "positive_threshold": positive},
            n_keep=self.num_generations,
            positive_threshold=self.positive_threshold(),
            escalation=list(self.sampling_escalation or []),
        )

    def allocation_config(self) -> AllocationConfig:
        return self._build(AllocationConfig, "allocation", prior=list(self.allocation_prior))

    def filtering_config(self) -> DynamicFilteringConfig:
        return self._build(
            DynamicFilteringConfig, "dynamic_filtering", score_range=list(self.dynamic_filtering_score_range)
        )

    def base_sampling_params(self) -> SamplingParams:
        """Round 0's sampling parameters: TRL's (top_k 0 = off is the core's -1; min_p None is 0)."""
        try:
            return SamplingParams(
                temperature=self.temperature,
                top_p=self.top_p,
                top_k=-1 if not self.top_k else self.top_k,
                min_p=self.min_p or 0.0,
                repetition_penalty=self.repetition_penalty,
                max_new_tokens=self.max_completion_length,
            )
        except ConfigError as err:  # rollout.top_p -> top_p: TRL's own field names
            name = (err.field or "").removeprefix("rollout.")
            raise err.named("max_completion_length" if name == "max_new_tokens" else name) from None
