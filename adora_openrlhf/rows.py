"""Training and held-out rows for the local backend, their reward functions, and the data order.

Rows follow the project's JSONL schema ``{"prompt", "label", "images", "source", "meta"}``. With no
``data.train_path`` and task ``kk`` the rows are generated K&K puzzles (``tasks/kk.py``), with task
``geometry`` generated images (``tasks/geo_synth.py``); train and eval share no puzzle or image. A local
``.jsonl``/``.json``/``.parquet`` file is read by :mod:`adora_openrlhf.datafiles` (errors name ``file:line``,
lines counted from 1); a name that is not a file path is loaded from the hub with ``datasets.load_dataset``.
Every row is checked at load time, before a run writes anything: prompt, label, meta, images (each file
decoded; relative paths were resolved against the data file's folder by :mod:`adora_openrlhf.datafiles`), a
known reward source, a label the source's reward can parse (:data:`LABEL_CHECKS`) and the meta fields the
reward reads (:data:`ROW_CHECKS`: a K&K label against the prompt's names and ``meta.statements``, a math
row's ``reward_style``/``answer_scope``/``grader_timeout_s``, a visual row's question and answer types);
errors name ``file:line: field``. A row is identified by its prompt and the content of its images
(:func:`row_key`): duplicate rows are reported, and held-out rows never repeat a training row (overlapping
held-out rows are dropped, with a warning). :func:`rows_fingerprint` is the content hash a checkpoint keeps
so that ``--resume`` notices data edited in place.

The data order is a pure function of (seed, position): position ``i`` (the i-th prompt the run consumes)
maps to epoch ``i // N`` and to entry ``i % N`` of that epoch's seeded permutation, so a resumed run
continues with exactly the prompts the uninterrupted run would have used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adora_openrlhf.config import ConfigError, DataConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Row:
    prompt: Any  # chat messages or a string
    label: str
    source: str
    meta: dict[str, Any]
    where: str = field(default="", compare=False)  # "file:line" (or "generated train:N") for error messages
    images: tuple[Any, ...] = ()  # image file paths or PIL images, one per <image> tag of the prompt (vision rows)
    key: str = field(default="", compare=False)  # row_identity(prompt, images); computed when not given

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(self, "key", row_identity(self.prompt, [_digest_or_name(ref) for ref in self.images]))


def image_digest(ref: Any) -> str:
    """A content hash of one image (a file path or a PIL image): SHA-256 of its size and RGB pixels, so the same
    picture has the same digest in memory, as PNG or as another lossless file. Raises what PIL raises for a
    file that is missing, not an image, or damaged."""
    from PIL import Image

    if isinstance(ref, Image.Image):
        rgb = ref.convert("RGB")
    else:
        with Image.open(ref) as image:
            rgb = image.convert("RGB")
    digest = hashlib.sha256(f"{rgb.size[0]}x{rgb.size[1]}:".encode())
    digest.update(rgb.tobytes())
    return digest.hexdigest()[:32]


def _digest_or_name(ref: Any) -> str:
    try:
        return image_digest(ref)
    except Exception:  # noqa: BLE001 - an unreadable image is reported by validate_rows; here it is only named
        return f"unreadable:{ref!r}"


def row_identity(prompt: Any, image_digests: Sequence[str]) -> str:
    """What makes two rows the same problem: the prompt and the content of its images (``repr(prompt)`` alone
    for a text row, so text rows keep the identity earlier versions saved in checkpoints)."""
    return repr(prompt) if not image_digests else f"{prompt!r} images:{','.join(image_digests)}"


def _load_path(path: str, option: str) -> tuple[list[dict[str, Any]], list[int], str]:
    """(rows, their 1-based lines, location prefix) of a local file or a hub dataset (split ``train``)."""
    from adora_openrlhf.datafiles import load_rows as load_row_source

    loaded = load_row_source(path, what=f"{option} file", option=option)
    return loaded.rows, loaded.numbers, loaded.where  # hub rows: "NAME:ROW", rows numbered from 1


def _kk_label_ok(label: str, meta: dict[str, Any]) -> None:
    from adora_openrlhf.rewards.kk import parse_kk_label

    names = meta.get("names")
    parse_kk_label(label, names if isinstance(names, list) and names else None)


# reward source -> check that raises ValueError when that reward cannot parse the label (checked at load time)
LABEL_CHECKS: dict[str, Callable[[str, dict[str, Any]], None]] = {"kk": _kk_label_ok}


class RowFieldError(ValueError):
    """A row field whose value the row's reward cannot use; ``field`` names it (``label``, ``meta.names``, ...)."""

    def __init__(self, field_name: str, message: str):
        super().__init__(message)
        self.field = field_name


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


def _kk_row_ok(prompt: Any, label: str, meta: dict[str, Any]) -> None:
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
    roles = parse_kk_label(label, names or None)  # LABEL_CHECKS reported a label that does not parse
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


def _math_row_ok(prompt: Any, label: str, meta: dict[str, Any]) -> None:
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


def _geometry_row_ok(prompt: Any, label: str, meta: dict[str, Any]) -> None:
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


RowCheck = Callable[[Any, str, dict[str, Any]], None]  # (prompt, label, meta) -> None; raises RowFieldError


def _row_checks() -> dict[str, RowCheck]:
    from adora_openrlhf.rewards.math import MATH_SOURCES

    checks: dict[str, RowCheck] = {"kk": _kk_row_ok}
    checks.update({source: _math_row_ok for source in MATH_SOURCES})
    checks.update({source: _geometry_row_ok for source in ("geometry3k", "mathvista", "geo_synth")})
    return checks


# reward source -> check of the fields its reward reads, beyond parsing the label (checked at load time)
ROW_CHECKS: dict[str, RowCheck] = _row_checks()


def _checked_image_digest(ref: Any, at: str) -> str:
    """:func:`image_digest` of one ``images`` entry; ConfigError ``AT: what is wrong`` when it is not a readable image."""
    if not isinstance(ref, str) and not hasattr(ref, "convert"):
        raise ConfigError(f"{at}: expected an image file path, got {type(ref).__name__}")
    if isinstance(ref, str) and not Path(ref).is_file():
        raise ConfigError(f"{at}: no image file at {ref!r} (a relative path is read from the data file's folder)")
    try:
        return image_digest(ref)
    except Exception as err:  # noqa: BLE001 - PIL raises OSError, UnidentifiedImageError, DecompressionBombError, SyntaxError...
        reason = " ".join(str(err).split())[:160] or type(err).__name__
        raise ConfigError(
            f"{at}: the image file {ref!r} cannot be decoded ({reason}); it is damaged or not an image: replace it"
        ) from None


MAX_LABEL_CHARS = 4096  # a ground-truth answer longer than this is refused at load (no task's answer comes near it)


def validate_rows(
    raw: Sequence[dict[str, Any]], where: str, default_source: str, lines: Sequence[int] | None = None
) -> list[Row]:
    """Rows from raw dicts; a malformed row raises ``WHERE:LINE: field 'name': what is wrong`` (``lines``: each
    row's 1-based line in its file; default: its 1-based position)."""
    from adora_openrlhf.rewards.base import get_reward_fn

    rows = []
    for i, r in enumerate(raw):
        at = f"{where}:{lines[i] if lines is not None else i + 1}"
        if not isinstance(r, dict):
            raise ConfigError(f"{at}: expected a JSON object, got {type(r).__name__}")
        prompt = r.get("prompt")
        if not (isinstance(prompt, str) and prompt.strip()) and not (isinstance(prompt, list) and prompt):
            raise ConfigError(f"{at}: field 'prompt': missing or empty (a string or a list of chat messages)")
        if isinstance(prompt, list) and not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt
        ):
            raise ConfigError(
                f'{at}: field \'prompt\': a list prompt must hold chat messages {{"role": text, "content": text}}'
            )
        label = r.get("label")
        if label is None or isinstance(label, (dict, list, bool)) or str(label).strip() == "":
            raise ConfigError(f"{at}: field 'label': missing, empty or not text (the ground-truth answer)")
        if len(str(label)) > MAX_LABEL_CHARS:
            raise ConfigError(
                f"{at}: field 'label': {len(str(label))} characters, more than the {MAX_LABEL_CHARS} a ground-truth answer may have "
                "(the graders would fail on it at every sample); put the answer alone in the label"
            )
        meta = r.get("meta") or {}
        if not isinstance(meta, dict):
            raise ConfigError(f"{at}: field 'meta': expected an object, got {type(meta).__name__}")
        images = r.get("images") or []
        if not isinstance(images, (list, tuple)):
            raise ConfigError(f"{at}: field 'images': expected a list of image paths, got {type(images).__name__}")
        digests = [_checked_image_digest(ref, f"{at}: field 'images[{k}]'") for k, ref in enumerate(images)]
        source = str(r.get("source") or default_source)
        try:
            get_reward_fn(source)
        except KeyError as err:
            raise ConfigError(f"{at}: field 'source': {err.args[0]}") from None
        check = LABEL_CHECKS.get(source)
        if check is not None:
            try:
                check(str(label), meta)
            except ValueError as err:
                raise ConfigError(f"{at}: field 'label': the {source!r} reward cannot parse it ({err})") from None
        row_check = ROW_CHECKS.get(source)
        if row_check is not None:
            try:
                row_check(prompt, str(label), meta)
            except RowFieldError as err:
                raise ConfigError(f"{at}: field '{err.field}': {err}") from None
        key = row_identity(prompt, digests)
        rows.append(
            Row(prompt=prompt, label=str(label), source=source, meta=meta, where=at, images=tuple(images), key=key)
        )
    if not rows:
        raise ConfigError(f"{where}: no rows")
    return rows


def _warn(message: str) -> None:
    logger.warning(message)


def _report_duplicates(rows: Sequence[Row], where: str) -> None:
    seen: dict[tuple[str, str], int] = {}
    repeats = []
    for i, row in enumerate(rows):
        key = (row_key(row), row.label)
        if key in seen:
            repeats.append((i, seen[key]))
        else:
            seen[key] = i
    if repeats:
        first, original = repeats[0]
        _warn(
            f"{rows[first].where}: duplicate row (same prompt, images and label as {rows[original].where}); {len(repeats)} duplicates in {where}"
        )


def _without_overlap(train: list[Row], held: list[Row], option: str) -> list[Row]:
    """Held-out rows that are not training rows (same prompt and images; with a warning when some are dropped)."""
    train_keys = {row_key(r) for r in train}
    kept = [r for r in held if row_key(r) not in train_keys]
    if not kept:
        raise ConfigError(
            f"{option}: every held-out row is also a training row (same prompt and images); give held-out rows that are not in the training data"
        )
    if len(kept) < len(held):
        _warn(
            f"{option}: dropped {len(held) - len(kept)} held-out rows that are also training rows (same prompt and images)"
        )
    return kept


def load_run_rows(cfg: DataConfig, seed: int) -> tuple[list[Row], list[Row]]:
    """(train rows, held-out rows) for ``cfg``; held-out prompts never appear among the training prompts. K&K rows
    get ``meta["kk_parser"] = cfg.kk_parser`` unless they name one."""
    train, held = _load_rows(cfg, seed)
    for row in (*train, *held):
        if row.source == "kk":
            row.meta.setdefault("kk_parser", cfg.kk_parser)
    return train, held


def _load_rows(cfg: DataConfig, seed: int) -> tuple[list[Row], list[Row]]:
    held: list[Row] | None = None
    if cfg.eval_path is not None:
        raw, lines, where = _load_path(cfg.eval_path, "data.eval_path")
        held = validate_rows(raw, where, cfg.task, lines)
    if cfg.train_path is None and cfg.task == "geometry":
        from adora_openrlhf.tasks.geo_synth import generate_splits as geo_splits

        train_raw, eval_raw = geo_splits(cfg.num_train, cfg.num_eval, seed, cfg.geo_tasks, cfg.geo_levels)
        train = validate_rows(train_raw, "generated train", cfg.task)
        if held is None:
            return train, validate_rows(eval_raw, "generated eval", cfg.task)
        return train, _without_overlap(train, held, "data.eval_path")
    if cfg.train_path is None:
        if cfg.task != "kk":
            raise ConfigError(
                f"data.train_path: task {cfg.task!r} has no generator; give a JSONL file (see data_prep/)"
            )
        from adora_openrlhf.tasks.kk import generate_splits

        try:
            train_raw, eval_raw = generate_splits(
                cfg.num_train,
                cfg.num_eval,
                cfg.kk_num_people,
                seed,
                name_pool=cfg.kk_name_pool,
                name_order=cfg.kk_name_order,
            )
        except (ValueError, RuntimeError) as err:  # e.g. more puzzles asked for than exist for these people counts
            raise ConfigError(
                f"data.num_train: cannot generate {cfg.num_train} + {cfg.num_eval} puzzles for kk_num_people {cfg.kk_num_people} ({err})"
            ) from None
        train = validate_rows(train_raw, "generated train", cfg.task)
        if held is None:
            return train, validate_rows(eval_raw, "generated eval", cfg.task)
        return train, _without_overlap(train, held, "data.eval_path")
    raw, lines, where = _load_path(cfg.train_path, "data.train_path")
    train = validate_rows(raw, where, cfg.task, lines)
    _report_duplicates(train, where)
    if held is not None:
        return train, _without_overlap(train, held, "data.eval_path")[: cfg.num_eval]
    if len(train) < 2:
        raise ConfigError(
            "data.train_path: need at least 2 rows to hold some out for evaluation (or give data.eval_path)"
        )
    k = min(cfg.num_eval, len(train) // 2)
    held = train[-k:]
    held_keys = {row_key(r) for r in held}
    train = [r for r in train[:-k] if row_key(r) not in held_keys]  # a held-out row is never also trained on
    if not train:
        raise ConfigError(
            "data.train_path: no training rows left after holding out evaluation rows (the file repeats one problem); give data.eval_path"
        )
    return train, held


def epoch_permutation(num_rows: int, seed: int, epoch: int) -> list[int]:
    order = list(range(num_rows))
    random.Random(f"data-order:{seed}:{epoch}").shuffle(order)
    return order


def batch_indices(position: int, count: int, num_rows: int, seed: int) -> list[int]:
    """Row indices of data positions ``position .. position + count - 1`` (see the module docstring)."""
    if num_rows < 1:
        raise ValueError("num_rows: the training set is empty")
    out, cache = [], {}
    for i in range(position, position + count):
        epoch = i // num_rows
        if epoch not in cache:
            cache[epoch] = epoch_permutation(num_rows, seed, epoch)
        out.append(cache[epoch][i % num_rows])
    return out


def row_key(row: Row) -> str:
    """A stable identity of a problem across steps (the sampler's history pool, duplicate and overlap checks):
    its prompt and the content of its images (:func:`row_identity`)."""
    return row.key


def rows_fingerprint(rows: Sequence[Row]) -> dict[str, Any]:
    """``{"rows": count, "sha256": hex}``: a hash of every row's identity (prompt and image contents), label,
    source and meta, in order. Equal for the same rows however the file is laid out; different when any row's
    content, or the order of the rows, changes."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps([row.key, row.label, row.source, row.meta], sort_keys=True, default=repr).encode())
        digest.update(b"\n")
    return {"rows": len(rows), "sha256": digest.hexdigest()}


def reward_fn_for(row: Row):
    from adora_openrlhf.rewards.base import get_reward_fn

    try:
        return get_reward_fn(row.source)
    except KeyError as err:
        raise ConfigError(f"data: {err.args[0]}") from None


def first_bad_prompt(lengths: Sequence[int], limit: int) -> int | None:
    for i, n in enumerate(lengths):
        if n > limit:
            return i
    return None
