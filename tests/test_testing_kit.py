"""The testing kit as its users get it: a suite outside the project, run as a user would.

It has no conftest, imports no module of the app and uses only the kit's fixtures (the `pytest11`
plugin) and Playwright.

The suite is the two examples of docs/TESTING.md (tests/testing_kit/), copied into a temporary
folder and run by pytest in a child process: a delegation that streams into the panel, a failure half
way with its reason, a timeout, Stop during a callee that never ends, and the REST + SSE path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent / "testing_kit"


@pytest.mark.e2e
def test_a_users_suite_outside_the_project_drives_the_panel_with_the_kit(tmp_path: Path) -> None:
    for example in EXAMPLES.glob("example_*.py"):
        shutil.copy(example, tmp_path / f"test_{example.name.removeprefix('example_')}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "NICEGUI_"))}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "5 passed" in result.stdout, result.stdout[-3000:]


def test_the_examples_in_docs_testing_are_the_ones_that_run() -> None:
    doc = (EXAMPLES.parent.parent / "docs" / "TESTING.md").read_text(encoding="utf-8")
    for example in sorted(EXAMPLES.glob("example_*.py")):
        assert f"```python\n{example.read_text(encoding='utf-8').rstrip()}\n```" in doc, example.name
