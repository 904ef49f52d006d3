"""The REST API for scripts and tests: one `/api` router made of the routers beside each package.

    /api/me                      core.auth.routes
    /api/agents                  core.delegation.agent_routes
    /api/sessions                core.chat.routes
    /api/agents/a2a/stream, /api/tasks   core.delegation.routes

(OpenAPI at `/docs`.) The A2A routes (`core.a2a.routes`) and the broker's (`core.broker.routes`)
are included by `app.py` on their own prefixes.
"""

from __future__ import annotations

from fastapi import APIRouter

from core.auth.routes import me_router
from core.chat.routes import chat_router
from core.delegation.agent_routes import agents_router
from core.delegation.routes import tasks_router


def api_router() -> APIRouter:
    """The `/api` routes (tag `chat`; the delegation routes add `delegation`)."""
    router = APIRouter(prefix="/api", tags=["chat"])
    router.include_router(me_router())
    router.include_router(agents_router())
    router.include_router(chat_router())
    router.include_router(tasks_router())
    return router
