"""Files in a real Chromium (issue 36), at 1280×800 and 390×844.

A file attached with the button, pasted or dropped reaches a remote a2a-sdk 1.3 agent as a file
part; the callee's image, file and data artifacts show in the side panel (the image previewed, the file
downloadable by its owner, the data folded as JSON).

The remote agent is `tests/utils/a2a_files_agent.py`, served from this test process: it records each
message it gets and answers `/artifacts` with a PNG, a text and a data part.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from e2e.conftest import VIEWPORTS, serve_app
from e2e.helpers import TURN_TIMEOUT_MS, open_chat, register_remote, send, session_id_of, unique, wait_for_turn_end
from tests.utils.a2a_files_agent import PNG, files_agent

pytestmark = pytest.mark.e2e

_OVERFLOW = "() => document.documentElement.scrollWidth - window.innerWidth"
_PASTE = """([name, text]) => {
    const data = new DataTransfer();
    data.items.add(new File([text], name, {type: 'text/plain'}));
    const target = document.querySelector('textarea[data-testid=msg-input], [data-testid=msg-input] textarea');
    target.dispatchEvent(new ClipboardEvent('paste', {clipboardData: data, bubbles: true, cancelable: true}));
}"""
_DROP = """([name, text]) => {
    const data = new DataTransfer();
    data.items.add(new File([text], name, {type: 'text/plain'}));
    document.body.dispatchEvent(new DragEvent('drop', {dataTransfer: data, bubbles: true, cancelable: true}));
}"""


@pytest.fixture(scope="module")
def remote(base_url: str) -> Iterator[tuple[str, list[dict]]]:
    """The recording a2a-sdk agent, registered with the app under a fresh id: (id, what it received)."""
    with files_agent() as (card_url, received):
        yield register_remote(base_url, card_url, f"files-{unique('x').split()[1]}"), received


def test_a_file_attached_in_the_browser_reaches_a_remote_agent_and_its_image_shows_in_the_panel(
    sized_page: Page, remote: tuple[str, list[dict]]
) -> None:
    page = sized_page
    agent_id, received = remote
    open_chat(page, "/?agent=general-assistant")
    with page.expect_file_chooser() as chooser:
        page.get_by_test_id("chat-attach").click()
    chooser.value.set_files(files=[{"name": "dot.png", "mimeType": "image/png", "buffer": PNG}])
    expect(page.get_by_test_id("chat-attachment")).to_have_count(1)
    page.evaluate(_PASTE, ["pasted.txt", "from the clipboard"])
    page.evaluate(_DROP, ["dropped.txt", "from a drop"])
    expect(page.get_by_test_id("chat-attachment")).to_have_count(3)
    assert page.evaluate(_OVERFLOW) <= 0

    count = len(received)
    note = unique("have a look")
    send(page, f"@{agent_id} {note}")
    wait_for_turn_end(page)
    message = received[count]
    files = {p["filename"]: p for p in message["parts"] if "filename" in p}
    assert files["dot.png"] == {"raw": base64.b64encode(PNG).decode(), "filename": "dot.png", "mediaType": "image/png"}
    assert base64.b64decode(files["pasted.txt"]["raw"]) == b"from the clipboard"
    assert base64.b64decode(files["dropped.txt"]["raw"]) == b"from a drop"
    expect(page.get_by_test_id("chat-attachment")).to_have_count(0)  # sent: the composer is empty again
    sent = page.get_by_test_id("user-message").last
    expect(sent.get_by_test_id("message-file-image")).to_be_visible()
    expect(sent.get_by_test_id("message-file")).to_have_count(2)

    back = page.get_by_test_id("agent-invoke-back")  # on a phone the panel covers the composer
    if back.is_visible():
        back.click()
    send(page, f"@{agent_id} /artifacts {unique('please')}")
    panel = page.get_by_test_id("agent-invoke-panel")
    image = panel.get_by_test_id("agent-panel-image").last
    expect(image).to_be_visible(timeout=TURN_TIMEOUT_MS)
    expect(image.locator("img")).to_have_js_property("naturalWidth", 8)  # the PNG loaded, for its owner
    expect(panel.get_by_test_id("agent-panel-file").last).to_contain_text("chart.png")
    data = panel.get_by_test_id("agent-panel-data").last
    expect(data).to_be_visible()
    data.click()  # folded until opened
    expect(data).to_contain_text('"days": 3')
    assert page.evaluate(_OVERFLOW) <= 0
    wait_for_turn_end(page)


def test_the_demo_models_file_and_data_show_in_the_panel(sized_page: Page) -> None:
    page = sized_page
    open_chat(page, "/?agent=general-assistant")
    send(page, "@coding-assistant /file chart.png")
    panel = page.get_by_test_id("agent-invoke-panel")
    expect(panel.get_by_test_id("agent-panel-image").last.locator("img")).to_have_js_property(
        "naturalWidth", 8, timeout=TURN_TIMEOUT_MS
    )
    expect(panel.get_by_test_id("agent-invoke-body").last).not_to_contain_text("artifact-file")
    wait_for_turn_end(page)
    back = page.get_by_test_id("agent-invoke-back")  # on a phone the panel covers the composer
    if back.is_visible():
        back.click()
    send(page, "@coding-assistant /data")
    data = panel.get_by_test_id("agent-panel-data").last
    expect(data).to_be_visible(timeout=TURN_TIMEOUT_MS)
    data.click()
    expect(data).to_contain_text('"ratio": 0.5')
    assert page.evaluate(_OVERFLOW) <= 0
    wait_for_turn_end(page)


def test_a_finished_tasks_artifacts_show_from_what_was_saved(browser: Browser) -> None:
    """With the task's stream gone (`STREAM_BUFFER_TTL_S=0`), its card opens it from the saved task and files."""
    with serve_app(STREAM_BUFFER_TTL_S="0") as url:
        context = browser.new_context(viewport=VIEWPORTS["desktop"], base_url=url)
        context.set_default_timeout(10_000)
        try:
            page = context.new_page()
            open_chat(page, "/?agent=general-assistant")
            send(page, "@coding-assistant /file chart.png @coding-assistant /data")
            wait_for_turn_end(page)
            page.reload()
            cards = page.get_by_test_id("tool-call")
            expect(cards).to_have_count(2)
            cards.first.click()
            panel = page.get_by_test_id("agent-invoke-panel")
            expect(panel.get_by_test_id("agent-panel-image").locator("img")).to_have_js_property("naturalWidth", 8)
            cards.last.click()
            data = panel.get_by_test_id("agent-panel-data").last
            data.click()
            expect(data).to_contain_text('"days": 3')
            expect(panel.get_by_test_id("agent-invoke-body").last).not_to_contain_text("artifact-data")
        finally:
            context.close()


def test_a_removed_file_is_not_sent_and_a_local_callee_gets_the_rest(sized_page: Page, base_url: str) -> None:
    page = sized_page
    open_chat(page, "/?agent=general-assistant")
    page.evaluate(_PASTE, ["keep.txt", "kept"])
    page.evaluate(_PASTE, ["drop-me.txt", "removed"])
    chips = page.get_by_test_id("chat-attachment")
    expect(chips).to_have_count(2)
    chips.filter(has_text="drop-me.txt").locator(".q-chip__icon--remove").click()
    expect(chips).to_have_count(1)
    send(page, "@coding-assistant look")
    wait_for_turn_end(page)
    session = session_id_of(page)
    [task] = [t for t in httpx.get(f"{base_url}/api/tasks", timeout=5).json() if t["callerSessionId"] == session]
    answer = httpx.get(f"{base_url}/api/tasks/{task['id']}", timeout=5).json()["messages"][-1]["content"]
    assert "Received file: keep.txt (text/plain, 4 bytes)" in answer and "drop-me.txt" not in answer
    assert page.evaluate(_OVERFLOW) <= 0


def test_a_chats_own_file_and_data_show_in_its_answer(sized_page: Page) -> None:
    """`/file` and `/data` without a mention: the chat's answer shows the image and the folded data, not the block."""
    page = sized_page
    open_chat(page, "/?agent=general-assistant")
    send(page, "/file dot.png")
    wait_for_turn_end(page)
    answer = page.get_by_test_id("assistant-message").last
    expect(answer.get_by_test_id("message-artifact-image").locator("img")).to_have_js_property("naturalWidth", 8)
    expect(answer).not_to_contain_text("artifact-file")
    send(page, "/data")
    wait_for_turn_end(page)
    data = page.get_by_test_id("assistant-message").last.get_by_test_id("agent-panel-data")
    data.click()
    expect(data).to_contain_text('"ok": true')
    page.reload()  # and from the saved answer
    expect(page.get_by_test_id("message-artifact-image").locator("img")).to_have_js_property("naturalWidth", 8)
    expect(page.get_by_test_id("assistant-message").last.get_by_test_id("agent-panel-data")).to_be_visible()
    assert page.evaluate(_OVERFLOW) <= 0
