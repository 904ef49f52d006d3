"""The return path when Redis goes away and comes back: injects wait in the outbox, results first,
none lost; health says so meanwhile. Redis is real; a TCP proxy in front of it is what goes down.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlparse

import httpx

from core.broker.inject import AUTO, DELAY, Inject, InjectPublisher
from core.services import Services
from tests.conftest import make_settings
from tests.test_broker import chat_agent_id, redis_url  # noqa: F401 - the fixture
from tests.utils.broker import (
    DISPATCH_HEADERS,
    FakeAgent,
    RedisListener,
    TcpProxy,
    broker_app,
    serve_app,
    status_update,
    wait_for,
)


async def test_redis_down_and_back_loses_no_result(tmp_path: Path, redis_url: str) -> None:  # noqa: F811
    target = urlparse(redis_url)
    proxy = await TcpProxy(target.hostname or "127.0.0.1", target.port or 6379).start()
    proxied = f"redis://127.0.0.1:{proxy.port}{target.path or '/0'}"
    chat_agent = chat_agent_id()
    services = Services.build(make_settings(tmp_path, redis={"url": proxied}))
    services.prepare()
    broker = services.broker
    async with (
        serve_app(broker_app(services)) as host,
        httpx.AsyncClient(base_url=f"http://{host}", headers=DISPATCH_HEADERS) as http,
        RedisListener(redis_url, chat_agent) as listener,
    ):
        agent = await FakeAgent.connect(host, a2a_id="travel", wait_registered=broker)

        async def dispatch(chat_id: str) -> int:
            await http.post(
                "/a2a/tasks/dispatch",
                json={"task": chat_id, "targetAgent": "travel", "agentId": chat_agent, "chatId": chat_id},
            )
            return (await agent.next_request("message/stream"))["id"]

        before = await dispatch("before")
        await agent.result(before, status_update("t0", "completed", "before the outage", final=True))
        await listener.wait(lambda m: len(m) == 1)

        await proxy.cut()
        during = [await dispatch(f"during-{i}") for i in range(3)]
        for i, rid in enumerate(during):
            await agent.working(rid, f"progress {i}", f"t{i + 1}")
            await agent.result(rid, status_update(f"t{i + 1}", "completed", f"result {i}", final=True))
        await wait_for(lambda: broker.injects.outbox_size == 6)
        health = (await http.get("/a2a/health")).json()
        assert health["status"] == "degraded" and health["redis"] == "down" and health["outbox"] == 6
        assert len(listener.messages) == 1

        await proxy.restore()
        messages = await listener.wait(lambda m: len(m) == 7, timeout=10)
        flushed = [(m["chatId"], m["text"], m["mode"]) for m in messages[1:]]
        # Results first (they must survive another drop), then the progress.
        assert [mode for _, _, mode in flushed] == ["auto"] * 3 + ["delay"] * 3
        assert sorted(flushed[:3]) == [(f"during-{i}", f"[出行助手] result {i}", "auto") for i in range(3)]
        assert sorted(flushed[3:]) == [(f"during-{i}", f"[出行助手] progress {i}", "delay") for i in range(3)]
        health = (await http.get("/a2a/health")).json()
        assert health["status"] == "ok" and health["outbox"] == 0
        await agent.close()
    await proxy.cut()


async def test_a_full_outbox_drops_progress_before_results() -> None:
    publisher = InjectPublisher("redis://127.0.0.1:1/0", outbox_max=3)
    await publisher.start()
    try:
        for i in range(2):
            await publisher.publish(Inject(1, "c", f"result {i}", AUTO))
        for i in range(3):
            await publisher.publish(Inject(1, "c", f"progress {i}", DELAY))
        await publisher.publish(Inject(1, "c", "result 2", AUTO))
        assert publisher.state == "down" and publisher.outbox_size == 3 and publisher.dropped == 3
        assert [i.text for _, i in publisher._auto] == ["result 0", "result 1", "result 2"]
        await publisher.publish(Inject(1, "c", "result 3", AUTO))  # only results left: the oldest goes
        assert [i.text for _, i in publisher._auto] == ["result 1", "result 2", "result 3"]
    finally:
        await publisher.stop()
    await asyncio.sleep(0)
