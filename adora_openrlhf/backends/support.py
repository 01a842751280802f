"""Which :class:`RunConfig` field each backend honours, and how: one table per backend, checked at start.

Every leaf field of ``RunConfig`` has one entry per backend:

- :data:`MAPPED`: turned into the engine's own option (openrlhf: the fields of ``field_flags.FIELD_FLAGS``; the test
  changes the field and sees the OpenRLHF command line change);
- :data:`USED`: read by this package's own code on that backend (the comment says where);
- :class:`Refused`: the backend cannot honour it; a value other than the default (under the entry's
  condition) is a :class:`ConfigError` naming the field, the backend and the fix.

:func:`check_backend_fields` runs the table of ``cfg.backend``; both backends call it before anything is built,
so no field is silently ignored.

:data:`OPENRLHF_FLAGS` does the same for OpenRLHF's own flags that have no ``RunConfig`` field but meet this
package's classes (asynchronous training, the off-policy corrections): :func:`check_openrlhf_flags` reads them
from OpenRLHF's parsed namespace (``flags.reconcile``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from adora_openrlhf.backends.openrlhf.field_flags import mapped_fields
from adora_openrlhf.config import ConfigError, RunConfig
from adora_openrlhf.dotted import flatten, value_at

MAPPED = "mapped"
USED = "used"


def _always(cfg: RunConfig) -> bool:
    return True


def _sampling_off(cfg: RunConfig) -> bool:
    return not cfg.sampling.enabled


@dataclass(frozen=True)
class Refused:
    """The backend cannot honour the field: ``fix`` says what to do instead; ``when`` limits the refusal (e.g.
    to runs with adaptive sampling off; it gets the ``RunConfig``, or OpenRLHF's namespace for an entry of
    :data:`OPENRLHF_FLAGS`); ``allowed`` decides which non-default values are fine anyway."""

    fix: str
    when: Callable[[Any], bool] = _always
    allowed: Callable[[Any], bool] = lambda value: False


Support = str | Refused

_GENERATED = Refused(
    "generated data is a local-backend feature; write the rows with `python -m data_prep.kk --out DIR` and pass --data.train_path"
)
_TINY = Refused("the openrlhf backend trains model.path (a Hugging Face model); the tiny model is local-only")
_WARMUP = Refused(
    "the supervised warm-up is a local-backend phase; run OpenRLHF's SFT (openrlhf.cli.train_sft) first and pass its output as --model"
)

OPENRLHF: dict[str, Support] = {
    **{dotted: MAPPED for dotted in mapped_fields()},  # field_flags.FIELD_FLAGS; the entries below override
    "recipe": USED,  # recorded with the run
    "backend": USED,  # picks this table
    "extra": USED,  # extra.openrlhf: the recipe's OpenRLHF flags
    "max_missing_reward_fraction": USED,  # samples_generator.check_missing_rewards
    "plugins": USED,  # RunConfig.from_dict (driver and trainer actor), ADORA_PLUGINS in every Ray worker (launcher.ray_env_vars)
    "rollout.top_k": USED,  # AdoraPPOTrainer adds it to OpenRLHF's generate_kwargs (its vLLM SamplingParams read top_k)
    "rollout.min_p": Refused(
        "OpenRLHF 0.11.2's own rollout sends no min_p to vLLM; it is used only by adaptive sampling (--sampling.enabled true)",
        _sampling_off,
    ),
    "rollout.repetition_penalty": Refused(
        "OpenRLHF 0.11.2's own rollout sends no repetition_penalty to vLLM; it is used only by adaptive sampling (--sampling.enabled true)",
        _sampling_off,
    ),
    "advantage.eps": USED,  # AdoraExperienceMaker: group advantages of this package
    # advantage.gamma / lambd and critic.lr / weight_decay / max_grad_norm / value_clip: MAPPED (field_flags), gae's
    # critic is OpenRLHF's own (its critic actor group); the two settings below have no OpenRLHF counterpart
    "critic.epochs": Refused(
        "OpenRLHF's critic trains for as many epochs as the policy (--train.max_epochs, our train.ppo_epochs); leave "
        "critic.epochs at 1 and set train.ppo_epochs"
    ),
    "critic.warm_start": Refused(
        "OpenRLHF's critic starts from --critic.model_name_or_path (default: the policy's model, value head new); "
        "pass another model there instead"
    ),
    # AdoraExperienceMaker
    **{
        f"adora.{name}": USED
        for name in (
            "enabled",
            "rule",
            "mode",
            "lambda_att",
            "lambda_amp",
            "tau",
            "correct_threshold",
            "drop_truncated_negatives",
            "edge_policy",
            "truncation_length",
            "length_shaping",
            "shaping_beta",
            "shaping_p",
        )
    },
    # AdoraSamplesGenerator (flags.reconcile refuses drop_unfinished)
    **{
        f"sampling.{name}": USED
        for name in (
            "enabled",
            "exit_rule",
            "positive_threshold",
            "samples_per_round",
            "max_rounds",
            "max_responses_per_prompt",
            "pool_scope",
            "drop_unfinished",
            "escalation",
            "trigger_after_step",
        )
    },
    # AdoraSamplesGenerator holds the RolloutAllocator (flags.reconcile checks its batch sizes)
    "allocation.method": Refused(
        "'skip' changes the number of responses per step, which OpenRLHF's fixed training batch (train.batch_size "
        "samples per optimiser step) cannot take on this backend; use 'difficulty' or 'knapsack'",
        allowed=lambda value: value in ("difficulty", "knapsack"),
    ),
    **{
        f"allocation.{name}": USED
        for name in (
            "candidates",
            "budget",
            "min_responses",
            "max_responses",
            "value",
            "skip_threshold",
            "explore",
            "prior",
            "decay",
            "max_prompts",
        )
    },
    "dynamic_filtering.max_refills": Refused(
        "OpenRLHF refills dropped prompts until its data runs out, with no cap per step; leave dynamic_filtering.max_refills at its default"
    ),
    **{
        f"model.tiny.{name}": _TINY
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
        )
    },
    **{
        f"model.tiny_vision.{name}": _TINY
        for name in (
            "image_size",
            "patch_size",
            "spatial_merge_size",
            "depth",
            "hidden_size",
            "intermediate_size",
            "num_heads",
        )
    },
    "model.generation_batch_size": Refused(
        "the local backend's generate batch; on the cluster vLLM batches itself (see --rollout.micro_batch_size)"
    ),
    "model.kv_cache": Refused("the local backend's generate cache; on the cluster vLLM manages its own paged KV cache"),
    "model.decoding": Refused(
        "the local backend's decoding loop; on the cluster vLLM schedules sequences itself (continuous batching)"
    ),
    "model.numerics": Refused(
        "the local backend's compact-decoding arithmetic; on the cluster vLLM computes with its own kernels"
    ),
    # attn_implementation: MAPPED
    "model.init_kwargs": Refused(
        'OpenRLHF builds the model itself; of model.init_kwargs it takes {"attn_implementation": ...} '
        '(--ds.attn_implementation) and {"trust_remote_code": true} (always on)',
        allowed=lambda value: (
            set(value) <= {"attn_implementation", "trust_remote_code"} and value.get("trust_remote_code", True) is True
        ),
    ),
    "model.merge_lora_on_save": Refused(
        "OpenRLHF saves its checkpoints its own way; merge the adapters of its final model afterwards"
    ),
    "data.task": USED,  # reward routing; geometry adds --data.image_key
    **{
        f"data.{name}": _GENERATED
        for name in (
            "kk.num_people",
            "kk.name_pool",
            "kk.name_order",
            "num_train",
            "num_eval",
            "rl_prompts",
            "geo.tasks",
            "geo.levels",
        )
    },
    # auto/chat: MAPPED to --data.apply_chat_template
    "data.prompt_template": Refused(
        "OpenRLHF renders prompts with the tokenizer's chat template (--data.apply_chat_template); use auto or chat",
        allowed=lambda value: value in ("auto", "chat"),
    ),
    "grading.deadline_s": USED,  # ADORA_GRADING_DEADLINE_S in every Ray worker (launcher.ray_env_vars); the reward file reads it
    "grading.workers": USED,  # ADORA_GRADING_WORKERS
    "data.kk.parser": USED,  # ADORA_KK_PARSER in every Ray worker (launcher.ray_env_vars)
    **{
        f"warmup.{name}": _WARMUP
        for name in ("steps", "lr", "batch_size", "style", "style_shares", "lr_ramp", "mix_steps", "mix_lr", "mix")
    },
    "report_to": Refused(
        "the openrlhf backend logs through OpenRLHF's own options (--logger.tensorboard_dir DIR, --logger.wandb.key KEY)"
    ),
}

# The local backend runs every field in its own code (trainer.py and the modules it calls), except these two.
LOCAL: dict[str, Support] = {
    **{dotted: USED for dotted in OPENRLHF},
    # rl_step.filtered_sample
    **{f"dynamic_filtering.{name}": USED for name in ("enabled", "score_range", "max_refills")},
    "extra": Refused(
        "extra holds backend-specific options (extra.openrlhf: OpenRLHF flags); the local backend has none"
    ),
    "max_missing_reward_fraction": Refused(
        "the local backend scores every response itself; this limit is for OpenRLHF's reward executor"
    ),
}

BACKEND_FIELDS: dict[str, Mapping[str, Support]] = {"local": LOCAL, "openrlhf": OPENRLHF}


# OpenRLHF 0.11.2 flags without a RunConfig field (they pass through: extra.openrlhf or the command line) whose
# effect on this package's classes is tested; every other OpenRLHF flag is OpenRLHF's business alone.
OPENRLHF_FLAGS: dict[str, Support] = {
    # async_trainer: OpenRLHF's asynchronous loop with AdoraSamplesGenerator and AdoraExperienceMaker
    # (tests/test_openrlhf_e2e.py: three ZeRO-3 steps, staleness logged, --resume)
    "train.async_enable": USED,
    "train.partial_rollout_enable": Refused(
        "partial rollouts let a weight sync land in the middle of a batch, so one group's rounds would come from "
        "different policy versions (the sampler's pool and ADORA's classes assume one); drop "
        "--train.partial_rollout_enable (asynchronous training without it keeps one version per batch)"
    ),  # OpenRLHF accepts it with --train.async_enable only
    # AdoraSamplesGenerator asks vLLM for the sampled tokens' log-probs when the level is not off; the
    # experience maker keeps them (rollout_log_probs) beside the advantages it writes, and OpenRLHF's PolicyLoss
    # reweights or masks each token by pi_train / pi_rollout (tests/test_openrlhf_experience_maker.py)
    **{f"algo.advantage.is_correction_{name}": USED for name in ("level", "mode", "gating", "threshold")},
    # OpenRLHF's KL loss weights its gradient by pi / pi_old, with pi_old the trainer's action_log_probs, which
    # AdoraExperienceMaker leaves as OpenRLHF computed them (same test)
    "algo.kl.unbiased_gradient": USED,
}


def check_openrlhf_flags(args: Any) -> None:
    """ConfigError for the first entry of :data:`OPENRLHF_FLAGS` that refuses its value in OpenRLHF's parsed
    namespace ``args``."""
    for dotted, support in OPENRLHF_FLAGS.items():
        value = value_at(args, dotted)
        if isinstance(support, Refused) and value and support.when(args) and not support.allowed(value):
            raise ConfigError(f"{dotted}: not supported by the openrlhf backend (got {value!r}); {support.fix}")


def leaf_values(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a.b": value} of a ``RunConfig.to_dict()`` (dict-valued fields such as ``extra`` are leaves)."""
    from adora_openrlhf.cli_args import LEAF_TYPES

    return flatten(values, is_leaf=LEAF_TYPES.__contains__, prefix=prefix)


def check_backend_fields(cfg: RunConfig) -> None:
    """ConfigError for the first field that ``cfg.backend`` refuses and that ``cfg`` sets to another value
    than its default."""
    defaults = leaf_values(RunConfig().to_dict())
    for dotted, value in leaf_values(cfg.to_dict()).items():
        # tests/test_backend_fields.py: every field has an entry
        support = BACKEND_FIELDS[cfg.backend].get(dotted, USED)
        if (
            isinstance(support, Refused)
            and value != defaults[dotted]
            and support.when(cfg)
            and not support.allowed(value)
        ):
            raise ConfigError(f"{dotted}: not supported by the {cfg.backend} backend (got {value!r}); {support.fix}")
