"""The chat page through NiceGUI's simulated `User` (no browser), with the offline demo model.

app.py builds the real app on a fresh data dir for every test (see `isolated_env` in tests/conftest.py).

What the simulation cannot show (layout, CSS visibility, real key modifiers such as Shift+Enter)
is left to the Playwright tests in e2e/.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import pytest
from nicegui import ElementFilter, app, ui
from nicegui import core as nicegui_core
from nicegui.testing import User
from nicegui.testing.user_interaction import UserInteraction
from redis.exceptions import ConnectionError as RedisConnectionError

from core.auth import accounts
from core.db import Database
from core.services import Services
from core.settings import load_settings
from tests.utils.simulated_user import simulated_app_user
from tests.utils.sync import run_sync

TEST_IDS = ["msg-input", "send-btn", "stop-btn", "session-list", "new-session-btn", "agent-picker", "chat-messages"]

GUIDE = (
    "This is the **offline demo model**: it answers deterministically, token by token. "
    "Mention an agent (`@coding-assistant write a haiku`) to delegate, or send `/lorem 300` for a long reply."
)


def echo_of(text: str, words: int) -> str:
    """The demo model's exact answer to a plain one-line message (core/chat/demo_model.py, rule 5)."""
    return f"You wrote {words} word{'s' if words != 1 else ''}:\n\n> {text}\n\n{GUIDE}"


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def litellm_imported() -> None:
    """Import LiteLLM (3-5 s, once per process) before the first test, not inside its time limits."""
    from core.chat.llm import litellm_module

    litellm_module()


@pytest.fixture
def app_env(request: pytest.FixtureRequest, isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Environment and data for app.py, set up before it runs.

    Parametrise it indirectly with `{"env": {...}, "accounts": [(name, password), ...]}`.
    """
    param: dict[str, Any] = getattr(request, "param", {})
    # app.py setdefault()s this one; keep it per test so it does not leak into later tests.
    monkeypatch.setenv("NICEGUI_STORAGE_PATH", str(isolated_env / "nicegui-storage"))
    for name, value in param.get("env", {}).items():
        monkeypatch.setenv(name, value)
    if param.get("accounts"):
        _create_accounts(param["accounts"])
    return param


def _create_accounts(pairs: list[tuple[str, str]]) -> None:
    db = Database(load_settings().database)
    db.migrate()

    async def create() -> None:
        try:
            async with db.session() as s:
                for username, password in pairs:
                    await accounts.create_user(s, username=username, password=password)
        finally:
            await db.close()

    run_sync(create())


@pytest.fixture
async def user(
    app_env: dict[str, Any], caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest
) -> AsyncIterator[User]:
    """NiceGUI's `user` fixture, but only once `app_env` has prepared the environment."""
    async with simulated_app_user(request, caplog) as simulated:
        yield simulated


SLOW_DEMO = {"env": {"DEMO_MODEL_DELAY_MS": "10"}}
ALICE = ("alice", "alice-password")
BOB = ("bob", "bob-password")
MULTI_USER = {"accounts": [ALICE, BOB]}


# -- helpers --------------------------------------------------------------------------------


def services() -> Services:
    return app.state.services


async def wait_until(predicate: Callable[[], bool], *, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)


def element(user: User, marker: str) -> ui.element:
    """The one element with that marker, visible or not."""
    with user:
        found = list(ElementFilter(marker=marker, local_scope=False))
    assert len(found) == 1, f"expected one element marked {marker!r}, found {len(found)}"
    return found[0]


def bubbles(user: User, testid: str) -> list[ui.chat_message]:
    with user:
        return [
            e for e in ElementFilter(kind=ui.chat_message, local_scope=False) if e.props.get("data-testid") == testid
        ]


def text_of(bubble: ui.element) -> str:
    """The markdown text shown in a chat bubble, in order."""
    return "".join(e.content for e in bubble.descendants() if isinstance(e, ui.markdown))


def user_texts(user: User) -> list[str]:
    """The user's messages as shown: plain text (labels) and fenced code (markdown), in order."""
    return [
        "\n".join(
            e.content if isinstance(e, ui.markdown) else e.text
            for e in b.descendants()
            if isinstance(e, ui.markdown | ui.label)
        )
        for b in bubbles(user, "user-message")
    ]


def assistant_texts(user: User) -> list[str]:
    return [text_of(b) for b in bubbles(user, "assistant-message")]


def session_titles(user: User) -> list[tuple[str, str]]:
    """(session id, title) of the session list's items, top to bottom."""
    items = [child for child in element(user, "session-list").default_slot.children if isinstance(child, ui.item)]
    result = []
    for item in items:
        labels = [e for e in item.descendants() if isinstance(e, ui.item_label)]
        result.append((item.props["data-session-id"], labels[0].text))
    return result


def current_session_id(user: User) -> str | None:
    """The id of the chat the page shows (from the session list's active item)."""
    items = [
        c
        for c in element(user, "session-list").default_slot.children
        if isinstance(c, ui.item) and c.props.get("active")
    ]
    return items[0].props["data-session-id"] if items else None


async def wait_for_answer(user: User, count: int = 1, timeout: float = 30.0) -> None:
    """Wait until `count` answers are on the page and the page shows no turn running."""
    send_btn, stop_btn = element(user, "send-btn"), element(user, "stop-btn")
    await wait_until(
        lambda: (
            len(bubbles(user, "assistant-message")) >= count
            and send_btn.enabled
            and not stop_btn.visible
            and not any(services().chat.is_running(sid) for sid, _ in session_titles(user))
        ),
        timeout=timeout,
        what=f"{count} finished answer(s)",
    )


async def send(user: User, text: str, *, via: str = "button") -> None:
    user.find(marker="msg-input").type(text)
    if via == "button":
        user.find(marker="send-btn").click()
    else:
        user.find(marker="msg-input").trigger("keydown.enter.exact.prevent")


async def navigated(user: User, previous) -> None:
    await wait_until(lambda: user.client is not previous, what="the next page to open")


async def saved_messages(session_id: str) -> list:
    from core.chat import sessions as sessions_store

    async with services().db.session() as s:
        return await sessions_store.list_messages(s, session_id=session_id)


# -- the page -------------------------------------------------------------------------------


async def test_the_page_has_every_test_id_and_the_docs(user: User) -> None:
    await user.open("/")
    for name in TEST_IDS:
        found = element(user, name)
        assert found.props.get("data-testid") == name, f"{name} has no DOM test id"
    for name in set(TEST_IDS) - {"stop-btn"}:
        await user.should_see(marker=name)
    # Stop exists but only shows while an answer is being generated.
    assert element(user, "stop-btn").visible is False
    await user.should_see("No chats yet")
    picker = element(user, "agent-picker")
    assert picker.value == "general-assistant"
    assert picker.options == {
        "coding-assistant": "Coding Assistant",
        "general-assistant": "General Assistant",
        "planner": "Planner",
    }

    # The OpenAPI docs, through the simulation's ASGI transport (test_app_cli.py checks a live server).
    docs = await user.http_client.get("/docs")
    assert docs.status_code == 200 and "swagger-ui" in docs.text.lower()
    schema = await user.http_client.get("/openapi.json")
    assert schema.status_code == 200 and "/api/sessions" in schema.json()["paths"]

    # A chat that does not exist (or is not this user's) says so.
    await user.open("/chat/as_does_not_exist")
    await user.should_see("There is no such chat session.")
    await user.should_see("Start a new chat")
    await user.should_not_see(marker="msg-input")


@pytest.mark.parametrize("app_env", [SLOW_DEMO], indirect=True)
async def test_send_with_the_button_or_enter_streams_the_demo_answer(user: User) -> None:
    await user.open("/")
    await send(user, "hello world")
    await wait_until(lambda: user_texts(user) == ["hello world"], what="the user's message")
    assert element(user, "msg-input").value == ""
    # While it streams, Stop shows and Send is disabled.
    await wait_until(lambda: element(user, "stop-btn").visible, what="the Stop button")
    assert element(user, "send-btn").enabled is False
    await wait_for_answer(user)
    assert assistant_texts(user) == [echo_of("hello world", 2)]
    assert [b.props["name"] for b in bubbles(user, "assistant-message")] == ["General Assistant"]

    sid = current_session_id(user)
    assert sid is not None and sid.startswith("as_")
    saved = await saved_messages(sid)
    assert [(m.role, m.content) for m in saved] == [("user", "hello world"), ("assistant", echo_of("hello world", 2))]

    # Enter in the message box sends too.
    await send(user, "sent with enter", via="enter")
    await wait_for_answer(user, count=2)
    assert user_texts(user) == ["hello world", "sent with enter"]
    assert assistant_texts(user) == [echo_of("hello world", 2), echo_of("sent with enter", 3)]
    assert current_session_id(user) == sid and len(session_titles(user)) == 1


async def test_sessions_newest_first_and_switching_shows_each_ones_messages(user: User) -> None:
    await user.open("/")
    await send(user, "first chat")
    await wait_for_answer(user)
    first = current_session_id(user)
    assert session_titles(user) == [(first, "first chat")]

    page = user.client
    user.find(marker="new-session-btn").click()
    await navigated(user, page)
    assert user.back_history[-1] == "/?agent=general-assistant"
    assert user_texts(user) == [] and assistant_texts(user) == []
    assert current_session_id(user) is None

    await send(user, "second chat")
    await wait_for_answer(user)
    second = current_session_id(user)
    assert second not in {None, first}
    assert session_titles(user) == [(second, "second chat"), (first, "first chat")]

    for sid, text, words in [(first, "first chat", 2), (second, "second chat", 2)]:
        item = next(i for i in user.find(marker="session-item").elements if i.props["data-session-id"] == sid)
        page = user.client
        UserInteraction(user, {item}, None).click()
        await navigated(user, page)
        assert user.back_history[-1] == f"/chat/{sid}"
        assert current_session_id(user) == sid
        assert user_texts(user) == [text]
        assert assistant_texts(user) == [echo_of(text, words)]


async def test_the_agent_picker_starts_a_chat_with_the_coding_assistant(user: User) -> None:
    await user.open("/")
    user.find(marker="agent-picker").click()
    # The welcome lists the agents by name too: pick the option of the picker.
    UserInteraction(user, {element(user, "agent-picker")}, "Coding Assistant").click()
    assert element(user, "agent-picker").value == "coding-assistant"

    await send(user, "write code")
    await wait_for_answer(user)
    code = '```python\ndef answer() -> str:\n    return "write code"\n```\n'
    assert assistant_texts(user) == [echo_of("write code", 2) + "\n\n" + code]
    assert [b.props["name"] for b in bubbles(user, "assistant-message")] == ["Coding Assistant"]
    sid = current_session_id(user)
    view = await services().workspace.open(services().auth.local_user_id, sid)
    assert view.agent.slug == "coding-assistant"


@pytest.mark.parametrize("app_env", [SLOW_DEMO], indirect=True)
async def test_stop_cancels_a_long_reply_and_keeps_what_it_said(user: User) -> None:
    await user.open("/")
    await send(user, "/lorem 2000")
    await wait_until(lambda: any(len(t.split()) >= 5 for t in assistant_texts(user)), what="the reply to start")
    # Send is disabled while it answers, but Enter still reaches the page: it must refuse politely.
    user.find(marker="msg-input").type("another question")
    user.find(marker="msg-input").trigger("keydown.enter.exact.prevent")
    await user.should_see("This chat is still answering; wait for it or press Stop.")
    assert user_texts(user) == ["/lorem 2000"]
    assert element(user, "msg-input").value == "another question"  # kept for later

    user.find(marker="stop-btn").click()
    await user.should_see("Stopped.", retries=50)
    await wait_for_answer(user)

    shown = assistant_texts(user)[0]
    assert 5 <= len(shown.split()) < 2000
    assert shown.startswith("lorem ipsum dolor sit amet")
    sid = current_session_id(user)
    saved = await saved_messages(sid)
    assert [(m.role, m.status) for m in saved] == [("user", "complete"), ("assistant", "canceled")]
    assert len(saved[1].content.split()) < 2000
    assert shown == saved[1].content  # the page shows exactly what was kept

    # Reopened, the chat shows the kept part as stopped, and nothing runs.
    await user.open(f"/chat/{sid}")
    await user.should_see("Stopped.")
    assert user_texts(user) == ["/lorem 2000"]
    assert assistant_texts(user) == [saved[1].content]
    assert element(user, "stop-btn").visible is False and element(user, "send-btn").enabled


@pytest.mark.parametrize("app_env", [SLOW_DEMO], indirect=True)
async def test_an_answer_cut_off_by_a_crash_shows_what_it_said_as_interrupted(user: User) -> None:
    from core.chat import sessions as sessions_store

    await user.open("/")
    agent = await services().workspace.default_agent()
    chat = await services().workspace.create(services().auth.local_user_id, agent.slug)
    async with services().db.session() as s:  # what the start after a kill -9 leaves (test_chat_engine.py)
        await sessions_store.add_messages(
            s,
            session_id=chat.id,
            messages=[
                {"role": "user", "content": "/lorem 3000"},
                {
                    "role": "assistant",
                    "content": "lorem ipsum dolor",
                    "status": "interrupted",
                    "error": sessions_store.INTERRUPTED_ERROR,
                },
            ],
        )
    await user.open(f"/chat/{chat.id}")
    await user.should_see("Interrupted by a server restart.")
    assert assistant_texts(user) == ["lorem ipsum dolor"]
    assert element(user, "stop-btn").visible is False and element(user, "send-btn").enabled


@pytest.mark.parametrize("app_env", [SLOW_DEMO], indirect=True)  # without a delay the answer may end first
async def test_a_page_opened_during_an_answer_replays_it_and_follows_it_live(user: User) -> None:
    await user.open("/")
    await send(user, "/lorem 200")
    await wait_until(lambda: any(len(t.split()) >= 10 for t in assistant_texts(user)), what="the reply to start")
    sid = current_session_id(user)
    assert services().chat.is_running(sid)

    await user.open(f"/chat/{sid}")  # a reload, or a second tab
    # The page answers as soon as its ui.timer waits for the socket, before build() has reattached
    # to the turn; the reattachment follows over the socket (as it would in a browser).
    await wait_until(
        lambda: assistant_texts(user) or not services().chat.is_running(sid),
        what="the reopened page to replay the turn",
    )
    partial = None
    if services().chat.is_running(sid):
        assert element(user, "stop-btn").visible and element(user, "send-btn").enabled is False
        partial = assistant_texts(user)
    await wait_for_answer(user)
    saved = await saved_messages(sid)
    assert len(saved[1].content.split()) == 200
    assert user_texts(user) == ["/lorem 200"]
    assert assistant_texts(user) == [saved[1].content]  # nothing lost, nothing repeated
    if partial is not None:
        assert len(partial) == 1 and saved[1].content.startswith(partial[0])


async def test_picking_another_agent_in_a_chat_with_messages_asks_then_starts_a_new_chat(user: User) -> None:
    await user.open("/")
    await send(user, "hello")
    await wait_for_answer(user)
    sid = current_session_id(user)

    page = user.client
    element(user, "agent-picker").value = "coding-assistant"
    # It asks first; staying keeps the chat and its agent.
    await user.should_see(marker="agent-change-confirm")
    user.find(marker="agent-change-cancel").click()
    await wait_until(lambda: element(user, "agent-picker").value == "general-assistant", what="the picker reset")
    assert user.client is page
    element(user, "agent-picker").value = "coding-assistant"
    await user.should_see(marker="agent-change-confirm")
    user.find(marker="agent-change-confirm").click()
    await navigated(user, page)
    assert user.back_history[-1] == "/?agent=coding-assistant"
    assert element(user, "agent-picker").value == "coding-assistant"
    assert user_texts(user) == []
    view = await services().workspace.open(services().auth.local_user_id, sid)
    assert view.agent.slug == "general-assistant"  # the old chat keeps its agent


@pytest.mark.parametrize("app_env", [{"env": {"MAX_MESSAGE_CHARS": "20"}}], indirect=True)
async def test_an_empty_or_too_long_message_shows_an_error(user: User) -> None:
    await user.open("/")
    assert element(user, "msg-input").props["maxlength"] == "20"  # the browser stops typing there
    user.find(marker="msg-input").type("x" * 21)  # the server checks too
    user.find(marker="send-btn").click()
    await user.should_see("The message is 21 characters long; the limit is 20.")
    for blank in ["", "   \n  "]:
        user.notify.messages.clear()
        user.find(marker="msg-input").clear().type(blank)
        user.find(marker="send-btn").click()
        await user.should_see("The message is empty; type something first.")
    user.find(marker="msg-input").clear()
    user.find(marker="msg-input").trigger("keydown.enter.exact.prevent")
    await user.should_see("The message is empty; type something first.")
    assert user_texts(user) == []
    assert session_titles(user) == []  # no chat was created for it


# -- multi-user mode ------------------------------------------------------------------------


async def log_in(user: User, username: str, password: str, path: str = "/") -> None:
    await user.open(path)  # redirected to the login page
    page = user.client
    user.find(marker="login-username").type(username)
    user.find(marker="login-password").type(password)
    user.find(marker="login-btn").click()
    await navigated(user, page)


@pytest.mark.parametrize("app_env", [MULTI_USER], indirect=True)
async def test_multi_user_mode_asks_for_a_login_but_not_for_the_docs(user: User) -> None:
    assert services().auth.multi_user
    response = await user.http_client.get("/", follow_redirects=False)
    assert response.status_code in {302, 303, 307}
    assert response.headers["location"] == "/login?redirect_to=%2F"
    await user.open("/")  # follows the redirect
    await user.should_see(marker="login-username")
    await user.should_see(marker="login-password")
    await user.should_not_see(marker="msg-input")

    # The OpenAPI docs are public (ui/auth.py PUBLIC_PREFIXES) and list the REST API.
    docs = await user.http_client.get("/docs", follow_redirects=False)
    assert docs.status_code == 200 and "swagger-ui" in docs.text.lower()
    schema = await user.http_client.get("/openapi.json", follow_redirects=False)
    assert schema.status_code == 200 and "/api/sessions" in schema.json()["paths"]


@pytest.mark.parametrize("app_env", [{**MULTI_USER, "env": {"LOGIN_MAX_FAILURES": "2"}}], indirect=True)
async def test_the_login_page_stops_checking_after_too_many_wrong_passwords(user: User) -> None:
    await user.open("/login")
    for _ in range(2):
        user.notify.messages.clear()
        user.find(marker="login-username").clear().type(ALICE[0])
        user.find(marker="login-password").clear().type("not-her-password")
        user.find(marker="login-btn").click()
        await user.should_see("Wrong username or password.", retries=30)
    user.notify.messages.clear()
    user.find(marker="login-password").clear().type(ALICE[1])  # even the right one, for a while
    user.find(marker="login-btn").click()
    await user.should_see("Too many failed logins; try again in", retries=30)
    await user.should_see(marker="login-username")


@pytest.mark.parametrize("app_env", [MULTI_USER], indirect=True)
async def test_a_wrong_password_or_unknown_user_is_refused_and_the_right_password_logs_in(user: User) -> None:
    await user.open("/login")
    login_page = user.client
    user.find(marker="login-username").type(ALICE[0])
    user.find(marker="login-password").type("not-her-password")
    user.find(marker="login-btn").click()
    await user.should_see("Wrong username or password.", retries=30)
    assert user.client is login_page

    # An unknown name gets the same words (names cannot be probed); Enter in the password field submits.
    user.notify.messages.clear()
    user.find(marker="login-username").clear().type("mallory")
    user.find(marker="login-password").clear().type(ALICE[1])
    user.find(marker="login-password").trigger("keydown.enter")
    await user.should_see("Wrong username or password.", retries=30)
    assert user.client is login_page

    user.find(marker="login-username").clear().type(ALICE[0])
    user.find(marker="login-password").clear().type(ALICE[1])
    user.find(marker="login-btn").click()
    await navigated(user, login_page)
    await user.should_see(marker="msg-input")
    assert user.back_history[-1] == "/"
    page = user.client
    await user.open("/")  # the login sticks (the browser's session cookie)
    assert user.client is not page
    await user.should_see(marker="msg-input")
    await user.should_see(marker="session-list")


@pytest.mark.parametrize("app_env", [MULTI_USER], indirect=True)
async def test_the_login_returns_to_the_page_asked_for_and_logout_ends_it(user: User) -> None:
    await log_in(user, *ALICE)
    await send(user, "alice's chat")
    await wait_for_answer(user)
    sid = current_session_id(user)
    await user.open("/logout")
    await user.should_see(marker="login-btn")
    await user.should_not_see(marker="msg-input")

    await log_in(user, *ALICE, path=f"/chat/{sid}")
    assert user.back_history[-1] == f"/chat/{sid}"
    assert user_texts(user) == ["alice's chat"]

    # Another browser, with its own cookies. (Finish with one simulated user before using the
    # other: NiceGUI routes `ui.navigate` to the user touched last.)
    bob = new_browser()
    async with bob.http_client:
        await log_in(bob, *BOB)
        assert session_titles(bob) == []
        await bob.open(f"/chat/{sid}")
        await bob.should_see("There is no such chat session.")
        await bob.should_not_see(content="alice's chat")


@pytest.mark.parametrize("app_env", [MULTI_USER], indirect=True)
async def test_another_users_delegated_task_page_looks_exactly_like_an_unknown_one(user: User) -> None:
    await log_in(user, *ALICE)
    await send(user, "@coding-assistant write alice's secret function")
    await wait_for_answer(user)
    async with services().db.session() as s:
        alice_id = next(u.id for u in await accounts.list_users(s) if u.username == ALICE[0])
    tasks = await services().delegation.list_tasks(alice_id)
    assert len(tasks) == 1
    await user.open(f"/audit/{tasks[0].id}")
    await user.should_see(content="alice's secret function")

    bob = new_browser()
    async with bob.http_client:
        await log_in(bob, *BOB)
        seen: list[list[str]] = []
        for task_id in (tasks[0].id, "no-such-task"):
            await bob.open(f"/audit/{task_id}")
            await bob.should_see("There is no such task among your conversations.")
            await bob.should_not_see(content="alice's secret function")
            seen.append(sorted(label.text for label in bob.find(ui.label).elements))
        assert seen[0] == seen[1]  # the page of another user's task and of no task at all are one page
        await bob.open("/audit")
        await bob.should_see(content="No delegations yet")


@pytest.mark.parametrize("app_env", [{**MULTI_USER, "env": {"MAX_RUNNING_TURNS_PER_USER": "1"}}], indirect=True)
async def test_a_send_over_the_users_running_turns_limit_says_why_and_keeps_the_text(user: User) -> None:
    await log_in(user, *ALICE)
    await send(user, "/hang")
    await wait_until(
        lambda: current_session_id(user) is not None and services().chat.is_running(current_session_id(user)),
        what="the first answer to run",
    )
    running = current_session_id(user)
    try:
        await user.open("/")  # a new chat: its first message is one answer too many
        await send(user, "one more question")
        await user.should_see(
            "You already have 1 answer being written, the most one account may have at once.", retries=30
        )
        assert element(user, "msg-input").value == "one more question"  # kept for later
    finally:
        await services().chat.cancel(running)


@pytest.mark.parametrize("app_env", [MULTI_USER], indirect=True)
async def test_a_send_while_redis_is_out_of_reach_says_so_and_keeps_the_text(
    user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41: a cluster's send fails before it saves anything when Redis is out of reach; the page says so."""
    await log_in(user, *ALICE)

    async def unreachable(**_: Any) -> None:
        raise RedisConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(services().chat, "start_turn", unreachable)
    await send(user, "a question for later")
    await user.should_see(
        "The server cannot reach Redis, which it needs for this request; try again in a few seconds.", retries=30
    )
    assert element(user, "msg-input").value == "a question for later"  # kept to send again


def lands_on_this_site(target: str) -> bool:
    """Whether a browser that opens `target` (relative to this page) stays on this site.

    Browsers parse URLs by the WHATWG URL standard: tabs and newlines are removed and, for http(s),
    a backslash is a path separator like "/". So "/\\evil.example" is the protocol-relative
    "//evil.example" (Node's `new URL("/\\evil.example", "http://127.0.0.1:3100/")` gives
    "http://evil.example/"). NiceGUI's `ui.navigate.to(path)` ends in `window.open(path, "_self")`.
    """
    normalized = re.sub(r"[\t\n\r]", "", target.strip(" \x00\x1f")).replace("\\", "/")
    parts = urlsplit(normalized)
    return not parts.scheme and not parts.netloc and normalized.startswith("/")


def new_browser() -> User:
    """Another simulated browser on the same app, with its own cookies."""
    return User(httpx.AsyncClient(transport=httpx.ASGITransport(nicegui_core.app), base_url="http://test"))


async def navigation_after_login(browser: User, monkeypatch: pytest.MonkeyPatch, redirect_to: str) -> list[str]:
    """Log in as alice from `/login?redirect_to=...`; returns where the page then sends the browser."""
    targets: list[str] = []
    monkeypatch.setattr(browser.navigate, "to", lambda target, new_tab=False: targets.append(target))
    await browser.open(f"/login?redirect_to={quote(redirect_to, safe='')}")
    browser.find(marker="login-username").type(ALICE[0])
    browser.find(marker="login-password").type(ALICE[1])
    browser.find(marker="login-btn").click()
    await wait_until(lambda: bool(targets), what="the navigation after the login")
    return targets


@pytest.mark.parametrize("app_env", [MULTI_USER], indirect=True)
async def test_after_login_the_browser_goes_where_it_asked_but_stays_on_this_site(
    user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    for redirect_to, expected in [
        ("/chat/as_x?y=1", "/chat/as_x?y=1"),
        ("//evil.example/x", "/"),
        ("https://evil.example/x", "/"),
    ]:
        browser = new_browser()
        async with browser.http_client:
            assert await navigation_after_login(browser, monkeypatch, redirect_to) == [expected], redirect_to

    # Already logged in, /login redirects over HTTP; Starlette's RedirectResponse percent-encodes
    # '\\' and TAB, so even the payloads of the next test stay on this site there.
    browser = new_browser()
    async with browser.http_client:
        await log_in(browser, *ALICE)
        for redirect_to in ["/\\evil.example/x", "/\t/evil.example/x", "//evil.example/x", "https://evil.example/"]:
            response = await browser.http_client.get(
                f"/login?redirect_to={quote(redirect_to, safe='')}", follow_redirects=False
            )
            assert response.status_code in {302, 303, 307}
            assert lands_on_this_site(response.headers["location"]), response.headers["location"]


@pytest.mark.parametrize("app_env", [MULTI_USER], indirect=True)
async def test_after_login_a_backslash_or_tab_target_does_not_leave_this_site(
    user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent_to = {}
    for redirect_to in ["/\\evil.example/x", "/\t/evil.example/x"]:
        browser = new_browser()
        async with browser.http_client:
            sent_to[redirect_to] = await navigation_after_login(browser, monkeypatch, redirect_to)
    off_site = {asked: targets for asked, targets in sent_to.items() if not all(map(lands_on_this_site, targets))}
    assert not off_site, f"the login sends the browser off this site: {off_site}"


async def test_notes_and_turns_started_elsewhere_appear_on_an_open_page(user: User) -> None:
    """Background-task notes show live as quiet lines; an announcement (a turn this page did not start) streams in."""
    await user.open("/?agent=general-assistant")
    await send(user, "hello")
    await wait_for_answer(user)
    session_id = current_session_id(user)
    chat = services().chat
    await chat.save_notes(session_id, [{"content": "[Travel] 6 trains found", "inject_mode": "delay"}])
    await wait_until(lambda: len(notes(user)) == 1, what="the progress note")
    assert notes(user) == [("delay", "[Travel] 6 trains found")] and len(bubbles(user, "assistant-message")) == 1
    await chat.save_notes(session_id, [{"content": "[Travel] G1234 booked", "inject_mode": "auto"}])
    await chat.start_announcement(session_id)
    await wait_for_answer(user, count=2)
    assert notes(user)[-1] == ("auto", "[Travel] G1234 booked")
    assert assistant_texts(user)[-1] == "Result from **Travel**:\n\n> G1234 booked"
    # A message sent from elsewhere (another tab, the REST API) shows too, with its answer.
    await chat.start_turn(session_id=session_id, user_id=services().auth.local_user_id, text="from elsewhere")
    await wait_for_answer(user, count=3)
    assert user_texts(user)[-1] == "from elsewhere" and assistant_texts(user)[-1] == echo_of("from elsewhere", 2)


def notes(user: User) -> list[tuple[str, str]]:
    with user:
        rows = [e for e in ElementFilter(marker="inject-note", local_scope=False)]
    return [(r.props["data-mode"], next(e.text for e in r.descendants() if isinstance(e, ui.label))) for r in rows]
