"""The app's chat gets each note of its background tasks exactly once, across a Redis cut and kill -9 (issue 35).

A real `python app.py` in cluster mode (a PostgreSQL database of its own, Redis behind a TCP proxy the test
cuts), a WebSocket agent the test drives, and a chat of the app dispatching three background tasks to it.
Progress arrives, Redis is cut, more progress comes and two tasks finish while it is down (their notes are saved
all the same: the inbox is on the relaying process's bus and the database is up), the process is killed with -9
while the third still runs. Started again, the third ends as interrupted and the two results Redis never got are
sent again, to Redis and to the chat, which has them already: the chat gets each result once and each progress
note once, for the inbox knows an inject by its position in its task, not by its text (docs/ARCHITECTURE.md,
"One task, one log"). A third start delivers nothing.
"""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest
from sqlmodel import col, select

from core.broker.store import INTERRUPTED
from core.db import Database
from models import AgentMessage
from tests.conftest import unavailable
from tests.utils.app_process import AppProcess, app_process
from tests.utils.broker import FakeAgent, TcpProxy, status_update
from tests.utils.cluster import ADMIN, REPLICA_START_TIMEOUT_S, ClusterBackends, add_account, cluster_backends
from tests.utils.ports import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.postgres]

NAME = "出行助手"  # the fake agent's card name: notes read "[出行助手] ..."
LEASE_S = 3  # the replica's liveness key: a restart under the same id waits for it to expire


async def serving(app: AppProcess) -> None:
    """Wait off the event loop: the Redis proxy runs on this loop and must keep serving."""
    await asyncio.to_thread(app.wait_until_serving, REPLICA_START_TIMEOUT_S, "/login")


async def until(predicate: Any, timeout: float = 30.0, interval: float = 0.1) -> Any:
    """Poll the coroutine function `predicate` until it returns something true; that."""
    async with asyncio.timeout(timeout):
        while not (got := await predicate()):
            await asyncio.sleep(interval)
    return got


async def notes_of(http: httpx.AsyncClient, session_id: str) -> list[dict[str, Any]]:
    response = await http.get(f"/api/sessions/{session_id}/messages")
    assert response.status_code == 200, response.text
    return response.json()


async def test_each_note_once_across_a_redis_cut_and_kill_9(postgres_server_url: str, tmp_path: Path) -> None:
    try:
        with cluster_backends(postgres_server_url) as backends:
            await asyncio.to_thread(add_account, backends, tmp_path / "cli")
            await run_scenario(backends, tmp_path)
    except ConnectionError as exc:
        unavailable(str(exc))


async def run_scenario(backends: ClusterBackends, tmp_path: Path) -> None:
    target = urlparse(backends.redis_url)
    proxy = await TcpProxy(target.hostname or "127.0.0.1", target.port or 6379).start()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = backends.env(
        REDIS_URL=f"redis://127.0.0.1:{proxy.port}{target.path or '/0'}",
        INSTANCE_ID="inbox-once",
        REPLICA_URL=url,
        PUBLIC_BASE_URL=url,
        CLUSTER_LEASE_S=str(LEASE_S),
        INJECT_MIN_INTERVAL="0",
        DEMO_MODEL_DELAY_MS="5",
        CONFIG_FILE=str(tmp_path / "no-config.json"),
        ENV_FILE=str(tmp_path / "no.env"),
    )
    data_dir = tmp_path / "data"
    try:
        with app_process(data_dir, port=port, **env) as app:
            await serving(app)
            agent = await FakeAgent.connect(app.base_url.removeprefix("http://"), a2a_id="travel")
            async with httpx.AsyncClient(base_url=app.base_url, auth=ADMIN, timeout=30) as http:

                async def listed() -> bool:
                    agents = (await http.get("/a2a/agents")).json()["agents"]
                    return any(a["a2a_id"] == "travel" for a in agents)

                await until(listed)
                chat = (await http.post("/api/sessions", json={"agentId": "general-assistant"})).json()
                requests = []
                for n in range(3):
                    turns = len([m for m in await notes_of(http, chat["id"]) if m["role"] == "assistant"])
                    sent = await http.post(
                        f"/api/sessions/{chat['id']}/messages", json={"content": f"/background @travel trip {n}"}
                    )
                    assert sent.status_code == 202, sent.text
                    requests.append((await agent.next_request("message/stream", timeout=30))["id"])

                    async def turn_over(turns: int = turns) -> bool:
                        answers = [m for m in await notes_of(http, chat["id"]) if m["role"] == "assistant"]
                        return len(answers) > turns and answers[-1]["status"] == "complete"

                    await until(turn_over)
                for n, rid in enumerate(requests):
                    await agent.working(rid, f"trip {n}: step 1", f"t{n}")

                async def first_steps() -> bool:
                    delay = [m for m in await notes_of(http, chat["id"]) if m["injectMode"] == "delay"]
                    return len(delay) >= 3

                await until(first_steps)

                await proxy.cut()
                await agent.working(requests[0], "trip 0: step 2", "t0")
                for n in (0, 1):
                    await agent.result(requests[n], status_update(f"t{n}", "completed", f"trip {n} booked", final=True))
                # Saved while Redis is down: the inbox is on this replica's bus, the notes go to the database.
                await until(lambda: _saved_notes(backends, chat["id"], 3), timeout=60)
            app.stop(signal.SIGKILL)
            await agent.close()

        await asyncio.sleep(LEASE_S + 1)  # the killed replica's liveness key expires: its id is free again
        await proxy.restore()

        with app_process(data_dir, port=port, **env) as app:
            await serving(app)
            async with httpx.AsyncClient(base_url=app.base_url, auth=ADMIN, timeout=30) as http:

                async def three_results() -> list[dict[str, Any]] | None:
                    messages = await notes_of(http, chat["id"])
                    results = [m for m in messages if m["injectMode"] == "auto"]
                    announced = messages[-1]["role"] == "assistant" and messages[-1]["status"] == "complete"
                    return messages if len(results) >= 3 and announced else None

                await until(three_results, timeout=60)
                await asyncio.sleep(2.0)  # a second copy of anything would be saved by now
                messages = await notes_of(http, chat["id"])
            assert app.stop() == 0

        results = Counter(m["a2aTaskId"] for m in messages if m["injectMode"] == "auto")
        assert sorted(results.values()) == [1, 1, 1], results  # each task's result once
        texts = sorted(m["content"] for m in messages if m["injectMode"] == "auto")
        assert texts == sorted([f"[{NAME}] trip 0 booked", f"[{NAME}] trip 1 booked", f"[{NAME}] {INTERRUPTED}"])
        progress = Counter(m["content"] for m in messages if m["injectMode"] == "delay")
        assert all(progress[f"[{NAME}] trip {n}: step 1"] == 1 for n in range(3)), progress  # read twice, saved once
        assert progress[f"[{NAME}] trip 0: step 2"] == 1  # saved during the cut: the notes do not wait for Redis
        assert set(progress) <= {f"[{NAME}] trip {n}: step 1" for n in range(3)} | {f"[{NAME}] trip 0: step 2"}

        # A third start delivers nothing again: the notes' positions are the inbox's own.
        with app_process(data_dir, port=port, **env) as app:
            await serving(app)
            async with httpx.AsyncClient(base_url=app.base_url, auth=ADMIN, timeout=30) as http:
                await asyncio.sleep(1.5)
                again = await notes_of(http, chat["id"])
            assert app.stop() == 0
        assert [m["id"] for m in again] == [m["id"] for m in messages]
    finally:
        await proxy.cut()


async def _saved_notes(backends: ClusterBackends, session_id: str, count: int) -> bool:
    """True once the session holds `count` notes saved since the first steps (step 2 and two results)."""
    db = Database(backends.database_url)
    try:
        async with db.session() as s:
            query = select(AgentMessage.content).where(
                AgentMessage.session_id == session_id, col(AgentMessage.inject_mode).is_not(None)
            )
            notes = list((await s.exec(query)).all())
    finally:
        await db.close()
    return sum(1 for n in notes if "step 2" in n or "booked" in n) >= count
