"""Where the time of a local-backend step goes, how far it is from the floor, and how it compares with TRL.

``python -m bench.overhead [--quick] [--steps 20] [--trl-steps 10] [--out DIR]``

All parts start from one warmed-up kk-tiny policy (seed 0) and the same data order, in one process:

1. **Components**: kk-tiny steps with plain GRPO and with adaptive sampling (balance) + ADORA; mean
   seconds per step of generation, scoring, the policy update, the advantage path (estimator + ADORA
   weights) and the sampler's own bookkeeping (rounds, exit rules, down-sampling), as fractions of the step.
2. **Floor**: the same first batch (prompts x n responses) through raw ``model.generate`` with the same
   decoding settings plus one forward/backward/AdamW step on the generated sequences (same micro-batch size), against the local
   backend's median GRPO step time.
3. **TRL**: TRL's ``GRPOTrainer`` on the same model, tokenizer, prompts, reward (the Logic-RL K&K reward)
   and batch shape (prompts x n, one update per batch, no KL, token-mean loss), against the local backend
   for the same number of steps: seconds per step and training reward over the last steps. Needs
   ``pip install -c requirements/constraints.txt -r requirements/bench.txt``; skipped with a note otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from adora_openrlhf.log_setup import setup_logging
from bench.common import VARIANTS, RunSpec, markdown_table, run_training, warm_start_dir, write_json

RECIPE = "kk-tiny"


def component_table(runs: dict[str, list[dict[str, Any]]]) -> tuple[list[list[str]], dict[str, dict[str, float]]]:
    keys = [
        ("generate", "time/generate_s"),
        ("score", "time/score_s"),
        ("update", "time/train_s"),
        ("advantages+ADORA", "time/advantage_s"),
        ("sampler bookkeeping", "time/sampler_overhead_s"),
    ]
    rows, stats = [], {}
    for variant, metrics in runs.items():
        steps = [m for m in metrics if "time/step_s" in m]
        step = statistics.fmean(m["time/step_s"] for m in steps)
        means = {name: statistics.fmean(m.get(key, 0.0) for m in steps) for name, key in keys}
        stats[variant] = {"step_s": step, **means}
        rows.append(
            [variant, f"{step:.3f}"] + [f"{means[name]:.4f} ({100 * means[name] / step:.2f}%)" for name, _ in keys]
        )
    return rows, stats


def raw_floor(model_dir: str, overrides: dict[str, Any], repeats: int) -> dict[str, float]:
    """Median seconds of raw transformers generate + one forward/backward/AdamW step on the first batch."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adora_openrlhf.prompt_templates import render_prompt
    from adora_openrlhf.recipes import build_run_config
    from adora_openrlhf.rows import batch_indices, load_run_rows

    cfg = build_run_config(RECIPE, {**overrides, "model.path": model_dir, "warmup.steps": 0})
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    train_rows, _ = load_run_rows(cfg.data, cfg.seed)
    rows = [train_rows[i] for i in batch_indices(0, cfg.prompts_per_step, len(train_rows), cfg.seed)]
    texts = [
        render_prompt(r.prompt, tokenizer, cfg.data.prompt_template) for r in rows for _ in range(cfg.sampling.n_keep)
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    gen_times, train_times = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                **batch,
                do_sample=True,
                temperature=cfg.rollout.temperature,
                top_p=cfg.rollout.top_p,
                top_k=0,
                max_new_tokens=cfg.rollout.max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                use_cache=True,
            )
        t1 = time.perf_counter()
        mask = (out != tokenizer.pad_token_id).long()
        mask[:, : batch["input_ids"].shape[1]] = batch["attention_mask"]
        total = mask[:, 1:].sum()
        for start in range(0, out.shape[0], cfg.train.micro_batch_size):  # same micro-batch size as the backend
            ids, m = out[start : start + cfg.train.micro_batch_size], mask[start : start + cfg.train.micro_batch_size]
            logits = model(input_ids=ids, attention_mask=m).logits[:, :-1]
            logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            (-(logp * m[:, 1:]).sum() / total).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        gen_times.append(t1 - t0)
        train_times.append(time.perf_counter() - t1)
    return {
        "generate_s": statistics.median(gen_times),
        "train_s": statistics.median(train_times),
        "floor_s": statistics.median(g + t for g, t in zip(gen_times, train_times, strict=True)),
        "sequences": len(texts),
    }


def run_trl(model_dir: str, overrides: dict[str, Any], steps: int, out: Path) -> dict[str, Any]:
    """TRL GRPOTrainer for ``steps`` steps on the local backend's first ``steps`` batches."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from adora_openrlhf.prompt_templates import render_prompt
    from adora_openrlhf.recipes import build_run_config
    from adora_openrlhf.rewards.kk import kk_reward
    from adora_openrlhf.rows import batch_indices, load_run_rows

    cfg = build_run_config(RECIPE, {**overrides, "model.path": model_dir, "warmup.steps": 0})
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    train_rows, _ = load_run_rows(cfg.data, cfg.seed)
    order = batch_indices(0, steps * cfg.prompts_per_step, len(train_rows), cfg.seed)
    data = Dataset.from_list(
        [
            {
                "prompt": render_prompt(train_rows[i].prompt, tokenizer, cfg.data.prompt_template),
                "label": train_rows[i].label,
                "names": train_rows[i].meta["names"],
            }
            for i in order
        ]
    )

    def reward(prompts, completions, label, names, **_):
        return [kk_reward(c, lab, {"names": nm}).reward for c, lab, nm in zip(completions, label, names, strict=True)]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self._t = [], 0.0

        def on_step_begin(self, args, state, control, **kw):
            self._t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self._t)

    timer = StepTimer()
    n = cfg.sampling.n_keep
    args = GRPOConfig(
        output_dir=str(out / "trl"),
        per_device_train_batch_size=cfg.prompts_per_step * n,
        num_generations=n,
        steps_per_generation=1,
        num_iterations=1,
        max_completion_length=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        learning_rate=cfg.train.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=cfg.train.weight_decay,
        max_grad_norm=cfg.train.max_grad_norm,
        beta=0.0,
        epsilon=cfg.train.clip_eps_low,
        loss_type="dapo",
        max_steps=steps,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        shuffle_dataset=False,
        seed=cfg.seed,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tokenizer, callbacks=[timer]
    )
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {"step_s": timer.times, "reward": rewards}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="local-backend RL steps per variant")
    parser.add_argument("--trl-steps", type=int, default=10, help="steps of the TRL comparison (both sides)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the raw floor measurement")
    parser.add_argument("--quick", action="store_true", help="a small check: 4 steps, 3 TRL steps, 150 warm-up steps")
    parser.add_argument("--out", default="bench/results/overhead")
    return parser


def _trl_comparison(init: str, from_init: dict[str, Any], trl_steps: int, out: Path) -> tuple[str, dict | None]:
    """(table, TRL's record) of the local backend's GRPO step against TRL's GRPOTrainer on the same start."""
    trl_table, trl_result = (
        "TRL not installed: pip install -c requirements/constraints.txt -r requirements/bench.txt",
        None,
    )
    if importlib.util.find_spec("trl") is not None:
        trl_result = run_trl(init, from_init, trl_steps, out)
        local = run_training(
            RunSpec("GRPO", 0, RECIPE, {**from_init, "steps": trl_steps}, str(out / "runs" / "GRPO_trl_match"))
        )["metrics"]
        local_steps = [m for m in local if "time/step_s" in m]
        last = max(1, min(3, trl_steps))
        local_s = statistics.median(m["time/step_s"] for m in local_steps)
        trl_s = statistics.median(trl_result["step_s"])
        trl_table = markdown_table(
            ["trainer", "s / step (median)", "ratio", f"train reward, mean of last {last} steps"],
            [
                [
                    "adora_openrlhf local (GRPO)",
                    f"{local_s:.2f}",
                    "1.00",
                    f"{statistics.fmean(m['reward/mean'] for m in local_steps[-last:]):.3f}",
                ],
                [
                    "TRL GRPOTrainer",
                    f"{trl_s:.2f}",
                    f"{trl_s / local_s:.2f}x",
                    f"{statistics.fmean(trl_result['reward'][-last:]):.3f}",
                ],
            ],
        )
    return trl_table, trl_result


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    setup_logging()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    steps, trl_steps = (4, 3) if args.quick else (args.steps, args.trl_steps)
    base: dict[str, Any] = {"save_every": 0, "eval_every": 0, "eval_samples": 0, "data.num_eval": 20}
    if args.quick:
        base["warmup.steps"] = 150
    out = Path(args.out)
    started = time.perf_counter()
    init = warm_start_dir(RECIPE, 0, base, out)
    from_init = {**base, "model.path": init, "warmup.steps": 0}

    variants = {"GRPO": VARIANTS["GRPO"], "Ada-balance+ADORA": VARIANTS["Ada-balance+ADORA"]}
    runs = {
        name: run_training(RunSpec(name, 0, RECIPE, {**from_init, **v, "steps": steps}, str(out / "runs" / name)))[
            "metrics"
        ]
        for name, v in variants.items()
    }
    comp_rows, comp_stats = component_table(runs)
    comp = markdown_table(
        ["variant", "step s", "generate", "score", "update", "advantages+ADORA", "sampler bookkeeping"], comp_rows
    )

    floor = raw_floor(init, from_init, args.repeats)
    grpo_steps = sorted(m["time/step_s"] for m in runs["GRPO"] if "time/step_s" in m)
    median_step = statistics.median(grpo_steps)
    floor_table = markdown_table(
        ["", "seconds", "ratio to floor"],
        [
            ["raw generate", f"{floor['generate_s']:.3f}", ""],
            ["raw forward/backward/step", f"{floor['train_s']:.3f}", ""],
            ["floor (sum)", f"{floor['floor_s']:.3f}", "1.00"],
            ["local backend GRPO step (median)", f"{median_step:.3f}", f"{median_step / floor['floor_s']:.2f}x"],
        ],
    )

    trl_table, trl_result = _trl_comparison(init, from_init, trl_steps, out)
    settings = {
        "recipe": RECIPE,
        "steps": steps,
        "trl_steps": trl_steps,
        "threads": torch.get_num_threads(),
        "total_wall_s": round(time.perf_counter() - started),
    }
    report = (
        f"settings: {settings}\n\n## Step components\n\n{comp}\n\n## Local step vs raw floor ({floor['sequences']} sequences)\n\n"
        f"{floor_table}\n\n## Local backend vs TRL GRPOTrainer\n\n{trl_table}\n"
    )
    (out / "table.md").write_text(report)
    write_json(
        out / "results.json",
        {"settings": settings, "components": comp_stats, "floor": floor, "grpo_step_s": grpo_steps, "trl": trl_result},
    )
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
