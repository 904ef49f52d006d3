"""Helpers shared by the browser tests: driving the chat page and reading what the server saved."""

from __future__ import annotations

import re
import time
import uuid

import httpx
from playwright.sync_api import Page, expect

from core.chat.demo_model import plan_reply

SESSION_URL = re.compile(r"/chat/(as_[A-Za-z0-9_]+)$")
TURN_TIMEOUT_MS = 20_000

# The text of the last assistant message: its markdown blocks, as the reader sees them.
_LAST_ASSISTANT_TEXT = """() => {
    const messages = document.querySelectorAll('[data-testid=assistant-message]');
    if (!messages.length) return null;
    const blocks = messages[messages.length - 1].querySelectorAll('.nicegui-markdown');
    return Array.from(blocks).map(b => b.innerText.trim()).filter(Boolean).join('\\n\\n');
}"""
# One sample of a running turn: the text so far and whether Generating… and Stop are shown.
_STREAM_SAMPLE = f"""() => ({{
    text: ({_LAST_ASSISTANT_TEXT})(),
    generating: !!document.querySelector('[data-testid=generating]:not(.hidden)'),
    stop: !!document.querySelector('[data-testid=stop-btn]:not(.hidden)'),
}})"""


def stream_sample(page: Page) -> dict:
    """One sample of a running turn: the text so far and whether Generating… and Stop are shown."""
    return page.evaluate(_STREAM_SAMPLE)


def open_chat(page: Page, path: str = "/") -> None:
    """Open a page and wait until NiceGUI's socket is connected (before that, clicks are lost)."""
    page.goto(path)
    page.wait_for_function("() => window.socket && window.socket.connected")


def send(page: Page, text: str) -> None:
    """Type a message, click Send and wait until the page shows it (the turn has then started)."""
    page.get_by_test_id("msg-input").fill(text)
    page.get_by_test_id("send-btn").click()
    expect(page.get_by_test_id("user-message").last).to_contain_text(text.splitlines()[0])


def assistant_text(page: Page) -> str | None:
    """The rendered text of the last assistant message (None when there is none yet)."""
    return page.evaluate(_LAST_ASSISTANT_TEXT)


def wait_for_turn_end(page: Page) -> None:
    """Wait until the page says the turn is over."""
    expect(page.get_by_test_id("generating")).to_be_hidden(timeout=TURN_TIMEOUT_MS)
    expect(page.get_by_test_id("stop-btn")).to_be_hidden()
    expect(page.get_by_test_id("send-btn")).to_be_enabled()


def wait_for_text(page: Page, min_chars: int, timeout_s: float = 10.0) -> str:
    """Wait until the last assistant message shows at least `min_chars` characters."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = assistant_text(page) or ""
        if len(text) >= min_chars:
            return text
        page.wait_for_timeout(30)
    raise AssertionError(f"the assistant never showed {min_chars} characters (last: {text!r})")


def session_id_of(page: Page) -> str:
    """The session id in the page's URL (`/chat/as_…`)."""
    expect(page).to_have_url(SESSION_URL)
    match = SESSION_URL.search(page.url)
    assert match, page.url
    return match.group(1)


def register_remote(base_url: str, card_url: str, agent_id: str) -> str:
    """Register the remote A2A agent whose card is at `card_url` under `agent_id` (201 or fail); returns the id."""
    created = httpx.post(f"{base_url}/api/a2a/remote-agents", json={"cardUrl": card_url, "id": agent_id}, timeout=30)
    assert created.status_code == 201, created.text
    return agent_id


def saved_messages(base_url: str, session_id: str) -> list[dict]:
    """The session's messages as the server saved them."""
    response = httpx.get(f"{base_url}/api/sessions/{session_id}/messages", timeout=5.0)
    response.raise_for_status()
    return response.json()


def lorem(count: int) -> str:
    """Exactly what the demo model answers to `/lorem <count>`."""
    return "".join(plan_reply([{"role": "user", "content": f"/lorem {count}"}], tools=None).tokens)


def words(text: str) -> list[str]:
    """The words of a text, ignoring how whitespace and paragraphs were rendered."""
    return text.split()


def as_rendered(markdown: str) -> str:
    """The text a reader sees for the demo model's markdown (quotes, bold, inline code, fences)."""
    text = re.sub(r"^```\w*$", "", markdown, flags=re.MULTILINE)
    text = re.sub(r"^> ?", "", text, flags=re.MULTILINE)
    return text.replace("**", "").replace("`", "")


def unique(prefix: str) -> str:
    """A message no other test sends."""
    return f"{prefix} {uuid.uuid4().hex[:8]}"
