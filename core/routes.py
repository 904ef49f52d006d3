"""The REST API for scripts and tests: one `/api` router made of the routers beside each package.

    /api/me                      core.auth.routes
    /api/admin                   core.admin.routes (admins only)
    /api/agents                  core.delegation.agent_routes
    /api/sessions                core.chat.routes
    /api/sessions/{id}/attachments, /api/attachments   core.chat.attachment_routes
    /api/agents/a2a/stream, /api/tasks   core.delegation.routes
    /metrics                     `metrics_router` (Prometheus; METRICS_TOKEN)

(OpenAPI at `/docs`.) The A2A routes (`core.a2a.routes`) and the broker's (`core.broker.routes`)
are included by `app.py` on their own prefixes.
"""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from core import metrics
from core.a2a.api_keys import bearer_token
from core.admin.routes import admin_router
from core.auth.deps import AuthStateDep, SettingsDep
from core.auth.routes import me_router
from core.chat.attachment_routes import attachments_router
from core.chat.routes import chat_router
from core.delegation.agent_routes import agents_router
from core.delegation.routes import tasks_router


def api_router() -> APIRouter:
    """The `/api` routes (tag `chat`; the delegation routes add `delegation`)."""
    router = APIRouter(prefix="/api", tags=["chat"])
    router.include_router(me_router())
    router.include_router(admin_router())
    router.include_router(agents_router())
    router.include_router(chat_router())
    router.include_router(attachments_router())
    router.include_router(tasks_router())
    return router


def metrics_router() -> APIRouter:
    """`GET /metrics`: this process's Prometheus metrics (`core.metrics`; docs/ARCHITECTURE.md, "Metrics").

    With `METRICS_TOKEN` set, only a scrape that sends it as a bearer token gets them (401 otherwise).
    Without it they are open in single-user mode (the app listens on loopback by default) and off (404)
    once there are accounts: a scraper must then be given the token.
    """
    router = APIRouter(tags=["operations"])

    @router.get("/metrics", include_in_schema=False)
    async def scrape(request: Request, settings: SettingsDep, auth: AuthStateDep) -> Response:
        token = settings.metrics_token
        if token:
            given = bearer_token(request.headers.get("authorization"))
            if given is None or not hmac.compare_digest(given.encode(), token.encode()):
                return JSONResponse(
                    {"detail": "Send METRICS_TOKEN as the bearer token: Authorization: Bearer <token>."},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
        elif auth.multi_user:
            return JSONResponse(
                {
                    "detail": "Metrics are off: there are accounts and METRICS_TOKEN is not set. Set it, then scrape "
                    "with it as the bearer token."
                },
                status_code=404,
            )
        return Response(metrics.exposition(), media_type=metrics.CONTENT_TYPE)

    return router
