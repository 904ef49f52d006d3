"""A broker agent working in the background of a chat, in a real Chromium (issue 5, item 6).

The example echo agent dials in through the agent-side pipe (both real processes);
the General Assistant dispatches to it with its `a2a_<id>` tool. The turn ends at
once; the agent's stream shows in the side panel; its progress arrives in the chat
as a quiet note and its result as a note the assistant then announces, live and
after a reload.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Page, expect

from e2e.conftest import REPO_ROOT
from e2e.helpers import TURN_TIMEOUT_MS, open_chat, send, unique, wait_for_turn_end

pytestmark = pytest.mark.e2e

AGENT_NAME = "Background Echo"


@pytest.fixture(scope="module")
def echo_agent_id(base_url: str) -> Iterator[str]:
    """A broker agent id served by `examples/echo_agent.py` behind `python -m core.pipe`."""
    agent_id = f"bg-{unique('x').split()[1]}"
    ws_url = base_url.replace("http://", "ws://") + f"/a2a?a2a_id={agent_id}"
    env = {**os.environ, "ECHO_DELAY": "0.15", "ECHO_NAME": AGENT_NAME, "PYTHONUNBUFFERED": "1"}
    env.pop("PYTEST_CURRENT_TEST", None)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "core.pipe",
            ws_url,
            "--",
            sys.executable,
            str(REPO_ROOT / "examples" / "echo_agent.py"),
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while agent_id not in {a["a2a_id"] for a in httpx.get(f"{base_url}/a2a/agents", timeout=2).json()["agents"]}:
            assert process.poll() is None and time.monotonic() < deadline, "the echo agent did not connect"
            time.sleep(0.05)
        yield agent_id
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_a_background_task_reports_back_into_the_chat(page: Page, echo_agent_id: str) -> None:
    """`/background @<agent> …`: the turn ends at once, the panel streams, notes arrive, the result is announced."""
    words = unique("seven words travel slowly through the broker").split()
    request = " ".join(words)

    open_chat(page, "/?agent=general-assistant")
    send(page, f"/background @{echo_agent_id} {request}")
    card = page.get_by_test_id("tool-call")
    expect(card).to_contain_text(f"Sent to {AGENT_NAME} in the background", timeout=TURN_TIMEOUT_MS)
    expect(card.get_by_test_id("tool-call-status")).to_have_text("started; the result will follow")
    expect(page.get_by_test_id("assistant-message").last).to_contain_text("working on it in the background")
    wait_for_turn_end(page)  # the chat is free while the agent works

    # The agent's stream in the side panel, like any delegation.
    tab = page.get_by_test_id("agent-invoke-tab")
    expect(tab).to_have_count(1)
    expect(tab).to_contain_text(AGENT_NAME)
    task_id = tab.get_attribute("data-task-id")

    # Progress: a quiet note, no reply. (The echo's artifact chunks are progress too, seed 003: those
    # that come after the throttle interval, INJECT_MIN_INTERVAL, are notes as well.)
    delay_note = page.locator("[data-testid=inject-note][data-mode=delay] [data-testid=inject-note-text]").first
    expect(delay_note).to_have_text(f"[{AGENT_NAME}] Echoing {len(words)} words…", timeout=TURN_TIMEOUT_MS)
    expect(page.get_by_test_id("assistant-message")).to_have_count(1)

    # The result: a note, then the assistant announces it in a turn of its own.
    auto_note = page.locator("[data-testid=inject-note][data-mode=auto] [data-testid=inject-note-text]")
    expect(auto_note).to_have_text(f"[{AGENT_NAME}] {request}", timeout=TURN_TIMEOUT_MS)
    announcement = page.get_by_test_id("assistant-message").last
    expect(page.get_by_test_id("assistant-message")).to_have_count(2, timeout=TURN_TIMEOUT_MS)
    expect(announcement).to_contain_text(f"Result from {AGENT_NAME}:")
    expect(announcement).to_contain_text(request)
    wait_for_turn_end(page)
    body = page.locator(f'[data-testid=agent-invoke-body][data-task-id="{task_id}"]')
    expect(body).to_contain_text(f"Echoing {len(words)} words…")
    expect(body).to_contain_text(request)
    expect(page.get_by_test_id("agent-invoke-status")).to_have_text("completed")

    # Saved in order: after a reload the chat reads the same.
    page.reload()
    page.wait_for_function("() => window.socket && window.socket.connected")
    expect(page.locator("[data-testid=inject-note][data-mode=auto]")).to_have_count(1)
    expect(page.get_by_test_id("assistant-message").last).to_contain_text(f"Result from {AGENT_NAME}:")
    order = page.evaluate("""() => Array.from(document.querySelectorAll(
        '[data-testid=user-message], [data-testid=assistant-message], [data-testid=inject-note]'))
        .map(e => e.dataset.mode || e.dataset.testid)""")
    assert order[0] == "user-message" and order[-3:] == ["delay", "auto", "assistant-message"], order
    notes = [kind for kind in order if kind in {"delay", "auto"}]
    assert notes[-1] == "auto" and set(notes[:-1]) == {"delay"}, order  # progress notes, then the result
    # A note opens its task in the side panel.
    page.locator("[data-testid=inject-note][data-mode=auto]").click()
    expect(page.get_by_test_id("agent-invoke-panel")).to_be_visible()
    expect(page.locator(f'[data-testid=agent-invoke-tab][data-task-id="{task_id}"]')).to_have_count(1)


def test_the_background_card_runs_until_its_task_ends(page: Page, echo_agent_id: str) -> None:
    """Issue 40, item 9d: the card said "completed 0.0 s" (the dispatch's own time) while the agent worked."""
    request = " ".join(unique("twenty words").split() + [f"w{i}" for i in range(18)])  # ≈ 3 s at 0.15 s a word
    open_chat(page, "/?agent=general-assistant")
    send(page, f"/background @{echo_agent_id} {request}")
    card = page.get_by_test_id("tool-call")
    expect(card).to_contain_text(f"Sent to {AGENT_NAME} in the background", timeout=TURN_TIMEOUT_MS)
    tab = page.get_by_test_id("agent-invoke-tab")
    expect(tab).to_have_attribute("data-state", "working", timeout=TURN_TIMEOUT_MS)
    expect(card).to_have_attribute("data-state", "working")
    expect(card.get_by_test_id("tool-call-status")).to_have_text("started; the result will follow")
    expect(card.get_by_test_id("tool-call-duration")).to_have_text("")  # no "0.0 s" beside a running task

    expect(tab).to_have_attribute("data-state", "completed", timeout=TURN_TIMEOUT_MS)
    expect(card).to_have_attribute("data-state", "completed")
    expect(card.get_by_test_id("tool-call-status")).to_have_text("completed")
    wait_for_turn_end(page)

    page.reload()  # saved: the task's own time
    page.wait_for_function("() => window.socket && window.socket.connected")
    took = page.get_by_test_id("tool-call").first.get_by_test_id("tool-call-duration")
    expect(took).to_have_text(re.compile(r"^\d+\.\d s$"))
    assert float(took.inner_text().split()[0]) >= 1.0, took.inner_text()
