"""Questions back (issue 36): delegated tasks that ask, over real HTTP on 127.0.0.1.

The remote side is `tests/utils/a2a_asking_server.py`, a plain a2a-sdk 1.3 agent in its own
process that asks `Which city do you mean? (task T, context C)` and, on the answer sent into
the same task, completes with `You answered: X (task T, context C)`. Local agents ask through
the `ask_user` tool (the demo model's `/ask QUESTION`).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.types import GetTaskRequest, Message, Part, Role, SendMessageRequest, TaskState

from core.chat.demo_model import plan_reply
from tests.test_a2a_client import register
from tests.test_delegation_api import two_users_api  # noqa: F401 (a fixture)
from tests.utils.a2a_agents import LOCAL_AGENTS, asking_server
from tests.utils.a2a_live import LiveApp, live_a2a_app, sdk_client, user_message
from tests.utils.accounts import ALICE, BOB

IDS = re.compile(r"\(task (\S+), context (\S+)\)")


@pytest.fixture(scope="module")
def asker() -> Iterator[str]:
    with asking_server() as url:
        yield url


@pytest.fixture(scope="module")
def auth_asker() -> Iterator[str]:
    with asking_server(auth=True) as url:
        yield url


@pytest.fixture
def app(tmp_path: Path, database_url: str) -> Iterator[LiveApp]:
    """The app on a live port, SQLite and PostgreSQL (its API's errors with their `code`, as app.py serves them)."""
    with live_a2a_app(
        tmp_path, error_codes=True, database_url=database_url, demo_model_delay_ms=0, outbound_allow_hosts=LOCAL_AGENTS
    ) as live:
        yield live


def start_chat(app: LiveApp, text: str, agent: str = "general-assistant") -> str:
    """Send one message in a new chat without waiting for the answer; returns the session id."""
    session = httpx.post(f"{app.url}/api/sessions", json={"agentId": agent}).json()["id"]
    assert httpx.post(f"{app.url}/api/sessions/{session}/messages", json={"content": text}).status_code == 202
    return session


def wait_task(app: LiveApp, session: str, states: set[str], timeout: float = 20) -> dict[str, Any]:
    """The session's (one) task once it is in one of `states`, read with GET /api/tasks/{id}."""
    deadline = time.monotonic() + timeout
    while True:
        tasks = [t for t in httpx.get(f"{app.url}/api/tasks").json() if t["callerSessionId"] == session]
        if tasks:
            detail = httpx.get(f"{app.url}/api/tasks/{tasks[0]['id']}").json()
            if detail["state"] in states:
                return detail
        assert time.monotonic() < deadline, f"no task in {states}: {tasks}"
        time.sleep(0.05)


def wait_turn(app: LiveApp, session: str, timeout: float = 20) -> str:
    """Wait for the chat's turn to end; its last message."""
    deadline = time.monotonic() + timeout
    while httpx.get(f"{app.url}/api/sessions/{session}").json()["running"]:
        assert time.monotonic() < deadline, "the turn did not end"
        time.sleep(0.05)
    content: str = httpx.get(f"{app.url}/api/sessions/{session}/messages").json()[-1]["content"]
    return content


def first_state(app: LiveApp, task_id: str, state: str) -> dict[str, Any]:
    """The task stream's first `state` event to `state` (the stream goes on: read until it comes)."""
    url = f"{app.url}/api/agents/a2a/stream"
    with httpx.stream("GET", url, params={"taskId": task_id}, timeout=10) as response:
        for line in response.iter_lines():
            if line.startswith("data:"):
                data: dict[str, Any] = json.loads(line.removeprefix("data:"))
                if data.get("to") == state:
                    return data
    raise AssertionError(f"no state {state}")


def answer(app: LiveApp, task_id: str, content: str) -> httpx.Response:
    return httpx.post(f"{app.url}/api/tasks/{task_id}/messages", json={"content": content}, timeout=10)


async def test_a_remote_agent_asks_back_and_the_rest_answer_completes_the_same_task(app: LiveApp, asker: str) -> None:
    assert register(app, asker, "asker").status_code == 201
    session = start_chat(app, "@asker what is the weather")
    task = wait_task(app, session, {"input-required"})
    asked = IDS.search(task["question"] or "")
    assert task["question"].startswith("Which city do you mean?") and asked, task
    assert [t["state"] for t in httpx.get(f"{app.url}/api/tasks").json()] == ["input-required"]
    # The caller's turn waits meanwhile.
    assert httpx.get(f"{app.url}/api/sessions/{session}").json()["running"] is True
    # The panel's stream says the state, with the question.
    state = first_state(app, task["id"], "input-required")
    assert (state["from"], state["message"]) == ("working", task["question"])

    response = answer(app, task["id"], "Paris")
    assert response.status_code == 202, response.text
    assert response.json()["state"] == "working"
    last = wait_turn(app, session)
    done = httpx.get(f"{app.url}/api/tasks/{task['id']}").json()
    assert (done["state"], done["question"]) == ("completed", None)
    answered = IDS.search(done["messages"][-1]["content"])
    assert done["messages"][-1]["content"].startswith("You answered: Paris")
    # The remote agent got the answer in the task and context that asked.
    assert answered and answered.groups() == asked.groups()
    assert [(m["role"], m["content"].split(" (task")[0]) for m in done["messages"]] == [
        ("user", "what is the weather"),
        ("assistant", "Which city do you mean?"),
        ("user", "Paris"),
        ("assistant", "You answered: Paris"),
    ]
    assert "You answered: Paris" in last
    # Answered, it asks nothing: 409 with a code.
    again = answer(app, task["id"], "Lyon")
    assert (again.status_code, again.json()["code"]) == (409, "task_not_waiting")


async def test_answers_to_unknown_tasks_and_bad_bodies_are_refused(app: LiveApp) -> None:
    unknown = answer(app, "no-such-task", "Paris")
    assert (unknown.status_code, unknown.json()["code"]) == (404, "task_not_found")
    assert answer(app, "no-such-task", "").status_code == 422
    too_long = httpx.post(f"{app.url}/api/tasks/x/messages", json={"content": "x" * 20_001})
    assert too_long.status_code == 422


async def test_auth_required_is_shown_with_the_agents_text(app: LiveApp, auth_asker: str) -> None:
    assert register(app, auth_asker, "signer").status_code == 201
    session = start_chat(app, "@signer read my mail")
    task = wait_task(app, session, {"auth-required"})
    assert task["question"].startswith("Sign in at https://example.test/login first.")
    assert answer(app, task["id"], "done").status_code == 202
    assert "You answered: done" in wait_turn(app, session)


async def test_stop_while_waiting_cancels_the_task(app: LiveApp, asker: str) -> None:
    assert register(app, asker, "asker").status_code == 201
    session = start_chat(app, "@asker what is the weather")
    task = wait_task(app, session, {"input-required"})
    assert httpx.post(f"{app.url}/api/sessions/{session}/stop").status_code in {200, 202, 204}
    wait_turn(app, session)
    ended = wait_task(app, session, {"canceled"})
    assert ended["id"] == task["id"] and ended["question"] is None
    gone = answer(app, task["id"], "Paris")
    assert (gone.status_code, gone.json()["code"]) == (409, "task_not_waiting")


async def test_the_callees_timeout_ends_a_waiting_task(app: LiveApp, asker: str) -> None:
    assert register(app, asker, "asker").status_code == 201
    session = start_chat(app, "/timeout 1500 @asker what is the weather")
    wait_task(app, session, {"input-required"})
    ended = wait_task(app, session, {"failed"})
    assert "did not finish within 1.5 s" in ended["error"]
    assert "did not finish within 1.5 s" in wait_turn(app, session)


async def test_a_local_callee_asks_through_ask_user_and_goes_on_with_the_answer(app: LiveApp) -> None:
    session = start_chat(app, "@coding-assistant /ask Which language do you want?")
    task = wait_task(app, session, {"input-required"})
    assert task["question"] == "Which language do you want?"
    assert answer(app, task["id"], "Rust").status_code == 202
    last = wait_turn(app, session)
    assert "You answered: Rust" in last
    assert httpx.get(f"{app.url}/api/tasks/{task['id']}").json()["state"] == "completed"


async def test_a_served_agent_that_asks_answers_a2a_callers_input_required_then_goes_on(app: LiveApp) -> None:
    async with sdk_client(app.agent_url("general-assistant"), app.key) as (client, _card):
        events = [e async for e in client.send_message(user_message("/ask Which city do you mean?"))]
        last = events[-1].status_update
        assert last.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        assert last.status.message.parts[0].text == "Which city do you mean?"
        task_id, context_id = last.task_id, last.context_id
        waiting = await client.get_task(GetTaskRequest(id=task_id))
        assert waiting.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        assert waiting.status.message.parts[0].text == "Which city do you mean?"
        rest = httpx.get(f"{app.url}/api/tasks/{task_id}").json()
        assert (rest["state"], rest["question"]) == ("input-required", "Which city do you mean?")
        follow = Message(
            message_id="m-answer",
            role=Role.ROLE_USER,
            parts=[Part(text="Paris")],
            task_id=task_id,
            context_id=context_id,
        )
        events = [e async for e in client.send_message(SendMessageRequest(message=follow))]
    assert events[0].task.id == task_id
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert events[-1].status_update.task_id == task_id
    [result] = [e.artifact_update.artifact for e in events if e.HasField("artifact_update")]
    assert result.parts[0].text == "You answered: Paris"
    row = httpx.get(f"{app.url}/api/tasks/{task_id}").json()
    assert row["state"] == "completed"


async def test_a_blocking_send_returns_the_question_and_the_next_blocking_send_the_answer(app: LiveApp) -> None:
    headers = {"Authorization": f"Bearer {app.key}", "A2A-Version": "1.0"}
    url = app.agent_url("general-assistant")

    def send(message: dict[str, Any]) -> dict[str, Any]:
        body = {"jsonrpc": "2.0", "id": "1", "method": "SendMessage", "params": {"message": message}}
        reply: dict[str, Any] = httpx.post(url, json=body, headers=headers, timeout=20).json()
        return reply

    first = send({"messageId": "a1", "role": "ROLE_USER", "parts": [{"text": "/ask Which city?"}]})
    task = first["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", first
    assert task["status"]["message"]["parts"][0]["text"] == "Which city?"
    second = send(
        {
            "messageId": "a2",
            "role": "ROLE_USER",
            "parts": [{"text": "Paris"}],
            "taskId": task["id"],
            "contextId": task["contextId"],
        }
    )
    done = second["result"]["task"]
    assert (done["id"], done["status"]["state"]) == (task["id"], "TASK_STATE_COMPLETED"), second
    assert done["artifacts"][0]["parts"][0]["text"] == "You answered: Paris"


async def test_only_the_tasks_owner_answers_and_anothers_task_looks_unknown(two_users_api) -> None:
    url, _services = two_users_api
    async with (
        httpx.AsyncClient(base_url=url, auth=ALICE, timeout=10) as alice,
        httpx.AsyncClient(base_url=url, auth=BOB, timeout=10) as bob,
    ):
        session = (await alice.post("/api/sessions", json={"agentId": "general-assistant"})).json()["id"]
        sent = await alice.post(f"/api/sessions/{session}/messages", json={"content": "@coding-assistant /ask Which?"})
        assert sent.status_code == 202
        deadline = time.monotonic() + 20
        while not [t for t in (await alice.get("/api/tasks")).json() if t["state"] == "input-required"]:
            assert time.monotonic() < deadline, "the task did not ask"
            await asyncio.sleep(0.05)
        [task] = (await alice.get("/api/tasks")).json()
        assert task["question"] == "Which?"
        theirs = await bob.post(f"/api/tasks/{task['id']}/messages", json={"content": "mine now"})
        unknown = await bob.post("/api/tasks/0123456789abcdef/messages", json={"content": "mine now"})
        assert (theirs.status_code, theirs.json()) == (unknown.status_code, unknown.json())
        assert theirs.status_code == 404
        anonymous = await httpx.AsyncClient(base_url=url).post(
            f"/api/tasks/{task['id']}/messages", json={"content": "x"}
        )
        assert anonymous.status_code == 401
        # Still waiting: the owner's answer goes on.
        assert (await alice.post(f"/api/tasks/{task['id']}/messages", json={"content": "Go"})).status_code == 202
        while (await alice.get(f"/api/sessions/{session}")).json()["running"]:
            assert time.monotonic() < deadline, "the turn did not end"
            await asyncio.sleep(0.05)
        last = (await alice.get(f"/api/sessions/{session}/messages")).json()[-1]["content"]
        assert "You answered: Go" in last and "mine now" not in last


async def test_a_remote_agent_served_on_asks_the_a2a_caller_and_gets_its_answer_in_its_own_task(
    app: LiveApp, asker: str
) -> None:
    """Hub in the middle: an A2A client → this app → the asking agent; the question and the answer pass through."""
    assert register(app, asker, "asker").status_code == 201
    async with sdk_client(app.agent_url("asker"), app.key) as (client, _card):
        events = [e async for e in client.send_message(user_message("what is the weather"))]
        last = events[-1].status_update
        assert last.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        question = last.status.message.parts[0].text
        asked = IDS.search(question)
        assert question.startswith("Which city do you mean?") and asked
        follow = Message(message_id="m-2", role=Role.ROLE_USER, parts=[Part(text="Paris")], task_id=last.task_id)
        events = [e async for e in client.send_message(SendMessageRequest(message=follow))]
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    [result] = [e.artifact_update.artifact for e in events if e.HasField("artifact_update")]
    answered = IDS.search(result.parts[0].text)
    assert result.parts[0].text.startswith("You answered: Paris") and answered
    assert answered.groups() == asked.groups()  # the remote agent's own task and context, both times


def test_the_demo_models_ask_calls_ask_user_when_offered_and_else_asks_in_its_reply() -> None:
    offered = [{"type": "function", "function": {"name": "ask_user", "parameters": {}}}]
    reply = plan_reply([{"role": "user", "content": "/ask Which city?"}], offered)
    [call] = reply.tool_calls
    assert (call.name, json.loads(call.arguments), reply.tokens) == ("ask_user", {"question": "Which city?"}, [])
    plain = plan_reply([{"role": "user", "content": "/ask Which city?"}], None)
    assert ("".join(plain.tokens), plain.tool_calls) == ("Which city?", [])
    result = {"role": "tool", "name": "ask_user", "content": json.dumps({"ok": True, "output": "Paris"})}
    answered = plan_reply([{"role": "user", "content": "/ask Which city?"}, {"role": "assistant"}, result], offered)
    assert "".join(answered.tokens) == "You answered: Paris"
