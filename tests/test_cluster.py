"""Cluster mode (issue 18): two real replicas on one PostgreSQL database and one Redis.

The replicas are `python app.py` processes (tests/utils/cluster.py), started together on a fresh
database and Redis key prefix of this run, with a short lease so a killed replica's turn is ended
quickly. One pair serves the whole module (start-up costs seconds); the kill -9 test runs last. The Redis cut
(issue 41) starts a pair of its own, with the default lease, that reaches Redis through a proxy it cuts
(tests/utils/tcp_proxy.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from core.chat.demo_model import plan_reply
from core.db import alembic_config
from tests.conftest import unavailable
from tests.utils.app_process import ROOT, app_process, child_env
from tests.utils.cluster import ADMIN, ClusterBackends, Replica, add_account, cluster_backends, start_replicas, wait_for
from tests.utils.tcp_proxy import ThreadedTcpProxy, threaded_proxy

pytestmark = [pytest.mark.cluster, pytest.mark.postgres]

LEASE_S = 4.0  # short: a replica killed mid-turn is noticed within about this (plus the reaper's period)
AGENT = "coding-assistant"


def words(command: str) -> str:
    """The demo model's exact answer to `command`."""
    return "".join(plan_reply([{"role": "user", "content": command}], tools=None).tokens)


@pytest.fixture(scope="module")
def backends(postgres_server_url: str) -> Iterator[ClusterBackends]:
    try:
        with cluster_backends(postgres_server_url) as made:
            yield made
    except ConnectionError as exc:
        unavailable(str(exc))


@pytest.fixture(scope="module")
def fresh_start(backends: ClusterBackends, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Two replicas started together on the fresh database, before any account exists: their output."""
    base = tmp_path_factory.mktemp("fresh")
    with start_replicas(backends, base, wait=False) as replicas:
        for replica in replicas:
            replica.app.process.wait(timeout=90)
        return [replica.app.output for replica in replicas]


@pytest.fixture(scope="module")
def replicas(
    backends: ClusterBackends, fresh_start: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Replica]]:
    base = tmp_path_factory.mktemp("cluster")
    add_account(backends, base / "cli")
    with start_replicas(backends, base, CLUSTER_LEASE_S=str(LEASE_S), DEMO_MODEL_DELAY_MS="5") as started:
        for replica in started:
            warm_up(replica)
        yield started


def warm_up(replica: Replica) -> None:
    """One short turn: the first model call imports LiteLLM, which holds a fresh replica's event loop for
    seconds (longer than this module's short lease), so it is paid before the tests.
    """
    with httpx.Client(base_url=replica.url, auth=ADMIN, timeout=60) as client:
        session_id = client.post("/api/sessions", json={"agentId": AGENT}).json()["id"]
        assert client.post(f"/api/sessions/{session_id}/messages", json={"content": "/slow 2 10"}).status_code == 202
        deadline = time.monotonic() + 60
        while client.get(f"/api/sessions/{session_id}").json()["running"]:
            assert time.monotonic() < deadline, f"the warm-up turn on {replica.url} did not end"
            time.sleep(0.1)


async def new_chat(client: httpx.AsyncClient) -> str:
    response = await client.post("/api/sessions", json={"agentId": AGENT})
    assert response.status_code == 201, response.text
    return response.json()["id"]


async def send(client: httpx.AsyncClient, session_id: str, text: str) -> httpx.Response:
    return await client.post(f"/api/sessions/{session_id}/messages", json={"content": text})


async def read_sse(
    client: httpx.AsyncClient, path: str, *, last_event_id: int | None = None, stop_after: int | None = None
) -> list[tuple[int, dict]]:
    """(id, data) of each event until `finish` (or after `stop_after` events: the cut)."""
    headers = {"Last-Event-ID": str(last_event_id)} if last_event_id is not None else {}
    events: list[tuple[int, dict]] = []
    async with client.stream("GET", path, headers=headers, timeout=60) as response:
        assert response.status_code == 200, await response.aread()
        event_id: int | None = None
        async for line in response.aiter_lines():
            if line.startswith("id:"):
                event_id = int(line[3:].strip())
            elif line.startswith("data:"):
                data = json.loads(line[5:].strip())
                events.append((event_id, data))
                if data.get("type") == "finish" or (stop_after is not None and len(events) >= stop_after):
                    return events
    return events


def text_of(events: list[tuple[int, dict]]) -> str:
    return "".join(d.get("delta", "") for _, d in events if d.get("type") == "text-delta")


async def messages(client: httpx.AsyncClient, session_id: str) -> list[dict]:
    response = await client.get(f"/api/sessions/{session_id}/messages")
    assert response.status_code == 200, response.text
    return response.json()


# -- start-up ----------------------------------------------------------------------------------------


def test_two_replicas_on_a_fresh_database_migrate_once_then_refuse_without_an_account(fresh_start: list[str]) -> None:
    for output in fresh_start:
        assert "UniqueViolation" not in output and "Traceback" not in output, output
        assert "there are no user accounts" in output, output


def test_cluster_mode_without_postgres_redis_or_secret_refuses_with_the_reasons(tmp_path: Path) -> None:
    with app_process(tmp_path / "data", CLUSTER="true") as app:
        assert app.process.wait(timeout=60) != 0
    output = app.output
    assert "Refusing to start in cluster mode" in output, output
    for setting in (
        "DATABASE_URL must point at PostgreSQL",
        "REDIS_URL",
        "STORAGE_SECRET",
        "REPLICA_URL",
        "INTERNAL_TOKEN",
        "INSTANCE_ID",
    ):
        assert setting in output, (setting, output)


def test_migrate_as_a_one_shot_step_run_twice_at_once_on_a_fresh_database(
    postgres_server_url: str, backends: ClusterBackends, tmp_path: Path
) -> None:
    from tests.conftest import create_postgres_database, drop_postgres_database

    url = create_postgres_database(postgres_server_url, prefix="a2a_cluster_migrate")
    try:
        env = child_env(tmp_path / "data", DATABASE_URL=url)
        runs = [
            subprocess.Popen(
                [sys.executable, "app.py", "migrate"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for _ in range(2)
        ]
        outputs = [run.communicate(timeout=120)[0] for run in runs]
        assert [run.returncode for run in runs] == [0, 0], outputs
        assert all("the database is at the newest schema" in out for out in outputs), outputs
        head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
        engine = create_engine(make_url(url).set(drivername="postgresql+psycopg"))
        try:
            with engine.connect() as conn:
                assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [head]
        finally:
            engine.dispose()
    finally:
        drop_postgres_database(postgres_server_url, url)


# -- turns across replicas ------------------------------------------------------------------------------


async def test_a_turn_on_a_is_read_on_b_and_resumed_on_a_with_nothing_lost_or_repeated(replicas: list[Replica]) -> None:
    a, b = replicas
    command = "/slow 60 20"
    async with a.client() as on_a, b.client() as on_b:
        session_id = await new_chat(on_a)
        turn = await send(on_a, session_id, command)
        assert turn.status_code == 202, turn.text
        after = turn.json()["afterEventId"]
        stream = f"/api/sessions/{session_id}/stream"
        on_b_events = await read_sse(on_b, stream, last_event_id=after)
        ids = [i for i, _ in on_b_events]
        assert ids == list(range(after + 1, after + 1 + len(ids))), ids
        assert on_b_events[0][1]["type"] == "start" and on_b_events[-1][1]["type"] == "finish"
        assert text_of(on_b_events) == words(command), on_b_events

        # The second turn: read on A, cut after a few events, resume on A with Last-Event-ID.
        turn = await send(on_b, session_id, command)
        assert turn.status_code == 202, turn.text
        after = turn.json()["afterEventId"]
        first_part = await read_sse(on_a, stream, last_event_id=after, stop_after=8)
        rest = await read_sse(on_a, stream, last_event_id=first_part[-1][0])
        whole = first_part + rest
        ids = [i for i, _ in whole]
        assert ids == list(range(after + 1, after + 1 + len(ids))), ids
        assert text_of(whole) == words(command)
        saved = await messages(on_b, session_id)
        assert [m["role"] for m in saved] == ["user", "assistant", "user", "assistant"]
        assert saved[-1]["content"] == words(command) and saved[-1]["status"] == "complete"


async def test_a_second_send_on_b_while_a_answers_is_refused(replicas: list[Replica]) -> None:
    a, b = replicas
    async with a.client() as on_a, b.client() as on_b:
        session_id = await new_chat(on_a)
        assert (await send(on_a, session_id, "/slow 40 50")).status_code == 202
        second = await send(on_b, session_id, "hello again")
        assert second.status_code == 409, second.text
        assert (await on_b.get(f"/api/sessions/{session_id}")).json()["running"] is True
        await read_sse(on_b, f"/api/sessions/{session_id}/stream")  # let it end
        assert [m["role"] for m in await messages(on_b, session_id)] == ["user", "assistant"]


async def test_one_users_running_turns_are_limited_across_replicas(replicas: list[Replica]) -> None:
    """Issue 34: MAX_RUNNING_TURNS_PER_USER (default 20) counts the user's turns on every replica, racing sends too."""
    a, b = replicas
    async with a.client() as on_a, b.client() as on_b:
        clients = [on_a, on_b] * 12
        chats = [await new_chat(client) for client in clients]
        try:
            sent = await asyncio.gather(
                *(send(client, sid, "/hang") for client, sid in zip(clients, chats, strict=True))
            )
            codes = [r.status_code for r in sent]
            assert codes.count(202) == 20 and codes.count(429) == 4, codes
            refused = next(r for r in sent if r.status_code == 429)
            assert refused.json()["code"] == "too_many_running_turns" and refused.headers["Retry-After"] == "10"
            # A stop on either replica frees a place on the other.
            running_on_a = next(
                sid
                for client, sid, r in zip(clients, chats, sent, strict=True)
                if client is on_a and r.status_code == 202
            )
            assert (await on_b.post(f"/api/sessions/{running_on_a}/stop")).json() == {"stopped": True}
            free = [sid for sid, r in zip(chats, sent, strict=True) if r.status_code == 429]
            assert (await send(on_b, free[0], "/hang")).status_code == 202
            assert (await send(on_a, free[1], "/hang")).status_code == 429
        finally:
            await asyncio.gather(*(on_a.post(f"/api/sessions/{sid}/stop") for sid in chats))


async def test_stop_on_b_ends_the_turn_running_on_a(replicas: list[Replica]) -> None:
    a, b = replicas
    async with a.client() as on_a, b.client() as on_b:
        session_id = await new_chat(on_a)
        turn = await send(on_a, session_id, "/slow 400 50")
        assert turn.status_code == 202
        after = turn.json()["afterEventId"]
        seen = await read_sse(on_b, f"/api/sessions/{session_id}/stream", last_event_id=after, stop_after=5)
        started = time.monotonic()
        stopped = await on_b.post(f"/api/sessions/{session_id}/stop")
        assert stopped.status_code == 200 and stopped.json() == {"stopped": True}, stopped.text
        assert time.monotonic() - started < 10
        rest = await read_sse(on_a, f"/api/sessions/{session_id}/stream", last_event_id=seen[-1][0])
        assert rest[-1][1]["type"] == "finish"
        saved = [m for m in await messages(on_a, session_id) if m["role"] == "assistant"]
        assert len(saved) == 1 and saved[0]["status"] == "canceled", saved
        spoken = text_of(seen + rest)
        assert spoken and saved[0]["content"] == spoken and len(spoken) < len(words("/slow 400 50"))
        assert (await on_a.get(f"/api/sessions/{session_id}")).json()["running"] is False


# -- A2A tasks across replicas ------------------------------------------------------------------------


async def _api_key(client: httpx.AsyncClient) -> str:
    response = await client.post("/api/a2a/keys", json={"name": "cluster"})
    assert response.status_code in (200, 201), response.text
    return response.json()["key"]


async def _rpc(replica: Replica, key: str, method: str, params: dict) -> dict:
    async with httpx.AsyncClient(base_url=replica.url, timeout=30) as client:  # the key, not the admin's login
        response = await client.post(
            f"/a2a/agents/{AGENT}",
            headers={"Authorization": f"Bearer {key}", "A2A-Version": "1.0"},
            json={"jsonrpc": "2.0", "id": "1", "method": method, "params": params},
        )
    assert response.status_code == 200, response.text
    return response.json()


async def test_subscribe_and_cancel_on_b_for_a_task_running_on_a(replicas: list[Replica]) -> None:
    a, b = replicas
    async with a.client() as on_a, httpx.AsyncClient(base_url=b.url, timeout=30) as on_b:
        key = await _api_key(on_a)
        message = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "/slow 30 30"}]}
        started = await _rpc(a, key, "SendMessage", {"message": message, "configuration": {"returnImmediately": True}})
        task_id = started["result"]["task"]["id"]
        texts: list[str] = []
        final = None
        async with on_b.stream(
            "POST",
            f"/a2a/agents/{AGENT}",
            headers={"Authorization": f"Bearer {key}", "A2A-Version": "1.0", "Accept": "text/event-stream"},
            json={"jsonrpc": "2.0", "id": "2", "method": "SubscribeToTask", "params": {"id": task_id}},
        ) as sub:
            assert sub.status_code == 200
            async for line in sub.aiter_lines():
                if not line.startswith("data:"):
                    continue
                result = json.loads(line[5:])
                assert "error" not in result, result
                update = result["result"].get("statusUpdate")
                if update is None:
                    continue
                for part in (update["status"].get("message") or {}).get("parts", []):
                    texts.append(part.get("text", ""))
                if update["status"]["state"] in {"TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED"}:
                    final = update["status"]["state"]
                    break
        assert final == "TASK_STATE_COMPLETED"
        assert words("/slow 30 30") in "".join(texts) or "".join(texts) == words("/slow 30 30")

        message = {"messageId": "m2", "role": "ROLE_USER", "parts": [{"text": "/slow 400 50"}]}
        started = await _rpc(a, key, "SendMessage", {"message": message, "configuration": {"returnImmediately": True}})
        task_id = started["result"]["task"]["id"]
        await asyncio.sleep(0.5)
        canceled = await _rpc(b, key, "CancelTask", {"id": task_id})
        assert "error" not in canceled, canceled
        assert canceled["result"]["status"]["state"] == "TASK_STATE_CANCELED"
        got = await _rpc(a, key, "GetTask", {"id": task_id})
        assert got["result"]["status"]["state"] == "TASK_STATE_CANCELED"


async def test_wrong_passwords_are_counted_across_the_replicas(
    replicas: list[Replica], backends: ClusterBackends, tmp_path: Path
) -> None:
    # A guesser spreading its attempts over the replicas gets LOGIN_MAX_FAILURES (10) in all, not 10 per replica.
    # From 127.0.0.2 and at an account of its own: this module's address (127.0.0.1) and admin keep their budgets.
    add_account(backends, tmp_path / "cli", "target", "target-password")
    clients = [
        httpx.AsyncClient(base_url=r.url, timeout=30, transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"))
        for r in replicas
    ]
    try:
        for i in range(10):
            guess = await clients[i % 2].get("/api/sessions", auth=("target", f"guess-{i}"))
            assert guess.status_code == 401, guess.text
        refused = await clients[1].get("/api/sessions", auth=("target", "target-password"))
        assert refused.status_code == 429 and refused.json()["code"] == "too_many_failed_logins", refused.text
        assert 0 < int(refused.headers["retry-after"]) <= 300
    finally:
        for client in clients:
            await client.aclose()


def test_a_replica_with_the_instance_id_of_a_running_one_refuses_to_start(
    replicas: list[Replica], backends: ClusterBackends, tmp_path: Path
) -> None:
    taken = replicas[1].instance_id
    with app_process(tmp_path / "data", **backends.env(INSTANCE_ID=taken, REPLICA_URL="http://127.0.0.1:1")) as app:
        assert app.process.wait(timeout=60) != 0
    assert f"another replica runs with INSTANCE_ID='{taken}'" in app.output, app.output


# -- Redis out of reach (issue 41) -------------------------------------------------------------------------

CUT_S = 10.0
OUTAGE_COMMAND = "/slow 300 50"  # about 15 s of tokens: the turns run before, through and after the cut


@pytest.fixture
def cut_replicas(
    backends: ClusterBackends, replicas: list[Replica], tmp_path: Path
) -> Iterator[tuple[list[Replica], ThreadedTcpProxy]]:
    """Two more replicas (the default lease) that reach Redis through a proxy the test cuts.

    Their keys are under a prefix of their own, so the module's pair (not cut) never sees their streams;
    the database (and its account, made for `replicas`) is the same.
    """
    with threaded_proxy(backends.redis_url) as proxy:
        proxied = dataclasses.replace(backends, redis_url=proxy.url, key_prefix=f"{backends.key_prefix}outage:")
        with start_replicas(proxied, tmp_path, name="outage", DEMO_MODEL_DELAY_MS="5") as started:
            for replica in started:
                warm_up(replica)
            yield started, proxy


async def test_a_10_s_redis_cut_during_4_turns_on_two_replicas_costs_no_turn(
    cut_replicas: tuple[list[Replica], ThreadedTcpProxy],
) -> None:
    """Issue 41: every turn completes with its whole text saved, its SSE readers on both replicas get every token
    and the end after the cut, and sends during the cut get 503 with a code (docs/ARCHITECTURE.md, "Cluster").
    """
    (a, b), proxy = cut_replicas
    async with a.client(timeout=120) as on_a, b.client(timeout=120) as on_b:
        owners = [on_a, on_b, on_a, on_b]
        sessions = [await new_chat(client) for client in owners]
        spares = [await new_chat(client) for client in (on_a, on_b)]
        afters = []
        for client, session_id in zip(owners, sessions, strict=True):
            started = await send(client, session_id, OUTAGE_COMMAND)
            assert started.status_code == 202, started.text
            afters.append(started.json()["afterEventId"])
        readers = [
            asyncio.create_task(read_sse(client, f"/api/sessions/{session_id}/stream", last_event_id=after))
            for session_id, after in zip(sessions, afters, strict=True)
            for client in (on_a, on_b)
        ]
        await asyncio.sleep(2.0)  # tokens flow on both replicas

        await asyncio.to_thread(proxy.cut)
        cut_at = time.monotonic()
        try:
            for client, spare in zip((on_a, on_b), spares, strict=True):
                refused = await send(client, spare, "hello during the cut")
                assert refused.status_code == 503, refused.text
                assert refused.json()["code"] == "redis_unavailable" and refused.headers["retry-after"], refused.text
                health = await client.get("/a2a/health")
                assert health.status_code == 503, health.text
                dependencies = health.json()["dependencies"]
                assert dependencies["redis"]["ok"] is False and dependencies["database"]["ok"] is True, dependencies
            assert not any(reader.done() for reader in readers)  # nobody was told the turn failed
            await asyncio.sleep(max(0.0, CUT_S - (time.monotonic() - cut_at)))
            held = [
                (await client.get("/a2a/health")).json()["dependencies"]["redis"]["heldEvents"]
                for client in (on_a, on_b)
            ]
            assert all(held), held  # both replicas' turns went on, their events waiting for Redis
        finally:
            await asyncio.to_thread(proxy.restore)

        results = await asyncio.wait_for(asyncio.gather(*readers), timeout=180)
        expected = words(OUTAGE_COMMAND)
        for n, events in enumerate(results):
            after = afters[n // 2]
            ids = [i for i, _ in events]
            assert ids == list(range(after + 1, after + 1 + len(ids))), (n, ids)
            assert events[0][1]["type"] == "start" and events[-1][1]["type"] == "finish", (n, events[-3:])
            assert not any(d.get("type") == "error" for _, d in events), (n, events)
            assert text_of(events) == expected, n

        for client, session_id in zip(owners, sessions, strict=True):
            saved = await messages(client, session_id)
            assert [m["role"] for m in saved] == ["user", "assistant"], saved
            assert saved[-1]["content"] == expected and saved[-1]["status"] == "complete", saved[-1]

        async def healthy(client: httpx.AsyncClient) -> bool:
            return (await client.get("/a2a/health")).status_code == 200

        for client, spare in zip((on_a, on_b), spares, strict=True):
            await wait_for(lambda client=client: healthy(client), timeout_s=30, what="health ok after the cut")
            again = await send(client, spare, "/slow 3 10")
            assert again.status_code == 202, again.text
            await read_sse(client, f"/api/sessions/{spare}/stream", last_event_id=again.json()["afterEventId"])


# -- a replica that dies ---------------------------------------------------------------------------------


async def test_a_turn_of_a_killed_replica_is_ended_by_the_other_within_the_lease(replicas: list[Replica]) -> None:
    a, b = replicas
    async with a.client() as on_a, b.client() as on_b:
        session_id = await new_chat(on_a)
        turn = await send(on_a, session_id, "/slow 400 50")
        assert turn.status_code == 202
        seen = await read_sse(
            on_b, f"/api/sessions/{session_id}/stream", last_event_id=turn.json()["afterEventId"], stop_after=10
        )
        a.app.process.send_signal(signal.SIGKILL)
        a.app.process.wait(timeout=10)
        killed = time.monotonic()
        rest = await read_sse(on_b, f"/api/sessions/{session_id}/stream", last_event_id=seen[-1][0])
        ended_after = time.monotonic() - killed
        assert rest[-1][1]["type"] == "finish"
        assert any(d.get("type") == "error" and "stopped" in d.get("errorText", "") for _, d in rest), rest
        # The lease, plus the reaper's period, plus a generous margin for a loaded machine.
        assert ended_after < LEASE_S * 2 + 10, ended_after

        async def saved() -> list[dict]:
            rows = [m for m in await messages(on_b, session_id) if m["role"] == "assistant"]
            return rows if rows and rows[0]["status"] != "streaming" else []

        [answer] = await wait_for(saved, what="the interrupted answer saved")
        assert answer["status"] == "interrupted"
        assert answer["content"] == text_of(seen + rest) and answer["content"]
        assert (await on_b.get(f"/api/sessions/{session_id}")).json()["running"] is False
        assert (await send(on_b, session_id, "/slow 3 10")).status_code == 202  # the session takes new turns
