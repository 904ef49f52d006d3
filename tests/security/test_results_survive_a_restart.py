"""Results promised as always delivered (`auto`) survive a stop: SIGTERM or kill -9, with Redis up or down.

A real `python app.py` with a real SQLite file, a real Redis behind a TCP proxy that the test cuts, a
WebSocket agent that dials in, an outside chat system dispatching over HTTP, and the app's own chat
dispatching in the background. The app is stopped while results wait for Redis and while tasks run,
then started again on the same data: every result reaches Redis, every task cut off ends with
"interrupted by a server restart", and the app's own chat gets its note and its announcement once.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from core.broker.service import STOPPED
from core.broker.store import INTERRUPTED
from tests.test_broker import redis_url  # noqa: F401 - the fixture
from tests.utils.app_process import AppProcess, app_process
from tests.utils.broker import DISPATCH_TOKEN, FakeAgent, RedisListener, TcpProxy, status_update
from tests.utils.ports import free_port

NAME = "出行助手"  # the fake agent's card name: injects read "[出行助手] ..."


async def serving(app: AppProcess) -> None:
    """Wait for `GET /` off the event loop: the Redis proxy runs on this loop and must keep serving."""
    await asyncio.to_thread(app.wait_until_serving)


async def connect_travel(app: AppProcess) -> FakeAgent:
    agent = await FakeAgent.connect(app.base_url.removeprefix("http://"), a2a_id="travel")
    async with httpx.AsyncClient(base_url=app.base_url) as http:
        for _ in range(100):
            if any(a["a2a_id"] == "travel" for a in (await http.get("/a2a/agents")).json()["agents"]):
                return agent
            await asyncio.sleep(0.05)
    raise AssertionError("the agent never showed up in /a2a/agents")


async def dispatch(http: httpx.AsyncClient, agent: FakeAgent, chat_agent: str, chat_id: str) -> int:
    response = await http.post(
        "/a2a/tasks/dispatch", json={"task": chat_id, "targetAgent": "travel", "agentId": chat_agent, "chatId": chat_id}
    )
    assert response.status_code == 200 and response.json()["status"] == "accepted", response.text
    return (await agent.next_request("message/stream"))["id"]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
async def test_no_result_is_lost_when_the_app_stops_while_redis_is_down(
    tmp_path: Path,
    redis_url: str,  # noqa: F811
    stop: signal.Signals,
) -> None:
    target = urlparse(redis_url)
    proxy = await TcpProxy(target.hostname or "127.0.0.1", target.port or 6379).start()
    env = {
        "REDIS_URL": f"redis://127.0.0.1:{proxy.port}{target.path or '/0'}",
        "INJECT_MIN_INTERVAL": "0",
        "BROKER_DISPATCH_TOKEN": DISPATCH_TOKEN,
    }
    chat_agent = f"restart-{uuid.uuid4().hex[:8]}"  # this run's own Redis channel
    data_dir, port = tmp_path / "data", free_port()
    headers = {"authorization": f"Bearer {DISPATCH_TOKEN}"}
    try:
        async with RedisListener(redis_url, chat_agent) as listener:
            with app_process(data_dir, port=port, **env) as app:
                await serving(app)
                agent = await connect_travel(app)
                async with httpx.AsyncClient(base_url=app.base_url, headers=headers, timeout=10) as http:
                    await proxy.cut()
                    done = [await dispatch(http, agent, chat_agent, f"done-{i}") for i in range(5)]
                    cut_off = await dispatch(http, agent, chat_agent, "cut-off")
                    await agent.working(cut_off, "halfway", "t-cut")
                    for i, rid in enumerate(done):
                        await agent.working(rid, f"progress {i}", f"t{i}")
                        await agent.result(rid, status_update(f"t{i}", "completed", f"result {i}", final=True))
                    for _ in range(200):
                        health = (await http.get("/a2a/health")).json()
                        if health["outbox"] == 11:  # 5 results and 6 progress notes wait for Redis
                            break
                        await asyncio.sleep(0.05)
                    assert health["redis"] == "down" and health["outbox"] == 11, health
                assert app.stop(stop) in (0, -signal.SIGKILL)
                await agent.close()
            assert listener.messages == []  # nothing reached Redis while it was down

            await proxy.restore()
            with app_process(data_dir, port=port, **env) as app:
                await serving(app)
                messages = await listener.wait(lambda m: len(m) >= 6, timeout=15)
                await asyncio.sleep(0.3)  # nothing more comes: each result exactly once
                assert app.stop() == 0
        got = sorted((m["chatId"], m["mode"], m["text"]) for m in listener.messages)
        ending = f"[{NAME}] {INTERRUPTED if stop == signal.SIGKILL else STOPPED}"
        assert got == sorted(
            [("cut-off", "auto", ending)] + [(f"done-{i}", "auto", f"[{NAME}] result {i}") for i in range(5)]
        )
        assert all(m["agentId"] == chat_agent for m in messages)
    finally:
        await proxy.cut()


async def test_the_apps_own_background_task_cut_by_kill_9_is_announced_after_the_restart(tmp_path: Path) -> None:
    data_dir, port = tmp_path / "data", free_port()
    with app_process(data_dir, port=port) as app:
        await serving(app)
        agent = await connect_travel(app)
        async with httpx.AsyncClient(base_url=app.base_url, timeout=30) as http:
            chat = (await http.post("/api/sessions", json={"agentId": "general-assistant"})).json()
            sent = await http.post(
                f"/api/sessions/{chat['id']}/messages", json={"content": "/background @travel 明天去上海的高铁"}
            )
            assert sent.status_code == 202, sent.text
            request = await agent.next_request("message/stream", timeout=30)
            await agent.working(request["id"], "已查到 6 个车次…")
            for _ in range(200):  # the turn that dispatched it is over and saved
                messages = (await http.get(f"/api/sessions/{chat['id']}/messages")).json()
                if messages and messages[-1]["role"] == "assistant" and messages[-1]["status"] == "complete":
                    break
                await asyncio.sleep(0.05)
        app.stop(signal.SIGKILL)
        await agent.close()

    with app_process(data_dir, port=port) as app:
        await serving(app)
        async with httpx.AsyncClient(base_url=app.base_url, timeout=30) as http:
            for _ in range(300):
                messages = (await http.get(f"/api/sessions/{chat['id']}/messages")).json()
                if messages[-1]["role"] == "assistant" and "interrupted by a server restart" in messages[-1]["content"]:
                    break
                await asyncio.sleep(0.05)
            notes = [(m["content"], m["injectMode"]) for m in messages if m["role"] == "system"]
            assert (f"[{NAME}] {INTERRUPTED}", "auto") in notes
            assert "interrupted by a server restart" in messages[-1]["content"]  # the agent announced it
            [task] = (await http.get("/api/tasks")).json()  # the side panel's record of it
            assert (task["calleeAgentId"], task["state"]) == ("travel", "failed")
        assert app.stop() == 0

    # A third start delivers nothing again: the saved note is the proof of delivery.
    with app_process(data_dir, port=port) as app:
        await serving(app)
        async with httpx.AsyncClient(base_url=app.base_url, timeout=30) as http:
            await asyncio.sleep(0.5)
            again = (await http.get(f"/api/sessions/{chat['id']}/messages")).json()
        assert len(again) == len(messages)
        assert app.stop() == 0
