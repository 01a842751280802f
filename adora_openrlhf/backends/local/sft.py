"""Supervised warm-up: next-token loss on task demonstrations, response tokens only.

A random-init model scores the minimum reward on every response, so GRPO would see only zero-signal
groups. A short supervised phase on demonstrations teaches the answer format and some of the task, which
gives RL groups with mixed rewards to learn from.

Demonstrations come from a registry keyed by (row source, style) (:data:`DEMONSTRATIONS`). The K&K styles:

- ``direct``: ``<think>`` the roles in one line ``</think>`` then the answer (no reasoning shown);
- ``thorough``: guess-and-check reasoning that tests candidates against every statement step by step
  (``tasks.kk.thorough_trace``); long, and right whenever it is executed correctly;
- ``shortcut``: ``<think>guess.</think>`` and a random answer; short, and right only by luck;
- ``restate``: the whole quiz read back, then a guess and a random answer (``tasks.kk.restate_think``);
  right only by luck, but about as long as a short thorough trace, so that response length alone does not
  tell a checked answer from a guess.

The warm-up has two phases (:class:`~adora_openrlhf.config.WarmupConfig`): ``steps`` on one style, then
``mix_steps`` on a mixture of styles (``mix``: style -> share). The K&K testbed first teaches the thorough
trace alone, so that it is executed reliably, then mixes in shortcuts so that the warmed-up policy mostly
guesses: RL then has a behaviour to select (thorough reasoning, which is longer and right more often).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from adora_openrlhf.backends.local.update import pack, token_log_probs
from adora_openrlhf.config import ConfigError, WarmupConfig
from adora_openrlhf.registry import Registry

Demonstration = Callable[[Any, random.Random], str]  # (row, rng) -> response text (without the eos token)
# source -> (style -> builder): DEMONSTRATIONS.get(source).get(style), each level a Registry
DEMONSTRATIONS: Registry[Registry[Demonstration]] = Registry("demonstration source", "source")


# (source, style) pairs whose demonstration is drawn at random each time (e.g. a guessed answer): never cached
RANDOMISED_DEMONSTRATIONS: set[tuple[str, str]] = set()


def register_demonstration(source: str, style: str, randomised: bool = False) -> Callable[[Demonstration], Demonstration]:
    """Register ``fn(row, rng) -> response text`` as the ``style`` demonstration of rows of ``source``;
    ``randomised``: the text depends on ``rng``, so the warm-up draws it anew each time instead of caching it."""
    if source not in DEMONSTRATIONS:
        DEMONSTRATIONS.add(source, Registry("style", f"warmup.style (rows of source {source!r})"))
    if randomised:
        RANDOMISED_DEMONSTRATIONS.add((source, style))
    return DEMONSTRATIONS.get(source).register(style)


def _kk_names_statements(row: Any):
    from adora_openrlhf.tasks.kk import statements_from_json

    names, statements = row.meta.get("names"), row.meta.get("statements")
    if not names or statements is None or len(statements) != len(names):
        raise ConfigError(
            "warmup.style: K&K reasoning traces need meta.names and meta.statements in every row (generated puzzles and "
            "public K&K files with a 'statements' field have them); use --warmup.style direct for rows without statements"
        )
    return names, statements_from_json(statements)


@register_demonstration("kk", "direct")
def kk_direct(row: Any, rng: random.Random) -> str:
    """Logic-RL format answer for a K&K row, from ``meta`` names/solution (or the label alone)."""
    names, solution = row.meta.get("names"), row.meta.get("solution")
    if names and solution is not None and len(names) == len(solution):
        check = ", ".join(f"{n} {'knight' if s else 'knave'}" for n, s in zip(names, solution, strict=True))
    else:
        check = row.label.replace("\n", ", ")
    return f"<think>{check}.</think>\n<answer>{row.label}</answer>"


@register_demonstration("kk", "thorough")
def kk_thorough(row: Any, rng: random.Random) -> str:
    """Guess-and-check trace that tests candidates in a fixed order until one passes every statement."""
    from adora_openrlhf.tasks.kk import thorough_response

    return thorough_response(*_kk_names_statements(row))


@register_demonstration("kk", "shortcut", randomised=True)
def kk_shortcut(row: Any, rng: random.Random) -> str:
    """``<think>guess.</think>`` and a uniformly random assignment."""
    from adora_openrlhf.tasks.kk import shortcut_response

    return shortcut_response(row.meta.get("names") or _kk_names_statements(row)[0], rng)


@register_demonstration("kk", "restate", randomised=True)
def kk_restate(row: Any, rng: random.Random) -> str:
    """The whole quiz read back, ``guess.``, and a uniformly random assignment."""
    from adora_openrlhf.tasks.kk import restate_response

    return restate_response(*_kk_names_statements(row), rng)


# Response probes: name the behaviour a response shows (for the metrics), one per source.
ResponseProbe = Callable[[str], str]  # response text -> style name ("other" when none fits)


@dataclass(frozen=True)
class Probe:
    """A source's response probe and the styles it reports every time, seen or not."""

    fn: ResponseProbe
    styles: tuple[str, ...]


RESPONSE_PROBES: Registry[Probe] = Registry("response probe", "source")


def register_probe(source: str, styles: Sequence[str]) -> Callable[[ResponseProbe], ResponseProbe]:
    """Register ``fn(response text) -> style name`` as the probe of rows of ``source``."""

    def wrap(fn: ResponseProbe) -> ResponseProbe:
        RESPONSE_PROBES.add(source, Probe(fn, tuple(styles)))
        return fn

    return wrap


@register_probe("kk", styles=("thorough", "shortcut"))
def kk_probe(response: str) -> str:
    """``thorough``, ``shortcut`` or ``other`` (see ``tasks.kk.trace_kind``)."""
    from adora_openrlhf.tasks.kk import trace_kind

    return trace_kind(response)


def style_fractions(sources: Sequence[str], texts: Sequence[str], prefix: str) -> dict[str, float]:
    """``{prefix}thorough_fraction``, ``{prefix}shortcut_fraction`` ...: the share of responses whose probe names
    each style, over the responses whose source has a probe (empty when none has); the styles a probe was
    registered with are reported even when no response shows them."""
    kinds = [RESPONSE_PROBES.get(s).fn(t) for s, t in zip(sources, texts, strict=True) if s in RESPONSE_PROBES]
    if not kinds:
        return {}
    names = sorted(set(kinds).union(*(RESPONSE_PROBES.get(s).styles for s in set(sources) if s in RESPONSE_PROBES)))
    return {f"{prefix}{name}_fraction": kinds.count(name) / len(kinds) for name in names}


def kk_demonstration(row: Any) -> str:
    """The ``direct`` K&K demonstration (kept for callers that want the plain answer)."""
    return kk_direct(row, random.Random(0))


def demonstration_for(row: Any, style: str = "direct", rng: random.Random | None = None) -> str:
    """The ``style`` demonstration of ``row``; sources without builders fall back to ``meta.solution_text``."""
    if row.source in DEMONSTRATIONS:
        return DEMONSTRATIONS.get(row.source).get(style)(row, rng or random.Random(0))
    solution = row.meta.get("solution_text") if isinstance(row.meta, dict) else None
    if isinstance(solution, str) and solution.strip():
        return solution
    raise ConfigError(
        f"warmup.steps: no demonstration for rows of source {row.source!r} (no registered builder and no meta.solution_text); "
        "set --warmup.steps 0 for a model that already follows the answer format"
    )


def warmup_styles(cfg: WarmupConfig) -> list[str]:
    """Styles the warm-up uses (phase 1 style, then the mixture's styles with a positive share)."""
    styles: list[str] = []
    if cfg.steps > 0:
        styles = _mix_weights(cfg.style_shares)[0] if cfg.style_shares else [cfg.style]
    if cfg.mix_steps > 0:
        styles += [s for s, share in cfg.mix.items() if share > 0 and s not in styles]
    return styles


def lr_factor(step: int, steps: int, ramp: float) -> float:
    """The learning-rate multiplier of optimiser step ``step`` (0-based) of ``steps``: a linear rise over the
    first ``r = ceil(ramp * steps)`` steps, ``(step + 1) / r``, then a linear decay, ``(steps - step) / (steps - r)``,
    reaching ``1 / (steps - r)`` at the last step (``r = 0``: the decay alone, ``1 - step / steps``). When the rise
    takes every step (``r = steps``, e.g. one step with any ramp) there is no decay; 0 after the last step."""
    rise = math.ceil(ramp * steps)
    if step < rise:
        return (step + 1) / rise
    if rise == 0:
        return max(0.0, 1.0 - step / steps)
    return max(0.0, (steps - step) / max(1, steps - rise))


def _phase(
    model,
    tokenizer,
    prompt_ids,
    rows,
    steps: int,
    lr: float,
    batch_size: int,
    pick_style,
    rng: random.Random,
    micro_batch_size: int,
    desc: str,
    extras: Sequence[Any] | None = None,
    ramp: float = 0.0,
) -> list[float]:
    """``steps`` AdamW steps (lr schedule :func:`lr_factor`) on random batches of demonstrations; returns the
    losses. ``extras`` holds each row's extra model inputs (images) or is None for text rows."""
    device = next(model.parameters()).device
    cache: dict[tuple[int, str], list[int]] = {}  # deterministic styles are tokenized once per row

    def response_ids(i: int, style: str) -> list[int]:
        key = (i, style)
        if key in cache:
            return cache[key]
        ids = tokenizer(demonstration_for(rows[i], style, rng), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        if (rows[i].source, style) not in RANDOMISED_DEMONSTRATIONS:
            cache[key] = ids
        return ids

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, steps, ramp))
    losses: list[float] = []
    model.train()
    bar = tqdm(range(steps), desc=desc, unit="step", dynamic_ncols=True)
    for _ in bar:
        chosen = [rng.randrange(len(rows)) for _ in range(batch_size)]
        responses = [response_ids(i, pick_style()) for i in chosen]
        # micro-batches of similar length waste less compute on padding (the loss is a sum over tokens)
        order = sorted(range(len(chosen)), key=lambda j: len(prompt_ids[chosen[j]]) + len(responses[j]))
        chosen, responses = [chosen[j] for j in order], [responses[j] for j in order]
        batch = pack([prompt_ids[i] for i in chosen], responses, tokenizer.pad_token_id, [extras[i] for i in chosen] if extras is not None else None)
        optimizer.zero_grad(set_to_none=True)
        total_tokens = float(batch.action_mask.sum())
        step_loss = 0.0
        for start in range(0, len(chosen), micro_batch_size):
            rows_slice = slice(start, start + micro_batch_size)
            mask = batch.action_mask[rows_slice].to(device)
            width = int(batch.attention_mask[rows_slice].sum(-1).max())
            sub = type(batch)(
                batch.input_ids[rows_slice, :width].to(device),
                batch.attention_mask[rows_slice, :width].to(device),
                mask[:, : width - 1],
                batch.extras[rows_slice] if batch.extras is not None else None,
            )
            lp = token_log_probs(model, sub)
            loss = -(lp * sub.action_mask).sum() / total_tokens
            loss.backward()
            step_loss += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        if not math.isfinite(step_loss):
            raise FloatingPointError(f"warm-up loss is not finite ({step_loss}); lower --warmup.lr")
        losses.append(step_loss)
        bar.set_postfix(loss=f"{step_loss:.3f}")
    return losses


def supervised_warmup(
    model,
    tokenizer,
    prompt_ids: Sequence[Sequence[int]],
    rows: Sequence[Any],
    cfg: WarmupConfig,
    seed: int,
    micro_batch_size: int,
    extras: Sequence[dict[str, torch.Tensor] | None] | None = None,
) -> list[float]:
    """Both warm-up phases; returns the per-step losses (phase 1 then phase 2).

    Loss = mean over response tokens of ``-log p(token)`` (the eos token included, so the model learns to stop).
    Phase 1: ``cfg.steps`` steps on style ``cfg.style`` (or styles drawn from ``cfg.style_shares``). Phase 2: ``cfg.mix_steps`` steps where each
    demonstration's style is drawn from ``cfg.mix`` (shares normalised to sum to 1).
    """
    rng = random.Random(f"warmup:{seed}")
    losses: list[float] = []
    if cfg.steps > 0:
        if cfg.style_shares:
            first, first_weights = _mix_weights(cfg.style_shares)
            pick, name = (lambda: rng.choices(first, first_weights)[0]), "+".join(first)
        else:
            pick, name = (lambda: cfg.style), cfg.style
        losses += _phase(
            model, tokenizer, prompt_ids, rows, cfg.steps, cfg.lr, cfg.batch_size, pick, rng, micro_batch_size, f"warm-up (SFT, {name})", extras, cfg.lr_ramp
        )
    if cfg.mix_steps > 0:
        styles, weights = _mix_weights(cfg.mix)
        losses += _phase(
            model,
            tokenizer,
            prompt_ids,
            rows,
            cfg.mix_steps,
            cfg.mix_lr,
            cfg.batch_size,
            lambda: rng.choices(styles, weights)[0],
            rng,
            micro_batch_size,
            "warm-up (SFT, mixed)",
            extras,
            cfg.lr_ramp,
        )
    return losses


def _mix_weights(mix: Mapping[str, float]) -> tuple[list[str], list[float]]:
    styles = [s for s, w in mix.items() if w > 0]
    return styles, [float(mix[s]) for s in styles]
