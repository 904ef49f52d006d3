"""The broker (seed 003) under load, against a real `python app.py` and a real Redis.

    .venv/bin/python bench/bench_broker.py [--quick] [--redis redis://127.0.0.1:6379/0]

1. Idle agents: 1,000 WebSocket agents dial in to /a2a (each answers the card
   request and then stays idle); server RSS before and with them connected,
   so memory per connection.
2. Relay: 200 concurrent tasks (20 agents x 10 tasks, multiplexed on each
   socket), each streaming N working status updates with a text message and a
   final completed status. Events/s in (the server's `eventsRelayed` over the
   wall time from the first dispatch to the last inject), injects/s out
   (counted by a Redis subscriber), server CPU per event. Run twice: with
   `inject_min_interval=0` (every event becomes an inject) and with the
   default 1000 ms (progress throttled, results always delivered).
3. Latency: sequential dispatches; time from sending `POST /a2a/tasks/dispatch`
   to the first inject arriving at a Redis subscriber (the agent answers with
   a working event at once). p50 / p99.
4. The app's own chat as the chat system: sequential chats (REST API) send
   `/background @bg go` to the General Assistant, whose `a2a_bg` tool
   dispatches in the background; the agent answers at once. Time from the
   message to the result's note being saved in the chat, and to the
   assistant's announcement being saved (polling the messages every 5 ms).

The agents and the subscriber run in this process; the server is measured from /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import statistics
import sys
import time
from pathlib import Path

import httpx
import redis.asyncio as redis
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_seconds, running_server, table, wait_cpu_idle  # noqa: E402

CARD_METHODS = {"agent/authenticatedExtendedCard", "GetExtendedAgentCard", "agent/getAuthenticatedExtendedCard"}
CARD = {"name": "Bench", "description": "A benchmark agent.", "version": "1", "skills": [{"id": "b", "name": "B"}]}

DISPATCH_TOKEN = "bench-dispatch-token"  # the chat system's credential on /a2a/tasks/dispatch
DISPATCH_HEADERS = {"Authorization": f"Bearer {DISPATCH_TOKEN}"}


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def settle(pid: int, timeout: float = 60.0) -> None:
    """Wait until the server is idle and its RSS holds still (LiteLLM is imported in a thread after start)."""
    deadline = time.monotonic() + timeout
    last = rss_mb(pid)
    while time.monotonic() < deadline:
        wait_cpu_idle(pid, window=0.5)
        time.sleep(1.0)
        now = rss_mb(pid)
        if abs(now - last) < 0.5:
            return
        last = now


class Agent:
    """A bench agent: answers the card; on `message/stream`, streams `events` updates (in frames of `batch`)."""

    def __init__(self, ws, *, events: int = 0, batch: int = 10, first_only: bool = False) -> None:
        self.ws, self.events, self.batch, self.first_only = ws, events, batch, first_only
        self.reader = asyncio.get_running_loop().create_task(self.read())

    async def read(self) -> None:
        try:
            async for frame in self.ws:
                for line in frame.split("\n"):
                    if not line.strip():
                        continue
                    msg = json.loads(line)
                    if msg.get("method") in CARD_METHODS:
                        await self.ws.send(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": CARD}))
                    elif msg.get("method") == "message/stream":
                        asyncio.get_running_loop().create_task(self.run(msg["id"]))
        except websockets.ConnectionClosed:
            pass

    async def run(self, rid: int) -> None:
        tid = f"t{rid}"

        def status(state: str, text: str | None, final: bool = False) -> str:
            body = {"state": state}
            if text:
                body["message"] = {
                    "kind": "message",
                    "role": "agent",
                    "messageId": f"{tid}-{text[:6]}",
                    "parts": [{"kind": "text", "text": text}],
                }
            return json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "result": {"kind": "status-update", "taskId": tid, "status": body, "final": final},
                }
            )

        if self.first_only:
            await self.ws.send(status("working", "started"))
            await self.ws.send(status("completed", "done", True))
            return
        lines = [status("working", f"step {i} of {self.events}") for i in range(self.events)]
        for i in range(0, len(lines), self.batch):
            await self.ws.send("\n".join(lines[i : i + self.batch]))
            await asyncio.sleep(0)
        await self.ws.send(status("completed", "all done", True))


COMPRESSION: str | None = None  # what the agents ask for (--deflate: permessage-deflate, the websockets default)


async def connect(port: int, a2a_id: str, **kwargs) -> Agent:
    ws = await websockets.connect(
        f"ws://127.0.0.1:{port}/a2a?a2a_id={a2a_id}",
        open_timeout=30,
        ping_interval=None,
        max_size=None,
        compression=COMPRESSION,
    )
    return Agent(ws, **kwargs)


async def agents_online(http: httpx.AsyncClient) -> int:
    return (await http.get("/a2a/stats")).json()["agentsOnline"]


async def wait_online(http: httpx.AsyncClient, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while await agents_online(http) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {await agents_online(http)} of {n} agents came online")
        await asyncio.sleep(0.1)


async def idle_agents(server, count: int) -> list[list[object]]:
    port = server.port
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=DISPATCH_HEADERS, timeout=30) as http:
        warm = [await connect(port, f"warm-{i}") for i in range(10)]
        await wait_online(http, 10)
        await asyncio.to_thread(settle, server.pid)
        before = rss_mb(server.pid)
        t0 = time.perf_counter()
        agents = []
        for start in range(0, count, 100):  # 100 handshakes at a time
            agents += await asyncio.gather(*(connect(port, f"idle-{i}") for i in range(start, min(count, start + 100))))
        await wait_online(http, count + 10)
        took = time.perf_counter() - t0
        await asyncio.to_thread(settle, server.pid)
        with_them = rss_mb(server.pid)
        for agent in agents + warm:
            await agent.ws.close()
    per_kib = (with_them - before) * 1024 / count
    return [[f"{count:,} idle agents", f"{before:.1f}", f"{with_them:.1f}", f"{per_kib:.1f}", f"{took:.2f}"]]


async def relay(
    server, redis_url: str, *, agents: int, per_agent: int, events: int, interval_label: str
) -> list[object]:
    port = server.port
    chat_agent = random.randint(10**9, 10**10)
    tasks = agents * per_agent
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=DISPATCH_HEADERS, timeout=60) as http:
        conns = [await connect(port, f"relay-{i}", events=events) for i in range(agents)]
        await wait_online(http, agents)
        stats0 = (await http.get("/a2a/stats")).json()
        sub = redis.Redis.from_url(redis_url)
        pubsub = sub.pubsub()
        await pubsub.subscribe(f"agent:events:{chat_agent}")
        received = {"all": 0, "auto": 0}
        finished = asyncio.Event()
        last_at = [0.0]

        async def count() -> None:
            async for item in pubsub.listen():
                if item["type"] != "message":
                    continue
                received["all"] += 1
                last_at[0] = time.perf_counter()
                if b'"mode": "auto"' in item["data"]:
                    received["auto"] += 1
                    if received["auto"] == tasks:
                        finished.set()

        counter = asyncio.get_running_loop().create_task(count())
        await asyncio.to_thread(settle, server.pid)
        cpu0, t0 = cpu_seconds(server.pid), time.perf_counter()
        bodies = [
            {"task": f"task {a}.{k}", "targetAgent": f"relay-{a}", "agentId": chat_agent, "chatId": f"c{a}.{k}"}
            for a in range(agents)
            for k in range(per_agent)
        ]
        acks = await asyncio.gather(*(http.post("/a2a/tasks/dispatch", json=b) for b in bodies))
        assert all(r.json()["status"] == "accepted" for r in acks)
        await asyncio.wait_for(finished.wait(), 300)
        await asyncio.sleep(0.3)  # stragglers
        wall = last_at[0] - t0
        cpu = cpu_seconds(server.pid) - cpu0
        stats1 = (await http.get("/a2a/stats")).json()
        counter.cancel()
        await pubsub.aclose()
        await sub.aclose()
        for agent in conns:
            await agent.ws.close()
        await asyncio.sleep(0.5)
    events_in = stats1["eventsRelayed"] - stats0["eventsRelayed"]
    throttled = stats1["injects"]["throttled"] - stats0["injects"]["throttled"]
    dropped = stats1["injects"]["dropped"] - stats0["injects"]["dropped"]
    return [
        f"{tasks} tasks x {events + 1} events, inject_min_interval={interval_label}",
        f"{events_in:,}",
        f"{wall:.2f}",
        f"{events_in / wall:,.0f}",
        f"{received['all']:,}",
        f"{received['all'] / wall:,.0f}",
        f"{throttled:,}",
        f"{dropped:,}",
        f"{cpu / events_in * 1e6:.0f}",
    ]


async def latency(server, redis_url: str, rounds: int) -> list[object]:
    port = server.port
    chat_agent = random.randint(10**9, 10**10)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=DISPATCH_HEADERS, timeout=30) as http:
        agent = await connect(port, "latency", first_only=True)
        await wait_online(http, 1)
        sub = redis.Redis.from_url(redis_url)
        pubsub = sub.pubsub()
        await pubsub.subscribe(f"agent:events:{chat_agent}")
        await pubsub.get_message(timeout=1)  # the subscribe confirmation
        samples = []
        for i in range(rounds):
            t0 = time.perf_counter()
            response = await http.post(
                "/a2a/tasks/dispatch",
                json={"task": "ping", "targetAgent": "latency", "agentId": chat_agent, "chatId": f"lat{i}"},
            )
            assert response.json()["status"] == "accepted"
            while True:
                item = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
                if item is None:
                    raise TimeoutError("no inject within 5 s")
                data = json.loads(item["data"])
                if data["chatId"] == f"lat{i}" and data["mode"] == "delay":
                    samples.append((time.perf_counter() - t0) * 1000)
                    break
        await pubsub.aclose()
        await sub.aclose()
        await agent.ws.close()
    samples.sort()
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    return [f"{rounds} dispatches", f"{statistics.median(samples):.2f}", f"{p99:.2f}", f"{samples[-1]:.2f}"]


async def background(server, rounds: int) -> list[object]:
    port = server.port
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=DISPATCH_HEADERS, timeout=60) as http:
        agent = await connect(port, "bg", first_only=True)
        await wait_online(http, 1)

        async def one() -> tuple[float, float]:
            sid = (await http.post("/api/sessions", json={"agentId": "general-assistant"})).json()["id"]
            t0 = time.perf_counter()
            response = await http.post(f"/api/sessions/{sid}/messages", json={"content": "/background @bg go"})
            assert response.status_code == 202, response.text
            note_at = None
            deadline = t0 + 30
            while time.perf_counter() < deadline:
                rows = (await http.get(f"/api/sessions/{sid}/messages")).json()
                if note_at is None and any(m.get("injectMode") == "auto" for m in rows):
                    note_at = time.perf_counter()
                if note_at and rows[-1]["role"] == "assistant" and rows[-1]["content"].startswith("Result from"):
                    return (note_at - t0) * 1000, (time.perf_counter() - t0) * 1000
                await asyncio.sleep(0.005)
            raise TimeoutError(f"chat {sid}: no announcement within 30 s")

        await one()  # the first turn imports LiteLLM
        samples = [await one() for _ in range(rounds)]
        await agent.ws.close()

    def p(values: list[float], q: float) -> float:
        values = sorted(values)
        return values[min(len(values) - 1, int(len(values) * q))]

    notes, done = [s[0] for s in samples], [s[1] for s in samples]
    return [
        f"{rounds} chats",
        f"{statistics.median(notes):.1f}",
        f"{p(notes, 0.99):.1f}",
        f"{statistics.median(done):.1f}",
        f"{p(done, 0.99):.1f}",
    ]


async def main_async(args: argparse.Namespace) -> None:
    idle_n = 200 if args.quick else 1000
    events = 20 if args.quick else 100
    rounds = 50 if args.quick else 300
    env = {"REDIS_URL": args.redis, "DEMO_MODEL_DELAY_MS": "0", "BROKER_DISPATCH_TOKEN": DISPATCH_TOKEN}

    with running_server({**env, "INJECT_MIN_INTERVAL": "0"}) as server:
        idle = await idle_agents(server, idle_n)
        print("\n## Idle agents\n")
        print(table(["case", "RSS before MB", "RSS with them MB", "KiB per agent", "connect+register s"], idle))
        relay_rows = [await relay(server, args.redis, agents=20, per_agent=10, events=events, interval_label="0")]
        lat = [await latency(server, args.redis, rounds)]
        bg = [await background(server, 20 if args.quick else 100)]
    with running_server(env) as server:
        relay_rows.append(
            await relay(server, args.redis, agents=20, per_agent=10, events=events, interval_label="1000 (default)")
        )
    print("\n## 200 concurrent streaming tasks relayed to Redis\n")
    print(
        table(
            [
                "case",
                "events in",
                "wall s",
                "events/s in",
                "injects out",
                "injects/s out",
                "throttled",
                "dropped (outbox full)",
                "server CPU µs/event",
            ],
            relay_rows,
        )
    )
    print("\n## Dispatch to first inject (at a Redis subscriber)\n")
    print(table(["case", "p50 ms", "p99 ms", "max ms"], lat))
    print("\n## Background dispatch from the app's chat: message to result note, and to announcement\n")
    print(table(["case", "note p50 ms", "note p99 ms", "announced p50 ms", "announced p99 ms"], bg))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller numbers, for a smoke run")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--deflate", action="store_true", help="agents negotiate permessage-deflate")
    args = parser.parse_args()
    global COMPRESSION
    COMPRESSION = "deflate" if args.deflate else None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the server inherits it: 1,000+ sockets
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
