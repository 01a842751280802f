"""The OpenRLHF mapping, written once: which of our fields becomes which OpenRLHF 0.11 flag, and which flag is read back.

:data:`FIELD_FLAGS` is one table. Each :class:`FieldFlags` entry names our dotted fields, the OpenRLHF flags it
emits (``to_flags(cfg)``: dotted names without ``--``, values as for ``flags.flag_tokens``), and, for the fields
both sides share, how the value in OpenRLHF's final namespace is read back (``read_back(args)``: ``{our field:
value}``), so that an OpenRLHF flag typed on the command line is what our classes use too. The table drives:

- the command line: ``flags.derived_flags`` emits every entry's flags;
- the read-back: ``flags.reconcile`` applies every entry's ``read_back``;
- the per-backend support table: ``backends/support.py`` marks every field named here as mapped on the openrlhf
  backend (unless it lists the field as used or refused, e.g. ``data.task``, which also picks the reward);
- the docs: :func:`markdown_table` is the table in docs/openrlhf_backend.md (a test keeps them equal).

Paths are resolved here, once: a local model, dataset or output folder becomes an absolute path in its flag
(:func:`local_path`; Ray's actors do not run in the driver's working directory; hub names stay as they are), and the
read-back carries the resolved value into the run's config, so that ``flags.reconcile`` builds the launcher's
RunConfig once, from one dict.

An advantage estimator registered in this package but unknown to OpenRLHF's ``--algo.advantage.estimator``
(whose choices are :data:`OPENRLHF_ESTIMATORS`) is passed as :data:`STAND_IN_ESTIMATOR`, a group estimator
without a critic; ``AdoraExperienceMaker`` then computes the registered one (the run config keeps its name).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adora_openrlhf.config import RunConfig
from adora_openrlhf.dotted import value_at
from adora_openrlhf.tasks.registry import is_vision_task

FINAL_MODEL_DIR = "final_model"  # output_dir/final_model: OpenRLHF's --ckpt.output_dir (the model saved at the end)

# our PolicyLossConfig.loss_agg -> OpenRLHF --actor.loss_agg_mode
LOSS_AGG_MODES = {"token_mean": "token-mean", "seq_mean_token_mean": "seq-mean-token-mean"}
# our ModelConfig.dtype -> OpenRLHF --ds.param_dtype (fp32: this package's addition, see precision.py)
PARAM_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
# the choices of OpenRLHF 0.11.2's --algo.advantage.estimator (cli/train_ppo_ray.py)
OPENRLHF_ESTIMATORS = ("gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo", "flash_reinforce")
STAND_IN_ESTIMATOR = "group_norm"  # OpenRLHF's flag value for an estimator of ours it does not know


@dataclass(frozen=True)
class FieldFlags:
    """Our ``fields`` -> OpenRLHF flags (``to_flags``), and the shared values read back from OpenRLHF's namespace."""

    fields: tuple[str, ...]
    flags: str  # the OpenRLHF flags, as the docs table shows them
    to_flags: Callable[[RunConfig], dict[str, Any]]
    read_back: Callable[[Any, RunConfig], dict[str, Any]] | None = (
        None  # (OpenRLHF's final namespace, our config) -> {our dotted field: value}
    )
    note: str = field(default="")


def local_path(value: str | None) -> str | None:
    """``value`` as an absolute path when it names a local file or folder; a hub name (or None) as it is."""
    return str(Path(value).resolve()) if value and Path(value).exists() else value


def one(
    ours: str,
    flag: str,
    convert: Callable[[Any], Any] = lambda v: v,
    back: Callable[[Any], Any] | None = None,
    note: str = "",
) -> FieldFlags:
    """A field that is one flag: ``--flag convert(value)``; with ``back``, the flag's final value is read back as ``back(value)``."""
    read_back = None if back is None else (lambda args, cfg: {ours: back(value_at(args, flag))})
    return FieldFlags((ours,), f"--{flag}", lambda cfg: {flag: convert(value_at(cfg, ours))}, read_back, note)


def _estimator_flag(name: str) -> str:
    return name if name in OPENRLHF_ESTIMATORS else STAND_IN_ESTIMATOR


def _estimator_back(args: Any, cfg: RunConfig) -> dict[str, Any]:
    """OpenRLHF's estimator when it is one of ours, group or token (a passed-through flag wins), except the stand-in of
    an estimator OpenRLHF does not know, which keeps our name; nothing for one of OpenRLHF's own (``flash_reinforce``)."""
    from adora_openrlhf.algorithms.advantages import ADVANTAGE_ESTIMATORS
    from adora_openrlhf.algorithms.token_advantages import TOKEN_ESTIMATORS

    name = args.algo.advantage.estimator
    if name == STAND_IN_ESTIMATOR and cfg.advantage.estimator not in OPENRLHF_ESTIMATORS:
        return {}
    return {"advantage.estimator": name} if name in ADVANTAGE_ESTIMATORS or name in TOKEN_ESTIMATORS else {}


def _token_flags(cfg: RunConfig) -> dict[str, Any]:
    if not cfg.advantage.token_level:  # group estimators: OpenRLHF's gamma 1, lambd 1
        return {}
    flags = {"algo.advantage.gamma": cfg.advantage.gamma}
    if cfg.advantage.estimator == "gae":
        flags["algo.advantage.lambd"] = cfg.advantage.lambd
    return flags


def _token_back(args: Any, cfg: RunConfig) -> dict[str, Any]:
    name = args.algo.advantage.estimator
    if name not in ("gae", "reinforce"):
        return {}
    values = {"advantage.gamma": float(args.algo.advantage.gamma)}
    if name == "gae":
        values["advantage.lambd"] = float(args.algo.advantage.lambd)
    return values


# our CriticConfig field -> OpenRLHF's flag of its critic (created for --algo.advantage.estimator gae)
CRITIC_FLAGS = {
    "critic.lr": "critic.adam.lr",
    "critic.weight_decay": "critic.adam.weight_decay",
    "critic.max_grad_norm": "critic.max_norm",
    "critic.value_clip": "critic.value_clip",
}


def _critic_flags(cfg: RunConfig) -> dict[str, Any]:
    if cfg.advantage.estimator != "gae":
        return {}
    # a constant critic.lr, as the local backend's critic (OpenRLHF's default schedule warms up from lr 0)
    return {**{flag: value_at(cfg, ours) for ours, flag in CRITIC_FLAGS.items()}, "critic.lr_scheduler": "constant"}


def _critic_back(args: Any, cfg: RunConfig) -> dict[str, Any]:
    if args.algo.advantage.estimator != "gae":
        return {}
    return {ours: float(value_at(args, flag)) for ours, flag in CRITIC_FLAGS.items()}


def _eval_flags(cfg: RunConfig) -> dict[str, Any]:
    flags: dict[str, Any] = {"eval.n_samples_per_prompt": max(cfg.eval_samples, 1)}
    if cfg.eval_samples == 0:  # greedy only, as the local backend's evaluation with eval_samples 0
        flags["eval.temperature"] = 0.0
    return flags


def _eval_dataset_flags(cfg: RunConfig) -> dict[str, Any]:
    if not cfg.data.eval_path:
        return {}
    return {"eval.dataset": local_path(cfg.data.eval_path), "eval.steps": cfg.eval_every if cfg.eval_every > 0 else -1}


def _output_flags(cfg: RunConfig) -> dict[str, Any]:
    out = Path(cfg.output_dir).resolve()
    return {
        "ckpt.output_dir": str(out / FINAL_MODEL_DIR),
        "ckpt.path": str(out / "checkpoints"),
        "logger.tensorboard_dir": str(out / "tensorboard"),
    }


def _kl_flags(cfg: RunConfig) -> dict[str, Any]:
    flags: dict[str, Any] = {"algo.kl.init_coef": cfg.train.kl_coef}
    if cfg.train.kl_coef > 0:  # GRPO-style KL loss against the reference (k3 estimator)
        flags.update({"algo.kl.use_loss": True, "algo.kl.estimator": "k3"})
    return flags


def _filtering_flags(cfg: RunConfig) -> dict[str, Any]:
    if not cfg.dynamic_filtering.enabled:  # OpenRLHF's own filtering (our samples generator passes it through)
        return {}
    return {
        "algo.dynamic_filtering_enable": True,
        "algo.dynamic_filtering_range": tuple(cfg.dynamic_filtering.score_range),
    }


def _lora_targets(modules: list[str]) -> list[str] | None:
    # ["all-linear"]: OpenRLHF's default, the string peft expands (a one-element list would name a module)
    return None if modules == ["all-linear"] else list(modules)


FIELD_FLAGS: tuple[FieldFlags, ...] = (
    one("model.path", "actor.model_name_or_path", local_path, back=str, note="a local folder: its absolute path"),
    one("data.train_path", "data.prompt_dataset", local_path, back=str, note="a local file: its absolute path"),
    FieldFlags(
        ("steps", "prompts_per_step", "allocation.method", "allocation.candidates"),
        "--data.max_samples",
        lambda cfg: {"data.max_samples": cfg.steps * cfg.allocation.candidate_count(cfg.prompts_per_step)},
        note="steps x prompts_per_step (x allocation.candidates with an allocator, which draws that many candidates per "
        "step): one episode of `steps` rollout batches (add --train.num_episodes for more passes)",
    ),
    FieldFlags(
        ("data.max_prompt_tokens", "rollout.max_new_tokens"),
        "--data.max_len",
        lambda cfg: {"data.max_len": cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens},
        note="max_prompt_tokens + max_new_tokens",
    ),
    one("prompts_per_step", "rollout.batch_size"),
    one("sampling.n_keep", "rollout.n_samples_per_prompt", back=int),
    one("rollout.temperature", "rollout.temperature", back=float),
    one("rollout.top_p", "rollout.top_p", back=float),
    FieldFlags(
        ("rollout.max_new_tokens",),
        "--rollout.max_new_tokens",
        lambda cfg: {"rollout.max_new_tokens": cfg.rollout.max_new_tokens},
        lambda args, cfg: (
            {} if args.rollout.max_new_tokens is None else {"rollout.max_new_tokens": int(args.rollout.max_new_tokens)}
        ),
    ),
    FieldFlags(
        ("train.micro_batch_size",),
        "--rollout.micro_batch_size, --train.micro_batch_size",
        lambda cfg: {
            "rollout.micro_batch_size": cfg.train.micro_batch_size,
            "train.micro_batch_size": cfg.train.micro_batch_size,
        },
    ),
    FieldFlags(
        ("prompts_per_step", "sampling.n_keep", "allocation.method", "allocation.budget", "allocation.min_responses"),
        "--train.batch_size",
        lambda cfg: {"train.batch_size": cfg.allocation.responses_per_step(cfg.prompts_per_step, cfg.sampling.n_keep)},
        note="prompts_per_step x n_keep (the knapsack's budget of responses with `allocation.method knapsack`): one "
        "optimiser step per rollout batch",
    ),
    one("train.ppo_epochs", "train.max_epochs"),
    one("seed", "train.seed"),
    FieldFlags(
        ("advantage.estimator",),
        "--algo.advantage.estimator",
        lambda cfg: {"algo.advantage.estimator": _estimator_flag(cfg.advantage.estimator)},
        _estimator_back,
        note=f"an estimator OpenRLHF does not know is passed as {STAND_IN_ESTIMATOR} and computed by our experience maker",
    ),
    FieldFlags(
        ("advantage.gamma", "advantage.lambd"),
        "--algo.advantage.gamma, --algo.advantage.lambd",
        _token_flags,
        _token_back,
        note="gae and reinforce only (lambd: gae)",
    ),
    FieldFlags(
        tuple(CRITIC_FLAGS),
        ", ".join(f"--{flag}" for flag in CRITIC_FLAGS.values()) + " (and --critic.lr_scheduler constant)",
        _critic_flags,
        _critic_back,
        note="gae only: OpenRLHF's critic at a constant learning rate, as the local backend's (value_clip None is refused)",
    ),
    one("train.lr", "actor.adam.lr"),
    one(
        "train.lr_scheduler",
        "actor.lr_scheduler",
        back=str,
        note="a name without a local counterpart is refused, naming the choices",
    ),
    one("train.lr_warmup_ratio", "actor.lr_warmup_ratio", back=float),
    one("train.min_lr_ratio", "actor.min_lr_ratio", back=float),
    one("train.weight_decay", "actor.adam.weight_decay"),
    FieldFlags(
        ("train.clip_eps_low", "train.clip_eps_high"),
        "--actor.eps_clip_low_high",
        lambda cfg: {"actor.eps_clip_low_high": (cfg.train.clip_eps_low, cfg.train.clip_eps_high)},
    ),
    one("train.max_grad_norm", "actor.max_norm"),
    one(
        "train.loss_agg",
        "actor.loss_agg_mode",
        LOSS_AGG_MODES.__getitem__,
        note="seq_mean_token_sum_norm has no OpenRLHF equivalent and is refused",
    ),
    FieldFlags(("train.kl_coef",), "--algo.kl.init_coef (> 0: --algo.kl.use_loss --algo.kl.estimator k3)", _kl_flags),
    FieldFlags(
        ("output_dir",),
        "--ckpt.output_dir, --ckpt.path, --logger.tensorboard_dir",
        _output_flags,
        lambda args, cfg: {"output_dir": str(Path(cfg.output_dir).resolve())},
        note="output_dir/final_model, output_dir/checkpoints, output_dir/tensorboard (output_dir made absolute)",
    ),
    one("save_every", "ckpt.save_steps", lambda every: every if every > 0 else -1),
    one(
        "model.dtype",
        "ds.param_dtype",
        PARAM_DTYPES.__getitem__,
        back={v: k for k, v in PARAM_DTYPES.items()}.__getitem__,
        note="bfloat16 -> bf16, float16 -> fp16, float32 -> fp32 (added to OpenRLHF's choices, precision.py)",
    ),
    one("model.lora_rank", "ds.lora.rank", back=int),
    one("model.lora_alpha", "ds.lora.alpha", back=int),
    one(
        "model.lora_target_modules",
        "ds.lora.target_modules",
        _lora_targets,
        back=lambda targets: ["all-linear"] if targets in ("all-linear", ["all-linear"]) else list(targets),
        note='["all-linear"] is OpenRLHF\'s default',
    ),
    FieldFlags(
        ("model.init_kwargs",),
        "--ds.attn_implementation",
        lambda cfg: (
            {"ds.attn_implementation": cfg.model.init_kwargs["attn_implementation"]}
            if "attn_implementation" in cfg.model.init_kwargs
            else {}
        ),
        note="only attn_implementation (and trust_remote_code: true, always on)",
    ),
    FieldFlags(
        ("model.freeze_visual_encoder",),
        "--actor.freeze_visual_encoder",
        lambda cfg: {"actor.freeze_visual_encoder": True} if cfg.model.freeze_visual_encoder else {},
        lambda args, cfg: {"model.freeze_visual_encoder": bool(value_at(args, "actor.freeze_visual_encoder"))},
        note="every parameter outside language_model.* and lm_head.*",
    ),
    FieldFlags(
        ("eval_samples",),
        "--eval.n_samples_per_prompt (0: --eval.temperature 0)",
        _eval_flags,
        lambda args, cfg: {"eval_samples": 0 if args.eval.temperature == 0 else int(args.eval.n_samples_per_prompt)},
        note="0: one greedy sample",
    ),
    FieldFlags(
        ("data.eval_path", "eval_every"),
        "--eval.dataset, --eval.steps",
        _eval_dataset_flags,
        lambda args, cfg: {"data.eval_path": args.eval.dataset} if args.eval.dataset else {},
        note="only with data.eval_path (a local file: its absolute path)",
    ),
    FieldFlags(
        ("dynamic_filtering.enabled", "dynamic_filtering.score_range"),
        "--algo.dynamic_filtering_enable, --algo.dynamic_filtering_range",
        _filtering_flags,
        lambda args, cfg: {
            "dynamic_filtering.enabled": bool(args.algo.dynamic_filtering_enable),
            "dynamic_filtering.score_range": [float(v) for v in args.algo.dynamic_filtering_range],
        },
        note="the range only with enabled",
    ),
    FieldFlags(
        ("data.task",),
        "--data.image_key, --data.max_images_per_prompt",
        lambda cfg: (
            {"data.image_key": "images", "data.max_images_per_prompt": 1} if is_vision_task(cfg.data.task) else {}
        ),
        note="a vision task (geometry): one image per prompt (the task also picks the reward)",
    ),
)


def mapped_fields() -> list[str]:
    """Every field some entry turns into OpenRLHF flags, in table order."""
    return list(dict.fromkeys(f for entry in FIELD_FLAGS for f in entry.fields))


def table_flags(cfg: RunConfig) -> dict[str, Any]:
    """Every entry's flags for ``cfg`` (the checks of ``flags.derived_flags`` come first)."""
    flags: dict[str, Any] = {}
    for entry in FIELD_FLAGS:
        flags.update(entry.to_flags(cfg))
    return flags


def read_back(args: Any, cfg: RunConfig) -> dict[str, Any]:
    """``{our dotted field: value}`` of every shared field, from OpenRLHF's final namespace (``cfg``: the config the
    command line was built from)."""
    values: dict[str, Any] = {}
    for entry in FIELD_FLAGS:
        if entry.read_back is not None:
            values.update(entry.read_back(args, cfg))
    return values


def markdown_table() -> str:
    """The mapping as the Markdown table of docs/openrlhf_backend.md."""
    rows = ["| our field(s) | OpenRLHF flag(s) | read back | note |", "|---|---|---|---|"]
    for entry in FIELD_FLAGS:
        ours = ", ".join(f"`{f}`" for f in entry.fields)
        flags = re.sub(r"(--[\w.]+)", r"`\1`", entry.flags)
        rows.append(f"| {ours} | {flags} | {'yes' if entry.read_back else ''} | {entry.note} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # the docs table: python -m adora_openrlhf.backends.openrlhf.field_flags
    print(markdown_table(), end="")
