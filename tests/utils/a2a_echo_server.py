"""A plain A2A agent built only on the a2a-sdk, run as its own process: the remote side of the tests and the bench.

    python tests/utils/a2a_echo_server.py --port 8765 [--name "Echo Agent"] [--v03-only] [--delay-ms 0]

It serves its card at `/.well-known/agent-card.json` and JSON-RPC at `/` with
the SDK's own routes, handler and in-memory task store. What it answers:

- `/ticks N`: N `working` status updates with the text `tick i`, then the
  artifact `done after N ticks`, then completed (the bench's trivial agent);
- `/fail`: one status update, then failed with a reason;
- `/chunks <words>`: a status note `starting…`, then the words as chunks of one
  artifact (appended), each after a note `chunk i/N`, then completed: the answer
  is the artifact alone, the notes are progress;
- `/halfway <words>`: as `/chunks`, but it fails after the first chunk and one more note (`giving up`);
- `/summed <words>`: the words as an artifact, then completed with a final message
  `Here is the answer.` (many agents end so): the answer is the artifact alone;
- anything else: `Echo: <text>` word by word in status updates, then the
  whole sentence as the artifact, then completed.

`--delay-ms` pauses between updates (to cancel or subscribe mid-stream);
`--v03-only` puts only a v0.3 interface on the card, as a pre-1.0 agent would;
`--push` offers push notifications (`pushNotifications: true`), sent by the SDK's own
`BasePushNotificationSender` from its `InMemoryPushNotificationConfigStore`.
"""

from __future__ import annotations

import argparse
import asyncio
import re

import httpx
import uvicorn
from a2a.helpers import get_message_text, new_task_from_user_message, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import (
    BasePushNotificationSender,
    InMemoryPushNotificationConfigStore,
    InMemoryTaskStore,
    TaskUpdater,
)
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Part, TaskState
from starlette.applications import Starlette

_TICKS = re.compile(r"^/ticks\s+(\d+)\s*$")
_WORD = re.compile(r"\s*\S+")


class EchoExecutor(AgentExecutor):
    """Echoes the request word by word, or ticks, as status updates; then one artifact."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Run one task."""
        task = context.current_task or new_task_from_user_message(context.message)
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        text = get_message_text(context.message).strip()
        ticks = _TICKS.match(text)
        if text == "/fail":
            await self._say(updater, task, "trying… ")
            await updater.failed(
                new_text_message("the echo agent was told to fail", context_id=task.context_id, task_id=task.id)
            )
            return
        if text.startswith(("/chunks ", "/halfway ")):
            words = text.split()[1:]
            await self._say(updater, task, "starting…")
            for i, word in enumerate(words, 1):
                if i == 2 and text.startswith("/halfway "):
                    await self._say(updater, task, "giving up")
                    await updater.failed(new_text_message("out of words", context_id=task.context_id, task_id=task.id))
                    return
                await self._say(updater, task, f"chunk {i}/{len(words)}")
                await updater.add_artifact(
                    [Part(text=word if i == 1 else f" {word}")],
                    artifact_id="answer",
                    name="answer",
                    append=i > 1,
                    last_chunk=i == len(words),
                )
            await updater.complete()
            return
        if text.startswith("/summed "):
            await updater.add_artifact([Part(text=text.removeprefix("/summed "))], name="answer")
            await updater.complete(new_text_message("Here is the answer.", context_id=task.context_id, task_id=task.id))
            return
        if ticks:
            count = int(ticks.group(1))
            for i in range(count):
                await self._say(updater, task, f"tick {i}")
            result = f"done after {count} ticks"
        else:
            result = f"Echo: {text}"
            for word in _WORD.findall(result):
                await self._say(updater, task, word)
        await updater.add_artifact([Part(text=result)], name="result")
        await updater.complete()

    async def _say(self, updater: TaskUpdater, task, text: str) -> None:
        await updater.update_status(
            TaskState.TASK_STATE_WORKING, message=new_text_message(text, context_id=task.context_id, task_id=task.id)
        )
        if self.delay_s:
            await asyncio.sleep(self.delay_s)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Mark the task canceled (its `execute` was cancelled already)."""
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def build_app(
    port: int, *, name: str = "Echo Agent", v03_only: bool = False, delay_ms: int = 0, push: bool = False
) -> Starlette:
    """The agent's Starlette app: card and JSON-RPC routes from the SDK's factories."""
    url = f"http://127.0.0.1:{port}/"
    versions = ["0.3"] if v03_only else ["1.0", "0.3"]
    card = AgentCard(
        name=name,
        description="Echoes what it is asked, word by word (a plain a2a-sdk agent).",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version=v) for v in versions
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=push),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="Echo", description="Repeats the request", tags=["test"])],
    )
    configs = InMemoryPushNotificationConfigStore() if push else None
    handler = DefaultRequestHandler(
        agent_executor=EchoExecutor(delay_ms / 1000),
        task_store=InMemoryTaskStore(),
        agent_card=card,
        push_config_store=configs,
        push_sender=BasePushNotificationSender(httpx.AsyncClient(timeout=10), configs) if configs else None,
    )
    routes = [*create_agent_card_routes(card), *create_jsonrpc_routes(handler, rpc_url="/", enable_v0_3_compat=True)]
    return Starlette(routes=routes)


def main() -> None:
    """Parse the options and serve until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="Echo Agent")
    parser.add_argument("--v03-only", action="store_true")
    parser.add_argument("--delay-ms", type=int, default=0)
    parser.add_argument("--push", action="store_true")
    args = parser.parse_args()
    app = build_app(args.port, name=args.name, v03_only=args.v03_only, delay_ms=args.delay_ms, push=args.push)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
