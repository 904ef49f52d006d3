"""Issue 40, item 10b and 10c: answering the last message again, and editing it and sending it again.

In the engine (`ChatEngine.regenerate`, `ChatEngine.resend`, `core/chat/rewind.py`) and over HTTP
(`POST /api/sessions/{id}/regenerate`, `POST /api/sessions/{id}/messages/{messageId}/resend`), with
the offline demo model, whose answers are known in advance.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.chat.engine import (
    InvalidMessageError,
    MessageNotFoundError,
    NothingToAnswerAgainError,
    NotLastMessageError,
    SessionNotFoundError,
    TurnInProgressError,
)
from core.routes import api_router
from core.services import Services
from core.web.errors import install_error_handlers
from tests.conftest import make_settings
from tests.test_api import stream_events
from tests.test_chat_engine import new_chat, run_turn, saved
from tests.utils.accounts import ALICE, BOB, seed_accounts
from tests.utils.live_server import live_server, services_app


async def follow(services: Services, turn) -> list:
    events = [e async for e in services.hub.subscribe(turn.stream_key, after=turn.after_event_id)]
    await services.chat.wait(turn.session_id, timeout=10)
    return events


def streamed_text(events: list) -> str:
    return "".join(e.data["delta"] for e in events if e.type == "text-delta")


# -- the engine -----------------------------------------------------------------------------------


async def test_regenerate_removes_the_last_answer_and_streams_and_saves_a_new_one(services: Services) -> None:
    user_id = services.auth.local_user_id
    chat = await new_chat(services)
    await run_turn(services, chat, "first question")
    await run_turn(services, chat, "second question")
    before = await saved(services, chat)
    assert [m.role for m in before] == ["user", "assistant", "user", "assistant"]

    turn = await services.chat.regenerate(session_id=chat, user_id=user_id)
    assert turn.user_message_id == before[2].id  # it answers the last message again
    events = await follow(services, turn)
    assert [events[0].type, events[-1].type] == ["start", "finish"]

    after = await saved(services, chat)
    assert [m.id for m in after[:3]] == [m.id for m in before[:3]]  # the question and the first exchange stay
    assert [m.role for m in after] == ["user", "assistant", "user", "assistant"]
    new_answer = after[3]
    # (SQLite may give the new row the old one's id: the rows are told apart by when they were written.)
    assert new_answer.created_at > before[3].created_at and new_answer.status == "complete"
    assert new_answer.content == streamed_text(events) and "second question" in new_answer.content
    assert new_answer.sort_order > after[2].sort_order


async def test_regenerate_of_a_delegating_turn_removes_its_steps_and_keeps_the_task_records(
    services: Services,
) -> None:
    user_id = services.auth.local_user_id
    chat = await new_chat(services, "general-assistant")
    await run_turn(services, chat, "@coding-assistant write a haiku")
    first = await saved(services, chat)
    assert [m.role for m in first] == ["user", "assistant", "assistant"]
    assert first[1].tool_calls[0]["name"] == "agent_invoke" and first[1].tool_results
    [old_task] = await services.delegation.tasks_of_session(user_id, chat)

    events = await follow(services, await services.chat.regenerate(session_id=chat, user_id=user_id))
    assert "a2a-task-started" in [e.type for e in events]
    after = await saved(services, chat)
    assert [m.role for m in after] == ["user", "assistant", "assistant"]
    assert after[0].id == first[0].id
    assert min(m.created_at for m in after[1:]) > max(m.created_at for m in first)  # the old steps are gone
    tasks = await services.delegation.tasks_of_session(user_id, chat)
    assert len(tasks) == 2 and old_task.id in {t.id for t in tasks}  # the audit trail keeps the first task
    assert {t.state for t in tasks} == {"completed"}


async def test_regenerate_keeps_the_notes_of_background_tasks_and_resend_keeps_their_positions(
    services: Services,
) -> None:
    user_id = services.auth.local_user_id
    chat = await new_chat(services)
    await run_turn(services, chat, "start something")
    await services.chat.save_notes(chat, [{"content": "progress 1", "inject_mode": "delay"}])
    await follow(services, await services.chat.regenerate(session_id=chat, user_id=user_id))
    assert [(m.role, m.content) for m in await saved(services, chat)][:3] == [
        ("user", "start something"),
        ("system", "progress 1"),
        ("assistant", (await saved(services, chat))[2].content),
    ]
    result = {"content": "[Travel] done", "inject_mode": "auto", "a2a_task_id": "t1", "inject_position": 2**31 - 1}
    await services.chat.save_notes(chat, [result])
    question = (await saved(services, chat))[0]
    turn = await services.chat.resend(session_id=chat, user_id=user_id, message_id=question.id, text="start again")
    await follow(services, turn)
    after = await saved(services, chat)
    assert [(m.id, m.role, m.content) for m in after[:1]] == [(question.id, "user", "start again")]
    # The note without a position goes with the rest; the task's result stays: it is the inbox's position.
    assert [(m.role, m.content) for m in after[1:2]] == [("system", "[Travel] done")]
    assert [m.role for m in after] == ["user", "system", "assistant"] and "start again" in after[2].content
    assert await services.chat.save_notes(chat, [result]) == []  # so the result is not saved again


async def test_resend_edits_only_the_last_message_of_the_user_with_the_checks_of_a_send(services: Services) -> None:
    user_id = services.auth.local_user_id
    chat = await new_chat(services)
    await run_turn(services, chat, "one")
    await run_turn(services, chat, "two")
    one, answer, two, _ = before = await saved(services, chat)

    with pytest.raises(NotLastMessageError, match="Only your last message"):
        await services.chat.resend(session_id=chat, user_id=user_id, message_id=one.id, text="uno")
    for not_mine in (answer.id, 999_999):
        with pytest.raises(MessageNotFoundError):
            await services.chat.resend(session_id=chat, user_id=user_id, message_id=not_mine, text="x")
    for bad in ("", "   ", "x" * (services.settings.max_message_chars + 1)):
        with pytest.raises(InvalidMessageError):
            await services.chat.resend(session_id=chat, user_id=user_id, message_id=two.id, text=bad)
    assert [(m.id, m.content) for m in await saved(services, chat)] == [(m.id, m.content) for m in before]
    assert not services.chat.is_running(chat)  # a refusal gives the turn back

    turn = await services.chat.resend(session_id=chat, user_id=user_id, message_id=two.id, text="  dos  ")
    assert turn.user_message_id == two.id
    events = await follow(services, turn)
    after = await saved(services, chat)
    assert [(m.id, m.content) for m in after[:3]] == [(one.id, "one"), (answer.id, answer.content), (two.id, "dos")]
    assert after[3].role == "assistant" and after[3].content == streamed_text(events) and "dos" in after[3].content


async def test_a_chat_without_a_message_has_nothing_to_answer_again(services: Services) -> None:
    chat = await new_chat(services)
    with pytest.raises(NothingToAnswerAgainError):
        await services.chat.regenerate(session_id=chat, user_id=services.auth.local_user_id)
    assert await saved(services, chat) == [] and not services.chat.is_running(chat)


async def test_someone_elses_chat_is_not_found(services: Services) -> None:
    chat = await new_chat(services)
    await run_turn(services, chat, "mine")
    [question, _] = await saved(services, chat)
    other = services.auth.local_user_id + 1000
    with pytest.raises(SessionNotFoundError):
        await services.chat.regenerate(session_id=chat, user_id=other)
    with pytest.raises(SessionNotFoundError):
        await services.chat.resend(session_id=chat, user_id=other, message_id=question.id, text="theirs")
    assert [m.content for m in await saved(services, chat)][0] == "mine"


async def test_both_are_refused_while_a_turn_runs_and_change_nothing(tmp_path, database_url: str) -> None:
    services = Services.build(make_settings(tmp_path, database_url=database_url, demo_model_delay_ms=20))
    services.prepare()
    try:
        user_id = services.auth.local_user_id
        chat = await new_chat(services)
        await services.chat.start_turn(session_id=chat, user_id=user_id, text="/lorem 500")
        [question] = await saved(services, chat)
        with pytest.raises(TurnInProgressError, match="still answering"):
            await services.chat.regenerate(session_id=chat, user_id=user_id)
        with pytest.raises(TurnInProgressError, match="still answering"):
            await services.chat.resend(session_id=chat, user_id=user_id, message_id=question.id, text="other")
        assert services.chat.is_running(chat)
        await services.chat.cancel(chat)
        assert [(m.role, m.content) for m in await saved(services, chat)][0] == ("user", "/lorem 500")
        assert [m.role for m in await saved(services, chat)] == ["user", "assistant"]
    finally:
        await services.stop()


# -- over HTTP -----------------------------------------------------------------------------------


def _server(tmp_path: Path, database_url: str, **settings) -> Iterator[tuple[str, Services]]:
    """The REST API as app.py serves it (errors with their `code`) on a live server."""
    services = Services.build(make_settings(tmp_path, database_url=database_url, **settings))
    services.prepare()
    app = services_app(services, api_router())
    install_error_handlers(app)
    with live_server(app) as url:
        yield url, services


@pytest.fixture
def api(tmp_path: Path, database_url: str) -> Iterator[tuple[str, Services]]:
    """Single-user mode, 5 ms per token, messages of at most 500 characters."""
    yield from _server(tmp_path, database_url, demo_model_delay_ms=5, max_message_chars=500)


@pytest.fixture
def accounts_api(tmp_path: Path, database_url: str) -> Iterator[tuple[str, Services]]:
    """Alice and bob; 20 ms per token, so a long answer is still running."""
    seed_accounts(tmp_path, database_url)
    yield from _server(tmp_path, database_url, demo_model_delay_ms=20)


async def test_regenerate_and_resend_over_http(api) -> None:
    url, _ = api
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        sid = (await client.post("/api/sessions", json={})).json()["id"]
        posted = (await client.post(f"/api/sessions/{sid}/messages", json={"content": "hello"})).json()
        await stream_events(client, posted["streamUrl"])
        first = (await client.get(f"/api/sessions/{sid}/messages")).json()

        again = await client.post(f"/api/sessions/{sid}/regenerate")
        assert again.status_code == 202, again.text
        assert again.json()["userMessageId"] == posted["userMessageId"]
        _, events = await stream_events(client, again.json()["streamUrl"])
        assert events[0]["data"]["type"] == "start" and events[-1]["data"]["type"] == "finish"
        text = "".join(e["data"]["delta"] for e in events if e["data"]["type"] == "text-delta")
        messages = (await client.get(f"/api/sessions/{sid}/messages")).json()
        assert [m["role"] for m in messages] == ["user", "assistant"]
        assert messages[1]["createdAt"] > first[1]["createdAt"] and messages[1]["content"] == text

        resend = f"/api/sessions/{sid}/messages/{posted['userMessageId']}/resend"
        edited = await client.post(resend, json={"content": "hello again"})
        assert edited.status_code == 202, edited.text
        _, events = await stream_events(client, edited.json()["streamUrl"])
        messages = (await client.get(f"/api/sessions/{sid}/messages")).json()
        assert [(m["role"], m["content"]) for m in messages][0] == ("user", "hello again")
        assert "hello again" in messages[1]["content"] and len(messages) == 2

        # Only the last message of the user, with the checks of a send.
        second = (await client.post(f"/api/sessions/{sid}/messages", json={"content": "next"})).json()
        await stream_events(client, second["streamUrl"])
        earlier = await client.post(resend, json={"content": "x"})
        assert (earlier.status_code, earlier.json().get("code")) == (409, "not_last_message"), earlier.text
        assert "Only your last message" in earlier.json()["detail"]
        last = f"/api/sessions/{sid}/messages/{second['userMessageId']}/resend"
        assert (await client.post(last, json={"content": ""})).status_code == 422
        too_long = await client.post(last, json={"content": "x" * 501})  # MAX_MESSAGE_CHARS=500 here
        assert (too_long.status_code, too_long.json()["code"]) == (422, "invalid_message")
        assert (await client.post(last, json={"content": "x", "extra": 1})).status_code == 422
        answer_id = messages[1]["id"]
        not_a_question = await client.post(f"/api/sessions/{sid}/messages/{answer_id}/resend", json={"content": "x"})
        assert (not_a_question.status_code, not_a_question.json()["code"]) == (404, "message_not_found")
        assert (await client.post(f"/api/sessions/{sid}/messages/0/resend", json={"content": "x"})).status_code == 422

        empty = (await client.post("/api/sessions", json={})).json()["id"]
        nothing = await client.post(f"/api/sessions/{empty}/regenerate")
        assert (nothing.status_code, nothing.json()["code"]) == (409, "nothing_to_answer_again")


async def test_over_http_both_are_409_while_the_chat_answers_and_404_in_someone_elses(accounts_api) -> None:
    url, _ = accounts_api
    async with (
        httpx.AsyncClient(base_url=url, auth=ALICE, timeout=10) as alice,
        httpx.AsyncClient(base_url=url, auth=BOB, timeout=10) as bob,
    ):
        sid = (await alice.post("/api/sessions", json={})).json()["id"]
        posted = (await alice.post(f"/api/sessions/{sid}/messages", json={"content": "/lorem 3000"})).json()
        resend = "/api/sessions/{}/messages/" + str(posted["userMessageId"]) + "/resend"
        for path, body in [("/api/sessions/{}/regenerate", None), (resend, {"content": "edited"})]:
            busy = await alice.post(path.format(sid), json=body)
            assert (busy.status_code, busy.json()["code"]) == (409, "turn_in_progress"), path
            assert "still answering" in busy.json()["detail"]
            theirs = await bob.post(path.format(sid), json=body)
            nothing = await bob.post(path.format("as_000000000000000000000000"), json=body)
            assert theirs.status_code == 404 and (theirs.status_code, theirs.json()) == (
                nothing.status_code,
                nothing.json(),
            )
        assert [m["content"] for m in (await alice.get(f"/api/sessions/{sid}/messages")).json()] == ["/lorem 3000"]
        await alice.post(f"/api/sessions/{sid}/stop")
