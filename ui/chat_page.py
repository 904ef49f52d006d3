"""The chat page: session list, messages streaming in, input, agent picker, Stop.

`/` is a new, not yet saved chat (it is created on the first message);
`/chat/{session_id}` opens one. A running turn is followed through a hub
subscription owned by this page; the turn itself belongs to the chat engine,
so reloading or closing the page never stops it, and a reloaded page replays
the turn so far and then follows it live.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from nicegui import Client, background_tasks, ui

from core.broker.tools import TOOL_NAME_PREFIX
from core.chat.engine import ChatError, SessionChange
from core.services import Services
from core.streaming.hub import StreamEvent, SubscriberOverflow, UnknownStream
from models import AgentMessage, AgentSession
from ui.agent_invoke_panel import AgentInvokePanel
from ui.agent_picker import AgentPicker
from ui.auth import current_user_id
from ui.streaming import StreamingMarkdown

FLUSH_INTERVAL_S = 0.08  # coalesces streamed chunks into at most ~12 renders per second


def testid(element: ui.element, name: str) -> ui.element:
    """Give an element both a server-side marker (User tests) and a DOM test id (Playwright)."""
    return element.mark(name).props(f"data-testid={name}")


def register_chat_pages(services: Services) -> None:
    """`/` (new chat) and `/chat/{session_id}`."""

    @ui.page("/", title="Chat")
    async def new_chat_page(client: Client, agent: str | None = None) -> None:
        await ChatPage(services, client, session_id=None, agent_slug=agent).build()

    @ui.page("/chat/{session_id}", title="Chat")
    async def chat_page(client: Client, session_id: str) -> None:
        await ChatPage(services, client, session_id=session_id).build()


class ChatPage:
    """One browser tab's chat screen and its live subscription."""

    def __init__(self, services: Services, client: Client, *, session_id: str | None,
                 agent_slug: str | None = None) -> None:
        self.services = services
        self.client = client
        self.session_id = session_id
        self.agent_slug = agent_slug
        self.user_id = current_user_id(services)
        self._follow_task: asyncio.Task | None = None
        self._views: dict[str, StreamingMarkdown] = {}
        self._tool_cards: dict[str, ToolCallCard] = {}
        self._bubble: ui.element | None = None
        self._has_messages = False
        self._unwatch: Callable[[], None] | None = None
        client.on_delete(self._stop_following)
        client.on_delete(self._stop_watching)

    # -- layout ----------------------------------------------------------------------

    async def build(self) -> None:
        """Lay out the page and load the chat."""
        agents = await self.services.workspace.agents()
        view = None
        if self.session_id is not None:
            try:
                view = await self.services.workspace.open(self.user_id, self.session_id)
            except ChatError as exc:
                with ui.column().classes("absolute-center items-center"):
                    ui.label(exc.message).classes("text-h6")
                    ui.button("Start a new chat", on_click=lambda: ui.navigate.to("/"))
                return
            self.agent_slug = view.agent.slug
        elif self.agent_slug not in {a.slug for a in agents}:
            default = await self.services.workspace.default_agent()
            self.agent_slug = default.slug if default else None

        with ui.header().classes("items-center justify-between bg-primary"):
            with ui.row().classes("items-center gap-2"):
                ui.button(icon="menu", on_click=lambda: drawer.toggle()).props("flat round color=white")
                ui.label("A2A Delegation Chat").classes("text-h6")
            with ui.row().classes("items-center gap-2"):
                ui.link("Agents", "/agents").classes("text-white no-underline").props("data-testid=agents-link")
                ui.button("Audit", icon="fact_check", on_click=lambda: ui.navigate.to("/audit")).props(
                    "flat color=white data-testid=audit-link")
                with ui.button(icon="more_vert").props("flat round color=white aria-label=More"):
                    with ui.menu():
                        ui.menu_item("A2A broker", lambda: ui.navigate.to("/broker"))
                        ui.menu_item("Remote agents", lambda: ui.navigate.to("/remote-agents"))
                        ui.menu_item("API keys", lambda: ui.navigate.to("/api-keys"))
                if self.services.auth.multi_user:
                    ui.button("Log out", on_click=lambda: ui.navigate.to("/logout")).props("flat color=white")

        with ui.left_drawer(value=True).classes("bg-grey-1") as drawer:
            testid(ui.button("New chat", icon="add", on_click=self._new_chat), "new-session-btn").classes("w-full")
            self.session_list = testid(ui.list().props("dense separator"), "session-list").classes("w-full mt-2")
        await self._render_session_list()
        self.panel = AgentInvokePanel(self.services, self.client, self.user_id)

        with ui.column().classes("w-full max-w-3xl mx-auto pb-4") as column:
            self.messages = testid(column, "chat-messages")
            if view is not None:
                for message in view.messages:
                    self._render_saved(message)

        with ui.footer().classes("bg-white text-black border-t"):
            with ui.column().classes("w-full max-w-3xl mx-auto gap-1"):
                with ui.row().classes("w-full items-center gap-2"):
                    self.agent_picker = testid(
                        AgentPicker(agents, value=self.agent_slug, on_change=self._on_agent_change).props(
                            "dense outlined options-dense"),
                        "agent-picker",
                    ).classes("w-56")
                    self.generating = testid(ui.row().classes("items-center gap-1 text-grey-7"), "generating")
                    with self.generating:
                        ui.spinner(size="sm")
                        ui.label("Generating…")
                    self.generating.set_visibility(False)
                with ui.row().classes("w-full items-end gap-2 no-wrap"):
                    self.input = testid(
                        ui.textarea(placeholder="Message (Enter to send, Shift+Enter for a new line)")
                        .props("autogrow outlined dense rows=1 maxlength="
                               f"{self.services.settings.max_message_chars}"),
                        "msg-input",
                    ).classes("flex-grow")
                    self.input.on("keydown.enter.exact.prevent", self.send)
                    self.send_btn = testid(ui.button(icon="send", on_click=self.send), "send-btn").props(
                        "aria-label=Send")
                    self.stop_btn = testid(
                        ui.button(icon="stop", on_click=self.stop, color="negative"), "stop-btn"
                    ).props("aria-label=Stop")
        self._set_generating(False)
        ui.timer(FLUSH_INTERVAL_S, self._flush)
        if view is not None:
            await self.panel.restore(await self.services.delegation.tasks_of_session(self.user_id, self.session_id))
        if view is not None and view.live_turn:
            self._follow(after=None)
        if self.session_id is not None:
            self._watch()

    async def _render_session_list(self) -> None:
        sessions = await self.services.workspace.sessions(self.user_id) if self.user_id else []
        self.session_list.clear()
        with self.session_list:
            if not sessions:
                ui.item_label("No chats yet").props("caption").classes("q-pa-md")
            for row in sessions:
                self._session_item(row)

    def _session_item(self, row: AgentSession) -> None:
        active = row.id == self.session_id
        item = ui.item(on_click=lambda r=row: ui.navigate.to(f"/chat/{r.id}")).props(
            f"clickable {'active' if active else ''} data-testid=session-item data-session-id={row.id}"
        ).mark("session-item")
        with item, ui.item_section():
            ui.item_label(row.title)
            ui.item_label(row.updated_at.strftime("%Y-%m-%d %H:%M")).props("caption")

    # -- messages --------------------------------------------------------------------

    def _render_saved(self, message: AgentMessage) -> None:
        self._has_messages = True
        with self.messages:
            if message.role == "user":
                with ui.chat_message(name="You", sent=True).classes("w-full").props("data-testid=user-message"):
                    ui.markdown(message.content)
                return
            if message.role == "system" and message.inject_mode:
                self._render_note(message)
                return
            if message.role != "assistant":
                return
            with ui.chat_message(name=self._agent_name()).classes("w-full").props(
                "data-testid=assistant-message"
            ):
                if message.content:
                    ui.markdown(message.content).classes("w-full")
                results = {r.get("toolCallId"): r for r in message.tool_results or []}
                for call in message.tool_calls or []:
                    card = ToolCallCard(call["name"], _parse_json(call.get("arguments")))
                    result = results.get(call["id"])
                    if result is not None:
                        metadata = result.get("metadata") or {}
                        card.finish(result.get("output"), metadata, bool(result.get("isError")))
                        if isinstance(metadata.get("taskId"), str):
                            card.link_task(metadata["taskId"], self.panel.show_task)
                if message.status == "canceled":
                    ui.label("Stopped.").classes("text-grey-7 text-caption")
                elif message.status == "interrupted":
                    ui.label("Interrupted by a server restart.").classes("text-grey-7 text-caption").props(
                        "data-testid=turn-interrupted").mark("turn-interrupted")
                elif message.status == "error" and message.error:
                    ui.label(message.error).classes("text-negative text-caption").props("data-testid=turn-error")

    def _render_note(self, message: AgentMessage) -> None:
        """A background task's inject: a quiet line in the chat; a click opens the task in the side panel."""
        icon = "check_circle" if message.inject_mode == "auto" else "more_horiz"
        with ui.row().classes("w-full items-start gap-2 no-wrap text-grey-7 text-caption q-px-md").props(
            f"data-testid=inject-note data-mode={message.inject_mode}"
        ) as note:
            ui.icon(icon, size="xs")
            ui.label(message.content).classes("whitespace-pre-wrap").props("data-testid=inject-note-text")
        note.mark("inject-note")
        if message.a2a_task_id:
            task_id = message.a2a_task_id
            note.classes("cursor-pointer").on("click", lambda: self.panel.show_task(task_id))

    def _agent_name(self) -> str:
        options = self.agent_picker.options if hasattr(self, "agent_picker") else {}
        return options.get(self.agent_slug, self.agent_slug or "Agent") if isinstance(options, dict) else "Agent"

    # -- sending and following ---------------------------------------------------------

    async def send(self) -> None:
        """Send the input as a message and follow the answer."""
        text = self.input.value or ""
        try:
            text = self.services.chat.validate_text(text)
            if self.session_id is None:
                created = await self.services.workspace.create(self.user_id, self.agent_slug or "")
                self.session_id = created.id
                ui.navigate.history.replace(f"/chat/{created.id}")
                self._watch()
            # The watcher shows the saved message and follows the answer, as for a turn started elsewhere.
            await self.services.chat.start_turn(session_id=self.session_id, user_id=self.user_id, text=text)
        except ChatError as exc:
            ui.notify(exc.message, color="negative")
            return
        self.input.value = ""
        await self._render_session_list()

    async def stop(self) -> None:
        """Stop the running answer (it keeps what it said)."""
        if self.session_id and not await self.services.chat.cancel(self.session_id):
            self._set_generating(False)

    def _follow(self, after: int | None) -> None:
        self._stop_following()
        try:
            subscription = self.services.hub.subscribe(self.session_id, after=after)
        except UnknownStream:
            return
        self._set_generating(True)
        self._follow_task = background_tasks.create(
            self._consume(subscription), name=f"follow {self.session_id}", context=self.client
        )

    def _watch(self) -> None:
        """Show the session's turns and notes as they start or are saved, whoever started them."""
        self._stop_watching()
        self._unwatch = self.services.chat.watch(self.session_id, self._on_session_change)

    def _stop_watching(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None

    def _on_session_change(self, change: SessionChange) -> None:
        if self.client.is_deleted:
            return
        # Called from the engine's task: build elements in a task of this page's client.
        background_tasks.create(self._show_change(change), name=f"change {change.session_id}", context=self.client)

    async def _show_change(self, change: SessionChange) -> None:
        for message in change.messages:
            self._render_saved(message)
        if change.turn is not None:
            self._follow(after=change.turn.after_event_id)

    def _stop_following(self) -> None:
        if self._follow_task is not None and not self._follow_task.done():
            self._follow_task.cancel()
        self._follow_task = None

    async def _consume(self, subscription) -> None:
        try:
            async for event in subscription:
                if self.client.is_deleted:
                    break
                await self._apply(event)
        except SubscriberOverflow:
            # Fell behind (a very fast stream and a slow browser): the saved answer has it all.
            with self.messages:
                ui.notify("The page fell behind the stream; reload to see the full answer.", color="warning")
        finally:
            subscription.close()
            # A follower that was replaced (or whose page is gone) leaves the page alone.
            if self._follow_task is asyncio.current_task() and not self.client.is_deleted:
                for view in self._views.values():
                    view.finalize()
                self._views = {}
                self._set_generating(False)
                with contextlib.suppress(Exception):
                    await self._render_session_list()

    def _flush(self) -> None:
        for view in self._views.values():
            view.flush()
        self.panel.flush()

    async def _apply(self, event: StreamEvent) -> None:
        data = event.data
        if event.type == "start":
            self._views, self._tool_cards = {}, {}
            with self.messages:
                self._bubble = ui.chat_message(name=self._agent_name()).classes("w-full").props(
                    "data-testid=assistant-message"
                )
        elif self._bubble is None:
            return  # joined mid-way without the start (should not happen: replay begins at the turn's start)
        elif event.type == "text-delta":
            text_id = data.get("id", "text")
            view = self._views.get(text_id)
            if view is None:
                with self._bubble:
                    view = StreamingMarkdown()
                    view.container.props("data-testid=assistant-text")
                self._views[text_id] = view
            view.append(data.get("delta", ""))
        elif event.type == "tool-input-available":
            self._flush()
            with self._bubble:
                self._tool_cards[data["toolCallId"]] = ToolCallCard(data.get("toolName", "tool"), data.get("input"))
        elif event.type == "a2a-task-started":
            card = self._tool_cards.get(data.get("toolCallId"))
            if card is not None and isinstance(data.get("taskId"), str):
                card.link_task(data["taskId"], self.panel.show_task)
            await self.panel.task_started(data)
        elif event.type == "tool-output-available":
            card = self._tool_cards.get(data.get("toolCallId"))
            if card is not None:
                card.finish(data.get("output"), data.get("metadata") or {}, bool(data.get("isError")))
        elif event.type == "error":
            self._flush()
            with self._bubble:
                ui.label(data.get("errorText", "Something went wrong.")).classes("text-negative text-caption").props(
                    "data-testid=turn-error"
                )
                ui.notify(data.get("errorText", "Something went wrong."), color="negative")
        elif event.type == "finish":
            self._flush()
            if data.get("finishReason") == "canceled":
                with self._bubble:
                    ui.label("Stopped.").classes("text-grey-7 text-caption")

    def _set_generating(self, running: bool) -> None:
        self.generating.set_visibility(running)
        self.stop_btn.set_visibility(running)
        self.send_btn.set_enabled(not running)

    # -- navigation --------------------------------------------------------------------

    def _new_chat(self) -> None:
        ui.navigate.to(f"/?agent={self.agent_slug}" if self.agent_slug else "/")

    async def _on_agent_change(self, event) -> None:
        slug = event.value
        if slug == self.agent_slug:
            return
        if self.session_id is None:
            self.agent_slug = slug
            return
        try:
            changed = await self.services.workspace.change_agent(self.user_id, self.session_id, slug)
        except ChatError as exc:
            ui.notify(exc.message, color="negative")
            return
        if changed:
            self.agent_slug = slug
        else:
            # A chat keeps the agent it started with: another agent means a new chat.
            ui.navigate.to(f"/?agent={slug}")


class ToolCallCard:
    """A compact card for one tool call inside an assistant message: name, target, status, duration."""

    def __init__(self, tool_name: str, arguments: Any) -> None:
        target = arguments.get("agentSlug") if isinstance(arguments, dict) else None
        title = f"Delegated to {target}" if target and tool_name == "agent_invoke" else tool_name
        icon = "call_split" if target else "build"
        if tool_name.startswith(TOOL_NAME_PREFIX):  # a broker agent's tool (core/broker/tools.py)
            title, icon = f"Sent to {tool_name.removeprefix(TOOL_NAME_PREFIX)} in the background", "schedule_send"
        with ui.card().tight().classes("w-full q-my-xs").props("flat bordered data-testid=tool-call") as self.card:
            with ui.row().classes("items-center gap-2 q-pa-sm no-wrap"):
                ui.icon(icon, size="xs").classes("text-grey-7")
                self.title = ui.label(title).classes("text-weight-medium")
                self.status = ui.label("running…").classes("text-grey-7 text-caption").props(
                    "data-testid=tool-call-status"
                )
            self.detail = ui.label("").classes("text-caption q-px-sm q-pb-sm text-grey-8")
            self.detail.set_visibility(False)

    def finish(self, output: Any, metadata: dict[str, Any], is_error: bool) -> None:
        """Show the call's outcome."""
        duration = metadata.get("durationMs")
        took = f" in {duration / 1000:.1f} s" if isinstance(duration, int | float) else ""
        if is_error:
            self.status.set_text(f"failed{took}")
            self.status.classes(replace="text-negative text-caption")
            message = output.get("error") if isinstance(output, dict) else str(output)
            self.detail.set_text(str(message))
            self.detail.set_visibility(True)
        else:
            self.status.set_text("started; the result will follow" if metadata.get("background") else f"done{took}")
        name = metadata.get("calleeAgentName")
        if isinstance(name, str) and name:
            self.title.set_text(f"Sent to {name} in the background" if metadata.get("background")
                                else f"Delegated to {name}")

    def link_task(self, task_id: str, open_task: Callable[[str], Awaitable[None]]) -> None:
        """Clicking the card opens that task in the side panel."""
        self.card.props(f"data-task-id={task_id}").classes("cursor-pointer")
        self.card.on("click", lambda: open_task(task_id))


def _parse_json(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value
