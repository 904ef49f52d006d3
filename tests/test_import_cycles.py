"""No import cycles in the app's code, imports made only for type checkers included (issue 35).

The layering contracts (`lint-imports`) keep the layers in order; this keeps modules within a layer from
importing each other in a ring, which makes a reader hold several files at once to follow one path. A cycle
found is named with its modules, so it can be broken where docs/ARCHITECTURE.md ("The layering is checked")
says how: a protocol in the lower module, or the import moved up to the caller.
"""

from __future__ import annotations

import sys

import grimp


def strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """Tarjan's algorithm over the direct imports; the components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for module in sorted(graph.modules):
            if module not in index:
                visit(module)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_no_module_of_the_app_imports_itself_back_through_others() -> None:
    graph = grimp.build_graph("core", "ui", "models", exclude_type_checking_imports=False)
    assert strongly_connected(graph) == []


def test_the_check_finds_a_ring_when_there_is_one() -> None:
    graph = grimp.ImportGraph()
    for name in ("pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d"):
        graph.add_module(name)
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.c")
    graph.add_import(importer="pkg.c", imported="pkg.a")
    graph.add_import(importer="pkg.d", imported="pkg.a")
    assert strongly_connected(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
