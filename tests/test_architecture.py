"""The package's layering rules, checked on its source: the library never imports its command layers
(``adora_openrlhf/evaluation/``, ``adora_openrlhf/data_prep/``) nor the checkout's thin entry points (``eval/``,
``data_prep/``), its modules import each other without a circle, ``config.py`` imports no backend, no function is
longer than 60 lines in the package (80 in ``bench/``), the installed distribution holds ``adora_openrlhf`` alone,
and every console script names a function that exists."""

from __future__ import annotations

import ast
import importlib
import pathlib

import setuptools
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "adora_openrlhf"
MAX_FUNCTION_LINES = 60  # in the package
MAX_SCRIPT_FUNCTION_LINES = 80  # in bench/
MAX_FILE_LINES = 600  # any Python file of the package, eval/ and bench/
COMMAND_LAYERS = ("adora_openrlhf.evaluation", "adora_openrlhf.data_prep")  # entry points above the library
CHECKOUT_ENTRY_POINTS = ("data_prep", "eval")  # the checkout's thin folders: python -m eval.run, python -m data_prep.kk


def _modules() -> dict[str, pathlib.Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported_names(module: str, path: pathlib.Path) -> set[str]:
    """Every module name an import statement of the file names (function-level imports included), and every
    ``import_module("literal")`` (``importlib.import_module``), a module loaded by a name written in the source."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if _literal_import_module(node):
            names.add(node.args[0].value)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _literal_import_module(node: ast.AST) -> bool:
    """``import_module("a.b")`` or ``importlib.import_module("a.b")`` with a string literal."""
    if not isinstance(node, ast.Call) or not node.args:
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    first = node.args[0]
    return name == "import_module" and isinstance(first, ast.Constant) and isinstance(first.value, str)


def _import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        edges = set()
        for name in _imported_names(module, path):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name not in (module, "adora_openrlhf"):
                edges.add(name)
        graph[module] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def _in_layer(name: str, layers: tuple[str, ...]) -> bool:
    return any(name == layer or name.startswith(layer + ".") for layer in layers)


def test_the_library_never_imports_the_command_layers_or_the_checkout_folders():
    """Below ``evaluation/`` and ``data_prep/`` no module imports them; no module of the package imports the
    checkout's ``eval/`` or ``data_prep/`` folders (they are not installed)."""
    library, checkout = {}, {}
    for module, path in _modules().items():
        names = _imported_names(module, path)
        if not _in_layer(module, COMMAND_LAYERS):
            library[module] = sorted(n for n in names if _in_layer(n, COMMAND_LAYERS))
        checkout[module] = sorted(n for n in names if n.split(".")[0] in CHECKOUT_ENTRY_POINTS)
    assert {m: names for m, names in library.items() if names} == {}
    assert {m: names for m, names in checkout.items() if names} == {}


def test_data_preparation_does_not_import_evaluation():
    """Evaluation converts hub benchmarks with the converters of ``data_prep/``; never the other way round."""
    found = {
        module: sorted(n for n in _imported_names(module, path) if _in_layer(n, ("adora_openrlhf.evaluation",)))
        for module, path in _modules().items()
        if _in_layer(module, ("adora_openrlhf.data_prep",))
    }
    assert len(found) >= 7
    assert {m: names for m, names in found.items() if names} == {}


def test_the_checkout_folders_are_thin_entry_points():
    """``eval/`` and ``data_prep/`` only name a ``main`` of the package: no function or class of their own."""
    for folder in CHECKOUT_ENTRY_POINTS:
        for path in sorted((ROOT / folder).glob("*.py")):
            tree = ast.parse(path.read_text())
            defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
            imports = _imported_names(".".join(path.relative_to(ROOT).with_suffix("").parts), path)
            assert defined == [], path
            assert all(n.startswith("adora_openrlhf.") for n in imports), (path, imports)


def test_no_import_circle_and_config_imports_no_backend():
    graph = _import_graph()
    assert _cycles(graph) == []
    assert sorted(m for m in graph["adora_openrlhf.config"] if ".backends" in m) == []


ALGORITHM_CORE_IMPORTS = (
    "adora_openrlhf.algorithms",
    "adora_openrlhf.config_checks",
    "adora_openrlhf.errors",
    "adora_openrlhf.registry",
)


def test_the_algorithm_core_imports_nothing_above_it():
    """``algorithms/`` (tensors in, tensors out, and the configs of its own parts) reads only its own modules and
    the small leaf modules beside it; ``config`` takes the configs from there, never the other way round
    (type-checking imports included)."""
    core = {m: path for m, path in _modules().items() if _in_layer(m, ("adora_openrlhf.algorithms",))}
    assert len(core) >= 10
    found = {
        m: sorted(
            n
            for n in _imported_names(m, path)
            if n.startswith("adora_openrlhf") and not _in_layer(n, ALGORITHM_CORE_IMPORTS)
        )
        for m, path in core.items()
    }
    assert {m: names for m, names in found.items() if names} == {}


def _script_imports(folder: pathlib.Path) -> dict[str, set[str]]:
    """Module names each .py file of a folder outside the package imports (function-level imports included)."""
    return {
        str(path.relative_to(ROOT)): _imported_names(".".join(path.relative_to(ROOT).with_suffix("").parts), path)
        for path in sorted(folder.rglob("*.py"))
    }


def test_evaluation_data_preparation_and_bench_reach_the_engine_and_the_run_directory_not_the_local_backend():
    """``evaluation/``, ``data_prep/`` and ``bench/`` use ``adora_openrlhf.engine``, ``adora_openrlhf.rundir`` and
    ``adora_openrlhf.train``; the local trainer's modules are its own."""
    found = {
        **{
            str(path.relative_to(ROOT)): _imported_names(m, path)
            for m, path in _modules().items()
            if _in_layer(m, COMMAND_LAYERS)
        },
        **_script_imports(ROOT / "bench"),
    }
    assert len(found) > 15
    assert {
        path: sorted(n for n in names if n.startswith("adora_openrlhf.backends.local"))
        for path, names in found.items()
        if any(n.startswith("adora_openrlhf.backends.local") for n in names)
    } == {}


def test_the_engine_and_the_run_directory_import_no_backend():
    graph = _import_graph()
    shared = [m for m in graph if m.split(".")[1:2] in (["engine"], ["rundir"]) or m == "adora_openrlhf.rows"]
    assert len(shared) >= 10
    assert {
        m: sorted(e for e in graph[m] if ".backends." in e) for m in shared if any(".backends." in e for e in graph[m])
    } == {}


def _long_functions(folder: pathlib.Path, limit: int) -> list[str]:
    long = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit:
                long.append(
                    f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
                )
    return long


def test_no_function_is_longer_than_60_lines_in_the_package_and_80_in_bench():
    """A function a reader holds at once: split a longer one into named steps."""
    assert _long_functions(ROOT / "adora_openrlhf", MAX_FUNCTION_LINES) == []
    assert _long_functions(ROOT / "bench", MAX_SCRIPT_FUNCTION_LINES) == []


def test_no_python_file_of_the_package_eval_or_bench_is_over_600_lines():
    lengths = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for folder in (PACKAGE, ROOT / "eval", ROOT / "bench")
        for path in folder.rglob("*.py")
    }
    assert len(lengths) > 100
    too_long = {path: n for path, n in lengths.items() if n > MAX_FILE_LINES}
    assert not too_long, f"over {MAX_FILE_LINES} lines (split them): {too_long}"


def test_every_module_of_the_package_is_placed_in_the_architecture_map():
    """docs/architecture.md names every module: its path under ``adora_openrlhf/`` (a file name in the module map
    stands for the folder of its list item), or its dotted name."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    items = {}  # folder -> the module map's list item of that folder
    for item in doc.split("\n- ")[1:]:
        folder = item.split("`", 2)[1] if item.startswith("`") else ""
        items[folder.rstrip("/") if folder.endswith("/") else ""] = item
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.name == "__init__.py":
            continue
        dotted = "adora_openrlhf." + ".".join(rel.with_suffix("").parts)
        folders = ["/".join(rel.parts[:i]) for i in range(len(rel.parts))]  # "", "backends", "backends/local", ...
        named = any(f"`{rel.relative_to(f) if f else rel}`" in items.get(f, "") for f in folders)
        if str(rel) not in doc and dotted not in doc and not named:
            missing.append(str(rel))
    assert not missing, f"docs/architecture.md does not place {missing}"


def test_the_distribution_installs_only_the_package():
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = setuptools.find_packages(str(ROOT), include=include)
    assert {"adora_openrlhf", *COMMAND_LAYERS} <= set(packages)
    assert sorted(p for p in packages if p.split(".")[0] != "adora_openrlhf") == []


def test_every_console_script_names_a_function_of_the_package():
    """``[project.scripts]``: each ``adora-*`` command is ``adora_openrlhf.MODULE:main``, and that function exists."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"adora-train", "adora-eval", "adora-prep-kk"} <= set(scripts)
    for name, target in scripts.items():
        module, _, function = target.partition(":")
        assert name.startswith("adora-") and module.startswith("adora_openrlhf.") and function == "main", name
        assert callable(getattr(importlib.import_module(module), function)), target


def test_import_module_with_a_literal_name_is_an_import(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "import importlib\nfrom importlib import import_module\n"
        "def f(name):\n    importlib.import_module('pkg.a')\n    import_module(\"pkg.b\")\n    import_module(name)\n"
    )
    assert _imported_names("pkg.m", source) == {"importlib", "importlib.import_module", "pkg.a", "pkg.b"}


def test_no_module_of_the_tasks_is_loaded_by_a_string_name_inside_tasks():
    """A task's module is imported, never loaded by name: the import graph then sees every edge."""
    for path in (PACKAGE / "tasks").rglob("*.py"):
        calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]
        names = [getattr(c.func, "attr", getattr(c.func, "id", None)) for c in calls]
        assert "import_module" not in names, f"{path.relative_to(ROOT)} loads a module by name"


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_readme_is_a_short_users_guide():
    """The README guides a user (at most 200 lines); measured results live in docs/results.md, each figure once."""
    readme = (ROOT / "README.md").read_text().splitlines()
    assert len(readme) <= 200, f"README.md has {len(readme)} lines; move results or internals to docs/"
    assert (ROOT / "docs" / "results.md").is_file()
    assert not any("timed again" in line.lower() for line in readme)


def test_the_formatter_wraps_code_at_120_characters():
    ruff = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    assert ruff["line-length"] == 120
    assert ruff["lint"]["pycodestyle"]["max-line-length"] <= 160  # strings and comments the formatter cannot wrap
