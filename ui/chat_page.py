"""The chat page: session list, messages streaming in, input, agent picker, Stop.

`/` is a new, not yet saved chat (it is created on the first message);
`/chat/{session_id}` opens one. A running turn is followed through a hub
subscription owned by this page; the turn itself belongs to the chat engine,
so reloading or closing the page never stops it, and a reloaded page replays
the turn so far and then follows it live.

Issue 14: the page sits in the shared frame (`ui/frame.py`); the chat follows the
newest message while the reader is at the bottom (`assets/app.js`, with a "jump to
latest" button); a new chat shows a welcome with the agents and example prompts;
the left drawer renames, deletes (with undo) and searches chats; the browser tab
is titled after the chat; Esc stops a reply, or closes the side panel. The user's
text is shown as written: plain text with its line breaks, and only fenced code
blocks (```) rendered as code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from nicegui import Client, background_tasks, ui

from core.broker.tools import TOOL_NAME_PREFIX
from core.chat.engine import ChatError, SessionChange
from core.delegation import TaskView, is_terminal, short_task_text, state_word
from core.services import Services
from core.streaming.hub import StreamEvent, SubscriberOverflow, UnknownStream
from models import AgentMessage, AgentSession
from ui.agent_invoke_panel import STATUS_COLORS, AgentInvokePanel
from ui.agent_picker import AgentPicker
from ui.auth import current_user_id
from ui.frame import page_frame, testid
from ui.streaming import ChatMarkdown, StreamingMarkdown

FLUSH_INTERVAL_S = 0.08  # coalesces streamed chunks into at most ~12 renders per second
NEW_CHAT_TITLE = "New chat"
# Shown on a new chat's welcome; each runs with the offline demo model (core/chat/demo_model.py).
EXAMPLE_PROMPTS = (
    "Hello! What can you do?",
    "@coding-assistant write a function that greets",
    "@planner plan a launch party and ask @@coding-assistant for the invitation script",
)
_FENCED = re.compile(r"(^```[^\n]*\n.*?^```[ \t]*$)", re.MULTILINE | re.DOTALL)


def register_chat_pages(services: Services) -> None:
    """`/` (new chat) and `/chat/{session_id}`."""

    @ui.page("/", title=NEW_CHAT_TITLE)
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
        self._cards_by_task: dict[str, ToolCallCard] = {}
        self._bubble: ui.element | None = None
        self._typing: ui.element | None = None
        self._running = False
        self.agent_names: dict[str, str] = {}
        self.search_text = ""
        self._has_messages = False
        self._unwatch: Callable[[], None] | None = None
        client.on_delete(self._stop_following)
        client.on_delete(self._stop_watching)

    # -- layout ----------------------------------------------------------------------

    async def build(self) -> None:
        """Lay out the page and load the chat."""
        agents = await self.services.workspace.agents()
        self.agent_names = {a.slug: a.name for a in agents}
        view = None
        if self.session_id is not None:
            try:
                view = await self.services.workspace.open(self.user_id, self.session_id)
            except ChatError as exc:
                with page_frame(self.services, title="Chat not found", active="/"):
                    with ui.column().classes("absolute-center items-center"):
                        ui.label(exc.message).classes("text-h6")
                        ui.button("Start a new chat", on_click=lambda: ui.navigate.to("/"))
                return
            self.agent_slug = view.agent.slug
        elif self.agent_slug not in self.agent_names:
            default = await self.services.workspace.default_agent()
            self.agent_slug = default.slug if default else None

        title = view.session.title if view is not None else NEW_CHAT_TITLE
        with page_frame(self.services, title=title, active="/") as frame:
            with frame.drawer:
                testid(ui.button("New chat", icon="add", on_click=self._new_chat), "new-session-btn").classes(
                    "w-full")
                self.search = testid(
                    ui.input(placeholder="Search chats", on_change=self._on_search).props(
                        "dense outlined clearable debounce=250 aria-label='Search chats'"),
                    "session-search",
                ).classes("w-full q-mt-sm")
                with self.search.add_slot("prepend"):
                    ui.icon("search", size="xs")
                self.session_list = testid(ui.list().props("dense separator"), "session-list").classes("w-full mt-2")
            self.frame = frame
        await self._render_session_list()
        self.panel = AgentInvokePanel(self.services, self.client, self.user_id)
        self.panel.state_listeners.append(self._on_task_state)

        with ui.column().classes("w-full max-w-3xl mx-auto pb-4 chat-column") as column:
            self.messages = testid(column, "chat-messages").props("role=log aria-label=Messages")
            self.welcome = self._welcome(agents)
            if view is not None:
                for message in view.messages:
                    self._render_saved(message)
            self.welcome.set_visibility(not self._has_messages)

        with ui.page_sticky(position="bottom", y_offset=12):
            testid(ui.button("Jump to latest", icon="arrow_downward").props(
                "rounded unelevated color=primary size=sm no-caps aria-label='Jump to the latest message'"),
                "jump-latest").classes("jump-latest").on("click", js_handler="() => window.appChat.jumpToLatest()")

        with ui.footer().classes("border-t chat-footer").props("data-testid=chat-footer"):
            with ui.column().classes("w-full max-w-3xl mx-auto gap-1"):
                with ui.row().classes("w-full items-center gap-2 no-wrap"):
                    self.agent_picker = testid(
                        AgentPicker(agents, value=self.agent_slug, on_change=self._on_agent_change).props(
                            "dense outlined options-dense"),
                        "agent-picker",
                    ).classes("w-56 agent-picker")
                    self.generating = testid(ui.row().classes("items-center gap-1 text-grey-7 no-wrap"), "generating")
                    with self.generating:
                        ui.spinner(size="sm")
                        ui.label("Generating…")
                    self.generating.set_visibility(False)
                with ui.row().classes("w-full items-end gap-2 no-wrap"):
                    self.input = testid(
                        ui.textarea(placeholder="Message (Enter to send, Shift+Enter for a new line)")
                        .props("autogrow outlined dense rows=1 autofocus aria-label=Message maxlength="
                               f"{self.services.settings.max_message_chars}"),
                        "msg-input",
                    ).classes("flex-grow min-w-0")
                    self.input.on("keydown.enter.exact.prevent", self.send)
                    self.send_btn = testid(ui.button(icon="send", on_click=self.send), "send-btn").props(
                        "aria-label=Send")
                    self.stop_btn = testid(
                        ui.button(icon="stop", on_click=self.stop, color="negative"), "stop-btn"
                    ).props("aria-label=Stop")
        self._set_generating(False)
        ui.on("app-escape", self._on_escape)
        ui.timer(FLUSH_INTERVAL_S, self._flush)
        if view is not None:
            tasks = await self.services.delegation.tasks_of_session(self.user_id, self.session_id)
            self._show_task_states(tasks)
            await self.panel.restore(tasks)
        if view is not None and view.live_turn:
            self._follow(after=None)
        if self.session_id is not None:
            self._watch()

    def _welcome(self, agents: list) -> ui.element:
        """A new chat's first screen: the agents, what `@agent` and `/background` do, and example prompts."""
        with ui.column().classes("w-full gap-3 q-pa-md welcome-card").props("data-testid=welcome") as welcome:
            ui.label("Start a conversation").classes("text-h5")
            ui.label("Pick an agent below and write to it. Agents can hand part of the work to other agents: "
                     "their answers stream into the side panel.").classes("text-grey-8")
            with ui.column().classes("w-full gap-2").props("data-testid=welcome-agents"):
                for agent in agents:
                    with ui.row().classes("w-full items-start gap-2 no-wrap").props(
                            f"data-testid=welcome-agent data-agent={agent.slug}"):
                        ui.icon("smart_toy", size="sm").classes("text-primary q-mt-xs")
                        with ui.column().classes("gap-0 min-w-0"):
                            with ui.row().classes("items-baseline gap-2"):
                                ui.label(agent.name).classes("text-weight-medium")
                                ui.label(f"@{agent.slug}").classes("font-mono text-caption text-grey-7")
                            if agent.description:
                                ui.label(agent.description).classes("text-grey-8 text-body2")
            with ui.column().classes("gap-1 text-body2 text-grey-8").props("data-testid=welcome-help"):
                ui.markdown("**`@agent-id` …** hands that part of your message to another agent "
                            "(`@coding-assistant write a function`); the answer streams into the side panel.")
                ui.markdown("**`/background @agent-id` …** sends a task to an agent connected to the broker; "
                            "it keeps working while you chat, and its progress shows as notes.")
            ui.label("Try one:").classes("text-weight-medium")
            with ui.row().classes("w-full gap-2"):
                for prompt in EXAMPLE_PROMPTS:
                    ui.button(prompt, on_click=lambda p=prompt: self._try_example(p)).props(
                        "outline no-caps align=left data-testid=example-prompt").classes(
                        "text-left").mark("example-prompt")
        return welcome

    async def _try_example(self, prompt: str) -> None:
        self.input.value = prompt
        await self.send()

    async def _render_session_list(self) -> None:
        sessions = await self.services.workspace.sessions(self.user_id, self.search_text) if self.user_id else []
        self.session_list.clear()
        with self.session_list:
            if not sessions:
                ui.item_label("No chats match." if self.search_text else "No chats yet").props("caption").classes(
                    "q-pa-md").props("data-testid=session-list-empty")
            for row in sessions:
                self._session_item(row)
                if row.id == self.session_id:
                    ui.page_title(row.title)

    async def _on_search(self, event) -> None:
        self.search_text = (event.value or "").strip()
        await self._render_session_list()

    def _session_item(self, row: AgentSession) -> None:
        active = row.id == self.session_id
        item = ui.item(on_click=lambda r=row: ui.navigate.to(f"/chat/{r.id}")).props(
            f"clickable {'active' if active else ''} data-testid=session-item data-session-id={row.id}"
        ).mark("session-item")
        with item:
            with ui.item_section():
                ui.item_label(row.title).classes("ellipsis").props("data-testid=session-title")
                ui.item_label(row.updated_at.strftime("%Y-%m-%d %H:%M")).props("caption")
            with ui.item_section().props("side"):
                menu_btn = ui.button(icon="more_vert").props(
                    f"flat round dense size=sm aria-label='Chat actions: {_quote(row.title)}' "
                    "data-testid=session-menu-btn")
                # The menu is made when it is first opened: the list is re-rendered after every answer.
                menu_btn.on("click.stop", lambda b=menu_btn, r=row: self._session_menu(b, r))

    def _session_menu(self, button: ui.button, row: AgentSession) -> None:
        for child in list(button.default_slot.children):
            if isinstance(child, ui.menu):
                child.delete()
        with button, ui.menu() as menu:
            ui.menu_item("Rename", lambda: self._rename_dialog(row)).props("data-testid=session-rename")
            ui.menu_item("Delete", lambda: self._delete(row)).props("data-testid=session-delete")
        menu.open()

    def _rename_dialog(self, row: AgentSession) -> None:
        with ui.dialog() as dialog, ui.card().classes("w-80 max-w-full"):
            ui.label("Rename chat").classes("text-h6")
            name = testid(ui.input("Title", value=row.title).props("autofocus outlined dense"),
                          "session-rename-input").classes("w-full")

            async def save() -> None:
                try:
                    await self.services.workspace.rename(self.user_id, row.id, name.value or "")
                except ChatError as exc:
                    ui.notify(exc.message, color="negative")
                    return
                dialog.close()
                await self._render_session_list()

            name.on("keydown.enter", save)
            with ui.row().classes("w-full justify-end"):
                ui.button("Cancel", on_click=dialog.close).props("flat data-testid=session-rename-cancel")
                testid(ui.button("Save", on_click=save), "session-rename-save")
        dialog.open()

    def _delete(self, row: AgentSession) -> None:
        """Ask, then delete a chat (its running answer is stopped first)."""
        with ui.dialog() as dialog, ui.card().classes("w-80 max-w-full").props("data-testid=session-delete-dialog"):
            ui.label("Delete this chat?").classes("text-h6")
            ui.label(row.title).classes("text-grey-8 ellipsis w-full")

            async def confirm() -> None:
                dialog.close()
                if not await self.services.workspace.delete(self.user_id, row.id):
                    ui.notify("That chat is already gone.", color="warning")
                if row.id == self.session_id:
                    ui.navigate.to("/")
                    return
                await self._render_session_list()

            with ui.row().classes("w-full justify-end"):
                ui.button("Cancel", on_click=dialog.close).props("flat data-testid=session-delete-cancel")
                testid(ui.button("Delete", on_click=confirm, color="negative"), "session-delete-confirm")
        dialog.open()

    # -- messages --------------------------------------------------------------------

    def _render_saved(self, message: AgentMessage) -> None:
        self._has_messages = True
        if hasattr(self, "welcome"):
            self.welcome.set_visibility(False)
        with self.messages:
            if message.role == "user":
                with ui.chat_message(name="You", sent=True).classes("w-full").props("data-testid=user-message"):
                    user_text(message.content)
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
                    card = ToolCallCard(call["name"], _parse_json(call.get("arguments")), self.agent_names,
                                        self.panel.show_task)
                    self._tool_cards[call["id"]] = card
                    result = results.get(call["id"])
                    if result is not None:
                        metadata = result.get("metadata") or {}
                        card.finish(result.get("output"), metadata, bool(result.get("isError")))
                        if isinstance(metadata.get("taskId"), str):
                            self._link_card(card, metadata["taskId"])
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
        return self.agent_names.get(self.agent_slug or "", self.agent_slug or "Agent")

    def _link_card(self, card: ToolCallCard, task_id: str) -> None:
        card.link_task(task_id)
        self._cards_by_task[task_id] = card
        state = self.panel.state_of(task_id)
        if state is not None:
            card.show_state(state)

    def _show_task_states(self, tasks: list[TaskView]) -> None:
        """After a load: each delegation card says its task's saved state (found by its tool call)."""
        for task in tasks:
            card = self._cards_by_task.get(task.id) or self._tool_cards.get(task.tool_call_id or "")
            if card is not None:
                if card.task_id is None:
                    self._link_card(card, task.id)
                card.show_state(task.state, task.duration_ms)

    def _on_task_state(self, task_id: str, state: str) -> None:
        card = self._cards_by_task.get(task_id)
        if card is not None:
            card.show_state(state)

    # -- sending and following ---------------------------------------------------------

    async def send(self) -> None:
        """Send the input as a message and follow the answer."""
        text = self.input.value or ""
        is_new = self.session_id is None
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
        if is_new:  # the new chat joins the list now; an existing one moves up when its answer ends
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
            self._views, self._tool_cards = {}, dict(self._tool_cards)
            with self.messages:
                self._bubble = ui.chat_message(name=self._agent_name()).classes("w-full").props(
                    "data-testid=assistant-message aria-live=polite aria-busy=true"
                )
            with self._bubble:
                self._typing = testid(ui.spinner("dots", size="md").classes("typing-indicator").props(
                    "aria-label='The agent is writing'"), "typing-indicator")
            return
        if self._bubble is None:
            return  # joined mid-way without the start (should not happen: replay begins at the turn's start)
        if event.type in {"text-delta", "tool-input-available", "error", "finish"}:
            self._hide_typing()
        if event.type == "text-delta":
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
            self.panel.note_tool_input(data.get("toolCallId"), data.get("input"))
            with self._bubble:
                self._tool_cards[data["toolCallId"]] = ToolCallCard(
                    data.get("toolName", "tool"), data.get("input"), self.agent_names, self.panel.show_task)
        elif event.type == "a2a-task-started":
            card = self._tool_cards.get(data.get("toolCallId"))
            if card is not None and isinstance(data.get("taskId"), str):
                card.set_callee(data.get("calleeAgentName"))
                self._link_card(card, data["taskId"])
            await self.panel.task_started(data)
        elif event.type == "tool-output-available":
            card = self._tool_cards.get(data.get("toolCallId"))
            if card is not None:
                card.finish(data.get("output"), data.get("metadata") or {}, bool(data.get("isError")))
                if card.task_id is not None and self.panel.state_of(card.task_id):
                    card.show_state(self.panel.state_of(card.task_id) or "")
        elif event.type == "error":
            self._flush()
            with self._bubble:
                ui.label(data.get("errorText", "Something went wrong.")).classes("text-negative text-caption").props(
                    "data-testid=turn-error role=alert"
                )
                ui.notify(data.get("errorText", "Something went wrong."), color="negative")
        elif event.type == "finish":
            self._flush()
            self._bubble.props("aria-busy=false")
            if data.get("finishReason") == "canceled":
                with self._bubble:
                    ui.label("Stopped.").classes("text-grey-7 text-caption")

    def _hide_typing(self) -> None:
        if self._typing is not None:
            self._typing.delete()
            self._typing = None

    def _set_generating(self, running: bool) -> None:
        self._running = running
        self.generating.set_visibility(running)
        self.stop_btn.set_visibility(running)
        self.send_btn.set_enabled(not running)
        if not running:
            self._hide_typing()

    async def _on_escape(self) -> None:
        """Esc stops a running reply; with nothing running it closes the side panel."""
        if self._running:
            await self.stop()
        elif self.panel.drawer.value:
            self.panel.close()

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
            return
        # A chat keeps the agent it started with: another agent means a new chat, so ask first.
        with ui.dialog() as dialog, ui.card().classes("w-96 max-w-full").props("data-testid=agent-change-dialog"):
            ui.label(f"Start a new chat with {self.agent_names.get(slug, slug)}?").classes("text-h6")
            ui.label(f"This chat stays with {self._agent_name()}; it is kept in the list.").classes("text-grey-8")
            with ui.row().classes("w-full justify-end"):
                testid(ui.button("Stay here", on_click=lambda: dialog.submit(False)).props("flat"),
                       "agent-change-cancel")
                testid(ui.button("New chat", on_click=lambda: dialog.submit(True)), "agent-change-confirm")
        confirmed = await dialog
        dialog.delete()
        if confirmed:
            ui.navigate.to(f"/?agent={slug}")
        else:
            self.agent_picker.set_value(self.agent_slug)


class ToolCallCard:
    """A compact card for one tool call inside an assistant message.

    For a delegation it names the callee (display name) and the short request, and says the task's
    state in the same word as the side panel, `/audit` and the API; other tools say running/done/failed.
    A delegation card is a button (click, Enter or Space) that opens its task in the side panel.
    """

    def __init__(self, tool_name: str, arguments: Any, agent_names: dict[str, str],
                 open_task: Callable[[str], Awaitable[None]]) -> None:
        self.task_id: str | None = None
        self._open_task = open_task
        self._state: str | None = None
        args = arguments if isinstance(arguments, dict) else {}
        target = args.get("agentSlug")
        self.is_delegation = bool(target) and tool_name == "agent_invoke"
        self.background = tool_name.startswith(TOOL_NAME_PREFIX)  # a broker agent's tool (core/broker/tools.py)
        request = args.get("input") if self.is_delegation else args.get("task") if self.background else None
        if self.is_delegation:
            callee = agent_names.get(str(target), str(target))
            title, icon = f"Delegated to {callee}", "call_split"
        elif self.background:
            callee = tool_name.removeprefix(TOOL_NAME_PREFIX)
            title, icon = f"Sent to {agent_names.get(callee, callee)} in the background", "schedule_send"
        else:
            title, icon = tool_name, "build"
        with ui.card().tight().classes("w-full q-my-xs tool-call-card").props(
                "flat bordered data-testid=tool-call") as self.card:
            with ui.row().classes("items-center gap-2 q-pa-sm no-wrap w-full"):
                ui.icon(icon, size="xs").classes("text-grey-7")
                with ui.column().classes("gap-0 min-w-0 col"):
                    self.title = ui.label(title).classes("text-weight-medium").props("data-testid=tool-call-title")
                    if isinstance(request, str) and request:
                        ui.label(short_task_text(request, 80)).classes("text-caption text-grey-7 ellipsis").props(
                            "data-testid=tool-call-request")
                self.status = ui.label("submitted" if self.is_delegation else "running…").classes(
                    "text-grey-7 text-caption").props("data-testid=tool-call-status")
                self.took = ui.label("").classes("text-grey-7 text-caption").props("data-testid=tool-call-duration")
            self.detail = ui.label("").classes("text-caption q-px-sm q-pb-sm text-grey-8")
            self.detail.set_visibility(False)
        # Listeners are set once, here: adding them after the card is shown makes the browser re-render it.
        self.card.on("click", self._open)
        self.card.on("keydown.enter", self._open)
        self.card.on("keydown.space.prevent", self._open)

    async def _open(self) -> None:
        if self.task_id is not None:
            await self._open_task(self.task_id)

    def set_callee(self, name: Any) -> None:
        """The callee's display name, from the task's announcement."""
        if isinstance(name, str) and name and self.is_delegation:
            self.title.set_text(f"Delegated to {name}")

    def finish(self, output: Any, metadata: dict[str, Any], is_error: bool) -> None:
        """Show the call's outcome (a delegation's task state, once known, takes precedence)."""
        duration = metadata.get("durationMs")
        if isinstance(duration, int | float):
            self.took.set_text(f"{duration / 1000:.1f} s")
        if is_error:
            message = output.get("error") if isinstance(output, dict) else str(output)
            self.detail.set_text(str(message))
            self.detail.set_visibility(True)
        if self._state is None:
            if self.background and not is_error:
                self.status.set_text("started; the result will follow")
            elif self.is_delegation and not is_error:
                self.show_state("completed")
            elif self.is_delegation:
                self.show_state("failed")
            else:
                self.status.set_text("failed" if is_error else "done")
                if is_error:
                    self.status.classes(replace="text-negative text-caption")
        name = metadata.get("calleeAgentName")
        if isinstance(name, str) and name:
            self.title.set_text(f"Sent to {name} in the background" if metadata.get("background")
                                else f"Delegated to {name}")

    def show_state(self, state: str, duration_ms: int | None = None) -> None:
        """The task's state, in the shared vocabulary."""
        if self.background and not is_terminal(state):
            return  # "started; the result will follow" says more than "working" for a background task
        word = state_word(state)
        self._state = state
        self.status.set_text(word)
        self.status.classes(replace=f"text-caption text-{STATUS_COLORS.get(word, 'grey-7')}")
        self.card.props(f"data-state={word}")
        if duration_ms is not None:
            self.took.set_text(f"{duration_ms / 1000:.1f} s")

    def link_task(self, task_id: str) -> None:
        """Clicking the card (or Enter on it) opens that task in the side panel."""
        self.task_id = task_id
        self.card.props(f"data-task-id={task_id} tabindex=0 role=button "
                        "aria-label='Open this task in the side panel'").classes("cursor-pointer")


def user_text(text: str) -> None:
    """The user's message as written: plain text with its line breaks; fenced code blocks as code."""
    with ui.column().classes("w-full gap-1 user-text-block").props("data-testid=user-text"):
        for i, part in enumerate(_FENCED.split(text)):
            if i % 2:
                ChatMarkdown(part).classes("w-full")
            elif part.strip("\n"):
                ui.label(part.strip("\n")).classes("user-text")


def _quote(text: str) -> str:
    return text.replace("'", "’").replace('"', "”")


def _parse_json(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value
