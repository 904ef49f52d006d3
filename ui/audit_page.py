"""The audit view (seed 000 §3.1.3): delegated tasks, which the session list never shows.

`/audit` lists the user's tasks (caller, callee, state, duration, tokens, cost);
`/audit/{task_id}` shows one task read-only: the waterfall of its whole
delegation chain (each hop's agent, start, duration, state, tokens and cost,
nested as the tasks nest: what a trace viewer shows), what was asked, the
callee's answer, and its own nested delegations.
"""

from __future__ import annotations

from datetime import UTC, datetime

from nicegui import ui

from core.auth.deps import AuthState
from core.delegation import TaskView, short_task_text, state_label, state_word
from core.delegation.service import DelegationService
from core.i18n import N_, _, format_datetime, format_number, format_usd, ngettext
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
            if task.cost_usd is not None:
                ui.label(_("Cost {cost}").format(cost=format_usd(task.cost_usd))).props("data-testid=audit-cost")
            ui.label(_("Depth {depth}").format(depth=task.recursion_depth))
        if task.parent_task_id:
            ui.link(_("Parent task"), f"/audit/{task.parent_task_id}").props("data-testid=audit-parent")
        elif task.caller_session_id:
            ui.link(_("Open the calling chat"), f"/chat/{task.caller_session_id}")
        if task.error:
            ui.label(task.error).classes("text-negative")
        _waterfall(await delegation.task_chain(current_user_id(auth) or 0, task_id), task.id)
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


COLUMNS = (
    N_("Started"),
    N_("Caller"),
    N_("Callee"),
    N_("Request"),
    N_("State"),
    N_("Duration"),
    N_("Tokens in/out"),
    N_("Cost"),
)


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
        cost = format_usd(task.cost_usd) if task.cost_usd is not None else "—"
        for title, text in zip(COLUMNS[5:], (_duration(task), tokens, cost), strict=True):
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


def _waterfall(chain: list[TaskView], current: str) -> None:
    """The delegation chain as a trace viewer draws it: one row a hop, nested, each bar at its time."""
    if len(chain) < 2:
        return
    start = chain[0].created_at
    now = datetime.now(UTC)
    span_s = max(((t.finished_at or now) - start).total_seconds() for t in chain) or 0.001
    ui.label(_("Delegation chain")).classes("text-h6 q-mt-md")
    with ui.column().classes("w-full gap-1 waterfall").props("data-testid=audit-waterfall"):
        for task in chain:
            word = state_word(task.state)
            offset_s = (task.created_at - start).total_seconds()
            length_s = ((task.finished_at or now) - task.created_at).total_seconds()
            with (
                ui.element("div")
                .classes("waterfall-row" + (" waterfall-row--current" if task.id == current else ""))
                .props(
                    f"data-testid=audit-waterfall-row data-task-id={task.id} "
                    f"data-depth={task.recursion_depth} data-state={word}"
                )
            ):
                with (
                    ui.row()
                    .classes("waterfall-name no-wrap items-center gap-1 min-w-0")
                    .style(f"padding-left: {(task.recursion_depth - 1) * 14}px")
                ):
                    ui.link(task.callee_agent_name, f"/audit/{task.id}").classes("ellipsis")
                    _state_badge(task)
                width = min(max(length_s / span_s * 100, 1.0), 100.0)  # a hop too short to see still shows
                left = min(offset_s / span_s * 100, 100.0 - width)
                with ui.element("div").classes("waterfall-track"):
                    ui.element("div").classes(f"waterfall-bar bg-{STATUS_COLORS.get(word, 'grey-7')}").style(
                        f"left: {left:.2f}%; width: {width:.2f}%"
                    )
                figures = [
                    _("+{seconds} s").format(seconds=format_number(offset_s, decimals=1)),
                    _duration(task),
                    _("{input} / {output} tokens").format(
                        input=format_number(task.input_tokens), output=format_number(task.output_tokens)
                    ),
                ]
                if task.cost_usd is not None:
                    figures.append(format_usd(task.cost_usd))
                ui.label(" · ".join(figures)).classes("waterfall-figures text-caption text-grey-7").props(
                    "data-testid=audit-waterfall-figures"
                )
