"""The load-time checks of the built-in tasks' rows (registered with each task in ``tasks/builtin.py``).

Beyond the common schema (``rows.py``), a row is checked for what its reward reads: a K&K label that parses and
grades the prompt's puzzle (names, ``meta.solution``, ``meta.num_people``, ``meta.statements``), a math row's
``reward_style``/``answer_scope``/``grader_timeout_s``, a visual row's question and answer types, choices and
precision. Each check raises :class:`~adora_openrlhf.tasks.registry.RowFieldError` naming the field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from adora_openrlhf.tasks.task import RowFieldError


def kk_label_ok(label: str, meta: dict[str, Any]) -> None:
    from adora_openrlhf.rewards.kk import parse_kk_label

    names = meta.get("names")
    parse_kk_label(label, names if isinstance(names, list) and names else None)


def user_text(prompt: Any) -> str:
    """What the user asks: a string prompt, or the contents of a chat prompt's user messages joined by newlines
    (a system message's example answer is not part of the puzzle)."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(
        str(m.get("content", "")) for m in prompt if isinstance(m, Mapping) and m.get("role", "user") == "user"
    )


def _mentions(text: str, name: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text) is not None


def kk_row_ok(prompt: Any, label: str, meta: dict[str, Any]) -> None:
    """A known ``meta.kk_parser`` and a boolean ``meta.think_opened_in_prompt`` when given, and a K&K label that
    grades the prompt's puzzle: one role for each of ``meta.names`` (when given; the label's own names
    otherwise), every one of them a name the prompt's user messages mention, in agreement with
    ``meta.solution`` and ``meta.num_people`` when given, and consistent with ``meta.statements`` when given
    (person ``i`` is a knight exactly when statement ``i`` is true under the label's roles)."""
    from adora_openrlhf.rewards.kk import KK_PARSERS, parse_kk_label

    parser = meta.get("kk_parser")
    if parser is not None and parser not in KK_PARSERS:
        raise RowFieldError(
            "meta.kk_parser", f"unknown K&K answer parser {parser!r}; choose one of {sorted(KK_PARSERS)}"
        )
    _think_flag_ok(meta)
    names = meta.get("names")
    if names is not None and not (
        isinstance(names, list)
        and names
        and all(isinstance(n, str) and n.strip() for n in names)
        and len(set(names)) == len(names)
    ):
        raise RowFieldError("meta.names", f"expected a list of distinct names, got {names!r}")
    roles = parse_kk_label(label, names or None)  # the label check refused a label that does not parse
    people = list(names) if names else list(roles)
    if names:
        try:
            stated = list(parse_kk_label(label))
        except ValueError:  # not the canonical "(k) Name is a knight" lines: the names alone were checked
            stated = people
        extra = [n for n in stated if n not in names]
        if extra:
            raise RowFieldError("label", f"gives roles to {extra}, who are not in meta.names {names}")
    missing = [n for n in people if not _mentions(user_text(prompt), n)]
    if missing:
        raise RowFieldError(
            "label", f"names {missing}, whom the prompt does not mention; the label belongs to another puzzle"
        )
    count = meta.get("num_people")
    if count is not None and count != len(people):
        raise RowFieldError("meta.num_people", f"{count!r}, but the label has {len(people)} people")
    solution = meta.get("solution")
    if solution is not None:
        if not (
            isinstance(solution, list) and len(solution) == len(people) and all(isinstance(x, bool) for x in solution)
        ):
            raise RowFieldError("meta.solution", f"expected {len(people)} booleans (true = knight), got {solution!r}")
        if solution != [roles[n] for n in people]:
            raise RowFieldError("meta.solution", f"{solution} disagrees with the label {label!r}")
    if meta.get("statements") is not None:
        _kk_statements_ok(meta["statements"], people, [roles[n] for n in people])


def _think_flag_ok(meta: dict[str, Any]) -> None:
    if "think_opened_in_prompt" in meta and not isinstance(meta["think_opened_in_prompt"], bool):
        raise RowFieldError(
            "meta.think_opened_in_prompt", f"expected true or false, got {meta['think_opened_in_prompt']!r}"
        )


def _kk_statements_ok(statements: Any, people: Sequence[str], assignment: Sequence[bool]) -> None:
    from adora_openrlhf.tasks.kk import evaluate, statements_from_json

    if not isinstance(statements, list) or len(statements) != len(people):
        raise RowFieldError(
            "meta.statements", f"expected one statement per person ({len(people)}), got {statements!r:.120}"
        )
    try:
        parsed = statements_from_json(statements)
        truth = [evaluate(st, assignment) for st in parsed]
    except (ValueError, TypeError, IndexError, KeyError) as err:
        raise RowFieldError(
            "meta.statements",
            f"not a statement list of the K&K task's form (tasks/kk.py) ({type(err).__name__}: {err})",
        ) from None
    wrong = [
        f"{name} ({'knight' if role else 'knave'}) says something {'false' if role else 'true'}"
        for name, role, said in zip(people, assignment, truth, strict=True)
        if said != role
    ]
    if wrong:
        raise RowFieldError("label", f"contradicts meta.statements: under its roles {'; '.join(wrong)}")


_NUMBER_IN_TEXT = re.compile(r"[-+]?(?:\d+(?:,\d{3})*(?:\.\d*)?|\.\d+)")
GEOMETRY_QUESTION_TYPES = ("free_form", "multi_choice")
GEOMETRY_ANSWER_TYPES = ("text", "integer", "float", "list")


def _positive_seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _meta_one_of(meta: dict[str, Any], key: str, default: str, choices: list[str]) -> str:
    """``meta[key]`` (``default`` when absent), which must be one of ``choices``; RowFieldError naming ``meta.<key>``."""
    value = meta.get(key, default)
    if value not in choices:
        raise RowFieldError(f"meta.{key}", f"expected one of {choices}, got {value!r}")
    return value


def math_row_ok(prompt: Any, label: str, meta: dict[str, Any]) -> None:
    """The meta fields the math reward reads (``rewards/math.py``): ``reward_style`` one of its styles,
    ``answer_scope`` one of its scopes, ``grader_timeout_s`` a finite number of seconds > 0."""
    from adora_openrlhf.rewards.math import ANSWER_SCOPES, REWARD_STYLES, math_config_for

    _meta_one_of(meta, "reward_style", "math_verify", sorted(REWARD_STYLES))
    _meta_one_of(meta, "answer_scope", "after_think", list(ANSWER_SCOPES))
    if "grader_timeout_s" in meta and not _positive_seconds(meta["grader_timeout_s"]):
        raise RowFieldError(
            "meta.grader_timeout_s", f"must be a finite number of seconds > 0, got {meta['grader_timeout_s']!r}"
        )
    try:
        math_config_for(meta)
    except (ValueError, TypeError) as err:
        raise RowFieldError("meta", str(err)) from None


def geometry_row_ok(prompt: Any, label: str, meta: dict[str, Any]) -> None:
    """The meta fields the visual-math reward reads (``rewards/geometry.py``): a boolean ``think_opened_in_prompt``,
    ``question_type`` and
    ``answer_type`` from its lists, ``choices`` a list of texts (and for a multiple-choice question one of them
    the label), ``precision`` a whole number >= 0, and a number in the label of an integer or float answer."""
    from adora_openrlhf.rewards.geometry import choice_index

    _think_flag_ok(meta)
    question_type = _meta_one_of(meta, "question_type", "free_form", list(GEOMETRY_QUESTION_TYPES))
    answer_type = _meta_one_of(meta, "answer_type", "text", list(GEOMETRY_ANSWER_TYPES))
    choices = meta.get("choices")
    if choices is not None and not (isinstance(choices, list) and all(isinstance(c, str) for c in choices)):
        raise RowFieldError("meta.choices", f"expected a list of option texts, got {choices!r:.120}")
    if question_type == "multi_choice" and choices and choice_index(label, choices) is None:
        raise RowFieldError("label", f"{label!r} is none of meta.choices {choices}")
    precision = meta.get("precision")
    whole = (
        isinstance(precision, (int, float))
        and not isinstance(precision, bool)
        and precision >= 0
        and float(precision).is_integer()
    )
    if precision is not None and not whole:
        raise RowFieldError("meta.precision", f"expected a whole number of decimals >= 0, got {precision!r}")
    if (
        answer_type in ("integer", "float")
        and not (question_type == "multi_choice" and choices)
        and not _NUMBER_IN_TEXT.search(label)
    ):
        raise RowFieldError("label", f"{label!r} holds no number, but meta.answer_type is {answer_type!r}")
