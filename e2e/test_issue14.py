"""Issue 14: the chat as people know it, on a desktop (1280×800) and on a phone (390×844).

Every test runs at both sizes (the `vpage` fixture). Each is named after the item of
the issue it checks; docs/TESTING.md maps the items to these tests.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from e2e.helpers import TURN_TIMEOUT_MS, open_chat, send, session_id_of, unique, wait_for_turn_end

pytestmark = pytest.mark.e2e

VIEWPORTS = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}
FIRST_TURN_MS = 30_000  # a fresh server's first turn imports LiteLLM (3-5 s, more on a busy machine)
LONG_LINE = "x = '" + "y" * 200 + "'"
PAGES = ("/audit", "/broker", "/remote-agents", "/api-keys")

_FITS = "() => document.documentElement.scrollWidth <= window.innerWidth"
_LAST_BOTTOM = """() => {
    const all = document.querySelectorAll('[data-testid=chat-messages] [data-testid$=-message]');
    const last = all[all.length - 1];
    const footer = document.querySelector('[data-testid=chat-footer]');
    return {bottom: last ? last.getBoundingClientRect().bottom : 0,
            limit: footer ? footer.getBoundingClientRect().top : innerHeight, height: innerHeight};
}"""


@pytest.fixture(params=list(VIEWPORTS))
def vpage(request: pytest.FixtureRequest, browser: Browser, base_url: str) -> Iterator[Page]:
    """A fresh page at one of the two viewports (light colour scheme)."""
    context = browser.new_context(viewport=VIEWPORTS[request.param], base_url=base_url)
    context.set_default_timeout(10_000)
    page = context.new_page()
    page.viewport_name = request.param  # type: ignore[attr-defined]
    try:
        yield page
    finally:
        context.close()


def is_phone(page: Page) -> bool:
    """Whether the page runs at the phone size."""
    return page.viewport_name == "phone"  # type: ignore[attr-defined]


def assert_fits(page: Page, where: str) -> None:
    """Nothing on the page is wider than the viewport."""
    widths = page.evaluate("() => [document.documentElement.scrollWidth, innerWidth]")
    assert widths[0] <= widths[1], f"{where}: the page is {widths[0]} px wide in a {widths[1]} px viewport"


def assert_header_one_row(page: Page) -> None:
    """The header is one row high."""
    height = page.get_by_test_id("app-header").bounding_box()["height"]
    assert height <= 72, f"the header wraps ({height} px high)"


def delegate(page: Page, text: str) -> None:
    """Send a delegating message and wait until the panel shows its task completed."""
    send(page, text)
    expect(page.get_by_test_id("agent-invoke-panel")).to_be_in_viewport(timeout=FIRST_TURN_MS)
    expect(page.get_by_test_id("agent-invoke-status").last).to_have_text("completed", timeout=FIRST_TURN_MS)


def close_panel(page: Page) -> None:
    """Close the side panel the way a user would at this size."""
    button = page.get_by_test_id("agent-invoke-back" if is_phone(page) else "agent-invoke-close")
    button.click()
    expect(page.get_by_test_id("agent-invoke-panel")).to_be_hidden()


# -- 2. responsive layout, 3. code ------------------------------------------------------------


def test_every_page_fits_the_viewport_after_a_delegation_and_a_long_code_line(vpage: Page) -> None:
    """Items 2 and 3: nothing wider than the viewport on any page; long code scrolls in its block."""
    page = vpage
    open_chat(page)
    if is_phone(page):  # the session list is a closed overlay on a phone
        expect(page.get_by_test_id("app-drawer")).to_be_hidden()
    else:
        expect(page.get_by_test_id("session-list")).to_be_visible()
    assert_header_one_row(page)
    delegate(page, f"@coding-assistant {unique('fit')}\n```python\n{LONG_LINE}\n```")
    if is_phone(page):  # the panel is a full-width sheet with a way back to the chat
        box = page.get_by_test_id("agent-invoke-panel").bounding_box()
        assert abs(box["width"] - 390) <= 1 and box["x"] >= -1, box
        expect(page.get_by_test_id("agent-invoke-back")).to_be_visible()
    wait_for_turn_end(page)
    assert_fits(page, "the chat after a delegation")
    # The long line scrolls inside its own code block, which has a language label and a copy button.
    block = page.get_by_test_id("user-message").last.get_by_test_id("code-block")
    expect(block).to_have_count(1)
    expect(block.get_by_test_id("code-lang")).to_have_attribute("data-lang", "python")
    expect(block.get_by_test_id("code-copy-btn")).to_have_attribute("aria-label", "Copy code")
    assert block.locator("pre").evaluate("pre => pre.scrollWidth > pre.clientWidth"), "the code does not scroll"
    session_id = session_id_of(page)
    task = page.get_by_test_id("agent-invoke-tab").last.get_attribute("data-task-id")
    close_panel(page)
    assert_fits(page, "the chat with the panel closed")
    expect(page.get_by_test_id("msg-input")).to_be_in_viewport()
    for path in (*PAGES, f"/audit/{task}", f"/chat/{session_id}"):
        page.goto(path)
        page.wait_for_function("() => window.socket && window.socket.connected")
        page.wait_for_timeout(300)
        assert_fits(page, path)
        assert_header_one_row(page)
        expect(page.get_by_test_id("app-header")).to_be_visible()
    # On the audit list the table scrolls in its own box (desktop) or reads as a list (phone).
    page.goto("/audit")
    expect(page.get_by_test_id("audit-table-box")).to_be_visible()
    assert_fits(page, "/audit")


def test_the_code_copy_button_copies_the_code(vpage: Page) -> None:
    """Item 3: the copy button puts the code (only the code) on the clipboard."""
    page = vpage
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    open_chat(page)
    send(page, f"{unique('copy')}\n```python\nprint('copied')\n```")
    button = page.get_by_test_id("user-message").last.get_by_test_id("code-copy-btn")
    button.click()
    expect(button).to_have_attribute("data-copied", "1")
    assert page.evaluate("() => navigator.clipboard.readText()").strip() == "print('copied')"


# -- 1. scrolling like a chat -------------------------------------------------------------------


def test_the_chat_follows_a_streaming_answer_until_the_reader_scrolls_up(vpage: Page) -> None:
    """Item 1: the newest message stays in view while it streams, until the reader scrolls up."""
    page = vpage
    open_chat(page)
    send(page, "/lorem 400" if is_phone(page) else "/lorem 1200")  # longer than the screen either way
    expect(page.get_by_test_id("assistant-text")).to_be_visible(timeout=FIRST_TURN_MS)
    samples = 0
    deadline = time.monotonic() + 20
    while page.get_by_test_id("generating").is_visible() and time.monotonic() < deadline:
        page.wait_for_timeout(60)  # let the page's scroll catch up with the last render
        where = page.evaluate(_LAST_BOTTOM)
        assert where["bottom"] <= where["limit"] + 2, f"the streaming answer ran below the input: {where}"
        samples += 1
    wait_for_turn_end(page)
    assert samples >= 3
    scroll_height = page.evaluate("() => document.documentElement.scrollHeight")
    assert scroll_height > page.viewport_size["height"], "the answer should be longer than the screen"

    # Reopened, the chat shows its newest message.
    page.reload()
    page.wait_for_function("() => window.socket && window.socket.connected")
    page.wait_for_timeout(500)
    where = page.evaluate(_LAST_BOTTOM)
    assert where["bottom"] <= where["limit"] + 2, f"a reopened chat does not show the newest message: {where}"

    # Scrolled up, a new answer does not pull the reader down; "Jump to latest" does.
    jump = page.get_by_test_id("jump-latest")
    expect(jump).to_be_hidden()
    page.mouse.wheel(0, -3000)
    page.wait_for_timeout(200)
    expect(jump).to_be_visible()
    send(page, "/lorem 200")
    page.wait_for_timeout(1500)
    assert page.evaluate("() => window.scrollY") < 400, "the page followed the answer after the reader scrolled up"
    jump.click()
    page.wait_for_timeout(200)
    where = page.evaluate(_LAST_BOTTOM)
    assert where["bottom"] <= where["limit"] + 2
    expect(jump).to_be_hidden()
    wait_for_turn_end(page)


# -- 4. a panel that stays put, tabs that can be told apart -------------------------------------


def test_the_panel_header_stays_visible_over_a_long_answer_and_tabs_differ(vpage: Page) -> None:
    """Item 4: the panel's header and tabs stay put; two tasks for one agent read differently."""
    page = vpage
    open_chat(page)
    first, second = "/lorem 600", unique("greet in Italian")
    send(page, f"@coding-assistant {first} @coding-assistant {second}")
    expect(page.get_by_test_id("agent-invoke-tab")).to_have_count(2, timeout=FIRST_TURN_MS)
    tabs = page.get_by_test_id("agent-invoke-tab")
    expect(tabs.first.get_by_test_id("agent-invoke-tab-name")).to_have_text("Coding Assistant")
    labels = [tabs.nth(i).inner_text() for i in range(2)]
    assert labels[0] != labels[1], f"two tasks for one agent have the same tab label: {labels}"
    for i in range(2):
        expect(tabs.nth(i).get_by_test_id("agent-invoke-tab-icon")).to_be_visible()
    # The whole request shows on hover (and is the tab's accessible name).
    tabs.nth(1).hover()
    expect(page.get_by_test_id("agent-invoke-tab-tooltip").last).to_contain_text(second)
    expect(tabs.nth(1)).to_have_attribute("aria-label", re.compile(re.escape(second)))
    # A long answer scrolls inside the panel; its header, tabs and close button stay on screen.
    tabs.first.click()
    expect(page.get_by_test_id("agent-invoke-status").first).to_have_text("completed", timeout=TURN_TIMEOUT_MS)
    scroller = page.get_by_test_id("agent-invoke-scroll")
    assert scroller.evaluate("el => el.scrollHeight > el.clientHeight"), "the long answer should overflow"
    scroller.evaluate("el => el.scrollTo(0, el.scrollHeight)")
    page.mouse.wheel(0, 5000)
    page.wait_for_timeout(200)
    for testid in ("agent-invoke-head", "agent-invoke-close"):
        expect(page.get_by_test_id(testid)).to_be_in_viewport()
    expect(tabs.first).to_be_in_viewport()
    wait_for_turn_end(page)
    assert_fits(page, "the chat with two tabs")
    # The chat's cards say which subtask is which.
    requests = page.get_by_test_id("tool-call-request")
    expect(requests.first).to_contain_text(first)
    expect(requests.last).to_contain_text(second)


# -- 5. one truth per task ---------------------------------------------------------------------


def _state_words(page: Page) -> tuple[str, str, str]:
    """The state word of the first task in its card, its tab and its panel, once the panel shows one.

    On a phone the panel is reopened by a click: its badge can be read before the sheet has
    rendered its text, so wait until the badge shows some (`innerText`, what is read below: its
    `textContent` is there before the sheet is drawn); the assertion is that the three agree.
    """
    card = page.get_by_test_id("tool-call").first
    expect(page.get_by_test_id("agent-invoke-status").first).to_have_text(re.compile(r"\S"), use_inner_text=True)
    return (
        card.get_by_test_id("tool-call-status").inner_text().strip(),
        page.get_by_test_id("agent-invoke-tab").first.get_attribute("data-state"),
        page.get_by_test_id("agent-invoke-status").first.inner_text().strip(),
    )


def test_stop_gives_one_state_word_in_card_tab_audit_and_api(vpage: Page, base_url: str) -> None:
    """Item 5: after Stop, card, tab, panel, /audit and the API say `canceled`, live and after a reload."""
    page = vpage
    open_chat(page)
    send(page, "@coding-assistant /lorem 3000")
    expect(page.get_by_test_id("agent-invoke-status").first).to_have_text("working", timeout=FIRST_TURN_MS)
    card_status = page.get_by_test_id("tool-call").first.get_by_test_id("tool-call-status")
    expect(card_status).to_have_text("working")
    expect(page.get_by_test_id("agent-invoke-body").first).to_contain_text("lorem ipsum")  # it streamed some text
    if is_phone(page):  # the panel is a sheet over the chat: back to the chat to press Stop
        close_panel(page)
    page.get_by_test_id("stop-btn").click()
    wait_for_turn_end(page)
    expect(card_status).to_have_text("canceled")
    if is_phone(page):
        page.get_by_test_id("tool-call").first.click()
    assert _state_words(page) == ("canceled", "canceled", "canceled")
    task_id = page.get_by_test_id("tool-call").first.get_attribute("data-task-id")
    assert task_id
    # The caller's name is the agent's display name, in the card and the bubble.
    expect(page.get_by_test_id("tool-call-title").first).to_have_text("Delegated to Coding Assistant")

    api = httpx.get(f"{base_url}/api/tasks/{task_id}", timeout=5.0)
    api.raise_for_status()
    assert api.json()["state"] == "canceled"

    page.reload()
    page.wait_for_function("() => window.socket && window.socket.connected")
    if is_phone(page):  # the panel comes back after a reload; on a phone it covers the chat
        expect(page.get_by_test_id("agent-invoke-status").first).to_have_text("canceled")
        close_panel(page)
    expect(page.get_by_test_id("tool-call").first.get_by_test_id("tool-call-status")).to_have_text("canceled")
    expect(page.get_by_test_id("assistant-message").first).to_contain_text("General Assistant")
    expect(page.get_by_test_id("tool-call-title").first).to_have_text("Delegated to Coding Assistant")
    page.get_by_test_id("tool-call").first.click()
    expect(page.get_by_test_id("agent-invoke-status").first).to_have_text("canceled")

    page.goto("/audit")
    row = page.locator(f'[data-testid=audit-row][data-task-id="{task_id}"]')
    expect(row.get_by_test_id("audit-state")).to_have_text("canceled")
    tokens = row.locator("td[data-label='Tokens in/out']").inner_text()  # (the cost column follows it)
    out = int(tokens.split("/")[-1].strip())
    assert out > 0, f"a stopped task that streamed text shows {tokens} tokens"


# -- 6. sessions ------------------------------------------------------------------------------


def open_drawer(page: Page) -> None:
    """Show the session list (on a phone, open the drawer first)."""
    if is_phone(page):
        page.get_by_test_id("menu-btn").click()
    expect(page.get_by_test_id("session-list")).to_be_visible()


def test_rename_delete_and_search_chats_and_the_tab_title(vpage: Page) -> None:
    """Item 6: search, rename and delete chats; the browser tab is titled after the chat."""
    page = vpage
    marker = unique("zebra")
    open_chat(page)
    expect(page).to_have_title("New chat")
    send(page, f"{marker} first")
    wait_for_turn_end(page)
    first_id = session_id_of(page)
    expect(page).to_have_title(f"{marker} first")
    page.goto("/")
    page.wait_for_function("() => window.socket && window.socket.connected")
    send(page, unique("other chat"))
    wait_for_turn_end(page)

    open_drawer(page)
    item = page.locator(f'[data-testid=session-item][data-session-id="{first_id}"]')
    # Search keeps the matching chats only.
    page.get_by_test_id("session-search").fill(marker.split()[1])
    expect(page.get_by_test_id("session-item")).to_have_count(1)
    expect(item).to_be_visible()
    # Rename.
    item.get_by_test_id("session-menu-btn").click()
    page.get_by_test_id("session-rename").click()
    page.get_by_test_id("session-rename-input").fill(f"Renamed {marker}")
    page.get_by_test_id("session-rename-save").click()
    expect(item.get_by_test_id("session-title")).to_have_text(f"Renamed {marker}")
    item.click()
    expect(page).to_have_url(re.compile(f"/chat/{first_id}$"))
    expect(page).to_have_title(f"Renamed {marker}")
    # Delete, after a confirmation.
    open_drawer(page)
    item.get_by_test_id("session-menu-btn").click()
    page.get_by_test_id("session-delete").click()
    page.get_by_test_id("session-delete-confirm").click()
    expect(page).to_have_url(re.compile(r"/$"))
    page.wait_for_function("() => window.socket && window.socket.connected")
    open_drawer(page)
    expect(page.locator(f'[data-testid=session-item][data-session-id="{first_id}"]')).to_have_count(0)


# -- 7. first screen, 8. feedback while waiting -------------------------------------------------


def test_first_screen_welcome_examples_typing_indicator_focus_and_esc(vpage: Page) -> None:
    """Items 7 and 8: welcome, example prompts, focus, typing indicator, aria-live, Esc stops."""
    page = vpage
    open_chat(page)
    welcome = page.get_by_test_id("welcome")
    expect(welcome).to_be_visible()
    # The seeded agents (other tests on this shared server may have added more).
    for slug in ("general-assistant", "coding-assistant", "planner"):
        expect(page.locator(f"[data-testid=welcome-agent][data-agent={slug}]")).to_have_count(1)
    expect(welcome).to_contain_text("Coding Assistant")
    expect(welcome).to_contain_text("/background")
    expect(page.get_by_test_id("example-prompt")).to_have_count(3)
    assert page.evaluate("() => document.activeElement?.dataset.testid") == "msg-input"
    # On a phone the keyboard resizes the layout, so the input bar stays above it.
    viewport = page.locator("meta[name=viewport]").get_attribute("content")
    assert "interactive-widget=resizes-content" in viewport
    # The typing indicator shows in the new bubble until the first token.
    page.evaluate("""() => { window.__typing = false; new MutationObserver(() => {
        if (document.querySelector('[data-testid=typing-indicator]')) window.__typing = true;
    }).observe(document.body, {childList: true, subtree: true}); }""")
    page.get_by_test_id("example-prompt").first.click()
    expect(page.get_by_test_id("user-message")).to_have_count(1)
    expect(welcome).to_be_hidden()
    wait_for_turn_end(page)
    assert page.evaluate("() => window.__typing"), "no typing indicator was shown before the first token"
    expect(page.get_by_test_id("typing-indicator")).to_have_count(0)
    message = page.get_by_test_id("assistant-message").last
    expect(message).to_have_attribute("aria-live", "polite")
    # Esc stops a running reply.
    send(page, "/lorem 3000")
    expect(page.get_by_test_id("assistant-text").last).to_be_visible(timeout=FIRST_TURN_MS)
    page.keyboard.press("Escape")
    wait_for_turn_end(page)
    expect(page.get_by_test_id("assistant-message").last.get_by_text("Stopped.", exact=True)).to_be_visible()


def test_esc_closes_the_panel_when_nothing_runs(vpage: Page) -> None:
    """Item 8: Esc closes the idle panel; the card opens it again from the keyboard."""
    page = vpage
    open_chat(page)
    delegate(page, f"@coding-assistant {unique('esc')}")
    wait_for_turn_end(page)
    expect(page.get_by_test_id("agent-invoke-panel")).to_be_in_viewport()
    page.keyboard.press("Escape")
    expect(page.get_by_test_id("agent-invoke-panel")).to_be_hidden()
    # The delegation card is reachable by keyboard and opens the task again with Enter.
    card = page.get_by_test_id("tool-call").first
    expect(card).to_have_attribute("tabindex", "0")
    card.focus()
    page.keyboard.press("Enter")
    expect(page.get_by_test_id("agent-invoke-panel")).to_be_in_viewport()


# -- 9. dark mode, 10. user text ----------------------------------------------------------------


def test_dark_mode_follows_the_system_and_the_toggle_is_kept(browser: Browser, base_url: str) -> None:
    """Item 9: dark mode follows the system on every page; the toggle's choice survives a reload."""
    for name, viewport in VIEWPORTS.items():
        context = browser.new_context(viewport=viewport, base_url=base_url, color_scheme="dark")
        page = context.new_page()
        try:
            for path in ("/", *PAGES):
                page.goto(path)
                page.wait_for_function("() => window.socket && window.socket.connected")
                expect(page.locator("body")).to_have_class(re.compile(r"\bbody--dark\b"), timeout=5_000)
                assert_fits(page, f"{path} ({name}, dark)")
            toggle = page.get_by_test_id("dark-mode-btn")
            expect(toggle).to_have_attribute("data-mode", "auto")
            toggle.click()  # auto → dark → light
            expect(toggle).to_have_attribute("data-mode", "dark")
            toggle.click()
            expect(toggle).to_have_attribute("data-mode", "light")
            expect(page.locator("body")).not_to_have_class(re.compile(r"\bbody--dark\b"))
            page.reload()
            page.wait_for_function("() => window.socket && window.socket.connected")
            expect(page.get_by_test_id("dark-mode-btn")).to_have_attribute("data-mode", "light")
            expect(page.locator("body")).not_to_have_class(re.compile(r"\bbody--dark\b"))
            page.get_by_test_id("dark-mode-btn").click()  # light → auto again
            expect(page.get_by_test_id("dark-mode-btn")).to_have_attribute("data-mode", "auto")
        finally:
            context.close()


def test_the_users_text_keeps_its_line_breaks_and_is_not_markdown(vpage: Page) -> None:
    """Item 10: the user's message is shown as written."""
    page = vpage
    open_chat(page)
    first = unique("line one")
    send(page, f"{first}\n# not a heading\n- not a list\n\n**not bold**")
    bubble = page.get_by_test_id("user-message").last
    text = bubble.get_by_test_id("user-text").inner_text()
    assert f"{first}\n# not a heading\n- not a list\n\n**not bold**" in text
    expect(bubble.locator("h1, ul, strong")).to_have_count(0)
    wait_for_turn_end(page)
    page.reload()
    page.wait_for_function("() => window.socket && window.socket.connected")
    bubble = page.get_by_test_id("user-message").last
    assert f"{first}\n# not a heading" in bubble.get_by_test_id("user-text").inner_text()


# -- 11. quiet logs -----------------------------------------------------------------------------


def test_a_delegation_logs_no_listener_warning_in_the_browser(vpage: Page) -> None:
    """Item 11: no 'Event listeners changed' warning per delegation."""
    page = vpage
    messages: list[str] = []
    page.on("console", lambda m: messages.append(m.text))
    open_chat(page)
    delegate(page, f"@coding-assistant {unique('quiet')} @coding-assistant {unique('twice')}")
    wait_for_turn_end(page)
    noisy = [m for m in messages if "Event listeners changed" in m]
    assert not noisy, noisy
