"""Issue 36 item 5: a remote agent's progress notes stay notes, on their own lines, never glued into its answer.

The remote side is `tests/utils/a2a_echo_server.py` (only the a2a-sdk, its own process): `/chunks` sends
notes in status messages around an answer in appended artifact chunks, `/halfway` fails after one chunk,
anything else streams its answer word by word in status messages.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.delegation.notes import ANSWER_TEXT_ID, STATUS_TEXT_ID, layout
from core.delegation.tasks import task_stream_key
from core.streaming import events as ev
from tests.test_a2a_client import chat, register
from tests.utils.a2a_agents import LOCAL_AGENTS, echo_server
from tests.utils.a2a_live import LiveApp, live_a2a_app

S, A = STATUS_TEXT_ID, ANSWER_TEXT_ID


@pytest.mark.parametrize(
    ("pieces", "shown"),
    [
        ([], ""),
        ([(S, "Echo:"), (S, " two"), (S, " words")], "Echo: two words"),  # the answer streamed in status messages
        ([(A, "local "), (A, "answer")], "local answer"),
        ([(S, "starting…"), (S, "chunk 1/2"), (A, "slow"), (S, "chunk 2/2"), (A, " echo")],
         "starting…\n\nchunk 1/2\n\nchunk 2/2\n\nslow echo"),
        ([(A, "three words"), (S, " Here is the answer. ")], "Here is the answer.\n\nthree words"),
        ([(S, "tick 0"), (S, "  "), (S, "tick 1"), (A, "\n\ndone")], "tick 0\n\ntick 1\n\ndone"),
        ([(S, "note"), (A, "\n")], "note"),
    ],
)  # fmt: skip
def test_layout(pieces: list[tuple[str, str]], shown: str) -> None:
    assert layout(pieces) == shown


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    with echo_server() as url:
        yield url


@pytest.fixture
def app(tmp_path: Path) -> Iterator[LiveApp]:
    with live_a2a_app(tmp_path, demo_model_delay_ms=0, outbound_allow_hosts=LOCAL_AGENTS) as live:
        yield live


async def buffered_text(app: LiveApp, task_id: str) -> list[tuple[str, str]]:
    """The task buffer's text pieces, `(text part id, text)`, as the side panel reads them."""
    pieces = []
    async for event in app.services.hub.subscribe(task_stream_key(task_id)):
        typed = ev.from_stream(event.type, event.data)
        if isinstance(typed, ev.TextDelta):
            pieces.append((typed.id, typed.delta))
        if isinstance(typed, ev.TaskDone):
            break
    return pieces


def task_of(app: LiveApp, session: str) -> dict:
    [task] = [t for t in httpx.get(f"{app.url}/api/tasks", timeout=10).json() if t["callerSessionId"] == session]
    return task


async def test_notes_are_marked_in_the_task_buffer_and_the_answer_is_the_artifact(app: LiveApp, echo: str) -> None:
    assert register(app, echo, "echo").status_code == 201
    task = task_of(app, chat(app, "@echo /chunks hello remote world"))
    assert task["state"] == "completed", task
    pieces = await buffered_text(app, task["id"])
    assert pieces == [
        (S, "starting…"),
        (S, "chunk 1/3"),
        (A, "hello"),
        (S, "chunk 2/3"),
        (A, " remote"),
        (S, "chunk 3/3"),
        (A, " world"),
    ]
    assert layout(pieces) == "starting…\n\nchunk 1/3\n\nchunk 2/3\n\nchunk 3/3\n\nhello remote world"
    detail = httpx.get(f"{app.url}/api/tasks/{task['id']}", timeout=10).json()
    assert detail["messages"][-1]["content"] == "hello remote world"

    # An answer streamed word by word in status messages is one text, as it came.
    task = task_of(app, chat(app, "@echo two words"))
    pieces = await buffered_text(app, task["id"])
    assert {p for p, _ in pieces} == {S} and layout(pieces) == "Echo: two words"


async def test_a_failure_says_what_the_agent_had_said_with_its_notes_on_their_own_lines(
    app: LiveApp, echo: str
) -> None:
    assert register(app, echo, "echo").status_code == 201
    session = chat(app, "@echo /halfway alpha beta gamma")
    task = task_of(app, session)
    assert (task["state"], task["error"]) == ("failed", "out of words"), task
    messages = httpx.get(f"{app.url}/api/sessions/{session}/messages", timeout=10).json()
    [result] = [r for m in messages for r in (m["toolResults"] or []) if "out of words" in str(r)]
    said = "starting…\n\nchunk 1/3\n\ngiving up\n\nalpha"
    assert result["output"]["error"] == f"Echo Agent failed: out of words. It had said:\n\n{said}", result
    detail = httpx.get(f"{app.url}/api/tasks/{task['id']}", timeout=10).json()
    assert detail["messages"][-1]["content"] == said
