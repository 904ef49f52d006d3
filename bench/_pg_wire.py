"""A counting TCP proxy for the benchmarks' PostgreSQL connections (bench_cluster_cost.py).

    python bench/_pg_wire.py LISTEN_PORT TARGET_HOST TARGET_PORT CONTROL_PORT [LOG_FILE]

Every connection to 127.0.0.1:LISTEN_PORT is relayed to TARGET_HOST:TARGET_PORT. It counts the
bytes each way and the frontend messages of the wire protocol (PostgreSQL 3.0) the clients send:
`E` (Execute, one per statement of the extended protocol), `Q` (a simple query: psycopg's BEGIN,
COMMIT, ROLLBACK), `S` (Sync: one per round trip of the extended protocol), `P` (Parse). A
connection to CONTROL_PORT gets the counts as one line of JSON. With LOG_FILE, the first bytes of
each Parse and Query (the statement's text) are written there, a line each. Only loopback addresses.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter

# Startup-phase requests that are not the startup message itself (no type byte before them).
_UNTYPED_REQUESTS = {80877103, 80877104, 80877102}  # SSLRequest, GSSENCRequest, CancelRequest

counts: Counter[str] = Counter()
LOG_BYTES = 100
log = None


class FrontendMessages:
    """Splits what a client sends into wire messages and counts them by type, without keeping their bodies."""

    def __init__(self) -> None:
        self._head = b""
        self._skip = 0
        self._typed = False
        self._capture: bytearray | None = None

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._skip:
                step = min(self._skip, len(view))
                if self._capture is not None:
                    self._capture += view[: max(0, min(step, LOG_BYTES - len(self._capture)))]
                    if self._skip == step:
                        log.write(bytes(self._capture).replace(b"\0", b" ").decode(errors="replace") + "\n")
                        self._capture = None
                self._skip -= step
                view = view[step:]
                continue
            need = 5 if self._typed else 8
            take = min(need - len(self._head), len(view))
            self._head += bytes(view[:take])
            view = view[take:]
            if len(self._head) < need:
                return
            if self._typed:
                counts[f"msg_{chr(self._head[0])}"] += 1
                self._skip = int.from_bytes(self._head[1:5], "big") - 4
                if log is not None and self._head[:1] in (b"P", b"Q"):
                    self._capture = bytearray(self._head[:1] + b" ")
            else:
                length = int.from_bytes(self._head[:4], "big")
                if int.from_bytes(self._head[4:8], "big") not in _UNTYPED_REQUESTS:
                    self._typed = True  # the startup message: typed messages from here on
                self._skip = length - 8
            self._head = b""


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: str, parse=None) -> None:
    try:
        while data := await reader.read(65536):
            counts[key] += len(data)
            if parse is not None:
                parse.feed(data)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def main(listen: int, host: str, port: int, control: int) -> None:
    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counts["connections"] += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(
            _relay(reader, up_writer, "bytes_to_server", FrontendMessages()),
            _relay(up_reader, writer, "bytes_to_client"),
        )

    async def report(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(json.dumps(dict(counts)).encode() + b"\n")
        await writer.drain()
        writer.close()

    proxy = await asyncio.start_server(client, "127.0.0.1", listen)
    ctl = await asyncio.start_server(report, "127.0.0.1", control)
    async with proxy, ctl:
        await asyncio.gather(proxy.serve_forever(), ctl.serve_forever())


def read_counts(control: int) -> dict[str, int]:
    """The proxy's counts so far (from its control port)."""
    import socket

    with socket.create_connection(("127.0.0.1", control), timeout=5) as sock:
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return json.loads(data)


if __name__ == "__main__":
    if len(sys.argv) > 5:
        log = open(sys.argv[5], "w", buffering=1)  # noqa: SIM115 - open for the proxy's life
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
