"""The import graph of the package has no cycle: no module imports a module above it,
not even for types (imports under `TYPE_CHECKING` count); and docs/design.md's map of the
code names every module, so a module added without its line there fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import axa_queue

PACKAGE = Path(axa_queue.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The package's modules `path` imports, anywhere in it (functions and
    `TYPE_CHECKING` blocks included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            # `from . import sql` imports the module sql (not the package's __init__,
            # which importing any module of the package runs first anyway);
            # `from .jobs import NewJob` imports jobs, and `from .worker import X` the
            # worker package's __init__.
            for alias in node.names:
                inner = f"{origin}.{alias.name}"
                if inner in modules:
                    found.add(inner)
                if node.module is not None or inner not in modules:
                    found.add(origin)
    return {one for one in found if one in modules and one != name}


def import_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {name: _imports(path, name, modules) for name, path in paths.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(node: str) -> list[str] | None:
        if node in on_stack:
            return [*stack[stack.index(node) :], node]
        if node in done:
            return None
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            found = visit(nxt)
            if found:
                return found
        stack.pop()
        on_stack.discard(node)
        done.add(node)
        return None

    for node in sorted(graph):
        found = visit(node)
        if found:
            return found
    return None


def test_the_import_graph_of_the_package_has_no_cycle() -> None:
    graph = import_graph()
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_worker_and_housekeeping_never_import_the_queue() -> None:
    graph = import_graph()
    for name in (
        "axa_queue.maintenance",
        "axa_queue.handlers.handler",
        "axa_queue.handlers.registry",
    ):
        assert "axa_queue.queue" not in graph[name], name
    for name in [n for n in graph if n.startswith("axa_queue.worker")]:
        assert "axa_queue.queue" not in graph[name], name


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


DESIGN = PACKAGE.parent.parent / "docs" / "design.md"
MAPPED = re.compile(r"`((?:[a-z_0-9]+/)*(?:[a-z_0-9]+\.py|[a-z_0-9]+/))`")


def _map_of_the_code() -> set[str]:
    """The paths docs/design.md's maps of the code name (`queue.py`, `db/calls.py`,
    `web/`), from its tables whose first column is `module`."""
    named: set[str] = set()
    in_map = False
    for line in DESIGN.read_text(encoding="utf-8").splitlines():
        if line.startswith("| module |"):
            in_map = True
        elif in_map and line.startswith("|"):
            for path in MAPPED.findall(line.split("|")[1]):
                named.add(path.removesuffix("__init__.py") or "__init__.py")
        else:
            in_map = False
    return named


def _modules_to_map() -> set[str]:
    """Every module of the package, as a path from `src/axa_queue/` (a package's
    `__init__.py` as its folder), but Django's numbered migrations and `__main__`."""
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).as_posix()
        if "/migrations/0" in relative or path.name == "__main__.py":
            continue
        found.add(relative.removesuffix("__init__.py") or "__init__.py")
    return found


def test_the_design_notes_map_of_the_code_names_every_module_and_only_those_that_exist() -> None:
    named, modules = _map_of_the_code(), _modules_to_map()
    assert sorted(modules - named) == [], "modules docs/design.md's map of the code leaves out"
    assert sorted(named - modules) == [], "paths docs/design.md's map names that do not exist"


def test_no_statement_is_made_by_editing_the_text_of_another() -> None:
    # Each variant is composed from named pieces (sql/naming.py, sql/exchange.py), so
    # the statement sent can be read whole: never by `str.replace` on another's text.
    edits = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path in sorted((PACKAGE / "sql").glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "replace"
    ]
    assert edits == []


def test_modules_stay_small_and_few_at_the_top() -> None:
    sizes = {
        str(path.relative_to(PACKAGE)): len(path.read_text(encoding="utf-8").splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    assert {name: n for name, n in sizes.items() if n > 500} == {}
    assert {name: n for name, n in sizes.items() if name.startswith("worker/") and n > 350} == {}
    assert len([name for name in sizes if "/" not in name]) <= 20
