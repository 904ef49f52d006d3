"""Remote HTTP A2A agents: registered by card URL, delegated to from a chat, served on to other clients (issue 6).

The remote side is `tests/utils/a2a_echo_server.py`, an agent built only on the
a2a-sdk, started as its own process: it answers `Echo: <text>` word by word.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from a2a.types import CancelTaskRequest, GetTaskRequest, TaskState

from tests.test_api import read_sse
from tests.utils.a2a_agents import LOCAL_AGENTS, echo_server
from tests.utils.a2a_live import LiveApp, free_port, live_a2a_app, sdk_client, user_message


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    """The echo agent with v1.0 and v0.3 interfaces."""
    with echo_server() as url:
        yield url


@pytest.fixture(scope="module")
def echo_v03() -> Iterator[str]:
    """The echo agent as a pre-1.0 agent: its card offers only v0.3."""
    with echo_server("--v03-only", "--name", "Old Echo") as url:
        yield url


@pytest.fixture
def app(tmp_path: Path) -> Iterator[LiveApp]:
    """The app on a live port, demo model without delay."""
    with live_a2a_app(tmp_path, demo_model_delay_ms=0, outbound_allow_hosts=LOCAL_AGENTS) as live:
        yield live


def register(app: LiveApp, card_url: str, agent_id: str | None = None) -> httpx.Response:
    return httpx.post(f"{app.url}/api/a2a/remote-agents", json={"cardUrl": card_url, "id": agent_id}, timeout=30)


def chat(app: LiveApp, text: str, agent: str = "general-assistant") -> str:
    """Send one message in a new chat and wait for the answer; returns the session id."""
    session = httpx.post(f"{app.url}/api/sessions", json={"agentId": agent}).json()["id"]
    assert httpx.post(f"{app.url}/api/sessions/{session}/messages", json={"content": text}).status_code == 202
    deadline = time.monotonic() + 30
    while httpx.get(f"{app.url}/api/sessions/{session}").json()["running"]:
        assert time.monotonic() < deadline, "the turn did not end"
        time.sleep(0.05)
    return session


def task_events(app: LiveApp, task_id: str) -> list[tuple[str, dict]]:
    """What the side panel streams for a task (its buffer, replayed): `(type, data)` pairs."""
    with httpx.stream("GET", f"{app.url}/api/agents/a2a/stream", params={"taskId": task_id}, timeout=10) as response:
        events = read_sse(list(response.iter_lines()))
    return [(e.get("event") or e["data"].get("type"), e["data"]) for e in events if "data" in e]


async def test_register_by_card_url_then_delegate_from_a_chat_with_the_stream_and_the_audit(
    app: LiveApp, echo: str
) -> None:
    created = register(app, echo, "echo")
    assert created.status_code == 201, created.text
    agent = created.json()
    assert (agent["id"], agent["name"], agent["protocolVersion"], agent["streaming"], agent["online"]) == (
        "echo",
        "Echo Agent",
        "1.0",
        True,
        True,
    )
    assert [a["id"] for a in httpx.get(f"{app.url}/api/a2a/remote-agents").json()] == ["echo"]

    session = chat(app, "@echo hello there, remote agent")
    [task] = [t for t in httpx.get(f"{app.url}/api/tasks").json() if t["callerSessionId"] == session]
    assert (task["calleeAgentId"], task["calleeAgentName"], task["state"]) == ("echo", "Echo Agent", "completed")
    # The panel's stream: the remote agent's words as they came, one text-delta each.
    deltas = [data["textDelta"] for kind, data in task_events(app, task["id"]) if kind == "text-delta"]
    assert deltas == ["Echo:", " hello", " there,", " remote", " agent"]
    # The audit data: the exchange saved with source='a2a'.
    detail = httpx.get(f"{app.url}/api/tasks/{task['id']}").json()
    assert [(m["role"], m["source"], m["content"]) for m in detail["messages"]] == [
        ("user", "a2a", "hello there, remote agent"),
        ("assistant", "a2a", "Echo: hello there, remote agent"),
    ]
    # And the caller's answer uses it.
    answer = httpx.get(f"{app.url}/api/sessions/{session}/messages").json()[-1]
    assert "Echo: hello there, remote agent" in answer["content"]


async def test_a_remote_agent_is_served_on_to_any_a2a_client(app: LiveApp, echo: str) -> None:
    assert register(app, echo, "echo").status_code == 201
    async with sdk_client(app.agent_url("echo"), app.key) as (client, card):
        assert card.name == "Echo Agent" and card.supported_interfaces[0].url == app.agent_url("echo")
        assert [s.id for s in card.skills] == ["echo"]
        events = [e async for e in client.send_message(user_message("through the hub"))]
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert events[-2].artifact_update.artifact.parts[0].text == "Echo: through the hub"


async def test_a_v03_only_agent_is_called_through_the_compat_transport(app: LiveApp, echo_v03: str) -> None:
    created = register(app, echo_v03)
    assert created.status_code == 201, created.text
    assert (created.json()["id"], created.json()["protocolVersion"]) == ("old-echo", "0.3")  # id from the name
    session = chat(app, "@old-echo are you there")
    [task] = [t for t in httpx.get(f"{app.url}/api/tasks").json() if t["callerSessionId"] == session]
    assert task["state"] == "completed", task
    detail = httpx.get(f"{app.url}/api/tasks/{task['id']}").json()
    assert detail["messages"][-1]["content"] == "Echo: are you there"


async def test_cards_that_cannot_be_used_are_refused_and_nothing_is_registered(app: LiveApp, echo: str) -> None:
    dead = register(app, f"http://127.0.0.1:{free_port()}/.well-known/agent-card.json")
    assert dead.status_code == 422 and "could not fetch the card: could not connect" in dead.json()["detail"]
    not_a_card = register(app, f"{app.url}/api/me.json")
    assert not_a_card.status_code == 422, not_a_card.text
    not_http = register(app, "ftp://example.com/card.json")
    assert not_http.status_code == 422 and "http(s)" in not_http.json()["detail"]
    taken = register(app, echo, "coding-assistant")
    assert taken.status_code == 409 and "local agent" in taken.json()["detail"]
    bad_id = register(app, echo, "Not An Id!")
    assert bad_id.status_code == 422 and "agent id" in bad_id.json()["detail"]
    assert httpx.get(f"{app.url}/api/a2a/remote-agents").json() == []
    assert (
        httpx.get(f"{app.url}/a2a/agents/coding-assistant/.well-known/agent-card.json").json()["name"]
        == "Coding Assistant"
    )
    assert register(app, echo, "echo").status_code == 201  # the same card, once usable, registers fine
    assert register(app, echo, "echo").status_code == 409


async def test_registrations_come_back_after_a_restart_and_can_be_removed(tmp_path: Path, echo: str) -> None:
    data = tmp_path / "kept"
    with live_a2a_app(tmp_path, data_dir=data, demo_model_delay_ms=0, outbound_allow_hosts=LOCAL_AGENTS) as first:
        assert register(first, echo, "echo").status_code == 201
    with live_a2a_app(tmp_path, data_dir=data, demo_model_delay_ms=0, outbound_allow_hosts=LOCAL_AGENTS) as second:
        deadline = time.monotonic() + 10
        while not [a for a in httpx.get(f"{second.url}/api/a2a/remote-agents").json() if a["online"]]:
            assert time.monotonic() < deadline, "the registration did not come back"
            time.sleep(0.05)
        session = chat(second, "@echo still here")
        [task] = [t for t in httpx.get(f"{second.url}/api/tasks").json() if t["callerSessionId"] == session]
        assert task["state"] == "completed"
        assert httpx.delete(f"{second.url}/api/a2a/remote-agents/echo").status_code == 204
        assert httpx.get(f"{second.url}/api/a2a/remote-agents").json() == []
        assert httpx.get(f"{second.url}/a2a/agents/echo/.well-known/agent-card.json").status_code == 404


async def test_canceling_a_task_on_a_remote_agent_stops_it(app: LiveApp) -> None:
    with echo_server("--delay-ms", "20", "--name", "Slow Echo") as slow:
        assert register(app, slow, "slow").status_code == 201
        async with sdk_client(app.agent_url("slow"), app.key) as (client, _):
            stream = client.send_message(user_message("/ticks 500"))
            task_id = (await anext(stream)).task.id
            async for event in stream:
                if event.WhichOneof("payload") == "status_update" and event.status_update.status.HasField("message"):
                    break
            canceled = await client.cancel_task(CancelTaskRequest(id=task_id))
            assert canceled.status.state == TaskState.TASK_STATE_CANCELED
            saved = await client.get_task(GetTaskRequest(id=task_id))
        assert saved.status.state == TaskState.TASK_STATE_CANCELED
        assert json.dumps(httpx.get(f"{app.url}/api/tasks/{task_id}").json()["state"]) == '"canceled"'


async def test_the_result_of_a_remote_agent_is_its_answer_not_its_progress_notes(app: LiveApp, echo: str) -> None:
    """Status notes and artifact chunks stream to the panel; the result is the artifact (issue 16 item 7)."""
    assert register(app, echo, "echo").status_code == 201
    session = chat(app, "@echo /chunks hello remote world")
    [task] = [t for t in httpx.get(f"{app.url}/api/tasks").json() if t["callerSessionId"] == session]
    assert task["state"] == "completed", task
    shown = "".join(data["textDelta"] for kind, data in task_events(app, task["id"]) if kind == "text-delta")
    assert "starting…" in shown and "chunk 3/3" in shown and "world" in shown  # the panel shows everything
    detail = httpx.get(f"{app.url}/api/tasks/{task['id']}").json()
    assert detail["messages"][-1]["content"] == "hello remote world"  # the result: the artifact only
    answer = httpx.get(f"{app.url}/api/sessions/{session}/messages").json()[-1]["content"]
    assert "hello remote world" in answer and "starting" not in answer and "chunk" not in answer
    async with sdk_client(app.agent_url("echo"), app.key, streaming=False) as (client, _):  # served on: the same
        [event] = [e async for e in client.send_message(user_message("/chunks just this"))]
    assert event.task.artifacts[0].parts[0].text == "just this"


async def test_an_answer_in_artifacts_is_not_glued_to_the_final_message_that_follows_it(
    app: LiveApp, echo: str
) -> None:
    """Artifacts, then a closing "Here is the answer.": the result is the artifacts, never both (issue 36 item 5)."""
    assert register(app, echo, "echo").status_code == 201
    session = chat(app, "@echo /summed three quiet words")
    [task] = [t for t in httpx.get(f"{app.url}/api/tasks").json() if t["callerSessionId"] == session]
    assert task["state"] == "completed", task
    detail = httpx.get(f"{app.url}/api/tasks/{task['id']}").json()
    assert detail["messages"][-1]["content"] == "three quiet words"


async def test_a_remote_agent_whose_server_died_is_shown_offline_until_it_is_back(
    app: LiveApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reachability: a failed call marks the agent offline at once; a look at the list re-checks it."""
    from core.a2a import client as a2a_client

    def online() -> bool:
        [agent] = httpx.get(f"{app.url}/api/a2a/remote-agents", timeout=10).json()
        return agent["online"]

    port = free_port()
    with echo_server("--name", "Mortal", port=port) as card_url:
        assert register(app, card_url, "mortal").status_code == 201
        assert online()
    session = chat(app, "@mortal are you there")  # the server is gone: the call fails...
    [task] = [t for t in httpx.get(f"{app.url}/api/tasks").json() if t["callerSessionId"] == session]
    assert task["state"] == "failed" and task["error"].startswith("Mortal is unreachable: "), task
    assert online() is False  # ...and says so at once
    monkeypatch.setattr(a2a_client, "REACHABILITY_MAX_AGE_S", 0.0)  # every look re-checks
    assert online() is False
    with echo_server("--name", "Mortal", port=port):
        assert online() is True  # back
        chat(app, "@mortal welcome back")
        assert online() is True
    assert online() is False
