"""The Knights-and-Knaves (K&K) task: puzzle logic, the generator, the testbed's demonstrations and the rows.

Every inhabitant is a knight (always tells the truth) or a knave (always lies). Person ``i`` says one
statement ``S_i`` about the others; an assignment ``x`` (``x[i] = True`` for a knight) is consistent when
``x[i] == eval(S_i, x)`` for every ``i``. A puzzle is kept only when exactly one of the ``2**n``
assignments is consistent (checked by exhaustive search in :func:`solve`).

Statements are nested tuples, the same shape as the public K&K data's ``statements`` field:

* ``("telling-truth", j)`` -- "P_j is a knight";  ``("lying", j)`` -- "P_j is a knave"
* ``("not", s)``, ``("and", s1, s2, ...)``, ``("or", s1, s2, ...)``
* ``("->", s1, s2)`` (implication), ``("<=>", s1, s2)`` (equivalence)

Rows follow the project's one JSONL schema:
``{"prompt": [chat messages], "label": solution_text, "source": "kk", "meta": {"num_people", "names", "solution"}}``.
The reward is ``rewards/kk.py``; the benchmark subsets of a row are :func:`subsets` (``ppl=N``, ``ID``/``OOD``);
the warm-up's demonstrations of a row and the response probe, built on the traces here, are ``kk_demonstrations.py``.
``python -m data_prep.kk`` writes generated rows to JSONL files and converts the public K&K files.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from adora_openrlhf.config_checks import check_choice, check_field_types, check_number, option, require
from adora_openrlhf.rewards.kk import KK_PARSERS

logger = logging.getLogger(__name__)

Statement = tuple  # nested tuple, see the module docstring

SOURCE = "kk"
MIN_PEOPLE, MAX_PEOPLE = 2, 8

# A fixed pool of short, distinct, single-token-ish names; no name is a prefix-word of another.
NAMES: tuple[str, ...] = (
    "Alice",
    "Bob",
    "Carol",
    "David",
    "Emma",
    "Frank",
    "Grace",
    "Henry",
    "Irene",
    "Jack",
    "Kate",
    "Liam",
    "Mia",
    "Noah",
    "Olivia",
    "Paul",
    "Quinn",
    "Rose",
    "Sam",
    "Tina",
    "Uma",
    "Victor",
    "Wendy",
    "Xavier",
    "Yara",
    "Zoe",
)

ROLE_WORD = {True: "knight", False: "knave"}

KK_SYSTEM_PROMPT = (
    "You are a helpful assistant. The assistant first thinks about the reasoning process in the mind and "
    "then provides the user with the answer. The reasoning process and answer are enclosed within "
    "<think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning process here "
    "</think><answer> answer here </answer>. Now the user asks you to solve a logical reasoning problem. "
    "After thinking, when you finally reach a conclusion, clearly state the identity of each character "
    "within <answer> </answer> tags, one per line, i.e., <answer> (1) Alice is a knight\n(2) Bob is a knave "
    "</answer>."
)


# ----------------------------------------------------------------------------------------------------------
# Logic: evaluation and exhaustive solving
# ----------------------------------------------------------------------------------------------------------


def evaluate(statement: Statement, assignment: Sequence[bool]) -> bool:
    """Truth value of ``statement`` under ``assignment`` (``assignment[j]`` is True when person j is a knight)."""
    op = statement[0]
    if op == "telling-truth":
        return bool(assignment[statement[1]])
    if op == "lying":
        return not assignment[statement[1]]
    if op == "not":
        return not evaluate(statement[1], assignment)
    if op == "and":
        return all(evaluate(s, assignment) for s in statement[1:])
    if op == "or":
        return any(evaluate(s, assignment) for s in statement[1:])
    if op == "->":
        return (not evaluate(statement[1], assignment)) or evaluate(statement[2], assignment)
    if op == "<=>":
        return evaluate(statement[1], assignment) == evaluate(statement[2], assignment)
    raise ValueError(f"statements: unknown operator {op!r}; expected telling-truth, lying, not, and, or, -> or <=>")


def solve(statements: Sequence[Statement], num_people: int) -> list[tuple[bool, ...]]:
    """All consistent assignments, by exhaustive search over the ``2**num_people`` knight/knave assignments.

    ``x`` is consistent iff ``x[i] == evaluate(statements[i], x)`` for every speaker ``i`` (a knight's
    statement is true, a knave's false).
    """
    if len(statements) != num_people:
        raise ValueError(f"statements: expected one statement per person ({num_people}), got {len(statements)}")
    solutions = []
    for assignment in itertools.product((True, False), repeat=num_people):
        if all(assignment[i] == evaluate(statements[i], assignment) for i in range(num_people)):
            solutions.append(tuple(assignment))
    return solutions


# ----------------------------------------------------------------------------------------------------------
# Generation
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KKPuzzle:
    names: tuple[str, ...]  # inhabitants in quiz order
    statements: tuple[Statement, ...]  # statements[i] is what names[i] says
    quiz: str  # natural-language rendering of the puzzle
    solution: tuple[bool, ...]  # the unique consistent assignment, True = knight

    @property
    def num_people(self) -> int:
        return len(self.names)

    @property
    def solution_text(self) -> str:
        """Canonical answer: one ``(k) Name is a knight/knave`` line per person, in quiz order."""
        return format_solution(self.names, self.solution)


def format_solution(names: Sequence[str], solution: Sequence[bool]) -> str:
    return "\n".join(
        f"({k}) {name} is a {ROLE_WORD[bool(role)]}"
        for k, (name, role) in enumerate(zip(names, solution, strict=True), 1)
    )


def _random_leaf(speaker: int, num_people: int, rng: random.Random) -> Statement:
    target = rng.choice([j for j in range(num_people) if j != speaker])
    return (rng.choice(("telling-truth", "lying")), target)


def _random_statement(speaker: int, num_people: int, rng: random.Random) -> Statement:
    """One statement about others: an identity claim, its negation, or a binary connective of two claims."""
    kind = rng.choices(("leaf", "not", "and", "or", "->", "<=>"), weights=(3, 1, 2, 2, 1, 1))[0]
    if kind == "leaf":
        return _random_leaf(speaker, num_people, rng)
    if kind == "not":
        return ("not", _random_leaf(speaker, num_people, rng))
    first = _random_leaf(speaker, num_people, rng)
    second = _random_leaf(speaker, num_people, rng)
    while second[1] == first[1] and num_people > 2:  # two claims about the same person are rarely informative
        second = _random_leaf(speaker, num_people, rng)
    return (kind, first, second)


def render_statement(statement: Statement, names: Sequence[str]) -> str:
    """Plain-English rendering; operands of connectives are always identity claims, so no bracketing is needed."""
    op = statement[0]
    if op == "telling-truth":
        return f"{names[statement[1]]} is a knight"
    if op == "lying":
        return f"{names[statement[1]]} is a knave"
    if op == "not":
        return f"it is false that {render_statement(statement[1], names)}"
    if op in ("and", "or"):
        return f" {op} ".join(render_statement(s, names) for s in statement[1:])
    if op == "->":
        return f"if {render_statement(statement[1], names)} then {render_statement(statement[2], names)}"
    if op == "<=>":
        return f"{render_statement(statement[1], names)} if and only if {render_statement(statement[2], names)}"
    raise ValueError(f"statements: unknown operator {op!r}")


def render_people_and_statements(names: Sequence[str], statements: Sequence[Statement]) -> str:
    """The middle of the quiz text: who is met and what each one says."""
    lines = [f"You meet {len(names)} inhabitants: {', '.join(names[:-1])} and {names[-1]}."]
    for name, statement in zip(names, statements, strict=True):
        text = render_statement(statement, names)
        lines.append(f'{name} says: "{text[0].upper()}{text[1:]}."')
    return " ".join(lines)


def render_quiz(names: Sequence[str], statements: Sequence[Statement]) -> str:
    """Compact quiz text (the tiny CPU model has a short context)."""
    return f"Knights always tell the truth and knaves always lie. {render_people_and_statements(names, statements)} Who is a knight and who is a knave?"


NAME_ORDERS = ("random", "pool")


@dataclass
class KKDataConfig:
    """``data.kk``: the puzzles task ``kk`` generates when no ``data.train_path`` is given, and the answer parser
    that grades every K&K row of the run."""

    num_people: list[int] = option(
        factory=lambda: [2, 3],
        help="people per generated puzzle, cycled: [2, 2, 3] = two 2-person puzzles per 3-person one",
    )
    name_pool: int = option(
        26,
        "generated puzzles draw their names from the first k of 26 names (a small pool eases copying for a tiny model)",
    )
    name_order: str = option(
        "random",
        "generated puzzles list their names in random order or in pool order ('pool': Alice before Bob before Carol)",
    )
    parser: str = option(
        "lenient",
        "answer parser: 'lenient' (phrasing variants such as 'Name: knight') or 'logic_rl' "
        "(Logic-RL's role-count rule and 'Name is a knight' statements exactly); a row's meta.kk_parser wins",
    )

    def __post_init__(self) -> None:
        check_field_types(self, "data.kk")
        require(
            isinstance(self.num_people, list) and len(self.num_people) > 0,
            "data.kk.num_people",
            f"must be a non-empty list of people counts such as [2, 3], got {self.num_people!r}",
        )
        for i, people in enumerate(self.num_people):
            check_number(people, f"data.kk.num_people[{i}]", integer=True, ge=2, le=8)
        check_choice(self.name_order, NAME_ORDERS, "data.kk.name_order", "name order")
        check_number(self.name_pool, "data.kk.name_pool", integer=True, ge=max(self.num_people), le=26)
        check_choice(self.parser, tuple(KK_PARSERS), "data.kk.parser", "K&K answer parser")


def generate_puzzle(
    num_people: int,
    rng: random.Random,
    max_tries: int = 10_000,
    name_pool: int = len(NAMES),
    name_order: str = "random",
) -> KKPuzzle:
    """A fresh puzzle with exactly one solution: sample statements until :func:`solve` finds a unique one.

    Names are drawn from the first ``name_pool`` entries of :data:`NAMES`; with ``name_order="pool"`` the
    inhabitants are listed in pool order (Alice before Bob before Carol). A small pool in pool order spares a
    tiny model most of the copying of names from the prompt, so its capacity goes to the logic."""
    if name_order not in NAME_ORDERS:
        raise ValueError(f"name_order: must be one of {list(NAME_ORDERS)}, got {name_order!r}")
    if not MIN_PEOPLE <= num_people <= MAX_PEOPLE:
        raise ValueError(f"num_people: must be in {MIN_PEOPLE}..{MAX_PEOPLE}, got {num_people}")
    if not num_people <= name_pool <= len(NAMES):
        raise ValueError(
            f"name_pool: must be in {num_people}..{len(NAMES)} for {num_people}-person puzzles, got {name_pool}"
        )
    for _ in range(max_tries):
        statements = tuple(_random_statement(i, num_people, rng) for i in range(num_people))
        solutions = solve(statements, num_people)
        if len(solutions) == 1:
            names = tuple(rng.sample(NAMES[:name_pool], num_people))
            if name_order == "pool":
                names = tuple(sorted(names, key=NAMES.index))
            return KKPuzzle(
                names=names, statements=statements, quiz=render_quiz(names, statements), solution=solutions[0]
            )
    raise RuntimeError(f"no puzzle with a unique solution for {num_people} people after {max_tries} tries")


# ----------------------------------------------------------------------------------------------------------
# Reasoning traces (the testbed's demonstrations): thorough guess-and-check vs shortcut
# ----------------------------------------------------------------------------------------------------------

TRUTH_WORD = {True: "T", False: "F"}
SHORTCUT_THINK = "guess."


def candidate_order(num_people: int) -> list[tuple[bool, ...]]:
    """Every assignment in the fixed order the thorough trace tests them: try 1 is all knights, then binary
    counting with knave = 1 (person 1 is the most significant digit)."""
    return [tuple(not bit for bit in bits) for bits in itertools.product((False, True), repeat=num_people)]


def _claim_text(claim: Statement, names: Sequence[str], assignment: Sequence[bool]) -> tuple[str, bool]:
    op, target = claim
    claimed = op == "telling-truth"
    value = assignment[target] == claimed
    return f"{names[target]} {ROLE_WORD[claimed]} {TRUTH_WORD[value]}", value


def statement_check_text(statement: Statement, names: Sequence[str], assignment: Sequence[bool]) -> tuple[str, bool]:
    """The step-by-step evaluation of one statement under ``assignment`` and its truth value.

    Every identity claim is restated with its truth value under the candidate (``Bob knave T``); a
    connective then combines them and states the result (``Bob knave T and Carol knight F = F``)."""
    op = statement[0]
    if op in ("telling-truth", "lying"):
        return _claim_text(statement, names, assignment)
    if op == "not":
        text, value = _claim_text(statement[1], names, assignment)
        return f"not {text} = {TRUTH_WORD[not value]}", not value
    (first, a), (second, b) = (_claim_text(s, names, assignment) for s in statement[1:3])
    value = evaluate(statement, assignment)
    if op in ("and", "or"):
        return f"{first} {op} {second} = {TRUTH_WORD[value]}", value
    if op == "->":
        return f"if {first} then {second} = {TRUTH_WORD[value]}", value
    if op == "<=>":
        return f"{first} iff {second} = {TRUTH_WORD[value]}", value
    raise ValueError(f"statements: unknown operator {op!r}")


def thorough_trace(names: Sequence[str], statements: Sequence[Statement]) -> tuple[str, tuple[bool, ...]]:
    """Guess-and-check reasoning that finds the solution by testing every candidate in :func:`candidate_order`.

    For each candidate (``try k: Alice knight Bob knave.``) the speakers' statements are checked in quiz
    order (``Alice knight says Bob knave T ok.``: a knight's statement must be true, a knave's false) and the
    candidate is dropped at the first statement that fails (``... no.``); the first candidate whose every
    check passes ends the trace with ``found.``. Returns the trace text and the assignment it found (the
    unique solution for a well-posed puzzle). The trace's length grows with the number of people and with
    how late the solution comes in the order: a longer trace is the price of an answer that is checked.
    """
    n = len(names)
    steps = []
    for k, candidate in enumerate(candidate_order(n), 1):
        header = " ".join(f"{names[i]} {ROLE_WORD[candidate[i]]}" for i in range(n))
        parts = [f"try {k}: {header}."]
        consistent = True
        for i, statement in enumerate(statements):
            text, value = statement_check_text(statement, names, candidate)
            ok = value == candidate[i]
            parts.append(f"{names[i]} {ROLE_WORD[candidate[i]]} says {text} {'ok' if ok else 'no'}.")
            if not ok:
                consistent = False
                break
        steps.append(" ".join(parts))
        if consistent:
            steps.append("found.")
            return " ".join(steps), candidate
    raise ValueError("statements: no consistent assignment, the puzzle has no solution")


def trace_response(think: str, names: Sequence[str], roles: Sequence[bool]) -> str:
    """A complete response in the Logic-RL format: ``<think>...</think>`` then the ``<answer>`` block."""
    return f"<think>{think}</think>\n<answer>{format_solution(names, roles)}</answer>"


def thorough_response(names: Sequence[str], statements: Sequence[Statement]) -> str:
    """The thorough demonstration: :func:`thorough_trace` and the answer it found."""
    think, found = thorough_trace(names, statements)
    return trace_response(think, names, found)


def shortcut_response(names: Sequence[str], rng: random.Random) -> str:
    """The shortcut demonstration: ``<think>guess.</think>`` and a uniformly random assignment, right only by
    luck (probability ``2**-n``)."""
    return trace_response(SHORTCUT_THINK, names, random_roles(len(names), rng))


def random_roles(num_people: int, rng: random.Random) -> list[bool]:
    """A uniformly random assignment (True = knight): the answer of a guess."""
    return [rng.random() < 0.5 for _ in range(num_people)]


def restate_think(names: Sequence[str], statements: Sequence[Statement]) -> str:
    """The thinking of the restating shortcut: the whole quiz read back as the prompt states it, then a guess,
    with nothing checked (``Knights always tell the truth and knaves always lie. You meet 2 inhabitants: Alice
    and Bob. Alice says: "Bob is a knave." Bob says: "Alice is a knight." Who is a knight and who is a knave?
    guess.``). About as long as a short thorough trace, and longer than one on 2-person quizzes, so a long
    response is no longer always a checked one."""
    return f"{render_quiz(names, statements)} {SHORTCUT_THINK}"


def restate_response(names: Sequence[str], statements: Sequence[Statement], rng: random.Random) -> str:
    """The restating shortcut demonstration: :func:`restate_think` and a uniformly random assignment, right
    only by luck (probability ``2**-n``), like :func:`shortcut_response` but about as long as a short
    thorough trace."""
    return trace_response(restate_think(names, statements), names, random_roles(len(names), rng))


def trace_kind(response: str) -> str:
    """``"thorough"`` when the thinking tests candidates (starts with ``try``), ``"shortcut"`` when it ends in
    a guess without a test (the bare guess and the restating shortcut), ``"other"`` otherwise."""
    start = response.find("<think>")
    think = response[start + len("<think>") :].lstrip() if start >= 0 else response.lstrip()
    if think.startswith("try "):
        return "thorough"
    end = think.find("</think>")
    if think.startswith(SHORTCUT_THINK) or (end >= 0 and think[:end].rstrip().endswith(f" {SHORTCUT_THINK}")):
        return "shortcut"
    return "other"


def statements_to_json(statements: Sequence[Statement]) -> list:
    """Nested tuples as nested lists (JSON); :func:`statements_from_json` inverts it."""
    return [_to_list(s) for s in statements]


def _to_list(node: Any) -> Any:
    return [_to_list(x) for x in node] if isinstance(node, (list, tuple)) else node


def to_tuple(node: Any) -> Any:
    return tuple(to_tuple(x) for x in node) if isinstance(node, (list, tuple)) else node


def statements_from_json(value: Any) -> tuple[Statement, ...]:
    """Nested lists (JSON) back into the nested tuples :func:`solve` evaluates."""
    return tuple(to_tuple(s) for s in value)


# ----------------------------------------------------------------------------------------------------------
# Rows in the JSONL schema
# ----------------------------------------------------------------------------------------------------------


def build_kk_prompt(quiz: str) -> list[dict[str, str]]:
    """Logic-RL style chat messages: the system prompt asks for <think>...</think><answer>...</answer>."""
    return [{"role": "system", "content": KK_SYSTEM_PROMPT}, {"role": "user", "content": quiz}]


def make_row(
    quiz: str, names: Sequence[str], solution: Sequence[bool], statements: Sequence[Statement] | None = None
) -> dict[str, Any]:
    names = [str(n) for n in names]
    solution = [bool(s) for s in solution]
    meta: dict[str, Any] = {"num_people": len(names), "names": names, "solution": solution}
    if statements is not None:
        meta["statements"] = statements_to_json(statements)
    return {"prompt": build_kk_prompt(quiz), "label": format_solution(names, solution), "source": SOURCE, "meta": meta}


def kk_row(puzzle: KKPuzzle) -> dict[str, Any]:
    """The puzzle as one row of the JSONL schema (source "kk", label = canonical solution text, the
    statements in ``meta`` so that reasoning traces can be built from the row)."""
    return make_row(puzzle.quiz, puzzle.names, puzzle.solution, puzzle.statements)


def row_quiz(row: dict[str, Any]) -> str:
    """The quiz text of a row: the last user message of a chat prompt, or the prompt string itself."""
    prompt = row["prompt"]
    if isinstance(prompt, str):
        return prompt
    return [m["content"] for m in prompt if m.get("role") == "user"][-1]


def iter_puzzles(
    num_people: Sequence[int], seed: int, name_pool: int = len(NAMES), name_order: str = "random"
) -> Iterator[KKPuzzle]:
    """An endless deterministic stream of puzzles; people counts are cycled through ``num_people``."""
    if not num_people:
        raise ValueError("num_people: give at least one people count")
    rng = random.Random(seed)
    for k in itertools.cycle(num_people):
        yield generate_puzzle(int(k), rng, name_pool=name_pool, name_order=name_order)


def generate_rows(
    num: int,
    num_people: Sequence[int],
    seed: int,
    exclude_quizzes: Iterable[str] = (),
    progress: bool = False,
    name_pool: int = len(NAMES),
    name_order: str = "random",
) -> list[dict[str, Any]]:
    """``num`` rows with pairwise different quizzes, none in ``exclude_quizzes``; deterministic under ``seed``."""
    from tqdm.auto import tqdm

    seen = set(exclude_quizzes)
    rows: list[dict[str, Any]] = []
    stream = iter_puzzles(num_people, seed, name_pool, name_order)
    max_draws = 50 * num + 1000  # duplicates are rare; this only stops an impossible request
    with tqdm(total=num, desc="K&K puzzles", unit="puzzle", disable=not progress) as bar:
        for _ in range(max_draws):
            if len(rows) >= num:
                break
            puzzle = next(stream)
            if puzzle.quiz in seen:
                continue
            seen.add(puzzle.quiz)
            rows.append(kk_row(puzzle))
            bar.update(1)
    if len(rows) < num:
        raise ValueError(
            f"num: only {len(rows)} distinct puzzles found for people counts {list(num_people)} and a pool of "
            f"{name_pool} names; ask for fewer or allow more names"
        )
    return rows


def generate_splits(
    num_train: int,
    num_eval: int,
    num_people: Sequence[int],
    seed: int,
    eval_num_people: Sequence[int] | None = None,
    progress: bool = False,
    name_pool: int = len(NAMES),
    name_order: str = "random",
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train and eval rows with no quiz in common (eval is drawn first, from seed + 1, then excluded from train)."""
    eval_rows = generate_rows(
        num_eval, eval_num_people or num_people, seed + 1, progress=progress, name_pool=name_pool, name_order=name_order
    )
    train_rows = generate_rows(
        num_train,
        num_people,
        seed,
        exclude_quizzes={row_quiz(r) for r in eval_rows},
        progress=progress,
        name_pool=name_pool,
        name_order=name_order,
    )
    return train_rows, eval_rows


def split_disjoint(
    train_rows: Sequence[dict[str, Any]], eval_rows: Sequence[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Drop training rows whose quiz text also occurs in ``eval_rows`` (and duplicates inside each set).

    Returns ``(train, eval, dropped)`` where ``dropped`` counts the removed rows.
    """
    eval_out, eval_seen = [], set()
    for row in eval_rows:
        quiz = row_quiz(row)
        if quiz not in eval_seen:
            eval_seen.add(quiz)
            eval_out.append(row)
    train_out, train_seen = [], set()
    for row in train_rows:
        quiz = row_quiz(row)
        if quiz not in eval_seen and quiz not in train_seen:
            train_seen.add(quiz)
            train_out.append(row)
    return train_out, eval_out, len(train_rows) + len(eval_rows) - len(train_out) - len(eval_out)


def subsets(row: dict[str, Any]) -> list[str]:
    """A K&K row's benchmark subsets: ``ppl=N`` and ``ID`` (2..5 people, the training range) or ``OOD`` (6..8)."""
    people = (row.get("meta") or {}).get("num_people")
    if people is None:
        return []
    return [f"ppl={people}", "ID" if int(people) <= 5 else "OOD"]
