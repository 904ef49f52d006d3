"""The broker against a live server: a real WebSocket client plays the remote agent of seed 003,
a real Redis subscriber checks the injects (texts, modes, throttling, idle timeout, cancel).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import websockets

from core.broker.service import Broker
from core.services import Services
from tests.conftest import make_settings, unavailable
from tests.utils.broker import (
    DISPATCH_HEADERS,
    FakeAgent,
    RedisListener,
    artifact_update,
    broker_app,
    redis_test_url,
    serve_app,
    status_update,
    task_event,
    travel_card,
    wait_for,
)
from tests.utils.cluster import redis_reachable


@pytest.fixture
async def redis_url() -> str:
    """A reachable Redis (skip, or fail under CI=true, without one)."""
    url = redis_test_url()
    if (reason := redis_reachable(url)) is not None:
        unavailable(reason)
    return url


def chat_agent_id() -> int:
    """A fresh numeric chat agent id: its channel `agent:events:<id>` is this test's alone."""
    return random.randint(10**9, 10**10)


@asynccontextmanager
async def running(
    tmp_path: Path, *, with_api: bool = False, **overrides
) -> AsyncIterator[tuple[str, Services, Broker, httpx.AsyncClient]]:
    services = Services.build(make_settings(tmp_path, **overrides))
    services.prepare()
    async with (
        serve_app(broker_app(services, with_api=with_api)) as host,
        httpx.AsyncClient(base_url=f"http://{host}", headers=DISPATCH_HEADERS, timeout=10) as http,
    ):
        yield host, services, services.broker, http


async def dispatch(
    http: httpx.AsyncClient, task: str, *, target: str = "travel", agent_id=123, chat_id: str = "abc"
) -> dict:
    response = await http.post(
        "/a2a/tasks/dispatch",
        json={"task": task, "targetAgent": target, "agentId": agent_id, "chatId": chat_id, "macAddress": "aa:bb"},
    )
    assert response.status_code == 200, response.text
    return response.json()


# -- connecting and discovery -------------------------------------------------------------------


async def test_agents_connect_and_are_discovered_by_binding(tmp_path: Path) -> None:
    async with running(tmp_path) as (host, services, broker, http):
        travel = await FakeAgent.connect(host, a2a_id="travel", agent_id="123", wait_registered=broker)
        weather = await FakeAgent.connect(
            host, card={**travel_card("Weather"), "skills": []}, a2a_id="weather", wait_registered=broker
        )
        legacy = await FakeAgent.connect(
            host, card=travel_card("Legacy"), a2a_id="legacy", agentId="7", wait_registered=broker
        )

        bound = (await http.get("/a2a/agents", params={"agent_id": "123"})).json()["agents"]
        assert [a["a2a_id"] for a in bound] == ["travel", "weather"]
        [travel_view] = [a for a in bound if a["a2a_id"] == "travel"]
        assert travel_view["name"] == "出行助手" and travel_view["agent_id"] == "123"
        assert travel_view["skills"] == [
            {"id": "train", "name": "火车票查询", "description": "High-speed train tickets"}
        ]
        tool = travel_view["tool"]
        assert tool["name"] == "a2a_travel" and "火车票查询" in tool["description"]
        assert tool["inputSchema"] == {
            "type": "object",
            "properties": {"task": {"type": "string", "description": "The complete task for 出行助手"}},
            "required": ["task"],
        }
        other = (await http.get("/a2a/agents", params={"agent_id": "999"})).json()["agents"]
        assert [a["a2a_id"] for a in other] == ["weather"]
        assert [a["a2a_id"] for a in (await http.get("/a2a/agents", params={"agent_id": "7"})).json()["agents"]] == [
            "legacy",
            "weather",
        ]
        everything = (await http.get("/a2a/agents")).json()["agents"]
        assert [a["a2a_id"] for a in everything] == ["legacy", "travel", "weather"]

        # One registry: the connection is the remote agent the chat delegates to.
        remote = services.registry.remote("travel")
        assert remote is broker.connection("travel") and remote.kind == "ws" and remote.name == "出行助手"
        await travel.close()
        await wait_for(lambda: services.registry.remote("travel") is None)
        assert [a["a2a_id"] for a in (await http.get("/a2a/agents")).json()["agents"]] == ["legacy", "weather"]
        await weather.close()
        await legacy.close()


async def close_of(agent: FakeAgent) -> tuple[int, str]:
    await asyncio.wait_for(agent.ws.wait_closed(), 5)
    return agent.ws.close_code, agent.ws.close_reason


async def test_ids_taken_by_local_or_online_agents_are_refused_with_a_reason(tmp_path: Path) -> None:
    async with running(tmp_path, request_timeout=500) as (host, services, broker, http):
        local = await FakeAgent.connect(host, a2a_id="coding-assistant")
        code, reason = await close_of(local)
        assert code == 4409 and "local agent" in reason

        first = await FakeAgent.connect(host, a2a_id="travel", wait_registered=broker)
        twin = await FakeAgent.connect(host, a2a_id="travel")
        code, reason = await close_of(twin)
        assert code == 4409 and "already connected" in reason
        assert broker.connection("travel") is not None  # the first one is undisturbed

        bad_card = await FakeAgent.connect(
            host, card={"description": "no name", "skills": [{"id": "x"}]}, a2a_id="nameless"
        )
        code, reason = await close_of(bad_card)
        assert code == 4400 and "lacks name" in reason and "skills[0]" in reason

        silent = await FakeAgent.connect(host, card=None, a2a_id="silent")  # never answers the card request
        code, reason = await close_of(silent)
        assert code == 4408 and "500 ms" in reason

        for query, says in [
            ("", "a2a_id= is required"),
            ("a2a_id=Bad%20Id", "not a valid id"),
            ("a2a_id=x&cardUrl=file:///etc/passwd", "cardUrl"),
        ]:
            with pytest.raises(websockets.InvalidStatus) as refused:
                await websockets.connect(f"ws://{host}/a2a?{query}", open_timeout=5)
            assert refused.value.response.status_code == 400
            assert says in refused.value.response.body.decode()
        stats = (await http.get("/a2a/stats")).json()
        assert stats["connections"] == {"total": 1, "refused": 7}
        await first.close()


async def test_the_card_can_come_from_a_card_url(tmp_path: Path) -> None:
    services = Services.build(make_settings(tmp_path, outbound_allow_hosts=["127.0.0.1"]))  # the card is local
    services.prepare()
    app = broker_app(services)

    @app.get("/cards/weather.json")
    async def card() -> dict:
        return {**travel_card("Weather"), "skills": [{"id": "forecast", "name": "Forecast"}]}

    async with serve_app(app) as host:
        agent = await FakeAgent.connect(
            host,
            card=None,
            a2a_id="weather",
            cardUrl=f"http://{host}/cards/weather.json",
            wait_registered=services.broker,
        )
        conn = services.broker.connection("weather")
        assert conn.name == "Weather" and conn.card()["skills"] == [{"id": "forecast", "name": "Forecast"}]
        await agent.close()


# -- dispatch, progress and the return path --------------------------------------------------------------


async def test_a_dispatched_task_streams_back_as_injects_exactly_as_the_seed_shows(
    tmp_path: Path, redis_url: str
) -> None:
    chat_agent = chat_agent_id()
    async with (
        running(tmp_path, redis={"url": redis_url}) as (host, services, broker, http),
        RedisListener(redis_url, chat_agent) as listener,
    ):
        agent = await FakeAgent.connect(host, a2a_id="travel", wait_registered=broker)
        ack = await dispatch(http, "帮我查明天到上海的高铁并比价", agent_id=chat_agent)
        assert ack["status"] == "accepted" and len(ack["taskId"]) == 36

        request = await agent.next_request("message/stream")
        message = request["params"]["message"]
        assert request["jsonrpc"] == "2.0" and isinstance(request["id"], int)
        assert message["role"] == "user"
        assert message["parts"] == [{"kind": "text", "text": "帮我查明天到上海的高铁并比价"}]
        assert str(uuid.UUID(message["messageId"])) == message["messageId"]  # seed 003: "messageId": "<uuid>"
        await agent.result(request["id"], task_event("t1"))
        await agent.working(request["id"], "已查到 6 个车次…")
        await agent.result(request["id"], status_update("t1", "completed", "已订好备选，最优 G1234。", final=True))

        messages = await listener.wait(lambda m: len(m) == 2)
        assert messages == [
            {
                "channel": f"agent:events:{chat_agent}",
                "type": "inject_system_message",
                "agentId": chat_agent,
                "chatId": "abc",
                "text": "[出行助手] 已查到 6 个车次…",
                "mode": "delay",
            },
            {
                "channel": f"agent:events:{chat_agent}",
                "type": "inject_system_message",
                "agentId": chat_agent,
                "chatId": "abc",
                "text": "[出行助手] 已订好备选，最优 G1234。",
                "mode": "auto",
            },
        ]
        await broker.injects.flushed()
        stats = (await http.get("/a2a/stats")).json()
        assert stats["tasks"]["byState"] == {"running": 0, "completed": 1}
        assert stats["eventsRelayed"] == 3 and stats["injects"]["sent"] == 2 and stats["redis"] == "up"
        [done] = broker.recent_tasks()
        assert (done.state, done.remote_task_id, done.chat_agent_id) == ("completed", "t1", chat_agent)
        await agent.close()


async def test_many_tasks_share_one_socket_and_several_lines_share_one_frame(tmp_path: Path, redis_url: str) -> None:
    chat_agent = chat_agent_id()
    async with (
        running(tmp_path, redis={"url": redis_url}) as (host, services, broker, http),
        RedisListener(redis_url, chat_agent) as listener,
    ):
        agent = await FakeAgent.connect(host, a2a_id="travel", wait_registered=broker)
        acks = [await dispatch(http, f"task {i}", agent_id=chat_agent, chat_id=f"chat-{i}") for i in range(3)]
        requests = [await agent.next_request("message/stream") for _ in acks]
        by_text = {r["params"]["message"]["parts"][0]["text"]: r["id"] for r in requests}
        assert len(set(by_text.values())) == 3
        # Answers interleaved, all in one frame; artifacts carry the results (one appended in two chunks).
        frame = []
        for i in (2, 0, 1):
            rid = by_text[f"task {i}"]
            frame += [{"jsonrpc": "2.0", "id": rid, "result": artifact_update(f"r{i}", f"result {i}")}]
        frame.append(
            {"jsonrpc": "2.0", "id": by_text["task 1"], "result": artifact_update("r1", " (more)", append=True)}
        )
        for i in range(3):
            frame.append(
                {
                    "jsonrpc": "2.0",
                    "id": by_text[f"task {i}"],
                    "result": status_update(f"r{i}", "completed", final=True),
                }
            )
        await agent.send(*frame)
        messages = await listener.wait(lambda m: sum(x["mode"] == "auto" for x in m) == 3)
        assert sorted((m["chatId"], m["text"], m["mode"]) for m in messages) == [
            ("chat-0", "[出行助手] result 0", "auto"),
            ("chat-0", "[出行助手] result 0", "delay"),  # seed 003: artifact text is progress too
            ("chat-1", "[出行助手] result 1", "delay"),  # " (more)" came within the throttle interval
            ("chat-1", "[出行助手] result 1 (more)", "auto"),
            ("chat-2", "[出行助手] result 2", "auto"),
            ("chat-2", "[出行助手] result 2", "delay"),
        ]
        assert {t.id for t in broker.recent_tasks()} == {a["taskId"] for a in acks}
        await agent.close()


async def test_progress_is_throttled_per_task_leading_edge_and_results_never(tmp_path: Path, redis_url: str) -> None:
    chat_agent = chat_agent_id()
    async with (
        running(tmp_path, redis={"url": redis_url}, inject_min_interval=400) as (host, _, broker, http),
        RedisListener(redis_url, chat_agent) as listener,
    ):
        agent = await FakeAgent.connect(host, a2a_id="travel", wait_registered=broker)
        await dispatch(http, "one", agent_id=chat_agent, chat_id="one")
        first = await agent.next_request("message/stream")
        await dispatch(http, "two", agent_id=chat_agent, chat_id="two")
        second = await agent.next_request("message/stream")
        # A burst: only the first progress of each task passes; the rest are dropped, not deferred.
        for i in range(5):
            await agent.working(first["id"], f"one step {i}", "t1")
            await agent.working(second["id"], f"two step {i}", "t2")
        await listener.wait(lambda m: len(m) == 2)
        await asyncio.sleep(0.5)  # the window is over: the next progress passes again
        await agent.working(first["id"], "one step 5", "t1")
        await agent.working(first["id"], "one step 6", "t1")  # inside the new window: dropped
        await agent.result(first["id"], status_update("t1", "completed", "one done", final=True))  # never throttled
        await agent.result(second["id"], status_update("t2", "failed", "no seats", final=True))
        messages = await listener.wait(lambda m: len(m) == 5)
        await asyncio.sleep(0.1)
        per_chat = {c: [(m["text"], m["mode"]) for m in listener.messages if m["chatId"] == c] for c in ("one", "two")}
        assert per_chat == {  # in order within a task (tasks are independent of each other)
            "one": [
                ("[出行助手] one step 0", "delay"),
                ("[出行助手] one step 5", "delay"),
                ("[出行助手] one done", "auto"),
            ],
            "two": [("[出行助手] two step 0", "delay"), ("[出行助手] The task failed: no seats", "auto")],
        }
        assert len(messages) == 5
        stats = (await http.get("/a2a/stats")).json()
        assert stats["injects"]["throttled"] == 9 and stats["tasks"]["byState"]["failed"] == 1
        await agent.close()


async def test_artifact_updates_are_progress_injects_of_their_own_and_throttled(tmp_path: Path, redis_url: str) -> None:
    """Seed 003 injects the text of every event: an artifact-update is a `delay` too, under the same throttle."""
    chat_agent = chat_agent_id()
    async with (
        running(tmp_path, redis={"url": redis_url}, inject_min_interval=400) as (host, _, broker, http),
        RedisListener(redis_url, chat_agent) as listener,
    ):
        agent = await FakeAgent.connect(host, a2a_id="travel", wait_registered=broker)
        await dispatch(http, "查车次", agent_id=chat_agent, chat_id="c1")
        rid = (await agent.next_request("message/stream"))["id"]
        await agent.result(rid, artifact_update("t1", "G1234 08:00"))
        await listener.wait(lambda m: len(m) == 1)
        await agent.result(rid, artifact_update("t1", " 二等座", append=True))  # inside the window: dropped
        await asyncio.sleep(0.5)
        await agent.result(rid, artifact_update("t1", " ¥553", append=True))  # the window is over: passes
        await listener.wait(lambda m: len(m) == 2)
        await agent.result(rid, status_update("t1", "completed", final=True))
        messages = await listener.wait(lambda m: len(m) == 3)
        assert [(m["text"], m["mode"]) for m in messages] == [
            ("[出行助手] G1234 08:00", "delay"),
            ("[出行助手]  ¥553", "delay"),
            ("[出行助手] G1234 08:00 二等座 ¥553", "auto"),
        ]  # the result is the whole artifact
        assert (await http.get("/a2a/stats")).json()["injects"]["throttled"] == 1
        await agent.close()


async def test_an_idle_task_times_out_is_canceled_at_the_agent_and_reported(tmp_path: Path, redis_url: str) -> None:
    chat_agent = chat_agent_id()
    async with (
        running(tmp_path, redis={"url": redis_url}, task_idle_timeout=300) as (host, _, broker, http),
        RedisListener(redis_url, chat_agent) as listener,
    ):
        agent = await FakeAgent.connect(host, a2a_id="travel", wait_registered=broker)
        await dispatch(http, "slow", agent_id=chat_agent)
        request = await agent.next_request("message/stream")
        await agent.result(request["id"], task_event("t-slow", "working"))
        await agent.working(request["id"], "working on it", "t-slow")
        cancel = await agent.next_request("tasks/cancel", timeout=3)
        assert cancel["params"] == {"id": "t-slow"}
        messages = await listener.wait(lambda m: len(m) == 2)
        assert [(m["text"], m["mode"]) for m in messages] == [
            ("[出行助手] working on it", "delay"),
            ("[出行助手] The task timed out: 出行助手 sent no progress for 0.3 s.", "auto"),
        ]
        await agent.result(cancel["id"], task_event("t-slow", "canceled"))
        # Late events of the finished task are dropped; nothing else is disturbed.
        await agent.working(request["id"], "too late", "t-slow")
        await wait_for(lambda: broker.conn_stats.unknown_responses >= 1)
        assert broker.stats()["tasks"]["byState"]["timeout"] == 1 and len(listener.messages) == 2
        await agent.close()


async def test_cancel_by_chat_id_cancels_that_chats_tasks_at_the_agent(tmp_path: Path, redis_url: str) -> None:
    chat_agent = chat_agent_id()
    async with (
        running(tmp_path, redis={"url": redis_url}) as (host, _, broker, http),
        RedisListener(redis_url, chat_agent) as listener,
    ):
        agent = await FakeAgent.connect(host, a2a_id="travel", wait_registered=broker)
        await dispatch(http, "a1", agent_id=chat_agent, chat_id="A")
        a1 = await agent.next_request("message/stream")
        await dispatch(http, "a2", agent_id=chat_agent, chat_id="A")
        a2 = await agent.next_request("message/stream")
        await dispatch(http, "b1", agent_id=chat_agent, chat_id="B")
        b1 = await agent.next_request("message/stream")
        await agent.result(a1["id"], task_event("ta1", "working"))
        await wait_for(lambda: any(t.remote_task_id == "ta1" for t in broker.running_tasks()))
        # a2 has not named its task yet: it is canceled as soon as it does.

        response = await http.post("/a2a/tasks/cancel", json={"chatId": "A"})
        assert response.json() == {"canceled": 2}
        cancel_a1 = await agent.next_request("tasks/cancel")
        assert cancel_a1["params"] == {"id": "ta1"}
        await agent.result(a2["id"], task_event("ta2", "working"))
        cancel_a2 = await agent.next_request("tasks/cancel")
        assert cancel_a2["params"] == {"id": "ta2"}

        await agent.result(b1["id"], status_update("tb1", "completed", "b done", final=True))
        messages = await listener.wait(lambda m: len(m) == 3)
        assert sorted((m["chatId"], m["text"], m["mode"]) for m in messages) == [
            ("A", "[出行助手] The task was canceled.", "auto"),
            ("A", "[出行助手] The task was canceled.", "auto"),
            ("B", "[出行助手] b done", "auto"),
        ]
        assert (await http.post("/a2a/tasks/cancel", json={"chatId": "A"})).json() == {"canceled": 0}
        await agent.close()


async def test_an_agent_that_disconnects_fails_its_tasks_with_auto_injects(tmp_path: Path, redis_url: str) -> None:
    chat_agent = chat_agent_id()
    async with (
        running(tmp_path, redis={"url": redis_url}) as (host, services, broker, http),
        RedisListener(redis_url, chat_agent) as listener,
    ):
        agent = await FakeAgent.connect(host, a2a_id="travel", wait_registered=broker)
        await dispatch(http, "x", agent_id=chat_agent, chat_id="x")
        await dispatch(http, "y", agent_id=chat_agent, chat_id="y")
        await agent.next_request("message/stream")
        await agent.next_request("message/stream")
        await agent.close()
        messages = await listener.wait(lambda m: len(m) == 2)
        assert {(m["chatId"], m["text"], m["mode"]) for m in messages} == {
            ("x", "[出行助手] The task failed: the agent disconnected.", "auto"),
            ("y", "[出行助手] The task failed: the agent disconnected.", "auto"),
        }
        await wait_for(lambda: services.registry.remote("travel") is None)
        assert (await dispatch(http, "z", agent_id=chat_agent)) == {"status": "no_agent"}


async def test_a_peer_that_stops_answering_pings_is_dropped(tmp_path: Path, redis_url: str) -> None:
    chat_agent = chat_agent_id()
    services = Services.build(make_settings(tmp_path, redis={"url": redis_url}))
    services.prepare()
    async with (
        serve_app(broker_app(services), ws_ping_interval=0.2, ws_ping_timeout=0.2) as host,
        httpx.AsyncClient(base_url=f"http://{host}", headers=DISPATCH_HEADERS) as http,
        RedisListener(redis_url, chat_agent) as listener,
    ):
        agent = await FakeAgent.connect(host, a2a_id="travel", wait_registered=services.broker)
        await dispatch(http, "x", agent_id=chat_agent)
        await agent.next_request("message/stream")
        await asyncio.sleep(0.5)
        assert services.broker.connection("travel") is not None  # pongs keep it alive
        agent.ws.transport.pause_reading()  # the peer hangs: no more pongs
        messages = await listener.wait(lambda m: len(m) == 1, timeout=5)
        assert messages[0]["mode"] == "auto" and "disconnected" in messages[0]["text"]
        assert services.broker.connection("travel") is None
        agent.ws.transport.abort()


async def test_v1_agents_stream_response_shape_and_method_names_are_accepted(tmp_path: Path) -> None:
    async with running(tmp_path) as (host, services, broker, http):
        agent = await FakeAgent.connect(host, card=None, a2a_id="modern")
        first = await agent.next_request()
        assert first["method"] == "agent/authenticatedExtendedCard" and first["id"] == 1
        await agent.send(
            {"jsonrpc": "2.0", "id": first["id"], "error": {"code": -32601, "message": "Method not found"}}
        )
        second = await agent.next_request()
        assert second["method"] == "GetExtendedAgentCard"
        await agent.result(
            second["id"],
            {
                **travel_card("Modern"),
                "supportedInterfaces": [{"url": "ws://agent", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
            },
        )
        await wait_for(lambda: broker.connection("modern") is not None)

        async with broker.injects.bus.subscribe() as injects:
            await dispatch(http, "hello", target="modern")
            request = await agent.next_request()
            assert request["method"] == "SendStreamingMessage"
            assert request["params"]["message"]["role"] == "ROLE_USER"
            assert request["params"]["message"]["parts"] == [{"text": "hello"}]
            rid = request["id"]
            await agent.result(
                rid,
                {
                    "task": {
                        "id": "T",
                        "contextId": "C",
                        "status": {"state": "TASK_STATE_SUBMITTED"},
                        "history": [{"role": "ROLE_USER", "parts": [{"text": "hello"}]}],
                    }
                },
            )
            await agent.result(
                rid,
                {
                    "statusUpdate": {
                        "taskId": "T",
                        "status": {
                            "state": "TASK_STATE_WORKING",
                            "message": {"role": "ROLE_AGENT", "parts": [{"text": "tick 0"}]},
                        },
                    }
                },
            )
            await agent.result(
                rid,
                {
                    "artifactUpdate": {
                        "taskId": "T",
                        "artifact": {"artifactId": "A", "parts": [{"text": "done after 1 tick"}]},
                    }
                },
            )
            await agent.result(rid, {"statusUpdate": {"taskId": "T", "status": {"state": "TASK_STATE_COMPLETED"}}})
            got = [await asyncio.wait_for(injects.get(), 5) for _ in range(2)]
        assert [(i.text, i.mode) for i in got] == [("[Modern] tick 0", "delay"), ("[Modern] done after 1 tick", "auto")]
        await agent.close()


async def test_a_v03_agent_that_only_knows_v1_stream_names_is_retried_with_them(tmp_path: Path) -> None:
    async with running(tmp_path) as (host, services, broker, http):
        agent = await FakeAgent.connect(host, a2a_id="travel", wait_registered=broker)
        async with broker.injects.bus.subscribe() as injects:
            await dispatch(http, "hello")
            old = await agent.next_request()
            assert old["method"] == "message/stream"
            await agent.send({"jsonrpc": "2.0", "id": old["id"], "error": {"code": -32601, "message": "no"}})
            new = await agent.next_request()
            assert new["method"] == "SendStreamingMessage" and new["id"] != old["id"]
            await agent.result(new["id"], {"message": {"role": "ROLE_AGENT", "parts": [{"text": "hi there"}]}})
            inject = await asyncio.wait_for(injects.get(), 5)
        assert (inject.text, inject.mode) == ("[出行助手] hi there", "auto")
        await agent.close()


# -- bad input ---------------------------------------------------------------------------------------------


async def test_bad_lines_get_clear_errors_and_disturb_nothing_else(tmp_path: Path) -> None:
    async with running(tmp_path, broker_max_line_bytes=2048) as (host, services, broker, http):
        agent = await FakeAgent.connect(host, a2a_id="travel", wait_registered=broker)
        bystander = await FakeAgent.connect(
            host, card=travel_card("Bystander"), a2a_id="bystander", wait_registered=broker
        )
        async with broker.injects.bus.subscribe() as injects:
            await dispatch(http, "keep going")
            request = await agent.next_request("message/stream")
            rid = request["id"]
            await agent.ws.send(
                '{"jsonrpc": "2.0", "id": 5, "result": \n[1, 2]\n\n["an array"]\n{"id": 3, "result": {}}'
            )
            await agent.ws.send("x" * 5000)
            await agent.send(
                {"jsonrpc": "2.0", "id": 77, "method": "tasks/get", "params": {}},
                {"jsonrpc": "2.0", "id": 424242, "result": status_update("zz", "working", "who?")},
                {"jsonrpc": "2.0", "id": rid, "error": "not an object"},
                {"jsonrpc": "2.0", "id": rid, "result": {"kind": "nonsense"}},
            )
            await wait_for(lambda: len(agent.errors) >= 7)
            codes = [(e["id"], e["error"]["code"]) for e in agent.errors]
            assert codes == [
                (None, -32700),
                (None, -32600),
                (None, -32600),
                (3, -32600),
                (None, -32600),
                (77, -32601),
                (rid, -32600),
            ]
            assert "not valid JSON" in agent.errors[0]["error"]["message"]
            assert "line too long: 5000 bytes, the limit is 2048" in agent.errors[4]["error"]["message"]
            assert "serves no methods" in agent.errors[5]["error"]["message"]
            # The task is still alive and finishes normally.
            await agent.result(rid, status_update("t1", "completed", "fine", final=True))
            inject = await asyncio.wait_for(injects.get(), 5)
            assert (inject.text, inject.mode) == ("[出行助手] fine", "auto")
        lines = (await http.get("/a2a/stats")).json()["lines"]
        assert lines["malformed"] == 5 and lines["oversized"] == 1 and lines["unknownResponses"] == 1
        assert lines["agentRequests"] == 1 and lines["badEvents"] == 1
        assert broker.connection("travel") is not None and broker.connection("bystander") is not None
        assert bystander.errors == []
        await agent.close()
        await bystander.close()


BAD_DISPATCH_BODIES = [
    ({}, {"task", "targetAgent", "agentId", "chatId"}),
    ({"task": "  ", "targetAgent": "travel", "agentId": 1, "chatId": "c"}, {"task"}),
    ({"task": "t", "targetAgent": 5, "agentId": True, "chatId": ["c"]}, {"targetAgent", "agentId", "chatId"}),
    ({"task": "t" * 20_001, "targetAgent": "travel", "agentId": "", "chatId": "c"}, {"task", "agentId"}),
    # A misspelt field is named, not dropped (a `macAdress` would otherwise vanish without a word).
    ({"task": "t", "targetAgent": "travel", "agentId": 1, "chatId": "c", "macAdress": "x"}, {"macAdress"}),
]


async def test_bad_dispatch_bodies_are_422_with_the_field_names(tmp_path: Path) -> None:
    async with running(tmp_path) as (host, services, broker, http):
        for body, fields in BAD_DISPATCH_BODIES:
            response = await http.post("/a2a/tasks/dispatch", json=body)
            assert response.status_code == 422
            assert {e["loc"][1] for e in response.json()["detail"]} == fields, body
        unknown = await http.post("/a2a/tasks/cancel", json={"chat": "x"})
        assert unknown.status_code == 422
        assert {e["loc"][1] for e in unknown.json()["detail"]} == {"chat", "chatId"}
        assert (
            await http.post("/a2a/tasks/dispatch", content=b"not json", headers={"content-type": "application/json"})
        ).status_code == 422
        assert broker.stats()["tasks"]["dispatched"] == 0


async def test_unknown_or_foreign_targets_get_no_agent(tmp_path: Path) -> None:
    async with running(tmp_path) as (host, services, broker, http):
        agent = await FakeAgent.connect(host, a2a_id="travel", agent_id="123", wait_registered=broker)
        assert await dispatch(http, "x", target="nobody") == {"status": "no_agent"}
        assert await dispatch(http, "x", agent_id=999) == {"status": "no_agent"}  # bound to 123 only
        assert (await dispatch(http, "x", agent_id="123"))["status"] == "accepted"  # "123" and 123 are one id
        assert broker.stats()["tasks"]["noAgent"] == 2
        await agent.close()


async def test_health_reports_redis_and_counts(tmp_path: Path) -> None:
    async with running(tmp_path) as (host, services, broker, http):
        answer = await http.get("/a2a/health")
        health = answer.json()
        assert answer.status_code == 200
        assert health["status"] == "ok" and health["redis"] == "disabled" and health["outbox"] == 0
        assert health["dependencies"] == {
            "database": {"required": True, "ok": True},
            "redis": {"required": False, "configured": False, "ok": True},
        }
    async with running(tmp_path, redis={"url": "redis://127.0.0.1:1/0"}) as (host, services, broker, http):
        answer = await http.get("/a2a/health")
        health = answer.json()
        assert health["status"] == "degraded" and health["redis"] == "down" and health["redisError"]
        # Outside a cluster Redis is optional (injects wait in the outbox): degraded, still 200.
        assert answer.status_code == 200 and health["dependencies"]["redis"]["ok"] is False
        assert health["dependencies"]["redis"]["required"] is False and health["dependencies"]["redis"]["error"]

        @contextlib.asynccontextmanager
        async def unreachable():  # the database gone: the one required dependency is down
            raise OSError("the database is out of reach")
            yield

        reading, services.db.read = services.db.read, unreachable
        try:
            answer = await http.get("/a2a/health")
        finally:
            services.db.read = reading
        health = answer.json()
        assert answer.status_code == 503 and health["status"] == "unavailable" and health["down"] == ["database"]
        assert health["dependencies"]["database"]["ok"] is False and health["dependencies"]["database"]["error"]
        services.db.read = unreachable
        try:
            assert (await http.get("/a2a/health?live=1")).status_code == 200  # the process answers (deploy/Caddyfile)
        finally:
            services.db.read = reading


# -- the app's own chat reaches a WebSocket agent through the one registry -----------------------------------


async def test_a_chat_mention_delegates_to_the_connected_ws_agent(tmp_path: Path) -> None:
    from core.chat import agents as agents_store
    from core.chat import sessions as sessions_store
    from core.delegation import task_stream_key

    async with running(tmp_path) as (host, services, broker, http):
        agent = await FakeAgent.connect(host, a2a_id="travel", wait_registered=broker)
        async with services.db.session() as s:
            general = await agents_store.get_agent_by_slug(s, "general-assistant")
            chat = await sessions_store.create_session(s, user_id=services.auth.local_user_id, agent_id=general.id)
        turn = await services.chat.start_turn(
            session_id=chat.id, user_id=services.auth.local_user_id, text="@travel 明天去上海的高铁"
        )
        request = await agent.next_request("message/stream", timeout=30)  # the first turn imports LiteLLM
        assert request["params"]["message"]["parts"][0]["text"] == "明天去上海的高铁"
        rid = request["id"]
        await agent.result(rid, task_event("t9", "working"))
        await agent.result(rid, artifact_update("t9", "G1234 "))
        await agent.result(rid, artifact_update("t9", "08:00", append=True))
        await agent.result(rid, status_update("t9", "completed", final=True))
        events = [e async for e in services.hub.subscribe(turn.stream_key, after=turn.after_event_id)]
        await services.chat.wait(chat.id, timeout=10)
        [started] = [e.data for e in events if e.type == "a2a-task-started"]
        assert started["calleeAgentSlug"] == "travel" and started["calleeAgentName"] == "出行助手"
        [output] = [e.data for e in events if e.type == "tool-output-available"]
        assert output["isError"] is False and output["output"]["output"] == "G1234 08:00"
        deltas = [
            e.data["delta"]
            async for e in services.hub.subscribe(task_stream_key(started["taskId"]))
            if e.type == "text-delta"
        ]
        assert deltas == ["G1234 ", "08:00"]  # what the side panel shows
        await agent.close()


async def test_stopping_the_chat_turn_cancels_the_ws_agents_task(tmp_path: Path) -> None:
    from core.chat import agents as agents_store
    from core.chat import sessions as sessions_store

    async with running(tmp_path) as (host, services, broker, http):
        agent = await FakeAgent.connect(host, a2a_id="travel", wait_registered=broker)
        async with services.db.session() as s:
            general = await agents_store.get_agent_by_slug(s, "general-assistant")
            chat = await sessions_store.create_session(s, user_id=services.auth.local_user_id, agent_id=general.id)
        await services.chat.start_turn(session_id=chat.id, user_id=services.auth.local_user_id, text="@travel go")
        request = await agent.next_request("message/stream", timeout=30)
        await agent.result(request["id"], task_event("t-stop", "working"))
        await agent.working(request["id"], "searching", "t-stop")
        await asyncio.sleep(0.05)
        assert await services.chat.cancel(chat.id)
        cancel = await agent.next_request("tasks/cancel")
        assert cancel["params"] == {"id": "t-stop"}
        await agent.close()


async def test_an_interrupted_task_ends_with_an_auto_inject_under_its_state(tmp_path: Path) -> None:
    async with running(tmp_path) as (host, services, broker, http):
        agent = await FakeAgent.connect(host, a2a_id="travel", wait_registered=broker)
        async with broker.injects.bus.subscribe() as injects:
            await dispatch(http, "book it")
            request = await agent.next_request("message/stream")
            await agent.result(request["id"], status_update("t1", "input-required", "Which day?", final=True))
            inject = await asyncio.wait_for(injects.get(), 5)
        assert (inject.text, inject.mode) == ("[出行助手] Which day?", "auto")
        assert broker.recent_tasks()[0].state == "input-required"
        await agent.close()
