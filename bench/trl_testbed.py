"""``python -m bench.trl_testbed``: the kk-testbed RL phase with TRL's ``GRPOTrainer`` and ``AdoraGRPOTrainer``.

Per seed, from the kk-testbed warm start of that seed (:func:`bench.common.warm_start_dir`, the same policy the
local backend's benchmarks start from), the testbed's 40 RL steps run with:

- ``trl``: TRL's ``GRPOTrainer`` (``GRPO``);
- ``adora-trl``: :class:`~adora_openrlhf.integrations.trl.AdoraGRPOTrainer`, variants ``GRPO+ADORA`` (length rule,
  attenuate, the K&K reference's edge cases) and ``Ada-balance`` (adaptive sampling, balance exit rule, rounds of
  8, at most 2 rounds), the settings of :data:`bench.common.VARIANTS`;
- ``local``: the local backend's GRPO (``bench.common.run_training`` with ``FROM_WARM_START``).

Matched settings (the testbed's): 16 prompts x 8 completions per step in the local backend's data order of the
seed, temperature 1, top-p 1, no top-k, 400 new tokens, lr 1.5e-4 constant, AdamW betas (0.9, 0.999), weight decay
0, gradient clipping 1.0, PPO clip 0.2 with one update per batch, token-mean loss (TRL ``loss_type="dapo"``), no
KL (``beta=0``), the local backend's K&K reward (Logic-RL, ``correct_threshold`` 1.0). TRL generates the 128
completions of a step and trains in 4 micro-batches of 32 (one optimiser step per batch).

Generation (``--generation``): ``compact`` (default) gives the policy a ``generate`` that TRL calls as it calls
``model.generate`` (:func:`use_compact_decoding`), made of the local backend's compact decoding: the same logits
processors and sampling with TRL's generation config of the call (so adaptive sampling's escalated parameters
too), each completion drawn from the same distribution, but finished sequences leave the batch. ``generate`` keeps
``transformers``' ``model.generate``, which runs all 128 sequences of a step until the longest ends (one runaway
completion at the 400-token limit keeps the whole batch decoding): about 6x the local backend's time per step here,
so 4-6 hours for the nine TRL runs of seeds 0-2 on the 2-core machine.

Held-out greedy accuracy on the seed's 200 held-out puzzles, with the local backend's evaluation
(``engine/evaluate.py``), before the first step and after the last. Records (per run:
``acc_step0``, ``acc_final``, 2- and 3-person accuracy, thorough share of greedy answers, seconds per step,
completions generated, training reward and completion length per step) go to
``bench/results/trl_testbed/results.json`` and ``table.md``; run folders stay under ``--out``. A finished run
(its ``record.json`` with the same settings) is reused.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import (
    FROM_WARM_START,
    VARIANTS,
    RunSpec,
    gain_cells,
    markdown_table,
    read_records,
    run_training,
    save_records,
    warm_start_dir,
)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "trl_testbed"
RECIPE = "kk-testbed"
# (trainer, variant): what runs, in this order, for each seed
PLAN = [("local", "GRPO"), ("trl", "GRPO"), ("adora-trl", "GRPO+ADORA"), ("adora-trl", "Ada-balance")]
MICRO_BATCH = 32  # TRL's per_device_train_batch_size; 128 completions -> 4 accumulation steps, one optimiser step


def adora_fields(variant: str) -> dict[str, Any]:
    """The AdoraGRPOConfig fields of a bench.common variant (its dotted overrides, written with TRL's prefixes)."""
    fields = {}
    for dotted, value in VARIANTS[variant].items():
        section, name = dotted.split(".")
        fields[f"{section}_{name}"] = value
    return fields


def load_testbed(seed: int, model_dir: str, steps: int | None = None):
    """(run config, tokenizer, train rows, held-out rows, their reward functions) of the seed's testbed."""
    from adora_openrlhf.engine.rollout import make_reward_fns
    from adora_openrlhf.engine.tokenization import load_tokenizer
    from adora_openrlhf.recipes import build_run_config
    from adora_openrlhf.rows import load_run_rows

    overrides = {"steps": steps} if steps is not None else {}
    cfg = build_run_config(RECIPE, {**FROM_WARM_START, **overrides, "seed": seed, "model.path": model_dir})
    train_rows, eval_rows = load_run_rows(cfg.data, seed)
    tokenizer = load_tokenizer(model_dir)
    return cfg, tokenizer, train_rows, eval_rows, make_reward_fns(train_rows), make_reward_fns(eval_rows)


def held_out(model, tokenizer, cfg, eval_rows, eval_rewards) -> dict[str, float]:
    """The local backend's held-out evaluation (greedy) of ``model``."""
    import torch

    from adora_openrlhf.engine.evaluate import evaluate
    from adora_openrlhf.engine.rollout import GenerationSettings, encode_prompts
    from adora_openrlhf.prompt_templates import render_prompt

    ids = encode_prompts(
        tokenizer,
        [render_prompt(r.prompt, tokenizer, cfg.data.prompt_template) for r in eval_rows],
        cfg.data.max_prompt_tokens,
        "eval",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed * 100_003)
        return evaluate(
            model, tokenizer, ids, eval_rows, eval_rewards, cfg.rollout, 0, GenerationSettings.of(cfg.model)
        )


GENERATIONS = ("compact", "generate")


def use_compact_decoding(model, pad_token_id: int) -> None:
    """Give ``model`` a ``generate(input_ids, attention_mask, generation_config)`` made of compact decoding
    (``engine/decoding.py``) that returns what ``model.generate`` returns: the left-padded prompts followed
    by the completions, each ending at its eos, padded with ``pad_token_id`` to the longest. Sampling follows the
    call's generation config (temperature, top-p, top-k, min-p, repetition penalty, max new tokens; greedy when
    ``do_sample`` is off) with ``torch.multinomial`` on the global generator, as ``model.generate`` samples."""
    import torch

    from adora_openrlhf.algorithms.sampling import SamplingParams
    from adora_openrlhf.engine.rollout import compact_decode_batch

    def generate(input_ids=None, attention_mask=None, generation_config=None, **kwargs):
        if kwargs:
            raise TypeError(f"compact generate: unexpected arguments {sorted(kwargs)} (text prompts only)")
        config = generation_config
        eos = (
            config.eos_token_id[0]
            if isinstance(config.eos_token_id, (list, tuple)) and len(config.eos_token_id) == 1
            else config.eos_token_id
        )
        if not isinstance(eos, int):
            raise ValueError(f"compact generate: one eos token id is needed, got {config.eos_token_id!r}")
        params = SamplingParams(
            temperature=config.temperature if config.do_sample else 1.0,
            top_p=config.top_p if config.top_p is not None else 1.0,
            top_k=config.top_k if config.top_k else -1,
            min_p=config.min_p or 0.0,
            repetition_penalty=config.repetition_penalty or 1.0,
            max_new_tokens=config.max_new_tokens,
        )
        rows, width = input_ids.shape
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                decoded = compact_decode_batch(
                    model, input_ids, attention_mask, params, (eos, pad_token_id), greedy=not config.do_sample
                )
        finally:
            model.train(was_training)
        longest = max(len(ids) for ids, _ in decoded)
        out = torch.full((rows, width + longest), pad_token_id, dtype=input_ids.dtype, device=input_ids.device)
        out[:, :width] = input_ids
        for row, (ids, _) in enumerate(decoded):
            out[row, width : width + len(ids)] = torch.tensor(ids, dtype=input_ids.dtype)
        return out

    model.generate = generate


def trl_args(cfg, run_dir: Path, seed: int) -> dict[str, Any]:
    """TRL GRPOConfig arguments that reproduce the local backend's RL step of ``cfg`` (group-normalised rewards,
    token-level loss, no KL, constant learning rate, the same sampling), run on the CPU without saving."""
    return dict(
        output_dir=str(run_dir / "trl"),
        per_device_train_batch_size=MICRO_BATCH,
        gradient_accumulation_steps=cfg.prompts_per_step * cfg.sampling.n_keep // MICRO_BATCH,
        num_generations=cfg.sampling.n_keep,
        num_iterations=1,
        max_completion_length=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        top_k=0,
        learning_rate=cfg.train.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=cfg.train.weight_decay,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=cfg.train.max_grad_norm,
        beta=0.0,
        epsilon=cfg.train.clip_eps_low,
        loss_type="dapo",
        scale_rewards="group",
        max_steps=cfg.steps,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        shuffle_dataset=False,
        seed=seed,
        disable_tqdm=True,
        remove_unused_columns=False,
    )


def _trainer(trainer_kind: str, variant: str, cfg: Any, model, reward, common: dict[str, Any], data, tokenizer):
    """TRL's GRPOTrainer (``trl``) or the drop-in AdoraGRPOTrainer with ``variant``'s fields, on the same inputs."""
    if trainer_kind == "trl":
        from trl import GRPOConfig, GRPOTrainer

        return GRPOTrainer(
            model=model, reward_funcs=reward, args=GRPOConfig(**common), train_dataset=data, processing_class=tokenizer
        )
    else:
        from adora_openrlhf.integrations.trl import AdoraGRPOConfig, AdoraGRPOTrainer

        args = AdoraGRPOConfig(**common, correct_threshold=cfg.adora.correct_threshold, **adora_fields(variant))
        return AdoraGRPOTrainer(
            model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tokenizer
        )


def run_trl(
    trainer_kind: str,
    variant: str,
    seed: int,
    model_dir: str,
    run_dir: Path,
    steps: int | None = None,
    generation: str = "compact",
) -> dict[str, Any]:
    """One TRL run of the testbed's RL phase from the warm start; its record."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from adora_openrlhf.prompt_templates import render_prompt
    from adora_openrlhf.rows import batch_indices
    from adora_openrlhf.tasks.behaviours import style_fractions

    cfg, tokenizer, train_rows, eval_rows, train_rewards, eval_rewards = load_testbed(seed, model_dir, steps)
    order = batch_indices(0, cfg.steps * cfg.prompts_per_step, len(train_rows), seed)
    texts = {i: render_prompt(train_rows[i].prompt, tokenizer, cfg.data.prompt_template) for i in set(order)}
    for text in list(texts.values())[:3]:  # TRL tokenizes text prompts with special tokens on: they must add none
        assert tokenizer(text)["input_ids"] == tokenizer(text, add_special_tokens=False)["input_ids"], (
            "the tokenizer adds special tokens"
        )
    data = Dataset.from_list([{"prompt": texts[i], "row_index": i} for i in order])

    def reward(prompts, completions, row_index, log_metric=None, **_):
        """The local backend's reward of each row (Logic-RL K&K), and the share of thorough completions."""
        if log_metric is not None:
            for name, value in style_fractions(
                [train_rows[i].source for i in row_index], list(completions), "response/"
            ).items():
                log_metric(name, value)
        return [
            float(train_rewards[i](c, train_rows[i].label, train_rows[i].meta).reward)
            for c, i in zip(completions, row_index, strict=True)
        ]

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    before = held_out(model, tokenizer, cfg, eval_rows, eval_rewards)
    common = trl_args(cfg, run_dir, seed)
    trainer = _trainer(trainer_kind, variant, cfg, model, reward, common, data, tokenizer)
    if generation == "compact":
        use_compact_decoding(trainer.model, tokenizer.pad_token_id)
    start = time.time()
    trainer.train()
    wall = time.time() - start
    after = held_out(trainer.model, tokenizer, cfg, eval_rows, eval_rewards)
    steps = [h for h in trainer.state.log_history if "reward" in h]
    (run_dir / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1) + "\n")
    return {
        "trainer": trainer_kind,
        "variant": variant,
        "seed": seed,
        "generation": generation,
        "acc_step0": before["eval/greedy_accuracy"],
        "acc_final": after["eval/greedy_accuracy"],
        "eval_step0": before,
        "eval_final": after,
        "wall_s": round(wall, 1),
        "step_s": wall / max(len(steps), 1),
        "responses": int(
            sum(h.get("sampling/responses_generated", cfg.prompts_per_step * cfg.sampling.n_keep) for h in steps)
        ),
        "train_reward": [h["reward"] for h in steps],
        "completion_length": [h.get("completions/mean_length") for h in steps],
        "thorough_fraction": [h.get("response/thorough_fraction") for h in steps],
    }


def run_local(variant: str, seed: int, model_dir: str, run_dir: Path, steps: int | None = None) -> dict[str, Any]:
    """The local backend's run of the variant from the same warm start; its record."""
    overrides = {
        **FROM_WARM_START,
        **VARIANTS[variant],
        "model.path": model_dir,
        **({"steps": steps} if steps is not None else {}),
    }
    run = run_training(RunSpec(variant, seed, RECIPE, overrides, str(run_dir / "run"), reuse=True))
    evals = [r for r in run["metrics"] if "eval/greedy_accuracy" in r]
    steps = [r for r in run["metrics"] if "reward/mean" in r]
    return {
        "trainer": "local",
        "variant": variant,
        "seed": seed,
        "acc_step0": evals[0]["eval/greedy_accuracy"],
        "acc_final": evals[-1]["eval/greedy_accuracy"],
        "eval_step0": {k: v for k, v in evals[0].items() if k.startswith("eval/")},
        "eval_final": {k: v for k, v in evals[-1].items() if k.startswith("eval/")},
        "curve": [(r["step"], r["eval/greedy_accuracy"]) for r in evals],
        "wall_s": round(run["summary"]["wall_time_s"], 1),
        "step_s": sum(r["time/step_s"] for r in steps) / max(len(steps), 1),
        "responses": int(sum(r.get("sampling/responses_generated", 0) for r in steps)),
        "train_reward": [r["reward/mean"] for r in steps],
        "completion_length": [r["response/length_mean"] for r in steps],
        "thorough_fraction": [r.get("response/thorough_fraction") for r in steps],
    }


def run_one(
    trainer_kind: str,
    variant: str,
    seed: int,
    model_dir: str,
    out: Path,
    steps: int | None = None,
    generation: str = "compact",
) -> dict[str, Any]:
    run_dir = out / trainer_kind / f"{variant}_seed{seed}"
    settings = {
        "trainer": trainer_kind,
        "variant": variant,
        "seed": seed,
        "model": model_dir,
        "micro_batch": MICRO_BATCH,
        "steps": steps,
    }
    if trainer_kind != "local":
        settings["generation"] = generation
    path = run_dir / "record.json"
    if path.exists() and (found := json.loads(path.read_text())).get("settings") == settings:
        return found
    run_dir.mkdir(parents=True, exist_ok=True)
    runner = run_local if trainer_kind == "local" else functools.partial(run_trl, trainer_kind, generation=generation)
    record = runner(variant, seed, model_dir, run_dir, steps)
    record["settings"] = settings
    path.write_text(json.dumps(record, indent=2) + "\n")
    return record


def table(records: list[dict[str, Any]]) -> str:
    """One row per (trainer, variant, TRL generation): per-seed accuracy at step 0 and 40, the gain (mean ± 95% interval), step time."""
    rows = []
    for trainer_kind, variant, generation in dict.fromkeys(
        (r["trainer"], r["variant"], r.get("generation")) for r in records
    ):
        runs = [
            r
            for r in records
            if r["trainer"] == trainer_kind and r["variant"] == variant and r.get("generation") == generation
        ]
        rows.append(
            [
                trainer_kind if generation is None else f"{trainer_kind} ({generation})",
                variant,
                *gain_cells(runs),
                f"{sum(r['step_s'] for r in runs) / len(runs):.1f}",
                f"{sum(r['responses'] for r in runs) / len(runs):.0f}",
            ]
        )
    header = [
        "trainer",
        "variant",
        "seeds",
        "acc step 0",
        "acc step 40",
        "gain per seed",
        "gain (mean ± 95%)",
        "s / step",
        "completions",
    ]
    return markdown_table(header, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trl_testbed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--runs",
        nargs="+",
        default=[f"{t}:{v}" for t, v in PLAN],
        help="TRAINER:VARIANT pairs (trainers: local, trl, adora-trl)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "trl_testbed", help="warm starts and run folders")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--steps", type=int, default=None, help="RL steps (default: the testbed's 40)")
    parser.add_argument(
        "--warm-start", default="{}", help="JSON overrides of the warm start (default none: the testbed's own)"
    )
    parser.add_argument(
        "--generation",
        choices=GENERATIONS,
        default="compact",
        help="TRL runs: compact decoding as the policy's generate, or transformers' model.generate",
    )
    args = parser.parse_args(argv)
    plan = [tuple(item.split(":", 1)) for item in args.runs]
    for trainer_kind, variant in plan:
        if (
            trainer_kind not in ("local", "trl", "adora-trl")
            or variant not in VARIANTS
            or (trainer_kind == "trl" and variant != "GRPO")
        ):
            parser.error(
                f"--runs: {trainer_kind}:{variant} is not a run this benchmark makes (trl runs GRPO only; variants: {sorted(VARIANTS)})"
            )
    records = read_records(args.results)
    for seed in args.seeds:
        model_dir = warm_start_dir(RECIPE, seed, json.loads(args.warm_start), args.out)
        for trainer_kind, variant in plan:
            print(f"[trl_testbed] {trainer_kind} {variant} seed {seed}", file=sys.stderr, flush=True)
            record = run_one(trainer_kind, variant, seed, model_dir, args.out, args.steps, args.generation)
            records = save_records(args.results, records, record, ("trainer", "variant", "seed"), table)
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
