"""File and data parts (issue 36): an answer's artifact blocks as parts, a remote agent's parts as blocks.

Inside the app a task's answer is text whose files and JSON values are artifact blocks
(`core.chat.artifacts`). On the wire they are parts: a file as `raw` bytes (or a `url`) with its
`filename` and `mediaType`, a JSON value as `data`. Server side, `answer_parts` splits a saved answer
into a text part and those parts; client side, `blocks_of` writes a remote agent's file and data parts
back as blocks (their JSON types kept: `json_value`), and `message_request` sends a delegation's files.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from a2a.types import Message, Part, Role, SendMessageRequest
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict, ParseDict

from core.chat import artifacts

__all__ = ["OutgoingFile", "answer_parts", "blocks_of", "json_value", "message_request"]


@dataclass(frozen=True, slots=True)
class OutgoingFile:
    """A file a delegation sends: its bytes, or a link to them."""

    name: str
    mime: str
    data: bytes | None = None
    url: str | None = None


def json_value(value: Any) -> Any:
    """A data part's JSON with its whole numbers whole again.

    The wire carries a data part as a protobuf `Value`, whose numbers are all doubles: `{"days": 3}` would
    reach the agent as `{"days": 3.0}`. JSON itself has one number type, and a sender that wrote 3 meant
    3, so a double with no fraction within 2**53 (where doubles hold every integer) is an integer again.
    """
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    if isinstance(value, dict):
        return {key: json_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [json_value(item) for item in value]
    return value


def _file_part(name: str, mime: str, data: bytes | None, url: str | None) -> Part:
    if data is not None:
        return Part(raw=data, filename=name, media_type=mime)
    return Part(url=url or "", filename=name, media_type=mime)


def answer_parts(text: str) -> list[Part]:
    """A saved answer as parts: its text (blocks taken out), then a part per file or data block."""
    rest, blocks = artifacts.split_blocks(text)
    parts = [Part(text=rest)] if rest or not blocks else []
    for block in blocks:
        if block.kind == "data":
            parts.append(Part(data=ParseDict(block.value, struct_pb2.Value())))
        else:
            parts.append(_file_part(block.name, block.mime, block.data, block.url))
    return parts


def blocks_of(parts: Iterable[Part]) -> str:
    """A remote agent's file and data parts as artifact blocks (text parts are left out)."""
    written: list[str] = []
    for part in parts:
        kind = part.WhichOneof("content")
        if kind == "data":
            written.append(artifacts.data_block(json_value(MessageToDict(part.data))))
        elif kind == "raw":
            mime = part.media_type or "application/octet-stream"
            written.append(artifacts.file_block(part.filename or "file", mime, part.raw))
        elif kind == "url":
            mime = part.media_type or "application/octet-stream"
            written.append(artifacts.file_block(part.filename or "file", mime, url=part.url))
    return "".join(written)


def message_request(
    text: str, files: Sequence[OutgoingFile], *, message_id: str, context_id: str | None = None
) -> SendMessageRequest:
    """A `SendMessage` request from the user: the text part, then a file part per file."""
    parts = [Part(text=text), *(_file_part(f.name, f.mime, f.data, f.url) for f in files)]
    message = Message(message_id=message_id, role=Role.ROLE_USER, parts=parts)
    if context_id:
        message.context_id = context_id
    return SendMessageRequest(message=message)
