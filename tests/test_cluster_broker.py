"""The broker across two replicas (issue 18, items 4 and 6; ARCHITECTURE.md, "Cluster: the broker across replicas").

Two real `python app.py` processes in cluster mode on one PostgreSQL database (created for this run) and one
Redis (a key prefix for this run); the example echo agent dials into A through the agent-side pipe. Everything
a test does goes through B, as a chat system or a user would. Under CI=true a missing server fails.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets
from sqlmodel import select

from core.auth import accounts
from core.broker.cluster import AgentDirectory, DuplicateReplicaError
from core.broker.inject import AUTO, Inject
from core.broker.service import Broker
from core.broker.store import INTERRUPTED, BrokerStore
from core.chat import agents as agents_store
from core.chat import sessions as sessions_store
from core.db import Database
from core.delegation.registry import AgentRegistry
from core.services import Services
from core.settings import Settings
from models import BrokerTaskRecord
from tests.conftest import make_settings, unavailable
from tests.utils.a2a_agents import echo_server
from tests.utils.broker import DISPATCH_HEADERS, RedisListener, redis_test_url
from tests.utils.broker_replicas import Replicas, echo_agent, listed_agents, two_replicas
from tests.utils.cluster import cluster_backends, redis_reachable
from tests.utils.ports import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.postgres]

ECHO_NAME = "Cluster Echo"


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory, postgres_server_url: str) -> Iterator[Replicas]:
    """Replicas A and B, module-scoped (starting two apps is the slow part)."""
    try:
        with (
            cluster_backends(postgres_server_url) as backends,
            two_replicas(backends, tmp_path_factory.mktemp("replicas"), OUTBOUND_ALLOW_HOSTS="127.0.0.1") as started,
        ):  # the HTTP A2A agent runs on this machine
            yield started
    except ConnectionError as exc:
        unavailable(str(exc))


@pytest.fixture(scope="module")
def echo_id(replicas: Replicas) -> Iterator[str]:
    """The echo agent, dialled into A (slow enough to cancel mid-task)."""
    agent_id = f"echo-{secrets.token_hex(3)}"
    with echo_agent(replicas.a.base_url, agent_id, delay_s=0.2, name=ECHO_NAME):
        yield agent_id


def chat_agent_number() -> int:
    """A chat agent id (seed 003 `agentId`) of this test only: its Redis channel is not shared with other runs."""
    return secrets.randbelow(10**12) + 10**6


async def wait_until(predicate, timeout: float = 20.0, interval: float = 0.1) -> None:
    """Poll the coroutine function `predicate` until it returns true."""
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(interval)


# -- item 4: the echo agent dialled into A, used through B ---------------------------------------


async def test_an_agent_on_a_is_listed_on_b_with_its_owner(replicas: Replicas, echo_id: str) -> None:
    """B lists the agent connected to A, card and tool included; stats tell the cluster from the replica."""
    assert echo_id in listed_agents(replicas.b.base_url)
    async with httpx.AsyncClient(timeout=10) as http:
        agents = (await http.get(f"{replicas.b.base_url}/a2a/agents")).json()["agents"]
        stats_b = (await http.get(f"{replicas.b.base_url}/a2a/stats")).json()
        stats_a = (await http.get(f"{replicas.a.base_url}/a2a/stats")).json()
    echo = next(a for a in agents if a["a2a_id"] == echo_id)
    assert echo["name"] == ECHO_NAME
    assert echo["tool"]["name"] == f"a2a_{echo_id}"
    assert [s["id"] for s in echo["skills"]] == ["echo"]
    # Stats count the cluster's agents; "here" is the replica's own sockets.
    assert stats_b["agentsOnline"] >= 1 and stats_b["cluster"]["agentsHere"] == 0
    assert stats_a["cluster"]["agentsHere"] >= 1
    assert stats_a["cluster"]["replica"] != stats_b["cluster"]["replica"]


async def test_dispatch_via_b_runs_on_a_and_injects_the_result(replicas: Replicas, echo_id: str) -> None:
    """A dispatch on B is acknowledged, runs on A, and its progress and one result reach the seed's channel."""
    chat_agent = chat_agent_number()
    text = f"hello across replicas {secrets.token_hex(3)}"
    async with RedisListener(replicas.redis_url, chat_agent) as redis, httpx.AsyncClient(timeout=15) as http:
        ack = (
            await http.post(
                f"{replicas.b.base_url}/a2a/tasks/dispatch",
                headers=DISPATCH_HEADERS,
                json={"task": text, "targetAgent": echo_id, "agentId": chat_agent, "chatId": "cluster-chat-1"},
            )
        ).json()
        assert ack["status"] == "accepted" and ack["taskId"]
        messages = await redis.wait(lambda ms: any(m["mode"] == "auto" for m in ms), timeout=30)
    results = [m for m in messages if m["mode"] == "auto"]
    assert len(results) == 1
    assert results[0] == {
        "channel": f"agent:events:{chat_agent}",
        "type": "inject_system_message",
        "agentId": chat_agent,
        "chatId": "cluster-chat-1",
        "text": f"[{ECHO_NAME}] {text}",
        "mode": "auto",
    }
    assert any(m["mode"] == "delay" for m in messages)  # progress came through too
    async with httpx.AsyncClient(timeout=10) as http:
        forwarded = (await http.get(f"{replicas.b.base_url}/a2a/stats")).json()["cluster"]["forwarded"]
    assert forwarded.get("dispatch", 0) >= 1


async def test_cancel_via_b_stops_the_task_on_a(replicas: Replicas, echo_id: str) -> None:
    """Cancel on B reaches the task running on A: one canceled result, and nothing left to cancel."""
    chat_agent = chat_agent_number()
    long_text = " ".join(f"word{i}" for i in range(200))  # 200 words at 0.2 s: 40 s unless canceled
    async with RedisListener(replicas.redis_url, chat_agent) as redis, httpx.AsyncClient(timeout=30) as http:
        ack = (
            await http.post(
                f"{replicas.b.base_url}/a2a/tasks/dispatch",
                headers=DISPATCH_HEADERS,
                json={"task": long_text, "targetAgent": echo_id, "agentId": chat_agent, "chatId": "cluster-chat-2"},
            )
        ).json()
        assert ack["status"] == "accepted"
        await redis.wait(lambda ms: any(m["mode"] == "delay" for m in ms), timeout=20)  # it runs on A
        canceled = (
            await http.post(
                f"{replicas.b.base_url}/a2a/tasks/cancel", headers=DISPATCH_HEADERS, json={"chatId": "cluster-chat-2"}
            )
        ).json()
        assert canceled == {"canceled": 1}
        messages = await redis.wait(lambda ms: any(m["mode"] == "auto" for m in ms), timeout=20)
        again = (
            await http.post(
                f"{replicas.b.base_url}/a2a/tasks/cancel", headers=DISPATCH_HEADERS, json={"chatId": "cluster-chat-2"}
            )
        ).json()
    assert [m["text"] for m in messages if m["mode"] == "auto"] == [f"[{ECHO_NAME}] The task was canceled."]
    assert again == {"canceled": 0}  # nothing runs any more, anywhere


async def test_a_duplicate_id_on_b_is_refused_with_4409(replicas: Replicas, echo_id: str) -> None:
    """A second agent with the id of A's agent is closed by B with 4409 before its card is asked for."""
    host_b = replicas.b.base_url.removeprefix("http://")
    async with websockets.connect(f"ws://{host_b}/a2a?a2a_id={echo_id}", open_timeout=10) as ws:
        with pytest.raises(websockets.ConnectionClosed) as closed:
            async with asyncio.timeout(20):
                async for frame in ws:  # a card request would mean it was not refused: answer nothing
                    assert "authenticatedExtendedCard" not in str(frame), "B asked the duplicate for its card"
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4409
    assert "already connected" in closed.value.rcvd.reason
    assert listed_agents(replicas.b.base_url) >= {echo_id}  # the first one is still there


async def test_the_internal_routes_take_only_the_internal_token(replicas: Replicas, echo_id: str) -> None:
    """`/a2a/internal/*`: no token or another token 401, an oversized body 413, an unknown field 422."""
    url = f"{replicas.a.base_url}/a2a/internal/dispatch"
    body = {
        "task": "x",
        "targetAgent": echo_id,
        "agentId": 1,
        "chatId": "c",
        "owner": "open",
        "taskId": "t-1",
        "origin": "elsewhere",
    }
    async with httpx.AsyncClient(timeout=10) as http:
        none = await http.post(url, json=body)
        dispatch_token = await http.post(url, json=body, headers=DISPATCH_HEADERS)
        auth = {"Authorization": f"Bearer {replicas.internal_token}"}
        too_big = await http.post(
            url,
            content=json.dumps({**body, "task": "x" * 300_000}),
            headers={**auth, "content-type": "application/json"},
        )
        unknown_field = await http.post(url, json={**body, "extra": 1}, headers=auth)
    assert none.status_code == 401 and dispatch_token.status_code == 401
    assert "INTERNAL_TOKEN" in none.json()["detail"]
    assert too_big.status_code == 413
    assert unknown_field.status_code == 422


# -- item 6: the app's own chat on B uses the agent on A in the background ---------------------------


async def test_background_dispatch_from_a_chat_on_b_reports_back_exactly_once(replicas: Replicas, echo_id: str) -> None:
    """`/background @echo …` on B, echo on A: its notes and one announcement land in the chat once each."""
    words = [f"w{i}-{secrets.token_hex(2)}" for i in range(5)]
    base = f"{replicas.b.base_url}/api"
    async with httpx.AsyncClient(timeout=20, auth=replicas.auth) as http:
        session = (await http.post(f"{base}/sessions", json={"agentId": "general-assistant"})).json()
        sid = session["id"]
        sent = await http.post(
            f"{base}/sessions/{sid}/messages", json={"content": f"/background @{echo_id} {' '.join(words)}"}
        )
        assert sent.status_code == 202, sent.text

        async def announced() -> bool:
            messages = (await http.get(f"{base}/sessions/{sid}/messages")).json()
            autos = [i for i, m in enumerate(messages) if m["injectMode"] == "auto"]
            return bool(autos) and any(
                m["role"] == "assistant" and m["status"] != "streaming" for m in messages[autos[0] + 1 :]
            )

        await wait_until(announced, timeout=60)
        await asyncio.sleep(3)  # anything delivered twice would be there by now
        messages = (await http.get(f"{base}/sessions/{sid}/messages")).json()
        tasks = (await http.get(f"{base}/tasks")).json()

    notes = [m for m in messages if m["injectMode"] is not None]
    autos = [m for m in notes if m["injectMode"] == "auto"]
    delays = [m["content"] for m in notes if m["injectMode"] == "delay"]
    assert [m["content"] for m in autos] == [f"[{ECHO_NAME}] {' '.join(words)}"]
    assert len(delays) == len(set(delays)) and f"[{ECHO_NAME}] Echoing 5 words…" in delays  # each once
    assert len({m["a2aTaskId"] for m in notes}) == 1
    roles = [m["role"] for m in messages]
    assert roles[:2] == ["user", "assistant"] and roles[-2:] == ["system", "assistant"], roles
    announcements = [m for m in messages[messages.index(autos[0]) + 1 :] if m["role"] == "assistant"]
    assert len(announcements) == 1 and " ".join(words) in announcements[0]["content"]
    # The side panel's task (recorded on B, run on A) followed the agent to its end.
    task = next(t for t in tasks if t["id"] == autos[0]["a2aTaskId"])
    assert task["state"] == "completed" and task["calleeAgentId"] == echo_id


async def test_registry_changes_on_a_reach_b(replicas: Replicas, echo_id: str) -> None:
    """A remote A2A agent registered on A joins B's registry (online there) and leaves it when removed on A.

    An agent edited on A reads the same on B; the id of the broker agent connected to A is taken on B too.
    """
    agent_id = f"http-echo-{secrets.token_hex(3)}"
    with echo_server() as card_url:
        async with httpx.AsyncClient(timeout=30, auth=replicas.auth) as http:
            taken = await http.post(
                f"{replicas.b.base_url}/api/a2a/remote-agents", json={"cardUrl": card_url, "id": echo_id}
            )
            assert taken.status_code == 409 and "connected to the broker" in taken.json()["detail"], taken.text
            registered = await http.post(
                f"{replicas.a.base_url}/api/a2a/remote-agents", json={"cardUrl": card_url, "id": agent_id}
            )
            assert registered.status_code == 201, registered.text

            async def online_on_b() -> bool:
                views = (await http.get(f"{replicas.b.base_url}/api/a2a/remote-agents")).json()
                return any(v["id"] == agent_id and v["online"] for v in views)

            await wait_until(online_on_b, timeout=20)  # in B's registry: B can delegate to it
            on_b = (await http.get(f"{replicas.b.base_url}/api/agents/{agent_id}")).json()
            assert on_b["kind"] == "remote-http" and on_b["online"] is True

            removed = await http.delete(f"{replicas.a.base_url}/api/a2a/remote-agents/{agent_id}")
            assert removed.status_code == 204

            async def gone_from_b() -> bool:
                listed = (await http.get(f"{replicas.b.base_url}/api/agents")).json()
                return agent_id not in {a["id"] for a in listed}

            await wait_until(gone_from_b, timeout=20)

            new_name = f"Renamed {secrets.token_hex(2)}"
            edited = await http.patch(f"{replicas.a.base_url}/api/agents/general-assistant", json={"name": new_name})
            assert edited.status_code == 200, edited.text
            assert (await http.get(f"{replicas.b.base_url}/api/agents/general-assistant")).json()["name"] == new_name


# -- start-up recovery in cluster mode (no replicas needed) ----------------------------------------


async def test_recovery_ends_this_replicas_tasks_and_those_of_gone_replicas_only(
    postgres_url: str, tmp_path: Path
) -> None:
    """At start a replica ends its own cut-off tasks and a dead replica's, never a live one's.

    A second process with a live replica's INSTANCE_ID is refused.
    """
    redis_url = redis_test_url()
    if problem := redis_reachable(redis_url):
        unavailable(problem)
    prefix = f"a2a-test-{secrets.token_hex(4)}:"

    def settings_of(instance: str) -> Settings:
        return make_settings(
            tmp_path / instance,
            database_url=postgres_url,
            cluster=True,
            instance_id=instance,
            redis={"url": redis_url, "key_prefix": prefix},
            cluster_lease_s=1.0,
            replica_url=f"http://127.0.0.1:{free_port()}",
            internal_token="t",
            storage_secret="s",
        )

    db = Database(postgres_url)
    db.migrate()
    live = AgentDirectory(redis_url, prefix, "live", "http://127.0.0.1:1", lease_s=60)
    try:
        for instance in ("me", "live", "dead"):
            await BrokerStore(db, instance).add_task(
                task_id=f"task-{instance}",
                owner="open",
                target_agent="echo",
                agent_name="Echo",
                chat_agent_id=7,
                chat_id=f"chat-{instance}",
                session_id=None,
                task=f"work of {instance}",
            )
        await live.claim_replica()  # "live" runs; "dead" left its tasks and is gone

        ended = await Broker(settings_of("me"), AgentRegistry(db)).recover()
        async with db.session() as s:
            rows = {r.id: r for r in (await s.exec(select(BrokerTaskRecord))).all()}
        assert ended == 2
        assert rows["task-live"].finished_at is None and rows["task-live"].instance == "live"
        for task_id in ("task-me", "task-dead"):
            assert rows[task_id].finished_at is not None and rows[task_id].state == "failed"
            assert rows[task_id].instance == "me"  # adopted: this replica sends its result
        assert sorted(r.id for r in rows.values() if r.result is not None) == ["task-dead", "task-me"]

        with pytest.raises(DuplicateReplicaError, match="INSTANCE_ID"):
            await Broker(settings_of("live"), AgentRegistry(db)).recover()
    finally:
        await live.stop()
        await db.close()
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(redis_url)
        keys = [k async for k in client.scan_iter(match=f"{prefix}*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


async def test_a_gone_replicas_tasks_end_once_when_the_reaper_and_a_starting_replica_adopt_them_at_once(
    postgres_url: str,
) -> None:
    """The reaper of one replica and the start of another adopt a dead replica's tasks together: each ends once.

    The reaper ends only the dead replica's tasks, never its own running ones.
    """
    db = Database(postgres_url)
    db.migrate()
    reaper_db, starting_db = Database(postgres_url), Database(postgres_url)  # two replicas: two connection pools
    try:
        dead_tasks = [f"task-dead-{n}" for n in range(20)]
        for task_id, instance in [(t, "dead") for t in dead_tasks] + [("task-reaper", "reaper")]:
            await BrokerStore(db, instance).add_task(
                task_id=task_id,
                owner="open",
                target_agent="echo",
                agent_name="Echo",
                chat_agent_id=7,
                chat_id="chat",
                session_id=None,
                task="work",
            )
        reaped, started = await asyncio.gather(
            BrokerStore(reaper_db, "reaper").adopt_running({"dead"}, sent=False),
            BrokerStore(starting_db, "starting").interrupt_running(sent=False, adopt={"dead"}),
        )
        async with db.session() as s:
            rows = {r.id: r for r in (await s.exec(select(BrokerTaskRecord))).all()}
        assert all(rows[t].result == f"[Echo] {INTERRUPTED}" for t in dead_tasks)
        assert len(reaped) + started == len(dead_tasks)  # each ended once: by one of the two, not both
        reaped_ids = {i.inject.task_id for i in reaped}
        assert reaped_ids == {t for t in dead_tasks if rows[t].instance == "reaper"}
        assert {t for t in dead_tasks if rows[t].instance == "starting"} == set(dead_tasks) - reaped_ids
        assert all(i.inject.text == f"[Echo] {INTERRUPTED}" and i.to_redis for i in reaped)  # Redis never had them
        assert rows["task-reaper"].finished_at is None  # the reaper's own running task
    finally:
        for database in (db, reaper_db, starting_db):
            await database.close()


# -- a replica killed for good: the reaper of a live replica ends its tasks --------------------------

REAPED_LEASE_S = 4.0  # short, as in tests/test_cluster.py: a replica killed is noticed within about this


async def test_a_killed_replicas_tasks_are_ended_by_the_reaper_of_a_live_one(
    postgres_server_url: str, tmp_path: Path
) -> None:
    """A kill -9 of A, nothing restarted: B's reaper ends A's task with one result; B's own task runs on.

    A pair of its own (this test kills A) with a short lease.
    """
    doomed_chat, survivor_chat = chat_agent_number(), chat_agent_number()
    long_text = " ".join(f"word{i}" for i in range(300))  # 300 words at 0.2 s: a minute unless ended
    agent_a, agent_b = f"echo-a-{secrets.token_hex(3)}", f"echo-b-{secrets.token_hex(3)}"
    try:
        with (
            cluster_backends(postgres_server_url) as backends,
            two_replicas(backends, tmp_path, CLUSTER_LEASE_S=str(REAPED_LEASE_S)) as pair,
            echo_agent(pair.a.base_url, agent_a, delay_s=0.2),
            echo_agent(pair.b.base_url, agent_b, delay_s=0.2),
        ):
            async with (
                RedisListener(pair.redis_url, doomed_chat, survivor_chat) as redis,
                httpx.AsyncClient(timeout=15) as http,
            ):
                task_ids = {}
                for chat_agent, target in ((doomed_chat, agent_a), (survivor_chat, agent_b)):
                    ack = (
                        await http.post(
                            f"{pair.b.base_url}/a2a/tasks/dispatch",
                            headers=DISPATCH_HEADERS,
                            json={
                                "task": long_text,
                                "targetAgent": target,
                                "agentId": chat_agent,
                                "chatId": f"chat-{chat_agent}",
                            },
                        )
                    ).json()
                    assert ack["status"] == "accepted", ack
                    task_ids[chat_agent] = ack["taskId"]

                def of(chat_agent: int, mode: str) -> list[dict]:
                    return [m for m in redis.messages if m["agentId"] == chat_agent and m["mode"] == mode]

                await redis.wait(lambda _: of(doomed_chat, "delay") and of(survivor_chat, "delay"), timeout=30)
                pair.a.process.kill()  # kill -9: A ends nothing and never comes back
                pair.a.process.wait(timeout=10)
                killed = time.monotonic()
                await redis.wait(lambda _: of(doomed_chat, "auto"), timeout=60)
                ended_after = time.monotonic() - killed
                survivor_progress = len(of(survivor_chat, "delay"))
                await asyncio.sleep(1.5)  # a second result would be there by now
                results = of(doomed_chat, "auto")
                survivor_results = of(survivor_chat, "auto")
                still_running = len(of(survivor_chat, "delay")) > survivor_progress
            # The lease, plus the reaper's period, plus a generous margin for a loaded machine.
            assert ended_after < REAPED_LEASE_S * 2 + 10, ended_after
            assert [m["text"] for m in results] == [f"[Echo] {INTERRUPTED}"]
            assert survivor_results == [] and still_running  # B's own task was not touched
            db = Database(backends.database_url)
            try:
                async with db.session() as s:
                    rows = {r.id: r for r in (await s.exec(select(BrokerTaskRecord))).all()}
            finally:
                await db.close()
            doomed, survivor = rows[task_ids[doomed_chat]], rows[task_ids[survivor_chat]]
            assert doomed.state == "failed" and doomed.finished_at is not None
            assert doomed.instance == survivor.instance == f"replica-{pair.b.base_url.rsplit(':', 1)[1]}"
            assert survivor.finished_at is None
    except ConnectionError as exc:
        unavailable(str(exc))


async def test_a_background_task_on_a_killed_replica_ends_in_the_dispatching_replicas_panel_and_chat(
    postgres_server_url: str, tmp_path: Path
) -> None:
    """`/background @<agent on A>` in a chat on B, then kill -9 of A: B's side panel ends the task, the chat hears once.

    B watches the task A runs (its side panel); no end will come from A, so B ends it as interrupted when A's key
    expires, and B's reaper ends A's row and tells the chat, once.
    """
    agent_a = f"echo-a-{secrets.token_hex(3)}"
    long_text = " ".join(f"word{i}" for i in range(300))  # 300 words at 0.2 s: a minute unless ended
    try:
        with (
            cluster_backends(postgres_server_url) as backends,
            two_replicas(backends, tmp_path, CLUSTER_LEASE_S=str(REAPED_LEASE_S)) as pair,
            echo_agent(pair.a.base_url, agent_a, delay_s=0.2),
        ):
            base = f"{pair.b.base_url}/api"
            async with httpx.AsyncClient(timeout=20, auth=pair.auth) as http:
                sid = (await http.post(f"{base}/sessions", json={"agentId": "general-assistant"})).json()["id"]
                sent = await http.post(
                    f"{base}/sessions/{sid}/messages", json={"content": f"/background @{agent_a} {long_text}"}
                )
                assert sent.status_code == 202, sent.text

                async def notes(mode: str) -> list[dict]:
                    messages = (await http.get(f"{base}/sessions/{sid}/messages")).json()
                    return [m for m in messages if m["injectMode"] == mode]

                await wait_until(lambda: notes("delay"), timeout=30)
                [task] = (await http.get(f"{base}/tasks")).json()
                assert task["state"] == "working"
                pair.a.process.kill()  # kill -9: A ends nothing and never comes back
                pair.a.process.wait(timeout=10)

                async def panel_ended() -> bool:
                    tasks = (await http.get(f"{base}/tasks")).json()
                    return tasks[0]["state"] == "failed"

                await wait_until(panel_ended, timeout=REAPED_LEASE_S * 2 + 20)
                await wait_until(lambda: notes("auto"), timeout=REAPED_LEASE_S * 2 + 20)
                await asyncio.sleep(1.5)  # a second result would be there by now
                results = await notes("auto")
                [task] = (await http.get(f"{base}/tasks")).json()
            assert [m["content"] for m in results] == [f"[Echo] {INTERRUPTED}"]
            assert task["state"] == "failed" and "replica running it stopped" in (task["error"] or "")
    except ConnectionError as exc:
        unavailable(str(exc))


# -- every replica's inbox: the notes of the tasks it relays, each result once ----------------------


async def test_every_replicas_inbox_delivers_what_it_relays_and_a_result_sent_on_both_is_saved_once(
    postgres_url: str, tmp_path: Path
) -> None:
    """Results published on any replica reach the chat, and a result sent on both replicas is saved once.

    Two replicas' services in this process, one database: each replica's inbox saves the notes of what its
    own broker publishes; the same result published on both (a replica that adopted a gone one's task while
    it came back) is saved and announced once, by its position; with one replica stopped, the other delivers.
    """
    redis_url = redis_test_url()
    if problem := redis_reachable(redis_url):
        unavailable(problem)
    prefix = f"a2a-test-{secrets.token_hex(4)}:"
    db = Database(postgres_url)
    db.migrate()
    async with db.session() as s:  # cluster mode runs with accounts only
        user = await accounts.create_user(s, username="alice", password=secrets.token_urlsafe(12), admin=True)
    await db.close()
    replicas = []
    for instance in ("inbox-a", "inbox-b"):
        services = Services.build(
            make_settings(
                tmp_path / instance,
                database_url=postgres_url,
                cluster=True,
                instance_id=instance,
                redis={"url": redis_url, "key_prefix": prefix},
                replica_url=f"http://127.0.0.1:{free_port()}",
                internal_token="t",
                storage_secret="s",
            )
        )
        services.prepare()
        await services.start()
        replicas.append(services)
    a, b = replicas
    try:
        async with a.db.session() as s:
            agent = await agents_store.get_agent_by_slug(s, "general-assistant")
            sid = (await sessions_store.create_session(s, user_id=user.id, agent_id=agent.id)).id

        def result(task_id: str) -> Inject:
            return Inject(
                agent_id=agent.id,
                chat_id=sid,
                text=f"[Echo] result of {task_id}",
                mode=AUTO,
                task_id=task_id,
                session_id=sid,
            )

        async def notes_and_announcements() -> tuple[list[str], int]:
            async with a.db.session() as s:
                rows = await sessions_store.list_messages(s, session_id=sid)
            notes = [m.content for m in rows if m.inject_mode == AUTO]
            return notes, sum(1 for m in rows if m.role == "assistant" and m.status != "streaming")

        async def settled(notes: int) -> bool:
            got, announced = await notes_and_announcements()
            return len(got) >= notes and announced >= notes and not any(r.chat.is_running(sid) for r in replicas)

        await b.broker.injects.publish(result("t-1"))  # published on either replica
        await a.broker.injects.publish(result("t-1"))  # the same result again, on the other
        await wait_until(lambda: settled(1), timeout=30)
        await asyncio.sleep(1.5)  # a second note or announcement would be there by now
        assert await notes_and_announcements() == (["[Echo] result of t-1"], 1)

        await a.stop()
        replicas.remove(a)
        await b.broker.injects.publish(result("t-2"))
        await wait_until(lambda: settled(2), timeout=30)
        await asyncio.sleep(1.5)
        notes, announced = await notes_and_announcements()
        assert notes == ["[Echo] result of t-1", "[Echo] result of t-2"] and announced == 2
    finally:
        for services in replicas:
            await services.stop()
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(redis_url)
        keys = [k async for k in client.scan_iter(match=f"{prefix}*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
