r"""Capacity (issue 19): N concurrent streaming turns in one process, and how smooth each stream stays.

    .venv/bin/python bench/bench_capacity.py [--quick] [--sizes 10 25 50 100 200] [--streams chat a2a] [--pin]
                                             [--tokens 150] [--delay-ms 20] [--no-ratio]
    .venv/bin/python bench/bench_capacity.py --model openai [bench_model_path.py's options]

`--model openai` runs `bench_model_path.py`: the chat stream through LiteLLM to a bundled fake
OpenAI-compatible server beside the demo model, in one run, and the ratio (issue 38).

One `python app.py` (demo model at `--delay-ms` between tokens: 20 ms is 50
tokens/s; `LOOP_PROBE=1` so the server measures its longest event-loop block).
For each N, at once:

- **chat**: N chats (created beforehand over `POST /api/sessions`) are each sent
  `/lorem 150` (`POST /api/sessions/{id}/messages`) and their `streamUrl` is read
  to its end;
- **a2a**: N A2A `SendStreamingMessage` calls to the seeded `coding-assistant`
  (JSON-RPC over HTTP, an API key), each `/lorem 150`, each stream read to its end.

The client is raw sockets in this process (one per stream, `Connection: close`),
so the client's own cost per event stays small next to the server's; it stamps
each read with `perf_counter()` and splits it into SSE events. A token event is
a `text-delta` (chat) or a status update carrying an agent message (A2A). Events
that arrive in one read share its stamp (a burst shows as 0 ms gaps).

Per N:

- tokens/s delivered: token events received by all clients / wall time from the
  first request to the end of the last stream;
- gap p50 / p99 / longest: between consecutive token events of one stream, over
  all streams; added p99 = gap p99 - the model's delay (what the server added);
- first token p50 / max: from the first request to a stream's first token event;
- gaps < 2 ms: the share of gaps that are bursts, tokens read together. A stream
  opened after its turn had streamed most of its reply is read as a replay, all
  at once, and its gaps say nothing about pacing; over 10 % marks the row as read
  in bursts (the goal line says so);
- server CPU per token: user+system CPU of the server process over the same span
  (from /proc) / token events;
- longest loop block: the server's event-loop probe (`core/web/loop_probe.py`),
  a window opened with SIGUSR1 before the requests and read with SIGUSR1 after
  the last stream; when it ended (seconds after the first request: the turns
  start in the first second or two) and how many blocks passed 20 ms; in the
  same window, the longest garbage collection (and its generation) and the
  number of full collections. The first figure counts only the blocks after which
  a stream was still live (the goal is about streams); the one in brackets is the
  whole window's, which may hold the full collection the app runs on purpose once
  the last stream has ended (`core/web/full_collections.py`). The probe counts any
  time the loop did not run, including time the load client (on the same CPUs)
  took from the server: `--pin` gives each a CPU of its own, so the blocks are the
  server's own.

Then (unless `--no-ratio`, or with `--quick`) the A2A `SendStreamingMessage`
ratio against a plain a2a-sdk server at 500 and 2,000 updates, measured by
`bench_a2a.py`'s own code (`bench_a2a.compare`), on a second server with the demo
model at zero delay.

Goals (issue 19), at N = 100: added p99 ≤ 50 ms and no loop block over 20 ms while streams run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (  # noqa: E402
    cpu_seconds,
    free_port,
    http_json,
    spawn,
    stop,
    table,
    wait_cpu_idle,
    wait_first_200,
)

#: A gap shorter than this is a burst: tokens that arrived together, not at the model's pace.
BURST_S = 0.002
#: More bursts than this share of gaps, and a row's gaps say nothing about pacing.
MAX_BURST_SHARE = 0.10
PROBE_LINE = re.compile(
    rb"loop-probe: longest block ([0-9.]+) ms at ([0-9.]+) s over ([0-9.]+) s "
    rb"\([0-9,]+ ticks, ([0-9]+) over 20 ms\); "
    rb"longest gc ([0-9.]+) ms \(generation (-?[0-9])\), ([0-9]+) full"
    rb"(?:; while streams run: longest ([0-9.]+) ms, ([0-9]+) over 20 ms)?"
)


@dataclass
class StreamRecord:
    """What one client saw: the arrival time of each token, and whether the stream ended well."""

    token_times: list[float] = field(default_factory=list)
    status: int = 0
    events: int = 0
    error: str | None = None
    #: When the send was accepted (chat: the 202 of the message's POST), perf_counter().
    accepted: float | None = None


async def read_stream(
    port: int,
    method: str,
    path: str,
    body: bytes | None,
    headers: dict[str, str],
    sep: bytes,
    is_token,
    record: StreamRecord,
) -> None:
    """One HTTP request whose response is SSE, read to EOF; tokens stamped as their read arrives.

    `is_token(piece)` says how many tokens an event carries (0: not a token event).
    """
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        record.error = f"connect: {exc}"
        return
    try:
        head = [
            f"{method} {path} HTTP/1.1",
            f"Host: 127.0.0.1:{port}",
            "Connection: close",
            "Accept: text/event-stream",
        ]
        head += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + (body or b""))
        await writer.drain()
        raw = await reader.readuntil(b"\r\n\r\n")
        record.status = int(raw.split(b" ", 2)[1])
        pending = b""
        while True:
            data = await reader.read(65536)
            if not data:
                break
            now = time.perf_counter()
            pieces = (pending + data).split(sep)
            pending = pieces.pop()
            for piece in pieces:
                record.events += 1
                # An event that carries k tokens (an A2A update that joined deltas) is k arrivals.
                record.token_times.extend([now] * is_token(piece))
    except (OSError, asyncio.IncompleteReadError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    finally:
        writer.close()


def chat_token(piece: bytes) -> int:
    """How many tokens a chat stream's event carries: one per text delta."""
    return 1 if b'"type":"text-delta"' in piece else 0


def a2a_token(piece: bytes) -> int:
    """How many tokens (lorem words) an A2A stream's event carries: a status update with the agent's message.

    The server joins the deltas that are ready together into one update (a loaded loop, a late
    reader), so one event may carry several words.
    """
    if b'"statusUpdate"' not in piece or b'"ROLE_AGENT"' not in piece:
        return 0
    update = json.loads(piece.partition(b"data:")[2])["result"]["statusUpdate"]
    return sum(len(part.get("text", "").split()) for part in update["status"]["message"]["parts"])


async def post_json(port: int, path: str, payload: object) -> tuple[int, dict]:
    """One JSON POST (a raw socket, like the streams); (status, decoded body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        body = json.dumps(payload).encode()
        writer.write(
            (
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode()
            + body
        )
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(rest) if rest.strip() else {}


def new_chats(port: int, n: int) -> list[str]:
    """N new chat sessions (made before the clock starts: the bench times turns, not chat creation)."""
    sessions = []
    for _ in range(n):
        status, created = http_json(port, "POST", "/api/sessions", {})
        assert status == 201, (status, created)
        sessions.append(created["id"])
    return sessions


async def chat_run(port: int, sessions: list[str], text: str) -> list[StreamRecord]:
    """Each of these chats sent `text` at once, each turn's stream read to its end."""
    records = [StreamRecord() for _ in sessions]

    async def one(session_id: str, record: StreamRecord) -> None:
        status, turn = await post_json(port, f"/api/sessions/{session_id}/messages", {"content": text})
        record.accepted = time.perf_counter()
        if status != 202:
            record.error = f"send: {status} {turn}"
            return
        await read_stream(port, "GET", turn["streamUrl"], None, {}, b"\n\n", chat_token, record)

    await asyncio.gather(*(one(s, r) for s, r in zip(sessions, records, strict=True)))
    return records


async def a2a_run(port: int, n: int, text: str, key: str) -> list[StreamRecord]:
    """N `SendStreamingMessage` calls of `text` at once, each stream read to its end."""
    records = [StreamRecord() for _ in range(n)]

    async def one(record: StreamRecord) -> None:
        body = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "SendStreamingMessage",
                "params": {"message": {"role": "ROLE_USER", "messageId": uuid.uuid4().hex, "parts": [{"text": text}]}},
            }
        ).encode()
        await read_stream(
            port,
            "POST",
            "/a2a/agents/coding-assistant",
            body,
            {"Authorization": f"Bearer {key}", "A2A-Version": "1.0"},
            b"\r\n\r\n",
            a2a_token,
            record,
        )

    await asyncio.gather(*(one(r) for r in records))
    return records


def loop_block(server, previous_lines: int) -> tuple[float | None, float | None, str, str, int]:
    """Ask the server for its probe's window (SIGUSR1) and read the line it logs.

    Returns the longest block while streams ran (ms; what the goal is about), the longest block
    of the whole window (ms; it also holds the full garbage collection the app runs once the last
    stream has ended), where that one was and how many blocks passed 20 ms as "at s / count (while
    streams ran)", the longest garbage collection as "ms (generation) / full collections", and how
    many probe lines the log holds.
    """
    server.proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = PROBE_LINE.findall(server.log_path.read_bytes())
        if len(lines) > previous_lines:
            block, at, _, over_20, gc_ms, generation, full, streaming, streaming_over_20 = lines[-1]
            return (
                float(streaming or block),
                float(block),
                f"{float(at):.2f} / {int(over_20)} ({int(streaming_over_20 or over_20)})",
                f"{float(gc_ms):.1f} (gen {int(generation)}) / {int(full)}",
                len(lines),
            )
        time.sleep(0.05)
    return None, None, "n/a", "n/a", previous_lines


def percentile(sorted_values: list[float], q: float) -> float:
    """The value at quantile `q` (nearest rank)."""
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(round(q * (len(sorted_values) - 1))))]


def load() -> str:
    """The machine's load average (1, 5, 15 min)."""
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


async def measure(
    server, kind: str, n: int, text: str, tokens: int, delay_ms: int, key: str, probe_lines: int
) -> tuple[list[object], dict, int]:
    """One N: the table row, the figures, and how many probe lines the log holds now."""
    sessions = new_chats(server.port, n) if kind == "chat" else []
    wait_cpu_idle(server.pid, timeout=30)
    *_, probe_lines = loop_block(server, probe_lines)  # opens a new window
    cpu0 = cpu_seconds(server.pid)
    t0 = time.perf_counter()
    records = await (chat_run(server.port, sessions, text) if kind == "chat" else a2a_run(server.port, n, text, key))
    wall = time.perf_counter() - t0
    firsts = sorted(r.token_times[0] - t0 for r in records if r.token_times)
    accepts = sorted(r.accepted - t0 for r in records if r.accepted is not None)
    cpu = cpu_seconds(server.pid) - cpu0
    block_ms, any_block_ms, block_where, gc_pause, probe_lines = loop_block(server, probe_lines)
    got = sum(len(r.token_times) for r in records)
    gaps = sorted(b - a for r in records for a, b in zip(r.token_times, r.token_times[1:], strict=False))
    short = sum(1 for r in records if len(r.token_times) < tokens or r.error)
    errors = [r.error for r in records if r.error][:3]
    p50, p99 = percentile(gaps, 0.5) * 1000, percentile(gaps, 0.99) * 1000
    figures = {
        "n": n,
        "rate": got / wall,
        "p50": p50,
        "p99": p99,
        "added": p99 - delay_ms,
        "longest": (gaps[-1] * 1000) if gaps else float("nan"),
        "cpu_us": cpu / max(got, 1) * 1e6,
        "block": block_ms,
        "short": short,
        "errors": errors,
        "first_p50": percentile(firsts, 0.5),
        "first_p99": percentile(firsts, 0.99),
        "accept_p50": percentile(accepts, 0.5),
        "accept_p99": percentile(accepts, 0.99),
        "first_max": firsts[-1] if firsts else float("nan"),
        "bursts": sum(1 for g in gaps if g < BURST_S) / max(len(gaps), 1),
    }
    row = [
        n,
        f"{figures['rate']:,.0f}",
        f"{p50:.1f}",
        f"{p99:.1f}",
        f"{figures['added']:.1f}",
        f"{figures['longest']:.0f}",
        f"{figures['first_p50']:.2f} / {figures['first_max']:.2f}",
        f"{figures['bursts'] * 100:.0f} %",
        f"{figures['cpu_us']:.0f}",
        "n/a" if block_ms is None else f"{block_ms:.1f} ({any_block_ms:.1f})",
        block_where,
        gc_pause,
        f"{short}" + (f" ({errors[0]})" if errors else ""),
        load(),
    ]
    return row, figures, probe_lines


async def main() -> None:
    """Run the sizes for each kind of stream, print the tables, the goals and the A2A ratio."""
    parser = argparse.ArgumentParser(description="N concurrent streamed turns: inter-token gaps, CPU, loop blocks")
    parser.add_argument("--quick", action="store_true", help="N = 10, 50, 100; no A2A ratio")
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="values of N (default 10 25 50 100 200)")
    parser.add_argument("--streams", nargs="+", choices=["chat", "a2a"], default=["chat", "a2a"])
    parser.add_argument("--tokens", type=int, default=150, help="words per reply (/lorem N)")
    parser.add_argument("--delay-ms", type=int, default=20, help="the demo model's delay between tokens")
    parser.add_argument("--no-ratio", action="store_true", help="skip the A2A ratio against a plain a2a-sdk server")
    parser.add_argument("--ratio-runs", type=int, default=3)
    parser.add_argument(
        "--pin", action="store_true", help="the server on CPU 1 and this load client on CPU 0 (Linux; at least 2 CPUs)"
    )
    parser.add_argument(
        "--model", choices=["demo", "openai"], default="demo", help="openai: bench_model_path.py (both, the ratio)"
    )
    if "--model" in sys.argv and "openai" in sys.argv:  # the real model path beside the demo one: its own script
        from bench import bench_model_path

        sys.argv = [a for a in sys.argv if a not in ("--model", "openai")]
        await bench_model_path.run(bench_model_path.parser().parse_args())
        return
    args = parser.parse_args()
    sizes = args.sizes or ([10, 50, 100] if args.quick else [10, 25, 50, 100, 200])
    text = f"/lorem {args.tokens}"
    print(f"load average at start: {load()}")

    results: dict[str, list[dict]] = {}
    all_cpus = os.sched_getaffinity(0) if args.pin else None
    with tempfile.TemporaryDirectory(prefix="bench-capacity-") as tmp:
        port = free_port()
        server = spawn(
            Path(tmp) / "data",
            port=port,
            env_extra={
                "DEMO_MODEL_DELAY_MS": str(args.delay_ms),
                "PUBLIC_BASE_URL": f"http://127.0.0.1:{port}",
                "LOOP_PROBE": "1",
            },
        )
        if args.pin:
            # Before the server starts its threads (they inherit it): the loop probe then counts
            # only the server's own work, not time the load client took from its core.
            os.sched_setaffinity(server.proc.pid, {1})
            os.sched_setaffinity(0, {0})
        try:
            wait_first_200(server, path="/api/me")
            status, created = http_json(port, "POST", "/api/a2a/keys", {"name": "bench"})
            assert status == 201, (status, created)
            key = created["key"]
            # Warm-up: LiteLLM's import and first call, the A2A SDK's import, one stream of each kind.
            await chat_run(port, new_chats(port, 2), "/lorem 5")
            await a2a_run(port, 2, "/lorem 5", key)
            probe_lines = 0
            for kind in args.streams:
                rows = []
                for n in sizes:
                    row, figures, probe_lines = await measure(
                        server, kind, n, text, args.tokens, args.delay_ms, key, probe_lines
                    )
                    rows.append(row)
                    results.setdefault(kind, []).append(figures)
                    print(f"  {kind} N={n}: {row}", flush=True)
                print(
                    f"\n{kind} stream: N at once, each /lorem {args.tokens} at {args.delay_ms} ms per token "
                    f"({1000 / max(args.delay_ms, 1):.0f} tokens/s)"
                )
                print(
                    table(
                        [
                            "N",
                            "tokens/s",
                            "gap p50 ms",
                            "gap p99 ms",
                            "added p99 ms",
                            "longest gap ms",
                            "first token p50 / max s",
                            "gaps < 2 ms",
                            "server CPU µs/token",
                            "longest loop block ms while streams ran (any)",
                            "at s / blocks > 20 ms (while streams ran)",
                            "longest gc ms / full gcs",
                            "short streams",
                            "load",
                        ],
                        rows,
                    )
                )
                print()
        finally:
            stop(server)
            if all_cpus is not None:
                # The ratio's two servers inherit this process's CPUs: all of them again, as without --pin.
                os.sched_setaffinity(0, all_cpus)

    for kind, figures_list in results.items():
        at_100 = [f for f in figures_list if f["n"] == 100]
        if at_100:
            f = at_100[0]
            # A stream whose first token comes after the turn could have ended was read as a replay
            # (all its events in one read): its gaps say nothing about pacing.
            paced = f["bursts"] <= MAX_BURST_SHARE
            ok = paced and f["added"] <= 50 and f["block"] is not None and f["block"] <= 20
            print(
                f"goal at N=100 ({kind}): added p99 {f['added']:.1f} ms (≤ 50), longest loop block while streams "
                f"ran {f['block']} ms (≤ 20){'' if paced else ', streams read in bursts (replays)'}: "
                f"{'met' if ok else 'NOT met'}"
            )

    if not (args.no_ratio or args.quick):
        from bench import bench_a2a

        rows = await bench_a2a.compare([500, 2000], args.ratio_runs)
        print(
            f"\nA2A SendStreamingMessage vs a plain a2a-sdk server (bench_a2a.py, median of {args.ratio_runs}; "
            "budget: ratio ≥ 1.0)"
        )
        print(table(bench_a2a.HEADER, rows))
    print(f"load average at end: {load()}")


if __name__ == "__main__":
    asyncio.run(main())
