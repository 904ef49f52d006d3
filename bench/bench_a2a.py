"""Standard A2A throughput (issue 6): updates/s of `SendStreamingMessage`, the app against a plain a2a-sdk server.

- **app**: `python app.py` (demo model, zero delay), the seeded `coding-assistant`
  asked `/lorem N`: N tokens as status updates (the tokens that are ready
  together share one update), then the artifact and the terminal state, through
  the delegation, the hub and the A2A server.
- **plain**: `tests/utils/a2a_echo_server.py`, a server made only of the a2a-sdk's
  own parts (DefaultRequestHandler, InMemoryTaskStore, its routes), asked
  `/ticks N`: N status updates with a text message each, then the artifact and
  completed.

Both run as their own processes on 127.0.0.1 and are driven, one call at a
time, by the official a2a-sdk client in this process. The rate is N updates
over the time from sending the request to the end of the stream, whatever the
number of events that carried them (also shown): a client gets the same text
either way. The budget (issue 6): the ratio app / plain at least 1.0.

    .venv/bin/python bench/bench_a2a.py [--sizes 500 2000] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory  # noqa: E402
from a2a.types import Message, Part, Role, SendMessageRequest  # noqa: E402

from bench._common import (  # noqa: E402
    PYTHON,
    ROOT,
    cpu_seconds,
    free_port,
    http_json,
    median,
    spawn,
    stop,
    table,
    wait_first_200,  # noqa: E402
)

ECHO_SERVER = ROOT / "tests" / "utils" / "a2a_echo_server.py"
HEADER = ["updates", "server", "events", "updates/s", "range", "server CPU µs/update"]


async def stream_once(agent_url: str, key: str | None, text: str) -> tuple[int, float]:
    """One streamed call: (events received, seconds from request to end of stream)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(headers=headers, timeout=120) as http:
        card = await A2ACardResolver(http, agent_url).get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create(card)
        request = SendMessageRequest(
            message=Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=[Part(text=text)])
        )
        count = 0
        started = time.perf_counter()
        async for _ in client.send_message(request):
            count += 1
        elapsed = time.perf_counter() - started
        await client.close()
    return count, elapsed


def start_plain(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [PYTHON, str(ECHO_SERVER), "--port", str(port), "--name", "Plain"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/.well-known/agent-card.json", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the plain a2a-sdk server did not start")
        time.sleep(0.05)


async def measure(name: str, pid: int, agent_url: str, key: str | None, text: str, updates: int, runs: int) -> dict:
    """`runs` calls after a warm-up: median updates/s, its range, events of the last call, CPU µs per update."""
    await stream_once(agent_url, key, text)  # warm-up (imports, first model call, connections)
    rates, events, cpu = [], 0, []
    for _ in range(runs):
        before = cpu_seconds(pid)
        events, elapsed = await stream_once(agent_url, key, text)
        cpu.append((cpu_seconds(pid) - before) / updates * 1e6)
        rates.append(updates / elapsed)
    return {
        "name": name,
        "events": events,
        "rate": median(rates),
        "min": min(rates),
        "max": max(rates),
        "cpu_us": median(cpu),
    }


async def compare(sizes: list[int], runs: int) -> list[list[object]]:
    """The app against the plain a2a-sdk server at each size, interleaved; the table's rows (with the ratio)."""
    with tempfile.TemporaryDirectory(prefix="bench-a2a-") as tmp:
        app_port = free_port()
        app = spawn(
            Path(tmp) / "data",
            port=app_port,
            env_extra={
                "DEMO_MODEL_DELAY_MS": "0",
                "PUBLIC_BASE_URL": f"http://127.0.0.1:{app_port}",
                "STREAM_BUFFER_MAX_EVENTS": "50000",
            },
        )
        plain_port = free_port()
        plain = start_plain(plain_port)
        try:
            wait_first_200(app, path="/api/me")
            status, created = http_json(app_port, "POST", "/api/a2a/keys", {"name": "bench"})
            assert status == 201, (status, created)
            key = created["key"]
            app_url = f"http://127.0.0.1:{app_port}/a2a/agents/coding-assistant"
            plain_url = f"http://127.0.0.1:{plain_port}"
            rows: list[list[object]] = []
            for size in sizes:
                # Interleaved, so both see the same machine load.
                ours = await measure("app", app.pid, app_url, key, f"/lorem {size}", size, runs)
                theirs = await measure("plain a2a-sdk", plain.pid, plain_url, None, f"/ticks {size}", size, runs)
                for result in (ours, theirs):
                    rows.append(
                        [
                            size,
                            result["name"],
                            result["events"],
                            f"{result['rate']:,.0f}",
                            f"{result['min']:,.0f}–{result['max']:,.0f}",
                            f"{result['cpu_us']:.0f}",
                        ]
                    )
                rows.append([size, "ratio app / plain", "", f"{ours['rate'] / theirs['rate']:.2f}", "", ""])
        finally:
            stop(app)
            plain.terminate()
            plain.wait(10)
    return rows


async def main() -> None:
    """Print the table for the sizes asked."""
    parser = argparse.ArgumentParser(description="A2A SendStreamingMessage updates/s: app vs plain a2a-sdk server")
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 2000], help="status updates per task")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    rows = await compare(args.sizes, args.runs)
    print(
        f"SendStreamingMessage, one client, loopback; median of {args.runs} runs after a warm-up (budget: ratio ≥ 1.0)"
    )
    print(table(HEADER, rows))


if __name__ == "__main__":
    asyncio.run(main())
