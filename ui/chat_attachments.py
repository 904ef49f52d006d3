"""Files in the chat page (issue 36): attach, show what a message carries, show a task's artifacts.

The composer's attach button, the files a message carries, and the file and data artifacts of
delegated tasks in the side panel.

The composer holds the files picked (the button `chat-attach`, a drop on the page or a paste: assets/app.js
hands those to the same hidden uploader) until the message is sent; they are checked against
`UPLOAD_MAX_BYTES` and `UPLOAD_ALLOWED_TYPES` as they arrive and stored for the user in the chat on send
(`core.chat.attachments`), so a new chat needs no session before its first message. Files are shown as
chips linking to their owner-only download (`/api/attachments/{id}`); images as thumbnails.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from nicegui import events, ui

from core.chat import attachments
from core.chat.artifacts import ArtifactBlock, split_blocks
from core.chat.engine import ChatEngine
from core.i18n import _
from core.settings import Settings
from core.streaming import events as ev
from ui.frame import testid

__all__ = ["ComposerFiles", "message_files", "saved_artifacts", "show_artifact", "show_block"]

_IMAGES = {"image/png", "image/jpeg", "image/gif", "image/webp"}


@dataclass(slots=True)
class _Pending:
    name: str
    mime: str
    data: bytes
    ref: dict[str, Any] | None = None  # once stored (a send that was refused keeps it for the next)


class ComposerFiles:
    """The files picked for the next message: the attach button, the chips, the hidden uploader."""

    def __init__(self, chat: ChatEngine, settings: Settings, user_id: int) -> None:
        self.chat = chat
        self.settings = settings
        self.user_id = user_id
        self.pending: list[_Pending] = []
        self.upload = (
            ui.upload(
                on_upload=self._received, multiple=True, auto_upload=True, max_file_size=settings.upload_max_bytes
            )
            .props("data-testid=chat-upload hide-upload-btn")
            .classes("chat-upload hidden")
        )
        self.upload.on_rejected(lambda: self._refused(_("The file is too large: at most {limit} bytes are accepted.")))
        self.button = testid(
            ui.button(icon="attach_file", on_click=lambda: self.upload.run_method("pickFiles")).props(
                "flat round dense aria-label='" + _("Attach files") + "'"
            ),
            "chat-attach",
        )

    def chips_row(self) -> None:
        """Where the picked files show (call inside the composer's column)."""
        self.chips = testid(ui.row().classes("w-full gap-1 chat-attachments"), "chat-attachments")
        self.chips.set_visibility(False)

    def _refused(self, message: str) -> None:
        ui.notify(message.format(limit=self.settings.upload_max_bytes), color="negative")

    async def _received(self, event: events.UploadEventArguments) -> None:
        data = await event.file.read()
        try:
            name, mime = attachments.check_upload(
                event.file.name,
                event.file.content_type,
                len(data),
                max_bytes=self.settings.upload_max_bytes,
                allowed=self.settings.upload_allowed_types,
            )
        except attachments.AttachmentError as exc:
            ui.notify(exc.message, color="negative")
            return
        self.pending.append(_Pending(name, mime, data))
        self._render()
        self.upload.reset()

    def _render(self) -> None:
        self.chips.clear()
        with self.chips:
            for index, file in enumerate(self.pending):
                ui.chip(
                    file.name,
                    icon="image" if file.mime in _IMAGES else "description",
                    removable=True,
                    on_value_change=lambda e, i=index: self._remove(i) if not e.value else None,
                ).props("dense data-testid=chat-attachment outline")
        self.chips.set_visibility(bool(self.pending))

    def _remove(self, index: int) -> None:
        if 0 <= index < len(self.pending):
            del self.pending[index]
        self._render()

    async def store(self, session_id: str) -> list[dict[str, Any]]:
        """Store the picked files in the chat (once each); the refs the message carries."""
        for file in self.pending:
            if file.ref is None:
                row = await attachments.save(
                    self.chat.db,
                    user_id=self.user_id,
                    session_id=session_id,
                    name=file.name,
                    mime=file.mime,
                    data=file.data,
                )
                file.ref = attachments.ref_of(row)
        return [file.ref for file in self.pending if file.ref is not None]

    def clear(self) -> None:
        """The message was sent: the composer holds no files any more."""
        self.pending = []
        self._render()


def message_files(refs: list[dict[str, Any]]) -> None:
    """The files a sent message carries: thumbnails for images, chips for the rest (links to their download)."""
    if not refs:
        return
    with ui.row().classes("gap-1 items-center message-files").props("data-testid=message-files"):
        for ref in refs:
            url = f"/api/attachments/{ref.get('id')}"
            label = attachments.file_line(ref)
            if ref.get("mime") in _IMAGES:
                with ui.link(target=url, new_tab=True).props(f"aria-label='{_attr(label)}'"):
                    ui.image(url).classes("message-file-thumb").props(
                        f"data-testid=message-file-image alt='{_attr(str(ref.get('name')))}'"
                    )
            else:
                ui.link(str(ref.get("name")), url).props(f"download data-testid=message-file title='{_attr(label)}'")


def show_artifact(artifact: ev.TaskArtifact) -> None:
    """A delegated task's file or data artifact in its panel tab (call inside the tab's artifacts column)."""
    if artifact.artifact_kind == "data":
        title = _("Data") + (f": {artifact.name}" if artifact.name else "")
        with ui.expansion(title, icon="data_object").classes("w-full").props("dense data-testid=agent-panel-data"):
            ui.code(json.dumps(artifact.data, ensure_ascii=False, indent=2), language="json").classes("w-full")
        return
    label = f"{artifact.name} ({artifact.mime}, {artifact.size} bytes)" if artifact.size is not None else artifact.name
    if artifact.attachment_id is not None:
        url = f"/api/attachments/{artifact.attachment_id}"
        if artifact.mime in _IMAGES:
            ui.image(url).classes("agent-panel-image").props(f"data-testid=agent-panel-image alt='{_attr(label)}'")
        ui.link(label, url).props("download data-testid=agent-panel-file").classes("text-caption")
    elif artifact.url and artifact.url.startswith(("https://", "http://")):  # a remote agent's own link, not fetched
        ui.link(label, artifact.url, new_tab=True).props('rel="noopener noreferrer" data-testid=agent-panel-file')


async def saved_artifacts(db: Any, task_id: str, user_id: int, answer: str) -> list[ev.TaskArtifact]:
    """A finished task's artifacts from what was saved: its stored files, and the data blocks of its answer."""
    files = [
        ev.TaskArtifact("file", row.name, row.mime, row.size, row.id)
        for row in await attachments.task_files(db, task_id, user_id)
    ]
    data = [ev.TaskArtifact("data", b.name, data=b.value) for b in split_blocks(answer)[1] if b.kind == "data"]
    return files + data


def show_block(block: ArtifactBlock) -> None:
    """A file or data block of a chat's own answer (a chat turn stores no files).

    Data is folded, a plain image shown, any other file offered for download from the answer's own bytes.
    """
    if block.kind == "data":
        show_artifact(ev.TaskArtifact("data", block.name, data=block.value))
        return
    label = f"{block.name} ({block.mime})"
    if block.data is None:
        if block.url and block.url.startswith(("https://", "http://")):
            ui.link(label, block.url, new_tab=True).props('rel="noopener noreferrer" data-testid=message-artifact-file')
        return
    url = f"data:{block.mime if block.mime in _IMAGES else 'application/octet-stream'};base64,"
    url += base64.b64encode(block.data).decode("ascii")
    if block.mime in _IMAGES:
        ui.image(url).classes("agent-panel-image").props(f"data-testid=message-artifact-image alt='{_attr(label)}'")
    else:
        ui.link(label, url).props(f"download='{_attr(block.name)}' data-testid=message-artifact-file")


def _attr(text: str) -> str:
    return text.replace("&", "&amp;").replace("'", "&#39;").replace('"', "&quot;")
