"""The PPO trainer that builds our classes inside its Ray actor: :class:`AdoraPPOTrainer`.

OpenRLHF's ``PPOTrainer`` is a Ray actor class (``@ray.remote``); its plain Python class is
``PPOTrainer.__ray_actor_class__``. :class:`AdoraPPOTrainer` subclasses that class: OpenRLHF's constructor
runs first (tokenizer, datasets, KL controller, loggers), then the sample generator and the experience
maker are rebuilt as :class:`~.samples_generator.AdoraSamplesGenerator` and
:class:`~.experience_maker.AdoraExperienceMaker` from the same objects. ``fit``, ``train_step``, PPO
updates, checkpoints and evaluation are OpenRLHF's.

Checkpoints: the samples generator's state (the sampler's step counter, which drives the escalation trigger
and the per-step seeds, and the ``pool_scope="history"`` reward pool) is added to OpenRLHF's checkpoint
``client_states`` under :data:`SAMPLER_STATE_KEY` and restored from them on ``--resume``
(``--ckpt.load_enable``). A checkpoint without that entry resumes the step counter at its ``global_step``
with an empty history, and says so.

The run's config arrives with OpenRLHF's own args namespace (``strategy.args.adora_run_config``, set by the
launcher), and both classes are constructed in ``__init__``, i.e. in the actor's process: nothing depends
on state of the driver process. :data:`RemoteAdoraPPOTrainer` is the Ray actor class the launcher hands to
OpenRLHF's ``train(args)``; Ray ships it by reference to this module, so every node must be able to import
``adora_openrlhf`` (install the package on the nodes, or submit with ``working_dir`` / ``py_modules``).
"""

from __future__ import annotations

import logging

import ray
from openrlhf.trainer.ppo_trainer import PPOTrainer as _OpenRLHFRemotePPOTrainer

from adora_openrlhf.backends.openrlhf.experience_maker import AdoraExperienceMaker
from adora_openrlhf.backends.openrlhf.flags import generate_kwargs_for, run_config_from_args, signal_description
from adora_openrlhf.backends.openrlhf.samples_generator import AdoraSamplesGenerator
from adora_openrlhf.log_setup import ensure_logging

OpenRLHFPPOTrainer = _OpenRLHFRemotePPOTrainer.__ray_actor_class__  # the class under OpenRLHF's @ray.remote
SAMPLER_STATE_KEY = "adora_samples_generator"  # entry of OpenRLHF's checkpoint client_states

logger = logging.getLogger(__name__)


class AdoraPPOTrainer(OpenRLHFPPOTrainer):
    """OpenRLHF's synchronous PPO/GRPO trainer with our sampler and advantage path."""

    def __init__(
        self,
        pretrain,
        strategy,
        actor_model_group,
        critic_model_group,
        reward_model_group,
        reference_model_group,
        vllm_engines,
        **generate_kwargs,
    ) -> None:
        run_config = run_config_from_args(strategy.args)  # fail before any model work when it is missing
        generate_kwargs = generate_kwargs_for(run_config, generate_kwargs)  # + rollout.top_k
        super().__init__(
            pretrain,
            strategy,
            actor_model_group,
            critic_model_group,
            reward_model_group,
            reference_model_group,
            vllm_engines,
            **generate_kwargs,
        )
        self.run_config = run_config
        self.samples_generator = AdoraSamplesGenerator(
            strategy=strategy,
            prompts_dataloader=self.prompts_dataloader,
            eval_dataloader=self.eval_dataloader,
            tokenizer=self.tokenizer,
            vllm_engines=vllm_engines,
            run_config=run_config,
        )
        self.experience_maker = AdoraExperienceMaker(
            actor_model_group,
            critic_model_group,
            reward_model_group,
            reference_model_group,
            self.kl_ctl,
            strategy,
            self.tokenizer,
            run_config=run_config,
        )
        ensure_logging()  # this runs in a Ray actor, which configured no log handler
        for line in signal_description(run_config):
            logger.info("[adora_openrlhf] %s", line)

    def save_logs_and_checkpoints(self, global_step: int, logs_dict=None, client_states=None) -> None:
        """OpenRLHF's logging and checkpointing, with the samples generator's state in ``client_states``."""
        client_states = {} if client_states is None else client_states
        client_states[SAMPLER_STATE_KEY] = self.samples_generator.state_dict()
        super().save_logs_and_checkpoints(global_step, logs_dict, client_states)

    def init_checkpoint_states(self) -> dict:
        """OpenRLHF's resume states; restores the samples generator's state from them."""
        states = super().init_checkpoint_states()
        saved = states.get(SAMPLER_STATE_KEY)
        if saved is not None:
            self.samples_generator.load_state_dict(saved)
        elif states.get("global_step", 0) > 0:
            self.samples_generator.sampling_step = int(states["global_step"])
            logger.warning(
                "resume: the checkpoint has no adaptive-sampler state; its step counter resumes at global_step=%d and the history pool starts empty",
                self.samples_generator.sampling_step,
            )
        return states

    def component_classes(self) -> dict[str, str]:
        """Qualified class names of the generator and experience maker (checked after start-up)."""
        return {
            "samples_generator": f"{type(self.samples_generator).__module__}.{type(self.samples_generator).__qualname__}",
            "experience_maker": f"{type(self.experience_maker).__module__}.{type(self.experience_maker).__qualname__}",
        }


RemoteAdoraPPOTrainer = ray.remote(AdoraPPOTrainer)
