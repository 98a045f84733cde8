"""The package's shape: folders whose imports run one way, and sizes a reader can hold.

    a folder (or top-level module) imports only those below it: no cycle between folders,
        function-level imports included, and no folder imports the package root (its facade)
    no cycle between modules either (a folder's __init__ counts as the module its importers name)
    a folder holds at most 3,000 lines, a module at most 450
    a function (or method) holds at most 60 lines of code: no docstring, comment or blank line
    the packed batch's four varlen keys (cu_seq_lens_q/k, max_length_q/k) are string literals in at
        most 2 modules: its home, packing_collators/batch/, and every other module reads its names

The import graph is read with ``ast`` from the source (nothing is imported), so an import
hidden inside a function counts like one at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "packing_collators"
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_FOLDER_LINES, MAX_MODULE_LINES, MAX_FUNCTION_LINES = 3000, 450, 60


def folder(path: Path) -> list[str]:
    return list(path.relative_to(PACKAGE).parts[:-1])


def unit(path: Path) -> str:
    """The folder a module belongs to, or the top-level module's own name (``_compat``)."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def imported_units(source: str, package: list[str]) -> set[str]:
    """The package's folders and top-level modules that ``source`` (a module of folder ``package``)
    imports, at any depth of its code ("": the package root)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            target = base + (node.module.split(".") if node.module else [])
            found.add(target[0] if target else "")  # "": the package root itself
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "packing_collators":
            found.add((node.module.split(".") + [""])[1])
        elif isinstance(node, ast.Import):
            found |= {(a.name.split(".") + [""])[1] for a in node.names if a.name.split(".")[0] == "packing_collators"}
    return found


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in MODULES:
        if path.parent == PACKAGE and path.name in ("__init__.py", "__main__.py"):
            continue  # the facade and the entry point sit above everything
        graph.setdefault(unit(path), set()).update(imported_units(path.read_text(), folder(path)) - {unit(path)})
    return graph


def test_no_folder_imports_the_package_root():
    importers = [
        str(p.relative_to(PACKAGE)) for p in MODULES if p.parent != PACKAGE and "" in imported_units(p.read_text(), folder(p))
    ]
    assert not importers, f"import from the module that defines the name, not the package root: {importers}"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` (its nodes, the first repeated last), or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return None
        for target in sorted(graph.get(node, ())):
            cycle = visit(target, path + [node])
            if cycle:
                return cycle
        done.add(node)
        return None

    return next((cycle for node in sorted(graph) if (cycle := visit(node, []))), None)


def test_imports_between_folders_run_one_way():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle between folders: " + " -> ".join(cycle or [])
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_graph_sees_function_level_and_absolute_imports():
    source = "import numpy\nfrom ._shard import a\n\ndef f():\n    from ..trainer import x\n    import packing_collators.checks\n"
    assert imported_units(source, ["parallel"]) == {"parallel", "trainer", "checks"}
    assert imported_units("from .. import __version__\n", ["offline"]) == {""}


def test_folders_and_modules_stay_small():
    folders: dict[str, int] = {}
    for path in MODULES:
        lines = len(path.read_text().splitlines())
        assert lines <= MAX_MODULE_LINES, f"{path.relative_to(PACKAGE)} has {lines} lines (at most {MAX_MODULE_LINES})"
        if path.parent != PACKAGE:
            folders[unit(path)] = folders.get(unit(path), 0) + lines
    over = {name: lines for name, lines in folders.items() if lines > MAX_FOLDER_LINES}
    assert not over, f"folders over {MAX_FOLDER_LINES} lines: {over}"


def code_lines(function: ast.AST, source: list[str]) -> int:
    """Lines of ``function`` that hold code: not blank, not a comment, not its docstring."""
    skip = set()
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        skip = set(range(body[0].lineno, body[0].end_lineno + 1))
    lines = range(function.lineno, function.end_lineno + 1)
    return sum(1 for n in lines if n not in skip and source[n - 1].strip() and not source[n - 1].strip().startswith("#"))


def test_functions_stay_short():
    long = []
    for path in MODULES:
        text = path.read_text()
        source = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and code_lines(node, source) > MAX_FUNCTION_LINES:
                long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({code_lines(node, source)} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines of code: {long}"


def module_of(path: Path) -> str:
    """A module's dotted name inside the package (``collate._features``; a folder's ``__init__``: ``collate``)."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


NAMES = {module_of(path): path for path in MODULES}


def imported_modules(path: Path) -> set[str]:
    """The package's modules that the module at ``path`` imports, at any depth of its code: a folder's
    ``__init__`` for ``from ..collate import x``, the module itself for ``from .._compat import x``, and
    a submodule for ``from . import _compile``."""
    package = module_of(path).split(".")[: len(path.relative_to(PACKAGE).parts) - 1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
            elif (node.module or "").split(".")[0] == "packing_collators":
                base = []
            else:
                continue
            module = (node.module or "").removeprefix("packing_collators").lstrip(".")
            target = ".".join(base + (module.split(".") if module else []))
            for alias in node.names:  # a submodule by its name (``from . import _compile``), else the module's name
                submodule = f"{target}.{alias.name}".lstrip(".")
                found.add(submodule if submodule in NAMES else target)
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("packing_collators").lstrip(".") for a in node.names if a.name.startswith("packing_collators")}
    return {name for name in found if name in NAMES} - {module_of(path)}


def test_imports_between_modules_run_one_way():
    """No circle of modules either, function-level imports included (the facade, ``""``, stays above all)."""
    graph = {name: imported_modules(path) - {""} for name, path in NAMES.items() if name not in ("", "__main__")}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle between modules: " + " -> ".join(cycle or [])


def test_the_module_graph_sees_submodules_and_folders():
    assert imported_modules(PACKAGE / "budget" / "__init__.py") >= {"budget._memory_budget", "budget._token_budget"}
    assert "batch" in imported_modules(PACKAGE / "collate" / "_flat_row.py")


def test_the_varlen_keys_are_spelled_in_at_most_two_modules():
    """``cu_seq_lens_q/k`` and ``max_length_q/k`` as string literals: in the batch's home, read everywhere else
    through its names (``packing_collators.batch``)."""
    keys = {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"}
    spelled = sorted(
        name
        for name, path in NAMES.items()
        if any(isinstance(n, ast.Constant) and n.value in keys for n in ast.walk(ast.parse(path.read_text())))
    )
    assert len(spelled) <= 2, f"the varlen keys are string literals in {spelled}; use packing_collators.batch's names"


def test_tests_import_nothing_from_scripts():
    """``scripts/`` holds runnable tools; what a test shares with one lives in ``benchmarks/`` (on the tests' path)."""
    tests = Path(__file__).resolve().parent

    def reaches_scripts(tree: ast.AST) -> bool:  # a path to scripts/ ("scripts"), or an import of a module there
        return any(
            (isinstance(n, ast.Constant) and n.value == "scripts")
            or (isinstance(n, (ast.Import, ast.ImportFrom)) and "scripts" in ast.unparse(n))
            for n in ast.walk(tree)
        )

    reaching = sorted(
        str(path.relative_to(tests))
        for path in tests.rglob("*.py")
        if path != Path(__file__).resolve() and reaches_scripts(ast.parse(path.read_text()))
    )
    assert not reaching, f"tests that load from scripts/: {reaching}"
    assert reaches_scripts(ast.parse('spec_from_file_location("sweep", ROOT / "scripts" / "sweep.py")'))


def test_no_folder_reaches_into_another_folders_private_module():
    """A folder's private modules are its own: others import what its ``__init__`` exports (compile's included)."""
    reach_ins = []
    for path in MODULES:
        if path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 2 and node.module:
                parts = node.module.split(".")
                if len(parts) >= 2 and parts[-1].startswith("_"):
                    reach_ins.append(f"{path.relative_to(PACKAGE)}: from {'.' * node.level}{node.module}")
    assert not reach_ins, reach_ins


def test_the_benchmark_scripts_import_one_way():
    """benchmarks/ imports its modules by name (sys.path): no script may import one that imports it back."""
    root = PACKAGE.parent / "benchmarks"
    stems = {path.stem for path in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            found.update(name.split(".")[0] for name in names if name.split(".")[0] in stems)
        graph.setdefault(path.stem, set()).update(found - {path.stem})
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in benchmarks/: " + " -> ".join(cycle or [])
