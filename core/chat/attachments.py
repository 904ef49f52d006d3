"""Files of a user's chats: attached to messages, or returned by delegated agents (issue 36).

A file is a row of `attachments` (owner, chat, name, type, size) and its bytes in `attachment_blobs`
(docs/ARCHITECTURE.md, "Files and data"). Only its owner reads it: anyone else's id is "not found",
exactly as an id that does not exist. A message names the files it carries in its `attachments`
column as refs (`{"id", "name", "mime", "size"}`); the model reads them through LiteLLM's content
parts (`expand_for_model`): images as `image_url` parts when the model takes images, text files
inlined, any other file named.

A remote agent that cannot log in as the owner gets a file it is sent as bytes, or, above
`A2A_FILE_INLINE_MAX_BYTES`, as a link with a token (`link_token`) that opens that one file for a day.
"""

from __future__ import annotations

import base64
import fnmatch
import json
import mimetypes
import time
import unicodedata
from dataclasses import dataclass
from typing import Any, Protocol

from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.db import Database
from core.errors import AppError
from core.i18n import _
from core.secret_box import SEALED_PREFIX
from models import Attachment, AttachmentBlob

__all__ = [
    "attachment_link",
    "FILE_PART",
    "LINK_TTL_S",
    "AttachmentError",
    "AttachmentNotFoundError",
    "AttachmentTooLargeError",
    "AttachmentTypeError",
    "FileData",
    "check_link_token",
    "check_upload",
    "clean_name",
    "expand_for_model",
    "file_line",
    "get_owned",
    "link_token",
    "load",
    "model_parts",
    "owned_refs",
    "prepare_for_agent",
    "ref_of",
    "save",
    "shown_inline",
    "takes_images",
    "task_files",
]

LINK_TTL_S = 86_400
#: The content part `build_model_messages` leaves for each attached file; `expand_for_model` replaces it.
FILE_PART = "attachment"
#: The largest text file given to a model whole (a longer one is cut there).
INLINE_TEXT_MAX_CHARS = 50_000
#: Types a browser may show inline (images it renders without scripts); everything else is a download.
_SHOWN_INLINE = {"image/png", "image/jpeg", "image/gif", "image/webp"}
_TEXT_TYPES = {"application/json", "application/xml", "application/x-yaml", "application/yaml", "application/csv"}


class AttachmentError(AppError):
    """An attachment refused or not found; `status_code` is the HTTP status the API answers with."""

    code = "attachment_error"
    status_code = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class AttachmentTooLargeError(AttachmentError):
    """A file over `UPLOAD_MAX_BYTES` (413)."""

    code = "attachment_too_large"
    status_code = 413


class AttachmentTypeError(AttachmentError):
    """A file whose type `UPLOAD_ALLOWED_TYPES` does not allow (415)."""

    code = "attachment_type_refused"
    status_code = 415


class AttachmentNotFoundError(AttachmentError):
    """No such file of this user (404: someone else's looks the same)."""

    code = "attachment_not_found"
    status_code = 404


class Sealer(Protocol):
    """What signs links (`core.secret_box.SecretBox`)."""

    def seal(self, secret: str) -> str: ...  # noqa: D102

    def open(self, stored: str) -> str: ...  # noqa: D102


@dataclass(frozen=True, slots=True)
class FileData:
    """A file with its bytes (what a delegation sends on)."""

    id: str
    name: str
    mime: str
    data: bytes

    @property
    def size(self) -> int:
        """Its size in bytes."""
        return len(self.data)


def clean_name(name: str | None) -> str:
    """A file name safe to store and to show: no folders, no control characters, at most 200 characters."""
    base = (name or "").replace("\\", "/").rsplit("/", 1)[-1]
    base = "".join(c for c in base if unicodedata.category(c)[0] != "C").strip().lstrip(".")
    return (base or "file")[:200]


def _mime_of(name: str, declared: str | None) -> str:
    declared = (declared or "").split(";", 1)[0].strip().lower()
    if declared and declared != "application/octet-stream":
        return declared
    guessed, _encoding = mimetypes.guess_type(name)
    return guessed or declared or "application/octet-stream"


def check_upload(
    name: str | None, declared_mime: str | None, size: int, *, max_bytes: int, allowed: list[str]
) -> tuple[str, str]:
    """The clean name and the type of a file someone uploads.

    Raises:
        AttachmentTooLargeError: over `max_bytes`.
        AttachmentTypeError: a type no pattern of `allowed` matches, or an empty file.
    """
    clean = clean_name(name)
    mime = _mime_of(clean, declared_mime)
    if size > max_bytes:
        raise AttachmentTooLargeError(
            _("The file is too large: at most {limit} bytes are accepted.").format(limit=max_bytes)
        )
    if not any(fnmatch.fnmatchcase(mime, pattern.strip().lower()) for pattern in allowed):
        raise AttachmentTypeError(_("Files of type {mime} cannot be attached here.").format(mime=mime))
    return clean, mime


def shown_inline(mime: str) -> bool:
    """Whether a browser may show the file in the page (plain images); HTML, SVG and all else are downloads."""
    return mime in _SHOWN_INLINE


def ref_of(row: Attachment) -> dict[str, Any]:
    """What a message keeps of a file."""
    return {"id": row.id, "name": row.name, "mime": row.mime, "size": row.size}


def file_line(ref: dict[str, Any]) -> str:
    """How a file is named to a model and in tool results: `NAME (MIME, N bytes)`."""
    return f"{ref.get('name')} ({ref.get('mime')}, {ref.get('size')} bytes)"


async def save(
    db: Database,
    *,
    user_id: int,
    session_id: str | None,
    name: str,
    mime: str,
    data: bytes,
    task_id: str | None = None,
) -> Attachment:
    """Store a file of `user_id` (already checked) and return its row."""
    row = Attachment(user_id=user_id, session_id=session_id, task_id=task_id, name=name, mime=mime, size=len(data))
    async with db.session() as s:
        s.add(row)
        await s.flush()
        s.add(AttachmentBlob(id=row.id, data=data))
        await s.commit()
    return row


async def get_owned(s: AsyncSession, attachment_id: str, user_id: int | None) -> Attachment:
    """The file with that id if `user_id` owns it (None: whoever; a signed link was checked).

    Raises:
        AttachmentNotFoundError: no such file, or someone else's.
    """
    row = await s.get(Attachment, attachment_id)
    if row is None or (user_id is not None and row.user_id != user_id):
        raise AttachmentNotFoundError(_("There is no such file."))
    return row


async def load(db: Database, ids: list[str]) -> dict[str, FileData]:
    """The files with these ids, bytes included (a missing one is left out)."""
    if not ids:
        return {}
    found: dict[str, FileData] = {}
    async with db.read() as s:
        for attachment_id in dict.fromkeys(ids):
            row = await s.get(Attachment, attachment_id)
            blob = await s.get(AttachmentBlob, attachment_id)
            if row is not None and blob is not None:
                found[attachment_id] = FileData(row.id, row.name, row.mime, bytes(blob.data))
    return found


async def owned_refs(db: Database, ids: list[str], *, user_id: int, session_id: str) -> list[dict[str, Any]]:
    """The refs of files a message of `user_id` in `session_id` may carry, in the order given.

    Raises:
        AttachmentNotFoundError: an id that is not a file of that user's chat.
    """
    if not ids:
        return []
    async with db.read() as s:
        rows = {row.id: row for row in [await s.get(Attachment, i) for i in dict.fromkeys(ids)] if row is not None}
    refs = []
    for attachment_id in dict.fromkeys(ids):
        row = rows.get(attachment_id)
        if row is None or row.user_id != user_id or row.session_id != session_id:
            raise AttachmentNotFoundError(_("There is no such file."))
        refs.append(ref_of(row))
    return refs


def link_token(box: Sealer, attachment_id: str, *, ttl_s: int = LINK_TTL_S, now: float | None = None) -> str:
    """A token that opens this one file for `ttl_s` seconds, for an agent that cannot log in as its owner."""
    expires = int((now if now is not None else time.time()) + ttl_s)
    return box.seal(json.dumps([attachment_id, expires])).removeprefix(SEALED_PREFIX)


def check_link_token(box: Sealer, attachment_id: str, token: str, *, now: float | None = None) -> bool:
    """Whether `token` opens the file `attachment_id` now."""
    try:
        opened = json.loads(box.open(SEALED_PREFIX + token))
    except Exception:  # a token of another key, or not a token at all
        return False
    if not (isinstance(opened, list) and len(opened) == 2):
        return False
    return bool(opened[0] == attachment_id and isinstance(opened[1], int) and opened[1] >= (now or time.time()))


def model_parts(text: str, refs: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A user message's content for the model: its text, then a placeholder part per file."""
    if not refs:
        return text
    return [{"type": "text", "text": text}, *({"type": FILE_PART, FILE_PART: ref} for ref in refs)]


async def expand_for_model(db: Database, messages: list[dict[str, Any]], *, takes_images: bool) -> None:
    """Replace the files' placeholder parts of `messages` with what the model reads (in place).

    Each file is named in a text part ("Attached file: NAME (MIME, N bytes)"); an image follows as an
    `image_url` part with its bytes when the model takes images; a text file follows inlined.
    """
    ids = _file_ids(messages)
    if not ids:
        return
    files = await load(db, ids)
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        expanded: list[dict[str, Any]] = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == FILE_PART):
                expanded.append(part)
                continue
            ref = part[FILE_PART]
            expanded.append({"type": "text", "text": "Attached file: " + file_line(ref)})
            found = files.get(ref["id"])
            if found is None:
                continue
            if found.mime.startswith("image/") and found.mime != "image/svg+xml" and takes_images:
                url = f"data:{found.mime};base64,{base64.b64encode(found.data).decode('ascii')}"
                expanded.append({"type": "image_url", "image_url": {"url": url}})
            elif found.mime.startswith("text/") or found.mime in _TEXT_TYPES:
                body = found.data.decode("utf-8", errors="replace")[:INLINE_TEXT_MAX_CHARS]
                expanded.append({"type": "text", "text": f"```\n{body}\n```"})
        message["content"] = expanded


def takes_images(model: str) -> bool:
    """Whether the model reads `image_url` parts: the demo model does; others as LiteLLM knows them (else not)."""
    if model.startswith("local/"):
        return True
    import sys

    litellm = sys.modules.get("litellm")  # imported by the gateway before any model call (core/chat/llm.py)
    if litellm is None:
        return False
    try:
        return bool(litellm.supports_vision(model=model))
    except Exception:  # a model LiteLLM does not know
        return False


def _file_ids(messages: list[dict[str, Any]]) -> list[str]:
    """The ids of the files whose placeholder parts are in `messages`."""
    return [
        part[FILE_PART]["id"]
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict) and part.get("type") == FILE_PART
    ]


async def prepare_for_agent(db: Database, agent: Any, messages: list[dict[str, Any]]) -> None:
    """`expand_for_model` for the agent's model (`AgentRunner`'s `prepare_messages`).

    Most turns carry no file: then LiteLLM is not asked whether the model takes images (a look-up in its
    model list, about a hundredth of a short turn's CPU, issue 38).
    """
    if _file_ids(messages):
        await expand_for_model(db, messages, takes_images=takes_images(agent.model or ""))


def attachment_link(base_url: str, box: Sealer, attachment_id: str) -> str:
    """An absolute URL that opens one file for a day, for a remote agent it is sent to."""
    return f"{base_url}/api/attachments/{attachment_id}/link?token={link_token(box, attachment_id)}"


async def task_files(db: Database, task_id: str, user_id: int) -> list[Attachment]:
    """The files a delegated task returned to `user_id`, oldest first (the panel of a task no longer buffered)."""
    async with db.read() as s:
        result = await s.exec(
            select(Attachment)
            .where(Attachment.task_id == task_id, Attachment.user_id == user_id)
            .order_by(col(Attachment.created_at))
        )
        return list(result.all())
