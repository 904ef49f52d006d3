"""A plain a2a-sdk agent that asks back, run as its own process: the remote side of issue 36's tests.

    python tests/utils/a2a_asking_server.py --port 8766 [--auth]

Every task first asks `Which city do you mean? (task <taskId>, context <contextId>)`
(`input-required`; with `--auth`: `auth-required` and `Sign in at https://example.test/login
first. (task …, context …)`), with a status note before it. The caller's next message in
the same task is the answer: the agent then completes with the artifact
`You answered: <answer> (task <taskId>, context <contextId>)`, so a test can see that
the answer reached the same task and context (a new task would be asked again).
"""

from __future__ import annotations

import argparse

import uvicorn
from a2a.helpers import get_message_text, new_task_from_user_message, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Part, TaskState
from starlette.applications import Starlette

QUESTION = "Which city do you mean?"
SIGN_IN = "Sign in at https://example.test/login first."


class AskingExecutor(AgentExecutor):
    """Asks one question per task, then answers with what it was told."""

    def __init__(self, auth: bool) -> None:
        self.auth = auth

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Ask on a new task; complete on the answer to a task that asked."""
        waiting = {TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED}
        current = context.current_task
        if current is not None and current.status.state in waiting:
            updater = TaskUpdater(event_queue, current.id, current.context_id)
            answer = get_message_text(context.message).strip()
            text = f"You answered: {answer} (task {current.id}, context {current.context_id})"
            await updater.update_status(TaskState.TASK_STATE_WORKING)
            await updater.add_artifact([Part(text=text)], name="answer")
            await updater.complete()
            return
        task = current or new_task_from_user_message(context.message)
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.update_status(
            TaskState.TASK_STATE_WORKING,
            message=new_text_message("Looking it up… ", context_id=task.context_id, task_id=task.id),
        )
        state = TaskState.TASK_STATE_AUTH_REQUIRED if self.auth else TaskState.TASK_STATE_INPUT_REQUIRED
        words = f"{SIGN_IN if self.auth else QUESTION} (task {task.id}, context {task.context_id})"
        await updater.update_status(state, message=new_text_message(words, context_id=task.context_id, task_id=task.id))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Mark the task canceled."""
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def build_app(port: int, *, auth: bool = False) -> Starlette:
    """The agent's Starlette app: card and JSON-RPC routes from the SDK's factories."""
    url = f"http://127.0.0.1:{port}/"
    card = AgentCard(
        name="Asking Agent",
        description="Asks which city you mean, then answers (a plain a2a-sdk agent).",
        version="1.0.0",
        supported_interfaces=[AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="ask", name="Ask", description="Asks back", tags=["test"])],
    )
    handler = DefaultRequestHandler(
        agent_executor=AskingExecutor(auth), task_store=InMemoryTaskStore(), agent_card=card
    )
    routes = [*create_agent_card_routes(card), *create_jsonrpc_routes(handler, rpc_url="/", enable_v0_3_compat=True)]
    return Starlette(routes=routes)


def main() -> None:
    """Parse the options and serve until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--auth", action="store_true")
    args = parser.parse_args()
    uvicorn.run(build_app(args.port, auth=args.auth), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
