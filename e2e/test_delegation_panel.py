"""Delegation in a real Chromium (seed 000 §3.5.2): the side panel, the saved task, the audit view.

The seeded `general-assistant` (with `agent-invoke`) and `coding-assistant` run on
the demo model, so what the callee says is known exactly: an echo of the input
with a code block (`core/chat/demo_model.py`), or lorem ipsum for `/lorem N`.
"""

from __future__ import annotations

import time

import httpx
import pytest
from playwright.sync_api import Page, expect

from core.chat.demo_model import _echo
from e2e.helpers import (
    TURN_TIMEOUT_MS,
    as_rendered,
    lorem,
    open_chat,
    send,
    session_id_of,
    unique,
    wait_for_turn_end,
    words,
)

pytestmark = pytest.mark.e2e

_BODY_TEXT = """(taskId) => {
    const body = document.querySelector(`[data-testid=agent-invoke-body][data-task-id="${taskId}"]`);
    return body ? body.innerText.trim() : null;
}"""


# Every length the panel's bodies have shown (a MutationObserver, installed before the send: on a
# loaded machine the whole reply can stream before a test that polls gets to look at the panel).
_RECORD_BODY_LENGTHS = """() => {
    window.__bodyLengths = {};
    const seen = () => document.querySelectorAll('[data-testid=agent-invoke-body]').forEach(body => {
        const lengths = (window.__bodyLengths[body.dataset.taskId] ||= []);
        const length = body.innerText.trim().length;
        if (lengths[lengths.length - 1] !== length) lengths.push(length);
    });
    new MutationObserver(seen).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


def tasks_of(base_url: str, session_id: str) -> list[dict]:
    """The tasks the server saved for a calling session, oldest first."""
    tasks = httpx.get(f"{base_url}/api/tasks", timeout=5.0).json()
    return sorted((t for t in tasks if t["callerSessionId"] == session_id), key=lambda t: t["createdAt"])


def task_ids_in_panel(page: Page) -> list[str]:
    """The task ids of the panel's tabs, in order."""
    return page.get_by_test_id("agent-invoke-tab").evaluate_all("tabs => tabs.map(t => t.dataset.taskId)")


def body_text(page: Page, task_id: str) -> str:
    """What the panel shows for a task (only the selected tab is rendered)."""
    return page.evaluate(_BODY_TEXT, task_id) or ""


def test_mention_opens_the_panel_which_streams_and_the_task_is_saved(page: Page, base_url: str) -> None:
    """`@coding-assistant …`: the panel opens by itself, streams, ends done; the task is saved and audited."""
    request = unique("write a greeting function")
    open_chat(page, "/?agent=general-assistant")
    page.evaluate(_RECORD_BODY_LENGTHS)
    send(page, f"@coding-assistant {request}")
    panel = page.get_by_test_id("agent-invoke-panel")
    expect(panel).to_be_visible(timeout=10_000)
    tab = page.get_by_test_id("agent-invoke-tab")
    expect(tab).to_have_count(1)
    expect(tab).to_contain_text("Coding Assistant")
    task_id = tab.get_attribute("data-task-id")
    assert task_id

    expect(page.get_by_test_id("agent-invoke-status")).to_have_text("completed", timeout=TURN_TIMEOUT_MS)
    wait_for_turn_end(page)
    expected = _echo(request, wants_code=True)
    final = body_text(page, task_id)
    assert words(final) == words(as_rendered(expected))
    lengths = page.evaluate("(taskId) => window.__bodyLengths[taskId] || []", task_id)
    intermediate = {n for n in lengths if 0 < n < len(final)}
    assert len(intermediate) >= 3, f"the panel should grow visibly while streaming, saw lengths {lengths}"
    expect(panel).to_be_visible()  # stays open after completion

    # The caller's answer quotes the callee, and its card links the task.
    card = page.get_by_test_id("tool-call")
    expect(card).to_contain_text("Delegated to Coding Assistant")
    expect(card).to_contain_text("completed")
    assert card.get_attribute("data-task-id") == task_id

    # Saved: a completed task and the callee's messages with source='a2a' and the caller's context.
    session_id = session_id_of(page)
    [task] = tasks_of(base_url, session_id)
    assert task["id"] == task_id and task["state"] == "completed" and task["calleeAgentId"] == "coding-assistant"
    assert task["callerAgentId"] == "general-assistant" and task["input"] == request
    detail = httpx.get(f"{base_url}/api/tasks/{task_id}", timeout=5.0).json()
    assert [(m["role"], m["source"]) for m in detail["messages"]] == [("user", "a2a"), ("assistant", "a2a")]
    assert all(m["a2aTaskId"] == task_id and m["callerSessionId"] == session_id for m in detail["messages"])
    assert detail["messages"][1]["content"] == expected

    # The task's session is not in the chat list; the audit view has it.
    listed = {s["id"] for s in httpx.get(f"{base_url}/api/sessions", timeout=5.0).json()}
    assert session_id in listed and task["sessionId"] not in listed
    expect(page.locator(f'[data-testid=session-item][data-session-id="{task["sessionId"]}"]')).to_have_count(0)
    page.goto("/audit")
    row = page.locator(f'[data-testid=audit-row][data-task-id="{task_id}"]')
    expect(row).to_contain_text("Coding Assistant")
    expect(row).to_contain_text("completed")
    row.get_by_role("link").click()
    expect(page.get_by_test_id("audit-task")).to_contain_text("General Assistant → Coding Assistant")
    expect(page.get_by_test_id("audit-message")).to_have_count(2)
    expect(page.get_by_test_id("audit-message").last).to_contain_text(f'return "{request}"')
    expect(page.get_by_test_id("msg-input")).to_have_count(0)  # read-only


def test_close_then_reopen_from_the_card(page: Page) -> None:
    """The close button hides the panel; clicking the delegation card opens that task again."""
    open_chat(page, "/?agent=general-assistant")
    send(page, f"@coding-assistant {unique('tiny task')}")
    expect(page.get_by_test_id("agent-invoke-status")).to_have_text("completed", timeout=TURN_TIMEOUT_MS)
    wait_for_turn_end(page)
    panel = page.get_by_test_id("agent-invoke-panel")
    page.get_by_test_id("agent-invoke-close").click()
    expect(panel).to_be_hidden()
    page.get_by_test_id("tool-call").click()
    expect(panel).to_be_visible()
    expect(page.get_by_test_id("agent-invoke-status")).to_have_text("completed")


def test_two_mentions_give_two_tabs_in_order(page: Page, base_url: str) -> None:
    """Two mentions in one message: two tasks, two tabs in the order they started, each with its own status."""
    first, second = unique("first job"), unique("second job")
    open_chat(page, "/?agent=general-assistant")
    send(page, f"@coding-assistant {first} @coding-assistant {second}")
    tabs = page.get_by_test_id("agent-invoke-tab")
    expect(tabs).to_have_count(2, timeout=10_000)
    wait_for_turn_end(page)
    session_id = session_id_of(page)
    saved = tasks_of(base_url, session_id)
    assert [t["input"] for t in saved] == [first, second]
    assert task_ids_in_panel(page) == [t["id"] for t in saved]
    for i, task in enumerate(saved):
        tabs.nth(i).click()
        status = page.locator(f'[data-testid=agent-invoke-status][data-task-id="{task["id"]}"]')
        expect(status).to_have_text("completed")
        expect(page.locator(f'[data-testid=agent-invoke-body][data-task-id="{task["id"]}"]')).to_contain_text(
            task["input"]
        )


def test_reload_mid_delegation_restores_the_panel(page: Page, base_url: str) -> None:
    """A reload while the callee streams: the panel is back with the text so far, and the rest follows live."""
    open_chat(page, "/?agent=general-assistant")
    send(page, "@coding-assistant /lorem 400")
    tab = page.get_by_test_id("agent-invoke-tab")
    expect(tab).to_have_count(1, timeout=10_000)
    task_id = tab.get_attribute("data-task-id")
    deadline = time.monotonic() + 10
    while len(body_text(page, task_id)) < 200 and time.monotonic() < deadline:
        page.wait_for_timeout(25)
    before = len(body_text(page, task_id))
    assert before >= 200

    page.reload()
    page.wait_for_function("() => window.socket && window.socket.connected")
    expect(page.get_by_test_id("agent-invoke-panel")).to_be_visible()
    expect(page.get_by_test_id("agent-invoke-tab")).to_have_count(1)
    assert page.get_by_test_id("agent-invoke-tab").get_attribute("data-task-id") == task_id
    expect(page.get_by_test_id("agent-invoke-status")).to_have_text("working")
    expect(page.get_by_test_id("agent-invoke-status")).to_have_text("completed", timeout=TURN_TIMEOUT_MS)
    assert words(body_text(page, task_id)) == words(lorem(400))
    wait_for_turn_end(page)
    detail = httpx.get(f"{base_url}/api/tasks/{task_id}", timeout=5.0).json()
    assert detail["state"] == "completed" and detail["messages"][-1]["content"] == lorem(400)


def ensure_planner(base_url: str) -> None:
    """A third agent that may delegate, for nested delegations (created once per server)."""
    response = httpx.post(
        f"{base_url}/api/agents",
        timeout=5.0,
        json={
            "id": "planner",
            "name": "Planner",
            "systemPrompt": "You plan work and delegate it.",
            "canDelegate": True,
        },
    )
    assert response.status_code in (201, 409), response.text


def test_a_nested_delegation_is_a_child_tab_of_its_parent(page: Page, base_url: str) -> None:
    """General → planner → coding-assistant: two tabs, the second marked as the first one's child."""
    ensure_planner(base_url)
    open_chat(page, "/?agent=general-assistant")
    send(page, f"@planner {unique('plan')} @@coding-assistant write it")
    tabs = page.get_by_test_id("agent-invoke-tab")
    expect(tabs).to_have_count(2, timeout=10_000)
    wait_for_turn_end(page)
    parent_id, child_id = task_ids_in_panel(page)
    assert tabs.nth(0).get_attribute("data-depth") == "0"
    assert tabs.nth(1).get_attribute("data-parent-task-id") == parent_id
    assert tabs.nth(1).get_attribute("data-depth") == "1"
    expect(tabs.nth(1)).to_contain_text("Coding Assistant")
    tabs.nth(1).click()
    expect(page.locator(f'[data-testid=agent-invoke-status][data-task-id="{child_id}"]')).to_have_text("completed")
    expect(page.locator(f'[data-testid=agent-invoke-body][data-task-id="{child_id}"]')).to_contain_text("write it")
    page.goto(f"/audit/{parent_id}")
    expect(page.get_by_test_id("audit-child")).to_have_attribute("data-task-id", child_id)


def test_closing_the_page_mid_delegation_loses_nothing(page: Page, browser, base_url: str) -> None:
    """The caller's page goes away while the callee streams; the delegation finishes, and reopening shows it."""
    open_chat(page, "/?agent=general-assistant")
    send(page, "@coding-assistant /lorem 300")
    expect(page.get_by_test_id("agent-invoke-tab")).to_have_count(1, timeout=10_000)
    session_id = session_id_of(page)
    task_id = page.get_by_test_id("agent-invoke-tab").get_attribute("data-task-id")
    page.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if httpx.get(f"{base_url}/api/tasks/{task_id}", timeout=5.0).json()["state"] == "completed":
            break
        time.sleep(0.1)
    detail = httpx.get(f"{base_url}/api/tasks/{task_id}", timeout=5.0).json()
    assert detail["state"] == "completed" and detail["messages"][-1]["content"] == lorem(300)

    reopened = browser.new_page(base_url=base_url)
    try:
        open_chat(reopened, f"/chat/{session_id}")
        wait_for_turn_end(reopened)
        card = reopened.get_by_test_id("tool-call")
        expect(card).to_contain_text("completed")
        card.click()
        expect(reopened.get_by_test_id("agent-invoke-status")).to_have_text("completed")
        body = reopened.locator(f'[data-testid=agent-invoke-body][data-task-id="{task_id}"]')
        expect(body).to_contain_text(lorem(300).split()[-1])
    finally:
        reopened.close()
