"""Local agents and their tools: lookups, the stored writes, and the seeded agents.

The rules an edit must follow (ids unique across every kind of agent, allowed callees that exist,
models LiteLLM knows, who may edit) are `core.delegation.agent_admin`'s; this module only reads and
writes rows. A deleted agent keeps its row (`deleted_at`), so its chats and audit records stay
readable; lookups by id and the lists leave it out unless asked.
"""

from __future__ import annotations

import re
from typing import Any

from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.db import Database
from core.errors import AppError
from models import Agent, AgentTool, utcnow

AGENT_INVOKE = "agent-invoke"
# One `a2a_<id>` tool per broker agent visible to the agent; a call dispatches in the background (core/broker/tools.py).
A2A_DISPATCH = "a2a-dispatch"
# The agent a new chat starts with unless the `DEFAULT_AGENT` setting names another.
DEFAULT_AGENT_SLUG = "general-assistant"
SLUG_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")

DEFAULT_AGENT_INVOKE_CONFIG: dict[str, Any] = {
    "maxRecursionDepth": 3,
    "timeoutMs": 120_000,
    "maxOutputTokens": 4096,
    "allowedAgents": None,  # None: any invokable agent
}
# The largest value of each agent-invoke limit: a chain 20 deep, a delegated task of an hour (the
# caller's whole turn has TURN_TIMEOUT_S anyway, 600 s by default), an answer of a million tokens.
AGENT_INVOKE_MAXIMA: dict[str, int] = {
    "maxRecursionDepth": 20,
    "timeoutMs": 3_600_000,
    "maxOutputTokens": 1_000_000,
}

SEED_AGENTS: list[dict[str, Any]] = [
    {
        "slug": "general-assistant",
        "name": "General Assistant",
        "description": "Answers general questions and delegates specialised work to other agents.",
        "system_prompt": (
            "You are a helpful general assistant. When another agent is better suited, delegate to it "
            "with the agent_invoke tool and then answer using its result. For long-running work, dispatch it to "
            "a remote agent with its a2a_<id> tool: it runs in the background, and its result arrives later as "
            "a system message that you then announce to the user."
        ),
        "tools": {AGENT_INVOKE: DEFAULT_AGENT_INVOKE_CONFIG, A2A_DISPATCH: {}},
    },
    {
        "slug": "coding-assistant",
        "name": "Coding Assistant",
        "description": "Writes and explains code.",
        "system_prompt": "You are a coding assistant. Answer with working code and short explanations.",
        "tools": {},
    },
    {
        "slug": "planner",
        "name": "Planner",
        "description": "Breaks a job into steps and hands each step to the agent best suited for it.",
        "system_prompt": (
            "You are a planner. Break the request into steps, delegate each step to the agent best suited for it "
            "with the agent_invoke tool, then combine their results into one answer."
        ),
        "tools": {AGENT_INVOKE: DEFAULT_AGENT_INVOKE_CONFIG},
    },
]


class AgentError(AppError, ValueError):
    """An agent definition that cannot be accepted; the message says why."""

    code = "agent_error"


class AgentExistsError(AgentError):
    """The id is taken by another local agent."""

    code = "agent_exists"


async def list_agents(session: AsyncSession, *, include_deleted: bool = False) -> list[Agent]:
    """Every local agent, by name (deleted ones too when asked: to name them in old chats and audit records)."""
    query = select(Agent).order_by(col(Agent.name), col(Agent.id))
    if not include_deleted:
        query = query.where(col(Agent.deleted_at).is_(None))
    return list((await session.exec(query)).all())


async def get_agent(session: AsyncSession, agent_id: int) -> Agent | None:
    """The agent with that database id, or None."""
    return await session.get(Agent, agent_id)


async def get_agent_by_slug(session: AsyncSession, slug: str, *, include_deleted: bool = False) -> Agent | None:
    """The agent with that registry id (slug), or None (also when it was deleted, unless asked)."""
    query = select(Agent).where(Agent.slug == slug)
    if not include_deleted:
        query = query.where(col(Agent.deleted_at).is_(None))
    return (await session.exec(query)).first()


async def get_default_agent(session: AsyncSession, slug: str = DEFAULT_AGENT_SLUG) -> Agent | None:
    """The agent a new chat starts with: the one the `DEFAULT_AGENT` setting names, or None if it is gone."""
    return await get_agent_by_slug(session, slug)


async def agent_tool_rows(session: AsyncSession, agent_id: int) -> list[tuple[str, dict[str, Any]]]:
    """`(tool_type, config)` of the agent's enabled tools."""
    rows = await session.exec(
        select(AgentTool).where(AgentTool.agent_id == agent_id, AgentTool.enabled).order_by(AgentTool.tool_type)
    )
    return [(row.tool_type, dict(row.config or {})) for row in rows.all()]


class AgentCache:
    """Each agent's row and enabled tools, read once per process and kept until an agent changes.

    A turn start needs both (`ChatEngine`); reading them each time was two of a turn start's
    statements on PostgreSQL (issue 41, docs/ARCHITECTURE.md "What the shared services carry").
    `forget` drops everything: `AgentAdmin` calls it (through `AgentRegistry.changed`) after each
    create, edit or delete here, and in a cluster each replica on the registry notice of another's
    (`core/db_events.py`) and when its listening connection comes back (notices may have been missed).
    A read still on its way when `forget` runs is returned but not kept.

    Args:
        db: the database.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self._by_id: dict[int, tuple[Agent | None, list[tuple[str, dict[str, Any]]]]] = {}
        self._generation = 0

    async def get(self, agent_id: int) -> tuple[Agent | None, list[tuple[str, dict[str, Any]]]]:
        """The agent (None when there is no such row) and its enabled tools (`agent_tool_rows`)."""
        kept = self._by_id.get(agent_id)
        if kept is None:
            generation = self._generation
            async with self.db.read() as r:
                agent = await get_agent(r, agent_id)
                tools = await agent_tool_rows(r, agent_id) if agent is not None and agent.deleted_at is None else []
            kept = (agent, tools)
            if generation == self._generation:
                self._by_id[agent_id] = kept
        agent, tools = kept
        return agent, [(tool_type, dict(config)) for tool_type, config in tools]  # a turn may not change the kept

    def forget(self, *_: object) -> None:
        """An agent was created, edited or deleted (any agent: a deletion edits others' allowed lists)."""
        self._by_id.clear()
        self._generation += 1

    async def forget_soon(self) -> None:
        """`forget`, as an awaitable (`RegistryEvents.on_reconnect`)."""
        self.forget()


async def tools_by_agent(session: AsyncSession) -> dict[int, dict[str, dict[str, Any]]]:
    """Every agent's enabled tools: `{agent id: {tool type: config}}`."""
    rows = await session.exec(select(AgentTool).where(AgentTool.enabled))
    tools: dict[int, dict[str, dict[str, Any]]] = {}
    for row in rows.all():
        tools.setdefault(row.agent_id, {})[row.tool_type] = dict(row.config or {})
    return tools


async def update_agent(
    session: AsyncSession,
    agent: Agent,
    changes: dict[str, Any],
    tools: dict[str, dict[str, Any]] | None = None,
) -> Agent:
    """Write `changes` (column name → value) and, when given, replace the agent's tools; commits."""
    for name, value in changes.items():
        setattr(agent, name, value)
    agent.updated_at = utcnow()
    session.add(agent)
    if tools is not None:
        assert agent.id is not None  # a saved row
        await _replace_tools(session, agent.id, tools)
    await session.commit()
    await session.refresh(agent)
    return agent


async def _replace_tools(session: AsyncSession, agent_id: int, tools: dict[str, dict[str, Any]]) -> None:
    existing = {
        row.tool_type: row
        for row in (await session.exec(select(AgentTool).where(AgentTool.agent_id == agent_id))).all()
    }
    for tool_type, row in existing.items():
        if tool_type not in tools:
            await session.delete(row)
    for tool_type, config in tools.items():
        kept = existing.get(tool_type)
        if kept is None:
            session.add(AgentTool(agent_id=agent_id, tool_type=tool_type, config=dict(config)))
        else:
            kept.config, kept.enabled = dict(config), True
            session.add(row)


async def delete_agent(session: AsyncSession, agent: Agent) -> list[str]:
    """Mark the agent deleted and take it out of every other agent's `allowedAgents`; commits.

    Returns:
        The ids of the agents whose `allowedAgents` named it.
    """
    agent.deleted_at = agent.updated_at = utcnow()
    session.add(agent)
    changed = []
    rows = await session.exec(
        select(AgentTool, Agent)
        .join(Agent, col(Agent.id) == col(AgentTool.agent_id))
        .where(col(AgentTool.tool_type) == AGENT_INVOKE, col(Agent.deleted_at).is_(None))
    )
    for tool, owner in rows.all():
        allowed = (tool.config or {}).get("allowedAgents")
        if isinstance(allowed, list) and agent.slug in allowed:
            tool.config = {**tool.config, "allowedAgents": [a for a in allowed if a != agent.slug]}
            session.add(tool)
            changed.append(owner.slug)
    await session.commit()
    return sorted(changed)


async def create_agent(
    session: AsyncSession,
    *,
    slug: str,
    name: str,
    model: str,
    description: str = "",
    system_prompt: str = "",
    tools: dict[str, dict[str, Any]] | None = None,
    **settings: Any,
) -> Agent:
    """Create a local agent with its tools; `settings` are more columns (`api_base`, sealed `api_key`, ...).

    Raises:
        AgentError: the slug is malformed or taken (also by a deleted agent), or the name is empty.
    """
    if not SLUG_PATTERN.fullmatch(slug):
        raise AgentError("an agent id is 1-64 lowercase letters, digits, '-' or '_', starting with a letter or digit")
    if not name.strip():
        raise AgentError("an agent needs a name")
    existing = await get_agent_by_slug(session, slug, include_deleted=True)
    if existing is not None:
        if existing.deleted_at is not None:
            raise AgentExistsError(
                f"the id {slug!r} belonged to a deleted agent, whose chats and audit records keep it; choose another id"
            )
        raise AgentExistsError(f"an agent with the id {slug!r} already exists")
    agent = Agent(
        slug=slug, name=name.strip(), model=model, description=description, system_prompt=system_prompt, **settings
    )
    session.add(agent)
    await session.flush()
    assert agent.id is not None  # flushed: the database gave it its id
    for tool_type, config in (tools or {}).items():
        session.add(AgentTool(agent_id=agent.id, tool_type=tool_type, config=dict(config)))
    agent.updated_at = utcnow()
    await session.commit()
    await session.refresh(agent)
    return agent


async def seed_agents(session: AsyncSession, *, model: str) -> list[Agent]:
    """Create the seeded agents on first start (when there are no agents at all, deleted ones included)."""
    if (await session.exec(select(Agent.id).limit(1))).first() is not None:
        return []
    created = []
    for spec in SEED_AGENTS:
        created.append(
            await create_agent(
                session,
                slug=spec["slug"],
                name=spec["name"],
                model=model,
                description=spec["description"],
                system_prompt=spec["system_prompt"],
                tools=spec["tools"],
            )
        )
    return created
