"""Delegation benchmarks (issue: agent delegation with a live side panel).

1. Chunk latency: a callee's text chunk is appended to its task buffer at time t0
   (recorded by wrapping `StreamHub.append`); it reaches (a) an in-process hub
   subscriber and (b) an SSE client of `GET /api/agents/a2a/stream` on loopback
   at t1. p50 / p99 of t1 - t0 over 10,000 chunks (`@coding-assistant /lorem 10000`).
   The demo model pauses 1 ms between tokens, as a fast real model would.
2. 100 concurrent delegations on the demo model with zero delay: all complete?
   wall time and peak RSS growth. (Zero delay saturates the event loop with 200
   token streams; on SQLite every unit of work then waits its turn behind them.)

Everything runs in this process (uvicorn in a thread for the SSE part) on a
fresh SQLite file, so t0 and t1 share one clock.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench._common import table  # noqa: E402
from core.delegation import task_stream_key  # noqa: E402
from core.services import Services  # noqa: E402
from core.settings import Settings  # noqa: E402
from core.streaming.hub import StreamHub  # noqa: E402

CHUNKS = 10_000


def build(tmp: Path, delay_ms: float) -> Services:
    # BENCH_DATABASE_URL=postgresql://... runs the same on PostgreSQL (default: a fresh SQLite file).
    settings = Settings(
        _env_file=None,
        data_dir=tmp / "data",
        demo_model_delay_ms=delay_ms,
        database_url=os.environ.get("BENCH_DATABASE_URL") or None,
        stream_buffer_max_events=50_000,
        stream_subscriber_queue=50_000,
    )
    services = Services.build(settings)
    services.prepare()
    return services


class AppendClock:
    """Records when each event of a task buffer was appended: (key, id) → perf_counter."""

    def __init__(self, hub: StreamHub) -> None:
        self.times: dict[tuple[str, int], float] = {}
        original = hub.append

        async def timed_append(key: str, type: str, data=None) -> int:
            event_id = await original(key, type, data)
            if type == "text-delta" and key.startswith("a2a_"):
                self.times[(key, event_id)] = time.perf_counter()
            return event_id

        hub.append = timed_append  # type: ignore[method-assign]


async def start_delegation(services: Services, text: str) -> str:
    """Start a delegating turn; returns the caller session id."""
    session = await services.workspace.create(services.auth.local_user_id, "general-assistant")
    await services.chat.start_turn(session_id=session.id, user_id=services.auth.local_user_id, text=text)
    return session.id


async def first_task_key(services: Services, session_id: str) -> str:
    async for event in services.hub.subscribe(session_id):
        if event.type == "a2a-task-started":
            return task_stream_key(event.data["taskId"])
    raise RuntimeError("no delegation started")


def percentiles(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered) * 1000, p99 * 1000, ordered[-1] * 1000


async def in_process_latency(tmp: Path) -> list[object]:
    services = build(tmp / "inproc", delay_ms=1)
    await services.start()
    clock = AppendClock(services.hub)
    try:
        session_id = await start_delegation(services, f"@coding-assistant /lorem {CHUNKS}")
        key = await first_task_key(services, session_id)
        latencies = []
        async for event in services.hub.subscribe(key):
            if event.type == "text-delta":
                latencies.append(time.perf_counter() - clock.times[(key, event.id)])
        await services.chat.wait(session_id, timeout=120)
    finally:
        await services.stop()
    p50, p99, worst = percentiles(latencies)
    return ["in-process subscriber", len(latencies), f"{p50:.3f}", f"{p99:.3f}", f"{worst:.3f}"]


async def sse_latency(tmp: Path) -> list[object]:
    import uvicorn
    from fastapi import FastAPI

    from core.routes import api_router

    services = build(tmp / "sse", delay_ms=1)
    app = FastAPI()
    app.state.services = services
    app.include_router(api_router())
    clock = AppendClock(services.hub)
    ready = threading.Event()
    holder: dict[str, object] = {}

    def serve() -> None:
        async def run() -> None:
            await services.start()
            config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
            server = uvicorn.Server(config)
            holder["server"], holder["loop"] = server, asyncio.get_running_loop()
            task = asyncio.create_task(server.serve())
            while not server.started:
                await asyncio.sleep(0.01)
            holder["port"] = server.servers[0].sockets[0].getsockname()[1]
            ready.set()
            await task
            await services.stop()

        asyncio.run(run())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(30)
    base = f"http://127.0.0.1:{holder['port']}"
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        session = (await client.post("/api/sessions", json={"agentId": "general-assistant"})).json()
        turn = (
            await client.post(
                f"/api/sessions/{session['id']}/messages", json={"content": f"@coding-assistant /lorem {CHUNKS}"}
            )
        ).json()
        task_id = None
        async with client.stream("GET", turn["streamUrl"]) as response:
            async for line in response.aiter_lines():
                if line.startswith("data:") and "a2a-task-started" in line:
                    task_id = json.loads(line[5:])["taskId"]
                    break
        key = task_stream_key(task_id)
        async with client.stream("GET", f"/api/agents/a2a/stream?taskId={task_id}") as response:
            event_id = None
            async for line in response.aiter_lines():
                if line.startswith("id:"):
                    event_id = int(line[3:].strip())
                elif line.startswith("data:") and '"textDelta"' in line:  # the seeds' task shape
                    latencies.append(time.perf_counter() - clock.times[(key, event_id)])
    server = holder["server"]
    server.should_exit = True  # type: ignore[attr-defined]
    thread.join(30)
    p50, p99, worst = percentiles(latencies)
    return ["SSE client on loopback", len(latencies), f"{p50:.3f}", f"{p99:.3f}", f"{worst:.3f}"]


async def concurrent_delegations(tmp: Path, n: int = 100) -> list[list[object]]:
    services = build(tmp / "many", delay_ms=0)
    await services.start()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        started = time.perf_counter()
        sessions = await asyncio.gather(*(start_delegation(services, f"@coding-assistant job {i}") for i in range(n)))
        await asyncio.gather(*(services.chat.wait(s, timeout=600) for s in sessions))
        wall = time.perf_counter() - started
    finally:
        rows = await services.delegation.list_tasks(services.auth.local_user_id, limit=10 * n)
        await services.stop()
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    completed = sum(1 for t in rows if t.state == "completed")
    return [
        ["delegations started", n],
        ["tasks completed", f"{completed} of {len(rows)}"],
        ["wall time s", f"{wall:.2f}"],
        ["per delegation ms (wall / n)", f"{wall / n * 1000:.1f}"],
        ["peak RSS growth MB (ru_maxrss)", f"{(rss_after - rss_before) / 1024:.1f}"],
    ]


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        print(f"Chunk latency, append into a2a_<taskId> → subscriber, {CHUNKS:,} chunks, demo delay 1 ms\n")
        rows = [await in_process_latency(tmp)]
        rows.append(await sse_latency(tmp))
        print(table(["path", "chunks", "p50 ms", "p99 ms", "max ms"], rows))
        engine = "PostgreSQL" if os.environ.get("BENCH_DATABASE_URL") else "SQLite"
        print(f"\n100 concurrent delegations, demo model with zero delay, {engine}\n")
        print(table(["measure", "value"], await concurrent_delegations(tmp)))


if __name__ == "__main__":
    asyncio.run(main())
