"""Errors of the HTTP API in the caller's language, each with a stable machine `code`.

Every request is translated into its `Accept-Language` (`LanguageMiddleware` sets `core.i18n`'s
language for the request; pages may choose another, ui/language.py). An error answer keeps
FastAPI's shape, `{"detail": …}`, and adds `code` beside it: the route's own code when it raised
an `ApiError` (`session_not_found`, …), else one named after the status (`not_found`,
`unauthorized`, …). Scripts compare `code`; `detail` is for people and changes with the language.
The codes are listed in docs/ARCHITECTURE.md, "Languages".
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import HTTPException
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from core.errors import AppError
from core.i18n import _, negotiate, use_language

__all__ = [
    "REDIS_UNREACHABLE",
    "STATUS_CODES",
    "ApiError",
    "LanguageMiddleware",
    "error_code",
    "install_error_handlers",
    "redis_down_text",
]

# The code of an error that names none of its own, by HTTP status.
STATUS_CODES: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_requests",
    500: "internal_error",
    502: "bad_gateway",
    503: "unavailable",
}
API_PREFIXES = ("/api", "/a2a")
API_FOLDERS = tuple(f"{prefix}/" for prefix in API_PREFIXES)  # every address under them is the API's


class ApiError(AppError, HTTPException):
    """An HTTP error with a stable `code`; `detail` is written (translated) where it is raised."""

    code = "api_error"

    def __init__(self, status_code: int, code: str, detail: Any, headers: dict[str, str] | None = None) -> None:
        super().__init__(status_code, detail=detail, headers=headers)
        self.code = code


def error_code(exc: StarletteHTTPException) -> str:
    """The machine code of an HTTP error."""
    return getattr(exc, "code", None) or STATUS_CODES.get(exc.status_code, f"http_{exc.status_code}")


class LanguageMiddleware:
    """Translate each HTTP request into the language its `Accept-Language` asks for (else English)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the request with `core.i18n`'s language set from its header."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope.get("headers") or [] if k == b"accept-language"), b"")
        with use_language(negotiate(header.decode("latin-1")[:1000])):
            await self.app(scope, receive, send)


async def api_error_response(request: Request, exc: Exception) -> Response:
    """`{"detail": …, "code": …}` for an HTTP error of the API (other paths: FastAPI's own answer)."""
    assert isinstance(exc, StarletteHTTPException)
    if not request.url.path.startswith(API_PREFIXES):
        return await http_exception_handler(request, exc)
    # ASCII JSON (as schemas.py's 422): a detail that repeats bad input can always be sent.
    body = json.dumps({"detail": exc.detail, "code": error_code(exc)}, ensure_ascii=True, default=str)
    headers = dict(getattr(exc, "headers", None) or {})
    if exc.status_code in (204, 304):
        return Response(status_code=exc.status_code, headers=headers)
    return Response(body.encode(), status_code=exc.status_code, media_type="application/json", headers=headers)


#: How long a caller is told to wait when Redis (a cluster's shared streams) is out of reach.
REDIS_RETRY_AFTER_S = 5
#: What redis-py raises when Redis is out of reach (a page catches them as the API's handlers do).
REDIS_UNREACHABLE = (RedisConnectionError, RedisTimeoutError)


def redis_down_text() -> str:
    """The sentence (translated) that says Redis is out of reach: the API's 503 and the pages' notices."""
    return _("The server cannot reach Redis, which it needs for this request; try again in a few seconds.")


async def redis_down_response(request: Request, exc: Exception) -> Response:
    """503 `redis_unavailable` with `Retry-After`: a cluster's Redis is out of reach (never a plain-text 500)."""
    body = {"detail": redis_down_text(), "code": "redis_unavailable"}
    headers = {"Retry-After": str(REDIS_RETRY_AFTER_S)}
    return Response(json.dumps(body).encode(), status_code=503, media_type="application/json", headers=headers)


async def unexpected_error_response(request: Request, exc: Exception) -> Response:
    """A failure the app did not expect, for the API: a JSON 500 with `internal_error` (the traceback is logged)."""
    body = {"detail": _("Something went wrong on the server; try again."), "code": "internal_error"}
    return Response(json.dumps(body).encode(), status_code=500, media_type="application/json")


def install_error_handlers(app: FastAPI) -> None:
    """Answer the API's errors with a `code` (NiceGUI keeps its 404 page for page addresses).

    HTTP errors keep their status; Redis out of reach is 503 with `Retry-After`; anything else unexpected
    is a JSON 500 (Starlette still logs its traceback).
    """
    page_404 = app.exception_handlers.get(404)
    page_500 = app.exception_handlers.get(Exception)  # NiceGUI's error page, for a page's failure

    async def not_found(request: Request, exc: Exception) -> Response:
        routed = request.scope.get("endpoint") is not None
        path = request.url.path
        # An unknown address under /api/ or /a2a/ (`/api/nope`, `/api/../../x` sent raw) is answered as the
        # API answers, not with NiceGUI's page: that page makes a NiceGUI client of a request that has no
        # browser session (API callers get none, ui/asgi_middlewares.py), and NiceGUI's storage pruning
        # then fails on it every 10 s (`KeyError: 'id'`) until the client is dropped a minute later.
        if (routed and path.startswith(API_PREFIXES) or path.startswith(API_FOLDERS)) and isinstance(
            exc, StarletteHTTPException
        ):
            return await api_error_response(request, exc)
        if page_404 is not None:  # NiceGUI's is a coroutine function; Starlette allows a plain one too
            answer = page_404(request, exc)
            return await answer if inspect.isawaitable(answer) else answer
        return await http_exception_handler(request, exc)  # type: ignore[arg-type]

    app.add_exception_handler(404, not_found)
    app.add_exception_handler(StarletteHTTPException, api_error_response)
    app.add_exception_handler(RedisConnectionError, redis_down_response)
    app.add_exception_handler(RedisTimeoutError, redis_down_response)

    async def unexpected(request: Request, exc: Exception) -> Response:
        if request.url.path.startswith(API_PREFIXES) or page_500 is None:
            return await unexpected_error_response(request, exc)
        answer = page_500(request, exc)
        return await answer if inspect.isawaitable(answer) else answer

    app.add_exception_handler(Exception, unexpected)
    app.add_middleware(LanguageMiddleware)
