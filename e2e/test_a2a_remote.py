"""A remote A2A agent in a real Chromium (issue 6): registered by card URL, its stream shown in the side panel.

The remote agent is `tests/utils/a2a_echo_server.py` (only the a2a-sdk), in its
own process, pausing 40 ms between words so the panel visibly streams.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from e2e.conftest import VIEWPORTS
from e2e.helpers import TURN_TIMEOUT_MS, open_chat, register_remote, send, session_id_of, unique, wait_for_turn_end
from tests.utils.a2a_agents import echo_server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def echo_card_url() -> Iterator[str]:
    """The card URL of a slow echo agent built on the a2a-sdk."""
    with echo_server("--delay-ms", "40", "--name", "Echo Agent") as url:
        yield url


def test_a_remote_agent_streams_into_the_panel_and_is_audited(page: Page, base_url: str, echo_card_url: str) -> None:
    """`@<remote id> …`: the panel opens on the remote agent and grows word by word; the exchange is audited."""
    agent_id = register_remote(base_url, echo_card_url, f"echo-{unique('x').split()[1]}")
    # Twenty-odd words at 40 ms each: long enough to see the panel grow even on a loaded machine.
    request = unique(
        "words from far away, one at a time, arriving slowly so that the panel can be seen "
        "growing while the remote agent is still streaming its answer"
    )
    expected = f"Echo: {request}"

    open_chat(page, "/?agent=general-assistant")
    send(page, f"@{agent_id} {request}")
    tab = page.get_by_test_id("agent-invoke-tab")
    expect(tab).to_have_count(1, timeout=10_000)
    expect(tab).to_contain_text("Echo Agent")
    task_id = tab.get_attribute("data-task-id")
    body = page.locator(f'[data-testid=agent-invoke-body][data-task-id="{task_id}"]')
    status = page.get_by_test_id("agent-invoke-status")
    lengths: set[int] = set()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if body.count():
            lengths.add(len(body.inner_text().strip()))
        if status.inner_text() == "completed":
            break
        page.wait_for_timeout(20)
    expect(status).to_have_text("completed", timeout=TURN_TIMEOUT_MS)
    expect(body).to_have_text(expected)
    intermediate = {n for n in lengths if 0 < n < len(expected)}
    assert len(intermediate) >= 3, f"the panel should grow while the remote agent streams, saw {sorted(lengths)}"
    wait_for_turn_end(page)

    session_id = session_id_of(page)
    [task] = [t for t in httpx.get(f"{base_url}/api/tasks", timeout=5).json() if t["callerSessionId"] == session_id]
    assert (task["id"], task["calleeAgentId"], task["state"]) == (task_id, agent_id, "completed")
    page.goto(f"/audit/{task_id}")
    expect(page.get_by_test_id("audit-task")).to_contain_text("General Assistant → Echo Agent")
    expect(page.get_by_test_id("audit-message")).to_have_count(2)
    expect(page.get_by_test_id("audit-message").last).to_contain_text(expected)


@pytest.mark.parametrize("size", list(VIEWPORTS))
def test_progress_notes_stay_on_their_own_lines_above_the_answer(
    browser: Browser, base_url: str, echo_card_url: str, size: str
) -> None:
    """Issue 36 item 5: `/chunks`' notes ("starting…", "chunk i/N") and its answer in chunks never run together."""
    agent_id = register_remote(base_url, echo_card_url, f"notes-{unique('x').split()[1]}-{size}")
    context = browser.new_context(viewport=VIEWPORTS[size], base_url=base_url)
    page = context.new_page()
    try:
        open_chat(page, "/?agent=general-assistant")
        send(page, f"@{agent_id} /chunks far away words")
        tab = page.get_by_test_id("agent-invoke-tab")
        expect(tab).to_have_count(1, timeout=10_000)
        task_id = tab.get_attribute("data-task-id")
        expect(page.get_by_test_id("agent-invoke-status")).to_have_text("completed", timeout=TURN_TIMEOUT_MS)
        body = page.locator(f'[data-testid=agent-invoke-body][data-task-id="{task_id}"]')
        expect(body.locator("p")).to_have_text(["starting…", "chunk 1/3", "chunk 2/3", "chunk 3/3", "far away words"])
        expect(body).to_be_in_viewport()
        widths = page.evaluate("() => [document.documentElement.scrollWidth, innerWidth]")
        assert widths[0] <= widths[1], f"the page is {widths[0]} px wide in a {widths[1]} px viewport"
        wait_for_turn_end(page)
        reply = page.get_by_test_id("assistant-message").last.locator("blockquote")
        expect(reply).to_have_text("far away words")  # the answer alone
    finally:
        context.close()
