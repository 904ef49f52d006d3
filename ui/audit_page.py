"""The audit view (seed 000 §3.1.3): delegated tasks, which the session list never shows.

`/audit` lists the user's tasks (caller, callee, state, duration, tokens);
`/audit/{task_id}` shows one task read-only: what was asked, the callee's
answer, and its own nested delegations.
"""

from __future__ import annotations

from nicegui import ui

from core.auth.deps import AuthState
from core.delegation import TaskView, short_task_text, state_label, state_word
from core.delegation.service import DelegationService
from core.i18n import N_, _, format_datetime, format_number, ngettext
from ui.agent_invoke_panel import STATUS_COLORS
from ui.auth import current_user_id
from ui.frame import page_frame
from ui.language import page


def register_audit_pages(*, delegation: DelegationService, auth: AuthState) -> None:
    """`/audit` and `/audit/{task_id}`."""

    @page("/audit", title="Delegated tasks")
    async def audit_page() -> None:
        with page_frame(auth, title=_("Delegated tasks"), active="/audit"):
            await _audit_list(delegation, auth)

    @page("/audit/{task_id}", title="Delegated task")
    async def audit_task_page(task_id: str) -> None:
        with page_frame(auth, title=_("Delegated task"), active="/audit"):
            await _audit_task(delegation, auth, task_id)


async def _audit_list(delegation: DelegationService, auth: AuthState) -> None:
    tasks = await delegation.list_tasks(current_user_id(auth) or 0)
    with ui.column().classes("w-full max-w-5xl mx-auto q-pa-md"):
        ui.label(_("Delegated tasks")).classes("text-h5")
        ui.label(
            _(
                "Every delegation of your chats, nested ones included, newest first. "
                "These sessions are kept out of the chat list."
            )
        ).classes("text-grey-7")
        if not tasks:
            ui.label(_("No delegations yet: mention an agent in a chat (@coding-assistant …).")).props(
                "data-testid=audit-empty"
            )
            return
        ui.label(
            ngettext("{count} delegated task", "{count} delegated tasks", len(tasks)).format(
                count=format_number(len(tasks))
            )
        ).classes("text-grey-7").props("data-testid=audit-count")
        with (
            ui.element("div").classes("w-full table-scroll").props("data-testid=audit-table-box"),
            ui.element("table").classes("w-full audit-table").props("data-testid=audit-table"),
        ):
            with ui.element("thead"), ui.element("tr"):
                for title in COLUMNS:
                    with ui.element("th").classes("text-left"):
                        ui.label(_(title))
            with ui.element("tbody"):
                for task in tasks:
                    _task_row(task)


async def _audit_task(delegation: DelegationService, auth: AuthState, task_id: str) -> None:
    detail = await delegation.task_detail(current_user_id(auth) or 0, task_id)
    with ui.column().classes("w-full max-w-3xl mx-auto q-pa-md"):
        ui.link(_("← All delegated tasks"), "/audit")
        if detail is None:
            ui.label(_("There is no such task among your conversations.")).classes("text-h6")
            return
        task = detail.task
        with ui.row().classes("items-center gap-2").props(f"data-testid=audit-task data-task-id={task.id}"):
            ui.label(f"{task.caller_agent_name or _('A remote caller')} → {task.callee_agent_name}").classes("text-h5")
            _state_badge(task)
        with ui.row().classes("gap-4 text-grey-8"):
            ui.label(_("Started {when}").format(when=format_datetime(task.created_at)))
            ui.label(_("Duration {duration}").format(duration=_duration(task)))
            ui.label(
                _("Tokens {input} in / {output} out").format(
                    input=format_number(task.input_tokens), output=format_number(task.output_tokens)
                )
            )
            ui.label(_("Depth {depth}").format(depth=task.recursion_depth))
        if task.parent_task_id:
            ui.link(_("Parent task"), f"/audit/{task.parent_task_id}").props("data-testid=audit-parent")
        elif task.caller_session_id:
            ui.link(_("Open the calling chat"), f"/chat/{task.caller_session_id}")
        if task.error:
            ui.label(task.error).classes("text-negative")
        for message in detail.messages:
            who = _("Request") if message.role == "user" else task.callee_agent_name
            with (
                ui.card()
                .classes("w-full")
                .props(f"flat bordered data-testid=audit-message data-role={message.role} data-source={message.source}")
            ):
                ui.label(who).classes("text-caption text-grey-7")
                ui.markdown(message.content or _("*(no text)*")).classes("w-full")
        if detail.children:
            ui.label(_("Nested delegations")).classes("text-h6 q-mt-md")
            for child in detail.children:
                with ui.row().classes("items-center gap-2").props(f"data-testid=audit-child data-task-id={child.id}"):
                    ui.link(f"{child.callee_agent_name}: {short_task_text(child.input, 80)}", f"/audit/{child.id}")
                    _state_badge(child)


COLUMNS = (N_("Started"), N_("Caller"), N_("Callee"), N_("Request"), N_("State"), N_("Duration"), N_("Tokens in/out"))


def _task_row(task: TaskView) -> None:
    word = state_word(task.state)
    with ui.element("tr").props(f"data-testid=audit-row data-task-id={task.id} data-state={word}"):
        cells = [
            format_datetime(task.created_at),
            task.caller_agent_name or _("remote"),
            ("↳ " * (task.recursion_depth - 1)) + task.callee_agent_name,
        ]
        for title, text in zip(COLUMNS[:3], cells, strict=True):
            with ui.element("td").props(f"data-label='{_(title)}'"):
                ui.label(text)
        with ui.element("td").props("data-label='" + _("Request") + "'"):
            ui.link(short_task_text(task.input, 80), f"/audit/{task.id}")
        with ui.element("td").props("data-label='" + _("State") + "'"):
            _state_badge(task)
        tokens = f"{format_number(task.input_tokens)} / {format_number(task.output_tokens)}"
        for title, text in zip(COLUMNS[5:], (_duration(task), tokens), strict=True):
            with ui.element("td").props(f"data-label='{_(title)}'"):
                ui.label(text)


def _state_badge(task: TaskView) -> None:
    word = state_word(task.state)
    ui.badge(state_label(task.state), color=STATUS_COLORS.get(word, "grey-7")).props(
        f"data-testid=audit-state data-state={word}"
    )


def _duration(task: TaskView) -> str:
    if task.duration_ms is None:
        return _("running")
    return _("{seconds} s").format(seconds=format_number(task.duration_ms / 1000, decimals=1))
