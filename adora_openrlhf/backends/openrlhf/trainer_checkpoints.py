"""What our OpenRLHF trainers keep in each DeepSpeed checkpoint folder beside OpenRLHF's own files:
:class:`CheckpointRecords`.

The samples generator's state (the sampler's step counter, which drives the escalation trigger and the per-step
seeds, the ``pool_scope="history"`` reward pool, the allocator's per-prompt store) is plain data, written as JSON
(:data:`SAMPLER_STATE_FILE`) into each checkpoint folder beside the run's config (:data:`~.flags.CHECKPOINT_CONFIG`),
and read back with ``json`` on ``--resume``: nothing of ours in a checkpoint is unpickled.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from adora_openrlhf.algorithms.allocation import check_store_state
from adora_openrlhf.backends.openrlhf.flags import CHECKPOINT_CONFIG

SAMPLER_STATE_FILE = "adora_sampler_state.json"  # the samples generator's state, in each DeepSpeed checkpoint folder


class CheckpointRecords:
    """The run's config and the sampler's state in OpenRLHF's checkpoint folders (``args.ckpt.path/_actor/``):
    written after each save, read on resume. Needs ``self.args`` (OpenRLHF's), ``self.run_config`` and
    ``sampler_state()`` (the trainer that lives beside the samples generator)."""

    def record_sampler_state(self, global_step: int) -> None:
        """Write the samples generator's state as JSON into the checkpoint folders of ``global_step`` (OpenRLHF's
        ``global_stepN`` and ``best_global_stepN``) that this step saved; written to a temporary name, then
        renamed, so a crash never leaves half a file."""
        state = self.sampler_state()
        if state is None:
            return
        for tag in (f"global_step{global_step}", f"best_global_step{global_step}"):
            folder = Path(self.args.ckpt.path) / "_actor" / tag
            if not folder.is_dir() or (folder / SAMPLER_STATE_FILE).exists():
                continue
            tmp = folder / (SAMPLER_STATE_FILE + ".tmp")
            tmp.write_text(json.dumps(state) + "\n", encoding="utf-8")
            os.replace(tmp, folder / SAMPLER_STATE_FILE)

    def record_config_in_checkpoints(self) -> None:
        """Write the run's config (:data:`CHECKPOINT_CONFIG`) into every DeepSpeed checkpoint folder that lacks it,
        so that ``--resume`` compares against what the checkpoint was trained with."""
        actor_dir = Path(self.args.ckpt.path) / "_actor"
        if not actor_dir.is_dir():
            return
        text = json.dumps(self.run_config.to_dict(), indent=2) + "\n"
        for folder in actor_dir.iterdir():
            if folder.is_dir() and not (folder / CHECKPOINT_CONFIG).exists():
                (folder / CHECKPOINT_CONFIG).write_text(text, encoding="utf-8")

    def saved_sampler_state(self, global_step: int) -> dict | None:
        """The JSON sampler state of the checkpoint folder of ``global_step`` (None without one); a file that is not
        the JSON this trainer writes (with ``allocation`` when the run allocates rollouts) is refused with one line
        naming it."""
        actor = Path(self.args.ckpt.path) / "_actor"
        latest = (actor / "latest").read_text(encoding="utf-8").strip() if (actor / "latest").is_file() else ""
        found = [
            actor / tag / SAMPLER_STATE_FILE
            for tag in (latest, f"global_step{global_step}")
            if tag and (actor / tag / SAMPLER_STATE_FILE).is_file()
        ]
        if global_step <= 0 or not found:
            return None
        path = found[0]  # the folder DeepSpeed loaded (``latest``), else the step's own
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            why = f"{type(err).__name__}: {err}"
            raise ValueError(
                f"{path}: not the sampler state this trainer writes ({why}); delete the file to resume with an empty history"
            ) from None
        if not (
            isinstance(state, dict)
            and isinstance(state.get("sampling_step"), int)
            and isinstance(state.get("sampler"), dict)
        ):
            raise ValueError(
                f"{path}: expected {{'sampling_step': int, 'sampler': {{...}}}}; delete the file to resume with an empty history"
            )
        if self.run_config.allocation.enabled and "allocation" not in state:
            raise ValueError(
                f"{path}: field allocation is missing (the allocator's store, saved with every checkpoint of a run with "
                "allocation.enabled); restore the file from your own copy"
            )
        if "allocation" in state:
            try:
                check_store_state(state["allocation"])
            except ValueError as err:
                raise ValueError(f"{path}: field allocation: {err}; restore the file from your own copy") from None
        return state
