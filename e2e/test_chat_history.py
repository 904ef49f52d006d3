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

from core.chat.demo_model import _echo
from e2e.conftest import serve_app
from e2e.helpers import (
    as_rendered,
    assistant_text,
    lorem,
    open_chat,
    saved_messages,
    send,
    session_id_of,
    unique,
    wait_for_turn_end,
    words,
)

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


# -- d: the controls on the messages --------------------------------------------------------------


@pytest.fixture
def vpage(browser: Browser, base_url: str, viewport: dict) -> Iterator[Page]:
    """A page of the shared server at the test's size, allowed to use the clipboard."""
    page = _page(browser, base_url, viewport)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
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


def start_chat(page: Page, *texts: str) -> str:
    """A new chat with these messages sent one after the other, each answered; returns its id."""
    open_chat(page)
    close_session_drawer(page)
    for text in texts:
        send(page, text)
        wait_for_turn_end(page)
    return session_id_of(page)


def test_each_answer_has_a_menu_to_copy_it_and_the_last_one_to_regenerate_it(vpage: Page, base_url: str) -> None:
    """Item 10d (and b): copy any answer; regenerate the last one, which streams a new answer in its place."""
    page = vpage
    first, second = unique("first"), unique("second")
    session_id = start_chat(page, first, second)
    before = saved_messages(base_url, session_id)
    menus = page.get_by_test_id("answer-menu-btn")
    expect(menus).to_have_count(2)
    fits_the_screen(page)

    menus.first.click()  # an earlier answer: copy only
    expect(page.get_by_test_id("answer-copy")).to_be_visible()
    expect(page.get_by_test_id("answer-regenerate")).to_have_count(0)
    page.get_by_test_id("answer-copy").click()
    expect(page.get_by_test_id("answer-copy")).to_be_hidden()
    assert page.evaluate("() => navigator.clipboard.readText()") == before[1]["content"]

    menus.last.click()
    regenerate = page.get_by_test_id("answer-regenerate")
    expect(regenerate).to_be_in_viewport()
    fits_the_screen(page)
    regenerate.click()
    expect(page.get_by_test_id("generating")).to_be_visible()
    wait_for_turn_end(page)
    expect(page.get_by_test_id("assistant-message")).to_have_count(2)
    expect(page.get_by_test_id("user-message")).to_have_count(2)
    after = saved_messages(base_url, session_id)
    assert [(m["role"], m["content"]) for m in after] == [(m["role"], m["content"]) for m in before]
    assert after[3]["createdAt"] > before[3]["createdAt"]  # a new answer, saved in place of the old one
    assert words(assistant_text(page)) == words(as_rendered(_echo(second, wants_code=False)))
    expect(menus).to_have_count(2)
    fits_the_screen(page)


def test_the_last_message_can_be_edited_and_sent_again(vpage: Page, base_url: str) -> None:
    """Item 10d (and c): only the last message has an edit button; the edit replaces it and what followed."""
    page = vpage
    one, two = unique("one"), unique("two")
    session_id = start_chat(page, one, two)
    edit = page.get_by_test_id("user-edit-btn")
    expect(edit).to_have_count(1)
    expect(page.get_by_test_id("user-message").last.get_by_test_id("user-edit-btn")).to_be_visible()

    edit.click()
    dialog = page.get_by_test_id("user-edit-dialog")
    expect(dialog).to_be_visible()
    box = dialog.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= page.viewport_size["width"]
    editor = page.get_by_test_id("user-edit-input")
    expect(editor).to_have_value(two)
    page.get_by_test_id("user-edit-cancel").click()
    expect(dialog).to_be_hidden()

    edit.click()
    editor = page.get_by_test_id("user-edit-input")
    editor.fill("/lorem 150")  # long enough (about 2 s) to see the controls while it runs
    page.get_by_test_id("user-edit-save").click()
    expect(page.get_by_test_id("user-edit-dialog")).to_have_count(0)
    expect(page.get_by_test_id("generating")).to_be_visible()
    expect(page.get_by_test_id("user-edit-btn")).to_be_hidden()  # not while the new answer is written
    expect(page.get_by_test_id("user-message").last).to_contain_text("/lorem 150")
    wait_for_turn_end(page)
    expect(page.get_by_test_id("user-message")).to_have_count(2)
    expect(page.get_by_test_id("assistant-message")).to_have_count(2)
    expect(page.get_by_test_id("user-edit-btn")).to_be_visible()
    assert words(assistant_text(page)) == words(lorem(150))
    saved = saved_messages(base_url, session_id)
    assert [(m["role"], m["content"]) for m in saved] == [
        ("user", one),
        ("assistant", _echo(one, wants_code=False)),
        ("user", "/lorem 150"),
        ("assistant", lorem(150)),
    ]
    fits_the_screen(page)
