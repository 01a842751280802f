"""The local RL loop, top to bottom: ``python -m adora_openrlhf.train --recipe kk-tiny`` ends up here.

Setup: rows (generated K&K puzzles, generated images for task ``geometry``, or JSONL files), tokenizer (trained
on the corpus for the tiny model, or the checkpoint's own; vision tasks add the processor, ``vlm.py``), policy
(tiny random-init Qwen2-style LM, tiny Qwen2.5-VL for vision tasks, or ``--model PATH|owner/name``, optional LoRA),
supervised warm-up, held-out evaluation at step 0, checkpoint ``step_000000``.

Each RL step (``rl_step.py``, :func:`rl_step`):

1. take the next ``prompts_per_step`` prompts of the seeded data order;
2. :class:`AdaptiveSampler` drives batched generation + reward scoring (one round of ``n_keep`` per prompt
   when adaptive sampling is off: plain GRPO), down-samples to ``n_keep`` and gives pool statistics; with
   ``dynamic_filtering.enabled`` (DAPO, ``rl_step.filtered_sample``) groups whose mean correctness is outside
   ``score_range`` are dropped and as many next prompts sampled in their place, at most ``max_refills`` times
   (the data position advances by every prompt consumed; a step that keeps no group makes no update);
3. :func:`compute_step_advantages`: group advantages (pool statistics when adaptive sampling is on), then
   ADORA weights;
4. :func:`policy_update`: token-level PPO-clip loss (+ k3 KL to the frozen step-0 policy when
   ``kl_coef > 0``), gradient clipping, AdamW; with ``advantage.estimator gae`` or ``reinforce`` the advantages
   are per token (``rl_step.token_update``) and ``gae`` trains a critic beside the policy (``critic.py``: built
   after the warm-up, saved in every checkpoint's ``critic/``, restored by ``--resume``);
5. metrics to JSONL/TensorBoard; held-out evaluation every ``eval_every`` steps; checkpoint every
   ``save_every`` steps (:func:`_train_in`, the loop).

At the end: reward-curve PNG, ``summary.json`` and the final model in ``final_model/``. The held-out rows and
the settings they are evaluated with are saved at the start (``heldout.jsonl``, ``heldout.json``: ``heldout.py``).
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from adora_openrlhf.algorithms.allocation import RolloutAllocator
from adora_openrlhf.algorithms.sampling import AdaptiveSampler
from adora_openrlhf.algorithms.token_advantages import CRITIC_ESTIMATORS
from adora_openrlhf.backends.local.critic import build_critic
from adora_openrlhf.backends.local.loading import (
    build_model,
    build_tokenizer,
    demonstrations,
    load_policy_and_tokenizer,
    resumed_critic,
    resumed_reference,
)
from adora_openrlhf.backends.local.rl_step import (
    PolicyDiverged,
    StepModels,
    StepSampling,
    rl_row_count,
    rl_step,
    weight_bound,
    weights_problem,
)
from adora_openrlhf.backends.local.sft import supervised_warmup, warmup_styles
from adora_openrlhf.backends.support import check_backend_fields
from adora_openrlhf.cli_args import format_config
from adora_openrlhf.cli_errors import check_output_dir
from adora_openrlhf.config import ConfigError, RunConfig
from adora_openrlhf.engine import vlm
from adora_openrlhf.engine.evaluate import evaluate, majority_accuracy
from adora_openrlhf.engine.model import (
    count_parameters,
    pick_device,
)
from adora_openrlhf.engine.model_source import check_model_source
from adora_openrlhf.engine.rollout import GenerationSettings, RolloutEngine, encode_prompts, make_reward_fns
from adora_openrlhf.prompt_templates import render_prompt
from adora_openrlhf.rewards.grading import StepGrader
from adora_openrlhf.rows import load_run_rows, rows_fingerprint
from adora_openrlhf.rundir import checkpoints as ckpt
from adora_openrlhf.rundir import checks as rundir
from adora_openrlhf.rundir.heldout import save_heldout
from adora_openrlhf.rundir.metrics import MetricsLogger, plot_reward_curve
from adora_openrlhf.tasks.registry import is_vision_task

logger = logging.getLogger(__name__)


def _check_runnable(cfg: RunConfig) -> None:
    if cfg.backend != "local":
        raise ConfigError(f"backend: the local trainer runs backend 'local', got {cfg.backend!r}")
    check_backend_fields(cfg)  # fields the local backend cannot honour (backends/support.py)
    if cfg.advantage.estimator in CRITIC_ESTIMATORS and (cfg.model.lora_rank > 0 or is_vision_task(cfg.data.task)):
        raise ConfigError(
            f"advantage.estimator: the local critic of {cfg.advantage.estimator!r} is built for text policies trained in "
            "full; drop --model.lora_rank and use a text task, or use --advantage.estimator reinforce (no critic)"
        )
    if cfg.model.path is not None:  # a local directory or a hub name (hub cache when HF_HUB_OFFLINE=1)
        check_model_source(cfg.model.path, "model.path", cfg.model.init_kwargs)
        local = Path(cfg.model.path)
        readable = (local / "config.json").is_file() or not local.exists()  # else the loader names what is wrong
        if (
            is_vision_task(cfg.data.task)
            and readable
            and not vlm.is_vlm_checkpoint(cfg.model.path, cfg.model.init_kwargs)
        ):
            raise ConfigError(
                f"model.path: data.task {cfg.data.task!r} needs a vision-language checkpoint (config.json with a vision_config), {cfg.model.path!r} has none"
            )


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _encode(cfg: RunConfig, tokenizer, rows, where: str, processor=None):
    """(prompt token ids, extra model inputs per prompt or None) of ``rows`` under the run's prompt template
    (too-long prompts are an error naming the row); with a processor, images go through it (``vlm.py``)."""
    if processor is not None:
        texts = [vlm.render_vlm_prompt(r.prompt, processor, cfg.data.prompt_template) for r in rows]
        locations = [r.where or f"{where}:{i + 1}" for i, r in enumerate(rows)]
        return vlm.encode_vlm_prompts(processor, texts, [r.images for r in rows], cfg.data.max_prompt_tokens, locations)
    texts = [render_prompt(r.prompt, tokenizer, cfg.data.prompt_template) for r in rows]
    return encode_prompts(
        tokenizer, texts, cfg.data.max_prompt_tokens, [r.where or f"{where}:{i + 1}" for i, r in enumerate(rows)]
    ), None


def warm_start(cfg: RunConfig, out_dir: str | Path) -> Path:
    """Build the policy of ``cfg``, run only its supervised warm-up, and save model and tokenizer (Hugging Face
    format) to ``out_dir``. ``--model.path out_dir --warmup.steps 0`` then starts RL from exactly this policy;
    the benchmarks start every variant of a seed from one warm start."""
    _check_runnable(cfg)
    _seed_everything(cfg.seed)
    train_rows, _ = load_run_rows(cfg.data, cfg.seed)
    tokenizer, processor = build_tokenizer(cfg, train_rows, None)
    model = build_model(cfg, tokenizer, pick_device())
    ids, extras = _encode(cfg, tokenizer, train_rows, "train", processor)
    supervised_warmup(model, tokenizer, ids, train_rows, cfg.warmup, cfg.seed, cfg.train.micro_batch_size, extras)
    out = Path(out_dir)
    ckpt.export_model(model, out, cfg.model.merge_lora_on_save)
    (processor or tokenizer).save_pretrained(str(out))
    return out


def train(
    cfg: RunConfig,
    resume: bool = False,
    overwrite: bool = False,
    resume_from: str | None = None,
    resume_changes: Sequence[str] = (),
) -> dict[str, Any]:
    """Run the whole training described by ``cfg``; returns the summary also written to ``summary.json``.
    Everything (config, output location, previous run and checkpoint, data, tokenizer, model, trainer state) is
    checked and loaded before ``output_dir`` is touched and locked (:mod:`.rundir`). A directory with checkpoints
    is continued with ``resume`` (from the latest, or ``resume_from``: a step number, ``step_000002`` or its path;
    ``resume_changes``: options changed on purpose) or replaced with ``overwrite``, never silently."""
    _check_runnable(cfg)
    started, out, resume = time.perf_counter(), Path(cfg.output_dir), resume or resume_from is not None
    check_output_dir(out, "output_dir")
    checkpoint = rundir.check_previous_run(out, cfg, resume, overwrite, resume_from, changes=resume_changes)
    _seed_everything(cfg.seed)
    device = pick_device()

    # ---- data, tokenizer, model, trainer state (read-only: nothing is written yet) ---------------------
    train_rows, eval_rows = load_run_rows(cfg.data, cfg.seed)
    rl_row_count(cfg, train_rows)  # data.rl_prompts fits the training rows
    if checkpoint is not None:
        rundir.check_resume_data(checkpoint, cfg, train_rows, eval_rows)
    else:  # every warm-up demonstration can be built (a row that cannot is named)
        demonstrations(train_rows, warmup_styles(cfg.warmup), random.Random(0))
    tokenizer, processor, model = load_policy_and_tokenizer(cfg, train_rows, checkpoint, device)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=cfg.train.lr, weight_decay=cfg.train.weight_decay
    )
    state = ref_model = critic = None
    if checkpoint is not None:
        state = ckpt.load_trainer_state(checkpoint, optimizer)
        ref_model = resumed_reference(cfg, tokenizer, device, out)
        critic = resumed_critic(cfg, model, checkpoint)
    encoded = (
        _encode(cfg, tokenizer, train_rows, "train", processor),
        _encode(cfg, tokenizer, eval_rows, "eval", processor),
    )
    rewards = make_reward_fns(train_rows), make_reward_fns(eval_rows)
    run_record = {
        "config": cfg.to_dict(),
        "data": {"train": rows_fingerprint(train_rows), "eval": rows_fingerprint(eval_rows)},
    }
    loaded = _Loaded(tokenizer, processor, model, optimizer, state, ref_model, encoded, rewards, run_record, critic)
    with rundir.RunDirLock(out):
        # again, now that no other run can start (the files were verified above)
        if rundir.check_previous_run(out, cfg, resume, overwrite, resume_from, False, resume_changes) != checkpoint:
            raise ConfigError(
                f"output_dir: {str(out)!r} changed while this run was starting (another training wrote checkpoints); run the command again"
            )
        if checkpoint is None:
            if overwrite and ckpt.list_checkpoints(out):
                logger.info(
                    "starting a new run in %s: --overwrite removes the previous run's checkpoints and metrics", out
                )
            rundir.clear_previous_run(out)
        else:
            rundir.set_aside_later_checkpoints(out, state.step)
        return _train_in(cfg, out, started, device, checkpoint, train_rows, eval_rows, loaded)


@dataclass
class _Loaded:
    """What :func:`train` checked and loaded before it touched the run directory."""

    tokenizer: Any
    processor: Any  # the vision-language processor, or None
    model: Any
    optimizer: torch.optim.Optimizer
    state: ckpt.TrainerState | None  # the resumed checkpoint's state (None for a new run)
    ref_model: Any  # a resumed run's KL reference (None: no KL term, LoRA, or built after the warm-up)
    encoded: Any  # ((train ids, train extras), (eval ids, eval extras))
    rewards: Any  # (train reward functions, eval reward functions)
    run_record: dict[str, Any]  # what every checkpoint records for --resume (trainer_state/run.json)
    critic: Any = None  # advantage.estimator gae: a resumed run's critic (a new run's is built after the warm-up)


class _LocalRun:
    """One run in its locked directory ``out``: what :func:`_train_in` sets up, evaluates, saves and finishes."""

    def __init__(
        self, cfg: RunConfig, out: Path, device, resume_from: Path | None, train_rows, eval_rows, loaded: _Loaded
    ) -> None:
        self.cfg, self.out, self.device, self.resume_from, self.loaded = cfg, out, device, resume_from, loaded
        self.train_rows, self.eval_rows = train_rows, eval_rows
        self.model, self.optimizer = loaded.model, loaded.optimizer
        # what checkpoints save as tokenizer/
        self.saved_tokenizer = loaded.processor if loaded.processor is not None else loaded.tokenizer
        (self.train_ids, self.train_extras), (self.eval_ids, self.eval_extras) = loaded.encoded
        train_rewards, self.eval_rewards = loaded.rewards
        self.generation = GenerationSettings.of(cfg.model)  # rollouts and evaluation decode alike
        allocator = RolloutAllocator(cfg.allocation, cfg.seed) if cfg.allocation.enabled else None
        self.sampling = StepSampling(AdaptiveSampler(cfg.sampling, cfg.rollout, seed=cfg.seed), allocator)
        self.engine = RolloutEngine(
            self.model,
            loaded.tokenizer,
            self.train_ids,
            train_rows,
            train_rewards,
            cfg.positive_threshold,
            self.generation,
            extras=self.train_extras,
            grader=StepGrader(cfg.grading),
        )
        self.eval_grader = StepGrader(cfg.grading)  # held-out evaluations: the same deadline, one budget per evaluation
        self.metrics_log: MetricsLogger | None = None
        self.weight_bound = math.inf  # until the RL phase starts (step_models)

    def write_run_files(self) -> None:
        """config.json, the held-out set (``heldout.py``) and a new tiny model's tokenizer; the policy in one log line."""
        cfg, out, tokenizer = self.cfg, self.out, self.loaded.tokenizer
        logger.info("config:\n%s", format_config(cfg))
        (out / "config.json").write_text(format_config(cfg) + "\n")
        save_heldout(out, self.eval_rows, cfg)  # for `python -m eval.run --run out` (heldout.py)
        if self.resume_from is None and cfg.model.path is None:
            self.saved_tokenizer.save_pretrained(str(out / "tokenizer"))
        total, trainable = count_parameters(self.model)
        tiny = (
            "tiny Qwen2.5-VL-style (random init)"
            if self.loaded.processor is not None
            else "tiny Qwen2-style (random init)"
        )
        logger.info(
            f"policy: {tiny if cfg.model.path is None else cfg.model.path}, {total:,} parameters ({trainable:,} trainable), vocab "
            f"{len(tokenizer)}, device {self.device}; {len(self.train_rows)} train / {len(self.eval_rows)} held-out prompts"
        )

    def check_weights(self, what: str) -> None:
        """FloatingPointError, before ``what`` is written, when a trained weight is not finite or exceeds the RL
        steps' bound (:func:`rl_step.weight_bound`, set when the RL phase starts); nothing is written then."""
        why = weights_problem(self.model, self.weight_bound)
        if why is None:
            return
        raise FloatingPointError(
            f"the policy diverged ({why}), so {what} was not written; lower train.lr (now {self.cfg.train.lr:g})"
            f"{_resume_advice(self.out)}"
        )

    def save(self, step: int, position: int) -> None:
        self.check_weights(f"checkpoint step_{step:06d}")
        allocator = self.sampling.allocator
        state = ckpt.TrainerState(
            step,
            position,
            self.sampling.sampler.state_dict(),
            ckpt.capture_rng(),
            allocator.state_dict() if allocator is not None else {},
        )
        ckpt.save_checkpoint(
            self.out,
            self.model,
            self.optimizer,
            self.saved_tokenizer,
            state,
            merge_lora=self.cfg.model.merge_lora_on_save,
            run_record=self.loaded.run_record,
            extra=self.loaded.critic.save if self.loaded.critic is not None else None,
        )

    def evaluate(self, step: int) -> dict[str, float]:
        """Held-out metrics; sampled with its own seed so evaluating never shifts the training RNG stream."""
        cfg, t0 = self.cfg, time.perf_counter()
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(cfg.seed * 100_003 + step)
            result = evaluate(
                self.model,
                self.loaded.tokenizer,
                self.eval_ids,
                self.eval_rows,
                self.eval_rewards,
                cfg.rollout,
                cfg.eval_samples,
                self.generation,
                extras=self.eval_extras,
                grader=self.eval_grader,
            )
        return {**result, "time/eval_s": time.perf_counter() - t0}

    def begin(self) -> tuple[int, int]:
        """The resumed state, or the warm-up, step-0 evaluation and checkpoint ``step_000000``: (first step, data position)."""
        cfg, out, state = self.cfg, self.out, self.loaded.state
        if state is not None:
            self.sampling.sampler.load_state_dict(state.sampler)
            if self.sampling.allocator is not None:
                self.sampling.allocator.load_state_dict(state.allocation)
            ckpt.restore_rng(state.rng)
            self.metrics_log = MetricsLogger(out, resume_step=state.step, report_to=cfg.report_to, config=cfg.to_dict())
            logger.info(
                "resumed from %s at step %d (data position %d)", self.resume_from, state.step, state.data_position
            )
            return state.step, state.data_position
        self.metrics_log = MetricsLogger(out, report_to=cfg.report_to, config=cfg.to_dict())
        t0 = time.perf_counter()
        losses = supervised_warmup(
            self.model,
            self.loaded.tokenizer,
            self.train_ids,
            self.train_rows,
            cfg.warmup,
            cfg.seed,
            cfg.train.micro_batch_size,
            self.train_extras,
        )
        warm = {"warmup/steps": len(losses), "warmup/time_s": time.perf_counter() - t0}
        if losses:
            warm.update({"warmup/first_loss": losses[0], "warmup/final_loss": float(np.mean(losses[-10:]))})
        if cfg.advantage.estimator in CRITIC_ESTIMATORS:  # the critic starts from the warmed-up policy
            self.loaded.critic = build_critic(self.model, cfg.critic, cfg.seed, cfg.critic.warm_start)
        baseline = {"eval/majority_accuracy": majority_accuracy(self.train_rows, self.eval_rows)}
        self.metrics_log.log(0, {**warm, **self.evaluate(0), **baseline})
        self.save(0, 0)
        return 0, 0

    def step_models(self) -> StepModels:
        """The models an RL step uses; the KL reference is the step-0 checkpoint's policy (LoRA runs: the base model, adapters off)."""
        cfg, ref_model = self.cfg, self.loaded.ref_model
        if ref_model is None and cfg.train.kl_coef > 0 and cfg.model.lora_rank == 0:
            with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
                ref_model = build_model(
                    cfg, self.loaded.tokenizer, self.device, ckpt.checkpoint_dir(self.out) / "step_000000"
                )
            ref_model.eval().requires_grad_(False)
        self.weight_bound = weight_bound(self.model)
        return StepModels(
            self.model,
            self.optimizer,
            ref_model,
            self.loaded.tokenizer,
            self.train_extras,
            weight_bound=self.weight_bound,
            critic=self.loaded.critic,
        )

    def finish(self, started: float, start_step: int) -> dict[str, Any]:
        """The reward curve, ``final_model/`` and ``summary.json`` (returned)."""
        from adora_openrlhf.rundir.metrics import read_metrics

        cfg, out = self.cfg, self.out
        plot_reward_curve(out / "metrics.jsonl", out / "reward_curve.png")
        final_dir = out / "final_model"
        self.check_weights("final_model")

        def write_final(directory: Path) -> None:
            ckpt.export_model(self.model, directory, cfg.model.merge_lora_on_save)
            self.saved_tokenizer.save_pretrained(str(directory))
            ckpt.write_model_manifest(directory)  # eval.run checks the weights against it

        ckpt.write_atomically(final_dir, write_final, "the final model", ckpt.resume_hint(out))
        evals = [r for r in read_metrics(out / "metrics.jsonl") if "eval/greedy_accuracy" in r]
        summary = {
            "recipe": cfg.recipe,
            "steps": cfg.steps,
            "eval_step0": {k: v for k, v in evals[0].items() if k.startswith("eval/")} if evals else {},
            "eval_final": {k: v for k, v in evals[-1].items() if k.startswith("eval/")} if evals else {},
            "wall_time_s": time.perf_counter() - started,
            "resumed_from_step": None if self.resume_from is None else start_step,
        }
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        logger.info("wrote %s, %s and %s", out / "summary.json", out / "reward_curve.png", final_dir)
        return summary


class ZeroAdvantageWatch:
    """One warning line when every advantage of ``STEPS`` RL steps in a row was zero (every group's rewards equal):
    the run is not learning, though it goes on (the policy may still reach a mixed group)."""

    STEPS = 5

    def __init__(self) -> None:
        self.first_zero: int | None = None
        self.warned = False

    def see(self, step: int, metrics: dict[str, float]) -> None:
        if metrics.get("advantage/mean_abs", 0.0) != 0.0:
            self.first_zero, self.warned = None, False
            return
        self.first_zero = step if self.first_zero is None else self.first_zero
        if not self.warned and step - self.first_zero + 1 >= self.STEPS:
            logger.warning(
                "steps %d-%d: every advantage was zero (each group's responses got equal rewards), so the policy is not being "
                "updated; check the reward and the warm-up, or raise sampling.n_keep / rollout.temperature",
                self.first_zero,
                step,
            )
            self.warned = True


def _resume_advice(out: Path) -> str:
    """How to go on after a divergence: every checkpoint was written after a check of its weights, so the latest
    holds good ones; ``--resume-changes train.lr`` lets the resumed run take a lower rate."""
    last = ckpt.latest_checkpoint(out)
    if last is None:
        return ""
    return (
        f"; the last good checkpoint is {last.name}: continue from it with --resume-from {last.name} "
        "--resume-changes train.lr --train.lr NEW_LR"
    )


def _train_in(
    cfg: RunConfig, out: Path, started: float, device, resume_from: Path | None, train_rows, eval_rows, loaded: _Loaded
) -> dict[str, Any]:
    """The run itself, in the locked ``out``: set up, warm up (or resume), the RL steps, finish."""
    run = _LocalRun(cfg, out, device, resume_from, train_rows, eval_rows, loaded)
    run.write_run_files()
    start_step, position = run.begin()
    models = run.step_models()
    bar = tqdm(
        range(start_step, cfg.steps), initial=start_step, total=cfg.steps, desc="RL", unit="step", dynamic_ncols=True
    )
    zero_watch = ZeroAdvantageWatch()
    for step in bar:
        try:
            metrics, position = rl_step(cfg, step, position, run.sampling, run.engine, train_rows, models)
        except PolicyDiverged as err:
            raise FloatingPointError(f"{err}{_resume_advice(out)}") from None
        zero_watch.see(step + 1, metrics)
        done = step + 1
        if (cfg.eval_every and done % cfg.eval_every == 0) or done == cfg.steps:
            metrics.update(run.evaluate(done))
        run.metrics_log.log(done, metrics)
        if (cfg.save_every and done % cfg.save_every == 0) or done == cfg.steps:
            run.save(done, position)
        bar.set_postfix(
            reward=f"{metrics.get('reward/mean', float('nan')):.2f}",
            acc=f"{metrics.get('reward/accuracy', float('nan')):.2f}",
        )
    bar.close()
    run.metrics_log.close()
    return run.finish(started, start_step)
