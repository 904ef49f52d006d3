"""The audit view (seed 000 §3.1.3): delegated tasks, which the session list never shows.

`/audit` lists the user's tasks (caller, callee, state, duration, tokens);
`/audit/{task_id}` shows one task read-only: what was asked, the callee's
answer, and its own nested delegations.
"""

from __future__ import annotations

from nicegui import ui

from core.delegation import TaskView, short_task_text, state_word
from core.services import Services
from ui.agent_invoke_panel import STATUS_COLORS
from ui.auth import current_user_id
from ui.frame import page_frame


def register_audit_pages(services: Services) -> None:
    """`/audit` and `/audit/{task_id}`."""

    @ui.page("/audit", title="Delegated tasks")
    async def audit_page() -> None:
        with page_frame(services, title="Delegated tasks", active="/audit"):
            await _audit_list(services)

    @ui.page("/audit/{task_id}", title="Delegated task")
    async def audit_task_page(task_id: str) -> None:
        with page_frame(services, title="Delegated task", active="/audit"):
            await _audit_task(services, task_id)


async def _audit_list(services: Services) -> None:
    tasks = await services.delegation.list_tasks(current_user_id(services) or 0)
    with ui.column().classes("w-full max-w-5xl mx-auto q-pa-md"):
        ui.label("Delegated tasks").classes("text-h5")
        ui.label("Every delegation of your chats, nested ones included, newest first. "
                 "These sessions are kept out of the chat list.").classes("text-grey-7")
        if not tasks:
            ui.label("No delegations yet: mention an agent in a chat (@coding-assistant …).").props(
                "data-testid=audit-empty")
            return
        with ui.element("div").classes("w-full table-scroll").props("data-testid=audit-table-box"), \
                ui.element("table").classes("w-full audit-table").props("data-testid=audit-table"):
            with ui.element("thead"), ui.element("tr"):
                for title in COLUMNS:
                    with ui.element("th").classes("text-left"):
                        ui.label(title)
            with ui.element("tbody"):
                for task in tasks:
                    _task_row(task)


async def _audit_task(services: Services, task_id: str) -> None:
    detail = await services.delegation.task_detail(current_user_id(services) or 0, task_id)
    with ui.column().classes("w-full max-w-3xl mx-auto q-pa-md"):
        ui.link("← All delegated tasks", "/audit")
        if detail is None:
            ui.label("There is no such task among your conversations.").classes("text-h6")
            return
        task = detail.task
        with ui.row().classes("items-center gap-2").props(f"data-testid=audit-task data-task-id={task.id}"):
            ui.label(f"{task.caller_agent_name or 'A remote caller'} → {task.callee_agent_name}").classes("text-h5")
            _state_badge(task)
        with ui.row().classes("gap-4 text-grey-8"):
            ui.label(f"Started {task.created_at:%Y-%m-%d %H:%M:%S} UTC")
            ui.label(f"Duration {_duration(task)}")
            ui.label(f"Tokens {task.input_tokens} in / {task.output_tokens} out")
            ui.label(f"Depth {task.recursion_depth}")
        if task.parent_task_id:
            ui.link("Parent task", f"/audit/{task.parent_task_id}").props("data-testid=audit-parent")
        elif task.caller_session_id:
            ui.link("Open the calling chat", f"/chat/{task.caller_session_id}")
        if task.error:
            ui.label(task.error).classes("text-negative")
        for message in detail.messages:
            who = "Request" if message.role == "user" else task.callee_agent_name
            with ui.card().classes("w-full").props(f"flat bordered data-testid=audit-message "
                                                   f"data-role={message.role} data-source={message.source}"):
                ui.label(who).classes("text-caption text-grey-7")
                ui.markdown(message.content or "*(no text)*").classes("w-full")
        if detail.children:
            ui.label("Nested delegations").classes("text-h6 q-mt-md")
            for child in detail.children:
                with ui.row().classes("items-center gap-2").props(
                        f"data-testid=audit-child data-task-id={child.id}"):
                    ui.link(f"{child.callee_agent_name}: {short_task_text(child.input, 80)}",
                            f"/audit/{child.id}")
                    _state_badge(child)


COLUMNS = ("Started", "Caller", "Callee", "Request", "State", "Duration", "Tokens in/out")


def _task_row(task: TaskView) -> None:
    word = state_word(task.state)
    with ui.element("tr").props(f"data-testid=audit-row data-task-id={task.id} data-state={word}"):
        cells = [
            f"{task.created_at:%Y-%m-%d %H:%M:%S}",
            task.caller_agent_name or "remote",
            ("↳ " * (task.recursion_depth - 1)) + task.callee_agent_name,
        ]
        for title, text in zip(COLUMNS[:3], cells, strict=True):
            with ui.element("td").props(f"data-label='{title}'"):
                ui.label(text)
        with ui.element("td").props("data-label=Request"):
            ui.link(short_task_text(task.input, 80), f"/audit/{task.id}")
        with ui.element("td").props("data-label=State"):
            _state_badge(task)
        for title, text in zip(COLUMNS[5:], (_duration(task), f"{task.input_tokens} / {task.output_tokens}"),
                               strict=True):
            with ui.element("td").props(f"data-label='{title}'"):
                ui.label(text)


def _state_badge(task: TaskView) -> None:
    word = state_word(task.state)
    ui.badge(word, color=STATUS_COLORS.get(word, "grey-7")).props("data-testid=audit-state")


def _duration(task: TaskView) -> str:
    return "running" if task.duration_ms is None else f"{task.duration_ms / 1000:.1f} s"
