"""ChatInbox on its own: which injects it takes, when it saves them, when it announces, what it does on errors.

The chat engine is a stand-in that records calls and lets the test decide when a
turn runs; the end-to-end behaviour with the real engine and a real remote agent
is in test_broker_chat.py.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from core.broker.inbox import ChatInbox
from core.broker.inject import AUTO, DELAY, Inject, InjectBus
from core.chat.engine import SessionNotFoundError, TurnInProgressError
from tests.utils.broker import wait_for


class RecordingChat:
    """What the inbox uses of ChatEngine: turns that the test starts and ends, notes and announcements recorded."""

    def __init__(self) -> None:
        self.running: dict[str, asyncio.Event] = {}
        self.saved: list[tuple[str, list[dict]]] = []
        self.announced: list[str] = []
        self.fail_saves = 0
        self.busy_announcements = 0
        self.missing: set[str] = set()

    def is_running(self, session_id: str) -> bool:
        return session_id in self.running

    async def wait(self, session_id: str, timeout: float | None = None) -> None:
        event = self.running.get(session_id)
        if event is not None:
            await event.wait()

    def begin_turn(self, session_id: str) -> None:
        self.running[session_id] = asyncio.Event()

    def end_turn(self, session_id: str) -> None:
        self.running.pop(session_id).set()

    async def save_notes(self, session_id: str, notes: list[dict]) -> list:
        if session_id in self.missing:
            raise SessionNotFoundError("There is no such chat session.")
        if self.fail_saves:
            self.fail_saves -= 1
            raise OSError("database is locked")
        self.saved.append((session_id, notes))
        return [SimpleNamespace(**note) for note in notes]  # the rows saved

    async def start_announcement(self, session_id: str) -> None:
        if self.busy_announcements:
            self.busy_announcements -= 1
            raise TurnInProgressError("busy")
        self.announced.append(session_id)


def inject(task: str, mode: str, text: str, chat: str = "as_1", session: str | None = "as_1") -> Inject:
    return Inject(agent_id=1, chat_id=chat, text=text, mode=mode, task_id=task, session_id=session)


async def started(chat: RecordingChat) -> tuple[ChatInbox, InjectBus]:
    bus = InjectBus()
    inbox = ChatInbox(chat, bus)  # type: ignore[arg-type]
    await inbox.start()
    return inbox, bus


async def test_only_the_apps_own_tasks_are_taken_and_progress_is_saved_without_an_announcement() -> None:
    chat = RecordingChat()
    inbox, bus = await started(chat)
    bus.publish(inject("other", AUTO, "[X] not ours", session=None))  # an outside chat system's task
    bus.publish(inject("t1", DELAY, "[A] working"))
    await wait_for(lambda: inbox.delivered == 1)
    await asyncio.sleep(0.05)
    assert chat.saved == [("as_1", [{"content": "[A] working", "inject_mode": "delay", "a2a_task_id": "t1"}])]
    assert chat.announced == []
    await inbox.stop()


async def test_results_during_a_turn_wait_for_it_and_share_one_announcement() -> None:
    chat = RecordingChat()
    inbox, bus = await started(chat)
    chat.begin_turn("as_1")
    bus.publish(inject("t1", AUTO, "[A] done"))
    bus.publish(inject("t2", AUTO, "[B] done"))
    await asyncio.sleep(0.1)
    assert chat.saved == [] and chat.announced == []  # never in the middle of a turn
    chat.end_turn("as_1")
    await wait_for(lambda: chat.announced)
    assert [[n["content"] for n in notes] for _, notes in chat.saved] == [["[A] done", "[B] done"]]
    assert chat.announced == ["as_1"]
    await inbox.stop()


async def test_an_announcement_that_loses_the_race_to_a_user_turn_comes_after_it() -> None:
    chat = RecordingChat()
    chat.busy_announcements = 2
    inbox, bus = await started(chat)
    bus.publish(inject("t1", AUTO, "[A] done"))
    await wait_for(lambda: chat.announced == ["as_1"])
    assert inbox.announced == 1 and len(chat.saved) == 1
    await inbox.stop()


async def test_a_failing_save_is_retried_and_a_deleted_chat_is_dropped() -> None:
    chat = RecordingChat()
    chat.fail_saves = 2
    inbox, bus = await started(chat)
    chat.missing.add("as_gone")
    bus.publish(inject("t1", AUTO, "[A] done"))
    bus.publish(inject("t2", AUTO, "[B] done", chat="as_gone", session="as_gone"))
    await wait_for(lambda: chat.announced == ["as_1"], timeout=10)
    assert [s for s, _ in chat.saved] == ["as_1"] and inbox.delivered == 1
    await wait_for(lambda: not inbox._workers)  # nothing left looping for the deleted chat
    await inbox.stop()
