"""Does a benchmark fit the model? One line per mismatch in the report, instead of a bare score.

A score near 0 can mean a weak model, or a benchmark whose prompts this model cannot read. Each check of
:data:`FIT_CHECKS` looks at one benchmark's rows, prompts and graded samples (:class:`FitContext`) and returns a
one-line note, or None when it sees nothing wrong:

- ``other_distribution``: the model comes from a local training run on its own generated rows (a tiny model of
  a local recipe) and the benchmark is not that run's held-out set;
- ``vocabulary``: prompts that the tokenizer cannot encode (they do not decode back to the same text, the
  whitespace aside: unknown tokens);
- ``context``: the longest prompt plus ``--max-new-tokens`` exceeds the model's context (its positions);
- ``system_dropped``: the model's prompt template (the compact one, or a tiny tokenizer's chat template that
  renders it) drops the prompts' system messages (not said of a run's own held-out set, which its trainer
  rendered the same way);
- ``foreign_names`` (K&K): at least :data:`MISFIT_SHARE` of the answered responses name people the puzzle does
  not contain;
- ``no_answer``: at least :data:`MISFIT_SHARE` of the responses give nothing the grader can read;
- ``truncated``: at least :data:`MISFIT_SHARE` of the responses reached the token limit without ending.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from adora_openrlhf.registry import Registry

MISFIT_SHARE = 0.5  # a response-level check speaks when at least this share of the responses shows the problem


@dataclass(frozen=True)
class PromptFit:
    """What the model's tokenizer and template make of a benchmark's prompts (:func:`prompt_fit`)."""

    prompts: int
    max_tokens: int  # the longest prompt, in tokens
    unencodable: tuple[str, ...]  # locations of prompts that do not round-trip through the tokenizer
    system_dropped: int  # prompts with a system message that the template leaves out


@dataclass(frozen=True)
class ModelOrigin:
    """The local training run a model directory belongs to (``evaluation/runs.py``)."""

    run_dir: str
    recipe: str | None
    generated_data: bool  # trained on rows the run generated itself (no data.train_path)


@dataclass(frozen=True)
class FitContext:
    bench: str
    rows: Sequence[Mapping[str, Any]]
    records: Sequence[Mapping[str, Any]]  # this benchmark's graded samples of these rows
    prompts: PromptFit | None
    max_new_tokens: int
    context_length: int | None
    origin: ModelOrigin | None
    is_run_heldout: bool  # the rows are the origin run's own held-out set


FitCheck = Callable[[FitContext], "str | None"]
FIT_CHECKS: Registry[FitCheck] = Registry("fit check", "eval fit checks")


def _squash(text: str) -> str:
    return "".join(text.split())


def prompt_fit(tokenizer, texts: Sequence[str], wheres: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> PromptFit:
    """:class:`PromptFit` of the rendered prompt ``texts`` of ``rows`` (located by ``wheres``) under ``tokenizer``."""
    unencodable, longest = [], 0
    for text, where in zip(texts, wheres, strict=True):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        longest = max(longest, len(ids))
        if _squash(tokenizer.decode(ids, skip_special_tokens=False)) != _squash(text):
            unencodable.append(where)
    dropped = 0
    for text, row in zip(texts, rows, strict=True):
        prompt = row.get("prompt")
        systems = (
            [m.get("content", "") for m in prompt if isinstance(m, Mapping) and m.get("role") == "system"]
            if isinstance(prompt, list)
            else []
        )
        dropped += any(s.strip() and _squash(s) not in _squash(text) for s in systems)
    return PromptFit(len(texts), longest, tuple(unencodable), dropped)


def fit_notes(ctx: FitContext) -> list[str]:
    """The notes of every check that finds a mismatch, in :data:`FIT_CHECKS` order."""
    notes = []
    for check in FIT_CHECKS.values():
        note = check(ctx)
        if note:
            notes.append(f"{ctx.bench}: {note}")
    return notes


@FIT_CHECKS.register("other_distribution")
def _other_distribution(ctx: FitContext) -> str | None:
    origin = ctx.origin
    if origin is None or not origin.generated_data or ctx.is_run_heldout:
        return None
    recipe = f"recipe {origin.recipe!r}" if origin.recipe else "a local recipe"
    return (
        f"the model was trained by the local run {origin.run_dir} ({recipe}) on rows it generated itself; these prompts "
        f"come from another distribution, so this score does not measure that training (the run's own held-out set: "
        f"python -m eval.run --run {origin.run_dir})"
    )


@FIT_CHECKS.register("vocabulary")
def _vocabulary(ctx: FitContext) -> str | None:
    fit = ctx.prompts
    if fit is None or not fit.unencodable:
        return None
    return f"the tokenizer cannot encode {len(fit.unencodable)} of {fit.prompts} prompts (they do not decode back to their text, e.g. {fit.unencodable[0]})"


@FIT_CHECKS.register("context")
def _context(ctx: FitContext) -> str | None:
    fit = ctx.prompts
    if fit is None or ctx.context_length is None or fit.max_tokens + ctx.max_new_tokens <= ctx.context_length:
        return None
    room = max(ctx.context_length - fit.max_tokens, 0)
    return (
        f"prompts of up to {fit.max_tokens} tokens plus --max-new-tokens {ctx.max_new_tokens} exceed the model's context of "
        f"{ctx.context_length} positions (--max-new-tokens {room} fits)"
    )


@FIT_CHECKS.register("system_dropped")
def _system_dropped(ctx: FitContext) -> str | None:
    fit = ctx.prompts
    if fit is None or not fit.system_dropped or ctx.is_run_heldout:  # the run's own rows: rendered as in training
        return None
    return f"the model's prompt template leaves out the system message of {fit.system_dropped} of {fit.prompts} prompts (it gets the user message only)"


_STATED = re.compile(r"\b([A-Z][A-Za-z'-]*)\s+is\s+(?:not\s+)?an?\s+(?:knight|knave)\b")


def stated_people(answer: str | None) -> set[str]:
    """Capitalised names that ``answer`` declares knights or knaves ("Alice is a knight", "Bob is not a knave")."""
    return set(_STATED.findall(answer or ""))


def _share_note(count: int, total: int) -> bool:
    return total > 0 and count >= MISFIT_SHARE * total


@FIT_CHECKS.register("foreign_names")
def _foreign_names(ctx: FitContext) -> str | None:
    from adora_openrlhf.rewards.kk import parse_kk_label

    answered = foreign = 0
    example = None
    for rec in ctx.records:
        if rec.get("source") != "kk":
            continue
        stated = stated_people(rec.get("extracted"))
        if not stated:
            continue
        try:
            people = set(parse_kk_label(str(rec["label"])))
        except (ValueError, KeyError):
            return None  # not K&K labels
        answered += 1
        strangers = sorted(stated - people)
        if strangers:
            foreign += 1
            example = example or (strangers[0], sorted(people))
    if example is None or not _share_note(foreign, answered):
        return None
    return (
        f"{foreign} of {answered} answered responses name people the puzzle does not contain (e.g. {example[0]!r} in a puzzle "
        f"about {', '.join(example[1])}): the model does not take the names from these prompts"
    )


@FIT_CHECKS.register("no_answer")
def _no_answer(ctx: FitContext) -> str | None:
    missing = [r for r in ctx.records if not str(r.get("extracted") or "").strip()]
    if not _share_note(len(missing), len(ctx.records)):
        return None
    snippet = " ".join(str(missing[0].get("response", "")).split())[:60]
    return f"{len(missing)} of {len(ctx.records)} responses give no answer the grader can read (e.g. {snippet!r})"


@FIT_CHECKS.register("truncated")
def _truncated(ctx: FitContext) -> str | None:
    cut = sum(bool(r.get("truncated")) for r in ctx.records)
    if not _share_note(cut, len(ctx.records)):
        return None
    return f"{cut} of {len(ctx.records)} responses reached --max-new-tokens {ctx.max_new_tokens} without ending"
