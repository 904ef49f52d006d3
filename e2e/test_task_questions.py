"""Questions back in a real Chromium (issue 36), at 1280×800 and 390×844.

A remote a2a-sdk agent (`tests/utils/a2a_asking_server.py`, its own process) asks
`Which city do you mean? (task T, context C)`: the side panel shows its question with an
answer box, and the answer, from the box or over REST, completes the same remote task.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Page, expect

from a2a_chat_testing.panel import Panel
from e2e.helpers import TURN_TIMEOUT_MS, open_chat, register_remote, send, unique, wait_for_turn_end
from tests.utils.a2a_agents import asking_server

pytestmark = pytest.mark.e2e

IDS = re.compile(r"\(task (\S+), context (\S+)\)")


@pytest.fixture(scope="module")
def asking_card_url() -> Iterator[str]:
    """The card URL of the asking agent."""
    with asking_server() as url:
        yield url


def _fits(page: Page) -> None:
    width = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
    assert width <= 0, f"the page is {width} px wider than the screen"


def _ask(page: Page, base_url: str, card_url: str) -> tuple[str, str]:
    """Delegate to the asking agent; returns the task id and the question, once the panel shows it."""
    agent_id = register_remote(base_url, card_url, f"asker-{unique('x').split()[1]}")
    open_chat(page, "/?agent=general-assistant")
    send(page, f"@{agent_id} {unique('what is the weather')}")
    tab = page.get_by_test_id("agent-invoke-tab")
    expect(tab).to_have_count(1, timeout=TURN_TIMEOUT_MS)
    expect(tab).to_have_attribute("data-state", "input-required", timeout=TURN_TIMEOUT_MS)
    task_id = tab.get_attribute("data-task-id") or ""
    question = page.get_by_test_id("agent-panel-question")
    expect(question).to_be_visible()
    expect(question).to_contain_text("Which city do you mean?")
    expect(page.get_by_test_id("agent-invoke-status")).to_have_text("input-required")
    expect(page.get_by_test_id("agent-panel-answer-input")).to_be_visible()
    expect(page.get_by_test_id("agent-panel-answer-send")).to_be_visible()
    _fits(page)
    return task_id, question.inner_text()


def test_the_panel_shows_the_question_and_its_answer_completes_the_task(
    sized_page: Page, base_url: str, asking_card_url: str
) -> None:
    page = sized_page
    task_id, question = _ask(page, base_url, asking_card_url)
    # The API says the same.
    task = httpx.get(f"{base_url}/api/tasks/{task_id}").json()
    assert (task["state"], task["question"]) == ("input-required", question)
    expect(page.get_by_test_id("stop-btn")).to_be_visible()  # the caller's turn waits

    page.get_by_test_id("agent-panel-answer-input").fill("Paris")
    page.get_by_test_id("agent-panel-answer-send").click()
    expect(page.get_by_test_id("agent-panel-question-box")).to_be_hidden()
    tab = page.get_by_test_id("agent-invoke-tab")
    expect(tab).to_have_attribute("data-state", "completed", timeout=TURN_TIMEOUT_MS)
    body = page.get_by_test_id("agent-invoke-body")
    expect(body).to_contain_text("You answered: Paris")
    _fits(page)
    asked = IDS.search(question)
    answered = IDS.search(body.inner_text())
    assert asked and answered and answered.groups() == asked.groups()  # the same remote task and context
    if page.viewport_size and page.viewport_size["width"] < 900:
        page.get_by_test_id("agent-invoke-back").click()
    wait_for_turn_end(page)
    done = httpx.get(f"{base_url}/api/tasks/{task_id}").json()
    assert (done["state"], done["question"]) == ("completed", None)


def test_an_answer_over_rest_closes_the_box_in_the_panel(page: Page, base_url: str, asking_card_url: str) -> None:
    task_id, _question = _ask(page, base_url, asking_card_url)
    answered = httpx.post(f"{base_url}/api/tasks/{task_id}/messages", json={"content": "Lyon"}, timeout=10)
    assert answered.status_code == 202, answered.text
    expect(page.get_by_test_id("agent-panel-question-box")).to_be_hidden()
    expect(page.get_by_test_id("agent-invoke-tab")).to_have_attribute(
        "data-state", "completed", timeout=TURN_TIMEOUT_MS
    )
    expect(page.get_by_test_id("agent-invoke-body")).to_contain_text("You answered: Lyon")
    wait_for_turn_end(page)


def test_a_local_callee_asks_with_the_demo_models_ask_through_the_kits_panel(page: Page) -> None:
    """`@coding-assistant /ask …`: the callee's `ask_user` tool; the testing kit's `Panel` reads and answers it."""
    open_chat(page, "/?agent=general-assistant")
    send(page, "@coding-assistant /ask Which language do you want?")
    panel = Panel(page).wait_open()
    tab = panel.wait_for_state("input-required")
    assert panel.question(tab) == "Which language do you want?"
    panel.answer("Rust", tab)
    done = panel.wait_for_state("completed", tab)
    assert "You answered: Rust" in panel.text(done)
    wait_for_turn_end(page)
    assert "You answered: Rust" in page.get_by_test_id("assistant-message").last.inner_text()
