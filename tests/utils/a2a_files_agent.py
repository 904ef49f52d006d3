"""A plain a2a-sdk 1.3 agent that records the parts it is sent and answers with files and data (issue 36).

Run in the test's process (`files_agent`): `received` holds each message it got as ProtoJSON (the
parts as the wire carried them). What it answers:

- a message whose text has `/artifacts`: an artifact with a text part, an 8×8 PNG file part
  (`chart.png`) and a data part `{"days": 3, "ok": true}`, then completed;
- anything else: `Got N file(s): NAME (MIME, N bytes), ...` as the artifact, then completed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from a2a.helpers import get_message_text, new_task_from_user_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Part
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict, ParseDict
from starlette.applications import Starlette

from core.chat.demo_model import _tiny_png
from tests.utils.live_server import live_server
from tests.utils.ports import free_port

PNG = _tiny_png()


class FilesExecutor(AgentExecutor):
    """Records every message; answers with the files it got, or with artifacts of every kind."""

    def __init__(self, received: list[dict]) -> None:
        self.received = received

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Run one task."""
        self.received.append(MessageToDict(context.message))
        task = context.current_task or new_task_from_user_message(context.message)
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        if "/artifacts" in get_message_text(context.message):
            data = ParseDict({"days": 3, "ok": True}, struct_pb2.Value())
            parts = [
                Part(text="Here are the results."),
                Part(raw=PNG, filename="chart.png", media_type="image/png"),
                Part(data=data),
            ]
            await updater.add_artifact(parts, name="results")
        else:
            files = [p for p in context.message.parts if p.WhichOneof("content") in ("raw", "url")]
            named = ", ".join(f"{p.filename} ({p.media_type}, {len(p.raw)} bytes)" for p in files)
            await updater.add_artifact([Part(text=f"Got {len(files)} file(s): {named}")], name="result")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Mark the task canceled."""
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def build_app(port: int, received: list[dict]) -> Starlette:
    """The agent's app: the SDK's card and JSON-RPC routes."""
    card = AgentCard(
        name="Files Agent",
        description="Records the parts it gets; answers with files and data.",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=f"http://127.0.0.1:{port}/", protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain", "image/png", "text/*"],
        default_output_modes=["text/plain", "image/png", "application/json"],
        skills=[AgentSkill(id="files", name="Files", description="Takes and returns files", tags=["test"])],
    )
    handler = DefaultRequestHandler(
        agent_executor=FilesExecutor(received), task_store=InMemoryTaskStore(), agent_card=card
    )
    return Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, rpc_url="/")])


@contextmanager
def files_agent() -> Iterator[tuple[str, list[dict]]]:
    """Serve the agent on a free loopback port; yields its card URL and the list of what it received."""
    port = free_port()
    received: list[dict] = []
    with live_server(build_app(port, received), port=port) as url:
        yield f"{url}/.well-known/agent-card.json", received
