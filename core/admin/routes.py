"""`/api/admin` (included under `/api` by `core.routes`): the admin area's API, for admins only.

    GET    /api/admin/users                   accounts, each with its running turns' count
    POST   /api/admin/users                   create an account {username, password, admin}
    PATCH  /api/admin/users/{id}              {admin?, disabled?, password?}
    GET    /api/admin/turns                   every running turn (any user, any replica)
    POST   /api/admin/turns/{sessionId}/stop  stop one
    GET    /api/admin/model                   the global model connection (never its key)
    PUT    /api/admin/model                   save {defaultModel?, apiBase?, apiKey?}
    POST   /api/admin/model/test              one prompt through the fields, unsaved
    GET    /api/admin/health                  database, Redis, broker, this replica

Who: `AreaAdmin` (an enabled admin; `local` in single-user mode), else 403 `admin_required`, before the
body is validated. Account changes in single-user mode: 409 `single_user_mode` (accounts start on the command line).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, status
from pydantic import Field

from core.admin.model_connection import ConnectionRuleError
from core.admin.service import AdminArea, SingleUserModeError
from core.auth.accounts import AccountError
from core.auth.deps import AreaAdmin, get_services
from core.auth.user_admin import AccountRuleError, UnknownAccountError
from core.web.errors import ApiError
from core.web.schemas import RequestBody


async def get_admin_area(request: Request) -> AdminArea:
    """The admin area's operations."""
    area: AdminArea = get_services(request).admin
    return area


AdminAreaDep = Annotated[AdminArea, Depends(get_admin_area)]


class NewAccount(RequestBody):
    """An account to create."""

    username: str = Field(min_length=1, max_length=64)
    password: str = Field(min_length=1, max_length=1024)
    admin: bool = False


class AccountChange(RequestBody):
    """What to change of an account; fields not given stay."""

    admin: bool | None = None
    disabled: bool | None = None
    password: str | None = Field(None, min_length=1, max_length=1024, description="A new password")


class ConnectionFields(RequestBody):
    """The global model connection; "" puts a field back to the environment's (the key: removes the saved one)."""

    default_model: str | None = Field(None, alias="defaultModel", max_length=255)
    api_base: str | None = Field(None, alias="apiBase", max_length=1000)
    api_key: str | None = Field(None, alias="apiKey", max_length=4096, description="Write-only")


def _refused(exc: Exception) -> ApiError:
    if isinstance(exc, UnknownAccountError):
        return ApiError(status.HTTP_404_NOT_FOUND, exc.code, detail=str(exc))
    if isinstance(exc, SingleUserModeError | AccountRuleError):
        return ApiError(status.HTTP_409_CONFLICT, exc.code, detail=str(exc))
    if isinstance(exc, AccountError):
        text = str(exc)
        return ApiError(422, exc.code, detail=text[:1].upper() + text[1:] + ".")
    raise exc


def admin_router() -> APIRouter:
    """The `/admin` routes (tag `admin`)."""
    router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(_admin_first)])

    @router.get("/users")
    async def list_users(area: AdminAreaDep) -> list[dict[str, Any]]:
        return await area.accounts()

    @router.post("/users", status_code=status.HTTP_201_CREATED)
    async def create_user(body: NewAccount, area: AdminAreaDep) -> dict[str, Any]:
        try:
            return await area.create_account(username=body.username, password=body.password, admin=body.admin)
        except (AccountError, SingleUserModeError) as exc:
            raise _refused(exc) from exc

    @router.patch("/users/{user_id}")
    async def change_user(user_id: int, body: AccountChange, user: AreaAdmin, area: AdminAreaDep) -> dict[str, Any]:
        changes = body.model_dump(exclude_none=True)
        try:
            return await area.change_account(user, user_id, changes)
        except (AccountError, AccountRuleError, UnknownAccountError, SingleUserModeError) as exc:
            raise _refused(exc) from exc

    @router.get("/turns")
    async def running_turns(area: AdminAreaDep) -> list[dict[str, Any]]:
        return await area.running_turns()

    @router.post("/turns/{session_id}/stop")
    async def stop_turn(session_id: str, area: AdminAreaDep) -> dict[str, Any]:
        if not await area.stop_turn(session_id):
            raise ApiError(
                status.HTTP_404_NOT_FOUND,
                "turn_not_running",
                detail="No turn of that chat is running (it may have ended).",
            )
        return {"stopped": True}

    @router.get("/model")
    async def model_connection(area: AdminAreaDep) -> dict[str, Any]:
        return await area.model.view()

    @router.put("/model")
    async def save_model_connection(body: ConnectionFields, user: AreaAdmin, area: AdminAreaDep) -> dict[str, Any]:
        assert user.id is not None, "a stored account has its id"
        try:
            return await area.model.save(body.model_dump(by_alias=True, exclude_unset=True), user_id=user.id)
        except ConnectionRuleError as exc:
            raise ApiError(
                422,
                exc.code,
                detail=[{"loc": ["body", exc.field], "msg": exc.message, "type": exc.code}],
            ) from exc

    @router.post("/model/test")
    async def test_model_connection(body: ConnectionFields, area: AdminAreaDep) -> dict[str, Any]:
        outcome = await area.model.test(body.model_dump(by_alias=True, exclude_unset=True))
        return {"ok": outcome.ok, "text": outcome.text}

    @router.get("/health")
    async def health(area: AdminAreaDep) -> dict[str, Any]:
        return await area.health()

    return router


async def _admin_first(user: AreaAdmin) -> None:
    """Every route of the area: an admin, checked before the body is read."""
