"""Sizes a reader can hold (issue 35; docs/ARCHITECTURE.md, "Sizes").

No production module over 500 lines; a class over 300 lines says why at its top ("Over 300 lines on
purpose: ..." in its docstring). A file that grows past the limit is split along its seams in the same
change; the failure names the file or class and its size.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 300
REASON = "Over 300 lines on purpose"


def production_modules() -> list[Path]:
    files = [ROOT / "app.py"]
    for package in ("core", "ui", "models"):
        files += [p for p in (ROOT / package).rglob("*.py") if "migrations" not in p.parts]
    return sorted(files)


def test_no_production_module_is_over_500_lines() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines()) for p in production_modules()}
    assert len(sizes) > 100  # the walk found the app
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_a_class_over_300_lines_says_why_at_its_top() -> None:
    unexplained = {}
    for path in production_modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES and REASON not in (ast.get_docstring(node) or ""):
                    unexplained[f"{path.relative_to(ROOT)}:{node.name}"] = lines
    assert unexplained == {}
