"""The testing kit as its users get it: a suite outside the project, run as a user would.

It has no conftest, imports no module of the app and uses only the kit's fixtures (the `pytest11`
plugin) and Playwright.

The suite is the examples of docs/TESTING.md (e2e/testing_kit/), copied into a temporary
folder and run by pytest in a child process: a delegation that streams into the panel, a failure half
way with its reason, a timeout, Stop during a callee that never ends, three parallel delegations in three
tabs, and the REST + SSE path. The pytest-playwright example skips where pytest-playwright (not a test
extra) is missing; scripts/package-check runs it. A second run shares one app for the session, on a port
of its own, started through `--chat-app-command`.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from a2a_chat_testing import free_port

EXAMPLES = Path(__file__).resolve().parent / "testing_kit"


def run_users_suite(folder: Path, *options: str) -> str:
    for example in EXAMPLES.glob("example_*.py"):
        shutil.copy(example, folder / f"test_{example.name.removeprefix('example_')}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "NICEGUI_"))}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *options, str(folder)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    return result.stdout


def passed_all(out: str, tests: int) -> bool:
    """Every test passed, but for the pytest-playwright example where pytest-playwright is not installed."""
    if importlib.util.find_spec("pytest_playwright") is not None:
        return f"{tests} passed" in out
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    return f"{tests - 1} passed, 1 skipped" in out and len(skipped) == 1 and "test_pytest_playwright.py" in skipped[0]


@pytest.mark.e2e
def test_a_users_suite_outside_the_project_drives_the_panel_with_the_kit(tmp_path: Path) -> None:
    out = run_users_suite(tmp_path)
    assert passed_all(out, 7), out[-3000:]


@pytest.mark.e2e
def test_one_app_for_the_session_on_a_chosen_port_started_by_a_chosen_command(tmp_path: Path) -> None:
    port = free_port()
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(EXAMPLES.parent.parent / 'app.py'))}"
    # Two more tests write down which process served them, and where.
    (tmp_path / "test_zz_shared.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.parametrize('n', [1, 2])\n"
        "def test_the_app(chat_app, n):\n"
        "    assert chat_app.messages(chat_app.new_session()) == [] and chat_app.tasks() == []\n"
        "    with open('served.txt', 'a') as f:\n"
        "        f.write(f'{chat_app.process.pid} {chat_app.port}\\n')\n",
        encoding="utf-8",
    )
    out = run_users_suite(
        tmp_path, "--chat-app-scope=session", f"--chat-app-port={port}", f"--chat-app-command={command}"
    )
    assert passed_all(out, 9), out[-3000:]
    served = set((tmp_path / "served.txt").read_text().splitlines())
    assert len(served) == 1 and served.pop().endswith(f" {port}")  # one app, on that port


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


@pytest.mark.e2e
@pytest.mark.chat_app_settings(DEMO_MODEL_DELAY_MS="0")
def test_the_kit_attaches_files_and_reads_a_tasks_file_and_data(chat_app) -> None:
    """Issue 36: `attach`, `send(attachments=…)`, a task's `a2a-artifact` events and `download`."""
    session = chat_app.new_session()
    file = chat_app.attach(session, "notes.txt", b"hello", "text/plain")
    assert (file["name"], file["mime"], file["size"]) == ("notes.txt", "text/plain", 5)
    chat_app.send(session, "@coding-assistant /file chart.png", attachments=[file["id"]])
    events = list(chat_app.stream(session))
    [started] = [e["data"] for e in events if e["type"] == "a2a-task-started"]
    [artifact] = [e["data"] for e in chat_app.task_stream(started["taskId"]) if e["type"] == "a2a-artifact"]
    assert (artifact["artifactKind"], artifact["name"], artifact["mime"]) == ("file", "chart.png", "image/png")
    assert chat_app.download(artifact["attachmentId"]).startswith(b"\x89PNG")
    assert chat_app.messages(session)[0]["attachments"][0]["id"] == file["id"]
