"""Issue 39, item 3: usage in the chat (folded in each answer's menu) and the audit's waterfall of a chain.

At 1280×800 and 390×844: a nested delegation (`@planner plan @@coding-assistant code it`); the last
answer's menu says its tokens; `/audit/{child}` draws the whole chain, one row a hop, each bar inside
the time line, and nothing is wider than the screen.
"""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from e2e.helpers import open_chat, send, session_id_of, wait_for_turn_end

pytestmark = pytest.mark.e2e

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}


@pytest.fixture(params=[DESKTOP, PHONE], ids=["desktop", "phone"])
def sized_page(browser: Browser, base_url: str, request: pytest.FixtureRequest) -> Page:
    context = browser.new_context(viewport=request.param, base_url=base_url)
    context.set_default_timeout(15_000)
    page = context.new_page()
    yield page
    context.close()


def fits_the_screen(page: Page) -> None:
    widths = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[0] <= widths[1], f"the page is {widths[0]} px wide on a screen of {widths[1]} px"


def test_an_answers_usage_and_the_waterfall_of_its_delegation_chain(sized_page: Page, base_url: str) -> None:
    page = sized_page
    open_chat(page)
    send(page, "@planner plan @@coding-assistant code it")
    wait_for_turn_end(page)
    session_id = session_id_of(page)

    page.keyboard.press("Escape")  # the side panel closes (it covers the chat on a phone)
    expect(page.get_by_test_id("agent-invoke-panel")).to_be_hidden()
    page.get_by_test_id("answer-menu-btn").last.click()
    usage = page.get_by_test_id("answer-usage")
    expect(usage).to_be_visible()
    expect(usage).to_contain_text("Tokens")
    page.keyboard.press("Escape")

    tasks = httpx.get(f"{base_url}/api/tasks", timeout=10).json()
    mine = [t for t in tasks if t["callerSessionId"] == session_id]
    root = next(t for t in mine if t["parentTaskId"] is None)
    child = next(t for t in tasks if t["parentTaskId"] == root["id"])
    page.goto(f"/audit/{child['id']}")
    waterfall = page.get_by_test_id("audit-waterfall")
    expect(waterfall).to_be_visible()
    rows = waterfall.get_by_test_id("audit-waterfall-row")
    expect(rows).to_have_count(2)
    assert rows.nth(0).get_attribute("data-task-id") == root["id"]
    assert rows.nth(1).get_attribute("data-task-id") == child["id"]
    assert [rows.nth(i).get_attribute("data-depth") for i in range(2)] == ["1", "2"]
    expect(rows.nth(1).get_by_test_id("audit-waterfall-figures")).to_contain_text("tokens")
    # Each bar lies inside its track, and the child's starts no earlier than its parent's.
    boxes = page.evaluate(
        """() => Array.from(document.querySelectorAll('[data-testid=audit-waterfall-row]')).map(row => {
               const track = row.querySelector('.waterfall-track').getBoundingClientRect();
               const bar = row.querySelector('.waterfall-bar').getBoundingClientRect();
               return [track.left, track.right, bar.left, bar.right];
           })"""
    )
    for track_left, track_right, bar_left, bar_right in boxes:
        assert track_left - 1 <= bar_left <= bar_right <= track_right + 1
    # One time line: every row's track as wide as the others, and wide enough to read.
    widths = {round(right - left) for left, right, _, _ in boxes}
    assert len(widths) == 1 and widths.pop() >= 150, f"the tracks are {boxes}"
    assert boxes[1][2] >= boxes[0][2] - 1
    fits_the_screen(page)
