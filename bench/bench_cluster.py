"""What running as a cluster costs and gives (issue 18; docs/ARCHITECTURE.md, "Cluster").

1. Added latency per event, producer to subscriber: the in-memory hub vs the Redis hub with the
   producer on one replica's hub and the subscriber on another's (two clients; 1 ms pace), p50/p99.
2. Capacity: concurrent chat turns streaming at 50 tokens/s (`/slow N 20`) that one process
   sustains while the p99 of the added inter-token delay (gap - 20 ms, seen by an SSE reader) stays
   <= 50 ms; the same for one replica and for two replicas in cluster mode (turns spread over both).
3. The longest event-loop block during a turn of `/lorem 2000` (a loop-lag probe beside the turn),
   in one in-process app on SQLite.

Needs PostgreSQL (TEST_POSTGRES_URL) and Redis (TEST_REDIS_URL) for the cluster parts. `--quick` runs
fewer events and concurrency steps. The load generator runs in this process: on a small machine it
competes with the replicas for CPU, so compare figures of one run, and read them with `uptime`.

    .venv/bin/python bench/bench_cluster.py [--quick]
    .venv/bin/python bench/bench_cluster.py --cost [bench_cluster_cost.py's options]

`--cost` runs `bench_cluster_cost.py` (issue 41): one process and one replica interleaved on the
same turns, the replica's CPU per token and per turn start against the process's, with what Redis
and PostgreSQL carry (CPU, statements, round trips, bytes), pinned with `--pin`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

TOKEN_GAP_MS = 20.0  # 50 tokens/s
ADDED_P99_BUDGET_MS = 50.0
SKIP_FIRST_TOKENS = 10


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- 1. added latency per event -----------------------------------------------------------------


async def hub_latency(events: int, redis_url: str | None) -> tuple[float, float]:
    """p50/p99 ms from append to a subscriber's receipt (Redis: producer and subscriber on different hubs)."""
    from core.streaming.hub import StreamHub

    key = f"bench-{secrets.token_hex(4)}"
    if redis_url is None:
        producer = reader = StreamHub()
        await producer.create(key)
        stop = None
    else:
        from redis.asyncio import Redis

        from core.streaming.redis_hub import RedisStreamHub

        prefix = f"bench-cluster-{secrets.token_hex(4)}:"
        producer = RedisStreamHub(Redis.from_url(redis_url, decode_responses=True), prefix=prefix, owner="a")
        reader = RedisStreamHub(Redis.from_url(redis_url, decode_responses=True), prefix=prefix, owner="b")
        await producer.start()
        await reader.start()
        await producer.create(key)
        await reader.refresh(key)

        async def stop() -> None:
            await producer.redis.delete(producer._stream(key), producer._hash(key), producer.open_set)
            await producer.stop()
            await reader.stop()

    delays: list[float] = []
    subscription = reader.subscribe(key)

    async def read() -> None:
        async for event in subscription:
            delays.append((time.perf_counter() - event.data["t"]) * 1000)

    task = asyncio.create_task(read())
    await asyncio.sleep(0.05)
    for _ in range(events):
        await producer.append(key, "text-delta", {"t": time.perf_counter()})
        await asyncio.sleep(0.001)
    await producer.finish(key)
    await asyncio.wait_for(task, 30)
    if stop is not None:
        await stop()
    return pct(delays, 0.5), pct(delays, 0.99)


# -- 2. capacity ------------------------------------------------------------------------------------


def free_port() -> int:
    from tests.utils.ports import free_port as free

    return free()


def start_app(data_dir: Path, port: int, **env: str) -> subprocess.Popen:
    from tests.utils.app_process import child_env

    data_dir.mkdir(parents=True, exist_ok=True)
    log = (data_dir.parent / f"app-{port}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "app.py"],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=child_env(data_dir, HOST="127.0.0.1", PORT=str(port), **env),
    )


def wait_serving(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"a replica exited with {proc.returncode}; see its log")
        try:
            if httpx.get(f"{url}/a2a/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} did not serve within 90 s")


async def one_turn(client: httpx.AsyncClient, tokens: int, gaps: list[float]) -> None:
    session = (await client.post("/api/sessions", json={"agentId": "coding-assistant"})).json()["id"]
    turn = await client.post(f"/api/sessions/{session}/messages", json={"content": f"/slow {tokens} 20"})
    turn.raise_for_status()
    after = turn.json()["afterEventId"]
    last: float | None = None
    seen = 0
    async with client.stream(
        "GET", f"/api/sessions/{session}/stream", headers={"Last-Event-ID": str(after)}, timeout=120
    ) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = json.loads(line[5:])
            if data.get("type") == "text-delta":
                now = time.perf_counter()
                seen += 1
                # The first tokens may come as a replay (the stream opened after the turn began): not live gaps.
                if last is not None and seen > SKIP_FIRST_TOKENS:
                    gaps.append(max(0.0, (now - last) * 1000 - TOKEN_GAP_MS))
                last = now
            elif data.get("type") == "finish":
                return


async def load(urls: list[str], concurrency: int, tokens: int, auth: tuple[str, str] | None) -> tuple[float, float]:
    """p50 and p99 added inter-token delay (ms) of `concurrency` turns spread over `urls`."""
    gaps: list[float] = []
    limits = httpx.Limits(max_connections=concurrency * 2 + 10)
    clients = [httpx.AsyncClient(base_url=u, auth=auth, timeout=120, limits=limits) for u in urls]
    try:
        await asyncio.gather(*(one_turn(clients[i % len(clients)], tokens, gaps) for i in range(concurrency)))
    finally:
        for c in clients:
            await c.aclose()
    return pct(gaps, 0.5), pct(gaps, 0.99)


async def capacity(urls: list[str], steps: list[int], tokens: int, auth) -> tuple[int, list[tuple[int, float]]]:
    sustained, seen = 0, []
    # Warm-up: LiteLLM's import and the first turn's costs are not measured.
    await load(urls, len(urls), SKIP_FIRST_TOKENS + 5, auth)
    await asyncio.sleep(3)
    for n in steps:
        p50, p99 = await load(urls, n, tokens, auth)
        seen.append((n, p99))
        print(
            f"    {len(urls)} process(es), {n:4d} turns: added inter-token delay p50 {p50:6.1f} ms, p99 {p99:7.1f} ms",
            flush=True,
        )
        if p99 > ADDED_P99_BUDGET_MS:
            break
        sustained = n
    return sustained, seen


def run_capacity(quick: bool, work: Path) -> dict[str, int]:
    from tests.conftest import DEFAULT_POSTGRES_URL, create_postgres_database, drop_postgres_database
    from tests.utils.broker import redis_test_url
    from tests.utils.cluster import ADMIN, ClusterBackends, add_account, delete_prefix

    steps = [5, 10, 20, 40] if quick else [5, 10, 20, 40, 50, 60, 80, 100, 120]
    tokens = 100 if quick else 200
    results: dict[str, int] = {}

    port = free_port()
    proc = start_app(work / "single" / "data", port, DEMO_MODEL_DELAY_MS="20")
    try:
        wait_serving(f"http://127.0.0.1:{port}", proc)
        print("  one process, default mode (SQLite, in-memory hub):")
        results["single"], _ = asyncio.run(capacity([f"http://127.0.0.1:{port}"], steps, tokens, None))
    finally:
        proc.terminate()
        proc.wait(30)

    server = os.environ.get("TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    db = create_postgres_database(server, prefix="a2a_bench_cluster")
    backends = ClusterBackends(
        database_url=db, redis_url=redis_test_url(), key_prefix=f"bench-cluster-{secrets.token_hex(4)}:"
    )
    try:
        add_account(backends, work / "cli")
        for count in (1, 2):
            procs, urls = [], []
            for n in range(count):
                port = free_port()
                url = f"http://127.0.0.1:{port}"
                procs.append(
                    start_app(
                        work / f"c{count}-{n}" / "data",
                        port,
                        DEMO_MODEL_DELAY_MS="20",
                        **backends.env(INSTANCE_ID=f"bench-{count}-{n}", REPLICA_URL=url),
                    )
                )
                urls.append(url)
            try:
                for url, p in zip(urls, procs, strict=True):
                    wait_serving(url, p)
                print(f"  cluster mode, {count} replica(s):")
                results[f"cluster{count}"], _ = asyncio.run(capacity(urls, steps, tokens, ADMIN))
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.wait(30)
    finally:
        delete_prefix(backends.redis_url, backends.key_prefix)
        drop_postgres_database(server, db)
    return results


# -- 3. the longest event-loop block during a turn --------------------------------------------------


async def loop_block(work: Path) -> float:
    from core.services import Services
    from core.settings import Settings

    settings = Settings(_env_file=None, data_dir=work / "loop" / "data", demo_model_delay_ms=0)
    services = Services.build(settings)
    services.prepare()
    await services.start()
    worst = 0.0
    running = True

    async def probe() -> None:
        nonlocal worst
        while running:
            started = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, (time.perf_counter() - started) * 1000 - 1)

    try:
        session = await services.workspace.create(services.auth.local_user_id, "coding-assistant")
        # Warm-up (LiteLLM's import on the first model call is not what this measures).
        await services.chat.start_turn(session_id=session.id, user_id=services.auth.local_user_id, text="/lorem 5")
        await services.chat.wait(session.id, timeout=120)
        probing = asyncio.create_task(probe())
        await services.chat.start_turn(session_id=session.id, user_id=services.auth.local_user_id, text="/lorem 2000")
        await services.chat.wait(session.id, timeout=120)
        running = False
        await probing
    finally:
        await services.stop()
    return worst


def main() -> None:
    if "--cost" in sys.argv:  # issue 41: a replica's cost against a process, and the shared services'
        from bench import bench_cluster_cost

        sys.argv = [a for a in sys.argv if a != "--cost"]
        asyncio.run(bench_cluster_cost.run(bench_cluster_cost.parser().parse_args()))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer events and concurrency steps")
    parser.add_argument("--cost", action="store_true", help="bench_cluster_cost.py: a replica's cost (issue 41)")
    args = parser.parse_args()
    from tests.utils.broker import redis_test_url

    print(f"load: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    events = 1_000 if args.quick else 5_000
    single = asyncio.run(hub_latency(events, None))
    cluster = asyncio.run(hub_latency(events, redis_test_url()))
    print(f"1. added latency per event ({events} events, 1 ms pace), p50 / p99:")
    print(f"   in-memory hub  {single[0]:7.3f} / {single[1]:7.3f} ms")
    print(
        f"   Redis hub      {cluster[0]:7.3f} / {cluster[1]:7.3f} ms  (added: {cluster[0] - single[0]:+.3f} / "
        f"{cluster[1] - single[1]:+.3f} ms)"
    )
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        print("2. capacity: concurrent turns at 50 tokens/s with p99 added inter-token delay <= 50 ms")
        found = run_capacity(args.quick, Path(tmp))
        print(
            f"   one process (default): {found['single']}; cluster 1 replica: {found['cluster1']}; "
            f"2 replicas: {found['cluster2']}  (2 / 1 replicas: "
            f"{found['cluster2'] / max(1, found['cluster1']):.2f}x; goal >= 1.8x)"
        )
        block = asyncio.run(loop_block(Path(tmp)))
        print(f"3. longest event-loop block during a /lorem 2000 turn (one process): {block:.1f} ms")
    print(f"load: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")


if __name__ == "__main__":
    main()
