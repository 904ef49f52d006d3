"""`/api/me`: who is logged in (included under `/api` by `core.routes`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from core.auth import accounts
from core.auth.deps import AuthStateDep, CurrentUser


def me_router() -> APIRouter:
    """`GET /me`."""
    router = APIRouter()

    @router.get("/me")
    async def me(user: CurrentUser, auth: AuthStateDep) -> dict[str, Any]:
        """Who is logged in."""
        return {
            "id": user.id,
            "username": user.username,
            "multiUser": auth.multi_user,
            "admin": accounts.may_change_agents(user, multi_user=auth.multi_user),
        }

    return router
