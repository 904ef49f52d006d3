"""The card of every agent the registry knows (`AgentCards`), in plain values for `protocol.build_card`.

Local agents (database) and remote ones (`AgentRegistry`) are looked up by id on every request, so
an agent added at run time has a card at once. The A2A endpoint (`core/a2a/server.py`) serves it.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from core.a2a import protocol as wire
from core.chat import agents as agents_store
from core.chat.agents import AGENT_INVOKE
from core.delegation.registry import AgentRegistry
from core.settings import Settings

CONTEXT_RULE = (
    "Conversations: send the contextId of one of your earlier tasks with this agent to continue it "
    "(the agent sees the earlier exchanges); an unknown contextId is refused (-32602), never replaced."
)
PROVIDER = "A2A Delegation Chat"
#: Where an agent's HTTP+JSON endpoint is, below its JSON-RPC URL (`/a2a/agents/{id}/rest/message:send`, …).
REST_PATH = "/rest"


def _app_version() -> str:
    try:
        return metadata.version("a2a-delegation-chat")
    except metadata.PackageNotFoundError:
        return "0.1.0"


class AgentCards:
    """The card of any agent the registry knows, built from what the app knows about it."""

    def __init__(self, db: Any, registry: AgentRegistry, settings: Settings) -> None:
        self.db = db
        self.registry = registry
        self.settings = settings
        self.version = _app_version()

    def rpc_url(self, agent_id: str) -> str:
        """The absolute URL of an agent's JSON-RPC endpoint."""
        return f"{self.settings.base_url}/a2a/agents/{agent_id}"

    def rest_url(self, agent_id: str) -> str:
        """The absolute URL of an agent's HTTP+JSON endpoint (the SDK's REST paths go below it)."""
        return self.rpc_url(agent_id) + REST_PATH

    async def exists(self, agent_id: str) -> bool:
        """Whether `spec` would find the agent: one indexed read (every JSON-RPC call asks), no card built."""
        if self.registry.remote(agent_id) is not None:
            return True
        async with self.db.read() as s:
            return await agents_store.get_agent_by_slug(s, agent_id) is not None

    async def spec(self, agent_id: str) -> wire.CardSpec | None:
        """The agent's card in plain values, or None when no agent has that id."""
        async with self.db.read() as s:
            agent = await agents_store.get_agent_by_slug(s, agent_id)
            tools = (
                [t for t, _ in await agents_store.agent_tool_rows(s, agent.id)]
                if agent is not None and agent.id is not None
                else []
            )
        common: dict[str, Any] = {
            "rpc_url": self.rpc_url(agent_id),
            "rest_url": self.rest_url(agent_id),
            "version": self.version,
            "provider": PROVIDER,
            "provider_url": self.settings.base_url,
            "notes": CONTEXT_RULE,
        }
        if agent is not None:
            extra = (
                (
                    wire.SkillSpec(
                        id="delegate",
                        name="Delegates to other agents",
                        tags=("delegation",),
                        description="May hand parts of a request to the app's other agents.",
                    ),
                )
                if AGENT_INVOKE in tools
                else ()
            )
            return wire.CardSpec(
                name=agent.name,
                description=agent.description,
                skills=(
                    wire.SkillSpec(
                        id=agent.slug, name=agent.name, description=agent.description, tags=("chat", "local")
                    ),
                ),
                extra_skills=extra,
                input_modes=(*wire.INPUT_MODES, *self.settings.upload_allowed_types),  # files: as uploads (issue 36)
                output_modes=wire.DEMO_OUTPUT_MODES if (agent.model or "").startswith("local/") else wire.TEXT_MODES,
                **common,
            )
        remote = self.registry.remote(agent_id)
        if remote is None:
            return None
        info = remote.card() or {}
        skills = tuple(
            wire.SkillSpec(
                id=str(s.get("id") or i),
                name=str(s.get("name") or s.get("id") or remote.name),
                description=str(s.get("description") or ""),
                tags=tuple(str(t) for t in s.get("tags") or ()),
            )
            for i, s in enumerate(info.get("skills") or [])
            if isinstance(s, dict)
        ) or (
            wire.SkillSpec(
                id=remote.id, name=remote.name, description=remote.description, tags=("remote", remote.kind)
            ),
        )
        # What it takes and gives is what its own card says (files and data pass through: issue 36).
        takes = tuple(str(m) for m in info.get("inputModes") or ()) or wire.INPUT_MODES
        gives = tuple(str(m) for m in info.get("outputModes") or ()) or wire.TEXT_MODES
        return wire.CardSpec(
            name=remote.name,
            description=remote.description,
            skills=skills,
            input_modes=takes,
            output_modes=gives,
            **common,
        )
