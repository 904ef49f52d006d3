"""Request bodies are capped before they are read whole, for callers who are not logged in too.

FastAPI reads a JSON body before it solves a route's dependencies (who asks), so without a cap any
client could make the server hold a body of any size. `BodyCapMiddleware` answers 413 with the
API's `code` (`too_large`) in the caller's language: at once when the declared `Content-Length` is
over the cap (nothing is read), else as soon as the bytes read pass it (a chunked body).

Starlette's own `RequestBodyLimitMiddleware` (FastAPI's `max_body_size`) does the same but answers a
declared length with a plain-text "Content Too Large"; the API answers every error as
`{"detail", "code"}` (core/web/errors.py).
"""

from __future__ import annotations

import json
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.i18n import _
from core.web.errors import ApiError

__all__ = ["BodyCapMiddleware", "BodyTooLargeError"]


class BodyTooLargeError(ApiError):
    """A request body over the cap (413, `too_large`)."""

    code = "too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(413, "too_large", _too_large(limit), headers={"Connection": "close"})


class BodyCapMiddleware:
    """413 for a request body over `limit` bytes under `prefixes` (paths under `exempt` cap their own).

    Args:
        app: the ASGI app.
        limit: the largest body accepted, in bytes.
        prefixes: the paths it applies to.
        exempt: paths under `prefixes` that read their own bodies capped and answer in their own protocol
            (the A2A JSON-RPC endpoints answer -32600).
        larger: (regular expression, limit) pairs: paths that match get that limit instead (file uploads).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        limit: int,
        prefixes: tuple[str, ...],
        exempt: tuple[str, ...] = (),
        larger: tuple[tuple[str, int], ...] = (),
    ) -> None:
        self.app = app
        self.limit = limit
        self.prefixes = prefixes
        self.exempt = exempt
        self.larger = tuple((re.compile(pattern), size) for pattern, size in larger)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on with a receive that counts its bytes, or refuse a declared length over the cap."""
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(self.prefixes) or path.startswith(self.exempt):
            await self.app(scope, receive, send)
            return
        limit = next((size for pattern, size in self.larger if pattern.match(path)), self.limit)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _refuse(send, limit)
            return
        received = 0

        async def capped_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLargeError(limit)  # the route's error handler answers it (core/web/errors.py)
            return message

        await self.app(scope, capped_receive, send)


def _too_large(limit: int) -> str:
    return _("The request body is too large: at most {limit} bytes are accepted.").format(limit=limit)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


async def _refuse(send: Send, limit: int) -> None:
    body = json.dumps({"detail": _too_large(limit), "code": "too_large"}, ensure_ascii=True).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
