"""Run metrics: one JSON line per step (``metrics.jsonl``, always), the experiment trackers named by
``report_to`` (:data:`TRACKERS`: TensorBoard events under ``tb/``, a Weights & Biases run under ``wandb/``), and
a PNG of the run's curves (``reward_curve.png``) at the end.

Every tracker receives the resolved run config once, as hyper-parameters: TensorBoard gets an HParams session
(one flat ``section.field`` entry per config leaf, shown in its HPARAMS tab) and the config JSON as text
(``config`` in the TEXT tab); wandb gets it as the run's ``config``."""

from __future__ import annotations

import json
import logging
import math
import os
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from adora_openrlhf.dotted import flatten

logger = logging.getLogger(__name__)

# shown next to the hparams
HPARAM_METRICS = (
    "reward/mean",
    "reward/accuracy",
    "eval/greedy_accuracy",
    "train/entropy",
    "response/length_mean",
)
WANDB_PROJECT_ENV = "WANDB_PROJECT"  # wandb project of the run; default "adora_openrlhf"


def flat_hparams(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train.lr": 1e-05, "model.path": "null", "data.kk.num_people": "[2, 3]", ...}``: one entry per config
    leaf; numbers, strings and bools stay, anything else (None, lists, mappings) becomes its JSON text."""
    return {
        name: value if _plain(value) else json.dumps(value, default=str)
        for name, value in flatten(config, prefix=prefix).items()
    }


def _plain(value: Any) -> bool:
    return isinstance(value, (bool, int, float, str)) and not (isinstance(value, float) and not math.isfinite(value))


class TensorBoardTracker:
    """Scalars to ``<run>/tb``; the config as an HParams session and as a ``config`` text summary."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any] | None, resume_step: int | None):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(
            log_dir=str(run_dir / "tb"), purge_step=None if resume_step is None else resume_step + 1
        )
        if config is not None:
            from torch.utils.tensorboard.summary import hparams

            for summary in hparams(flat_hparams(config), {name: 0.0 for name in HPARAM_METRICS}):
                self.writer.file_writer.add_summary(summary)
            self.writer.add_text("config", "```json\n" + json.dumps(config, indent=2, default=str) + "\n```", 0)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A Weights & Biases run in ``<run>/wandb`` (project ``$WANDB_PROJECT``, default ``adora_openrlhf``), with the
    config as its ``config``. ``WANDB_MODE=offline`` writes the run locally with no network (``wandb sync``
    uploads it later). A resumed training continues the same wandb run (its id is kept in ``wandb/run_id``)."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any] | None, resume_step: int | None):
        import wandb

        folder = run_dir / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder / "run_id"
        run_id = id_file.read_text().strip() if resume_step is not None and id_file.exists() else uuid.uuid4().hex[:8]
        id_file.write_text(run_id + "\n")
        self.run = wandb.init(
            project=os.environ.get(WANDB_PROJECT_ENV, "adora_openrlhf"),
            dir=str(run_dir),
            id=run_id,
            name=run_dir.name,
            config=dict(config) if config is not None else None,
            resume="allow",
        )

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=step)

    def close(self) -> None:
        self.run.finish()


# report_to name -> tracker class: (run directory, config dict or None, resume step or None) -> .log(step, scalars), .close()
TRACKERS: dict[str, Callable[..., Any]] = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker}


class MetricsLogger:
    """Appends step records to ``metrics.jsonl`` and sends their finite numbers to the trackers named in
    ``report_to`` (keys of :data:`TRACKERS`; ``"none"`` or an empty list = JSONL only). On resume, records after
    the resumed step are dropped first, so the file holds each step once."""

    def __init__(
        self,
        output_dir: str | Path,
        resume_step: int | None = None,
        report_to: tuple[str, ...] | list[str] = ("tensorboard",),
        config: Mapping[str, Any] | None = None,
    ):
        self.dir = Path(output_dir)
        self.path = self.dir / "metrics.jsonl"
        self.dir.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        elif self.path.exists():
            kept = [json.dumps(r) for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
            self.path.write_text("".join(line + "\n" for line in kept))
        self.trackers = [TRACKERS[name](self.dir, config, resume_step) for name in report_to if name != "none"]
        logger.debug("metrics to %s and %s", self.path, [name for name in report_to if name != "none"] or "no tracker")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        record = {"step": step, **{k: (float(v) if isinstance(v, (int, float)) else v) for k, v in metrics.items()}}
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        scalars = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}
        for tracker in self.trackers:
            tracker.log(step, scalars)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Step records of ``metrics.jsonl``; a line that is not a JSON object (the torn last line of a killed run)
    is dropped: its step is redone on resume."""
    records = []
    for line in Path(path).read_bytes().decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def plot_reward_curve(metrics_path: str | Path, out_path: str | Path, window: int = 5) -> Path:
    """PNG of the run, four panels: training reward (raw and moving average); training and held-out accuracy;
    policy entropy (``train/entropy``); response length (``response/length_mean``, ``response/length_max``) with
    the share of responses cut at ``max_new_tokens`` (``response/truncated_fraction``) on a second axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    train = [r for r in records if "reward/mean" in r]
    evals = [r for r in records if "eval/greedy_accuracy" in r]
    fig, ((ax_r, ax_a), (ax_h, ax_l)) = plt.subplots(2, 2, figsize=(11, 8))
    if train:
        steps = [r["step"] for r in train]
        rewards = [r["reward/mean"] for r in train]
        smooth = [
            sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1])
            for i in range(len(rewards))
        ]
        ax_r.plot(steps, rewards, alpha=0.35, label="reward (step)")
        ax_r.plot(steps, smooth, label=f"reward ({window}-step mean)")
        ax_a.plot(steps, [r["reward/accuracy"] for r in train], alpha=0.35, label="train accuracy (rollouts)")
    for key, label in (
        ("eval/greedy_accuracy", "held-out accuracy (greedy)"),
        ("eval/sampled_accuracy", "held-out accuracy (sampled)"),
    ):
        points = [(r["step"], r[key]) for r in evals if key in r]
        if points:
            ax_a.plot(*zip(*points, strict=True), marker="o", label=label)
    _plot_keys(ax_h, records, (("train/entropy", "mean token entropy (nats)"),))
    _plot_keys(ax_l, records, (("response/length_mean", "mean length"), ("response/length_max", "max length")))
    clipped = [(r["step"], r["response/truncated_fraction"]) for r in records if "response/truncated_fraction" in r]
    if clipped:
        ax_t = ax_l.twinx()
        ax_t.plot(*zip(*clipped, strict=True), color="tab:red", alpha=0.5, linestyle="--", label="truncated fraction")
        ax_t.set_ylim(0, 1)
        ax_t.set_ylabel("truncated fraction")
        ax_t.legend(loc="upper right")
    for ax, ylabel in (
        (ax_r, "reward"),
        (ax_a, "accuracy"),
        (ax_h, "policy entropy (nats)"),
        (ax_l, "response tokens"),
    ):
        ax.set_xlabel("RL step")
        ax.set_ylabel(ylabel)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left" if ax is ax_l else "best")
    ax_a.set_ylim(0, 1)
    fig.tight_layout()
    out = Path(out_path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _plot_keys(ax, records, keys) -> None:
    for key, label in keys:
        points = [(r["step"], r[key]) for r in records if key in r]
        if points:
            ax.plot(*zip(*points, strict=True), label=label)
