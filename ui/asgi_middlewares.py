"""NiceGUI's HTTP middlewares, as pure ASGI (docs/ARCHITECTURE.md "The streaming hot path").

`ui.run` adds three `BaseHTTPMiddleware`s (redirects behind a path prefix, the cache header of
NiceGUI's own files, and the request tracking that gives `app.storage.user` its request). Such a
middleware runs the rest of the app in a task of its own and copies every body chunk through a
memory stream: measured here, about 18 µs of CPU per layer for each SSE write, for every token of
every stream. `use_pure_asgi_middlewares` swaps each for the version below, which does the same
work on the response's start message and passes body chunks straight through. The swap happens
at start-up, before the first request; a NiceGUI that adds another `BaseHTTPMiddleware` is logged.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from nicegui import core
from nicegui.middlewares import RedirectWithPrefixMiddleware, SetCacheControlMiddleware
from nicegui.storage import RequestTrackingMiddleware, request_contextvar
from nicegui.version import __version__
from starlette.applications import Starlette
from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

_NICEGUI_FILES = f"/_nicegui/{__version__}/"
_NICEGUI_DYNAMIC_FILES = f"/_nicegui/{__version__}/dynamic_resources/"


class RedirectWithPrefix:
    """A redirect to `/path` goes to `<X-Forwarded-Prefix>/path` (an app served under a proxy's prefix)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Prefix the `Location` of a redirect when the proxy sent a prefix."""
        prefix = Headers(scope=scope).get("x-forwarded-prefix", "") if scope["type"] == "http" else ""
        if not prefix:
            await self.app(scope, receive, send)
            return

        async def send_prefixed(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                location = headers.get("location")
                if location is not None and location.startswith("/"):
                    headers["location"] = prefix + location
            await send(message)

        await self.app(scope, receive, send_prefixed)


class SetCacheControl:
    """NiceGUI's versioned files (not its per-page dynamic ones) get its configured `Cache-Control`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Set the header on responses for NiceGUI's versioned files."""
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not path.startswith(_NICEGUI_FILES) or path.startswith(_NICEGUI_DYNAMIC_FILES):
            await self.app(scope, receive, send)
            return

        async def send_cached(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)["cache-control"] = core.app.config.cache_control_directives
            await send(message)

        await self.app(scope, receive, send_cached)


class RequestTracking:
    """NiceGUI's request tracking: the request in `request_contextvar`, a session id, the user's storage.

    As in NiceGUI's own: the session counts as active (its storage is not pruned) until the response
    starts, and `request.state.responded` turns true then (`app.storage.browser` is read-only after).
    One difference: a request under `sessionless_prefixes` (the REST API, A2A) that brings no
    session gets none. NiceGUI would make one for every such call, a session id, a storage object
    and a cookie nobody sends back, for a caller that is no browser and so has no browser login.

    Args:
        app: the ASGI app.
        sessionless_prefixes: paths whose requests use a browser session only when they bring one.
    """

    def __init__(self, app: ASGIApp, sessionless_prefixes: tuple[str, ...] = ()) -> None:
        self.app = app
        self.sessionless_prefixes = sessionless_prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Track one HTTP request."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        request_contextvar.set(request)
        request.state.responded = False
        if "id" not in request.session:
            if scope.get("path", "").startswith(self.sessionless_prefixes):
                await self.app(scope, receive, send)
                return
            request.session["id"] = str(uuid.uuid4())
        session_id = request.session["id"]
        storage = core.app.storage
        active = storage._active_request_sessions  # noqa: SLF001 (NiceGUI's own bookkeeping, kept as it keeps it)
        active[session_id] += 1
        counted = True

        def done() -> None:
            nonlocal counted
            if counted:
                counted = False
                active[session_id] -= 1
                if active[session_id] <= 0:
                    del active[session_id]

        async def send_tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                request.state.responded = True
                done()
            await send(message)

        try:
            if session_id not in storage._users:  # noqa: SLF001
                await storage._create_user_storage(session_id)  # noqa: SLF001
            await self.app(scope, receive, send_tracked)
        finally:
            done()


# (Values typed Any: Starlette's `Middleware` types its class as a private protocol that mypy does not
# match against a union of classes.)
PURE_ASGI_VERSIONS: dict[object, Any] = {
    RedirectWithPrefixMiddleware: RedirectWithPrefix,
    SetCacheControlMiddleware: SetCacheControl,
    RequestTrackingMiddleware: RequestTracking,
}


def use_pure_asgi_middlewares(app: Starlette, *, sessionless_prefixes: tuple[str, ...] = ()) -> None:
    """Swap NiceGUI's `BaseHTTPMiddleware`s in `app` for their pure-ASGI versions (before the first request).

    Starlette builds the middleware stack when the lifespan starts; it is built again, from the new
    list, at the next call. `sessionless_prefixes` goes to `RequestTracking`.
    """
    options: dict[object, dict[str, Any]] = {RequestTrackingMiddleware: {"sessionless_prefixes": sessionless_prefixes}}
    app.user_middleware = [
        Middleware(PURE_ASGI_VERSIONS[m.cls], *m.args, **{**m.kwargs, **options.get(m.cls, {})})
        if m.cls in PURE_ASGI_VERSIONS
        else m
        for m in app.user_middleware
    ]
    app.middleware_stack = None
    left = [
        m.cls.__name__ for m in app.user_middleware if isinstance(m.cls, type) and issubclass(m.cls, BaseHTTPMiddleware)
    ]
    if left:
        log.warning("these HTTP middlewares still copy every streamed chunk through a task: %s", ", ".join(left))
