"""Files of chats over HTTP (included under `/api` by `core.routes`; issue 36).

    POST /api/sessions/{id}/attachments     upload one file (multipart, field `file`) into a chat of yours
    GET  /api/attachments/{id}              download a file of yours
    GET  /api/attachments/{id}/link?token=  download one file with the token a remote agent was sent

Someone else's chat or file is "not found" (404), exactly like one that does not exist. Every
download has `X-Content-Type-Options: nosniff` and a sandboxing CSP, and every type but plain images
(PNG, JPEG, GIF, WebP) is `Content-Disposition: attachment`, so an uploaded HTML or SVG file is never
shown as a page of this site. The upload's body may be `UPLOAD_MAX_BYTES` plus framing (app.py lets it past the API's
`MAX_REQUEST_BODY_BYTES`); over it, 413 `attachment_too_large`; a type `UPLOAD_ALLOWED_TYPES` does
not list, 415 `attachment_type_refused`.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Query, Request, UploadFile
from fastapi.responses import Response
from pydantic import BaseModel, Field

from core.auth.deps import CurrentUser, DatabaseDep, SettingsDep, user_id_of
from core.chat import attachments
from core.chat import sessions as sessions_store
from core.i18n import _
from core.secret_box import LazySecretBox
from core.web.errors import ApiError
from models import Attachment, AttachmentBlob

__all__ = ["UPLOAD_FRAMING_BYTES", "AttachmentOut", "attachments_router", "upload_path_pattern"]

#: What a multipart body may add around the file (boundaries, headers).
UPLOAD_FRAMING_BYTES = 65_536


def upload_path_pattern() -> str:
    """The upload route's paths, as a regular expression (app.py gives them their own body cap)."""
    return r"^/api/sessions/[^/]+/attachments$"


class AttachmentOut(BaseModel):
    """A stored file."""

    id: str
    name: str
    mime: str = Field(description="Its MIME type")
    size: int = Field(description="Bytes")
    url: str = Field(description="Where its owner downloads it")


def attachment_out(row: Attachment) -> AttachmentOut:
    """The API's view of a file."""
    return AttachmentOut(id=row.id, name=row.name, mime=row.mime, size=row.size, url=f"/api/attachments/{row.id}")


def _refusal(exc: attachments.AttachmentError) -> ApiError:
    return ApiError(exc.status_code, exc.code, detail=exc.message)


def attachments_router() -> APIRouter:
    """The routes above."""
    router = APIRouter(tags=["chat"])

    @router.post("/sessions/{session_id}/attachments", status_code=201, response_model=AttachmentOut)
    async def upload(
        session_id: str, file: UploadFile, request: Request, user: CurrentUser, db: DatabaseDep, settings: SettingsDep
    ) -> AttachmentOut:
        """Store one file in a chat of yours; send its `id` in a message's `attachmentIds`."""
        async with db.read() as s:
            chat = await sessions_store.get_user_session(s, session_id=session_id, user_id=user_id_of(user))
        if chat is None:
            raise ApiError(404, "session_not_found", detail=_("There is no such chat session."))
        limit = settings.upload_max_bytes
        data = await file.read(limit + 1)
        try:
            name, mime = attachments.check_upload(
                file.filename, file.content_type, len(data), max_bytes=limit, allowed=settings.upload_allowed_types
            )
        except attachments.AttachmentError as exc:
            raise _refusal(exc) from None
        row = await attachments.save(
            db, user_id=user_id_of(user), session_id=session_id, name=name, mime=mime, data=data
        )
        return attachment_out(row)

    @router.get("/attachments/{attachment_id}", response_class=Response)
    async def download(attachment_id: str, user: CurrentUser, db: DatabaseDep) -> Response:
        """A file of yours, as a download (plain images may be shown by an `<img>`)."""
        return await _serve(db, attachment_id, user_id_of(user))

    @router.get("/attachments/{attachment_id}/link", response_class=Response)
    async def download_by_link(
        attachment_id: str,
        db: DatabaseDep,
        settings: SettingsDep,
        token: Annotated[str, Query(max_length=2000)] = "",
    ) -> Response:
        """One file, for an agent it was sent to as a link (the token opens that file for a day)."""
        box = LazySecretBox(settings.data_dir, settings.secret_key)
        if not token or not attachments.check_link_token(box, attachment_id, token):
            raise ApiError(404, "attachment_not_found", detail=_("There is no such file."))
        return await _serve(db, attachment_id, None)

    return router


async def _serve(db: Any, attachment_id: str, user_id: int | None) -> Response:
    async with db.read() as s:
        try:
            row = await attachments.get_owned(s, attachment_id, user_id)
        except attachments.AttachmentError as exc:
            raise _refusal(exc) from None
        blob = await s.get(AttachmentBlob, attachment_id)
    if blob is None:
        raise ApiError(404, "attachment_not_found", detail=_("There is no such file."))
    disposition = "inline" if attachments.shown_inline(row.mime) else "attachment"
    headers = {
        "Content-Disposition": f"{disposition}; filename*=UTF-8''{quote(row.name, safe='')}",
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "default-src 'none'; sandbox",
        "Cache-Control": "private, max-age=3600",
    }
    return Response(bytes(blob.data), media_type=row.mime, headers=headers)
