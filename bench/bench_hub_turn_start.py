"""What a turn start costs Redis at the cluster's stream hub, with the hubs alone (issue 41).

One replica's hub runs turn starts as a chat turn makes them (the claim `create`, the turn's metadata, the stream
route's `refresh` and its reader's replay, 4 events, the end), `--concurrency` at a time, while `--others` more
hubs in the same process stand for the other replicas: each mirrors every change (before the changes carried the
state, each read every change back). Reported per turn start: Redis's CPU (`INFO cpu`, less its idle rate measured
just before), its commands (`INFO commandstats`, those scripts run included), its socket reads (`total_reads_processed`:
about one per round trip, fewer when pipelined or concurrent requests arrive together) and bytes in and out, and this
process's CPU (the owner's and the others' client work together). `--concurrency 1`: one turn start at a time.

Needs Redis (TEST_REDIS_URL or redis://127.0.0.1:6379/0); nothing else may use that Redis meanwhile for a clean
figure (its CPU is the whole server's).

    .venv/bin/python bench/bench_hub_turn_start.py [--turns 600] [--concurrency 100] [--others 0 4] [--runs 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from core.streaming.redis_hub import RedisStreamHub  # noqa: E402
from tests.utils.cluster import delete_prefix  # noqa: E402


def server(url: str) -> tuple[float, float, Counter[str]]:
    """Redis's CPU seconds, its bytes in + out, and its command calls by name (`reads`: its read events), now."""
    client = redis.Redis.from_url(url)
    try:
        cpu, stats, commands = client.info("cpu"), client.info("stats"), client.info("commandstats")
    finally:
        client.close()
    calls = Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in commands.items()})
    calls["reads"] = int(stats.get("total_reads_processed", 0))  # Redis 6+: one per read of a client's socket
    return (
        float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
        float(stats["total_net_input_bytes"]) + float(stats["total_net_output_bytes"]),
        calls,
    )


async def one_turn(hub: RedisStreamHub, key: str) -> None:
    await hub.create(key, meta={})
    await hub.update_meta(key, userSortOrder=1, userMessageId=2, agentSlug="helper", draftId=3)
    await hub.refresh(key)  # the stream route
    subscription = hub.subscribe(key)

    async def read() -> int:
        return len([event async for event in subscription])

    reader = asyncio.create_task(read())
    await asyncio.sleep(0)
    for type, data in (("start", {}), ("text-start", {"id": "t"}), ("text-delta", {"id": "t", "delta": "hi"})):
        await hub.append(key, type, data)
    await hub.append(key, "text-end", {"id": "t"})
    await hub.finish(key)
    assert await asyncio.wait_for(reader, 10) == 4


async def run(url: str, turns: int, concurrency: int, others: int) -> dict[str, float]:
    prefix = f"bench-turn-start-{secrets.token_hex(4)}:"
    hubs = [RedisStreamHub.from_url(url, prefix=prefix, owner=f"r{i}", ttl_s=60) for i in range(1 + others)]
    for hub in hubs:
        await hub.start()
    owner = hubs[0]
    try:
        await asyncio.gather(*(one_turn(owner, f"warm-{i}") for i in range(concurrency)))  # pools, scripts loaded
        await asyncio.sleep(0.5)
        idle_cpu, _, _ = server(url)
        await asyncio.sleep(1.0)
        idle_rate = server(url)[0] - idle_cpu
        cpu0, bytes0, calls0 = server(url)
        client0, wall0 = time.process_time(), time.monotonic()
        for start in range(0, turns, concurrency):
            await asyncio.gather(*(one_turn(owner, f"t-{i}") for i in range(start, min(turns, start + concurrency))))
        last = f"t-{turns - 1}"
        deadline = time.monotonic() + 10
        while any((info := hub.get(last)) is None or info.state.value != "done" for hub in hubs[1:]):
            assert time.monotonic() < deadline, "the other replicas did not hear of the last turn's end"
            await asyncio.sleep(0.01)
        wall = time.monotonic() - wall0
        client = time.process_time() - client0
        cpu1, bytes1, calls1 = server(url)
    finally:
        for hub in hubs:
            await hub.stop()
        delete_prefix(url, prefix)
    calls = calls1 - calls0
    reads = calls.pop("reads", 0)
    for name in ("info", "scan", "del"):  # this bench's own
        calls.pop(name, None)
    return {
        "redis_us": (cpu1 - cpu0 - idle_rate * wall) / turns * 1e6,
        "commands": sum(calls.values()) / turns,
        "reads": reads / turns,
        "bytes": (bytes1 - bytes0) / turns,
        "client_us": client / turns * 1e6,
        "top": " ".join(f"{name} {n / turns:.1f}" for name, n in calls.most_common(12)),  # type: ignore[dict-item]
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--others", type=int, nargs="+", default=[0, 4])
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    url = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    print(f"load {os.getloadavg()[0]:.2f}; {args.turns} turn starts, {args.concurrency} at a time")
    print(
        "| run | other replicas | Redis CPU µs | commands | socket reads | bytes | client CPU µs (all hubs) "
        "| commands by name |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for run_no in range(1, args.runs + 1):
        for others in args.others:
            f = await run(url, args.turns, args.concurrency, others)
            print(
                f"| {run_no} | {others} | {f['redis_us']:.0f} | {f['commands']:.1f} | {f['reads']:.1f} "
                f"| {f['bytes']:,.0f} | {f['client_us']:,.0f} | {f['top']} |"
            )
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
