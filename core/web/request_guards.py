"""Who may talk to this server at all: the names it answers to, and browser requests from other sites.

Two attacks reach a server that listens only on 127.0.0.1 through the user's own browser:

- DNS rebinding: a page on `attacker.example` makes its name resolve to 127.0.0.1 and then reads
  this app as if it were its own site. Its requests carry `Host: attacker.example`, so every HTTP
  request and WebSocket handshake whose Host is not one of the trusted names is refused (400).
- Cross-site requests: any page may POST to `http://127.0.0.1:3100` or open a WebSocket to it
  (the broker's `/a2a` would take it for an agent). Browsers say where such a request comes from
  in `Origin`, so a state-changing request (not GET, HEAD or OPTIONS) or a WebSocket handshake
  whose Origin is not this app's own is refused (403). Clients that are not browsers (curl, the
  pipe, A2A SDKs) send no Origin and are not concerned.

The session cookie is `SameSite=Lax` as well (see `app.py`), so another site's requests do not
carry a login either.
"""

from __future__ import annotations

from collections.abc import Collection
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocketClose

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
ANY_HOST = "*"


def host_name(host_header: str) -> str:
    """The name in a Host header, without the port: `127.0.0.1:3100` → `127.0.0.1`, `[::1]:80` → `::1`."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class RequestGuardMiddleware:
    """Refuse requests for names this server does not answer to, and browser requests from other sites.

    Args:
        app: the ASGI app to guard.
        trusted_hosts: the names (no port) the server answers to; `*` among them turns the Host check off.
        trusted_origins: origins (`scheme://host[:port]`) accepted besides the request's own, such as
            the one of `PUBLIC_BASE_URL` behind a proxy that rewrites Host.
    """

    def __init__(self, app: ASGIApp, *, trusted_hosts: Collection[str], trusted_origins: Collection[str] = ()) -> None:
        self.app = app
        self.any_host = ANY_HOST in trusted_hosts
        self.trusted_hosts = frozenset(h.strip().lower().strip("[]") for h in trusted_hosts if h != ANY_HOST)
        self.trusted_netlocs = frozenset(urlsplit(o).netloc.lower() for o in trusted_origins if o)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, or answer it with the refusal (a WebSocket handshake: 403)."""
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        refusal = self._refusal(scope, host, headers.get("origin"))
        if refusal is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await WebSocketClose(code=1008, reason=refusal[1][:120])(scope, receive, send)  # the handshake gets 403
        else:
            await JSONResponse({"detail": refusal[1]}, status_code=refusal[0])(scope, receive, send)

    def _refusal(self, scope: Scope, host: str, origin: str | None) -> tuple[int, str] | None:
        if not self.any_host and host_name(host) not in self.trusted_hosts:
            return 400, (
                f"This server does not answer to the name {host_name(host)[:100]!r}. If that is how you "
                "reach it, add the name to TRUSTED_HOSTS or set PUBLIC_BASE_URL."
            )
        state_changing = scope["type"] == "websocket" or scope.get("method", "GET") not in SAFE_METHODS
        if origin is None or not state_changing:
            return None
        netloc = urlsplit(origin).netloc.lower() if origin != "null" else ""
        if netloc and (netloc == host.strip().lower() or netloc in self.trusted_netlocs):
            return None
        return 403, (
            f"Refused a request from another site (Origin {origin[:100]!r}): this app accepts changes "
            "and WebSockets only from its own pages."
        )
