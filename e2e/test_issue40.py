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


# The focus ring's contrast against what is behind it (WCAG 2 relative luminance; the ring is drawn
# outside the element, so "behind" is the first ancestor with a background colour).
_RING = """(el) => {
    const rgb = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
    const lum = ([r, g, b]) => {
        const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
        return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
    };
    const ringOf = el.matches('.q-select__focus-target') ? el.closest('.q-field') : el;
    const s = getComputedStyle(ringOf);
    let bg = null;
    for (let a = ringOf.parentElement; a; a = a.parentElement) {
        const c = rgb(getComputedStyle(a).backgroundColor);
        if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) { bg = c.slice(0, 3); break; }
    }
    bg = bg || [255, 255, 255];
    const ring = rgb(s.outlineColor).slice(0, 3);
    const [hi, lo] = [lum(ring), lum(bg)].sort((x, y) => y - x);
    return {style: s.outlineStyle, width: parseFloat(s.outlineWidth), ratio: (hi + 0.05) / (lo + 0.05),
            ring: s.outlineColor, bg: bg.join(',')};
}"""


def _tab_to(page: Page, testid: str, limit: int = 40) -> None:
    """Press Tab until the element with that test id (or a control inside it) has the focus."""
    for _ in range(limit):
        page.keyboard.press("Tab")
        if page.evaluate(
            "(t) => { const a = document.activeElement; const el = document.querySelector(`[data-testid=${t}]`);"
            " return !!el && (a === el || el.contains(a)); }",
            testid,
        ):
            return
    raise AssertionError(f"Tab never reached {testid}")


def _assert_ring(page: Page, name: str) -> None:
    ring = page.evaluate(f"({_RING})(document.activeElement)")
    assert ring["style"] != "none" and ring["width"] >= 2, f"{name}: no focus ring ({ring})"
    assert ring["ratio"] >= 3, f"{name}: the focus ring's contrast is {ring['ratio']:.2f}:1 ({ring})"


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_keyboard_focus_shows_a_ring_of_3_to_1_on_send_and_the_header(desktop: Page, theme: str) -> None:
    """Item 7: Send and the header's buttons get a focus ring of contrast >= 3:1 against what is behind it."""
    page = desktop
    open_chat(page, "/")
    if theme == "dark":
        # Set again until it holds: the page's own dark-mode element applies its setting ("auto") when it
        # mounts, which on a loaded machine can come after a first set.
        page.wait_for_function(
            "() => { if (!document.body.classList.contains('body--dark')) Quasar.Dark.set(true);"
            " return document.body.classList.contains('body--dark'); }",
            polling=200,
        )
    page.get_by_test_id("msg-input").click()
    page.keyboard.press("Tab")
    focused = page.evaluate("document.activeElement.dataset.testid")
    assert focused == "send-btn", focused
    _assert_ring(page, "send-btn")
    for name in ("menu-btn", "language-switch", "dark-mode-btn"):
        _tab_to(page, name)
        _assert_ring(page, name)


def test_the_tab_after_send_goes_to_the_top_or_to_the_open_panel(desktop: Page) -> None:
    """Item 7: after Send, Tab goes to the header's menu (not nowhere); with the side panel open, into the panel."""
    page = desktop
    open_chat(page, "/?agent=general-assistant")
    page.get_by_test_id("msg-input").click()
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.dataset.testid") == "menu-btn"

    send(page, "@coding-assistant write a function that greets")
    expect(page.get_by_test_id("agent-invoke-panel")).to_be_visible(timeout=FIRST_TURN_MS)
    wait_for_turn_end(page)
    page.get_by_test_id("msg-input").click()
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.dataset.testid") == "send-btn"
    page.keyboard.press("Tab")
    assert page.evaluate("() => !!document.activeElement.closest('[data-testid=agent-invoke-panel]')"), page.evaluate(
        "document.activeElement.outerHTML.slice(0, 200)"
    )


def test_the_phones_first_page_opens_at_its_top_with_the_heading_in_view(phone: Page) -> None:
    """Item 8: a new chat on a phone opened scrolled 83 px down, its heading under the top bar."""
    page = phone
    open_chat(page, "/")
    heading = page.get_by_test_id("welcome").get_by_text("Start a conversation")
    expect(heading).to_be_visible()
    page.wait_for_timeout(800)  # app.js attaches to the chat every 250 ms (and used to scroll it to its end)
    assert page.evaluate("window.scrollY") == 0
    header = page.get_by_test_id("app-header").bounding_box()
    box = heading.bounding_box()
    assert header and box
    assert box["y"] >= header["y"] + header["height"], f"the heading {box} is under the top bar {header}"
    expect(heading).to_be_in_viewport(ratio=1)


def test_generating_stays_on_one_line_on_a_chinese_phone(browser: Browser, base_url: str) -> None:
    """Item 9: 生成中… wrapped on a phone, one character a line beside the agent picker."""
    context = browser.new_context(viewport=PHONE, base_url=base_url, locale="zh-CN")
    context.set_default_timeout(10_000)
    page = context.new_page()
    try:
        open_chat(page, "/?agent=coding-assistant")
        close_session_drawer(page)
        send(page, "/hang")
        generating = page.get_by_test_id("generating")
        expect(generating).to_be_visible(timeout=FIRST_TURN_MS)
        label = generating.get_by_text("生成中…")
        box = label.bounding_box()
        line = page.evaluate("(el) => parseFloat(getComputedStyle(el).lineHeight)", label.element_handle())
        assert box and box["height"] <= line * 1.5, f"生成中… takes {box} with a line of {line} px"
        assert box["x"] + box["width"] <= PHONE["width"], box
        page.get_by_test_id("stop-btn").click()
        wait_for_turn_end(page)
    finally:
        context.close()
