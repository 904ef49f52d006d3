"""The chat page in a real Chromium against the real server and the offline demo model.

What the demo model says is deterministic (`core/chat/demo_model.py`), so every test
checks the exact answer, both as rendered and as saved (`GET /api/sessions/{id}/messages`).
All tests share one server and, in single-user mode, one user: each test sends
its own unique text and only looks at the sessions it made.
"""

from __future__ import annotations

import re
import time

import httpx
import pytest
from playwright.sync_api import Page, expect

from core.chat.demo_model import _echo
from e2e.helpers import (
    as_rendered,
    assistant_text,
    lorem,
    open_chat,
    saved_messages,
    send,
    session_id_of,
    stream_sample,
    unique,
    wait_for_text,
    wait_for_turn_end,
    words,
)

pytestmark = pytest.mark.e2e

# -- tests ----------------------------------------------------------------------------------


def test_send_streams_the_answer_chunk_by_chunk(page: Page, base_url: str) -> None:
    """The answer grows on screen while it streams, with Generating… and Stop shown, then both go."""
    open_chat(page)
    # About 150 words: the echo streams some 180 tokens, ≈ 2.7 s at 15 ms a token.
    text = unique("stream") + " " + " ".join(f"word{i}" for i in range(150))
    send(page, text)

    generating, stop_btn = page.get_by_test_id("generating"), page.get_by_test_id("stop-btn")
    expect(generating).to_be_visible()
    expect(stop_btn).to_be_visible()
    expect(page.get_by_test_id("send-btn")).to_be_disabled()
    session_id = session_id_of(page)  # the new chat got its id as soon as the message was sent

    lengths: list[int] = []
    visible_while_streaming = False
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        sample = stream_sample(page)
        if not sample["generating"]:
            break
        if sample["text"]:
            if not lengths or len(sample["text"]) != lengths[-1]:
                lengths.append(len(sample["text"]))
            if len(lengths) >= 5 and sample["stop"]:
                visible_while_streaming = True
        page.wait_for_timeout(25)

    assert len(lengths) >= 5, f"expected the answer to grow in several steps, saw lengths {lengths}"
    assert lengths == sorted(lengths), f"the streamed text shrank at some point: {lengths}"
    assert visible_while_streaming, "Generating… and Stop should stay visible while the text grows"

    wait_for_turn_end(page)
    expected = _echo(text, wants_code=False)
    assert words(assistant_text(page)) == words(as_rendered(expected))
    expect(page.get_by_test_id("assistant-message").locator("strong")).to_have_text("offline demo model")
    saved = saved_messages(base_url, session_id)
    assert [(m["role"], m["content"]) for m in saved] == [("user", text), ("assistant", expected)]
    assert saved[1]["status"] == "complete"
    expect(page).to_have_url(re.compile(rf"/chat/{session_id}$"))


def test_reload_mid_stream_replays_then_follows_live(page: Page, base_url: str) -> None:
    """A reload shows the answer so far, follows the rest live, and nothing is lost or repeated."""
    open_chat(page)
    send(page, "/lorem 300")  # ≈ 4.5 s
    session_id = session_id_of(page)
    before_reload = wait_for_text(page, 40)

    page.reload()
    page.wait_for_function("() => window.socket && window.socket.connected")
    generating = page.get_by_test_id("generating")
    # The replay brings back at least what was on screen before, while the turn still runs.
    replayed = wait_for_text(page, len(before_reload))
    assert words(lorem(300))[: len(words(replayed))] == words(replayed), "the replayed text is not the answer's start"
    expect(generating).to_be_visible()
    grew = {len(replayed)}
    deadline = time.monotonic() + 15
    while generating.is_visible() and time.monotonic() < deadline:
        grew.add(len(assistant_text(page) or ""))
        page.wait_for_timeout(50)
    assert len(grew) >= 3, f"after the reload the answer should keep growing live, saw lengths {sorted(grew)}"

    wait_for_turn_end(page)
    expected = lorem(300)
    assert words(assistant_text(page)) == words(expected), "words were lost or repeated across the reload"
    expect(page.get_by_test_id("assistant-message")).to_have_count(1)
    expect(page.get_by_test_id("user-message")).to_have_count(1)
    saved = saved_messages(base_url, session_id)
    assert [(m["role"], m["content"]) for m in saved] == [("user", "/lorem 300"), ("assistant", expected)]

    page.reload()
    page.wait_for_function("() => window.socket && window.socket.connected")
    expect(page.get_by_test_id("assistant-message")).to_have_count(1)
    expect(page.get_by_test_id("user-message")).to_have_count(1)
    assert words(assistant_text(page)) == words(expected)
    expect(generating).to_be_hidden()


def test_stop_keeps_the_partial_answer(page: Page, base_url: str) -> None:
    """Stop ends the answer where it is; the partial text and a "Stopped." note are saved."""
    open_chat(page)
    send(page, "/lorem 2000")  # ≈ 30 s if nobody stopped it
    session_id = session_id_of(page)
    wait_for_text(page, 100)
    page.get_by_test_id("stop-btn").click()

    message = page.get_by_test_id("assistant-message")
    expect(message.get_by_text("Stopped.", exact=True)).to_be_visible()
    wait_for_turn_end(page)
    stopped_at = assistant_text(page)
    page.wait_for_timeout(600)  # 40 tokens' worth of time: the text must not grow any more
    assert assistant_text(page) == stopped_at, "the answer kept growing after Stop"
    full = words(lorem(2000))
    shown = words(stopped_at)
    assert 0 < len(shown) < len(full) and full[: len(shown)] == shown

    saved = saved_messages(base_url, session_id)
    assert [m["role"] for m in saved] == ["user", "assistant"]
    assert saved[1]["status"] == "canceled"
    assert words(saved[1]["content"]) == shown, "the saved partial answer differs from what was shown"

    page.reload()
    page.wait_for_function("() => window.socket && window.socket.connected")
    expect(message).to_have_count(1)
    expect(message.get_by_text("Stopped.", exact=True)).to_be_visible()
    assert words(assistant_text(page)) == shown
    expect(page.get_by_test_id("stop-btn")).to_be_hidden()


def test_session_list_and_switching(page: Page, base_url: str) -> None:
    """Two chats are listed newest first; clicking the older one opens it; the list survives a reload."""
    first_text, second_text = unique("first chat"), unique("second chat")
    open_chat(page)
    send(page, first_text)
    first_id = session_id_of(page)
    wait_for_turn_end(page)

    page.get_by_test_id("new-session-btn").click()
    expect(page).to_have_url(re.compile(r"/(\?agent=[\w-]+)?$"))
    page.wait_for_function("() => window.socket && window.socket.connected")
    expect(page.get_by_test_id("assistant-message")).to_have_count(0)
    send(page, second_text)
    expect(page).not_to_have_url(re.compile(rf"/chat/{first_id}$"))
    second_id = session_id_of(page)
    assert second_id != first_id
    wait_for_turn_end(page)

    items = page.get_by_test_id("session-list").get_by_test_id("session-item")

    def listed_ids() -> list[str]:
        return [i for i in items.evaluate_all("els => els.map(e => e.dataset.sessionId)") if i in {first_id, second_id}]

    expect(items.first).to_have_attribute("data-session-id", second_id)  # the newest is on top
    assert listed_ids() == [second_id, first_id]
    expect(page.locator(f'[data-testid=session-item][data-session-id="{first_id}"]')).to_contain_text(first_text)

    page.locator(f'[data-testid=session-item][data-session-id="{first_id}"]').click()
    expect(page).to_have_url(re.compile(rf"/chat/{first_id}$"))
    page.wait_for_function("() => window.socket && window.socket.connected")
    expect(page.get_by_test_id("user-message")).to_have_count(1)
    expect(page.get_by_test_id("user-message")).to_contain_text(first_text)
    expect(page.get_by_test_id("assistant-message")).to_have_count(1)
    assert words(assistant_text(page)) == words(as_rendered(_echo(first_text, wants_code=False)))
    expect(page.get_by_text(second_text)).to_have_count(1)  # only its session-list entry

    page.reload()
    page.wait_for_function("() => window.socket && window.socket.connected")
    expect(items.first).to_have_attribute("data-session-id", second_id)
    assert listed_ids() == [second_id, first_id]
    expect(page.get_by_test_id("user-message")).to_contain_text(first_text)


def _choose_agent(page: Page, name: str) -> None:
    picker = page.get_by_test_id("agent-picker")
    picker.click()
    page.get_by_role("option", name=name, exact=True).click()
    expect(picker).to_contain_text(name)


def test_agent_picker_coding_assistant_answers_with_code(page: Page, base_url: str) -> None:
    """On a new chat, picking the Coding Assistant gives an answer with a rendered code block."""
    open_chat(page)
    _choose_agent(page, "Coding Assistant")
    send(page, "show code")
    session_id = session_id_of(page)
    wait_for_turn_end(page)

    message = page.get_by_test_id("assistant-message")
    expect(message.locator(".q-message-name")).to_have_text("Coding Assistant")
    code = message.locator("pre code, .codehilite").first
    expect(code).to_be_visible()
    expect(code).to_contain_text("def answer() -> str:")
    expect(code).to_contain_text('return "show code"')
    saved = saved_messages(base_url, session_id)
    assert saved[-1]["content"] == _echo("show code", wants_code=True)
    session = httpx.get(f"{base_url}/api/sessions/{session_id}", timeout=5.0).json()
    assert session["agentId"] == "coding-assistant"


def test_finished_answer_renders_like_the_saved_one(page: Page) -> None:
    """Once a streamed answer ends, it is one markdown element, exactly as after a reload."""
    open_chat(page)
    send(page, unique("render check"))
    wait_for_turn_end(page)
    page.wait_for_timeout(300)  # a few flush ticks of the page's timer
    blocks = page.get_by_test_id("assistant-message").locator(".nicegui-markdown")
    live_count = blocks.count()

    page.reload()
    page.wait_for_function("() => window.socket && window.socket.connected")
    expect(blocks).to_have_count(1)
    assert live_count == 1, f"the finished live answer is still split into {live_count} markdown blocks"
