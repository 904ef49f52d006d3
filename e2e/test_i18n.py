"""Chinese in a real Chromium (issue 17): pages, the side panel's states, the header's switch.

A zh-CN browser gets Chinese pages, the side panel says the seeds' words for each state, and the
header's switch changes the language in place and keeps it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from e2e.helpers import TURN_TIMEOUT_MS, open_chat, send, wait_for_turn_end
from e2e.test_broker_background import echo_agent_id  # noqa: F401 (the example echo agent behind the pipe)

pytestmark = pytest.mark.e2e

VIEWPORTS = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}
FIRST_TURN_MS = 30_000  # a fresh server's first turn imports LiteLLM (3-5 s, more on a busy machine)
PAGES = ("/", "/agents", "/audit", "/broker", "/remote-agents", "/api-keys")

# Every word the panel's status badges have shown, in order (a MutationObserver: no state is missed).
_RECORD_STATUSES = """() => {
    window.__statuses = [];
    const seen = () => document.querySelectorAll('[data-testid=agent-invoke-status]').forEach(b => {
        const word = b.innerText.trim();
        if (word && window.__statuses[window.__statuses.length - 1] !== word) window.__statuses.push(word);
    });
    new MutationObserver(seen).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


def _context_page(browser: Browser, base_url: str, viewport: str, locale: str) -> Page:
    context = browser.new_context(viewport=VIEWPORTS[viewport], base_url=base_url, locale=locale)
    context.set_default_timeout(10_000)
    page = context.new_page()
    page.viewport_name = viewport  # type: ignore[attr-defined]
    return page


@pytest.fixture(params=list(VIEWPORTS))
def zh_page(request: pytest.FixtureRequest, browser: Browser, base_url: str) -> Iterator[Page]:
    """A page of a browser set to Chinese (`Accept-Language: zh-CN`), at one of the two viewports."""
    page = _context_page(browser, base_url, request.param, "zh-CN")
    try:
        yield page
    finally:
        page.context.close()


@pytest.fixture
def zh_desktop(browser: Browser, base_url: str) -> Iterator[Page]:
    """A Chinese browser at 1280x800."""
    page = _context_page(browser, base_url, "desktop", "zh-CN")
    try:
        yield page
    finally:
        page.context.close()


def _close_panel_on_a_phone(page: Page) -> None:
    if page.viewport_name == "phone":  # type: ignore[attr-defined]
        page.get_by_test_id("agent-invoke-back").click()


def test_a_chinese_browser_gets_chinese_pages_that_fit_the_screen(zh_page: Page) -> None:
    """First visit with Accept-Language zh-CN: every page is Chinese, and none is wider than the screen."""
    page = zh_page
    for path in PAGES:
        open_chat(page, path)
        assert page.evaluate("document.documentElement.lang") == "zh-CN", path
        expect(page.get_by_test_id("nav-chat")).to_have_text("对话")
        expect(page.get_by_test_id("language-switch")).to_have_attribute("data-language", "zh_CN")
        widths = page.evaluate("() => [document.documentElement.scrollWidth, innerWidth]")
        assert widths[0] <= widths[1], f"{path}: the page is {widths[0]} px wide in a {widths[1]} px viewport"
    open_chat(page, "/")
    expect(page.get_by_test_id("welcome")).to_contain_text("开始对话")
    expect(page.get_by_test_id("msg-input")).to_have_attribute("placeholder", "消息（Enter 发送，Shift+Enter 换行）")
    # NiceGUI's own "connection lost" popup is in the catalog's words too, and Quasar's own words are Chinese.
    assert page.evaluate("Array.from(document.querySelectorAll('#popup span')).map(s => s.textContent)") == [
        "连接中断",
        "正在尝试重新连接…",
    ]
    page.wait_for_function("() => window.Quasar && Quasar.lang.props.isoName === 'zh-CN'")


def test_a_chinese_message_gets_a_chinese_answer_with_chinese_code_buttons(zh_desktop: Page) -> None:
    """The demo model answers Chinese in Chinese; the code block's Copy button (assets/app.js) is Chinese too."""
    page = zh_desktop
    open_chat(page, "/?agent=coding-assistant")
    send(page, "写一个打招呼的函数")
    wait_for_turn_end(page)
    expect(page.get_by_test_id("assistant-message").last).to_contain_text("你写了 1 个词：")
    expect(page.get_by_test_id("assistant-message").last).to_contain_text("离线演示模型")
    copy = page.get_by_test_id("code-copy-btn").last
    expect(copy).to_have_attribute("data-label", "复制")
    expect(copy).to_have_attribute("aria-label", "复制代码")


def test_a_delegation_shows_waiting_generating_and_done_in_chinese(zh_page: Page) -> None:
    """The panel: 等待回复… before the first token, 生成中… while it streams, 完成 at the end."""
    page = zh_page
    open_chat(page, "/?agent=general-assistant")
    page.evaluate(_RECORD_STATUSES)
    send(page, "@coding-assistant /slow 20 60")
    status = page.get_by_test_id("agent-invoke-status")
    expect(status).to_have_text("生成中…", timeout=FIRST_TURN_MS)
    expect(status).to_have_text("完成", timeout=TURN_TIMEOUT_MS)
    seen = page.evaluate("window.__statuses")
    assert seen == ["等待回复…", "生成中…", "完成"], seen
    expect(page.get_by_test_id("agent-invoke-tab")).to_have_attribute("data-state", "completed")
    _close_panel_on_a_phone(page)
    wait_for_turn_end(page)
    expect(page.get_by_test_id("tool-call-status")).to_have_text("完成")
    expect(page.get_by_test_id("tool-call-title")).to_have_text("已委派给 Coding Assistant")


def test_stop_shows_the_chinese_stopped_state(zh_desktop: Page) -> None:
    """Stop during a delegation: the tab and the card say 已停止 (the state stays `canceled`)."""
    page = zh_desktop
    open_chat(page, "/?agent=general-assistant")
    send(page, "@coding-assistant /hang")
    status = page.get_by_test_id("agent-invoke-status")
    expect(status).to_have_text("生成中…", timeout=FIRST_TURN_MS)
    page.get_by_test_id("stop-btn").click()
    expect(status).to_have_text("已停止", timeout=TURN_TIMEOUT_MS)
    expect(page.get_by_test_id("agent-invoke-tab")).to_have_attribute("data-state", "canceled")
    wait_for_turn_end(page)
    expect(page.get_by_test_id("tool-call-status")).to_have_text("已停止")
    expect(page.get_by_test_id("assistant-message").last).to_contain_text("已停止。")


def test_a_timeout_shows_the_chinese_timed_out_state(zh_desktop: Page) -> None:
    """`/timeout 500 @coding-assistant /hang`: the tab says 任务超时 (the state stays `failed`)."""
    page = zh_desktop
    open_chat(page, "/?agent=general-assistant")
    send(page, "/timeout 500 @coding-assistant /hang")
    status = page.get_by_test_id("agent-invoke-status")
    expect(status).to_have_text("任务超时", timeout=FIRST_TURN_MS)
    expect(page.get_by_test_id("agent-invoke-tab")).to_have_attribute("data-state", "failed")
    # The reason is in the reader's language too: the turn keeps the language of the page that started it.
    expect(page.get_by_test_id("agent-invoke-error")).to_have_text("Coding Assistant 未能在 0.5 秒内完成，已被停止。")
    expect(page.get_by_test_id("agent-invoke-status")).to_have_attribute("data-reason", "timeout")
    wait_for_turn_end(page)
    expect(page.get_by_test_id("tool-call-status")).to_have_text("任务超时")  # the card says the same


def test_a_lost_stream_shows_connection_lost_in_chinese(zh_desktop: Page, echo_agent_id: str) -> None:  # noqa: F811
    """A broker agent that leaves mid-stream (`/disconnect`): the tab says 连接中断 (the state stays `failed`)."""
    page = zh_desktop
    open_chat(page, "/?agent=general-assistant")
    send(page, f"@{echo_agent_id} /disconnect one two three four")
    status = page.get_by_test_id("agent-invoke-status")
    expect(status).to_have_text("连接中断", timeout=FIRST_TURN_MS)
    expect(status).to_have_attribute("data-reason", "connection_lost")
    expect(page.get_by_test_id("agent-invoke-tab")).to_have_attribute("data-state", "failed")
    # Issue 40: the reason is Chinese too (it was "Echo is unreachable: … (the agent disconnected)").
    expect(page.get_by_test_id("agent-invoke-error")).to_contain_text("无法连接")
    expect(page.get_by_test_id("agent-invoke-error")).to_contain_text("连接失败或已中断")
    expect(page.get_by_test_id("agent-invoke-error")).not_to_contain_text("unreachable")
    wait_for_turn_end(page)
    expect(page.get_by_test_id("tool-call-status")).to_have_text("连接中断")


def test_the_switch_changes_the_language_without_a_reload_and_keeps_it(browser: Browser, base_url: str) -> None:
    """An English browser switches to Chinese in the header: same page (no reload), kept after a reload."""
    page = _context_page(browser, base_url, "desktop", "en-US")
    try:
        open_chat(page, "/?agent=general-assistant")
        expect(page.get_by_test_id("nav-chat")).to_have_text("Chat")
        page.get_by_test_id("msg-input").fill("draft")
        page.evaluate("window.__sameDocument = true")
        page.get_by_test_id("language-switch").click()
        page.get_by_role("option", name="简体中文").click()
        expect(page.get_by_test_id("nav-chat")).to_have_text("对话")
        expect(page.get_by_test_id("welcome")).to_contain_text("开始对话")
        assert page.evaluate("window.__sameDocument === true"), "the switch reloaded the page"
        expect(page.get_by_test_id("msg-input")).to_have_value("draft")  # what was being typed stays
        assert page.evaluate("document.documentElement.lang") == "zh-CN"
        page.wait_for_function("() => Quasar.lang.props.isoName === 'zh-CN'")
        # The rebuilt page works: a message gets its answer, in the page's language where the page speaks.
        send(page, "hello")
        wait_for_turn_end(page)
        expect(page.get_by_test_id("user-message").last.locator(".q-message-name")).to_have_text("你")

        page.reload()
        page.wait_for_function("() => window.socket && window.socket.connected")
        expect(page.get_by_test_id("nav-chat")).to_have_text("对话")
        open_chat(page, "/audit")
        expect(page.get_by_test_id("nav-audit")).to_have_text("委派任务")

        open_chat(page, "/?lang=en")  # a link's ?lang= wins and is kept
        expect(page.get_by_test_id("nav-chat")).to_have_text("Chat")
        open_chat(page, "/audit")
        expect(page.get_by_test_id("nav-audit")).to_have_text("Delegated tasks")
    finally:
        page.context.close()


def test_the_switch_works_on_a_phone_and_the_page_fits(browser: Browser, base_url: str) -> None:
    """At 390x844 the switch is in the header, works, and nothing is wider than the screen in either language."""
    page = _context_page(browser, base_url, "phone", "en-US")
    try:
        open_chat(page, "/")
        switch = page.get_by_test_id("language-switch")
        expect(switch).to_be_visible()
        switch.click()
        page.get_by_role("option", name="简体中文").click()
        expect(page.get_by_test_id("welcome")).to_contain_text("开始对话")
        for path in PAGES:
            open_chat(page, path)
            widths = page.evaluate("() => [document.documentElement.scrollWidth, innerWidth]")
            assert widths[0] <= widths[1], f"{path}: the page is {widths[0]} px wide in a {widths[1]} px viewport"
    finally:
        page.context.close()


# Words that stay as they are in Chinese: names of things (protocols, products, the seeded agents, units).
_KEPT_WORDS = {
    "A2A",
    "API",
    "Redis",
    "JSON",
    "URL",
    "HTTP",
    "WebSocket",
    "JWT",
    "ID",
    "MB",
    "KiB",
    "ms",
    "Coding",
    "Assistant",
    "General",
    "Planner",
    "Echo",
    "Travel",
    "local",
    "demo",
    "python",
    "lorem",  # the request as the person wrote it (`/lorem 3`): their words, not the page's
}


# The text a person reads: text nodes in visible elements; icons (ligature names such as `menu`) and code left out.
_VISIBLE_TEXT = """() => {
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    const parts = [];
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        const el = node.parentElement;
        if (!el || el.closest('.q-icon, .material-icons, code, pre, kbd, script, style, [aria-hidden=true]')) continue;
        if (!el.offsetParent && getComputedStyle(el).position !== 'fixed') continue;
        parts.push(node.textContent);
    }
    return parts.join(' ');
}"""


def _english_words(page: Page) -> set[str]:
    """Latin words of three letters or more in the page's visible text, less what is not prose.

    Not prose: names that stay as they are (`_KEPT_WORDS`), and the pieces of a command or an address
    written into a sentence: a token with `/`, `.`, `=`, `?` or `_` in it, a placeholder or an HTTP method
    in capitals (`NAME`, `POST`), an identifier in camel case (`agentId`).
    """
    words = set()
    for token in re.split(r"[\s（），、；：。()]+", page.evaluate(_VISIBLE_TEXT)):
        if re.search(r"[/.=?_]", token) or token.isupper() or re.search(r"[a-z][A-Z]", token):
            continue
        words.update(re.findall(r"[A-Za-z][A-Za-z'-]{2,}", token))
    return words - _KEPT_WORDS


TASK_DATA_FIELDS = ("input", "calleeAgentName", "calleeAgentId", "callerAgentId", "callerAgentName")


def test_the_broker_and_audit_pages_have_no_english_left_in_chinese(zh_page: Page) -> None:
    """After a delegation, /audit and /broker in a Chinese browser: every visible word is Chinese (issue 40 item 5).

    Names stay (agents, protocols, products); a state, reason or label built from parts is translated.
    """
    page = zh_page
    open_chat(page, "/?agent=general-assistant")
    send(page, "@coding-assistant /lorem 3")
    expect(page.get_by_test_id("agent-invoke-status")).to_have_text("完成", timeout=FIRST_TURN_MS)
    # What the pages show as data is in the data's own words: agents' names and ids, the requests people wrote.
    tasks = page.request.get("/api/tasks").json()
    broker_agents = page.request.get("/a2a/agents").json()["agents"]
    local_agents = page.request.get("/api/agents").json()
    data = " ".join(
        [t[k] or "" for t in tasks for k in TASK_DATA_FIELDS]
        + [f"{a.get('name', '')} {a.get('a2a_id', '')}" for a in broker_agents]
        + [f"{a.get('name', '')} {a.get('id', '')}" for a in local_agents]
    )
    data_words = set(re.findall(r"[A-Za-z][A-Za-z'-]{2,}", data))
    for path in ("/audit", "/broker"):
        open_chat(page, path)
        page.wait_for_timeout(300)  # the page's first data
        assert _english_words(page) - data_words == set(), path
