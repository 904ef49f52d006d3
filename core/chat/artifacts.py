"""Files and data in an agent's answer text: artifact blocks (issue 36).

An answer is text; a file or a JSON value in it is a fenced block with an `artifact-…` info string:

    ```artifact-file name="chart.png" type="image/png" encoding="base64"
    iVBORw0KGgo…
    ```

    ```artifact-data name="result"
    {"days": 3, "ok": true}
    ```

A file block holds its bytes in base64 (`encoding="base64"`), its text as it is (no encoding), or
only a link (`url="…"`, empty body). The blocks are how a file or data travels with a task's answer
inside the app: the demo model writes them (`/file`, `/data`), a remote agent's file and data parts
become them (`core.a2a.protocol.remote`), the A2A server turns them back into file and data parts
(`core.a2a.protocol.tasks`), and a delegation's end stores the files and shows both in the side
panel (`core.delegation.artifacts`). The saved answer keeps them, so a task read after a restart
still has its artifacts. This module imports nothing of the app.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["ArtifactBlock", "data_block", "file_block", "split_blocks", "strip_blocks"]

_BLOCK = re.compile(r"```artifact-(file|data)([^\n`]*)\n(.*?)\n?```[ \t]*\n?", re.DOTALL)
_OPEN_BLOCK = re.compile(r"```artifact-(file|data)[^`]*\Z", re.DOTALL)
_ATTR = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True, slots=True)
class ArtifactBlock:
    """One block: a file (bytes, or a link) or a JSON value.

    Attributes:
        kind: "file" or "data".
        name: the file's name, or the data's name ("" when none).
        mime: a file's type.
        data: a file's bytes (None for a link).
        url: a file given as a link only.
        value: a data block's JSON value.
    """

    kind: str
    name: str = ""
    mime: str = "application/octet-stream"
    data: bytes | None = None
    url: str | None = None
    value: Any = None


def _quote(value: str) -> str:
    return value.replace('"', "'").replace("\n", " ")


def file_block(name: str, mime: str, data: bytes | None = None, *, url: str | None = None) -> str:
    """A file as a block (bytes in base64, or a link)."""
    if data is None:
        return f'```artifact-file name="{_quote(name)}" type="{_quote(mime)}" url="{_quote(url or "")}"\n```\n'
    body = base64.b64encode(data).decode("ascii")
    return f'```artifact-file name="{_quote(name)}" type="{_quote(mime)}" encoding="base64"\n{body}\n```\n'


def data_block(value: Any, name: str = "") -> str:
    """A JSON value as a block."""
    label = f' name="{_quote(name)}"' if name else ""
    return f"```artifact-data{label}\n{json.dumps(value, ensure_ascii=False)}\n```\n"


def split_blocks(text: str) -> tuple[str, list[ArtifactBlock]]:
    """The text without its blocks, and the blocks in order (a block that does not read is left as text)."""
    blocks: list[ArtifactBlock] = []

    def take(match: re.Match[str]) -> str:
        block = _read(match.group(1), dict(_ATTR.findall(match.group(2))), match.group(3))
        if block is None:
            return match.group(0)
        blocks.append(block)
        return ""

    rest = _BLOCK.sub(take, text)
    return (rest.strip() if blocks else rest), blocks


def strip_blocks(text: str) -> str:
    """The text to show while it is written: whole blocks out, and a block still being written hidden."""
    rest, _blocks = split_blocks(text)
    return _OPEN_BLOCK.sub("", rest)


def _read(kind: str, attrs: dict[str, str], body: str) -> ArtifactBlock | None:
    name = attrs.get("name", "")
    if kind == "data":
        try:
            return ArtifactBlock("data", name=name, value=json.loads(body))
        except json.JSONDecodeError:
            return None
    mime = attrs.get("type") or "application/octet-stream"
    if attrs.get("url"):
        return ArtifactBlock("file", name=name or "file", mime=mime, url=attrs["url"])
    if attrs.get("encoding") == "base64":
        try:
            data = base64.b64decode("".join(body.split()), validate=True)
        except (binascii.Error, ValueError):
            return None
    else:
        data = body.encode("utf-8")
    return ArtifactBlock("file", name=name or "file", mime=mime, data=data)
