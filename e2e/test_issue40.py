"""Issue 40: the rough edges a newcomer hits in the browser, at 1280×800 and 390×844.

The panel's own Stop on a phone, the delegation card's state beside a long request, keyboard
focus that shows, the phone's first page at its top.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from e2e.helpers import TURN_TIMEOUT_MS, open_chat, send, wait_for_turn_end

pytestmark = pytest.mark.e2e

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}
FIRST_TURN_MS = 30_000  # a fresh server's first turn imports LiteLLM (3-5 s, more on a busy machine)


def _page(browser: Browser, base_url: str, viewport: dict) -> Page:
    context = browser.new_context(viewport=viewport, base_url=base_url)
    context.set_default_timeout(10_000)
    return context.new_page()


@pytest.fixture
def phone(browser: Browser, base_url: str) -> Iterator[Page]:
    """A page at 390x844."""
    page = _page(browser, base_url, PHONE)
    try:
        yield page
    finally:
        page.context.close()


@pytest.fixture
def desktop(browser: Browser, base_url: str) -> Iterator[Page]:
    """A page at 1280x800."""
    page = _page(browser, base_url, DESKTOP)
    try:
        yield page
    finally:
        page.context.close()


def close_session_drawer(page: Page) -> None:
    """On a phone the session drawer opens over the chat: close it with its backdrop."""
    backdrop = page.locator(".q-drawer__backdrop")
    if backdrop.count() and backdrop.first.is_visible():
        backdrop.first.click(position={"x": 380, "y": 400})
        expect(backdrop.first).to_be_hidden()


def test_the_panel_has_its_own_stop_on_a_phone(phone: Page) -> None:
    """Item 2: with the panel over the whole phone screen, its own Stop is in view and stops the turn."""
    page = phone
    open_chat(page, "/?agent=general-assistant")
    close_session_drawer(page)
    send(page, "@coding-assistant /hang")
    panel = page.get_by_test_id("agent-invoke-panel")
    expect(panel).to_be_in_viewport(timeout=FIRST_TURN_MS)
    expect(page.get_by_test_id("agent-invoke-status")).to_have_text("working", timeout=FIRST_TURN_MS)
    stop = page.get_by_test_id("agent-invoke-stop")
    expect(stop).to_be_in_viewport()
    stop.click()  # Playwright clicks only what is on top at that point: nothing covers it
    expect(page.get_by_test_id("agent-invoke-tab")).to_have_attribute("data-state", "canceled", timeout=TURN_TIMEOUT_MS)
    expect(stop).to_be_hidden()
    wait_for_turn_end(page)
    expect(page.get_by_test_id("assistant-message").last).to_contain_text("Stopped.")


def _overlap(a: dict, b: dict) -> bool:
    return (
        a["x"] < b["x"] + b["width"]
        and b["x"] < a["x"] + a["width"]
        and a["y"] < b["y"] + b["height"]
        and b["y"] < a["y"] + a["height"]
    )


def test_the_delegation_cards_state_does_not_overlap_a_long_request(desktop: Page) -> None:
    """Item 4: "completed 0.4 s" sits beside a long request, not over it; the request is cut inside the card."""
    page = desktop
    open_chat(page, "/?agent=general-assistant")
    request = "write a function that greets " + " ".join(f"word{i}" for i in range(40))
    send(page, f"@coding-assistant {request}")
    wait_for_turn_end(page)
    card = page.get_by_test_id("tool-call").last
    expect(card.get_by_test_id("tool-call-status")).to_have_text("completed")
    expect(card.get_by_test_id("tool-call-duration")).to_contain_text(" s")
    boxes = {
        name: card.get_by_test_id(name).bounding_box()
        for name in ("tool-call-title", "tool-call-request", "tool-call-status", "tool-call-duration")
    }
    card_box = card.bounding_box()
    assert card_box and all(boxes.values()), boxes
    for text in ("tool-call-title", "tool-call-request"):
        for state in ("tool-call-status", "tool-call-duration"):
            assert not _overlap(boxes[text], boxes[state]), f"{text} {boxes[text]} overlaps {state} {boxes[state]}"
    for name, box in boxes.items():
        assert box["x"] + box["width"] <= card_box["x"] + card_box["width"] + 1, f"{name} sticks out of the card"
