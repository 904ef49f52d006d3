"""A broker task is one log: read by id at `/api/agents/a2a/stream?taskId=` on any replica (issue 35, item 1).

Two real `python app.py` processes in cluster mode (PostgreSQL + Redis), the example echo agent dialled into A.
A chat system dispatches over HTTP on B with a user's API key; the task runs on A, and its stream is read by id
on B and on A, and cut and resumed with `Last-Event-ID`: the same events, none lost, none repeated.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlmodel import select

from core.a2a import api_keys
from core.db import Database
from models import User
from tests.conftest import unavailable
from tests.utils.broker import DISPATCH_HEADERS
from tests.utils.broker_replicas import Replicas, echo_agent, two_replicas
from tests.utils.cluster import ADMIN, cluster_backends

pytestmark = [pytest.mark.cluster, pytest.mark.postgres]

ECHO_NAME = "Stream Echo"

Event = tuple[int, str, dict[str, Any]]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory, postgres_server_url: str) -> Iterator[Replicas]:
    """Replicas A and B, module-scoped."""
    try:
        with (
            cluster_backends(postgres_server_url) as backends,
            two_replicas(backends, tmp_path_factory.mktemp("replicas")) as started,
        ):
            yield started
    except ConnectionError as exc:
        unavailable(str(exc))


@pytest.fixture(scope="module")
def echo_id(replicas: Replicas) -> Iterator[str]:
    """The echo agent, dialled into A (slow enough to read its task while it runs)."""
    agent_id = f"echo-{secrets.token_hex(3)}"
    with echo_agent(replicas.a.base_url, agent_id, delay_s=0.3, name=ECHO_NAME):
        yield agent_id


async def admin_api_key(replicas: Replicas) -> str:
    """An A2A API key of the admin (the user the chat system acts for)."""
    db = Database(replicas.backends.database_url)
    try:
        async with db.session() as s:
            admin = (await s.exec(select(User).where(User.username == ADMIN[0]))).one()
            assert admin.id is not None
            _row, key = await api_keys.create_key(s, user_id=admin.id, name="chat system")
            await s.commit()
        return key
    finally:
        await db.close()


async def read_stream(
    http: httpx.AsyncClient, base_url: str, task_id: str, *, after: int | None = None, take: int | None = None
) -> list[Event]:
    """The task stream's events (id, type, data) until it ends, or the first `take` of them."""
    headers = {"Last-Event-ID": str(after)} if after is not None else {}
    events: list[Event] = []
    fields: dict[str, str] = {}
    async with http.stream(
        "GET", f"{base_url}/api/agents/a2a/stream", params={"taskId": task_id}, headers=headers
    ) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line:
                if not line.startswith(":"):
                    name, _, value = line.partition(":")
                    fields[name] = value.removeprefix(" ")
                continue
            if "id" in fields and "data" in fields:
                data = json.loads(fields["data"])  # seed 000: unnamed events say their type in the data
                events.append((int(fields["id"]), fields.get("event") or data.get("type", "message"), data))
                if take is not None and len(events) >= take:
                    return events
            fields = {}
    return events


async def test_a_broker_task_dispatched_over_http_is_read_by_id_on_both_replicas_and_resumed(
    replicas: Replicas, echo_id: str
) -> None:
    """Dispatched on B, run on A: both replicas serve its one log; a cut reader resumes, nothing lost or repeated."""
    key = await admin_api_key(replicas)
    words = [f"w{i}-{secrets.token_hex(2)}" for i in range(4)]
    async with httpx.AsyncClient(timeout=30) as chat_system:  # its own Authorization: the key, not the admin's
        ack = (
            await chat_system.post(
                f"{replicas.b.base_url}/a2a/tasks/dispatch",
                headers={"Authorization": f"Bearer {key}"},
                json={"task": " ".join(words), "targetAgent": echo_id, "agentId": 7, "chatId": "stream-chat"},
            )
        ).json()
    assert ack.get("status") == "accepted", ack
    task_id = ack["taskId"]
    async with httpx.AsyncClient(timeout=30, auth=replicas.auth) as http:
        # Cut while the task runs, then resumed from the last event seen.
        first = await asyncio.wait_for(read_stream(http, replicas.b.base_url, task_id, take=2), 20)
        rest = await asyncio.wait_for(read_stream(http, replicas.b.base_url, task_id, after=first[-1][0]), 30)
        on_b = await asyncio.wait_for(read_stream(http, replicas.b.base_url, task_id), 20)
        on_a = await asyncio.wait_for(read_stream(http, replicas.a.base_url, task_id), 20)

    assert on_a == on_b
    assert first + rest == on_b  # nothing lost, nothing repeated
    ids = [e[0] for e in on_b]
    assert ids == sorted(set(ids))
    kinds = [e[1] for e in on_b]
    assert kinds[0] == "state" and on_b[0][2]["to"] == "working"
    assert kinds[-1] == "done" and on_b[-1][2]["state"] == "completed"
    text = "".join(e[2]["textDelta"] for e in on_b if e[1] == "text-delta")
    assert all(w in text for w in words)


async def test_another_users_broker_task_is_not_served(replicas: Replicas, echo_id: str) -> None:
    """A task dispatched with the dispatch token (no user) is answered like an unknown one."""
    async with httpx.AsyncClient(timeout=30) as chat_system:
        ack = (
            await chat_system.post(
                f"{replicas.b.base_url}/a2a/tasks/dispatch",
                headers=DISPATCH_HEADERS,
                json={"task": "hello", "targetAgent": echo_id, "agentId": 7, "chatId": "other-chat"},
            )
        ).json()
    assert ack.get("status") == "accepted", ack
    async with httpx.AsyncClient(timeout=30, auth=replicas.auth) as http:
        answer = (
            await http.get(f"{replicas.b.base_url}/api/agents/a2a/stream", params={"taskId": ack["taskId"]})
        ).json()
    assert answer == {"active": False, "reason": "no-buffer"}
