"""The audit view (seed 000 §3.1.3): delegated tasks, which the session list never shows.

`/audit` lists the user's tasks (caller, callee, state, duration, tokens);
`/audit/{task_id}` shows one task read-only: what was asked, the callee's
answer, and its own nested delegations.
"""

from __future__ import annotations

from nicegui import ui

from core.delegation import TaskView
from core.services import Services
from ui.agent_invoke_panel import STATUS_COLORS, STATUS_LABELS
from ui.auth import current_user_id


def register_audit_pages(services: Services) -> None:
    """`/audit` and `/audit/{task_id}`."""

    @ui.page("/audit", title="Delegated tasks")
    async def audit_page() -> None:
        _header()
        tasks = await services.delegation.list_tasks(current_user_id(services) or 0)
        with ui.column().classes("w-full max-w-5xl mx-auto q-pa-md"):
            ui.label("Delegated tasks").classes("text-h5")
            ui.label("Every delegation of your chats, nested ones included, newest first. "
                     "These sessions are kept out of the chat list.").classes("text-grey-7")
            if not tasks:
                ui.label("No delegations yet: mention an agent in a chat (@coding-assistant …).").props(
                    "data-testid=audit-empty")
                return
            with ui.element("table").classes("w-full audit-table").props("data-testid=audit-table"):
                with ui.element("thead"), ui.element("tr"):
                    for title in ("Started", "Caller", "Callee", "Request", "State", "Duration", "Tokens in/out"):
                        with ui.element("th").classes("text-left"):
                            ui.label(title)
                with ui.element("tbody"):
                    for task in tasks:
                        _task_row(task)

    @ui.page("/audit/{task_id}", title="Delegated task")
    async def audit_task_page(task_id: str) -> None:
        _header()
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
                        ui.link(f"{child.callee_agent_name}: {child.input[:80]}", f"/audit/{child.id}")
                        _state_badge(child)


def _header() -> None:
    with ui.header().classes("items-center justify-between bg-primary"):
        ui.link("A2A Delegation Chat", "/").classes("text-h6 text-white no-underline")
        ui.label("Audit").classes("text-white")


def _task_row(task: TaskView) -> None:
    with ui.element("tr").props(f"data-testid=audit-row data-task-id={task.id} data-state={task.state}"):
        cells = [
            f"{task.created_at:%Y-%m-%d %H:%M:%S}",
            task.caller_agent_name or "remote",
            ("↳ " * (task.recursion_depth - 1)) + task.callee_agent_name,
        ]
        for text in cells:
            with ui.element("td"):
                ui.label(text)
        with ui.element("td"):
            ui.link(task.input[:80] + ("…" if len(task.input) > 80 else ""), f"/audit/{task.id}")
        with ui.element("td"):
            _state_badge(task)
        for text in (_duration(task), f"{task.input_tokens} / {task.output_tokens}"):
            with ui.element("td"):
                ui.label(text)


def _state_badge(task: TaskView) -> None:
    label = STATUS_LABELS.get(task.state, task.state)
    ui.badge(label, color=STATUS_COLORS.get(label, "grey-7")).props("data-testid=audit-state")


def _duration(task: TaskView) -> str:
    return "running" if task.duration_ms is None else f"{task.duration_ms / 1000:.1f} s"
