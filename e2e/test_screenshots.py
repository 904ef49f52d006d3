"""The screenshot set in docs/ (issue 14): desktop and phone, light and dark, with the side panel open.

    docs/screenshots/{desktop,phone}-{light,dark}.png

Each is taken after a delegation with a code block has finished, so the chat, a
delegation card and the panel's streamed answer are all on it. The README shows two.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from e2e.helpers import open_chat, send, wait_for_turn_end

pytestmark = pytest.mark.e2e

OUT = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
SIZES = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}
FIRST_TURN_MS = 30_000


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("size", list(SIZES))
def test_screenshot_with_the_panel_open(browser: Browser, base_url: str, size: str, scheme: str) -> None:
    """Save docs/screenshots/<size>-<scheme>.png after a delegation."""
    context = browser.new_context(viewport=SIZES[size], base_url=base_url, color_scheme=scheme)
    context.set_default_timeout(10_000)
    page = context.new_page()
    try:
        open_chat(page)
        send(page, "@coding-assistant write a function that greets")
        expect(page.get_by_test_id("agent-invoke-status").first).to_have_text("completed", timeout=FIRST_TURN_MS)
        wait_for_turn_end(page)
        expect(page.get_by_test_id("agent-invoke-panel")).to_be_in_viewport()
        expect(page.get_by_test_id("code-block").last).to_be_visible()
        if scheme == "dark":
            assert page.evaluate("() => document.body.classList.contains('body--dark')")
        page.wait_for_timeout(400)  # the drawer's slide-in animation
        OUT.mkdir(parents=True, exist_ok=True)
        path = OUT / f"{size}-{scheme}.png"
        page.screenshot(path=str(path))
        assert path.stat().st_size > 10_000
    finally:
        context.close()
