"""The testing kit as its users get it: a suite outside the project, run as a user would.

It has no conftest, imports no module of the app and uses only the kit's fixtures (the `pytest11`
plugin) and Playwright.

The suite is the two examples of docs/TESTING.md (e2e/testing_kit/), copied into a temporary
folder and run by pytest in a child process: a delegation that streams into the panel, a failure half
way with its reason, a timeout, Stop during a callee that never ends, and the REST + SSE path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

EXAMPLES = Path(__file__).resolve().parent / "testing_kit"


@pytest.mark.e2e
def test_a_users_suite_outside_the_project_drives_the_panel_with_the_kit(tmp_path: Path) -> None:
    for example in EXAMPLES.glob("example_*.py"):
        shutil.copy(example, tmp_path / f"test_{example.name.removeprefix('example_')}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "NICEGUI_"))}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "5 passed" in result.stdout, result.stdout[-3000:]


def test_the_examples_in_docs_testing_are_the_ones_that_run() -> None:
    doc = (EXAMPLES.parent.parent / "docs" / "TESTING.md").read_text(encoding="utf-8")
    for example in sorted(EXAMPLES.glob("example_*.py")):
        assert f"```python\n{example.read_text(encoding='utf-8').rstrip()}\n```" in doc, example.name


@pytest.fixture
def chat_app_users() -> dict[str, str]:
    """Two accounts: the kit's `chat_app` then runs with accounts (the fixture a user would override)."""
    return {"alice": "alice-password-1", "bob": "bob-password-2"}


@pytest.mark.e2e
@pytest.mark.chat_app_settings(DEMO_MODEL_DELAY_MS="0")
def test_with_accounts_the_kit_logs_in_and_keeps_users_apart(chat_app, chat_page) -> None:
    session = chat_app.new_session()  # as alice, the first user
    chat_app.send(session, "hello")
    assert list(chat_app.stream(session))[-1]["type"] == "finish"
    bob = chat_app.as_user("bob")
    assert bob.http.get(f"/api/sessions/{session}/messages").status_code == 404
    assert httpx.get(f"{chat_app.base_url}/api/sessions", timeout=10).status_code == 401
    # chat_page logged in through /login: alice's chat is in her list.
    chat_page.reload()
    expect(chat_page.get_by_test_id("session-item")).to_have_count(1)
