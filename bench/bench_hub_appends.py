"""What a streamed token costs at the cluster's stream hub, with the hub alone (issue 41): its client and Redis.

Two parts, each `--runs` times, in a process on CPU 1 (`--cpu`), with one `RedisStreamHub` as `from_url` makes it
for a replica, on `--streams` streams it opened:

- **the batches alone**: `--batches` batches of one append to each stream (`AppendBatches`, the common path: the
  leases valid), each batch submitted at once and awaited; per append this process's CPU, the part of it spent
  sending the batch (`AppendBatches._send`: packing, the round trip, the replies), and Redis's CPU;
- **the hub**: `--appends` appends to each stream at `--rate` per second, all streams at once, as that many turns
  streaming would. Per append: this process's CPU (the hub's client work: the batches, redis-py, the loop),
  Redis's CPU (`INFO cpu`, less its idle rate measured just before), Redis's command time (`INFO commandstats`
  usec; a script's time includes the commands it runs, which count again), its commands and socket reads
  (`total_reads_processed`: about one per round trip), and its bytes in and out.

`--no-hiredis` hides hiredis from redis-py for the run (its pure-Python reply parser then), to measure what
hiredis changes. Needs Redis (TEST_REDIS_URL or redis://127.0.0.1:6379/0); nothing else may use that Redis
meanwhile for a clean figure (its CPU is the whole server's). Run it under `flock /tmp/bench.lock`.

    .venv/bin/python bench/bench_hub_appends.py [--streams 100] [--appends 150] [--rate 50] [--batches 400]
                                                [--runs 3] [--cpu 1] [--no-hiredis]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if "--no-hiredis" in sys.argv:
    sys.modules["hiredis"] = None  # type: ignore[assignment]  # redis-py's import of it fails: no hiredis parser

import redis  # noqa: E402
from redis.utils import HIREDIS_AVAILABLE  # noqa: E402

from bench.bench_hub_turn_start import server  # noqa: E402
from core.streaming.redis_batches import Append  # noqa: E402
from core.streaming.redis_hub import RedisStreamHub  # noqa: E402
from tests.utils.cluster import delete_prefix  # noqa: E402

#: Redis's own figures per command (`INFO commandstats`): the call counts and microseconds.
Stats = dict[str, tuple[int, float]]


def command_stats(url: str) -> Stats:
    """Redis's `commandstats` now: calls and usec by command name."""
    client = redis.Redis.from_url(url)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return {name.removeprefix("cmdstat_"): (int(v["calls"]), float(v["usec"])) for name, v in stats.items()}


@asynccontextmanager
async def hub_with_streams(url: str, streams: int) -> AsyncIterator[tuple[RedisStreamHub, list[str]]]:
    """A started hub (as `from_url` makes it for a replica) and `streams` streams it opened; all removed after."""
    prefix = f"bench-appends-{secrets.token_hex(4)}:"
    hub = RedisStreamHub.from_url(url, prefix=prefix, owner="r0", ttl_s=60)
    await hub.start()
    keys = [f"s-{i}" for i in range(streams)]
    try:
        for key in keys:
            await hub.create(key, meta={})
        yield hub, keys
    finally:
        await hub.stop()
        delete_prefix(url, prefix)


async def one_stream(hub: RedisStreamHub, key: str, appends: int, interval: float) -> None:
    """`appends` events at `interval` s apart (on a clock: a late one does not push the next back)."""
    start = time.monotonic()
    for n in range(appends):
        await hub.append(key, "text-delta", {"id": "t", "delta": f" word{n}"})
        delay = start + (n + 1) * interval - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


async def run(url: str, streams: int, appends: int, rate: float) -> dict[str, float]:
    async with hub_with_streams(url, streams) as (hub, keys):
        await asyncio.gather(*(one_stream(hub, key, 3, 0.0) for key in keys))  # pools warm
        await asyncio.sleep(0.5)
        idle_cpu = server(url)[0]
        await asyncio.sleep(1.0)
        idle_rate = server(url)[0] - idle_cpu
        stats0 = command_stats(url)
        cpu0, bytes0, calls0 = server(url)
        client0, wall0 = time.process_time(), time.monotonic()
        await asyncio.gather(*(one_stream(hub, key, appends, 1 / rate) for key in keys))
        wall = time.monotonic() - wall0
        client = time.process_time() - client0
        cpu1, bytes1, calls1 = server(url)
        stats1 = command_stats(url)
    total = streams * appends
    calls = calls1 - calls0
    reads = calls.pop("reads", 0)
    usec = sum(stats1[name][1] - stats0.get(name, (0, 0.0))[1] for name in stats1 if name != "info")
    calls.pop("info", None)  # this bench's own
    return {
        "client_us": client / total * 1e6,
        "redis_us": (cpu1 - cpu0 - idle_rate * wall) / total * 1e6,
        "command_us": usec / total,
        "commands": sum(calls.values()) / total,
        "reads": reads / total,
        "bytes": (bytes1 - bytes0) / total,
        "wall": wall,
        "top": " ".join(f"{name} {n / total:.2f}" for name, n in calls.most_common(4)),  # type: ignore[dict-item]
    }


async def batches_alone(url: str, streams: int, batches: int) -> dict[str, float]:
    """The owner's batches alone (`AppendBatches`, the common path: leases valid): `batches` batches of one append
    to each of `streams` streams, each batch submitted at once and awaited; per append, this process's CPU and
    Redis's.
    """
    payload = json.dumps({"id": "t", "delta": " word"})
    async with hub_with_streams(url, streams) as (hub, keys):
        appends = hub._appends

        async def batch(event_id: int) -> None:
            calls = [
                appends.submit(
                    Append(key, event_id, [hub._keys.stream(key), hub._keys.hash(key)], "text-delta", payload)
                )
                for key in keys
            ]
            assert await asyncio.gather(*calls) == [event_id] * len(keys)

        sending = 0.0  # this process's CPU inside `AppendBatches._send`: nothing else runs meanwhile here
        send = appends._send

        async def timed_send(batch: list[Append]) -> list[Any]:
            nonlocal sending
            start = time.process_time()
            try:
                return await send(batch)
            finally:
                sending += time.process_time() - start

        appends._send = timed_send  # type: ignore[method-assign]
        for event_id in range(1, 4):  # pools warm
            await batch(event_id)
        cpu0 = server(url)[0]
        client0, sending = time.process_time(), 0.0
        for event_id in range(4, 4 + batches):
            await batch(event_id)
        client = time.process_time() - client0
        cpu1 = server(url)[0]
    total = streams * batches
    return {
        "client_us": client / total * 1e6,
        "send_us": sending / total * 1e6,
        "redis_us": (cpu1 - cpu0) / total * 1e6,
    }


async def main(args: argparse.Namespace) -> None:
    url = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    print(
        f"load {os.getloadavg()[0]:.2f}; {args.streams} streams x {args.appends} appends at {args.rate:g}/s; "
        f"CPU {args.cpu}; hiredis {HIREDIS_AVAILABLE}"
    )
    print(f"The batches alone: {args.batches} batches of {args.streams} appends, back to back")
    print("| run | client CPU µs/append | of it, sending the batch | Redis CPU µs/append |")
    print("|---|---|---|---|")
    for run_no in range(1, args.runs + 1):
        f = await batches_alone(url, args.streams, args.batches)
        print(f"| {run_no} | {f['client_us']:.1f} | {f['send_us']:.1f} | {f['redis_us']:.1f} |")
    print(f"The hub: {args.streams} streams at {args.rate:g} appends/s each")
    print(
        "| run | client CPU µs/append | Redis CPU µs/append | Redis command µs/append | commands/append "
        "| socket reads/append | bytes/append | wall s | commands by name |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for run_no in range(1, args.runs + 1):
        f = await run(url, args.streams, args.appends, args.rate)
        print(
            f"| {run_no} | {f['client_us']:.1f} | {f['redis_us']:.1f} | {f['command_us']:.2f} | {f['commands']:.2f} "
            f"| {f['reads']:.3f} | {f['bytes']:.0f} | {f['wall']:.1f} | {f['top']} |"
        )
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--appends", type=int, default=150)
    parser.add_argument("--rate", type=float, default=50.0, help="appends per second per stream")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batches", type=int, default=400, help="batches of the batches alone")
    parser.add_argument("--cpu", type=int, default=1, help="the CPU this process runs on")
    parser.add_argument("--no-hiredis", action="store_true", help="redis-py without hiredis (its Python parser)")
    arguments = parser.parse_args()
    os.sched_setaffinity(0, {arguments.cpu})
    asyncio.run(main(arguments))
