"""Run metrics: one JSON line per step (``metrics.jsonl``), TensorBoard scalars (``tb/``), and a
reward-curve PNG (``reward_curve.png``) at the end."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Optional


class MetricsLogger:
    """Appends step records to ``metrics.jsonl`` and TensorBoard. On resume, records after the resumed step
    are dropped first, so the file holds each step once."""

    def __init__(self, output_dir: str | Path, resume_step: Optional[int] = None, tensorboard: bool = True):
        self.dir = Path(output_dir)
        self.path = self.dir / "metrics.jsonl"
        self.dir.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        elif self.path.exists():
            kept = [json.dumps(r) for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
            self.path.write_text("".join(line + "\n" for line in kept))
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(self.dir / "tb"), purge_step=None if resume_step is None else resume_step + 1)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        record = {"step": step, **{k: (float(v) if isinstance(v, (int, float)) else v) for k, v in metrics.items()}}
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(float(value)):
                    self.writer.add_scalar(key, float(value), step)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


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
    """PNG with the training reward (raw and moving average), training accuracy and held-out accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    train = [r for r in records if "reward/mean" in r]
    evals = [r for r in records if "eval/greedy_accuracy" in r]
    fig, (ax_r, ax_a) = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        steps = [r["step"] for r in train]
        rewards = [r["reward/mean"] for r in train]
        smooth = [sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1]) for i in range(len(rewards))]
        ax_r.plot(steps, rewards, alpha=0.35, label="reward (step)")
        ax_r.plot(steps, smooth, label=f"reward ({window}-step mean)")
        ax_a.plot(steps, [r["reward/accuracy"] for r in train], alpha=0.35, label="train accuracy (rollouts)")
    for key, label in (("eval/greedy_accuracy", "held-out accuracy (greedy)"), ("eval/sampled_accuracy", "held-out accuracy (sampled)")):
        points = [(r["step"], r[key]) for r in evals if key in r]
        if points:
            ax_a.plot(*zip(*points), marker="o", label=label)
    ax_r.set_xlabel("RL step")
    ax_r.set_ylabel("reward")
    ax_r.legend()
    ax_a.set_xlabel("RL step")
    ax_a.set_ylabel("accuracy")
    ax_a.set_ylim(0, 1)
    ax_a.legend()
    fig.tight_layout()
    out = Path(out_path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
