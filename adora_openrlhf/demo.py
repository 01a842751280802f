"""``python -m adora_openrlhf.demo``: the algorithm core on a simulated policy, no model needed.

Each prompt has a hidden success probability (many easy, many hard, few in between, as in RL on reasoning
data). The demo samples with plain GRPO (one round of n) and with adaptive multi-round sampling (``pos`` and
``balance``), computes group advantages with pool statistics and ADORA weights, and prints per-variant
metrics: responses generated, zero-signal groups, groups that retired, ADORA TAS fraction.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch
from rich.console import Console
from rich.table import Table

from adora_openrlhf.algorithms.pipeline import GroupBatch, compute_step_advantages
from adora_openrlhf.algorithms.sampling import AdaptiveSampler, GenerationRequest, ScoredResponse
from adora_openrlhf.cli_errors import OneLineParser, add_debug_flag, run_cli
from adora_openrlhf.config import AdaptiveSamplingConfig, AdoraConfig, AdvantageConfig, SamplingParams


def simulated_engine(success: Sequence[float], rng: random.Random):
    """generate() for a fake policy: reward 1 with the prompt's success probability; correct answers run longer."""

    def generate(requests: Sequence[GenerationRequest]) -> list[list[ScoredResponse]]:
        out = []
        for req in requests:
            group = []
            for _ in range(req.num_samples):
                ok = rng.random() < success[req.prompt_index]
                length = rng.randint(40, 120) if ok else rng.randint(20, 100)
                group.append(ScoredResponse(reward=float(ok), positive=ok, length=length, truncated=length >= 118))
            out.append(group)
        return out

    return generate


def run_variant(name: str, sampling: AdaptiveSamplingConfig, steps: int, prompts: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    sampler = AdaptiveSampler(sampling, SamplingParams(max_new_tokens=120), seed=seed)
    totals: dict[str, float] = {}
    for step in range(steps):
        success = [rng.choice([0.0, 0.02, 0.05, 0.1, 0.3, 0.6, 0.95, 1.0]) for _ in range(prompts)]
        result = sampler.sample(prompts, simulated_engine(success, rng), step=step)
        kept = result.groups
        batch = GroupBatch(
            rewards=result.kept_rewards(),
            lengths=torch.tensor([[r.length for r in g.kept] for g in kept]),
            truncated=torch.tensor([[r.truncated for r in g.kept] for g in kept]),
        )
        out = compute_step_advantages(
            batch, AdvantageConfig("group_norm"), AdoraConfig(enabled=True), result.pool_stats
        )
        for key, value in {**result.metrics, **out.metrics}.items():
            totals[key] = totals.get(key, 0.0) + value / steps
    totals["variant"] = name  # type: ignore[assignment]
    return totals


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m adora_openrlhf.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=8, help="training group size")
    parser.add_argument("--seed", type=int, default=0)
    add_debug_flag(parser)
    return run_cli(lambda: _run(parser.parse_args(argv)), argv)


def _run(args) -> int:
    for flag, value, low in (
        ("--steps", args.steps, 1),
        ("--prompts", args.prompts, 1),
        ("--n", args.n, 1),
        ("--seed", args.seed, 0),
    ):
        if value < low:
            raise ValueError(f"{flag}: must be >= {low}, got {value}")
    n = args.n
    variants = {
        "GRPO (1 round of n)": AdaptiveSamplingConfig(enabled=False, n_keep=n),
        "adaptive pos": AdaptiveSamplingConfig(
            enabled=True, exit_rule="pos", n_keep=n, samples_per_round=n, max_rounds=4
        ),
        "adaptive balance": AdaptiveSamplingConfig(
            enabled=True, exit_rule="balance", n_keep=n, samples_per_round=n, max_rounds=4
        ),
    }
    rows = [run_variant(name, cfg, args.steps, args.prompts, args.seed) for name, cfg in variants.items()]
    table = Table(title=f"Simulated policy: {args.prompts} prompts x {args.steps} steps, n = {n} (means per step)")
    columns = [
        ("responses", "sampling/responses_generated", "{:.0f}"),
        ("rounds", "sampling/rounds_used", "{:.2f}"),
        ("zero-signal frac", "advantage/zero_signal_fraction", "{:.3f}"),
        ("unfinished", "sampling/unfinished_prompts", "{:.1f}"),
        ("ADORA TAS frac", "adora/tas_fraction", "{:.3f}"),
        ("ADORA mean w", "adora/mean_weight", "{:.3f}"),
        ("1st-round reward", "sampling/first_round_mean_reward", "{:.3f}"),
    ]
    table.add_column("variant")
    for title, _, _ in columns:
        table.add_column(title, justify="right")
    for row in rows:
        table.add_row(str(row["variant"]), *[fmt.format(row[key]) for _, key, fmt in columns])
    Console(width=140).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
