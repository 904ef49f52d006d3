"""Test helpers for the broker.

The app served on the test's own loop, a scripted remote agent (a real `websockets`
client speaking line-delimited JSON-RPC as seed 003 describes), a real Redis
subscriber, and a TCP proxy in front of Redis that a test can cut and restore.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlencode

import uvicorn
import websockets
from fastapi import FastAPI

from core.broker.routes import broker_router
from core.services import Services
from tests.utils.live_server import services_app

CARD_METHODS = {"agent/authenticatedExtendedCard", "GetExtendedAgentCard", "agent/getAuthenticatedExtendedCard"}
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

# Every test app's settings carry this dispatch token (tests/conftest.py make_settings); a chat system sends it.
DISPATCH_TOKEN = "test-dispatch-token"
DISPATCH_HEADERS = {"Authorization": f"Bearer {DISPATCH_TOKEN}"}


def travel_card(name: str = "出行助手") -> dict[str, Any]:
    """The seed's example agent."""
    return {
        "name": name,
        "description": "Trains and flights: search, compare, book.",
        "version": "1.0.0",
        "capabilities": {"streaming": True},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": [
            {"id": "train", "name": "火车票查询", "description": "High-speed train tickets", "tags": ["travel"]}
        ],
    }


def broker_app(services: Services, *, with_api: bool = False) -> FastAPI:
    """A FastAPI app with the broker routes (and the chat API when asked), services started by its lifespan."""
    if with_api:
        from core.routes import api_router

        return services_app(services, broker_router(), api_router())
    return services_app(services, broker_router())


@asynccontextmanager
async def serve_app(app: FastAPI, *, ws: str = "wsproto", **options: Any) -> AsyncIterator[str]:
    """Serve `app` with uvicorn on 127.0.0.1 on *this* loop (so tests share objects with it); yields host:port.

    `wsproto` by default: the WebSocket implementation NiceGUI's `ui.run` uses.
    """
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", ws=ws, **options)
    server = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("the test server did not start")
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)


class FakeAgent:
    """A remote agent on the other end of `/a2a`: answers the card request, records everything else."""

    def __init__(self, ws: websockets.ClientConnection, card: dict[str, Any] | None) -> None:
        self.ws = ws
        self.card = card
        self.requests: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.errors: list[dict[str, Any]] = []  # JSON-RPC errors the broker sent us
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(cls, host: str, *, card: Any = "travel", wait_registered: Any = None, **query: str) -> FakeAgent:
        """Dial in with `?<query>`; with `wait_registered` (the broker), wait until it lists the agent.

        `card`: the card to answer with (the seed's travel agent by default); None: never answer.
        """
        agent = cls(
            await websockets.connect(f"ws://{host}/a2a?{urlencode(query)}", open_timeout=5, max_size=None),
            travel_card() if card == "travel" else card,
        )
        if wait_registered is not None:
            await wait_for(lambda: wait_registered.connection(query.get("a2a_id", "")) is not None)
        return agent

    async def _read(self) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for frame in self.ws:
                for line in str(frame).split("\n"):
                    if not line.strip():
                        continue
                    message = json.loads(line)
                    if message.get("method") in CARD_METHODS and self.card is not None:
                        await self.send({"jsonrpc": "2.0", "id": message["id"], "result": self.card})
                    elif "method" in message:
                        await self.requests.put(message)
                    else:
                        self.errors.append(message)

    async def next_request(self, method: str | None = None, timeout: float = 5.0) -> dict[str, Any]:
        """The next request the broker sent (skipping other methods when `method` is given)."""
        async with asyncio.timeout(timeout):
            while True:
                message = await self.requests.get()
                if method is None or message["method"] == method:
                    return message

    async def send(self, *messages: dict[str, Any]) -> None:
        """Send messages, all in one frame, one per line."""
        await self.ws.send("\n".join(json.dumps(m, ensure_ascii=False) for m in messages))

    async def result(self, rpc_id: Any, result: dict[str, Any]) -> None:
        """One response for a request id (a stream event, when the id is a `message/stream`)."""
        await self.send({"jsonrpc": "2.0", "id": rpc_id, "result": result})

    async def working(self, rpc_id: Any, text: str, task_id: str = "t1") -> None:
        """A v0.3 `status-update` in state working with a text message."""
        await self.result(rpc_id, status_update(task_id, "working", text))

    async def close(self) -> None:
        """Close the socket and stop reading."""
        await self.ws.close()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


def status_update(task_id: str, state: str, text: str | None = None, *, final: bool = False) -> dict[str, Any]:
    """A v0.3 status-update result."""
    status: dict[str, Any] = {"state": state}
    if text is not None:
        status["message"] = {
            "kind": "message",
            "role": "agent",
            "messageId": f"m-{task_id}-{state}",
            "parts": [{"kind": "text", "text": text}],
        }
    return {"kind": "status-update", "taskId": task_id, "contextId": "c1", "status": status, "final": final}


def task_event(task_id: str, state: str = "submitted") -> dict[str, Any]:
    """A v0.3 Task result."""
    return {"kind": "task", "id": task_id, "contextId": "c1", "status": {"state": state}}


def artifact_update(task_id: str, text: str, *, append: bool = False, artifact_id: str = "a1") -> dict[str, Any]:
    """A v0.3 artifact-update result."""
    return {
        "kind": "artifact-update",
        "taskId": task_id,
        "contextId": "c1",
        "append": append,
        "artifact": {"artifactId": artifact_id, "parts": [{"kind": "text", "text": text}]},
    }


async def wait_for(predicate: Any, timeout: float = 5.0, interval: float = 0.01) -> None:
    """Poll until `predicate()` is true."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(interval)


class RedisListener:
    """A real Redis subscriber on `agent:events:<agentId>` channels, collecting decoded injects."""

    def __init__(self, url: str, *agent_ids: Any) -> None:
        import redis.asyncio as redis

        self.client = redis.Redis.from_url(url)
        self.pubsub = self.client.pubsub()
        self.channels = [f"agent:events:{a}" for a in agent_ids]
        self.messages: list[dict[str, Any]] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RedisListener:
        await self.pubsub.subscribe(*self.channels)
        self._task = asyncio.get_running_loop().create_task(self._collect())
        return self

    async def _collect(self) -> None:
        async for item in self.pubsub.listen():
            if item["type"] == "message":
                self.messages.append({"channel": item["channel"].decode(), **json.loads(item["data"])})

    async def wait(self, predicate: Any, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Wait until `predicate(messages)` holds; returns the messages."""
        await wait_for(lambda: predicate(self.messages), timeout)
        return self.messages

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.pubsub.aclose()
        await self.client.aclose()


def redis_test_url() -> str:
    """`TEST_REDIS_URL`, or the local default."""
    return os.environ.get("TEST_REDIS_URL", DEFAULT_REDIS_URL)


class TcpProxy:
    """A loopback TCP proxy to `target`; `cut()` closes it and every connection, `restore()` listens again."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> TcpProxy:
        """Listen (on a free port the first time, on the same port afterwards)."""
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update({writer, up_writer})

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers.difference_update({writer, up_writer})

    async def cut(self) -> None:
        """Stop listening and drop every proxied connection (Redis looks down)."""
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            await self._server.wait_closed()
            self._server = None

    async def restore(self) -> None:
        """Listen again on the same port (Redis is back)."""
        await self.start()
