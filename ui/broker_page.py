"""`/broker`: the seed-003 broker, live: online agents, running tasks, counters.

Refreshed once a second by a timer; the tables get new rows, nothing else is
rebuilt. A page holds no rules: the rows come from `Broker` views below.
"""

from __future__ import annotations

import time
from typing import Any

from nicegui import ui

from core.auth.deps import AuthState
from core.broker import Broker
from core.broker.service import user_owner
from core.delegation import state_label
from core.i18n import N_, _, format_number, pgettext
from ui.auth import current_user_id
from ui.frame import page_frame, testid
from ui.language import page

REFRESH_S = 1.0
RECENT_SHOWN = 20
# The broker's own state words, beside A2A's (which read as everywhere else: core.delegation.state_label).
BROKER_STATES = {"running": N_("running"), "timeout": N_("timed out")}
REDIS_STATES = ("disabled", "up", "down")  # InjectPublisher.state (core/broker/inject.py)

AGENT_COLUMNS = [
    {"name": "id", "label": N_("Id"), "field": "id", "align": "left"},
    {"name": "name", "label": N_("Name"), "field": "name", "align": "left"},
    {"name": "binding", "label": N_("Bound to"), "field": "binding", "align": "left"},
    {"name": "skills", "label": N_("Skills"), "field": "skills", "align": "left"},
    {"name": "age", "label": N_("Connected for"), "field": "age", "align": "right"},
    {"name": "inFlight", "label": N_("In flight"), "field": "inFlight", "align": "right"},
    {"name": "address", "label": N_("From"), "field": "address", "align": "left"},
]
TASK_COLUMNS = [
    {"name": "task", "label": N_("Task"), "field": "task", "align": "left"},
    {"name": "agent", "label": N_("Agent"), "field": "agent", "align": "left"},
    {"name": "chat", "label": N_("Chat (agentId / chatId)"), "field": "chat", "align": "left"},
    {"name": "state", "label": N_("State"), "field": "state", "align": "left"},
    {"name": "progress", "label": N_("Last progress"), "field": "progress", "align": "left"},
    {"name": "events", "label": N_("Events"), "field": "events", "align": "right"},
    {"name": "injects", "label": N_("Injects (throttled)"), "field": "injects", "align": "right"},
    {"name": "age", "label": N_("Age"), "field": "age", "align": "right"},
]


def age(seconds: float) -> str:
    """`42 s`, `3 min 5 s`, `2 h 10 min`."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return _("{s} s").format(s=seconds)
    if seconds < 3600:
        return _("{m} min {s} s").format(m=seconds // 60, s=seconds % 60)
    return _("{h} h {m} min").format(h=seconds // 3600, m=seconds % 3600 // 60)


def _columns(columns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A table's columns with their labels in the reader's language."""
    return [{**column, "label": _(column["label"])} for column in columns]


def agent_rows(broker: Broker, now: float | None = None) -> list[dict[str, Any]]:
    """One row per connected agent (cluster mode: to any replica; "From" names the replica)."""
    now = now or time.time()
    return [
        {
            "id": c.id,
            "name": c.name,
            "binding": c.binding or _("global (every chat agent)"),
            "skills": ", ".join(s["name"] for s in c.card()["skills"]) or "—",
            "age": age(now - c.connected_at),
            "inFlight": c.in_flight,
            "address": c.remote_addr or "—",
        }
        for c in broker.agents()
    ]


def task_rows(tasks: list[Any], viewer: str, now: float | None = None) -> list[dict[str, Any]]:
    """One row per broker task (running or finished); what was asked and said only in the viewer's own tasks."""
    now = now or time.time()
    rows = []
    for t in tasks:
        end = t.finished_at or now
        own = t.owner == viewer
        rows.append(
            {
                "id": t.id,
                "task": (t.text if len(t.text) <= 60 else t.text[:59] + "…") if own else _("(not yours)"),
                "agent": t.agent.name,
                "chat": f"{t.chat_agent_id} / {t.chat_id}" if own else "—",
                "state": state_text(t.state),
                "progress": (t.last_text[:120] or "—") if own else "—",
                "events": t.events,
                "injects": f"{t.injects} ({t.throttled})",
                "age": age(end - t.created_at),
            }
        )
    return rows


def state_text(state: str) -> str:
    """A broker task's state as people read it, in their language (an unknown word as it is)."""
    if state in BROKER_STATES:
        return _(BROKER_STATES[state])
    return state_label(state)


def redis_text(state: str) -> str:
    """The inject publisher's Redis state (`disabled`, `up`, `down`) in the reader's language."""
    words = {
        "disabled": pgettext("Redis state", "disabled"),
        "up": pgettext("Redis state", "up"),
        "down": pgettext("Redis state", "down"),
    }
    return words.get(state, state)


def counters(broker: Broker) -> list[tuple[str, str]]:
    """The figures shown at the top."""
    stats, health = broker.stats(), broker.health()
    by_state = stats["tasks"]["byState"]
    injects = stats["injects"]
    finished = ", ".join(
        f"{state_text(k)} {format_number(v)}" for k, v in sorted(by_state.items()) if k != "running"
    ) or _("none")
    redis = redis_text(health["redis"]) + (
        _(" — {count} waiting").format(count=format_number(health["outbox"])) if health["outbox"] else ""
    )
    return [
        (N_("Agents online"), format_number(stats["agentsOnline"])),
        (N_("Tasks running"), format_number(by_state.get("running", 0))),
        (N_("Tasks finished"), finished),
        (N_("Events relayed"), format_number(stats["eventsRelayed"])),
        (N_("Injects sent"), format_number(injects["sent"])),
        (N_("Throttled / dropped"), f"{format_number(injects['throttled'])} / {format_number(injects['dropped'])}"),
        (
            N_("Connections (refused)"),
            f"{format_number(stats['connections']['total'])} ({format_number(stats['connections']['refused'])})",
        ),
        (N_("Redis"), redis),
    ]


def register_broker_pages(*, broker: Broker | None, auth: AuthState) -> None:
    """`/broker`."""

    @page("/broker", title="Broker")
    async def broker_page() -> None:
        with page_frame(auth, title=_("Broker"), active="/broker"):
            _broker_content(broker, auth)


def _broker_content(broker: Broker | None, auth: AuthState) -> None:
    with ui.column().classes("w-full max-w-6xl mx-auto q-pa-md gap-4"):
        ui.label(_("Broker")).classes("text-h5")
        ui.label(
            _(
                "Remote agents dial in on /a2a (python -m core.pipe ws://…/a2a?a2a_id=NAME -- command); "
                "chat systems dispatch with POST /a2a/tasks/dispatch and hear back over Redis."
            )
        ).classes("text-grey-7")
        if broker is None:
            ui.label(_("The broker is not running in this process."))
            return
        viewer = user_owner(current_user_id(auth) or 0)  # texts and chat ids of one's own tasks only
        figures: dict[str, ui.label] = {}
        with ui.row().classes("gap-3 w-full").mark("broker-counters").props("data-testid=broker-counters"):
            for title, value in counters(broker):
                with ui.card().props("flat bordered").classes("q-pa-sm"):
                    ui.label(_(title)).classes("text-caption text-grey-7")
                    figures[title] = (
                        ui.label(value)
                        .classes("text-subtitle1")
                        .mark(f"counter-{title}")
                        .props(f"data-testid=broker-counter data-counter='{title}'")
                    )

        ui.label(_("Online agents")).classes("text-h6")
        agents = (
            testid(ui.table(columns=_columns(AGENT_COLUMNS), rows=agent_rows(broker), row_key="id"), "broker-agents")
            .classes("w-full")
            .props("flat bordered dense no-data-label='" + _("No agent is connected.") + "'")
        )
        ui.label(_("Running tasks")).classes("text-h6")
        running = (
            testid(
                ui.table(columns=_columns(TASK_COLUMNS), rows=task_rows(broker.running_tasks(), viewer), row_key="id"),
                "broker-running",
            )
            .classes("w-full")
            .props("flat bordered dense no-data-label='" + _("No task is running.") + "'")
        )
        ui.label(_("Recently finished")).classes("text-h6")
        recent = (
            testid(
                ui.table(
                    columns=_columns(TASK_COLUMNS),
                    rows=task_rows(broker.recent_tasks()[:RECENT_SHOWN], viewer),
                    row_key="id",
                ),
                "broker-recent",
            )
            .classes("w-full")
            .props("flat bordered dense no-data-label='" + _("Nothing finished yet.") + "'")
        )

        def refresh() -> None:
            now = time.time()
            for title, value in counters(broker):
                if figures[title].text != value:
                    figures[title].set_text(value)
            for table, rows in (
                (agents, agent_rows(broker, now)),
                (running, task_rows(broker.running_tasks(), viewer, now)),
                (recent, task_rows(broker.recent_tasks()[:RECENT_SHOWN], viewer, now)),
            ):
                if table.rows != rows:
                    table.rows = rows
                    table.update()

        ui.timer(REFRESH_S, refresh)
