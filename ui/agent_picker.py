"""The chat page's agent picker: each option shows the agent's name and, under it, its description."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nicegui import ui

from core.i18n import N_, _
from models import Agent

_OPTION = r"""
<q-item v-bind="props.itemProps" :aria-label="props.opt.label">
  <q-item-section>
    <q-item-label>{{ props.opt.label }}</q-item-label>
    <q-item-label caption lines="2">{{ props.opt.description }}</q-item-label>
  </q-item-section>
</q-item>
"""


DELETED = N_("(agent deleted)")


class AgentPicker(ui.select):
    """A select of agents by id, showing names, with each agent's description under its name in the list.

    A chat whose agent was deleted shows it as "<id> (agent deleted)" (the chat stays readable).
    """

    def __init__(self, agents: list[Agent], *, value: str | None, on_change: Callable[..., Any]) -> None:
        self._descriptions = {a.slug: a.description for a in agents}
        options = {a.slug: a.name for a in agents}
        if value is not None and value not in options:
            options[value] = f"{value} {_(DELETED)}"
            self._descriptions[value] = _("This chat's agent was deleted; its messages stay readable.")
        super().__init__(options, value=value, label=_("Agent"), on_change=on_change)
        self.add_slot("option", _OPTION)

    def _update_options(self) -> None:
        super()._update_options()
        for option, value in zip(self._props["options"], self._values, strict=False):
            option["description"] = getattr(self, "_descriptions", {}).get(value, "")
