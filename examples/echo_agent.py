r"""An example stdio A2A agent for the broker: it echoes the task back, word by word.

Run it behind the pipe, which dials the broker for it:

    python -m core.pipe "ws://127.0.0.1:3100/a2a?a2a_id=echo" -- python examples/echo_agent.py

Then dispatch to it:

    curl -s localhost:3100/a2a/tasks/dispatch -H 'content-type: application/json' \\
         -d '{"task": "hello there", "targetAgent": "echo", "agentId": 1, "chatId": "c1"}'

or mention it in the app's chat: `@echo hello there`.

The protocol (seed 003): JSON-RPC 2.0, one message per line on stdin/stdout.
It answers `agent/authenticatedExtendedCard` (and the other card method names)
with its card; `message/stream` with a Task, a working status, the echo as an
artifact streamed word by word, and a final completed status; `tasks/cancel`
by stopping the task (its stream ends with a canceled status). Many tasks run
at once. Nothing but the standard library; logs go to stderr.

A task whose text starts with `/disconnect` echoes its first three words and then
the agent process exits, as an agent that vanishes mid-stream would (the broker
fails its tasks: "the agent disconnected").

    ECHO_DELAY   seconds between words (default 0.05)
    ECHO_NAME    the agent's display name (default "Echo")
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from typing import Any

CARD_METHODS = {"agent/authenticatedExtendedCard", "agent/getAuthenticatedExtendedCard", "GetExtendedAgentCard"}
DELAY_S = float(os.environ.get("ECHO_DELAY", "0.05"))
NAME = os.environ.get("ECHO_NAME", "Echo")
DISCONNECT_COMMAND = "/disconnect"

CARD = {
    "name": NAME,
    "description": "Repeats what you tell it, word by word. Useful to try the broker.",
    "version": "1.0.0",
    "protocolVersion": "0.3.0",
    "capabilities": {"streaming": True},
    "defaultInputModes": ["text/plain"],
    "defaultOutputModes": ["text/plain"],
    "skills": [{"id": "echo", "name": "Echo", "description": "Repeat the text back", "tags": ["demo"]}],
}


def log(*parts: object) -> None:
    """Logs go to stderr: stdout is the protocol."""
    print(f"[{NAME.lower()}-agent]", *parts, file=sys.stderr, flush=True)


def send(message: dict[str, Any]) -> None:
    """One JSON-RPC message, one line."""
    sys.stdout.write(json.dumps(message, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def result(rpc_id: Any, body: dict[str, Any]) -> None:
    """A JSON-RPC result."""
    send({"jsonrpc": "2.0", "id": rpc_id, "result": body})


def error(rpc_id: Any, code: int, message: str) -> None:
    """A JSON-RPC error."""
    send({"jsonrpc": "2.0", "id": rpc_id, "error": {"code": code, "message": message}})


def text_message(text: str, task_id: str) -> dict[str, Any]:
    """An agent message with one text part (v0.3 shape)."""
    return {
        "kind": "message",
        "role": "agent",
        "messageId": uuid.uuid4().hex,
        "taskId": task_id,
        "parts": [{"kind": "text", "text": text}],
    }


def status(rpc_id: Any, task_id: str, state: str, text: str | None = None, *, final: bool = False) -> None:
    """A status-update event on the stream of `rpc_id`."""
    body: dict[str, Any] = {"state": state}
    if text:
        body["message"] = text_message(text, task_id)
    result(rpc_id, {"kind": "status-update", "taskId": task_id, "contextId": task_id, "status": body, "final": final})


class EchoAgent:
    """The running tasks, by the agent's task id."""

    def __init__(self) -> None:
        self.tasks: dict[str, tuple[Any, asyncio.Task[None]]] = {}

    def handle(self, line: str) -> None:
        """One line from the broker."""
        try:
            message = json.loads(line)
        except ValueError:
            log("ignored a line that is not JSON:", line[:200])
            return
        if not isinstance(message, dict) or "method" not in message:
            if isinstance(message, dict) and "error" in message:
                log("the broker reports:", message["error"])
            return  # responses to us: we send no requests
        method, rpc_id, params = message["method"], message.get("id"), message.get("params") or {}
        if method in CARD_METHODS:
            result(rpc_id, CARD)
        elif method == "message/stream":
            self.start(rpc_id, params)
        elif method == "tasks/cancel":
            self.cancel(rpc_id, str(params.get("id", "")))
        elif rpc_id is not None:
            error(rpc_id, -32601, f"Method not found: {method}")

    def start(self, rpc_id: Any, params: dict[str, Any]) -> None:
        """`message/stream`: start a task that streams on `rpc_id`."""
        parts = (params.get("message") or {}).get("parts") or []
        text = "".join(p.get("text", "") for p in parts if isinstance(p, dict))
        if not text.strip():
            error(rpc_id, -32602, "Invalid params: the message has no text")
            return
        task_id = uuid.uuid4().hex
        task = asyncio.get_running_loop().create_task(self.run(rpc_id, task_id, text))
        self.tasks[task_id] = (rpc_id, task)
        task.add_done_callback(lambda _: self.tasks.pop(task_id, None))

    async def run(self, rpc_id: Any, task_id: str, text: str) -> None:
        """The task: Task, working status, the echo word by word, completed."""
        result(rpc_id, {"kind": "task", "id": task_id, "contextId": task_id, "status": {"state": "submitted"}})
        words = text.split()
        vanish = bool(words) and words[0] == DISCONNECT_COMMAND
        status(rpc_id, task_id, "working", f"Echoing {len(words)} word{'s' if len(words) != 1 else ''}…")
        try:
            for i, word in enumerate(words):
                if vanish and i == 3:
                    log("/disconnect: leaving mid-stream")
                    os._exit(3)  # no goodbye: the pipe sees its child die and closes the socket
                await asyncio.sleep(DELAY_S)
                result(
                    rpc_id,
                    {
                        "kind": "artifact-update",
                        "taskId": task_id,
                        "contextId": task_id,
                        "append": i > 0,
                        "lastChunk": i == len(words) - 1,
                        "artifact": {
                            "artifactId": "echo",
                            "name": "echo",
                            "parts": [{"kind": "text", "text": word if i == 0 else f" {word}"}],
                        },
                    },
                )
        except asyncio.CancelledError:
            status(rpc_id, task_id, "canceled", "Stopped on request.", final=True)
            raise
        status(rpc_id, task_id, "completed", final=True)

    def cancel(self, rpc_id: Any, task_id: str) -> None:
        """`tasks/cancel`."""
        entry = self.tasks.get(task_id)
        if entry is None:
            error(rpc_id, -32001, f"Task not found: {task_id}")
            return
        entry[1].cancel()
        result(rpc_id, {"kind": "task", "id": task_id, "contextId": task_id, "status": {"state": "canceled"}})


async def main() -> None:
    """Read stdin line by line until it closes."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=16 * 1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    agent = EchoAgent()
    log("ready")
    while line := await reader.readline():
        if line.strip():
            agent.handle(line.decode("utf-8", "replace"))
    log("stdin closed; bye")


if __name__ == "__main__":
    asyncio.run(main())
