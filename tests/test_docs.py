"""The docs stay a user's guide: short pages, results.md opening with its claims table, no measured figure quoted in
the package's runtime messages (warnings, errors, --help)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_DOC_LINES = 400
MAX_RESULTS_LINES = 300
# a measured ratio ("0.72-0.79x", "1.5x faster") or a spelled-out count of runs ("three of four", "two of three")
MEASUREMENT = re.compile(
    r"\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?x\b"
    r"|\b(?:one|two|three|four|five|six|seven|eight|nine|ten) of (?:two|three|four|five|six|seven|eight|nine|ten)\b",
    re.IGNORECASE,
)


def test_docs_are_short():
    for path in sorted((ROOT / "docs").glob("*.md")):
        lines = len(path.read_text().splitlines())
        assert lines <= MAX_DOC_LINES, f"{path.name} has {lines} lines (at most {MAX_DOC_LINES}): move detail out"
    results = (ROOT / "docs" / "results.md").read_text().splitlines()
    assert len(results) <= MAX_RESULTS_LINES, f"docs/results.md has {len(results)} lines (at most {MAX_RESULTS_LINES})"


def test_results_open_with_the_claims_table():
    lines = (ROOT / "docs" / "results.md").read_text().splitlines()
    first_table = next(i for i, line in enumerate(lines) if line.startswith("|"))
    headings = [line for line in lines[:first_table] if line.startswith("## ")]
    assert not headings, f"docs/results.md: {headings} come before the claims table"
    assert lines[first_table].startswith("| method | regime | seeds |")


def _messages(tree: ast.AST) -> list[ast.Constant]:
    """The string constants of a module that are not docstrings."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_measurement_in_runtime_messages():
    found = []
    for path in sorted((ROOT / "adora_openrlhf").rglob("*.py")):
        for node in _messages(ast.parse(path.read_text())):
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno}: {m.group(0)!r}" for m in MEASUREMENT.finditer(node.value)
            ]
    assert not found, "measured figures in messages (say what to do and link docs/results.md instead):\n" + "\n".join(
        found
    )


def test_guard_catches_quoted_measurements():
    assert MEASUREMENT.search("0.72-0.79x the time")
    assert MEASUREMENT.search("three of four runs collapsed")
    assert not MEASUREMENT.search("(the LLM reference: 3900 of 4096)")
