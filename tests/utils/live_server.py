"""Run an ASGI app under uvicorn on 127.0.0.1 in a background thread: real HTTP for tests."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import uvicorn
from fastapi import APIRouter, FastAPI

from core.services import Services


def services_app(services: Services, *routers: APIRouter) -> FastAPI:
    """A FastAPI app with `routers` on `services`, which its lifespan starts and stops."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await services.start()
        yield
        await services.stop()

    app = FastAPI(lifespan=lifespan)
    app.state.services = services
    for router in routers:
        app.include_router(router)
    return app


@contextmanager
def live_server(app, *, startup_timeout: float = 15.0, port: int = 0) -> Iterator[str]:
    """Serve `app` on `port` (default: a free one) on loopback; yields its base URL, stops it on exit."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", ws="websockets-sansio"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="live-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
