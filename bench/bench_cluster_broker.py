"""What the broker across replicas costs (docs/ARCHITECTURE.md, "Cluster: the broker across replicas").

Two replicas in cluster mode on a fresh PostgreSQL database and one Redis; a bench agent (answers at once:
one working event, then completed) dials into A. Dispatches go to A (the agent's own replica) and to B
(forwarded to A over the internal route), one at a time, alternating:

- the ack: `POST /a2a/tasks/dispatch` until its answer;
- to the first inject: the dispatch until the `delay` inject reaches a Redis subscriber.

Prints p50 / p99 per case and the ratio B / A of the medians; and `uptime`, since the machine is shared.

    TEST_REDIS_URL=redis://127.0.0.1:6379/0 .venv/bin/python bench/bench_cluster_broker.py [--rounds 200]
        [--postgres postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import redis.asyncio as redis
from _common import table
from bench_broker import connect

from tests.conftest import DEFAULT_POSTGRES_URL
from tests.utils.broker import DISPATCH_HEADERS
from tests.utils.broker_replicas import two_replicas
from tests.utils.cluster import cluster_backends


def p(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank)."""
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


async def measure(base_urls: dict[str, str], redis_url: str, rounds: int) -> dict[str, tuple[list[float], list[float]]]:
    """Ack and first-inject latencies (ms) per case, dispatching alternately to each replica."""
    chat_agent = random.randint(10**9, 10**10)
    port_a = int(base_urls["A (agent here)"].rsplit(":", 1)[1])
    agent = await connect(port_a, "bench-echo", first_only=True)
    results: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in base_urls}
    sub = redis.Redis.from_url(redis_url)
    pubsub = sub.pubsub()
    await pubsub.subscribe(f"agent:events:{chat_agent}")
    await pubsub.get_message(timeout=1)
    async with httpx.AsyncClient(headers=DISPATCH_HEADERS, timeout=30) as http:
        deadline = time.monotonic() + 30
        for url in base_urls.values():  # both replicas list it (B through the directory)
            while "bench-echo" not in {a["a2a_id"] for a in (await http.get(f"{url}/a2a/agents")).json()["agents"]}:
                assert time.monotonic() < deadline, "the bench agent did not come online"
                await asyncio.sleep(0.1)
        for i in range(rounds + 10):  # the first 10 warm up
            for name, url in base_urls.items():
                chat_id = f"c{i}-{name[0]}"
                t0 = time.perf_counter()
                response = await http.post(
                    f"{url}/a2a/tasks/dispatch",
                    json={"task": "ping", "targetAgent": "bench-echo", "agentId": chat_agent, "chatId": chat_id},
                )
                acked = time.perf_counter()
                assert response.json()["status"] == "accepted", response.text
                while True:
                    item = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
                    if item is None:
                        raise TimeoutError("no inject within 5 s")
                    data = json.loads(item["data"])
                    if data["chatId"] == chat_id and data["mode"] == "delay":
                        break
                if i >= 10:
                    results[name][0].append((acked - t0) * 1000)
                    results[name][1].append((time.perf_counter() - t0) * 1000)
    await pubsub.aclose()
    await sub.aclose()
    await agent.ws.close()
    return results


def main() -> None:
    """Run and print."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES_URL)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp,
        cluster_backends(args.postgres) as backends,
        two_replicas(backends, Path(tmp), DEMO_MODEL_DELAY_MS="0") as replicas,
    ):
        urls = {"A (agent here)": replicas.a.base_url, "B (forwarded to A)": replicas.b.base_url}
        results = asyncio.run(measure(urls, backends.redis_url, args.rounds))
    rows = [
        [
            name,
            f"{args.rounds}",
            f"{statistics.median(ack):.2f}",
            f"{p(ack, 0.99):.2f}",
            f"{statistics.median(first):.2f}",
            f"{p(first, 0.99):.2f}",
        ]
        for name, (ack, first) in results.items()
    ]
    (ack_a, first_a), (ack_b, first_b) = results.values()
    print("\n## Dispatch across replicas (cluster mode)\n")
    print(
        table(
            ["dispatched to", "rounds", "ack p50 ms", "ack p99 ms", "first inject p50 ms", "first inject p99 ms"], rows
        )
    )
    print(
        f"\nforwarded / local, medians: ack {statistics.median(ack_b) / statistics.median(ack_a):.2f}x, "
        f"first inject {statistics.median(first_b) / statistics.median(first_a):.2f}x"
    )
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
