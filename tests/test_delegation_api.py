"""`GET /api/agents/a2a/stream?taskId=` and `/api/tasks` over real HTTP: replay, resume, owner only."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.delegation import task_stream_key
from core.services import Services
from tests.conftest import make_settings
from tests.test_api import build_api_app, stream_events
from tests.utils.accounts import ALICE, BOB, seed_accounts
from tests.utils.live_server import live_server


@pytest.fixture
def two_users_api(tmp_path: Path, database_url: str) -> Iterator[tuple[str, Services]]:
    """A live API server with accounts alice and bob; the demo model takes 2 ms per token."""
    seed_accounts(tmp_path, database_url)
    services = Services.build(make_settings(tmp_path, database_url=database_url, demo_model_delay_ms=2))
    services.prepare()
    with live_server(build_api_app(services)) as url:
        yield url, services


def kind(event: dict) -> str:
    """An SSE event's type: its `event:` name, or the `type` of an unnamed event's data."""
    return event.get("event") or event["data"]["type"]


async def delegate(client: httpx.AsyncClient, text: str) -> tuple[str, str]:
    """Send a delegating message as the client's user; returns (session id, task id) once the turn ended."""
    session = (await client.post("/api/sessions", json={"agentId": "general-assistant"})).json()
    turn = (await client.post(f"/api/sessions/{session['id']}/messages", json={"content": text})).json()
    _, events = await stream_events(client, turn["streamUrl"])
    [started] = [e["data"] for e in events if kind(e) == "a2a-task-started"]
    return session["id"], started["taskId"]


async def test_the_owner_reads_the_task_stream_and_can_resume_it(two_users_api) -> None:
    url, _ = two_users_api
    async with httpx.AsyncClient(base_url=url, auth=ALICE, timeout=10) as alice:
        _, task_id = await delegate(alice, "@coding-assistant write hello")
        response, events = await stream_events(alice, f"/api/agents/a2a/stream?taskId={task_id}")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        kinds = [kind(e) for e in events]
        assert kinds[0] == "state" and kinds[-1] == "done" and "text-delta" in kinds
        ids = [int(e["id"]) for e in events]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)

        middle = ids[len(ids) // 2]
        _, rest = await stream_events(
            alice, f"/api/agents/a2a/stream?taskId={task_id}", headers={"Last-Event-ID": str(middle)}
        )
        assert [int(e["id"]) for e in rest] == [i for i in ids if i > middle]
        _, by_query = await stream_events(alice, f"/api/agents/a2a/stream?taskId={task_id}&lastEventId={middle}")
        assert [int(e["id"]) for e in by_query] == [i for i in ids if i > middle]


async def test_another_users_task_looks_exactly_like_an_unknown_one(two_users_api) -> None:
    url, _ = two_users_api
    async with (
        httpx.AsyncClient(base_url=url, auth=ALICE, timeout=10) as alice,
        httpx.AsyncClient(base_url=url, auth=BOB, timeout=10) as bob,
    ):
        _, task_id = await delegate(alice, "@coding-assistant secret plans")
        unknown_id = "0123456789abcdef0123456789abcdef"
        for path in ["/api/agents/a2a/stream?taskId={}", "/api/tasks/{}"]:
            theirs, unknown = await bob.get(path.format(task_id)), await bob.get(path.format(unknown_id))
            assert (theirs.status_code, theirs.json()) == (unknown.status_code, unknown.json()), path
        assert (await bob.get(f"/api/tasks/{task_id}")).status_code == 404
        assert (await alice.get(f"/api/agents/a2a/stream?taskId={task_id}")).status_code == 200
        assert (await bob.get("/api/tasks")).json() == []
        assert [t["id"] for t in (await alice.get("/api/tasks")).json()] == [task_id]
        anonymous = await httpx.AsyncClient(base_url=url).get(f"/api/agents/a2a/stream?taskId={task_id}")
        assert anonymous.status_code == 401


async def test_missing_or_unknown_task_ids(two_users_api) -> None:
    url, _ = two_users_api
    async with httpx.AsyncClient(base_url=url, auth=ALICE, timeout=10) as alice:
        missing = await alice.get("/api/agents/a2a/stream")
        assert missing.status_code == 400 and "taskId" in missing.json()["detail"]
        empty = await alice.get("/api/agents/a2a/stream?taskId=")
        assert empty.status_code == 400
        unknown = await alice.get("/api/agents/a2a/stream?taskId=0123456789abcdef")
        assert unknown.status_code == 200 and unknown.json() == {"active": False, "reason": "no-buffer"}
        too_long = await alice.get("/api/agents/a2a/stream?taskId=" + "x" * 65)
        assert too_long.status_code == 422


async def test_an_evicted_task_answers_no_buffer_and_stays_readable(two_users_api) -> None:
    url, services = two_users_api
    async with httpx.AsyncClient(base_url=url, auth=ALICE, timeout=10) as alice:
        session_id, task_id = await delegate(alice, "@coding-assistant short lived")
        services.hub.ttl_s = 0
        services.hub.sweep()
        assert services.hub.get(task_stream_key(task_id)) is None
        gone = await alice.get(f"/api/agents/a2a/stream?taskId={task_id}")
        assert gone.status_code == 200 and gone.json() == {"active": False, "reason": "no-buffer"}
        detail = (await alice.get(f"/api/tasks/{task_id}")).json()
        assert detail["state"] == "completed" and detail["callerSessionId"] == session_id
        assert [m["source"] for m in detail["messages"]] == ["a2a", "a2a"]


async def test_a_running_task_streams_live_to_a_late_subscriber(two_users_api) -> None:
    url, services = two_users_api
    async with httpx.AsyncClient(base_url=url, auth=ALICE, timeout=20) as alice:
        session = (await alice.post("/api/sessions", json={"agentId": "general-assistant"})).json()
        await alice.post(f"/api/sessions/{session['id']}/messages", json={"content": "@coding-assistant /lorem 600"})
        task_id = None
        for _ in range(200):
            tasks = (await alice.get("/api/tasks")).json()
            if tasks and tasks[0]["state"] == "working":
                task_id = tasks[0]["id"]
                break
            await asyncio.sleep(0.01)
        assert task_id, "the task never started"
        response, events = await stream_events(alice, f"/api/agents/a2a/stream?taskId={task_id}")
        text = "".join(e["data"]["textDelta"] for e in events if kind(e) == "text-delta")
        assert len(text.split()) == 600 and events[-1]["data"]["state"] == "completed"


async def test_agents_can_be_added_over_the_api_and_delegate_at_once(two_users_api) -> None:
    url, _ = two_users_api
    async with httpx.AsyncClient(base_url=url, auth=ALICE, timeout=10) as alice:
        created = await alice.post(
            "/api/agents",
            json={
                "id": "architect",
                "name": "Architect",
                "systemPrompt": "You design.",
                "canDelegate": True,
                "delegation": {"maxRecursionDepth": 2},
            },
        )
        assert created.status_code == 201 and created.json()["model"] == "local/demo"
        again = await alice.post("/api/agents", json={"id": "architect", "name": "Architect"})
        assert again.status_code == 409 and "already exists" in again.json()["detail"]
        misspelt = await alice.post(
            "/api/agents", json={"id": "critic", "name": "Critic", "canDelegate": True, "delegation": {"maxDepth": 2}}
        )
        assert misspelt.status_code == 422
        assert misspelt.json()["detail"][0]["loc"] == ["body", "delegation", "maxDepth"]
        bad = await alice.post("/api/agents", json={"id": "Not Valid!", "name": "x"})
        assert bad.status_code == 422
        assert bad.json()["detail"][0]["loc"] == ["body", "id"] and "agent id" in bad.json()["detail"][0]["msg"]
        missing = await alice.post("/api/agents", json={"id": "x"})
        assert missing.status_code == 422 and "name" in str(missing.json()["detail"])
        _, task_id = await delegate(alice, "@architect sketch @@coding-assistant code it")
        detail = (await alice.get(f"/api/tasks/{task_id}")).json()
        assert detail["calleeAgentId"] == "architect" and detail["state"] == "completed"
        [child] = detail["children"]
        assert child["calleeAgentId"] == "coding-assistant" and child["recursionDepth"] == 2


def seed_000_panel(raw: bytes) -> dict:
    """Seed 000 §3.3.1's `AgentInvokePanel.onmessage`, translated line by line, over the raw SSE bytes."""
    streamed_text, is_done, error = "", False, None
    for frame in raw.decode().split("\n\n"):
        lines = frame.split("\n")
        if any(line.startswith("event:") for line in lines):
            continue  # a named event: `onmessage` does not see it
        data = "\n".join(line[5:].lstrip(" ") for line in lines if line.startswith("data:"))
        if not data:
            continue
        chunk = json.loads(data)
        if chunk["type"] == "text-delta":
            streamed_text += chunk["textDelta"]
        elif chunk["type"] == "done":
            is_done = True
            break  # eventSource.close()
        elif chunk["type"] == "error":
            error = chunk["message"]
            break  # eventSource.close()
    return {"streamedText": streamed_text, "isDone": is_done, "error": error}


async def test_the_task_stream_speaks_seed_000_and_seed_002_on_the_wire(two_users_api) -> None:
    """text-delta {textDelta}, error {message}, done, X-Stream-Resume; `state` is {taskId, from, to, timestamp}."""
    url, _ = two_users_api
    async with httpx.AsyncClient(base_url=url, auth=ALICE, timeout=20) as alice:
        _, task_id = await delegate(alice, "@coding-assistant write hello")
        async with alice.stream("GET", f"/api/agents/a2a/stream?taskId={task_id}") as response:
            raw = b"".join([chunk async for chunk in response.aiter_bytes()])
        assert response.headers["x-stream-resume"] == "true"
        assert response.headers["content-type"].startswith("text/event-stream")
        answer = (await alice.get(f"/api/tasks/{task_id}")).json()["messages"][-1]["content"]
        assert seed_000_panel(raw) == {"streamedText": answer, "isDone": True, "error": None}

        frames = [f for f in raw.decode().split("\n\n") if f.strip()]
        states = [json.loads(f.split("data: ", 1)[1]) for f in frames if "\nevent: state\n" in f"\n{f}"]
        assert [(s["from"], s["to"]) for s in states] == [
            ("unknown", "submitted"),
            ("submitted", "working"),
            ("working", "completed"),
        ]
        assert all(list(s) == ["taskId", "from", "to", "timestamp"] and s["taskId"] == task_id for s in states)
        assert all(s["timestamp"].endswith("Z") for s in states)
        delta = next(f for f in frames if '"type":"text-delta"' in f)
        assert re.fullmatch(
            r'id: \d+\ndata: \{"type":"text-delta","textDelta":"[^"]*"\}',
            delta.split("\n", 1)[1] if delta.startswith("retry:") else delta,
        )
        assert frames[-1].split("\n")[1].startswith('data: {"type":"done","state":"completed"')

        _, failed_id = await delegate(alice, "@coding-assistant /error")
        async with alice.stream("GET", f"/api/agents/a2a/stream?taskId={failed_id}") as response:
            failed = b"".join([chunk async for chunk in response.aiter_bytes()])
        panel = seed_000_panel(failed)
        assert panel["error"] and not panel["isDone"] and panel["streamedText"]
        assert b'"type":"error","message":' in failed and b"errorText" not in failed
