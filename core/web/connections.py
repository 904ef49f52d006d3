"""Slow and greedy clients: a deadline for request headers, a cap per address, the open-files limit.

uvicorn reads request headers for as long as a client takes to send them: a connection that sends
half a request and stops holds a file descriptor forever (issue 34: 1,100 of them from one client
made every other request fail with "Too many open files"). `guarded_http_protocol` returns
uvicorn's httptools protocol (the one `http="auto"` picks: NiceGUI installs `uvicorn[standard]`)
with two rules added, given to `ui.run(http=...)`:

- Headers on time. A timer starts when the connection is made and stops when the request's headers
  are complete; when it fires the connection is closed (with a 408 if part of a request came). On a
  keep-alive connection the wait *between* requests is uvicorn's own keep-alive timeout (5 s); the
  timer starts again at the first byte of the next request, so the two never cover the same wait.
  A WebSocket upgrade completes its headers like any request; the socket is then the WebSocket
  protocol's, which has its own ping and close timeouts.
- One address, a bounded number of connections. Connections are counted per TCP peer address (the
  only one known before headers: X-Forwarded-For comes with them); a connection over the cap is
  answered 429 and closed at once. Addresses in `uncapped` (the trusted proxies, which put all
  their users behind one address) are not counted. An upgraded connection stays counted until
  its WebSocket closes.

`raise_open_files_limit` lifts the process's soft open-files limit to its hard limit at start, as
Go programs do: the soft default (often 1,024) is far below what a server holding streams needs.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["ConnectionLimits", "guarded_http_protocol", "raise_open_files_limit"]

log = logging.getLogger(__name__)

#: How often the "address at its cap" warning may repeat for one address.
CAP_WARNING_INTERVAL_S = 60.0
#: The limit tried when the hard limit is "unlimited" (Linux refuses more than fs.nr_open, 1,048,576 by default),
#: then macOS's OPEN_MAX when that is refused too.
OPEN_FILES_TARGETS = (1_048_576, 10_240)


def _answer(status: str, body: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection (JSON as the API's errors, core/web/errors.py)."""
    content = json.dumps(body).encode() if body else b""
    head = f"HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: {len(content)}\r\n"
    if content:
        head += "Content-Type: application/json\r\n"
    return head.encode() + b"\r\n" + content


# Written before any request is read, so there is no Accept-Language to translate to: English.
TOO_MANY_CONNECTIONS = _answer(
    "429 Too Many Requests",
    {
        "detail": "Too many open connections from your address. Close some, or wait, and try again.",
        "code": "too_many_connections",
    },
)
HEADERS_TOO_SLOW = _answer("408 Request Timeout")


class ConnectionLimits:
    """The two rules' settings and the open connections per peer address (one event loop uses it)."""

    def __init__(self, *, header_timeout_s: float, max_per_address: int, uncapped: Sequence[str] = ()) -> None:
        self.header_timeout_s = header_timeout_s
        self.max_per_address = max_per_address
        self._uncapped = [ipaddress.ip_network(entry, strict=False) for entry in uncapped]
        self._open: Counter[str] = Counter()
        self._counted: dict[object, str] = {}  # transport -> address, for connections that count
        self._warned: dict[str, float] = {}

    def open_from(self, address: str) -> int:
        """How many connections `address` holds now."""
        return self._open[address]

    def admit(self, transport: object, address: str) -> bool:
        """Count a new connection; False when its address already holds the most it may."""
        if self._is_uncapped(address):
            return True
        if self._open[address] >= self.max_per_address:
            self._warn(address)
            return False
        self._open[address] += 1
        self._counted[transport] = address
        return True

    def release(self, transport: object) -> None:
        """The connection on `transport` closed (once or more: only the first call counts)."""
        address = self._counted.pop(transport, None)
        if address is None:
            return
        self._open[address] -= 1
        if self._open[address] <= 0:
            del self._open[address]
            self._warned.pop(address, None)

    def _is_uncapped(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:  # a dual-stack socket's IPv4 peer
            ip = ip.ipv4_mapped
        return any(ip in network for network in self._uncapped)

    def _warn(self, address: str) -> None:
        now = time.monotonic()
        if now - self._warned.get(address, -CAP_WARNING_INTERVAL_S) >= CAP_WARNING_INTERVAL_S:
            self._warned[address] = now
            log.warning(
                "%s holds %d connections, MAX_CONNECTIONS_PER_ADDRESS: its new ones are closed",
                address,
                self.max_per_address,
            )


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline for request headers and a cap per address."""

    limits: ClassVar[ConnectionLimits]
    _releasing_ws: ClassVar[dict[type, type]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._request_begun = False
        if self.ws_protocol_class is not None:
            self.ws_protocol_class = self._released_on_close(self.ws_protocol_class)

    @classmethod
    def _released_on_close(cls, ws_class: type) -> type:
        """`ws_class`, made to give the connection's count back when its WebSocket closes."""
        if ws_class not in cls._releasing_ws:
            limits = cls.limits

            class Releasing(ws_class):  # type: ignore[misc]
                def connection_lost(self, exc: Exception | None) -> None:
                    try:
                        super().connection_lost(exc)
                    finally:
                        limits.release(self.transport)

            Releasing.__name__ = Releasing.__qualname__ = f"Releasing{ws_class.__name__}"
            cls._releasing_ws[ws_class] = Releasing
        return cls._releasing_ws[ws_class]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.client is not None and not self.limits.admit(transport, self.client[0]):
            transport.write(TOO_MANY_CONNECTIONS)
            transport.close()
            return
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        self.limits.release(self.transport)
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._request_begun = True
        if self._header_timer is None:  # the next request on a keep-alive connection
            self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        self._request_begun = False
        super().on_headers_complete()

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self.limits.header_timeout_s, self._headers_too_slow)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        log.debug("%s: request headers not complete within %.1f s, closing", self.client, self.limits.header_timeout_s)
        # A 408 tells a slow but real client what happened, unless a pipelined response is still being written.
        if self._request_begun and (self.cycle is None or self.cycle.response_complete):
            self.transport.write(HEADERS_TOO_SLOW)
        self.transport.close()


def guarded_http_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """The protocol class for uvicorn's `http=` option, bound to `limits`."""
    return type("GuardedHttpProtocol", (GuardedHttpProtocol,), {"limits": limits, "_releasing_ws": {}})


def raise_open_files_limit() -> tuple[int, int] | None:
    """Lift the soft RLIMIT_NOFILE to the hard limit; (before, after), or None where there is no such limit."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    targets = [hard] if hard != unlimited else []
    targets += [t for t in OPEN_FILES_TARGETS if hard == unlimited or t < hard]
    for target in targets:
        if soft == unlimited or target <= soft:  # never lowered
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            continue
        log.info("open-files limit raised from %s to %s", soft, target)
        return soft, target
    log.debug("open-files limit left at %s (hard limit %s)", soft, hard)
    return soft, soft
