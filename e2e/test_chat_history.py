"""Issue 40, item 10: what chat users expect, in a real Chromium at 1280×800 and 390×844.

Chats grouped by day in the sidebar; a menu on each answer (copy, and regenerate on the last one);
editing and sending again the last message. The answers are the offline demo model's, so each
check knows the exact text.
"""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from e2e.conftest import serve_app
from e2e.helpers import open_chat

pytestmark = pytest.mark.e2e

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}
FIRST_TURN_MS = 30_000  # a fresh server's first turn imports LiteLLM (3-5 s, more on a busy machine)


def _page(browser: Browser, base_url: str, viewport: dict) -> Page:
    context = browser.new_context(viewport=viewport, base_url=base_url, timezone_id="UTC")
    context.set_default_timeout(10_000)
    return context.new_page()


@pytest.fixture(params=[DESKTOP, PHONE], ids=["desktop", "phone"])
def viewport(request: pytest.FixtureRequest) -> dict:
    """Each test of this module at both sizes."""
    return request.param


def fits_the_screen(page: Page) -> None:
    """Nothing is wider than the screen: the page does not scroll sideways."""
    widths = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[0] <= widths[1], f"the page is {widths[0]} px wide on a screen of {widths[1]} px"


def open_drawer(page: Page) -> None:
    """On a phone the chat list is in the drawer behind the menu button."""
    if not page.get_by_test_id("session-list").is_visible():
        page.get_by_test_id("menu-btn").click()
    expect(page.get_by_test_id("session-list")).to_be_visible()


# -- a: chats grouped by day -------------------------------------------------------------------


@pytest.fixture(scope="module")
def dated_server() -> Iterator[tuple[str, Path]]:
    """A server of its own whose database the test may write to (the chats' times)."""
    data = Path(tempfile.mkdtemp(prefix="e2e-dated-"))
    with serve_app(DATA_DIR=str(data)) as url:
        yield url, data / "app.db"


def test_chats_are_grouped_under_today_yesterday_previous_7_days_and_older(
    browser: Browser, dated_server: tuple[str, Path], viewport: dict
) -> None:
    """Item 10a: each chat under the heading of its last activity's day (the browser's zone, here UTC)."""
    url, database = dated_server
    now = datetime.now(UTC)
    times = {
        "today": now,
        "yesterday": (now - timedelta(days=1)).replace(hour=12, minute=0),
        "previous-7-days": now - timedelta(days=4),
        "older": now - timedelta(days=40),
    }
    ids = {}
    with httpx.Client(base_url=url, timeout=10) as client:
        for group in times:
            ids[group] = client.post("/api/sessions", json={"title": f"chat of {group}"}).json()["id"]
    with sqlite3.connect(database) as db:
        for group, moment in times.items():
            stamp = moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
            db.execute("UPDATE agent_sessions SET updated_at = ? WHERE id = ?", (stamp, ids[group]))

    page = _page(browser, url, viewport)
    try:
        open_chat(page)
        open_drawer(page)
        headings = page.get_by_test_id("session-group")
        expect(headings).to_have_text(["Today", "Yesterday", "Previous 7 days", "Older"])
        # Each chat comes right after its own heading, in the list's order.
        order = page.evaluate(
            """() => Array.from(document.querySelector('[data-testid=session-list]').querySelectorAll(
                   '[data-testid=session-group], [data-testid=session-item]'
               )).map(e => e.dataset.group || e.dataset.sessionId)"""
        )
        mine = set(times) | set(ids.values())  # the server is the module's: the other size's chats are listed too
        assert [x for x in order if x in mine] == [x for group in times for x in (group, ids[group])]
        fits_the_screen(page)
        # In Chinese, the same headings in its words.
        open_chat(page, "/?lang=zh_CN")
        open_drawer(page)
        expect(page.get_by_test_id("session-group")).to_have_text(["今天", "昨天", "过去 7 天", "更早"])
        open_chat(page, "/?lang=en")
    finally:
        page.context.close()
