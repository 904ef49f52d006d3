"""AgentInvokePanel (seed 000 §3.3): the right drawer where delegated answers stream.

It opens by itself when the chat's stream says `a2a-task-started`, one tab per
task in the order they started; a task started by a callee (a nested
delegation) is a child tab, indented under its parent. Each tab shows the
callee's name, a status (waiting, generating, done, failed with the reason)
and the callee's markdown as it streams, read-only. The panel stays open after
the tasks end, until the user closes it.

Issue 14: the panel is fixed to the window with its own scroll area (its header and
tabs never leave the screen); below 900 px it is a full-width sheet with a way back
to the chat. Each tab shows the agent, a short form of the task's request and a
status icon; hovering shows the whole request (also the tab's `aria-label`, and the
first line of its panel). States are the words of `core.delegation.states`, the
same as the chat's cards, `/audit` and the API.

A task that asks back (`input-required`, `auth-required`, issue 36) shows its question with
an answer box (`ui.agent_question_box`); the answer goes into the same task.

Each running task is followed through its own hub subscription (`a2a_<taskId>`),
owned by the page's client; a task whose buffer is gone is shown from the
saved messages instead. Text is coalesced: the page's flush timer calls `flush`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from nicegui import Client, background_tasks, ui

from core.chat.artifacts import strip_blocks
from core.delegation import (
    COMPLETED,
    CONNECTION_LOST,
    TERMINAL_STATES,
    WORKING,
    DelegationService,
    TaskView,
    short_task_text,
    state_label,
    state_word,
    task_stream_key,
)
from core.delegation.notes import ANSWER_TEXT_ID, STATUS_TEXT_ID, layout
from core.delegation.questions import TaskNotWaitingError
from core.delegation.tasks import WAITING_STATES
from core.i18n import _
from core.streaming import events as ev
from core.streaming.backend import HubSubscription, StreamHubBackend
from core.streaming.hub import StreamEvent, SubscriberOverflowError, UnknownStreamError
from ui.agent_question_box import QuestionBox
from ui.chat_attachments import saved_artifacts, show_artifact
from ui.frame import DRAWER_BREAKPOINT_PX
from ui.streaming import StreamingMarkdown

# How each state word looks (the words themselves come from core.delegation.states).
STATUS_COLORS = {
    "submitted": "grey-7",
    "working": "primary",
    "completed": "positive",
    "failed": "negative",
    "canceled": "warning",
    "input-required": "orange-9",
    "auth-required": "orange-9",
}
STATUS_ICONS = {
    "submitted": "schedule",
    "working": "autorenew",
    "completed": "check_circle",
    "failed": "error",
    "canceled": "block",
    "input-required": "help",
    "auth-required": "lock",
}
PANEL_WIDTH_PX = 460


@dataclass(slots=True)
class TaskTab:
    """The widgets and state of one task's tab."""

    task_id: str
    callee_name: str
    parent_task_id: str | None
    depth: int
    tab: ui.tab
    status: ui.badge
    icon: ui.icon
    text: ui.label
    request: ui.label
    tooltip: ui.tooltip
    error: ui.label
    body: StreamingMarkdown
    state: str = "submitted"
    reason: str | None = None  # why it failed, when that has its own words (states.py: timeout, connection lost)
    follower: asyncio.Task[None] | None = None
    views: dict[str, StreamingMarkdown] = field(default_factory=dict)
    # A remote task's text pieces `(text part id, text)` once it sent a status message's text (`notes.layout`).
    pieces: list[tuple[str, str]] | None = None
    answered: bool = False  # whether one of those pieces is an artifact's text (then the status ones are notes)
    question: QuestionBox | None = None
    artifacts: ui.column | None = None  # the task's files and data (issue 36: ui/chat_attachments.py)


class AgentInvokePanel:
    """The side panel of one chat page; create it inside the page (it adds a right drawer).

    Over 300 lines on purpose: one tab per task, each following its task's stream and drawn from
    its events, and the tabs share one drawer, one selection and one clean-up on leaving the page.
    """

    def __init__(
        self,
        delegation: DelegationService,
        hub: StreamHubBackend,
        client: Client,
        user_id: int | None,
        on_stop: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.delegation = delegation
        self.hub = hub
        self.client = client
        self.user_id = user_id
        self.tabs_by_task: dict[str, TaskTab] = {}
        self.selected_task_id: str | None = None
        self.task_texts: dict[str, str] = {}  # tool call id → the request it delegates (from `tool-input-available`)
        self.state_listeners: list[Callable[[str, str], None]] = []
        with (
            ui.right_drawer(value=False, bottom_corner=True)
            .props(f"width={PANEL_WIDTH_PX} bordered breakpoint={DRAWER_BREAKPOINT_PX - 1}")
            .classes("panel-bg q-pa-none agent-invoke-drawer") as d
        ):
            self.drawer = d.mark("agent-invoke-panel").props("data-testid=agent-invoke-panel")
            with ui.column().classes("w-full gap-0 agent-invoke-head").props("data-testid=agent-invoke-head"):
                with ui.row().classes("w-full items-center justify-between q-px-sm q-pt-sm no-wrap"):
                    with ui.row().classes("items-center gap-1 no-wrap"):
                        ui.button(_("Chat"), icon="arrow_back", on_click=self.close).props(
                            "flat dense no-caps data-testid=agent-invoke-back "
                            "aria-label='" + _("Back to the chat") + "'"
                        ).classes("phone-only").mark("agent-invoke-back")
                        ui.label(_("Delegated tasks")).classes("text-subtitle1 text-weight-medium q-pl-sm")
                    # Its own Stop (issue 40): on a phone the panel covers the footer's.
                    self.stop_btn = (
                        ui.button(_("Stop"), icon="stop", on_click=on_stop)
                        .props("flat dense no-caps color=negative data-testid=agent-invoke-stop")
                        .props("aria-label='" + _("Stop the answer") + "'")
                        .classes("q-ml-auto q-mr-xs")
                        .mark("agent-invoke-stop")
                    )
                    self.stop_btn.set_visibility(False)
                    self.has_stop = on_stop is not None
                    self.close_btn = (
                        ui.button(icon="close", on_click=self.close)
                        .props(
                            "flat round dense aria-label='" + _("Close the panel") + "' data-testid=agent-invoke-close"
                        )
                        .mark("agent-invoke-close")
                    )
                self.tabs = ui.tabs(on_change=self._on_tab_change).props("dense align=left no-caps")
                self.tabs.classes("w-full text-grey-8 agent-invoke-tabs").props("data-testid=agent-invoke-tabs")
            with ui.element("div").classes("w-full agent-invoke-scroll").props("data-testid=agent-invoke-scroll"):
                self.panels = ui.tab_panels(self.tabs, animated=False).classes("w-full panel-bg")
        client.on_delete(self.stop_following)

    def note_tool_input(self, tool_call_id: Any, arguments: Any) -> None:
        """Remember what a delegating tool call asks, so its tab can show it when the task starts."""
        if isinstance(tool_call_id, str) and isinstance(arguments, dict):
            text = arguments.get("input") or arguments.get("task")
            if isinstance(text, str):
                self.task_texts[tool_call_id] = text

    # -- opening tasks -------------------------------------------------------------------

    async def task_started(self, started: ev.TaskStarted) -> None:
        """An `a2a-task-started` event: add (or show) that task's tab and open the panel."""
        task_id = started.task_id
        if task_id not in self.tabs_by_task:
            self._add_tab(
                task_id,
                started.callee_agent_name or started.callee_agent_slug or _("Agent"),
                started.parent_task_id,
                self.task_texts.get(started.tool_call_id),
            )
            self._follow_or_load(task_id)
        self._select_if_idle(task_id)
        self.open()

    async def restore(self, tasks: list[TaskView]) -> None:
        """After a reload: tabs for the session's running and recent tasks (those still buffered)."""
        recent = [t for t in tasks if t.live]
        for task in recent:
            if task.id not in self.tabs_by_task:
                self._add_tab(task.id, task.callee_agent_name, task.parent_task_id, task.input)
                self._follow_or_load(task.id, saved=task)
        if recent:
            running = next((t for t in recent if t.state not in TERMINAL_STATES), recent[0])
            self.select(running.id)
            self.open()

    async def show_task(self, task_id: str) -> None:
        """Open the panel on that task (a click on its card in the chat)."""
        if task_id not in self.tabs_by_task:
            detail = await self.delegation.task_detail(self.user_id or 0, task_id)
            if detail is None:
                ui.notify(_("That delegated task is not available."), color="warning")
                return
            self._add_tab(task_id, detail.task.callee_agent_name, detail.task.parent_task_id, detail.task.input)
            self._follow_or_load(task_id, saved=detail.task)
        self.select(task_id)
        self.open()

    def open(self) -> None:
        """Show the drawer."""
        self.drawer.show()

    def close(self) -> None:
        """Hide the drawer (tasks keep running; their tabs stay)."""
        self.drawer.hide()

    def show_running(self, running: bool) -> None:
        """The page's turn runs (or not): the panel's Stop shows while it does."""
        self.stop_btn.set_visibility(running and self.has_stop)

    def select(self, task_id: str) -> None:
        """Make that task's tab the visible one."""
        if task_id in self.tabs_by_task:
            self.selected_task_id = task_id
            self.tabs.set_value(_tab_name(task_id))

    def _on_tab_change(self, event: Any) -> None:
        value = event.value if isinstance(event.value, str) else getattr(event.value, "_props", {}).get("name", "")
        if value.startswith("task-"):
            self.selected_task_id = value.removeprefix("task-")

    def _select_if_idle(self, task_id: str) -> None:
        """Show a new task unless the one on screen is still streaming."""
        current = self.tabs_by_task.get(self.selected_task_id or "")
        if current is None or current.state in TERMINAL_STATES:
            self.select(task_id)

    def _add_tab(
        self, task_id: str, callee_name: str, parent_task_id: str | None, request: str | None = None
    ) -> TaskTab:
        parent = self.tabs_by_task.get(parent_task_id or "")
        depth = parent.depth + 1 if parent else 0
        word = state_word(None)
        # Children go right after their parent's subtree, so a nested delegation sits under its parent.
        with self.tabs:
            tab = (
                ui.tab(name=_tab_name(task_id), label="")
                .props(
                    f"no-caps data-testid=agent-invoke-tab data-task-id={task_id} "
                    f"data-parent-task-id={parent_task_id or ''} data-depth={depth} data-state={word}"
                )
                .mark("agent-invoke-tab")
            )
            with tab:
                with ui.row().classes("items-center gap-2 no-wrap"):
                    icon = ui.icon(STATUS_ICONS[word], color=STATUS_COLORS[word], size="xs").props(
                        f"data-testid=agent-invoke-tab-icon aria-label='{state_label(None)}'"
                    )
                    with ui.column().classes("gap-0 items-start min-w-0"):
                        ui.label(("↳ " * depth) + callee_name).classes("agent-invoke-tab-name").props(
                            "data-testid=agent-invoke-tab-name"
                        )
                        text = ui.label("").classes("agent-invoke-tab-text").props("data-testid=agent-invoke-tab-text")
                tooltip = ui.tooltip("").props("data-testid=agent-invoke-tab-tooltip max-width=360px")
        if parent is not None:
            order = list(self.tabs_by_task.values())
            subtree_end = max(
                (i for i, t in enumerate(order) if t.task_id == parent.task_id or self._descends(t, parent.task_id)),
                default=len(order) - 1,
            )
            tab.move(self.tabs, target_index=subtree_end + 1)
        with self.panels:
            with ui.tab_panel(tab).classes("q-pa-md panel-bg"):
                with ui.row().classes("items-center gap-2 no-wrap"):
                    ui.label(callee_name).classes("text-weight-medium").props("data-testid=agent-invoke-title")
                    status = (
                        ui.badge(state_label(None), color=STATUS_COLORS[word])
                        .props(f"data-testid=agent-invoke-status data-task-id={task_id}")
                        .mark("agent-invoke-status")
                    )
                request_label = (
                    ui.label("")
                    .classes("text-caption text-grey-7 whitespace-pre-wrap")
                    .props("data-testid=agent-invoke-request")
                )
                error = ui.label("").classes("text-negative text-caption").props("data-testid=agent-invoke-error")
                error.set_visibility(False)
                with (
                    ui.column()
                    .classes("w-full gap-0")
                    .props(f"data-testid=agent-invoke-body data-task-id={task_id}")
                    .mark("agent-invoke-body")
                ):
                    body = StreamingMarkdown()
                question = QuestionBox(task_id, lambda answer: self._answer(task_id, answer))
                files = ui.column().classes("w-full gap-2 q-mt-sm").props("data-testid=agent-panel-artifacts")
        entry = TaskTab(
            task_id, callee_name, parent_task_id, depth, tab, status, icon, text, request_label, tooltip, error, body
        )
        entry.question = question
        entry.artifacts = files
        self.tabs_by_task[task_id] = entry
        self._set_request(entry, request)
        if request is None:
            background_tasks.create(self._load_request(entry), name=f"task text {task_id}", context=self.client)
        return entry

    def _set_request(self, entry: TaskTab, request: str | None) -> None:
        if not request:
            return
        entry.text.set_text(short_task_text(request))
        entry.tooltip.set_text(request)
        entry.request.set_text(request)
        entry.tab.props(f'aria-label="{_attr(entry.callee_name + ": " + short_task_text(request, 200))}"')

    async def _load_request(self, entry: TaskTab) -> None:
        detail = await self.delegation.task_detail(self.user_id or 0, entry.task_id)
        if detail is not None and not self.client.is_deleted:
            self._set_request(entry, detail.task.input)

    def _descends(self, tab: TaskTab, ancestor_id: str) -> bool:
        parent_id = tab.parent_task_id
        while parent_id:
            if parent_id == ancestor_id:
                return True
            parent = self.tabs_by_task.get(parent_id)
            parent_id = parent.parent_task_id if parent else None
        return False

    # -- following -----------------------------------------------------------------------

    def _follow_or_load(self, task_id: str, saved: TaskView | None = None) -> None:
        entry = self.tabs_by_task[task_id]
        try:
            subscription = self.hub.subscribe(task_stream_key(task_id))
        except UnknownStreamError:
            entry.follower = background_tasks.create(
                self._load_saved(entry), name=f"load task {task_id}", context=self.client
            )
            return
        entry.follower = background_tasks.create(
            self._consume(entry, subscription), name=f"follow task {task_id}", context=self.client
        )

    async def _consume(self, entry: TaskTab, subscription: HubSubscription) -> None:
        try:
            async for event in subscription:
                if self.client.is_deleted:
                    break
                await self._apply(entry, event)
        except SubscriberOverflowError:
            await self._load_saved(entry)
        finally:
            subscription.close()
        if not self.client.is_deleted:
            entry.body.finalize()
            if entry.state not in TERMINAL_STATES:  # the buffer ended without its final state (should not happen)
                await self._load_saved(entry)
            if entry.state not in TERMINAL_STATES:  # and nothing saved says how it ended: its stream is lost
                entry.reason = CONNECTION_LOST
                self._set_state(entry, "failed")
                self._show_error(entry, _("The connection to this task's stream was lost."))

    async def _apply(self, entry: TaskTab, event: StreamEvent) -> None:
        try:
            typed = ev.from_stream(event.type, event.data)
        except ev.EventFormatError:
            return  # a kind the panel does not show (or a malformed event): the saved task tells the end
        match typed:
            case ev.TextDelta(id=part, delta=delta):
                if "```artifact-" in delta:  # a file or data block: shown by its `a2a-artifact` event
                    delta = strip_blocks(delta)
                first = not entry.body.text
                self._add_text(entry, part, delta)
                if first and entry.state == WORKING:  # 等待回复… becomes 生成中… with the first token
                    self._set_state(entry, entry.state)
            case ev.ToolInput():  # the callee delegating in turn: its child's request
                self.note_tool_input(typed.tool_call_id, typed.input)
            case ev.TaskState() | ev.TaskDone():
                self._set_state(entry, typed.state, typed.error)
                if entry.question is not None and isinstance(typed, ev.TaskState) and typed.state in WAITING_STATES:
                    entry.question.show(typed.state, typed.message or "")
                elif entry.question is not None:
                    entry.question.hide()
            case ev.Error(error_text=text, code=code):
                if code is not None:
                    entry.reason = code
                self._show_error(entry, text or _("The delegated agent failed."))
            case ev.TaskStarted():  # the callee delegated in turn: a child tab
                await self.task_started(typed)
            case ev.TaskArtifact() if entry.artifacts is not None:
                with entry.artifacts:
                    show_artifact(typed)

    def _add_text(self, entry: TaskTab, part: str, delta: str) -> None:
        """Show more text; a remote agent's progress notes go on their own lines once its answer comes.

        Appended as it comes, except where a status message's text turns out to be a note
        (`core/delegation/notes.py`): then the text is laid out again and drawn anew.
        """
        if entry.pieces is None:
            if part != STATUS_TEXT_ID:
                entry.body.append(delta)
                return
            entry.pieces = [(ANSWER_TEXT_ID, entry.body.text)] if entry.body.text else []
        entry.pieces.append((part, delta))
        if (part == STATUS_TEXT_ID) != entry.answered:  # more of the same: still appended
            entry.body.append(delta)
            return
        entry.answered = True
        text = layout(entry.pieces)
        if text.startswith(entry.body.text):
            entry.body.append(text[len(entry.body.text) :])
            return
        slot = entry.body.container.parent_slot  # the body's column (data-testid=agent-invoke-body)
        assert slot is not None, "the body was drawn in its column"
        entry.body.container.delete()
        with slot.parent:
            entry.body = StreamingMarkdown(text)

    async def _answer(self, task_id: str, answer: str) -> bool:
        """The answer box's Send: the answer into the task (only the task's owner's); False when it was not taken."""
        try:
            if await self.delegation.owned_task(self.user_id or 0, task_id) is None:
                raise TaskNotWaitingError(task_id)
            await self.delegation.questions.answer(task_id, answer)
        except TaskNotWaitingError:
            ui.notify(_("This task is not waiting for an answer any more."), color="warning")
            return False
        return True

    async def _load_saved(self, entry: TaskTab) -> None:
        detail = await self.delegation.task_detail(self.user_id or 0, entry.task_id)
        if detail is None or self.client.is_deleted:
            return
        saved = "".join(m.content for m in detail.messages if m.role == "assistant" and m.content)
        text = strip_blocks(saved)
        if entry.artifacts is not None and not list(entry.artifacts) and detail.task.state == COMPLETED:
            with entry.artifacts:  # no longer buffered (its `a2a-artifact` events gone): from what was saved
                for artifact in await saved_artifacts(self.delegation.db, entry.task_id, self.user_id or 0, saved):
                    show_artifact(artifact)
        if text != entry.body.text and not entry.body.finalized:
            entry.body.append(text[len(entry.body.text) :] if text.startswith(entry.body.text) else "")
        entry.body.finalize()
        self._set_state(entry, detail.task.state, detail.task.error)

    def _set_state(self, entry: TaskTab, state: str, error: Any = None) -> None:
        entry.state = state
        word = state_word(state)
        label = state_label(state, has_text=bool(entry.body.text), reason=entry.reason)
        entry.status.set_text(label)
        entry.status.props(f"color={STATUS_COLORS.get(word, 'grey-7')} data-reason={entry.reason or ''}")
        entry.icon.props(
            f"name={STATUS_ICONS.get(word, 'help')} color={STATUS_COLORS.get(word, 'grey-7')} aria-label='{label}'"
        )
        entry.tab.props(f"data-state={word}")
        if error and state != COMPLETED:
            self._show_error(entry, str(error))
        for listener in self.state_listeners:
            listener(entry.task_id, state)

    def _show_error(self, entry: TaskTab, message: str) -> None:
        entry.error.set_text(message)
        entry.error.set_visibility(True)

    def flush(self) -> None:
        """Render what streamed since the last tick (called by the page's timer)."""
        for entry in self.tabs_by_task.values():
            entry.body.flush()

    def stop_following(self) -> None:
        """Cancel the subscriptions (the page is gone; the tasks go on)."""
        for entry in self.tabs_by_task.values():
            if entry.follower is not None and not entry.follower.done():
                entry.follower.cancel()

    def reason_of(self, task_id: str) -> str | None:
        """Why a task shown here failed, when that has its own words (`timeout`, `connection_lost`)."""
        entry = self.tabs_by_task.get(task_id)
        return entry.reason if entry else None

    def state_of(self, task_id: str) -> str | None:
        """The last state seen for a task shown here."""
        entry = self.tabs_by_task.get(task_id)
        return entry.state if entry else None


def _tab_name(task_id: str) -> str:
    return f"task-{task_id}"


def _attr(text: str) -> str:
    return text.replace("&", "&amp;").replace('"', "&quot;")
