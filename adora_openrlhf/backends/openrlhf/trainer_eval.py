"""The held-out evaluation our OpenRLHF trainers add to OpenRLHF's: :class:`HeldOutRecords`.

OpenRLHF evaluates every ``--eval.steps`` only; our trainers also evaluate before the first step (in
``init_checkpoint_states``) and after the last step when that step is not a multiple of ``--eval.steps``, as the
local backend does, and append each evaluation's numbers to ``metrics.jsonl`` (``"eval": true``) once per step.
"""

from __future__ import annotations


class HeldOutRecords:
    """Needs ``self.args``, ``self.eval_dataloader``, ``self.generate_kwargs`` (OpenRLHF's), ``self.metrics_log``,
    ``self.recorded_evals``, ``self.last_step``, ``self.last_eval_step`` (set by ``setup_records``) and
    ``evaluate_held_out(step)`` (the trainer that lives beside the samples generator)."""

    def evaluates(self) -> bool:
        """Whether this run evaluates a held-out set (``--eval.dataset`` and ``--eval.steps``)."""
        return self.eval_dataloader is not None and self.args.eval.steps != float("inf")

    def record_eval(self, global_step: int, logs: dict) -> None:
        """An evaluation's numbers appended to ``metrics.jsonl`` (``"eval": true``), once per step: OpenRLHF's
        asynchronous generator evaluates the resumed step again, which the resumed run's records already hold."""
        self.last_eval_step = global_step
        if self.metrics_log is not None and global_step not in self.recorded_evals:
            self.recorded_evals.add(global_step)
            self.metrics_log.log(global_step, {"eval": True, **numeric_logs(logs)})

    def eval_generate_kwargs(self) -> dict:
        """OpenRLHF's evaluation settings, as its ``fit`` builds them."""
        return {
            **self.generate_kwargs,
            "temperature": self.args.eval.temperature,
            "n_samples_per_prompt": self.args.eval.n_samples_per_prompt,
        }

    def evaluate_last_step(self) -> None:
        """After ``fit``: evaluate the last step when ``fit`` made no evaluation of it (OpenRLHF evaluates multiples
        of ``--eval.steps`` only), then close ``metrics.jsonl``."""
        try:
            if self.evaluates() and self.last_step > 0 and self.last_eval_step != self.last_step:
                self.wandb_logger = None  # finished by fit; TensorBoard's writer reopens its file
                self.evaluate_held_out(self.last_step)
                if self.tensorboard_logger:
                    self.tensorboard_logger.close()
        finally:
            if self.metrics_log is not None:
                self.metrics_log.close()


def numeric_logs(logs: dict) -> dict[str, float]:
    """The numbers of OpenRLHF's step or evaluation logs (its sample texts and flags are left out)."""
    return {
        key: float(value)
        for key, value in logs.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }
