"""What a new user sees first, in a real Chromium: every page works offline, and the README's picture.

No page of the app may load anything from outside the server (this machine has no internet, and
neither has a user behind a firewall): each page is opened at 1280×800 and at 390×844 while every
request the browser makes is recorded.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from e2e.conftest import VIEWPORTS, serve_app
from e2e.helpers import open_chat, send

pytestmark = pytest.mark.e2e

DOCS_DIR = Path(__file__).resolve().parent.parent / "docs"
NICEGUI_PAGES = ["/", "/audit", "/api-keys", "/remote-agents", "/broker"]


def requests_elsewhere(page: Page, base_url: str, open_page) -> list[str]:
    """Open a page with `open_page(page)`; the URLs it fetched from anywhere but the server.

    A request that the page's Content-Security-Policy blocked never left the browser: not counted.
    """
    seen: list[str] = []
    blocked: list[str] = []
    page.on("request", lambda r: seen.append(r.url))
    page.on("requestfailed", lambda r: blocked.append(r.url) if "csp" in (r.failure or "").lower() else None)
    open_page(page)
    page.wait_for_load_state("networkidle")
    return [url for url in seen if not url.startswith((f"{base_url}/", "data:", "blob:")) and url not in blocked]


@pytest.mark.parametrize("path", NICEGUI_PAGES)
def test_no_page_loads_anything_from_outside_the_server(sized_page: Page, base_url: str, path: str) -> None:
    def open_page(page: Page) -> None:
        open_chat(page, path)

    assert requests_elsewhere(sized_page, base_url, open_page) == []


def test_the_api_docs_work_offline(sized_page: Page, base_url: str) -> None:
    def open_swagger(page: Page) -> None:
        page.goto("/docs")
        expect(page.locator(".swagger-ui .info .title")).to_contain_text("A2A Delegation Chat")
        expect(page.locator(".opblock-summary-path").filter(has_text="/api/sessions").first).to_be_visible()

    def open_redoc(page: Page) -> None:
        page.goto("/redoc")
        expect(page.locator("h1").first).to_contain_text("A2A Delegation Chat")
        expect(page.get_by_text("/api/sessions").first).to_be_attached()

    assert requests_elsewhere(sized_page, base_url, open_swagger) == []
    assert requests_elsewhere(sized_page, base_url, open_redoc) == []


def test_screenshot_for_the_readme(browser: Browser) -> None:
    """A chat mid-delegation with the side panel open, saved as docs/screenshot.png.

    A server of its own, so the chat list holds no other test's chats, and a slower demo model,
    so the picture catches the Coding Assistant while it still streams into the panel.
    """
    with serve_app(DEMO_MODEL_DELAY_MS="100") as url:
        context = browser.new_context(viewport=VIEWPORTS["desktop"], base_url=url)
        context.set_default_timeout(10_000)
        try:
            page = context.new_page()
            open_chat(page, "/")
            send(page, "@coding-assistant write a function that greets a user by name")
            panel = page.get_by_test_id("agent-invoke-panel")
            # The first turn of a fresh server imports LiteLLM (3-5 s, more on a busy machine).
            expect(panel).to_be_visible(timeout=30_000)
            # Mid-answer, before its code block starts (about 25 tokens, 2.5 s, later).
            expect(page.get_by_test_id("agent-invoke-body")).to_contain_text("offline demo model", timeout=30_000)
            expect(page.get_by_test_id("agent-invoke-status")).to_have_text("working")
            page.mouse.move(0, 0)  # no hover highlight in the picture
            DOCS_DIR.mkdir(exist_ok=True)
            path = DOCS_DIR / "screenshot.png"
            page.screenshot(path=str(path))
            assert path.stat().st_size > 10_000
        finally:
            context.close()
