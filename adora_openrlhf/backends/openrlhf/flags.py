"""RunConfig -> OpenRLHF 0.11 command-line flags, the checks between the two, and the config carried to Ray.

The OpenRLHF command line of a run is built in three layers, later ones winning (argparse keeps the last
value of a repeated option):

1. flags derived from the :class:`RunConfig` (:func:`derived_flags`): the data keys and the reward file of
   :mod:`adora_openrlhf.rewards`, then every field of the mapping table (``field_flags.FIELD_FLAGS``: model,
   group size, sampling defaults, estimator, optimiser, KL, checkpoints, evaluation, DAPO dynamic filtering);
   fields this backend cannot honour are refused (``backends/support.py``);
2. the recipe's cluster flags, ``RunConfig.extra["openrlhf"]`` (a mapping ``{"actor.num_gpus_per_node": 8,
   "train.colocate_all": True, ...}``: dotted OpenRLHF names without the leading ``--``);
3. the OpenRLHF flags typed on our command line (everything our parser does not know is passed through).

After OpenRLHF's parser has validated the result, :func:`reconcile` copies the fields both sides share (the
table's read-backs: group size, estimator, rollout temperature/top_p/max_new_tokens, dtype, LoRA, evaluation
samples, dynamic filtering, the learning-rate schedule, and the model, data and output paths, made absolute where they
are local) from the final namespace back into the RunConfig, built once from that dict, so an
OpenRLHF flag given explicitly is what both OpenRLHF and our classes use, and rejects
combinations our classes do not support. :func:`attach_run_config` stores the RunConfig as JSON on the
namespace (``args.adora_run_config``); the namespace travels inside OpenRLHF's strategy object to the Ray
trainer actor, where :func:`run_config_from_args` rebuilds it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from adora_openrlhf.backends.openrlhf.field_flags import LOSS_AGG_MODES, PARAM_DTYPES, read_back, table_flags
from adora_openrlhf.cli_args import apply_overrides
from adora_openrlhf.config import ConfigError, RunConfig
from adora_openrlhf.rewards.openrlhf_reward import REWARD_LABEL_KEY  # the column data_prep writes (source, label, meta)

EXTRA_KEY = "openrlhf"  # RunConfig.extra[EXTRA_KEY]: recipe-level OpenRLHF flags {"group.name": value}
ARGS_ATTR = "adora_run_config"  # attribute of OpenRLHF's args namespace holding our RunConfig as JSON
CHECKPOINT_CONFIG = "adora_run_config.json"  # the RunConfig, saved by the trainer in each DeepSpeed checkpoint folder
MARKER_FILE = "adora_trainer.json"  # output_dir/MARKER_FILE: written by our trainer actor, checked by the launcher
LAUNCH_ID_ATTR = "adora_launch_id"  # attribute of OpenRLHF's args namespace: the launch's id, echoed in the marker


def reward_file_path() -> str:
    """Absolute path of the reward hook file passed to ``--reward.remote_url``."""
    return str(Path(__file__).resolve().parents[2] / "rewards" / "openrlhf_reward.py")


def flag_tokens(name: str, value: Any) -> list[str]:
    """Command-line tokens of one OpenRLHF option: True -> ``--name``; False/None -> nothing; a list or
    tuple -> ``--name v1 v2``; anything else -> ``--name value``."""
    flag = name if name.startswith("--") else f"--{name}"
    if value is None or value is False:
        return []
    if value is True:
        return [flag]
    if isinstance(value, (list, tuple)):
        return [flag, *(str(v) for v in value)]
    return [flag, str(value)]


def derived_flags(cfg: RunConfig, resume: bool = False) -> dict[str, Any]:
    """OpenRLHF options implied by the RunConfig (dotted names, values as for :func:`flag_tokens`). Fields this
    backend cannot honour are refused first (``backends/support.py``)."""
    from adora_openrlhf.backends.support import check_backend_fields

    check_backend_fields(cfg)
    if cfg.advantage.estimator == "gae" and cfg.critic.value_clip is None:
        raise ConfigError(
            "critic.value_clip: OpenRLHF's critic always clips its value loss (--critic.value_clip takes a number); "
            "give a value (OpenRLHF's default: 0.5) or use --backend local for the unclipped loss"
        )
    if not cfg.model.path:
        raise ConfigError(
            "model.path: the openrlhf backend needs a Hugging Face model (name or directory); pass --model PATH"
        )
    if not cfg.data.train_path:
        raise ConfigError(
            "data.train_path: the openrlhf backend needs a prompt dataset (JSONL from data_prep or a dataset name); pass --data.train_path PATH"
        )
    if cfg.train.loss_agg not in LOSS_AGG_MODES:
        raise ConfigError(
            f"train.loss_agg: {cfg.train.loss_agg!r} has no OpenRLHF 0.11 equivalent; choose one of {sorted(LOSS_AGG_MODES)}"
        )
    if cfg.model.dtype not in PARAM_DTYPES:
        raise ConfigError(
            f"model.dtype: not supported by the openrlhf backend (got {cfg.model.dtype!r}); set one of {sorted(PARAM_DTYPES)}"
        )
    return {
        "data.input_key": "prompt",
        "data.label_key": REWARD_LABEL_KEY,
        "data.apply_chat_template": True,  # data.prompt_template auto or chat (support.py refuses compact)
        "reward.remote_url": reward_file_path(),
        "ckpt.load_enable": resume,
        **table_flags(cfg),  # every field OpenRLHF has a flag for (field_flags.FIELD_FLAGS)
    }


def recipe_flags(cfg: RunConfig) -> dict[str, Any]:
    """The recipe's OpenRLHF flags, ``cfg.extra["openrlhf"]``, checked to be a mapping of dotted names."""
    extra = cfg.extra.get(EXTRA_KEY, {})
    if not isinstance(extra, Mapping):
        raise ConfigError(
            f"extra.{EXTRA_KEY}: must be a mapping of OpenRLHF flag names to values, got {type(extra).__name__}"
        )
    for name in extra:
        if not isinstance(name, str) or name.startswith("-") or not name:
            raise ConfigError(
                f"extra.{EXTRA_KEY}: flag names are dotted OpenRLHF names without '--' (e.g. 'vllm.num_engines'), got {name!r}"
            )
    return dict(extra)


def build_argv(
    cfg: RunConfig, passthrough: Sequence[str] = (), resume: bool = False, base_flags: Mapping[str, Any] | None = None
) -> list[str]:
    """The OpenRLHF command line: ``base_flags`` (defaults of the machine), derived flags, the recipe's flags, then
    ``passthrough`` (last wins)."""
    flags = dict(base_flags or {})
    flags.update(derived_flags(cfg, resume))
    flags.update(recipe_flags(cfg))
    passthrough = switch_values(flags, list(passthrough))
    argv: list[str] = []
    for name, value in flags.items():
        argv.extend(flag_tokens(name, value))
    return argv + passthrough


def switch_values(flags: dict[str, Any], passthrough: list[str]) -> list[str]:
    """``--name false`` / ``--name true`` on the command line for an OpenRLHF switch that ``flags`` sets (a recipe's
    ``train.colocate_all``, a machine default's ``vllm.enforce_eager``) turns it off or on in ``flags``; argparse
    itself can only turn a switch on. The rest of ``passthrough`` is returned unchanged."""
    switches = {f"--{name}": name for name, value in flags.items() if isinstance(value, bool)}
    rest: list[str] = []
    i = 0
    while i < len(passthrough):
        token, value = passthrough[i], passthrough[i + 1] if i + 1 < len(passthrough) else None
        if token in switches and value is not None and value.lower() in ("true", "false"):
            flags[switches[token]] = value.lower() == "true"
            i += 2
            continue
        rest.append(token)
        i += 1
    return rest


def check_step_fills_a_batch(args: SimpleNamespace) -> None:
    """A step's responses (rollout.batch_size x n_samples_per_prompt) must fill at least one training batch: with
    fewer, OpenRLHF's actor makes no optimiser step at all (its gradient norm stays 0), as when an 8-GPU recipe's
    ``train.batch_size`` is kept while its prompts per step are scaled down."""
    responses = args.rollout.batch_size * args.rollout.n_samples_per_prompt
    if responses < args.train.batch_size:
        raise ConfigError(
            f"train.batch_size: {args.train.batch_size} is more than a step's {responses} responses (rollout.batch_size "
            f"{args.rollout.batch_size} x n_samples_per_prompt {args.rollout.n_samples_per_prompt}), so no optimiser "
            f"step would run; set --train.batch_size {responses} (or a divisor of it)"
        )


def check_critic_ranks(args: SimpleNamespace) -> None:
    """OpenRLHF's critic (``--algo.advantage.estimator gae``) trains on ``critic.num_nodes x critic.num_gpus_per_node``
    ranks (OpenRLHF's default: 8 per node, whatever the policy's), each taking ``train.micro_batch_size`` samples
    per micro-step: a step's ``train.batch_size`` must fill them, or DeepSpeed stops the critic with "Gradient
    accumulation steps: 0"."""
    if not args.critic.model_name_or_path:
        return
    ranks = args.critic.num_nodes * args.critic.num_gpus_per_node
    if args.train.batch_size < ranks * args.train.micro_batch_size:
        raise ConfigError(
            f"critic.num_gpus_per_node: OpenRLHF's critic runs on {ranks} ranks (critic.num_nodes {args.critic.num_nodes} "
            f"x critic.num_gpus_per_node {args.critic.num_gpus_per_node}), more than a step's train.batch_size "
            f"({args.train.batch_size}) fills with train.micro_batch_size {args.train.micro_batch_size} each; set "
            f"--critic.num_gpus_per_node (the policy has {args.actor.num_nodes * args.actor.num_gpus_per_node})"
        )


def check_allocation_batches(cfg: RunConfig, args: SimpleNamespace) -> None:
    """A rollout allocator's step must fill whole training batches (``AllocationConfig.responses_per_step``: the
    knapsack's budget, rollout.batch_size x n_samples_per_prompt otherwise); OpenRLHF's actors take train.batch_size
    samples per optimiser step. The generator takes one allocation per step, so a separate vLLM batch size is
    refused."""
    responses = cfg.allocation.responses_per_step(args.rollout.batch_size, args.rollout.n_samples_per_prompt)
    if responses % args.train.batch_size:
        raise ConfigError(
            f"allocation.budget: {cfg.allocation.method} allocates {responses} responses per step, not a multiple of "
            f"train.batch_size ({args.train.batch_size}); choose --allocation.budget or --train.batch_size so that it is"
        )
    if (
        cfg.sampling.enabled
        and cfg.allocation.method == "knapsack"
        and cfg.allocation.max_responses > cfg.sampling.response_budget
    ):
        raise ConfigError(
            f"allocation.max_responses: {cfg.allocation.max_responses} is more than the sampler keeps per prompt "
            f"(its budget, {cfg.sampling.response_budget} responses); a group would come back smaller than allocated "
            f"and the step short of whole training batches; set --allocation.max_responses {cfg.sampling.response_budget}"
        )
    generate_batch = getattr(args.rollout, "vllm_generate_batch_size", None)
    if generate_batch not in (None, args.rollout.batch_size):
        raise ConfigError(
            f"rollout.vllm_generate_batch_size: with a rollout allocator each step is one allocation of "
            f"rollout.batch_size ({args.rollout.batch_size}) prompts; drop --rollout.vllm_generate_batch_size"
        )


def reconcile(cfg: RunConfig, args: SimpleNamespace) -> RunConfig:
    """The launcher's RunConfig, built once: ``cfg``'s values with the shared fields taken from OpenRLHF's final
    namespace and the local paths resolved (both by the read-backs of ``field_flags.FIELD_FLAGS``), as one dict;
    unsupported combinations raise."""
    from adora_openrlhf.algorithms.advantages import ADVANTAGE_ESTIMATORS
    from adora_openrlhf.algorithms.token_advantages import TOKEN_ESTIMATORS
    from adora_openrlhf.backends.support import check_openrlhf_flags

    check_openrlhf_flags(args)  # OpenRLHF's own flags that meet our classes (async, off-policy corrections)
    if args.train.async_enable and args.algo.advantage.is_correction_level == "off":
        logging.getLogger(__name__).warning(
            "train.async_enable: batches one policy version old are trained on as if on-policy; add "
            "--algo.advantage.is_correction_level token (uncorrected and corrected asynchronous runs: "
            "docs/results.md#the-cluster-testbed)"
        )
    estimator = args.algo.advantage.estimator
    ours = estimator in ADVANTAGE_ESTIMATORS or estimator in TOKEN_ESTIMATORS
    if not ours and (cfg.adora.enabled or cfg.sampling.enabled):
        names = sorted([*ADVANTAGE_ESTIMATORS.names(), *TOKEN_ESTIMATORS.names()])
        raise ConfigError(
            f"algo.advantage.estimator: {estimator!r} is not an estimator of this package; ADORA and adaptive "
            f"sampling need one of {names} (or turn --adora.enabled/--sampling.enabled off)"
        )
    generator_features = (
        (cfg.sampling.enabled, "sampling.enabled", "adaptive multi-round sampling", "the sampler"),
        (cfg.allocation.enabled, "allocation.method", "rollout allocation", "the allocator"),
    )
    for active, name, feature, actor in generator_features:
        if not active:
            continue
        if args.algo.dynamic_filtering_enable:
            raise ConfigError(
                f"{name}: {feature} and --algo.dynamic_filtering_enable are alternatives on this backend; use one of them"
            )
        if not args.reward.remote_url:
            raise ConfigError(
                f"{name}: {actor} needs rewards at rollout time; set --reward.remote_url (the reward file)"
            )
        if not args.vllm.num_engines:
            raise ConfigError(f"{name}: {actor} generates with vLLM; set --vllm.num_engines >= 1")
    if cfg.sampling.enabled and cfg.sampling.drop_unfinished:
        raise ConfigError(
            "sampling.drop_unfinished: the openrlhf backend needs rollout.batch_size groups per step (OpenRLHF "
            "splits them evenly across ranks); keep unfinished prompts (--sampling.drop_unfinished false) or use "
            "--algo.dynamic_filtering_enable without the sampler"
        )
    check_step_fills_a_batch(args)
    check_critic_ranks(args)
    if cfg.allocation.enabled:
        check_allocation_batches(cfg, args)
    buffer, max_new = args.reward.overlong_buffer_len, args.rollout.max_new_tokens or args.data.max_len
    if buffer is not None and buffer > max_new:
        raise ConfigError(
            f"reward.overlong_buffer_len: {buffer:g} is longer than the response limit ({max_new} tokens); lower it or raise --rollout.max_new_tokens"
        )
    values = apply_overrides(cfg.to_dict(), read_back(args, cfg))  # the shared fields (field_flags.FIELD_FLAGS)
    return RunConfig.from_dict(values)


def generate_kwargs_for(cfg: RunConfig, generate_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """OpenRLHF's rollout ``generate_kwargs`` (temperature, top_p, max_new_tokens ... from its flags) plus the
    shared sampling field it has no flag for but sends to vLLM when present: ``top_k`` (``rollout.top_k``)."""
    return {**generate_kwargs, "top_k": cfg.rollout.top_k}


def signal_description(cfg: RunConfig) -> list[str]:
    """One line per consumer of the correctness signal: what it reads and its threshold."""
    lines = [
        f"ADORA correct: raw reward (reward source 'rewards', before length penalties) > adora.correct_threshold={cfg.adora.correct_threshold}"
        + ("" if cfg.adora.enabled else " (ADORA off: classes are logged only)")
    ]
    if cfg.sampling.enabled:
        lines.append(
            f"sampler positive: raw reward (reward source 'rewards', before length penalties) > sampling.positive_threshold={cfg.positive_threshold}"
            + (" (unset: adora.correct_threshold)" if cfg.sampling.positive_threshold is None else "")
        )
    return lines


def attach_run_config(args: SimpleNamespace, cfg: RunConfig) -> None:
    """Store the RunConfig on OpenRLHF's namespace so that it reaches the Ray trainer actor with it."""
    setattr(args, ARGS_ATTR, json.dumps(cfg.to_dict()))


def run_config_from_args(args: SimpleNamespace) -> RunConfig:
    """The RunConfig carried by OpenRLHF's namespace (inside the Ray actor)."""
    text = getattr(args, ARGS_ATTR, None)
    if not text:
        raise ConfigError(
            f"args.{ARGS_ATTR}: OpenRLHF's namespace carries no adora_openrlhf config; launch with `python -m adora_openrlhf.train --backend openrlhf ...`"
        )
    return RunConfig.from_dict(json.loads(text))


def namespace_to_dict(args: Any) -> Any:
    """Nested plain dict of OpenRLHF's (hierarchical) namespace, for printing."""
    if isinstance(args, SimpleNamespace):
        return {key: namespace_to_dict(value) for key, value in vars(args).items()}
    if dataclasses.is_dataclass(args) and not isinstance(args, type):
        return dataclasses.asdict(args)
    if isinstance(args, tuple):
        return list(args)
    return args
