"""No import circles between the production modules, and every mechanism folder is imported
only from inside itself.

A circle is a cycle of direct imports a → b → … → a among modules where, along every edge,
neither end is an ancestor package of the other: a package's ``__init__`` importing its own
submodules, or a submodule importing its parent packages, is how a package presents its parts
and is not counted. Every import counts, wherever it stands: at module level, inside a
function (a deferred import still couples the two modules) or under ``TYPE_CHECKING`` (the
types tie them just the same). A circle is reported as its strongly connected component:
the modules that all reach each other.

The graph is grimp's (the one ``lint-imports`` checks its contracts on), built from the
source, nothing imported.
"""

from __future__ import annotations

from collections.abc import Iterable

import grimp
import pytest

# The packages whose circles fail this test.
PACKAGES = ("service", "worker", "dpcore", "dprelease_cli", "dprelease_client")
MECHANISMS = "dpcore.mechanisms"


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    # No cache: parallel test workers would share one cache folder.
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def _related(a: str, b: str) -> bool:
    """Whether one module is an ancestor package of the other (or they are the same)."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _edges(graph: grimp.ImportGraph) -> dict[str, set[str]]:
    return {
        module: {
            imported
            for imported in graph.find_modules_directly_imported_by(module)
            if not _related(module, imported)
        }
        for module in graph.modules
    }


def _reach(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in edges[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted."""
    reach = {module: _reach(edges, module) for module in edges}
    found: list[list[str]] = []
    placed: set[str] = set()
    for module in sorted(edges):
        if module in placed:
            continue
        component = sorted(other for other in reach[module] if module in reach[other])
        placed.update(component)
        if len(component) > 1:
            found.append(component)
    return found


def _show(components: Iterable[list[str]]) -> str:
    return "\n".join(" ↔ ".join(component) for component in components)


def test_the_circle_finder_ignores_a_package_and_its_parts() -> None:
    edges = {
        "p": {"p.a"},  # a package presenting its part
        "p.a": {"p", "p.b"},
        "p.b": {"p.a"},  # a circle between siblings
        "q": {"q.c"},
        "q.c": {"q"},  # only a part and its package
    }
    kept = {
        module: {b for b in targets if not _related(module, b)} for module, targets in edges.items()
    }
    assert circles(kept) == [["p.a", "p.b"]]


def test_no_import_circles(graph: grimp.ImportGraph) -> None:
    found = circles(_edges(graph))
    assert not found, "import circles (break them by moving what both need lower):\n" + _show(found)


def test_mechanism_folders_are_imported_only_from_inside(graph: grimp.ImportGraph) -> None:
    """One mechanism, one folder: what several mechanisms (or the accounting, the audit, the
    distributed engine) need lives in a shared module; the registry finds the mechanisms by
    name at run time."""
    folders = [m for m in graph.find_children(MECHANISMS) if graph.find_children(m)]
    assert folders, "no mechanism folder found"
    leaks = []
    for folder in sorted(folders):
        inside = {folder} | graph.find_descendants(folder)
        for module in sorted(inside):
            for importer in sorted(graph.find_modules_that_directly_import(module)):
                if importer not in inside and not _related(importer, folder):
                    leaks.append(f"{importer} -> {module}")
    assert not leaks, "imports of a mechanism folder from outside it:\n" + "\n".join(leaks)
