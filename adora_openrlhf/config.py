"""Typed configuration for every component, in one place.

Each dataclass documents its fields where they are defined: ``field(metadata={"help": ...})`` is the reference,
and the text of every dotted flag's ``--help`` (``cli_args.py``). Every
config validates itself in ``__post_init__`` and raises :class:`ConfigError` naming the field and the fix,
so a bad recipe or flag fails before any model is built.

Configs are plain dataclasses: ``dataclasses.asdict`` gives the JSON saved with each run, and
``from_dict`` rebuilds them (unknown keys are an error, not silently ignored).

Every ``__post_init__`` starts with :func:`check_field_types`: each field's value has its annotated type,
whatever it came from (a flag, a ``--config`` file, a recipe, ``bench --set``, Python code). A boolean is
``true`` or ``false`` and nothing else (not ``"false"``, which is truthy, nor ``null``, ``0`` or ``2``); a string
field holds a string; a list, a mapping and a nested section hold one. Numbers are checked, with their range, by
the section's own :func:`_number` calls.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union

from adora_openrlhf.errors import ConfigError  # defined beside the registries (no import circle); exported here


def _require(condition: bool, field_path: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{field_path}: {message}")


def _number(
    value: Any,
    field_path: str,
    *,
    integer: bool = False,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    also: tuple = (),
) -> None:
    """One check per numeric field: the type (an integer, or any real number; never a bool or a string), a finite
    value, and the range ``gt < v``, ``ge <= v``, ``v < lt``, ``v <= le``. Values in ``also`` (e.g. -1 = off) pass."""
    if any(value is a or (type(value) is type(a) and value == a) for a in also):
        return
    bounds = [
        f"> {gt}" if gt is not None else "",
        f">= {ge}" if ge is not None else "",
        f"< {lt}" if lt is not None else "",
        f"<= {le}" if le is not None else "",
    ]
    wanted = (("an integer" if integer else "a finite number") + " " + " and ".join(b for b in bounds if b)).strip()
    wanted += "".join(f" or {a}" for a in also)
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float))
    ok = ok and math.isfinite(value)
    ok = ok and (gt is None or value > gt) and (ge is None or value >= ge) and (lt is None or value < lt) and (le is None or value <= le)
    if not ok:
        raise ConfigError(f"{field_path}: must be {wanted}, got {value!r}")


def _kind(value: Any) -> str:
    """What a value is, in the words of a JSON/YAML file."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    return f"a {type(value).__name__}"


def _type_problem(value: Any, hint: Any) -> str | None:
    """What ``value`` should be instead, when it is not of type ``hint``; None when it is (or the hint is a number,
    which :func:`_number` checks with its range). Elements of lists and mappings are checked too."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        problems = [_type_problem(value, arm) for arm in args if arm is not type(None)]
        if any(p is None for p in problems):
            return None
        return " or ".join(p for p in problems if p) + (" or null" if type(None) in args else "")
    if hint is Any or hint in (int, float):
        return None
    if hint is bool:
        return None if value is True or value is False else "true or false"
    if hint is str:
        return None if isinstance(value, str) else "a string"
    if origin is list:
        if not isinstance(value, list):
            return "a list"
        for i, item in enumerate(value):
            problem = _type_problem(item, args[0])
            if problem:
                return f"a list whose items are each {problem} (item {i} is {item!r})"
        return None
    if origin is dict:
        if not isinstance(value, Mapping):
            return "a mapping"
        for key, item in value.items():
            problem = "a string" if not isinstance(key, str) else _type_problem(item, args[1])
            if problem:
                return f"a mapping whose {'keys' if not isinstance(key, str) else 'values'} are each {problem} (at {key!r})"
        return None
    if dataclasses.is_dataclass(hint):
        return None if isinstance(value, hint) else "a mapping of its options"
    return None


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def check_field_types(obj: Any, section: str) -> None:
    """ConfigError naming the first field of dataclass ``obj`` (``section.field``) whose value is not of its
    annotated type, with what it should be and what it is. Numbers are left to :func:`_number`."""
    hints = _type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        problem = _type_problem(value, hints[f.name])
        if problem:
            fix = "; write true or false without quotes" if problem == "true or false" and isinstance(value, str) else ""
            raise ConfigError(f"{section + '.' if section else ''}{f.name}: must be {problem}, got {value!r} ({_kind(value)}){fix}")


T = TypeVar("T")


def from_dict(cls: type[T], values: Mapping[str, Any], path: str = "") -> T:
    """Build dataclass ``cls`` from a mapping, recursing into nested config dataclasses.

    Unknown keys raise :class:`ConfigError` listing the valid ones.
    """
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(known))
    if unknown:
        where = path or cls.__name__
        raise ConfigError(f"{where}: unknown option(s) {unknown}; valid options are {sorted(known)}")
    kwargs: dict[str, Any] = {}
    for name, value in values.items():
        default = known[name].default_factory if known[name].default_factory is not dataclasses.MISSING else None  # type: ignore[misc]
        sample = default() if callable(default) else None
        if dataclasses.is_dataclass(sample) and isinstance(value, Mapping):
            kwargs[name] = from_dict(type(sample), value, f"{path + '.' if path else ''}{name}")
        else:
            kwargs[name] = value
    return cls(**kwargs)  # type: ignore[call-arg]


# ---------------------------------------------------------------------------------------------------------
# Sampling parameters
# ---------------------------------------------------------------------------------------------------------

SAMPLING_PARAM_NAMES = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass(frozen=True)
class SamplingParams:
    """Decoding parameters for one generation request (the subset shared by vLLM and transformers)."""

    temperature: float = field(default=1.0, metadata={"help": "softmax temperature; > 0 (greedy decoding is not used for RL rollouts)"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling mass in (0, 1]"})
    top_k: int = field(default=-1, metadata={"help": "keep the k most likely tokens; -1 disables (vLLM convention)"})
    min_p: float = field(default=0.0, metadata={"help": "drop tokens below min_p * p(max token); 0 disables"})
    repetition_penalty: float = field(default=1.0, metadata={"help": ">1 penalises tokens already generated; 1 disables"})
    max_new_tokens: int = field(default=512, metadata={"help": 'generation limit per response; a response that hits it is "truncated"'})

    def __post_init__(self) -> None:
        check_field_types(self, "rollout")
        _number(self.temperature, "rollout.temperature", gt=0)
        _number(self.top_p, "rollout.top_p", gt=0, le=1)
        _number(self.top_k, "rollout.top_k", integer=True, ge=1, also=(-1,))
        _number(self.min_p, "rollout.min_p", ge=0, lt=1)
        _number(self.repetition_penalty, "rollout.repetition_penalty", gt=0)
        _number(self.max_new_tokens, "rollout.max_new_tokens", integer=True, ge=1)

    def override(self, changes: Mapping[str, Any]) -> SamplingParams:
        """Return a copy with ``changes`` applied; unknown parameter names are an error."""
        valid = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - valid)
        _require(not unknown, "sampling.escalation", f"unknown sampling parameter(s) {unknown}; valid: {sorted(valid)}")
        return dataclasses.replace(self, **dict(changes))


# ---------------------------------------------------------------------------------------------------------
# Group advantages
# ---------------------------------------------------------------------------------------------------------


@dataclass
class AdvantageConfig:
    """Group baseline / advantage estimator (see ``algorithms/advantages.py`` for the formulas)."""

    estimator: str = field(default="group_norm", metadata={"help": "one of algorithms.advantages.ADVANTAGE_ESTIMATORS"})
    eps: float = field(default=1e-9, metadata={"help": "added to the group std by group_norm (OpenRLHF 0.11 uses 1e-9)"})

    def __post_init__(self) -> None:
        check_field_types(self, "advantage")
        from adora_openrlhf.algorithms.advantages import ADVANTAGE_ESTIMATORS

        ADVANTAGE_ESTIMATORS.check(self.estimator)
        _number(self.eps, "advantage.eps", ge=0)


# ---------------------------------------------------------------------------------------------------------
# ADORA
# ---------------------------------------------------------------------------------------------------------

ADORA_MODES = ("attenuate", "amplify")


@dataclass
class AdoraConfig:
    """ADORA advantage reweighting (see ``algorithms/adora.py``).

    Every prompt group is classed as temporarily advantageous (TAS), disadvantageous (TDS) or neutral (the
    length rule's groups with no correct response under ``edge_policy="vlm"``). ``attenuate`` multiplies TDS advantages by
    ``lambda_att``; ``amplify`` multiplies TAS advantages by ``lambda_amp``. Neutral groups keep weight 1.
    """

    enabled: bool = field(default=False, metadata={"help": "off = plain estimator output, untouched"})
    rule: str = field(default="length", metadata={"help": 'group classification rule: one of algorithms.adora.GROUP_RULES ("length", "difficulty")'})
    mode: str = field(default="attenuate", metadata={"help": '"attenuate" (TDS *= lambda_att; the reference code) or "amplify" (TAS *= lambda_amp)'})
    lambda_att: float = field(default=0.1, metadata={"help": "attenuation factor for TDS groups, in (0, 1]"})
    lambda_amp: float = field(default=2.0, metadata={"help": "amplification factor for TAS groups, >= 1 (paper constant unverified; tune it)"})
    tau: float = field(default=0.5, metadata={"help": "difficulty rule: TAS when 0 < group accuracy <= tau"})
    correct_threshold: float = field(default=0.5, metadata={"help": "a response is correct when reward > this (1.0 for the Logic-RL K&K reward)"})
    drop_truncated_negatives: bool = field(default=True, metadata={"help": "length rule: incorrect responses that hit the limit are not counted"})
    edge_policy: str = field(
        default="vlm",
        metadata={
            "help": "length rule edge groups, one of algorithms.adora.EDGE_POLICIES: 'vlm' (no correct -> weight 1, "
            "correct but no counted incorrect -> TDS) or 'llm' (no correct -> TDS, correct but no counted incorrect -> TAS)"
        },
    )
    truncation_length: int | None = field(
        default=None,
        metadata={
            "help": "length rule: a response of at least this many tokens counts as truncated (the LLM reference: 3900 of 4096); None = only the engine's flag"
        },
    )
    length_shaping: bool = field(default=False, metadata={"help": "reference LLM option: shift correct rewards by length before normalising"})
    shaping_beta: float = field(default=0.5, metadata={"help": "length shaping magnitude: shift = +-beta * (2u - 1)"})
    shaping_p: float = field(default=0.5, metadata={"help": "length shaping: hard group if #correct < n*p, easy if #correct >= n*(1-p)"})

    def __post_init__(self) -> None:
        check_field_types(self, "adora")
        from adora_openrlhf.algorithms.adora import EDGE_POLICIES, GROUP_RULES

        EDGE_POLICIES.check(self.edge_policy)
        if self.truncation_length is not None:
            _number(self.truncation_length, "adora.truncation_length", integer=True, ge=1)
        GROUP_RULES.check(self.rule)
        _require(self.mode in ADORA_MODES, "adora.mode", f"unknown mode {self.mode!r}; choose one of {list(ADORA_MODES)}")
        _number(self.lambda_att, "adora.lambda_att", gt=0, le=1)  # weights only scale, never flip
        _number(self.lambda_amp, "adora.lambda_amp", ge=1)
        _number(self.tau, "adora.tau", gt=0, le=1)
        _number(self.correct_threshold, "adora.correct_threshold")
        _number(self.shaping_beta, "adora.shaping_beta", ge=0)
        _number(self.shaping_p, "adora.shaping_p", gt=0, le=1)


# ---------------------------------------------------------------------------------------------------------
# Adaptive multi-round sampling (Reinforce-Ada) with adaGRPO escalation
# ---------------------------------------------------------------------------------------------------------

POOL_SCOPES = ("step", "history")


@dataclass
class AdaptiveSamplingConfig:
    """Adaptive multi-round sampling (see ``algorithms/sampling.py``).

    When ``enabled`` is False the sampler does one round of ``n_keep`` responses per prompt and keeps them
    all, which is plain GRPO sampling.
    """

    enabled: bool = field(default=False, metadata={"help": "False = one round of n_keep responses per prompt (plain GRPO)"})
    exit_rule: str = field(default="balance", metadata={"help": 'when a prompt retires: one of algorithms.sampling.EXIT_RULES ("balance", "pos")'})
    positive_threshold: float = field(default=0.5, metadata={"help": "a response is positive when reward > this (Reinforce-Ada: 0.7 for 0/1 rewards)"})
    n_keep: int = field(default=4, metadata={"help": "responses kept per prompt for training (the group size n)"})
    samples_per_round: int = field(default=8, metadata={"help": "responses generated per round for each still-active prompt"})
    max_rounds: int = field(default=4, metadata={"help": "rounds per training step at most"})
    max_responses_per_prompt: int | None = field(
        default=None, metadata={"help": "hard cap on the pool per prompt per step; None = max_rounds*samples_per_round"}
    )
    pool_scope: str = field(default="step", metadata={"help": 'baseline pool: "step" (this step\'s responses) or "history" (every step so far)'})
    drop_unfinished: bool = field(default=False, metadata={"help": "drop prompts that never retired instead of keeping what they have"})
    escalation: list[dict[str, Any]] = field(default_factory=list, metadata={"help": "round r>=1 uses escalation[min(r-1, len-1)] over the defaults"})
    trigger_after_step: int = field(default=0, metadata={"help": "escalation is used only from this training step on (adaGRPO's K)"})

    def __post_init__(self) -> None:
        check_field_types(self, "sampling")
        from adora_openrlhf.algorithms.sampling import EXIT_RULES

        EXIT_RULES.check(self.exit_rule)
        _number(self.positive_threshold, "sampling.positive_threshold")
        _number(self.n_keep, "sampling.n_keep", integer=True, ge=1)
        _number(self.samples_per_round, "sampling.samples_per_round", integer=True, ge=1)
        _number(self.max_rounds, "sampling.max_rounds", integer=True, ge=1)
        _number(self.max_responses_per_prompt, "sampling.max_responses_per_prompt", integer=True, ge=1, also=(None,))
        _require(self.pool_scope in POOL_SCOPES, "sampling.pool_scope", f"must be one of {list(POOL_SCOPES)}, got {self.pool_scope!r}")
        _number(self.trigger_after_step, "sampling.trigger_after_step", integer=True, ge=0)
        _require(
            isinstance(self.escalation, list) and all(isinstance(e, Mapping) for e in self.escalation),
            "sampling.escalation",
            "must be a list of mappings such as [{'temperature': 1.2}, {'temperature': 1.4, 'top_p': 1.0}]",
        )
        for i, changes in enumerate(self.escalation):
            unknown = sorted(set(changes) - set(SAMPLING_PARAM_NAMES))
            _require(not unknown, f"sampling.escalation[{i}]", f"unknown sampling parameter(s) {unknown}; valid: {list(SAMPLING_PARAM_NAMES)}")
            try:  # each entry's values get the rollout parameters' range checks now, not at the entry's first use
                SamplingParams(**changes)
            except ConfigError as err:
                raise ConfigError(str(err).replace("rollout.", f"sampling.escalation[{i}].", 1)) from None
        if self.enabled:
            budget = self.response_budget
            _require(
                budget >= self.n_keep,
                "sampling.max_responses_per_prompt",
                f"the per-prompt budget ({budget} responses) is smaller than n_keep={self.n_keep}; raise "
                "max_rounds, samples_per_round or max_responses_per_prompt, or lower n_keep",
            )

    @property
    def response_budget(self) -> int:
        """Most responses one prompt may receive in one step."""
        full = self.max_rounds * self.samples_per_round
        return full if self.max_responses_per_prompt is None else min(full, self.max_responses_per_prompt)


# ---------------------------------------------------------------------------------------------------------
# DAPO dynamic filtering (the simple alternative to adaptive sampling)
# ---------------------------------------------------------------------------------------------------------


@dataclass
class DynamicFilteringConfig:
    """DAPO dynamic filtering (see ``algorithms/dynamic_filtering.py``), OpenRLHF's ``--algo.dynamic_filtering_enable``.

    A prompt's group of ``n_keep`` responses is kept when ``low < mean(scores) < high`` (scores: the task's 0/1
    correctness); other groups are dropped and as many new prompts are drawn from the data and sampled in their
    place, at most ``max_refills`` times per step. An alternative to adaptive sampling (``sampling.enabled``).
    """

    enabled: bool = field(
        default=False, metadata={"help": "drop groups whose mean correctness is outside score_range and refill them with new prompts (DAPO dynamic sampling)"}
    )
    score_range: list[float] = field(
        default_factory=lambda: [0.0, 1.0],
        metadata={
            "help": "[low, high]: a group is kept when low < mean correctness < high ([0, 1]: drop all-wrong and all-correct groups); "
            "OpenRLHF's --algo.dynamic_filtering_range"
        },
    )
    max_refills: int = field(
        default=4,
        metadata={
            "help": "refill rounds per step at most, each sampling as many new prompts as were dropped; after them the step "
            "trains on the groups it has (fewer than prompts_per_step, none = no update)"
        },
    )

    def __post_init__(self) -> None:
        if isinstance(self.score_range, tuple):  # OpenRLHF's namespace holds (low, high)
            self.score_range = list(self.score_range)
        check_field_types(self, "dynamic_filtering")
        _require(
            isinstance(self.score_range, list) and len(self.score_range) == 2,
            "dynamic_filtering.score_range",
            f"must be two numbers [low, high] such as [0, 1], got {self.score_range!r}",
        )
        for i, value in enumerate(self.score_range):
            _number(value, f"dynamic_filtering.score_range[{i}]")
        low, high = self.score_range
        _require(low < high, "dynamic_filtering.score_range", f"low must be below high (a group is kept when low < mean < high), got {self.score_range!r}")
        _require(
            low < 1 and high > 0,
            "dynamic_filtering.score_range",
            f"no group could ever be kept: a mean correctness lies in [0, 1], so low must be < 1 and high > 0, got {self.score_range!r}",
        )
        _number(self.max_refills, "dynamic_filtering.max_refills", integer=True, ge=0)


# ---------------------------------------------------------------------------------------------------------
# Model, data, optimisation, and the whole run
# ---------------------------------------------------------------------------------------------------------

TASKS = ("kk", "math", "geometry")
GEO_TASKS = ("count", "most", "larger", "colour")  # question kinds of data_prep.geo_synth.TASKS (a test keeps them equal)
BACKENDS = ("local", "openrlhf")
KV_CACHES = ("growing", "dynamic")  # backends/local/kv_cache.py: model.generate's key/value cache
DECODINGS = ("compact", "generate")  # backends/local/decoding.py: the local backend's decoding loop


@dataclass
class TinyModelConfig:
    """Random-init Qwen2-style causal LM built on the spot when no ``model.path`` is given (local backend)."""

    vocab_size: int = field(default=512, metadata={"help": "size of the byte-level BPE tokenizer trained on the task corpus"})
    hidden_size: int = field(default=128, metadata={"help": "tiny LM width"})
    intermediate_size: int = field(default=384, metadata={"help": "tiny LM MLP width"})
    num_hidden_layers: int = field(default=4, metadata={"help": "tiny LM transformer blocks"})
    num_attention_heads: int = field(default=4, metadata={"help": "tiny LM attention heads; must divide hidden_size"})
    num_key_value_heads: int = field(default=2, metadata={"help": "tiny LM key/value heads (grouped-query attention); must divide num_attention_heads"})
    max_position_embeddings: int = field(default=1024, metadata={"help": "tiny LM context length in tokens (prompt + response)"})

    def __post_init__(self) -> None:
        check_field_types(self, "model.tiny")
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            _number(getattr(self, name), f"model.tiny.{name}", integer=True, ge=1)
        _require(self.hidden_size % self.num_attention_heads == 0, "model.tiny.hidden_size", "must be divisible by num_attention_heads")
        _require(self.num_attention_heads % self.num_key_value_heads == 0, "model.tiny.num_key_value_heads", "must divide num_attention_heads")
        _number(self.vocab_size, "model.tiny.vocab_size", integer=True, ge=256)  # the byte alphabet


@dataclass
class TinyVisionConfig:
    """Vision tower of the tiny random-init Qwen2.5-VL built for ``data.task geometry`` (local backend)."""

    image_size: int = field(
        default=64, metadata={"help": "images are resized to image_size x image_size pixels; must be a multiple of patch_size * spatial_merge_size"}
    )
    patch_size: int = field(default=8, metadata={"help": "ViT patch side in pixels; (image_size / patch_size)^2 / spatial_merge_size^2 image tokens per image"})
    spatial_merge_size: int = field(default=2, metadata={"help": "patches merged per side into one language-model token"})
    depth: int = field(default=2, metadata={"help": "vision transformer blocks (the last one uses full attention)"})
    hidden_size: int = field(default=64, metadata={"help": "vision transformer width"})
    intermediate_size: int = field(default=128, metadata={"help": "vision MLP width"})
    num_heads: int = field(default=2, metadata={"help": "vision attention heads; must divide hidden_size"})

    def __post_init__(self) -> None:
        check_field_types(self, "model.tiny_vision")
        for name in ("image_size", "patch_size", "spatial_merge_size", "depth", "hidden_size", "intermediate_size", "num_heads"):
            _number(getattr(self, name), f"model.tiny_vision.{name}", integer=True, ge=1)
        unit = self.patch_size * self.spatial_merge_size
        _require(
            self.image_size >= unit and self.image_size % unit == 0,
            "model.tiny_vision.image_size",
            f"must be a positive multiple of patch_size * spatial_merge_size = {unit}, got {self.image_size}",
        )
        _require(self.depth >= 1, "model.tiny_vision.depth", f"must be >= 1, got {self.depth}")
        _require(self.hidden_size % self.num_heads == 0, "model.tiny_vision.hidden_size", "must be divisible by num_heads")


@dataclass
class ModelConfig:
    """Policy model: a local Hugging Face checkpoint or the tiny model."""

    path: str | None = field(
        default=None,
        metadata={
            "help": "Hugging Face model: a local directory or a hub name owner/name (loaded with from_pretrained; "
            "HF_HUB_OFFLINE=1 reads only the local hub cache); None -> tiny model"
        },
    )
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig, metadata={"help": "the tiny random-init language model (no model.path)"})
    tiny_vision: TinyVisionConfig = field(
        default_factory=TinyVisionConfig, metadata={"help": "vision tower of the tiny Qwen2.5-VL (data.task geometry, no model.path)"}
    )
    lora_rank: int = field(default=0, metadata={"help": "> 0 trains LoRA adapters (peft) instead of all weights"})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA scaling numerator: adapters are scaled by lora_alpha / lora_rank"})
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        metadata={"help": 'module names that get LoRA adapters, or ["all-linear"] (every linear layer but the output head, as in peft)'},
    )
    dtype: str = field(default="float32", metadata={"help": '"float32" | "bfloat16" | "float16"'})
    generation_batch_size: int = field(default=64, metadata={"help": "local backend: sequences per model.generate call (memory bound)"})
    freeze_visual_encoder: bool = field(
        default=False,
        metadata={
            "help": "vision-language models: keep the vision encoder and its projector into the language model fixed and train the "
            "language model only (OpenRLHF's --actor.freeze_visual_encoder; every parameter outside language_model.* and lm_head.*)"
        },
    )
    kv_cache: str = field(
        default="growing",
        metadata={
            "help": 'local backend: the KV cache of model.generate, "growing" (a preallocated buffer that doubles when full; '
            'same tokens as "dynamic", faster decoding) or "dynamic" (transformers\' DynamicCache, which concatenates every token)'
        },
    )
    decoding: str = field(
        default="compact",
        metadata={
            "help": 'local backend: "compact" (finished sequences leave the batch, so a batch costs about the sum of its response '
            'lengths; text prompts of full-attention models, others use model.generate) or "generate" (transformers\' model.generate, '
            "which runs every sequence until the longest ends); greedy tokens are the same"
        },
    )
    init_kwargs: dict[str, Any] = field(
        default_factory=dict,
        metadata={"help": 'extra from_pretrained arguments for model.path as a JSON object, e.g. {"trust_remote_code": true, "attn_implementation": "sdpa"}'},
    )
    merge_lora_on_save: bool = field(
        default=False,
        metadata={"help": "with LoRA: checkpoints and final_model hold the merged model (a plain checkpoint) instead of the adapters; resume still works"},
    )

    def __post_init__(self) -> None:
        if self.lora_target_modules == "all-linear":  # peft's spelling: one string
            self.lora_target_modules = ["all-linear"]
        check_field_types(self, "model")
        _number(self.generation_batch_size, "model.generation_batch_size", integer=True, ge=1)
        _require(self.kv_cache in KV_CACHES, "model.kv_cache", f"must be one of {list(KV_CACHES)}, got {self.kv_cache!r}")
        _require(self.decoding in DECODINGS, "model.decoding", f"must be one of {list(DECODINGS)}, got {self.decoding!r}")
        _number(self.lora_rank, "model.lora_rank", integer=True, ge=0)
        _number(self.lora_alpha, "model.lora_alpha", integer=True, gt=0)  # peft: an integer
        _require(
            self.path is None or (isinstance(self.path, str) and self.path.strip() != ""),
            "model.path",
            f"must be a directory or hub name (or unset for the tiny model), got {self.path!r}",
        )
        _require(
            isinstance(self.lora_target_modules, list)
            and all(isinstance(m, str) and m for m in self.lora_target_modules)
            and (self.lora_rank == 0 or len(self.lora_target_modules) > 0),
            "model.lora_target_modules",
            f'must be a non-empty list of module names such as ["q_proj", "v_proj"], got {self.lora_target_modules!r}',
        )
        _require(self.dtype in ("float32", "bfloat16", "float16"), "model.dtype", f"must be float32, bfloat16 or float16, got {self.dtype!r}")
        _require(
            isinstance(self.init_kwargs, Mapping) and all(isinstance(k, str) and k for k in self.init_kwargs),
            "model.init_kwargs",
            f'must be a JSON object of from_pretrained arguments such as {{"trust_remote_code": true}}, got {self.init_kwargs!r}',
        )
        for key in ("dtype", "torch_dtype", "pretrained_model_name_or_path"):
            _require(
                key not in self.init_kwargs,
                f"model.init_kwargs.{key}",
                "is set by the run itself" + (" (use model.dtype)" if "dtype" in key else " (use model.path)"),
            )
        try:
            json.dumps(self.init_kwargs)
        except (TypeError, ValueError):
            raise ConfigError(f"model.init_kwargs: values must be JSON (strings, numbers, booleans, lists, objects), got {self.init_kwargs!r}") from None
        _require(
            self.lora_target_modules == ["all-linear"] or "all-linear" not in self.lora_target_modules,
            "model.lora_target_modules",
            '"all-linear" stands alone: give ["all-linear"] or a list of module names',
        )


@dataclass
class DataConfig:
    """Training / evaluation prompts in the one JSONL schema (prompt, label, images, source, meta)."""

    task: str = field(default="kk", metadata={"help": '"kk" | "math" | "geometry": picks the reward and the prompt template'})
    train_path: str | None = field(default=None, metadata={"help": "JSONL file or HF dataset name; None -> generated K&K puzzles (task kk)"})
    eval_path: str | None = field(default=None, metadata={"help": "held-out JSONL; None -> generated K&K puzzles disjoint from training"})
    kk_num_people: list[int] = field(
        default_factory=lambda: [2, 3], metadata={"help": "people per generated puzzle (task kk), cycled: [2, 2, 3] = two 2-person per 3-person"}
    )
    kk_name_pool: int = field(
        default=26, metadata={"help": "generated K&K puzzles draw their names from the first k of 26 names (a small pool eases copying for a tiny model)"}
    )
    kk_name_order: str = field(
        default="random", metadata={"help": "generated K&K puzzles list their names in random order or in pool order ('pool': Alice before Bob before Carol)"}
    )
    num_train: int = field(default=2000, metadata={"help": "generated training puzzles"})
    num_eval: int = field(default=100, metadata={"help": "generated held-out puzzles"})
    max_prompt_tokens: int = field(default=512, metadata={"help": "prompts longer than this are rejected with their row index"})
    geo_tasks: list[str] = field(
        default_factory=lambda: ["count", "most", "larger"],
        metadata={"help": "task geometry without train_path: question kinds of the generated images (data_prep.geo_synth.TASKS)"},
    )
    geo_levels: list[int] = field(
        default_factory=lambda: [1, 2, 3, 4],
        metadata={"help": "task geometry without train_path: difficulty levels 1..4 of the generated images (more shapes, distractors, closer sizes)"},
    )
    prompt_template: str = field(
        default="auto", metadata={"help": 'local backend: "auto" (chat template if the tokenizer has one, else "compact") | "chat" | "compact"'}
    )
    kk_parser: str = field(
        default="lenient",
        metadata={
            "help": "K&K answer parser: 'lenient' (phrasing variants such as 'Name: knight') or 'logic_rl' "
            "(Logic-RL's role-count rule and 'Name is a knight' statements exactly); a row's meta.kk_parser wins"
        },
    )

    def __post_init__(self) -> None:
        check_field_types(self, "data")
        from adora_openrlhf.backends.local.tokenization import PROMPT_TEMPLATES

        PROMPT_TEMPLATES.check(self.prompt_template)
        _require(self.task in TASKS, "data.task", f"unknown task {self.task!r}; choose one of {list(TASKS)}")
        _require(
            isinstance(self.kk_num_people, list) and len(self.kk_num_people) > 0,
            "data.kk_num_people",
            f"must be a non-empty list of people counts such as [2, 3], got {self.kk_num_people!r}",
        )
        for i, people in enumerate(self.kk_num_people):
            _number(people, f"data.kk_num_people[{i}]", integer=True, ge=2, le=8)
        _require(self.kk_name_order in ("random", "pool"), "data.kk_name_order", f"must be 'random' or 'pool', got {self.kk_name_order!r}")
        _number(self.kk_name_pool, "data.kk_name_pool", integer=True, ge=max(self.kk_num_people), le=26)
        _number(self.num_train, "data.num_train", integer=True, ge=1)
        _number(self.num_eval, "data.num_eval", integer=True, ge=1)
        _number(self.max_prompt_tokens, "data.max_prompt_tokens", integer=True, ge=1)
        for name in ("train_path", "eval_path"):
            value = getattr(self, name)
            _require(value is None or (isinstance(value, str) and value.strip() != ""), f"data.{name}", f"must be a file path or dataset name, got {value!r}")
        _require(self.kk_parser in ("lenient", "logic_rl"), "data.kk_parser", f"unknown K&K answer parser {self.kk_parser!r}; choose lenient or logic_rl")
        _require(
            isinstance(self.geo_tasks, list) and bool(self.geo_tasks) and all(t in GEO_TASKS for t in self.geo_tasks),
            "data.geo_tasks",
            f"each must be one of {', '.join(GEO_TASKS)}, got {self.geo_tasks}",
        )
        _require(
            isinstance(self.geo_levels, list) and bool(self.geo_levels), "data.geo_levels", f"must be a non-empty list of levels 1..4, got {self.geo_levels!r}"
        )
        for i, level in enumerate(self.geo_levels):
            _number(level, f"data.geo_levels[{i}]", integer=True, ge=1, le=4)


@dataclass
class PolicyLossConfig:
    """Token-level PPO-clip objective with optional KL to a frozen reference."""

    lr: float = field(default=1e-5, metadata={"help": "AdamW learning rate"})
    lr_scheduler: str = field(
        default="constant",
        metadata={
            "help": "learning-rate schedule over the run's optimiser steps: constant | constant_with_warmup | linear | cosine | "
            "cosine_with_min_lr (OpenRLHF's names and formulas, algorithms/lr_schedules.py)"
        },
    )
    lr_warmup_ratio: float = field(default=0.0, metadata={"help": "warm-up share of the optimiser steps (ceil(ratio * steps)); ignored by constant"})
    min_lr_ratio: float = field(default=0.1, metadata={"help": "cosine_with_min_lr: the floor, as a fraction of lr"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    clip_eps_low: float = field(default=0.2, metadata={"help": "ratio clipped to [1 - clip_eps_low, 1 + clip_eps_high]"})
    clip_eps_high: float = field(default=0.2, metadata={"help": "DAPO's clip-higher uses e.g. 0.28"})
    kl_coef: float = field(default=0.0, metadata={"help": "> 0 adds kl_coef * KL(policy || reference) (k3 estimator) per token"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping"})
    ppo_epochs: int = field(default=1, metadata={"help": "passes over each rollout batch"})
    micro_batch_size: int = field(default=8, metadata={"help": "responses per forward/backward"})
    loss_agg: str = field(
        default="token_mean", metadata={"help": '"token_mean" (DAPO) | "seq_mean_token_mean" (GRPO paper) | "seq_mean_token_sum_norm" (Dr. GRPO)'}
    )

    def __post_init__(self) -> None:
        check_field_types(self, "train")
        _number(self.lr, "train.lr", gt=0)
        _number(self.lr_warmup_ratio, "train.lr_warmup_ratio", ge=0, lt=1)
        _number(self.min_lr_ratio, "train.min_lr_ratio", ge=0, le=1)
        _number(self.weight_decay, "train.weight_decay", ge=0)
        _number(self.clip_eps_low, "train.clip_eps_low", gt=0, lt=1)  # 1 - clip_eps_low must stay a positive ratio
        _number(self.clip_eps_high, "train.clip_eps_high", gt=0)
        _number(self.kl_coef, "train.kl_coef", ge=0)
        _number(self.max_grad_norm, "train.max_grad_norm", gt=0)  # 0 would freeze every gradient, < 0 flip it
        _number(self.ppo_epochs, "train.ppo_epochs", integer=True, ge=1)
        _number(self.micro_batch_size, "train.micro_batch_size", integer=True, ge=1)
        from adora_openrlhf.algorithms.lr_schedules import LR_SCHEDULES
        from adora_openrlhf.algorithms.policy_loss import LOSS_AGGREGATIONS

        LOSS_AGGREGATIONS.check(self.loss_agg)
        LR_SCHEDULES.check(self.lr_scheduler)


@dataclass
class WarmupConfig:
    """Supervised warm-up before RL (local backend): next-token loss on the task's demonstrations, so a
    random-init model has some reward signal. Two phases: ``steps`` on demonstrations of one ``style`` (or of a
    mixture, ``style_shares``), then ``mix_steps`` on a mixture of styles (``mix``). Styles are registered per
    task in ``backends/local/sft.py`` (K&K: ``direct``, ``thorough``, ``shortcut``, ``restate``). Each phase's learning rate
    rises linearly from 0 over the first ``lr_ramp`` fraction of its steps, then decays linearly to 0."""

    steps: int = field(default=0, metadata={"help": "phase 1: optimiser steps of supervised training before RL; 0 = none"})
    lr: float = field(default=1e-3, metadata={"help": "phase 1 AdamW learning rate (linear decay to 0)"})
    batch_size: int = field(default=32, metadata={"help": "demonstrations per warm-up step (both phases)"})
    style: str = field(default="direct", metadata={"help": "phase 1 demonstration style (K&K: direct | thorough | shortcut | restate)"})
    style_shares: dict[str, float] = field(
        default_factory=dict,
        metadata={"help": 'phase 1 as a mixture of styles instead of warmup.style alone, e.g. {"thorough": 0.85, "shortcut": 0.15}; {} = warmup.style only'},
    )
    lr_ramp: float = field(default=0.0, metadata={"help": "fraction of each phase's steps over which the lr rises linearly from 0 (0 = none)"})
    mix_steps: int = field(default=0, metadata={"help": "phase 2: optimiser steps on a mixture of styles; 0 = no phase 2"})
    mix_lr: float = field(default=1e-3, metadata={"help": "phase 2 AdamW learning rate (linear decay to 0)"})
    mix: dict[str, float] = field(default_factory=dict, metadata={"help": 'phase 2 style shares, e.g. {"thorough": 0.3, "shortcut": 0.7}'})

    def __post_init__(self) -> None:
        check_field_types(self, "warmup")
        _number(self.steps, "warmup.steps", integer=True, ge=0)
        _number(self.lr, "warmup.lr", gt=0)
        _number(self.batch_size, "warmup.batch_size", integer=True, ge=1)
        _require(isinstance(self.style, str) and bool(self.style), "warmup.style", f"must be a style name, got {self.style!r}")
        _require(isinstance(self.style_shares, Mapping), "warmup.style_shares", 'must be a mapping style -> share, e.g. {"thorough": 0.85, "shortcut": 0.15}')
        for style, share in self.style_shares.items():
            _number(share, f"warmup.style_shares[{style!r}]", ge=0)
        _require(
            not self.style_shares or sum(self.style_shares.values()) > 0,
            "warmup.style_shares",
            "give at least one style a positive share, or {} for warmup.style alone",
        )
        _number(self.lr_ramp, "warmup.lr_ramp", ge=0, lt=1)
        _number(self.mix_steps, "warmup.mix_steps", integer=True, ge=0)
        _number(self.mix_lr, "warmup.mix_lr", gt=0)
        _require(isinstance(self.mix, Mapping), "warmup.mix", 'must be a mapping style -> share, e.g. {"thorough": 0.3, "shortcut": 0.7}')
        for style, share in self.mix.items():
            _number(share, f"warmup.mix[{style!r}]", ge=0)
        _require(self.mix_steps == 0 or sum(self.mix.values()) > 0, "warmup.mix", "give at least one style a positive share when warmup.mix_steps > 0")


REPORT_TO_CHOICES = ("tensorboard", "wandb", "none")  # backends/local/metrics.py TRACKERS, plus "none"


def parse_report_to(value: Any) -> list[str]:
    """``report_to`` as a list of tracker names (``"tensorboard,wandb"`` -> ``["tensorboard", "wandb"]``), checked:
    known names, ``none`` alone, and an importable ``wandb`` when wandb is asked for."""
    names = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value
    _require(
        isinstance(names, list) and all(isinstance(n, str) for n in names),
        "report_to",
        f"must be a list or comma list of {list(REPORT_TO_CHOICES)}, got {value!r}",
    )
    unknown = [n for n in names if n not in REPORT_TO_CHOICES]
    _require(not unknown, "report_to", f"unknown tracker(s) {unknown}; choose from {list(REPORT_TO_CHOICES)}")
    _require("none" not in names or len(names) == 1, "report_to", f"'none' cannot be combined with other trackers, got {names}")
    if "wandb" in names:
        import importlib.util

        _require(
            importlib.util.find_spec("wandb") is not None,
            "report_to",
            "'wandb' needs the wandb package, which is not installed; install it with "
            "`pip install 'adora_openrlhf[wandb]'` (or `pip install wandb`), or drop wandb from report_to",
        )
    return list(names)


@dataclass
class RunConfig:
    """One training run: recipe name, backend and every component's config."""

    recipe: str = field(default="kk-tiny", metadata={"help": "named preset this config was built from (adora_openrlhf.recipes.RECIPES)"})
    backend: str = field(default="local", metadata={"help": '"local" (embedded, one process) | "openrlhf" (Ray + vLLM + DeepSpeed cluster)'})
    seed: int = field(default=0, metadata={"help": "seed of data order, model init, sampling and evaluation; in [0, 2**32)"})
    steps: int = field(default=100, metadata={"help": "RL steps (each: sample, score, advantages, policy update)"})
    prompts_per_step: int = field(default=8, metadata={"help": "prompts per RL step (rollout batch)"})
    output_dir: str = field(default="runs/kk-tiny", metadata={"help": "run directory: config, metrics, checkpoints, final model"})
    save_every: int = field(default=25, metadata={"help": "checkpoint every k steps (0 = only at the end)"})
    eval_every: int = field(default=25, metadata={"help": "held-out evaluation every k steps (0 = only at start and end)"})
    report_to: list[str] = field(
        default_factory=lambda: ["tensorboard"],
        metadata={
            "help": "local backend: experiment trackers besides metrics.jsonl (always written), a list or a comma "
            "list of " + ", ".join(REPORT_TO_CHOICES) + "; 'none' = JSONL only. wandb needs `pip install "
            "'adora_openrlhf[wandb]'`; WANDB_MODE=offline runs it with no network"
        },
    )
    rollout: SamplingParams = field(default_factory=SamplingParams, metadata={"help": "default (round-0) sampling parameters"})
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig, metadata={"help": "group baseline (advantage estimator)"})
    adora: AdoraConfig = field(default_factory=AdoraConfig, metadata={"help": "ADORA advantage reweighting"})
    sampling: AdaptiveSamplingConfig = field(default_factory=AdaptiveSamplingConfig, metadata={"help": "n_keep = group size n"})
    dynamic_filtering: DynamicFilteringConfig = field(
        default_factory=DynamicFilteringConfig, metadata={"help": "DAPO dynamic filtering: drop all-correct/all-wrong groups and refill"}
    )
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "policy model"})
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "training and held-out prompts"})
    train: PolicyLossConfig = field(default_factory=PolicyLossConfig, metadata={"help": "policy loss and optimiser"})
    warmup: WarmupConfig = field(default_factory=WarmupConfig, metadata={"help": "local backend: supervised warm-up before RL"})
    eval_samples: int = field(
        default=1, metadata={"help": "held-out evaluation: sampled responses per puzzle (rollout parameters) besides the greedy one; 0 = greedy only"}
    )
    extra: dict[str, Any] = field(default_factory=dict, metadata={"help": "backend-specific options (e.g. OpenRLHF pass-through flags)"})
    max_missing_reward_fraction: float = field(
        default=0.01,
        metadata={
            "help": "openrlhf backend: rollouts of a batch that OpenRLHF's executor returns without a reward are "
            "scored 0 and counted (info 'reward_missing'); the run fails when their fraction exceeds this"
        },
    )

    def __post_init__(self) -> None:
        self.report_to = parse_report_to(self.report_to)  # a comma list of names becomes a list first
        check_field_types(self, "")
        _require(self.backend in BACKENDS, "backend", f"unknown backend {self.backend!r}; choose one of {list(BACKENDS)}")
        _number(self.seed, "seed", integer=True, ge=0, lt=2**32)  # NumPy's seed range
        _number(self.steps, "steps", integer=True, ge=1)
        _number(self.prompts_per_step, "prompts_per_step", integer=True, ge=1)
        _number(self.save_every, "save_every", integer=True, ge=0)
        _number(self.eval_every, "eval_every", integer=True, ge=0)
        _number(self.eval_samples, "eval_samples", integer=True, ge=0)
        _number(self.max_missing_reward_fraction, "max_missing_reward_fraction", ge=0, le=1)
        _require(isinstance(self.output_dir, str) and self.output_dir.strip() != "", "output_dir", f"must be a directory path, got {self.output_dir!r}")
        _require(
            not self.model.freeze_visual_encoder or self.data.task == "geometry",
            "model.freeze_visual_encoder",
            f"applies to vision-language models (data.task geometry), got data.task {self.data.task!r}; drop --model.freeze_visual_encoder",
        )
        if self.dynamic_filtering.enabled:
            _require(
                not self.sampling.enabled,
                "dynamic_filtering.enabled",
                "DAPO dynamic filtering and adaptive sampling (sampling.enabled) are alternatives; use one: "
                "--dynamic_filtering.enabled false or --sampling.enabled false",
            )
            _require(
                self.sampling.n_keep >= 2,
                "dynamic_filtering.enabled",
                f"needs groups of 2 or more responses (sampling.n_keep = {self.sampling.n_keep}): a single response's mean "
                "correctness is 0 or 1, outside the kept range; raise --sampling.n_keep",
            )

    @property
    def n_samples_per_prompt(self) -> int:
        """The training group size n (kept responses per prompt)."""
        return self.sampling.n_keep

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(values: Mapping[str, Any]) -> RunConfig:
        return from_dict(RunConfig, values)
