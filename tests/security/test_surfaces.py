"""Every surface has its row in `tests/security/README.md`, and every row names a surface and tests that exist.

A surface is what someone outside can reach or what decides who and where (docs/ARCHITECTURE.md, "A row
for every surface"):

- a route of the built app (app.py's `build`, run the way the page tests run it: app.py in NiceGUI's user
  simulation, so the routes NiceGUI adds at start-up are there too): `GET /api/agents`, `WS /a2a`,
  `MOUNT /_nicegui_ws`; NiceGUI's version in its paths is written `{version}`;
- a page action: a server-side handler that a page binds to an event, found in `ui/*.py` by reading the
  source (`ast`): a keyword `on_<event>=handler`, `.on(event, handler)` (`ui.on` too), `.on_click(handler)`,
  `.on_value_change(handler)`, `ui.timer(interval, handler)`, `ui.menu_item(text, handler)`. Named
  `ui/<module>.py:<function>` by the function that runs (nested functions joined with dots, `<locals>`
  left out, so `register_api_keys_page.api_keys_page.create`); a lambda is named by the function its body
  calls, and when that is not a function of the module, by the enclosing function and the call
  (`ui/frame.py:build_frame:drawer.toggle`). Lifecycle hooks (`client.on_delete`, `client.on_connect`)
  and browser-only handlers (`js_handler=`) are not page actions;
- a setting that names an address or a secret: a field of `core.settings.Settings` (nested ones as
  `REDIS_URL`, `AUTH_PUBLIC_KEYS`) whose name or description has one of `ADDRESS_OR_SECRET_WORDS`.

The README's tables under "## Routes", "## Page actions" and "## Settings" name their surfaces in
backticks in the first column (several in one cell are allowed). Files and tests named anywhere in the
README, backticked `path.py` or `path.py::test_name`, must exist: a name without a folder, or one starting
with `../`, is read from `tests/security/`, any other from the repository's root.
"""

from __future__ import annotations

import ast
import re
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import pytest
from fastapi.routing import APIWebSocketRoute, iter_route_contexts
from nicegui import __version__ as nicegui_version
from pydantic import BaseModel
from starlette.routing import Mount, WebSocketRoute

from core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
TABLE = Path(__file__).resolve().parent / "README.md"
SECTIONS = {"routes": "## Routes", "actions": "## Page actions", "settings": "## Settings"}

ADDRESS_OR_SECRET_WORDS = {
    "url",
    "urls",
    "host",
    "hosts",
    "address",
    "addresses",
    "ip",
    "ips",
    "proxy",
    "proxies",
    "base",
    "dsn",
    "secret",
    "secrets",
    "key",
    "keys",
    "token",
    "password",
    "passwords",
}
HANDLER_METHODS = {"on_click", "on_value_change"}  # element.on_click(handler): NiceGUI's method forms


# -- what the code has -------------------------------------------------------------------------


def route_surfaces(routes: Iterable) -> set[str]:
    """`METHOD /path` for every HTTP route, `WS /path` for sockets, `MOUNT /path` for mounted apps."""
    found = set()
    for context in iter_route_contexts(list(routes)):  # included routers flattened, as FastAPI's OpenAPI reads them
        route = context.original_route
        path = (context.path or "").replace(f"/_nicegui/{nicegui_version}/", "/_nicegui/{version}/")
        if isinstance(route, Mount):
            found.add(f"MOUNT {path}")
        elif isinstance(route, WebSocketRoute | APIWebSocketRoute):
            found.add(f"WS {path}")
        else:
            found.update(f"{method} {path}" for method in sorted(context.methods or ()) if method != "HEAD")
    return found


class _Actions(ast.NodeVisitor):
    """The page actions of one module of `ui/`."""

    def __init__(self, module: str, tree: ast.Module) -> None:
        self.module = module
        self.scope: list[ast.AST] = []  # enclosing classes and functions
        self.found: set[str] = set()
        self.tree = tree

    def visit_ClassDef(self, node: ast.ClassDef) -> None:  # noqa: N802 - ast's names
        self.scope.append(node)
        self.generic_visit(node)
        self.scope.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:  # noqa: N802
        self.scope.append(node)
        self.generic_visit(node)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # noqa: N815

    def visit_Call(self, node: ast.Call) -> None:  # noqa: N802
        for handler in self._handlers(node):
            if not isinstance(handler, ast.Constant):  # on_load=True and the like are no handlers
                self.found.add(f"ui/{self.module}.py:{self._name(handler)}")
        self.generic_visit(node)

    @staticmethod
    def _handlers(node: ast.Call) -> list[ast.expr]:
        handlers = [k.value for k in node.keywords if k.arg and k.arg.startswith("on_")]
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name == "on":
            handlers += node.args[1:2] + [k.value for k in node.keywords if k.arg == "handler"]
        elif name in HANDLER_METHODS:
            handlers += node.args[:1]
        elif name in {"timer", "menu_item"} and isinstance(func, ast.Attribute) and _source(func.value) == "ui":
            handlers += node.args[1:2] + [k.value for k in node.keywords if k.arg in {"callback", "on_click"}]
        return handlers

    def _name(self, handler: ast.expr) -> str:
        target = handler
        if isinstance(handler, ast.Lambda):
            target = handler.body.func if isinstance(handler.body, ast.Call) else handler.body
        resolved = self._resolve(target)
        if resolved is not None:
            return resolved
        return f"{self._path(self.scope)}:{_source(target)}"

    def _resolve(self, target: ast.expr) -> str | None:
        """The dotted name of the function `target` names in this module (a nested def, or `self.method`)."""
        if isinstance(target, ast.Name):
            for depth in range(len(self.scope), -1, -1):
                if any(d.name == target.id for d in _local_defs(self.scope[depth - 1] if depth else self.tree)):
                    return ".".join(filter(None, [self._path(self.scope[:depth]), target.id]))
            return None
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            for depth in range(len(self.scope), 0, -1):
                if isinstance(self.scope[depth - 1], ast.ClassDef):
                    cls = self.scope[depth - 1]
                    if any(
                        isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name == target.attr
                        for s in cls.body
                    ):
                        return f"{self._path(self.scope[:depth])}.{target.attr}"
                    return None
        return None

    @staticmethod
    def _path(scope: list[ast.AST]) -> str:
        return ".".join(s.name for s in scope)  # type: ignore[attr-defined]


def _local_defs(node: ast.AST) -> Iterable[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    """The functions and classes defined in `node`'s own body (inside `with`, `if`, ...; not in nested ones)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield child
        elif not isinstance(child, ast.Lambda):
            yield from _local_defs(child)


def _source(node: ast.expr) -> str:
    return ast.unparse(node)


def page_action_surfaces(ui_dir: Path = ROOT / "ui") -> set[str]:
    """Every page action in `ui/*.py` (see the module's docstring for how they are named)."""
    found: set[str] = set()
    for path in sorted(ui_dir.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        visitor = _Actions(path.stem, tree)
        visitor.visit(tree)
        found |= visitor.found
    return found


def setting_surfaces(model: type[BaseModel] = Settings, prefix: str = "") -> set[str]:
    """The environment names of the settings whose name or description names an address or a secret."""
    found = set()
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found |= setting_surfaces(annotation, f"{prefix}{name}_")
            continue
        words = set(re.split(r"[^a-z0-9]+", f"{name} {field.description or ''}".lower()))
        if words & ADDRESS_OR_SECRET_WORDS:
            found.add(f"{prefix}{name}".upper())
    return found


# -- what the table says ---------------------------------------------------------------------------


def table_rows(text: str) -> dict[str, list[list[str]]]:
    """The rows of each section's table, as lists of cells (the header and its rule left out)."""
    rows: dict[str, list[list[str]]] = {kind: [] for kind in SECTIONS}
    current = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = next((kind for kind, title in SECTIONS.items() if line.strip() == title), None)
            continue
        if current is None or not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if set(cells[0]) <= {"-", ":", " "} or cells[0] == "Surface":
            continue
        rows[current].append(cells)
    return rows


def named_surfaces(rows: list[list[str]]) -> list[str]:
    """The surfaces the rows name: the backticked names in each row's first cell."""
    return [name for cells in rows for name in re.findall(r"`([^`]+)`", cells[0])]


TEST_REF = re.compile(r"`((?:[\w.-]+/)*[\w.-]+\.py)(?:::([\w:\[\]-]+))?`")


def referenced_tests(text: str) -> list[tuple[str, str | None]]:
    """Every backticked `path.py` or `path.py::name` in the text."""
    return [(path, name or None) for path, name in TEST_REF.findall(text)]


def missing_reference(path: str, name: str | None) -> str | None:
    """Why `path::name` does not name a test that exists, or None when it does."""
    base = TABLE.parent if path.startswith("../") or "/" not in path else ROOT
    file = (base / path).resolve()
    if not file.is_file():
        return f"{path}: no such file"
    if name is None:
        return None
    scope: list[ast.stmt] = ast.parse(file.read_text(encoding="utf-8")).body
    for part in re.sub(r"\[.*\]$", "", name).split("::"):
        found = next(
            (
                s
                for s in scope
                if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and s.name == part
            ),
            None,
        )
        if found is None:
            return f"{path}::{name}: {path} has no {part}"
        scope = found.body if isinstance(found, ast.ClassDef) else []
    return None


def _differences(kind: str, in_code: set[str], rows: list[list[str]]) -> list[str]:
    named = named_surfaces(rows)
    problems = [f"{kind}: `{s}` has no row" for s in sorted(in_code - set(named))]
    problems += [f"{kind}: the row of `{s}` names nothing that exists" for s in sorted(set(named) - in_code)]
    problems += [f"{kind}: `{s}` has {named.count(s)} rows" for s in sorted(set(named)) if named.count(s) > 1]
    return problems


HOW_TO_FIX = (
    "\nAdd a row to tests/security/README.md for each surface without one (who may use it, what it "
    "fetches, which secret goes where, its caps, and the tests), and remove the rows of surfaces "
    "that are gone."
)


# -- the tests ---------------------------------------------------------------------------------


@pytest.fixture
async def built_app_routes(
    isolated_env: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> AsyncIterator[list]:
    """app.py, run as the page tests run it (NiceGUI's user simulation, start-up included); its routes."""
    from nicegui import app

    from tests.utils.simulated_user import simulated_app_user

    monkeypatch.setenv("NICEGUI_STORAGE_PATH", str(isolated_env / "nicegui-storage"))
    async with simulated_app_user(request):
        yield list(app.routes)


async def test_every_route_has_its_row_and_every_row_a_route(built_app_routes: list) -> None:
    rows = table_rows(TABLE.read_text(encoding="utf-8"))["routes"]
    problems = _differences("route", route_surfaces(built_app_routes), rows)
    assert not problems, "\n".join(problems) + HOW_TO_FIX


def test_every_page_action_has_its_row_and_every_row_an_action() -> None:
    rows = table_rows(TABLE.read_text(encoding="utf-8"))["actions"]
    problems = _differences("page action", page_action_surfaces(), rows)
    assert not problems, "\n".join(problems) + HOW_TO_FIX


def test_every_address_or_secret_setting_has_its_row_and_every_row_a_setting() -> None:
    rows = table_rows(TABLE.read_text(encoding="utf-8"))["settings"]
    problems = _differences("setting", setting_surfaces(), rows)
    assert not problems, "\n".join(problems) + HOW_TO_FIX


def test_every_row_has_every_column_and_names_tests_that_exist() -> None:
    text = TABLE.read_text(encoding="utf-8")
    problems = []
    for kind, rows in table_rows(text).items():
        for cells in rows:
            if len(cells) != 6 or not all(cells):
                problems.append(f"{kind}: {cells[0]}: a row has six filled cells (write 'no test yet' for a gap)")
    problems += [p for p in (missing_reference(path, name) for path, name in referenced_tests(text)) if p]
    assert not problems, "\n".join(problems)
