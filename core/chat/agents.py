"""Local agents and their tools: lookups, creation and the two seeded agents."""

from __future__ import annotations

import re
from typing import Any

from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

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


class AgentError(ValueError):
    """An agent definition that cannot be accepted; the message says why."""


class AgentExists(AgentError):
    """The id is taken by another local agent."""


async def list_agents(session: AsyncSession) -> list[Agent]:
    """Every local agent, by name."""
    return list((await session.exec(select(Agent).order_by(Agent.name))).all())


async def get_agent(session: AsyncSession, agent_id: int) -> Agent | None:
    """The agent with that database id, or None."""
    return await session.get(Agent, agent_id)


async def get_agent_by_slug(session: AsyncSession, slug: str) -> Agent | None:
    """The agent with that registry id (slug), or None."""
    return (await session.exec(select(Agent).where(Agent.slug == slug))).first()


async def get_default_agent(session: AsyncSession, slug: str = DEFAULT_AGENT_SLUG) -> Agent | None:
    """The agent a new chat starts with: the one the `DEFAULT_AGENT` setting names, or None if it is gone."""
    return await get_agent_by_slug(session, slug)


async def agent_tool_rows(session: AsyncSession, agent_id: int) -> list[tuple[str, dict[str, Any]]]:
    """`(tool_type, config)` of the agent's enabled tools."""
    rows = await session.exec(select(AgentTool).where(AgentTool.agent_id == agent_id, AgentTool.enabled))
    return [(row.tool_type, dict(row.config or {})) for row in rows.all()]


async def create_agent(
    session: AsyncSession,
    *,
    slug: str,
    name: str,
    model: str,
    description: str = "",
    system_prompt: str = "",
    tools: dict[str, dict[str, Any]] | None = None,
) -> Agent:
    """Create a local agent with its tools.

    Raises:
        AgentError: the slug is malformed or taken, or the name is empty.
    """
    if not SLUG_PATTERN.fullmatch(slug):
        raise AgentError("an agent id is 1-64 lowercase letters, digits, '-' or '_', starting with a letter or digit")
    if not name.strip():
        raise AgentError("an agent needs a name")
    if await get_agent_by_slug(session, slug) is not None:
        raise AgentExists(f"an agent with the id {slug!r} already exists")
    agent = Agent(slug=slug, name=name.strip(), model=model, description=description, system_prompt=system_prompt)
    session.add(agent)
    await session.flush()
    for tool_type, config in (tools or {}).items():
        session.add(AgentTool(agent_id=agent.id, tool_type=tool_type, config=dict(config)))
    agent.updated_at = utcnow()
    await session.commit()
    await session.refresh(agent)
    return agent


async def seed_agents(session: AsyncSession, *, model: str) -> list[Agent]:
    """Create the seeded agents on first start (when there are no agents at all)."""
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
