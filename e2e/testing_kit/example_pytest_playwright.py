"""An example a user can copy (docs/TESTING.md): pytest-playwright's `page` beside the kit's `chat_page`.

With pytest-playwright installed the kit drives its `browser` (one Playwright for the run), so both
fixtures work in one test; without it this module is skipped.
"""

import pytest
from playwright.sync_api import expect

pytest.importorskip("pytest_playwright")


def test_a_second_reader_sees_the_chat_of_the_first(chat_app, chat_page, page):
    chat_page.get_by_test_id("msg-input").fill("hello")
    chat_page.get_by_test_id("send-btn").click()
    expect(chat_page.get_by_test_id("assistant-message").last).to_be_visible()
    page.goto(chat_app.base_url)  # single-user mode: the same user in a second browser context
    expect(page.get_by_test_id("session-item")).to_have_count(1)
