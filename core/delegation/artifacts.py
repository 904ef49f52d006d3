"""Files and data through a delegation (issue 36): the caller's files out, the callee's artifacts back.

Out: a delegation passes the files of the caller's message (the user's last message in the calling
chat; in a nested delegation, the files its task was given) to the callee. A local callee's task
message carries them (`agent_messages.attachments`), so its model reads them as any chat's model
does (`core.chat.attachments.expand_for_model`). A remote A2A callee gets them as file parts: bytes
up to `A2A_FILE_INLINE_MAX_BYTES`, else a link that opens that one file for a day (`link`).

Back: a callee's answer may hold artifact blocks (`core.chat.artifacts`): the demo model's `/file`
and `/data`, a remote agent's file and data parts. When the task completes, each file is stored for
the caller's owner in the caller's chat (owner-only, like an upload), and each file and data block is
sent into the task's stream as an `a2a-artifact` event (before `done`), which the side panel shows.
The caller's model reads the answer's text with one line per artifact instead of the blocks.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlmodel import col, select

from core.chat import artifacts as blocks
from core.chat import attachments
from core.chat.tools import ToolContext
from core.db import Database
from core.streaming import events as ev
from models import AgentMessage

__all__ = ["SentFile", "TaskFiles"]

#: The most files a delegation passes on.
MAX_FILES = 20


@dataclass(frozen=True, slots=True)
class SentFile:
    """A file sent to a remote callee: its bytes, or a link to them."""

    name: str
    mime: str
    data: bytes | None = None
    url: str | None = None


@dataclass(slots=True)
class TaskFiles:
    """The files of delegations (see the module's docstring).

    Args:
        db: the database.
        inline_max_bytes: the largest file sent to a remote callee as bytes (`A2A_FILE_INLINE_MAX_BYTES`).
        link: an attachment's id → an absolute URL that opens it for a day (None: larger files are named only).
    """

    db: Database
    inline_max_bytes: int = 1_048_576
    link: Callable[[str], str] | None = None

    async def of_caller(self, ctx: ToolContext) -> list[dict[str, Any]]:
        """The refs of the files of the message the calling turn answers (outside a chat: the ones it was sent)."""
        if ctx.session_id is None:
            return list(ctx.files)[:MAX_FILES]
        async with self.db.read() as s:
            result = await s.exec(
                select(AgentMessage)
                .where(AgentMessage.session_id == ctx.session_id, AgentMessage.role == "user")
                .order_by(col(AgentMessage.sort_order).desc())
                .limit(1)
            )
            last = result.first()
        return list((last.attachments or []) if last is not None else [])[:MAX_FILES]

    async def outgoing(self, refs: list[dict[str, Any]]) -> list[SentFile]:
        """The files to send a remote callee: bytes when small enough, else a link (or only the name)."""
        small = [r["id"] for r in refs if int(r.get("size") or 0) <= self.inline_max_bytes]
        loaded = await attachments.load(self.db, small)
        sent = []
        for ref in refs:
            found = loaded.get(ref["id"])
            if found is not None:
                sent.append(SentFile(found.name, found.mime, data=found.data))
            elif self.link is not None:
                sent.append(SentFile(ref["name"], ref["mime"], url=self.link(ref["id"])))
        return sent

    async def publish_returned(
        self, hub: ev.EventSink, key: str, task_id: str, ctx: ToolContext, task_session_id: str, answer: str
    ) -> str:
        """Store and announce the artifacts of a completed task's answer; the answer for the caller's model."""
        text, found = blocks.split_blocks(answer)
        if not found:
            return answer
        lines = [text] if text else []
        for block in found:
            if block.kind == "data":
                await ev.publish(hub, key, ev.TaskArtifact("data", block.name, data=block.value))
                lines.append(f"Returned data: {json.dumps(block.value, ensure_ascii=False)}")
                continue
            stored_id = None
            if block.data is not None:
                row = await attachments.save(
                    self.db,
                    user_id=ctx.user_id,
                    session_id=ctx.session_id or task_session_id,
                    name=attachments.clean_name(block.name),
                    mime=block.mime,
                    data=block.data,
                    task_id=task_id,
                )
                stored_id = row.id
            size = len(block.data) if block.data is not None else None
            artifact = ev.TaskArtifact("file", block.name, block.mime, size, stored_id, block.url)
            await ev.publish(hub, key, artifact)
            shown = {"name": block.name, "mime": block.mime, "size": size if size is not None else "?"}
            lines.append("Returned file: " + attachments.file_line(shown))
        return "\n\n".join(lines)
