"""Password checks under load: 50 concurrent chat turns with HTTP Basic, and `/a2a/health` under wrong passwords.

    .venv/bin/python bench/bench_basic_auth.py [--turns 50] [--wrong 100]

A server with one account (`bench`) is started on 127.0.0.1 in a fresh data folder. Then:

1. accept time: `--turns` chat turns posted at once, each with Basic credentials, to sessions made
   beforehand; the time until the last one is accepted (202), and each request's latency;
2. health under attack: `--wrong` requests with a wrong password sent at once from this address,
   while `GET /a2a/health` (no credentials) is timed every 20 ms.

argon2 costs about 0.1 s of CPU per verification: checked on the event loop, every request waits
for all the checks queued before it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PYTHON, ROOT, clean_env, cpu_seconds, median, spawn, stop, table, wait_first_200  # noqa: E402

USER, PASSWORD = "bench", "bench-password"


def create_account(data_dir: Path) -> None:
    env = clean_env(data_dir, 3100, APP_USER_PASSWORD=PASSWORD)  # the port is not used by `users`
    subprocess.run([PYTHON, "app.py", "users", "add", USER], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True)


async def accept_time(base: str, turns: int) -> tuple[float, list[float]]:
    async with httpx.AsyncClient(base_url=base, auth=(USER, PASSWORD), timeout=120) as client:
        sessions = [(await client.post("/api/sessions", json={})).json()["id"] for _ in range(turns)]

        async def post(session_id: str) -> float:
            started = time.perf_counter()
            response = await client.post(f"/api/sessions/{session_id}/messages", json={"content": "hello"})
            assert response.status_code == 202, response.text
            return time.perf_counter() - started

        started = time.perf_counter()
        latencies = await asyncio.gather(*(post(s) for s in sessions))
        return time.perf_counter() - started, list(latencies)


async def health_under_wrong_passwords(base: str, wrong: int) -> tuple[list[float], dict[int, int]]:
    statuses: dict[int, int] = {}
    health: list[float] = []
    async with httpx.AsyncClient(base_url=base, timeout=120) as attacker, \
            httpx.AsyncClient(base_url=base, timeout=120) as prober:

        async def attempt(i: int) -> None:
            response = await attacker.get("/api/sessions", auth=(USER, f"wrong-{i}"))
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

        attack = asyncio.gather(*(attempt(i) for i in range(wrong)))
        while not attack.done():
            started = time.perf_counter()
            assert (await prober.get("/a2a/health")).status_code == 200
            health.append(time.perf_counter() - started)
            await asyncio.sleep(0.02)
        await attack
    return health, statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--wrong", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-auth-") as tmp:
        data = Path(tmp) / "data"
        create_account(data)
        server = spawn(data, env_extra={"DEMO_MODEL_DELAY_MS": "5"})
        try:
            wait_first_200(server, path="/login")
            base = f"http://127.0.0.1:{server.port}"
            cpu_before = cpu_seconds(server.pid)
            total, latencies = asyncio.run(accept_time(base, args.turns))
            cpu_turns = cpu_seconds(server.pid) - cpu_before
            time.sleep(3)  # the turns finish
            health, statuses = asyncio.run(health_under_wrong_passwords(base, args.wrong))
        finally:
            stop(server)
    print(f"Basic auth under load; 2 CPUs ({os.cpu_count()} reported), commit under test: {ROOT}\n")
    print(table(["measure", "value"], [
        [f"{args.turns} concurrent turns: all accepted after (s)", f"{total:.2f}"],
        ["  per request latency median / max (s)", f"{median(latencies):.2f} / {max(latencies):.2f}"],
        ["  server CPU while accepting (s)", f"{cpu_turns:.2f}"],
        [f"{args.wrong} wrong passwords: /a2a/health median / max (ms)",
         f"{median(health) * 1000:.0f} / {max(health) * 1000:.0f}"],
        ["  answers to the wrong passwords", ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items()))],
    ]))


if __name__ == "__main__":
    main()
