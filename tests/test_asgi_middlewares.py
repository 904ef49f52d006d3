"""NiceGUI's HTTP middlewares as pure ASGI (ui/asgi_middlewares.py): the same work, no task per body chunk.

An app assembled as `ui.run` assembles it (session cookie, request tracking, prefix redirects, cache
header), its `BaseHTTPMiddleware`s swapped; then the app itself, as NiceGUI's `User` starts it.
"""

from __future__ import annotations

import asyncio
import sys

import anyio.to_thread
import httpx
import pytest
from nicegui import app as nicegui_app
from nicegui import core
from nicegui.middlewares import RedirectWithPrefixMiddleware, SetCacheControlMiddleware
from nicegui.storage import RequestTrackingMiddleware, request_contextvar
from nicegui.testing import User
from nicegui.version import __version__
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, StreamingResponse
from starlette.routing import Route

from tests.test_chat_page import app_env, services, user  # noqa: F401 (fixtures)
from ui.asgi_middlewares import (
    RedirectWithPrefix,
    RequestTracking,
    SetCacheControl,
    use_pure_asgi_middlewares,
)

STATIC = f"/_nicegui/{__version__}/static/app.js"
DYNAMIC = f"/_nicegui/{__version__}/dynamic_resources/x.js"


async def seen(request: Request) -> JSONResponse:
    tracked = request_contextvar.get()
    return JSONResponse(
        {
            "tracked_is_this_request": tracked is not None and tracked.scope is request.scope,
            "responded": request.state.responded,
            "session_id": request.session.get("id"),
            "user_storage": dict(nicegui_app.storage.user) if request.session.get("id") else None,
            "active_sessions": dict(core.app.storage._active_request_sessions),  # noqa: SLF001
        }
    )


async def chunks(request: Request) -> StreamingResponse:
    async def body():
        for i in range(3):
            yield f"data: {i}\n\n"
            await asyncio.sleep(0.01)

    return StreamingResponse(body(), media_type="text/event-stream")


def assembled_like_ui_run() -> Starlette:
    """Starlette with NiceGUI's middlewares in `ui.run`'s order (the last one listed is the innermost)."""
    routes = [
        Route("/seen", seen),
        Route("/api/seen", seen),
        Route("/chunks", chunks),
        Route("/go", lambda request: RedirectResponse("/there")),
        Route("/away", lambda request: RedirectResponse("https://elsewhere.example/x")),
        Route(STATIC, lambda request: PlainTextResponse("js")),
        Route(DYNAMIC, lambda request: PlainTextResponse("js")),
    ]
    return Starlette(
        routes=routes,
        middleware=[
            Middleware(SetCacheControlMiddleware),
            Middleware(RedirectWithPrefixMiddleware),
            Middleware(SessionMiddleware, secret_key="test-secret"),
            Middleware(RequestTrackingMiddleware),
        ],
    )


@pytest.fixture
async def swapped() -> httpx.AsyncClient:
    app = assembled_like_ui_run()
    use_pure_asgi_middlewares(app, sessionless_prefixes=("/api/",))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        yield client


def test_every_base_http_middleware_is_swapped_and_the_order_kept() -> None:
    app = assembled_like_ui_run()
    use_pure_asgi_middlewares(app)
    assert [m.cls for m in app.user_middleware] == [
        SetCacheControl,
        RedirectWithPrefix,
        SessionMiddleware,
        RequestTracking,
    ]
    assert app.user_middleware[2].kwargs == {"secret_key": "test-secret"}  # arguments carried over


async def test_requests_are_tracked_as_nicegui_tracks_them(swapped: httpx.AsyncClient) -> None:
    first = await swapped.get("/seen")
    body = first.json()
    assert body["tracked_is_this_request"] and body["responded"] is False
    assert body["session_id"] and body["user_storage"] == {}
    assert body["active_sessions"] == {body["session_id"]: 1}  # counted while the page is built
    assert body["session_id"] in core.app.storage._users  # noqa: SLF001 (the user's storage was made)
    again = await swapped.get("/seen")  # the session cookie brings the same id back
    assert again.json()["session_id"] == body["session_id"]
    assert body["session_id"] not in core.app.storage._active_request_sessions  # noqa: SLF001 (not after it)


async def test_an_api_call_without_a_browser_session_gets_none(swapped: httpx.AsyncClient) -> None:
    users_before = set(core.app.storage._users)  # noqa: SLF001
    call = await swapped.get("/api/seen")
    body = call.json()
    assert body["tracked_is_this_request"] and body["responded"] is False
    assert body["session_id"] is None and "set-cookie" not in call.headers
    assert set(core.app.storage._users) == users_before  # noqa: SLF001 (no storage made for it)

    page = await swapped.get("/seen")  # a browser's page: a session, then its API calls use it
    session_id = page.json()["session_id"]
    assert session_id and "set-cookie" in page.headers
    assert (await swapped.get("/api/seen")).json()["session_id"] == session_id


async def test_a_redirect_gets_the_proxys_prefix(swapped: httpx.AsyncClient) -> None:
    assert (await swapped.get("/go")).headers["location"] == "/there"
    prefixed = await swapped.get("/go", headers={"X-Forwarded-Prefix": "/chat"})
    assert prefixed.headers["location"] == "/chat/there"
    away = await swapped.get("/away", headers={"X-Forwarded-Prefix": "/chat"})
    assert away.headers["location"] == "https://elsewhere.example/x"  # another site's address is left alone


async def test_nicegui_versioned_files_get_the_cache_header(
    swapped: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `ui.run` sets the directives; this app was not started by it.
    monkeypatch.setattr(core.app.config, "cache_control_directives", "public, max-age=60", raising=False)
    cached = await swapped.get(STATIC)
    assert cached.headers["cache-control"] == "public, max-age=60"
    assert "cache-control" not in (await swapped.get(DYNAMIC)).headers
    assert "cache-control" not in (await swapped.get("/seen")).headers


async def test_a_stream_passes_through_chunk_by_chunk() -> None:
    app = assembled_like_ui_run()
    use_pure_asgi_middlewares(app)
    sent: list[dict] = []

    async def receive() -> dict:
        await asyncio.sleep(1)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/chunks",
        "raw_path": b"/chunks",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"test")],
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
    }
    await app(scope, receive, send)
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body" and m.get("body")]
    assert bodies == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]  # one write each, as the route wrote them


async def test_the_app_serves_with_no_base_http_middleware_left(user: User) -> None:  # noqa: F811
    await user.open("/")
    # and its worker threads share the GIL with the event loop (app.share_the_gil_with_the_event_loop)
    assert sys.getswitchinterval() == pytest.approx(0.001)
    assert anyio.to_thread.current_default_thread_limiter().total_tokens == 4
    kinds = [m.cls for m in nicegui_app.user_middleware]
    assert RequestTracking in kinds and RedirectWithPrefix in kinds and SetCacheControl in kinds
    left = [k.__name__ for k in kinds if isinstance(k, type) and issubclass(k, BaseHTTPMiddleware)]
    assert left == []
