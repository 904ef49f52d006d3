"""Every API error is JSON with a `code` (issue 41, item 3): Redis out of reach is 503 with `Retry-After`,
an unexpected failure a JSON 500, never a plain-text page; the routes' own HTTP errors keep theirs.
"""

from __future__ import annotations

import httpx
from fastapi import FastAPI
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core.web.errors import REDIS_RETRY_AFTER_S, ApiError, install_error_handlers


def app_with_failures() -> FastAPI:
    app = FastAPI()

    @app.post("/api/redis-down")
    async def redis_down() -> None:
        raise RedisConnectionError("Error 111 connecting to 127.0.0.1:6390. Connection refused.")

    @app.post("/api/redis-slow")
    async def redis_slow() -> None:
        raise RedisTimeoutError("Timeout reading from socket")

    @app.post("/api/broken")
    async def broken() -> None:
        raise RuntimeError("a bug")

    @app.post("/api/refused")
    async def refused() -> None:
        raise ApiError(409, "busy", detail="The chat is still answering.")

    install_error_handlers(app)
    return app


async def test_redis_out_of_reach_is_503_with_a_code_and_retry_after_and_a_bug_is_a_json_500() -> None:
    transport = httpx.ASGITransport(app=app_with_failures(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        for path in ("/api/redis-down", "/api/redis-slow"):
            down = await client.post(path)
            assert down.status_code == 503 and down.headers["retry-after"] == str(REDIS_RETRY_AFTER_S)
            assert down.json()["code"] == "redis_unavailable" and "Redis" in down.json()["detail"]
            assert "6390" not in down.text  # the address stays in the log
        broken = await client.post("/api/broken")
        assert broken.status_code == 500 and broken.headers["content-type"] == "application/json"
        assert broken.json() == {"detail": "Something went wrong on the server; try again.", "code": "internal_error"}
        refused = await client.post("/api/refused")
        assert refused.status_code == 409 and refused.json()["code"] == "busy"
