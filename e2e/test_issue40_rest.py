"""Issue 40, the rest: the panel's code bar after the language switch, and item 9's small texts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from e2e.helpers import open_chat, send, wait_for_turn_end

pytestmark = pytest.mark.e2e

DESKTOP = {"width": 1280, "height": 800}
FIRST_TURN_MS = 30_000  # a fresh server's first turn imports LiteLLM (3-5 s, more on a busy machine)


@pytest.fixture
def desktop(browser: Browser, base_url: str) -> Iterator[Page]:
    """A page at 1280x800."""
    context = browser.new_context(viewport=DESKTOP, base_url=base_url)
    context.set_default_timeout(10_000)
    page = context.new_page()
    try:
        yield page
    finally:
        context.close()


def _switch_language(page: Page, option: str) -> None:
    page.get_by_test_id("language-switch").click()
    page.get_by_role("option", name=option).click()


def test_the_panels_code_blocks_keep_their_copy_bar_after_the_language_switch(desktop: Page) -> None:
    """Item 6: after the switch, the panel's code blocks had no Copy bar until a reload.

    The page built again by the switch brings the panel back with its tasks' code already in it,
    and app.js only decorated what a mutation announced afterwards.
    """
    page = desktop
    open_chat(page, "/?agent=general-assistant")
    send(page, "@coding-assistant write a function that greets")
    panel = page.get_by_test_id("agent-invoke-panel")
    expect(panel).to_be_visible(timeout=FIRST_TURN_MS)
    wait_for_turn_end(page)
    expect(panel.get_by_test_id("code-copy-btn").first).to_have_attribute("aria-label", "Copy code")

    _switch_language(page, "简体中文")
    expect(page.get_by_test_id("nav-chat")).to_have_text("对话")
    expect(panel).to_be_visible()
    expect(panel.locator("pre").first).to_be_visible()
    expect(panel.get_by_test_id("code-block").first).to_be_visible()
    expect(panel.get_by_test_id("code-copy-btn").first).to_have_attribute("aria-label", "复制代码")
    assert panel.locator("pre").count() == panel.get_by_test_id("code-block").count()


def test_try_it_shows_the_reply_as_markdown_like_the_chat(desktop: Page) -> None:
    """Item 9a: the agent editor's "Try it" showed the model's reply as raw Markdown (`**`, `>`, fences)."""
    page = desktop
    open_chat(page, "/agents?edit=coding-assistant")
    page.get_by_test_id("agent-try").click()
    out = page.get_by_test_id("agent-try-out")
    expect(out).to_contain_text("Reply:", timeout=FIRST_TURN_MS)
    expect(out.locator("strong")).to_have_text("offline demo model")
    expect(out.locator("blockquote")).to_contain_text("Say hello")
    expect(out.get_by_test_id("code-block")).to_be_visible()  # the chat's code block, with its bar
    expect(out.get_by_test_id("code-lang")).to_have_attribute("data-lang", "python")
    expect(out.get_by_test_id("code-copy-btn")).to_be_visible()
    text = out.inner_text()
    assert "**" not in text and "```" not in text, text


# Every text the last answer shows while it streams, recorded by the page at each change.
_RECORD_ANSWER = """() => {
    window.__shown = [];
    const messages = document.querySelector('[data-testid=chat-messages]');
    new MutationObserver(() => {
        const answers = messages.querySelectorAll('[data-testid=assistant-message]');
        if (answers.length) window.__shown.push(answers[answers.length - 1].innerText);
    }).observe(messages, {childList: true, subtree: true, characterData: true});
}"""


def test_half_streamed_bold_never_shows_its_stars(desktop: Page) -> None:
    """Item 9c: while the answer streamed, `**offline` showed its stars until the bold closed."""
    page = desktop
    open_chat(page, "/?agent=general-assistant")
    page.evaluate(_RECORD_ANSWER)
    send(page, "hello there")
    wait_for_turn_end(page)
    answer = page.get_by_test_id("assistant-message").last
    expect(answer.locator("strong")).to_have_text("offline demo model")
    shown: list[str] = page.evaluate("window.__shown")
    streaming = [text for text in shown if "offline" in text]
    assert len(streaming) > 3, shown  # it was seen growing
    assert not [text for text in shown if "**" in text or "`" in text], [t for t in shown if "**" in t or "`" in t]


def test_redoc_asks_nothing_of_another_site(desktop: Page, base_url: str) -> None:
    """Item 9e: /redoc asked Redocly's CDN for a logo (blocked by the page's policy, an error in the console)."""
    page = desktop
    asked: list[str] = []
    console: list[str] = []
    page.on("request", lambda r: asked.append(r.url))
    page.on("console", lambda m: console.append(m.text) if m.type in {"error", "warning"} else None)
    page.goto("/redoc")
    expect(page.locator("h1").first).to_contain_text("A2A Delegation Chat")
    expect(page.get_by_text("/api/sessions").first).to_be_attached()
    page.wait_for_load_state("networkidle")
    elsewhere = [url for url in asked if not url.startswith((f"{base_url}/", "data:", "blob:"))]
    assert elsewhere == [], elsewhere
    assert not [text for text in console if "Content Security Policy" in text or "redoc.ly" in text], console
    assert page.locator("img[alt='redocly logo']").count() == 0


_DOCS_THEME = """() => ({
    dark: document.documentElement.classList.contains('dark-mode'),
    background: getComputedStyle(document.documentElement).backgroundColor,
    text: getComputedStyle(document.querySelector('.swagger-ui .info .title')).color,
})"""


def _docs_theme(page: Page) -> dict:
    page.goto("/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("A2A Delegation Chat")
    return page.evaluate(_DOCS_THEME)


_NEXT_THEME = {"auto": "dark", "dark": "light", "light": "auto"}  # the toggle's cycle (ui/frame.py)


def _pick_theme(page: Page, mode: str) -> None:
    """Click the header's theme toggle until it says `mode` (auto, dark, light); the server keeps it."""
    open_chat(page, "/")
    toggle = page.get_by_test_id("dark-mode-btn")
    now = toggle.get_attribute("data-mode") or "auto"
    while now != mode:
        toggle.click()
        now = _NEXT_THEME[now]
        expect(toggle).to_have_attribute("data-mode", now)


@pytest.mark.parametrize("system", ["light", "dark"])
def test_swagger_follows_the_apps_theme(browser: Browser, base_url: str, system: str) -> None:
    """Item 9f: /docs stayed light in dark mode; it follows the system, and the header's choice over it."""
    context = browser.new_context(viewport=DESKTOP, base_url=base_url, color_scheme=system)  # type: ignore[arg-type]
    context.set_default_timeout(10_000)
    page = context.new_page()
    try:
        theme = _docs_theme(page)  # nothing chosen yet: the system's
        assert theme["dark"] is (system == "dark"), theme
        assert (theme["background"] == "rgb(28, 32, 34)") is (system == "dark"), theme

        other = "light" if system == "dark" else "dark"
        _pick_theme(page, other)
        theme = _docs_theme(page)
        assert theme["dark"] is (other == "dark"), theme
        assert (theme["background"] == "rgb(28, 32, 34)") is (other == "dark"), theme
        assert (theme["text"] != "rgb(59, 65, 81)") is (other == "dark"), theme  # Swagger's light title colour

        _pick_theme(page, "auto")  # back to the system's
        assert _docs_theme(page)["dark"] is (system == "dark")
    finally:
        context.close()
