"""The agent-side pipe (seed 003, after mcp_pipe.py): dial a broker, bridge it to a stdio agent.

    python -m core.pipe "ws://broker:3100/a2a?a2a_id=echo" -- python examples/echo_agent.py

The agent behind the pipe needs no public address and no HTTP server: it reads
JSON-RPC 2.0 requests from stdin, one per line, and writes responses to stdout,
one per line. The pipe only carries lines: WebSocket frame -> child's stdin
(a frame may hold several lines), child's stdout line -> one WebSocket frame.
The child's stderr is passed through for its logs.

When either side ends (the broker drops the socket, the child exits), the pipe
stops the child, waits, and starts over with a fresh child and a fresh
connection, backing off exponentially (1 s, 2 s, 4 s, ... up to 60 s; back to
the start after a connection that lasted a while). SIGINT or SIGTERM stop it.

The URL may also come from `$A2A_BROKER_URL`. This module uses only the
standard library and `websockets`, so it runs wherever the agent does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence

import websockets

log = logging.getLogger("a2a-pipe")

MAX_LINE_BYTES = 16 * 1024 * 1024
STABLE_AFTER_S = 10.0  # a connection that lasted this long resets the backoff
CHILD_STOP_TIMEOUT_S = 3.0


async def bridge_once(url: str, command: Sequence[str]) -> str:
    """One connection and one child, until either ends; returns why it ended."""
    async with websockets.connect(url, max_size=MAX_LINE_BYTES, open_timeout=10) as ws:
        log.info("connected to %s; starting %s", _redact(url), " ".join(command))
        child = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=MAX_LINE_BYTES
        )
        stdin, stdout = child.stdin, child.stdout
        assert stdin is not None and stdout is not None

        async def to_child() -> str:
            async for frame in ws:
                text = frame.decode("utf-8", "replace") if isinstance(frame, bytes) else frame
                for line in text.split("\n"):
                    if line.strip():
                        stdin.write(line.encode("utf-8") + b"\n")
                await stdin.drain()
            return f"the broker closed the connection ({ws.close_code} {ws.close_reason or ''})".strip()

        async def from_child() -> str:
            while True:
                try:
                    raw = await stdout.readline()
                except ValueError:  # a line over the limit: skip it, keep the stream in step
                    log.warning("the agent wrote a line over %d bytes; dropped", MAX_LINE_BYTES)
                    continue
                if not raw:
                    return "the agent closed its stdout"
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if line.strip():
                    await ws.send(line)

        async def child_exit() -> str:
            return f"the agent exited with code {await child.wait()}"

        legs = [asyncio.create_task(c) for c in (to_child(), from_child(), child_exit())]
        try:
            done, _ = await asyncio.wait(legs, return_when=asyncio.FIRST_COMPLETED)
            first = next(iter(done))
            reason = first.result() if not first.cancelled() and first.exception() is None else repr(first.exception())
        finally:
            for leg in legs:
                leg.cancel()
            await asyncio.gather(*legs, return_exceptions=True)
            await _stop(child)
        return reason


async def _stop(child: asyncio.subprocess.Process) -> None:
    if child.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        if child.stdin is not None:
            child.stdin.close()
        child.terminate()
    try:
        await asyncio.wait_for(child.wait(), CHILD_STOP_TIMEOUT_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        await child.wait()


async def run(url: str, command: Sequence[str], *, backoff_initial: float = 1.0, backoff_max: float = 60.0) -> None:
    """Bridge forever, reconnecting with exponential backoff."""
    backoff = backoff_initial
    while True:
        started = time.monotonic()
        try:
            reason = await bridge_once(url, command)
        except websockets.InvalidStatus as exc:
            body = exc.response.body.decode("utf-8", "replace")[:300] if exc.response.body else ""
            reason = f"refused with HTTP {exc.response.status_code} {body}".strip()
        except (OSError, websockets.WebSocketException, TimeoutError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
        if time.monotonic() - started >= STABLE_AFTER_S:
            backoff = backoff_initial
        log.warning("%s; reconnecting in %.1f s", reason, backoff)
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, backoff_max)


def _redact(url: str) -> str:
    """The URL without its token (it is a credential)."""
    head, sep, query = url.partition("?")
    if not sep:
        return url
    parts = [p if not p.startswith("token=") else "token=***" for p in query.split("&")]
    return f"{head}?{'&'.join(parts)}"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """`[options] [URL] -- command ...`."""
    argv = list(argv)
    if "--" not in argv:
        raise SystemExit("usage: python -m core.pipe [--backoff-initial S] [--backoff-max S] URL -- command [args...]")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m core.pipe", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "url",
        nargs="?",
        default=os.environ.get("A2A_BROKER_URL"),
        help="ws://host:3100/a2a?a2a_id=NAME[&agent_id=ID] (default $A2A_BROKER_URL)",
    )
    parser.add_argument("--backoff-initial", type=float, default=1.0, help="first reconnect delay, seconds")
    parser.add_argument("--backoff-max", type=float, default=60.0, help="longest reconnect delay, seconds")
    args = parser.parse_args(argv[:split])
    args.command = argv[split + 1 :]
    if not args.url or not args.command:
        parser.error("a broker URL (or $A2A_BROKER_URL) and a command after -- are required")
    if not args.url.startswith(("ws://", "wss://")):
        parser.error("the broker URL must start with ws:// or wss://")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Run the pipe until SIGINT or SIGTERM."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def guarded() -> None:
        task = asyncio.current_task()
        assert task is not None  # run by asyncio.run: always in a task
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await run(args.url, args.command, backoff_initial=args.backoff_initial, backoff_max=args.backoff_max)
        log.info("stopped")

    asyncio.run(guarded())


if __name__ == "__main__":
    main()
