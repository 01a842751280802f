"""The PPO trainer that builds our classes inside its Ray actor: :class:`AdoraPPOTrainer`.

OpenRLHF's ``PPOTrainer`` is a Ray actor class (``@ray.remote``); its plain Python class is
``PPOTrainer.__ray_actor_class__``. :class:`AdoraPPOTrainer` subclasses that class: OpenRLHF's constructor
runs first (tokenizer, datasets, KL controller, loggers), then the sample generator and the experience
maker are rebuilt as :class:`~.samples_generator.AdoraSamplesGenerator` and
:class:`~.experience_maker.AdoraExperienceMaker` from the same objects. ``fit``, ``train_step``, PPO
updates, checkpoints and evaluation are OpenRLHF's.

Checkpoints hold the run's config and the sampler's state as JSON beside OpenRLHF's files
(:mod:`.trainer_checkpoints`); a checkpoint without the sampler's state file resumes the step counter at its
``global_step`` with an empty history, and says so.

Run records, beside OpenRLHF's TensorBoard logs: ``metrics.jsonl`` in the run directory (one record per
training step with every logged number, ``adora/*`` and ``sampling/*`` included, and one per evaluation,
``"eval": true``; on resume the records after the resumed step are dropped first) and :data:`MARKER_FILE`,
written when the trainer is built, which the launcher checks after ``train(args)`` returns: a run in which
OpenRLHF's stock trainer ran instead of this one (so without ADORA and the sampler) fails instead of passing
silently. The held-out evaluations beyond OpenRLHF's: :mod:`.trainer_eval`.

The run's config arrives with OpenRLHF's own args namespace (``strategy.args.adora_run_config``, set by the
launcher), and both classes are constructed in ``__init__``, i.e. in the actor's process: nothing depends
on state of the driver process. :data:`RemoteAdoraPPOTrainer` is the Ray actor class the launcher hands to
OpenRLHF's ``train(args)``; Ray ships it by reference to this module, so every node must be able to import
``adora_openrlhf`` (install the package on the nodes, or submit with ``working_dir`` / ``py_modules``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

import ray
import torch
from openrlhf.trainer.ppo_trainer import BasePPOTrainer
from openrlhf.trainer.ppo_trainer import PPOTrainer as _OpenRLHFRemotePPOTrainer

from adora_openrlhf.backends.openrlhf.experience_maker import AdoraExperienceMaker
from adora_openrlhf.backends.openrlhf.flags import (
    LAUNCH_ID_ATTR,
    MARKER_FILE,
    generate_kwargs_for,
    run_config_from_args,
    signal_description,
)
from adora_openrlhf.backends.openrlhf.samples_generator import POLICY_VERSION, AdoraSamplesGenerator
from adora_openrlhf.backends.openrlhf.trainer_checkpoints import SAMPLER_STATE_FILE as SAMPLER_STATE_FILE
from adora_openrlhf.backends.openrlhf.trainer_checkpoints import CheckpointRecords
from adora_openrlhf.backends.openrlhf.trainer_eval import HeldOutRecords, numeric_logs
from adora_openrlhf.log_setup import ensure_logging

OpenRLHFPPOTrainer = _OpenRLHFRemotePPOTrainer.__ray_actor_class__  # the class under OpenRLHF's @ray.remote

logger = logging.getLogger(__name__)


class PolicyVersionBroadcast(BasePPOTrainer):
    """OpenRLHF's weight broadcast, after which every engine is told the policy version it now holds
    (:attr:`policy_version`: the number of optimiser steps behind those weights, 0 for the starting model). The
    samples generator tags each rollout with its engines' version; the trainer logs how many steps old the rollouts
    it trains on are. Listed after OpenRLHF's trainer class among the bases, so that this runs inside the
    asynchronous trainer's engine lock (``TrainingActor.broadcast_to_vllm``), where no generation is under way."""

    policy_version = 0

    def broadcast_to_vllm(self) -> None:
        super().broadcast_to_vllm()
        if self.vllm_engines:
            ray.get([engine.set_policy_version.remote(self.policy_version) for engine in self.vllm_engines])


class AdoraTrainerRecords(CheckpointRecords, HeldOutRecords):
    """What our trainers add to OpenRLHF's, in the synchronous and the asynchronous loop alike: the run's records
    (``metrics.jsonl``, :data:`MARKER_FILE`, the config and the sampler's state in each checkpoint folder), the
    held-out evaluation before the first step, the resume of the sampler's state, and the rollouts' staleness.

    The subclass says where the samples generator lives: :meth:`sampler_state`, :meth:`restore_sampler_state`,
    :meth:`evaluate_held_out` and :meth:`component_classes`."""

    def setup_records(self, run_config) -> None:
        """Called by the subclass's ``__init__`` once OpenRLHF's has run: our experience maker in place of OpenRLHF's
        (built from the same model groups, KL controller and tokenizer), and the run's records."""
        self.experience_maker = AdoraExperienceMaker(
            self.actor_model_group,
            self.critic_model_group,
            self.reward_model_group,
            self.reference_model_group,
            self.kl_ctl,
            self.strategy,
            self.tokenizer,
            run_config=run_config,
        )
        self.run_config = run_config
        ensure_logging()  # this runs in a Ray actor, which configured no log handler
        for line in signal_description(run_config):
            logger.info("[adora_openrlhf] %s", line)
        # the run directory; OpenRLHF's final model goes to its final_model/
        self.output_dir = Path(run_config.output_dir)
        self.metrics_log = None  # opened by init_checkpoint_states, once the resume step is known
        self.recorded_evals: set[int] = set()  # steps whose evaluation metrics.jsonl holds
        self.last_step = 0
        self.last_eval_step: int | None = None

    # -- where the samples generator lives (the subclass) ------------------------------------------------------
    def sampler_state(self) -> dict | None:
        """The samples generator's state that goes with the checkpoint being saved."""
        raise NotImplementedError

    def restore_sampler_state(self, state: dict) -> None:
        raise NotImplementedError

    def evaluate_held_out(self, global_step: int) -> None:
        """Evaluate the held-out set with the current weights, recorded at ``global_step``."""
        raise NotImplementedError

    def component_classes(self) -> dict[str, str]:
        raise NotImplementedError

    # -- records -------------------------------------------------------------------------------------------
    def write_marker(self) -> None:
        """Record that this trainer (not OpenRLHF's stock one) runs, with the launch's id, for the launcher."""
        self.output_dir.mkdir(parents=True, exist_ok=True)
        marker = {
            "launch_id": getattr(self.args, LAUNCH_ID_ATTR, None),
            "trainer": f"{type(self).__module__}.{type(self).__qualname__}",
            **self.component_classes(),
            "pid": os.getpid(),
            "time": time.time(),
        }
        (self.output_dir / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")

    def train_step(self, rollout_samples, global_step: int):
        """OpenRLHF's step, whose weights become policy version ``global_step + 1``, with the rollouts' staleness
        (``async/staleness_mean`` and ``_max``: this step's policy version ``global_step`` minus the version that
        generated each sample; always 0 in the synchronous loop)."""
        versions = [e.info[POLICY_VERSION] for e in rollout_samples if POLICY_VERSION in e.info]
        self.policy_version = global_step + 1  # what the broadcast at the end of the step hands the engines
        status, next_step = super().train_step(rollout_samples, global_step)
        check_finite_step(status, global_step + 1)
        if versions:
            staleness = global_step - torch.cat(versions).float()
            status["async/staleness_mean"] = float(staleness.mean())
            status["async/staleness_max"] = float(staleness.max())
        return status, next_step

    def save_logs_and_checkpoints(self, global_step: int, logs_dict=None, client_states=None) -> None:
        """OpenRLHF's logging and checkpointing, with the samples generator's state beside each checkpoint and the
        step's numbers appended to ``metrics.jsonl``."""
        self.last_step = global_step
        if self.metrics_log is not None:
            self.metrics_log.log(global_step, numeric_logs(logs_dict or {}))
        super().save_logs_and_checkpoints(global_step, logs_dict, client_states)
        self.record_config_in_checkpoints()
        self.record_sampler_state(global_step)

    def save_best_checkpoint(self, eval_metrics, global_step, client_states=None):
        """OpenRLHF's best-checkpoint save, with the run's config in the new checkpoint folder."""
        super().save_best_checkpoint(eval_metrics, global_step, client_states)
        self.record_config_in_checkpoints()
        self.record_sampler_state(global_step)

    def init_checkpoint_states(self) -> dict:
        """OpenRLHF's resume states (called once, at the start of ``fit``); restores the samples generator's state
        from them, opens ``metrics.jsonl`` at the resumed step, and evaluates the held-out set before the first
        step of a new run."""
        from adora_openrlhf.rundir.metrics import MetricsLogger, read_metrics

        states = super().init_checkpoint_states()
        step = int(states.get("global_step", 0))
        saved = self.saved_sampler_state(step)
        if saved is not None:
            self.restore_sampler_state(saved)
        elif step > 0:
            self.restore_sampler_state({"sampling_step": step, "sampler": None})
            logger.warning(
                "resume: the checkpoint has no adaptive-sampler state; its step counter resumes at global_step=%d and the history pool starts empty",
                step,
            )
        self.last_step = step
        self.policy_version = step  # the weights OpenRLHF's fit broadcasts on resume
        self.metrics_log = MetricsLogger(self.output_dir, resume_step=step if step > 0 else None, report_to=("none",))
        kept = read_metrics(self.metrics_log.path) if self.metrics_log.path.exists() else []
        self.recorded_evals = {int(r["step"]) for r in kept if r.get("eval")}
        if step == 0 and self.evaluates():
            self.evaluate_held_out(0)
        return states

    def fit(self, global_step: int = 0) -> None:
        """OpenRLHF's ``fit`` (its synchronous or asynchronous loop), then :meth:`evaluate_last_step`."""
        try:
            super().fit(global_step)
        except BaseException:
            if self.metrics_log is not None:
                self.metrics_log.close()
            raise
        self.evaluate_last_step()


class AdoraPPOTrainer(AdoraTrainerRecords, OpenRLHFPPOTrainer, PolicyVersionBroadcast):
    """OpenRLHF's synchronous PPO/GRPO trainer with our sampler and advantage path."""

    def __init__(self, pretrain, strategy, *model_groups_and_engines, **generate_kwargs) -> None:
        """OpenRLHF's constructor (its arguments: the model groups and the vLLM engines), then our classes."""
        run_config = run_config_from_args(strategy.args)  # fail before any model work when it is missing
        generate_kwargs = generate_kwargs_for(run_config, generate_kwargs)  # + rollout.top_k
        super().__init__(pretrain, strategy, *model_groups_and_engines, **generate_kwargs)
        self.samples_generator = AdoraSamplesGenerator(
            strategy=strategy,
            prompts_dataloader=self.prompts_dataloader,
            eval_dataloader=self.eval_dataloader,
            tokenizer=self.tokenizer,
            vllm_engines=self.vllm_engines,
            run_config=run_config,
        )
        self.setup_records(run_config)
        self.write_marker()

    def sampler_state(self) -> dict:
        return self.samples_generator.state_dict()

    def restore_sampler_state(self, state: dict) -> None:
        self.samples_generator.load_state_dict(state)

    def evaluate_held_out(self, global_step: int) -> None:
        self.evaluate(global_step, **self.eval_generate_kwargs())

    def evaluate(self, global_step, **generate_kwargs):
        """OpenRLHF's evaluation, with its numbers appended to ``metrics.jsonl`` (``"eval": true``)."""
        logs = super().evaluate(global_step, **generate_kwargs)
        self.record_eval(global_step, logs)
        return logs

    def component_classes(self) -> dict[str, str]:
        """Qualified class names of the generator and experience maker (checked after start-up)."""
        return {
            "samples_generator": qualified_name(self.samples_generator),
            "experience_maker": qualified_name(self.experience_maker),
        }


def qualified_name(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


class PolicyNotFinite(FloatingPointError):
    """OpenRLHF's policy loss of a training step is not finite (NaN or infinite log-probabilities, or a diverged
    update); the run stops before the step's checkpoint is written."""


# OpenRLHF's step statistics that a finite policy always gives finite values
FINITE_STEP_KEYS = ("policy_loss", "ppo_kl")


def check_finite_step(status: dict, step: int) -> None:
    """:class:`PolicyNotFinite` naming ``step`` (1-based) when a :data:`FINITE_STEP_KEYS` value of OpenRLHF's step
    ``status`` is not finite. OpenRLHF itself trains on: DeepSpeed's stage 3 reports a NaN gradient's norm as -1 and
    applies it, and every later step samples from the broken policy."""
    for key in FINITE_STEP_KEYS:
        value = status.get(key)
        if isinstance(value, (int, float)) and not math.isfinite(value):
            raise PolicyNotFinite(
                f"the policy's {key} is {value} at step {step}: its log-probabilities or update are not finite; "
                "lower --train.lr, or check that the model's weights load as saved (--model.path)"
            )


RemoteAdoraPPOTrainer = ray.remote(AdoraPPOTrainer)
