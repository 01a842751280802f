"""A synthetic visual task drawn with PIL, in the Geometry3K row schema (images, prompt, label, choices).

Each row is one small image (``IMAGE_SIZE`` x ``IMAGE_SIZE`` pixels, white background, flat-coloured circles,
squares and triangles that never touch) and one question about it. Four question kinds (registry
:data:`TASKS`):

* ``count``: "How many red shapes are there?"; label the number (``answer_type`` ``integer``).
* ``most``: "Which colour has the most shapes?"; multiple choice over the colours in the image, label the
  colour (one colour has strictly the most shapes).
* ``larger``: "Which is larger, the red shape or the blue shape?"; multiple choice over the two colours,
  label the colour of the larger shape (same kind; radii differ by at least ``max(1, 4 - level)`` pixels).

Difficulty ``level`` 1..4 (``meta.difficulty``) adds shapes, distractor colours and closer sizes, so some
prompts are solved by a weak policy and others are not. The label is computed from the list of drawn
shapes, so it is right by construction; the tests recount it from the pixels.

Every row has ``meta.solution_text``: a short ``<think>`` line stating what the image shows, then the
answer in ``<answer>`` tags (the reward's format). Generation is a pure function of the seed: the same seed
gives the same rows and the same pixels.

Warm-up demonstrations (declared on the task, looked up by ``tasks/behaviours.py``; styles for ``warmup.style`` / ``style_shares`` / ``mix``):

* ``read`` (alias ``direct``, the default): the row's solution text, the image read into the think, then the
  answer (``<think>blue square, red circle.</think>`` and ``<answer>red</answer>``);
* ``guess`` (drawn anew each time): ``<think>guess.</think>`` and a uniformly random choice (a free-form
  count: a random number from 0 to 4), right 1 / (number of choices) of the time whatever the image;
* ``default``: ``<think>guess.</think>`` and always the first choice (a count: 0), a fixed answer that ignores
  the image (``geo-testbed``'s shortcut: a policy trained on random guesses leans its greedy guess towards the
  colour it sees, docs/local_backend.md).

The response probe names a response ``read`` (its think names at least one colour), ``guess`` (its think is
``guess.``) or ``other``; the trainer logs the shares (``response/read_fraction``, ``eval/greedy_guess_fraction``).

``python -m data_prep.geo_synth`` writes the rows as JSONL with PNG files. The benchmark subsets of a row are
:func:`subsets` (``task=KIND``, ``level=L``).
"""

from __future__ import annotations

import json
import logging
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from adora_openrlhf.config_checks import check_choice, check_field_types, check_number, option, require
from adora_openrlhf.tasks.task import Probe

logger = logging.getLogger(__name__)
SOURCE = "geo_synth"
IMAGE_SIZE = 64
IMAGE_TAG = "<image>"
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (230, 190, 20),
}
KINDS = ("circle", "square", "triangle")
LEVELS = (1, 2, 3, 4)
GAP = 2  # pixels between the bounding boxes of any two shapes


@dataclass(frozen=True)
class Shape:
    kind: str
    colour: str
    x: int  # centre
    y: int
    r: int  # half the side of the bounding box

    @property
    def box(self) -> tuple[int, int, int, int]:
        return (self.x - self.r, self.y - self.r, self.x + self.r, self.y + self.r)


def place_shapes(rng: random.Random, specs: Sequence[tuple[str, str, int]], size: int = IMAGE_SIZE) -> list[Shape]:
    """Shapes ``(kind, colour, r)`` at random positions whose boxes keep ``GAP`` pixels apart (retried until they fit)."""
    for _ in range(200):
        placed: list[Shape] = []
        for kind, colour, r in specs:
            for _ in range(100):
                x, y = rng.randint(r + 1, size - r - 2), rng.randint(r + 1, size - r - 2)
                s = Shape(kind, colour, x, y, r)
                if all(_apart(s, o) for o in placed):
                    placed.append(s)
                    break
            else:
                break
        if len(placed) == len(specs):
            return placed
    raise ValueError(f"cannot place {len(specs)} shapes on a {size}x{size} image; use fewer or smaller shapes")


def _apart(a: Shape, b: Shape) -> bool:
    ax0, ay0, ax1, ay1 = a.box
    bx0, by0, bx1, by1 = b.box
    return ax1 + GAP < bx0 or bx1 + GAP < ax0 or ay1 + GAP < by0 or by1 + GAP < ay0


def draw(shapes: Sequence[Shape], size: int = IMAGE_SIZE):
    """The RGB image of ``shapes`` (flat colours, no anti-aliasing)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), (255, 255, 255))
    pen = ImageDraw.Draw(image)
    for s in shapes:
        fill = COLOURS[s.colour]
        x0, y0, x1, y1 = s.box
        if s.kind == "circle":
            pen.ellipse((x0, y0, x1, y1), fill=fill)
        elif s.kind == "square":
            pen.rectangle((x0, y0, x1, y1), fill=fill)
        else:
            pen.polygon([(s.x, y0), (x1, y1), (x0, y1)], fill=fill)
    return image


# ---------------------------------------------------------------------------------------------------------
# Question kinds: rng, level -> (shapes, question, label, choices or None, think line)
# ---------------------------------------------------------------------------------------------------------

Task = Callable[[random.Random, int], tuple[list[Shape], str, str, list[str] | None, str]]
TASKS: dict[str, Task] = {}


def register_task(name: str) -> Callable[[Task], Task]:
    def wrap(fn: Task) -> Task:
        TASKS[name] = fn
        return fn

    return wrap


def _counts_line(shapes: Sequence[Shape]) -> str:
    counts = {c: sum(s.colour == c for s in shapes) for c in COLOURS}
    return ", ".join(f"{c} {n}" for c, n in counts.items() if n)


def _radius(rng: random.Random) -> int:
    return rng.randint(4, 6)


@register_task("count")
def count_task(rng: random.Random, level: int):
    """Target colour 0..level+1 times, plus level distractor shapes of other colours."""
    target = rng.choice(list(COLOURS))
    k = rng.randint(0 if level > 1 else 1, level + 1)
    others = [c for c in COLOURS if c != target][: max(1, level - 1)]
    specs = [(rng.choice(KINDS), target, _radius(rng)) for _ in range(k)]
    specs += [(rng.choice(KINDS), rng.choice(others), _radius(rng)) for _ in range(level)]
    rng.shuffle(specs)
    shapes = place_shapes(rng, specs)
    return shapes, f"How many {target} shapes are there?", str(k), None, f"{_counts_line(shapes)}."


@register_task("most")
def most_task(rng: random.Random, level: int):
    """min(level + 1, 4) colours; the most common one has one more shape than the runner-up."""
    colours = rng.sample(list(COLOURS), min(level + 1, len(COLOURS)))
    top = rng.randint(2, 3)
    counts = {c: rng.randint(1, top - 1) for c in colours[1:]}
    counts[colours[0]] = top
    specs = [(rng.choice(KINDS), c, 4) for c, n in counts.items() for _ in range(n)]
    rng.shuffle(specs)
    shapes = place_shapes(rng, specs)
    choices = sorted(colours, key=list(COLOURS).index)
    return shapes, "Which colour has the most shapes?", colours[0], choices, f"{_counts_line(shapes)}."


@register_task("colour")
def colour_task(rng: random.Random, level: int):
    """One shape of the asked kind, plus level - 1 distractors of the other kinds in the other colours; multiple
    choice over all colours, label the colour of the shape of the asked kind."""
    kind, colour = rng.choice(KINDS), rng.choice(list(COLOURS))
    other_kinds = [k for k in KINDS if k != kind]
    other_colours = [c for c in COLOURS if c != colour]
    specs = [(kind, colour, _radius(rng))] + [
        (rng.choice(other_kinds), rng.choice(other_colours), _radius(rng)) for _ in range(level - 1)
    ]
    shapes = place_shapes(rng, specs)
    seen = ", ".join(f"{s.colour} {s.kind}" for s in sorted(shapes, key=lambda s: s.x))
    return shapes, f"What colour is the {kind}?", colour, list(COLOURS), f"{seen}."


@register_task("larger")
def larger_task(rng: random.Random, level: int):
    """Two shapes of one kind and two colours, radii differing by at least max(1, 4 - level) pixels; level - 1 small
    distractors of the other colours."""
    big, small = rng.sample(list(COLOURS), 2)
    r_small = rng.randint(3, 5)
    r_big = r_small + rng.randint(max(1, 4 - level), 5 - min(level, 3))
    kind = rng.choice(KINDS)
    specs = [(kind, big, r_big), (kind, small, r_small)]
    spare = [c for c in COLOURS if c not in (big, small)]
    specs += [(rng.choice(KINDS), rng.choice(spare), 3) for _ in range(level - 1)]
    rng.shuffle(specs)
    shapes = place_shapes(rng, specs)
    first, second = sorted((big, small), key=list(COLOURS).index)
    return (
        shapes,
        f"Which is larger, the {first} shape or the {second} shape?",
        big,
        [first, second],
        f"{big} big, {small} small.",
    )


def make_row(rng: random.Random, task: str, level: int) -> dict[str, Any]:
    """One row (image as a PIL image in ``images``) of question kind ``task`` at ``level``."""
    shapes, question, label, choices, think = TASKS[task](rng, level)
    meta: dict[str, Any] = {
        "task": task,
        "difficulty": level,
        "shapes": [[s.kind, s.colour, s.x, s.y, s.r] for s in shapes],
    }
    if choices is None:
        meta.update(question_type="free_form", answer_type="integer")
        prompt = f"{IMAGE_TAG}{question}"
    else:
        meta.update(
            question_type="multi_choice",
            answer_type="text",
            choices=choices,
            answer_letter="ABCD"[choices.index(label)],
        )
        prompt = f"{IMAGE_TAG}{question} Choices: {', '.join(choices)}."
    meta["solution_text"] = f"<think>{think}</think>\n<answer>{label}</answer>"
    return {"prompt": prompt, "label": label, "images": [draw(shapes)], "source": SOURCE, "meta": meta}


def generate_rows(
    count: int, seed: int, tasks: Sequence[str] = tuple(TASKS), levels: Sequence[int] = LEVELS
) -> list[dict[str, Any]]:
    """``count`` rows cycling over ``tasks`` x ``levels``; a pure function of the arguments."""
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        raise ValueError(f"tasks: unknown question kind(s) {unknown}; choose from {sorted(TASKS)}")
    if not tasks or not levels or not all(1 <= lv <= 4 for lv in levels):
        raise ValueError(f"levels: each must be in 1..4, got {list(levels)}")
    rng = random.Random(f"geo_synth:{seed}")
    combos = [(t, lv) for lv in levels for t in tasks]
    return [make_row(rng, *combos[i % len(combos)]) for i in range(count)]


GUESS_THINK = "guess."
COLOUR_WORD = re.compile(rf"\b({'|'.join(COLOURS)})\b")  # any colour name as a word (the probe's sign of reading)
MAX_GUESSED_COUNT = 4  # a guessed answer to a free-form count question is a number from 0 to this


def read_demonstration(row: Any, rng: random.Random) -> str:
    """The row's ``meta.solution_text``: what the image shows in the think, then the label."""
    return row.meta["solution_text"]


def guess_demonstration(row: Any, rng: random.Random) -> str:
    """``<think>guess.</think>`` and a uniformly random choice (a count: 0 to :data:`MAX_GUESSED_COUNT`)."""
    choices = row.meta.get("choices")
    answer = rng.choice(choices) if choices else str(rng.randint(0, MAX_GUESSED_COUNT))
    return f"<think>{GUESS_THINK}</think>\n<answer>{answer}</answer>"


def default_demonstration(row: Any, rng: random.Random) -> str:
    """``<think>guess.</think>`` and always the first choice (a count: 0), whatever the image: a fixed default answer."""
    choices = row.meta.get("choices")
    return f"<think>{GUESS_THINK}</think>\n<answer>{choices[0] if choices else 0}</answer>"


def response_style(response: str) -> str:
    """``read`` when the response's think names a colour, ``guess`` when the think is ``guess.``, else ``other``
    (the probe of geo_synth rows)."""
    start, end = response.find("<think>"), response.find("</think>")
    if start < 0 or end < start:
        return "other"
    think = response[start + len("<think>") : end].strip()
    if think == GUESS_THINK:
        return "guess"
    return "read" if COLOUR_WORD.search(think) else "other"


# The warm-up's demonstration styles of geo_synth rows (read = direct: the solution text); guess is random.
DEMONSTRATION_STYLES = {
    "read": read_demonstration,
    "direct": read_demonstration,
    "guess": guess_demonstration,
    "default": default_demonstration,
}
RANDOMISED_STYLES = ("guess",)
PROBE = Probe(response_style, ("read", "guess"))  # the styles reported in every step's metrics


def _signature(row: dict[str, Any]) -> str:
    return json.dumps([row["prompt"], row["meta"]["shapes"]])


@dataclass
class GeoDataConfig:
    """``data.geo``: the shape images task ``geometry`` generates when no ``data.train_path`` is given."""

    tasks: list[str] = option(
        factory=lambda: ["count", "most", "larger"], help="question kinds of the generated images"
    )
    levels: list[int] = option(
        factory=lambda: [1, 2, 3, 4],
        help="difficulty levels 1..4 of the generated images (more shapes, distractors, closer sizes)",
    )

    def __post_init__(self) -> None:
        check_field_types(self, "data.geo")
        require(
            isinstance(self.tasks, list) and bool(self.tasks),
            "data.geo.tasks",
            f"must be a non-empty list of tasks from {list(TASKS)}, got {self.tasks!r}",
        )
        for i, task in enumerate(self.tasks):
            check_choice(task, tuple(TASKS), f"data.geo.tasks[{i}]", "geometry task")
        require(
            isinstance(self.levels, list) and bool(self.levels),
            "data.geo.levels",
            f"must be a non-empty list of levels 1..4, got {self.levels!r}",
        )
        for i, level in enumerate(self.levels):
            check_number(level, f"data.geo.levels[{i}]", integer=True, ge=1, le=4)


def generate_splits(
    num_train: int, num_eval: int, seed: int, tasks: Sequence[str] = tuple(TASKS), levels: Sequence[int] = LEVELS
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out) rows with no image in common (held-out drawn from its own seed stream)."""
    held = generate_rows(num_eval, seed * 7919 + 104_729, tasks, levels)
    seen = {_signature(r) for r in held}
    train = [r for r in generate_rows(num_train + num_eval, seed, tasks, levels) if _signature(r) not in seen][
        :num_train
    ]
    return train, held


def subsets(row: dict[str, Any]) -> list[str]:
    """A generated row's benchmark subsets: its question kind and difficulty level."""
    meta = row.get("meta") or {}
    return [f"task={meta['task']}", f"level={meta['difficulty']}"] if "task" in meta and "difficulty" in meta else []
