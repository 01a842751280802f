"""RunConfig -> OpenRLHF 0.11 command-line flags, the checks between the two, and the config carried to Ray.

The OpenRLHF command line of a run is built in three layers, later ones winning (argparse keeps the last
value of a repeated option):

1. flags derived from the :class:`RunConfig` (:func:`derived_flags`): model (dtype, LoRA), data keys, group size,
   sampling defaults, estimator, optimiser, KL, checkpoints, evaluation samples, DAPO dynamic filtering, and the reward file of
   :mod:`adora_openrlhf.rewards`; fields this backend cannot honour are refused (``backends/support.py``);
2. the recipe's cluster flags, ``RunConfig.extra["openrlhf"]`` (a mapping ``{"actor.num_gpus_per_node": 8,
   "train.colocate_all": True, ...}``: dotted OpenRLHF names without the leading ``--``);
3. the OpenRLHF flags typed on our command line (everything our parser does not know is passed through).

After OpenRLHF's parser has validated the result, :func:`reconcile` copies the fields both sides share
(group size, estimator, rollout temperature/top_p/max_new_tokens, dtype, LoRA, evaluation samples, dynamic filtering) from the
final namespace back into the
RunConfig, so an OpenRLHF flag given explicitly is what both OpenRLHF and our classes use, and rejects
combinations our classes do not support. :func:`attach_run_config` stores the RunConfig as JSON on the
namespace (``args.adora_run_config``); the namespace travels inside OpenRLHF's strategy object to the Ray
trainer actor, where :func:`run_config_from_args` rebuilds it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from adora_openrlhf.config import ConfigError, RunConfig
from adora_openrlhf.rewards.openrlhf_reward import REWARD_LABEL_KEY  # the column data_prep writes (source, label, meta)

EXTRA_KEY = "openrlhf"  # RunConfig.extra[EXTRA_KEY]: recipe-level OpenRLHF flags {"group.name": value}
ARGS_ATTR = "adora_run_config"  # attribute of OpenRLHF's args namespace holding our RunConfig as JSON
FINAL_MODEL_DIR = "final_model"  # output_dir/final_model: OpenRLHF's --ckpt.output_dir (the model saved at the end)
CHECKPOINT_CONFIG = "adora_run_config.json"  # the RunConfig, saved by the trainer in each DeepSpeed checkpoint folder
MARKER_FILE = "adora_trainer.json"  # output_dir/MARKER_FILE: written by our trainer actor, checked by the launcher
LAUNCH_ID_ATTR = "adora_launch_id"  # attribute of OpenRLHF's args namespace: the launch's id, echoed in the marker

# our PolicyLossConfig.loss_agg -> OpenRLHF --actor.loss_agg_mode
LOSS_AGG_MODES = {"token_mean": "token-mean", "seq_mean_token_mean": "seq-mean-token-mean"}
# our ModelConfig.dtype -> OpenRLHF --ds.param_dtype (fp32: this package's addition, see precision.py)
PARAM_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


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
    if not cfg.model.path:
        raise ConfigError("model.path: the openrlhf backend needs a Hugging Face model (name or directory); pass --model PATH")
    if not cfg.data.train_path:
        raise ConfigError("data.train_path: the openrlhf backend needs a prompt dataset (JSONL from data_prep or a dataset name); pass --data.train_path PATH")
    if cfg.train.loss_agg not in LOSS_AGG_MODES:
        raise ConfigError(f"train.loss_agg: {cfg.train.loss_agg!r} has no OpenRLHF 0.11 equivalent; choose one of {sorted(LOSS_AGG_MODES)}")
    if cfg.model.dtype not in PARAM_DTYPES:
        raise ConfigError(f"model.dtype: not supported by the openrlhf backend (got {cfg.model.dtype!r}); set one of {sorted(PARAM_DTYPES)}")
    if cfg.report_to != ["tensorboard"]:
        raise ConfigError(
            "report_to: the openrlhf backend logs through OpenRLHF's own options "
            "(--logger.tensorboard_dir DIR, --logger.wandb.key KEY); leave report_to at its default"
        )
    out_dir = Path(cfg.output_dir)
    flags: dict[str, Any] = {
        "actor.model_name_or_path": cfg.model.path,
        "data.prompt_dataset": cfg.data.train_path,
        "data.input_key": "prompt",
        "data.label_key": REWARD_LABEL_KEY,
        "data.apply_chat_template": True,
        "data.max_samples": cfg.steps * cfg.prompts_per_step,  # one episode of `steps` rollout batches
        "data.max_len": cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens,
        "reward.remote_url": reward_file_path(),
        "rollout.batch_size": cfg.prompts_per_step,
        "rollout.n_samples_per_prompt": cfg.sampling.n_keep,
        "rollout.temperature": cfg.rollout.temperature,
        "rollout.top_p": cfg.rollout.top_p,
        "rollout.max_new_tokens": cfg.rollout.max_new_tokens,
        "rollout.micro_batch_size": cfg.train.micro_batch_size,
        "train.batch_size": cfg.prompts_per_step * cfg.sampling.n_keep,  # one optimiser step per rollout batch
        "train.micro_batch_size": cfg.train.micro_batch_size,
        "train.max_epochs": cfg.train.ppo_epochs,
        "train.seed": cfg.seed,
        "algo.advantage.estimator": cfg.advantage.estimator,
        "actor.adam.lr": cfg.train.lr,
        "actor.lr_scheduler": cfg.train.lr_scheduler,
        "actor.lr_warmup_ratio": cfg.train.lr_warmup_ratio,
        "actor.min_lr_ratio": cfg.train.min_lr_ratio,
        "actor.adam.weight_decay": cfg.train.weight_decay,
        "actor.eps_clip_low_high": (cfg.train.clip_eps_low, cfg.train.clip_eps_high),
        "actor.max_norm": cfg.train.max_grad_norm,
        "actor.loss_agg_mode": LOSS_AGG_MODES[cfg.train.loss_agg],
        "algo.kl.init_coef": cfg.train.kl_coef,
        "ckpt.output_dir": str(out_dir / FINAL_MODEL_DIR),
        "ckpt.path": str(out_dir / "checkpoints"),
        "ckpt.save_steps": cfg.save_every if cfg.save_every > 0 else -1,
        "ckpt.load_enable": resume,
        "logger.tensorboard_dir": str(out_dir / "tensorboard"),
        "ds.param_dtype": PARAM_DTYPES[cfg.model.dtype],
        "ds.lora.rank": cfg.model.lora_rank,
        "ds.lora.alpha": cfg.model.lora_alpha,
        # ["all-linear"]: OpenRLHF's default, the string peft expands (a one-element list would name a module)
        "ds.lora.target_modules": None if cfg.model.lora_target_modules == ["all-linear"] else list(cfg.model.lora_target_modules),
        "eval.n_samples_per_prompt": max(cfg.eval_samples, 1),
    }
    if cfg.eval_samples == 0:  # greedy only, as the local backend's evaluation with eval_samples 0
        flags["eval.temperature"] = 0.0
    if "attn_implementation" in cfg.model.init_kwargs:
        flags["ds.attn_implementation"] = cfg.model.init_kwargs["attn_implementation"]
    if cfg.train.kl_coef > 0:  # GRPO-style KL loss against the reference (k3 estimator)
        flags.update({"algo.kl.use_loss": True, "algo.kl.estimator": "k3"})
    if cfg.data.eval_path:
        flags.update({"eval.dataset": cfg.data.eval_path, "eval.steps": cfg.eval_every if cfg.eval_every > 0 else -1})
    if cfg.dynamic_filtering.enabled:  # DAPO dynamic filtering: OpenRLHF's own (our samples generator passes it through)
        flags.update({"algo.dynamic_filtering_enable": True, "algo.dynamic_filtering_range": tuple(cfg.dynamic_filtering.score_range)})
    if cfg.data.task == "geometry":  # Qwen2.5-VL: one diagram per prompt
        flags.update({"data.image_key": "images", "data.max_images_per_prompt": 1})
    if cfg.model.freeze_visual_encoder:
        flags["actor.freeze_visual_encoder"] = True
    return flags


def recipe_flags(cfg: RunConfig) -> dict[str, Any]:
    """The recipe's OpenRLHF flags, ``cfg.extra["openrlhf"]``, checked to be a mapping of dotted names."""
    extra = cfg.extra.get(EXTRA_KEY, {})
    if not isinstance(extra, Mapping):
        raise ConfigError(f"extra.{EXTRA_KEY}: must be a mapping of OpenRLHF flag names to values, got {type(extra).__name__}")
    for name in extra:
        if not isinstance(name, str) or name.startswith("-") or not name:
            raise ConfigError(f"extra.{EXTRA_KEY}: flag names are dotted OpenRLHF names without '--' (e.g. 'vllm.num_engines'), got {name!r}")
    return dict(extra)


def build_argv(cfg: RunConfig, passthrough: Sequence[str] = (), resume: bool = False, base_flags: Mapping[str, Any] | None = None) -> list[str]:
    """The OpenRLHF command line: ``base_flags`` (defaults of the machine), derived flags, the recipe's flags, then
    ``passthrough`` (last wins)."""
    flags = dict(base_flags or {})
    flags.update(derived_flags(cfg, resume))
    flags.update(recipe_flags(cfg))
    argv: list[str] = []
    for name, value in flags.items():
        argv.extend(flag_tokens(name, value))
    return argv + list(passthrough)


def reconcile(cfg: RunConfig, args: SimpleNamespace) -> RunConfig:
    """RunConfig with the shared fields taken from OpenRLHF's final namespace; unsupported combinations raise."""
    from adora_openrlhf.algorithms.advantages import ADVANTAGE_ESTIMATORS

    if args.train.async_enable:
        raise ConfigError(
            "train.async_enable: the adora_openrlhf trainer runs OpenRLHF's synchronous PPOTrainer; drop "
            "--train.async_enable (or run OpenRLHF's own entry for asynchronous training without our classes)"
        )
    estimator = args.algo.advantage.estimator
    ours = estimator in ADVANTAGE_ESTIMATORS
    if not ours and (cfg.adora.enabled or cfg.sampling.enabled):
        raise ConfigError(
            f"algo.advantage.estimator: {estimator!r} is not a group estimator of this package; ADORA and adaptive "
            f"sampling need one of {sorted(ADVANTAGE_ESTIMATORS)} (or turn --adora.enabled/--sampling.enabled off)"
        )
    if cfg.sampling.enabled:
        if args.algo.dynamic_filtering_enable:
            raise ConfigError("sampling.enabled: adaptive multi-round sampling and --algo.dynamic_filtering_enable are alternatives; use one of them")
        if not args.reward.remote_url:
            raise ConfigError("sampling.enabled: the sampler needs rewards at rollout time; set --reward.remote_url (the reward file)")
        if not args.vllm.num_engines:
            raise ConfigError("sampling.enabled: the sampler generates with vLLM; set --vllm.num_engines >= 1")
        if cfg.sampling.drop_unfinished:
            raise ConfigError(
                "sampling.drop_unfinished: the openrlhf backend needs rollout.batch_size groups per step (OpenRLHF "
                "splits them evenly across ranks); keep unfinished prompts (--sampling.drop_unfinished false) or use "
                "--algo.dynamic_filtering_enable without the sampler"
            )
    buffer, max_new = args.reward.overlong_buffer_len, args.rollout.max_new_tokens or args.data.max_len
    if buffer is not None and buffer > max_new:
        raise ConfigError(
            f"reward.overlong_buffer_len: {buffer:g} is longer than the response limit ({max_new} tokens); lower it or raise --rollout.max_new_tokens"
        )
    values = cfg.to_dict()
    values["sampling"]["n_keep"] = int(args.rollout.n_samples_per_prompt)
    if ours:
        values["advantage"]["estimator"] = estimator
    values["model"]["dtype"] = {v: k for k, v in PARAM_DTYPES.items()}[args.ds.param_dtype]
    values["model"]["lora_rank"] = int(args.ds.lora.rank)
    values["model"]["lora_alpha"] = int(args.ds.lora.alpha)
    targets = args.ds.lora.target_modules
    values["model"]["lora_target_modules"] = ["all-linear"] if targets in ("all-linear", ["all-linear"]) else list(targets)
    values["eval_samples"] = 0 if args.eval.temperature == 0 else int(args.eval.n_samples_per_prompt)  # 0: greedy only
    values["model"]["freeze_visual_encoder"] = bool(getattr(args.actor, "freeze_visual_encoder", False))
    values["dynamic_filtering"]["enabled"] = bool(args.algo.dynamic_filtering_enable)
    values["dynamic_filtering"]["score_range"] = [float(v) for v in args.algo.dynamic_filtering_range]
    values["train"]["lr_scheduler"] = str(args.actor.lr_scheduler)  # a name without a local counterpart fails here, naming the choices
    values["train"]["lr_warmup_ratio"] = float(args.actor.lr_warmup_ratio)
    values["train"]["min_lr_ratio"] = float(args.actor.min_lr_ratio)
    values["rollout"]["temperature"] = float(args.rollout.temperature)
    values["rollout"]["top_p"] = float(args.rollout.top_p)
    if args.rollout.max_new_tokens is not None:
        values["rollout"]["max_new_tokens"] = int(args.rollout.max_new_tokens)
    return RunConfig.from_dict(values)


def generate_kwargs_for(cfg: RunConfig, generate_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """OpenRLHF's rollout ``generate_kwargs`` (temperature, top_p, max_new_tokens ... from its flags) plus the
    shared sampling field it has no flag for but sends to vLLM when present: ``top_k`` (``rollout.top_k``)."""
    return {**generate_kwargs, "top_k": cfg.rollout.top_k}


def signal_description(cfg: RunConfig) -> list[str]:
    """One line per consumer of the correctness signal: what it reads and its threshold."""
    lines = [
        f"ADORA correct: raw reward (reward source 'rewards', before length penalties) > adora.correct_threshold={cfg.adora.correct_threshold}"
        + ("" if cfg.adora.enabled else " (ADORA off: classes are logged only)"),
    ]
    if cfg.sampling.enabled:
        lines.append(
            f"sampler positive: raw reward (reward source 'rewards', before length penalties) > sampling.positive_threshold={cfg.sampling.positive_threshold}"
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
