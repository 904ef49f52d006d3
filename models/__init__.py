"""SQLModel tables. Names follow seed 000 §3.1 and docs/ARCHITECTURE.md ("The data model").

Only what a table needs lives here: columns, keys, indexes and defaults.
Schema changes go through the Alembic scripts in `models/migrations/`.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel


def utcnow() -> datetime:
    """Timezone-aware now; every timestamp column stores UTC."""
    return datetime.now(UTC)


def new_session_id() -> str:
    """Session ids are text with the `as_` prefix, as in seed 000 (`as_xxx`)."""
    return f"as_{secrets.token_hex(12)}"


def new_task_id() -> str:
    """Task ids are opaque hex strings, safe in URLs and buffer keys (`a2a_<taskId>`)."""
    return secrets.token_hex(16)


class UTCDateTime(TypeDecorator[datetime]):
    """`DateTime(timezone=True)` that always reads back aware UTC (SQLite stores naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime given; use models.utcnow()")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _ts(nullable: bool = False, **kw: Any) -> Any:
    return Field(sa_type=UTCDateTime, nullable=nullable, **kw)


class User(SQLModel, table=True):
    """A person who logs in. In single-user mode the only user is `local`, without a password."""

    __tablename__ = "users"

    id: int | None = Field(default=None, primary_key=True)
    username: str = Field(sa_column=Column(String(64), unique=True, nullable=False))
    password_hash: str | None = Field(default=None, sa_type=String(255))
    # Admins create, change and delete agents (the first account is one; `app.py users promote`).
    is_admin: bool = Field(default=False, sa_column=Column(Boolean, nullable=False, server_default=false()))
    created_at: datetime = _ts(default_factory=utcnow)
    # Set by an admin (migration 0011): the account can no longer log in, and its open logins end.
    disabled_at: datetime | None = _ts(nullable=True, default=None)


class Agent(SQLModel, table=True):
    """A local agent: its slug is its id in the app's one agent registry.

    A deleted agent keeps its row (`deleted_at` set) so its chats and audit records stay readable;
    its id stays taken.
    """

    __tablename__ = "agents"

    id: int | None = Field(default=None, primary_key=True)
    slug: str = Field(sa_column=Column(String(64), unique=True, nullable=False))
    name: str = Field(sa_type=String(128))
    description: str = Field(default="", sa_type=Text)
    system_prompt: str = Field(default="", sa_type=Text)
    model: str = Field(default="local/demo", sa_type=String(255))
    # Where and how its model is called (LiteLLM `api_base`, `api_key`); unset: the app's LLM_API_BASE/KEY.
    api_base: str | None = Field(default=None, sa_type=String(1000))
    api_key: str | None = Field(default=None, sa_type=Text)  # sealed by core/secret_box.py, never shown
    temperature: float | None = Field(default=None, sa_type=Float)
    max_output_tokens: int | None = Field(default=None, sa_type=Integer)
    created_at: datetime = _ts(default_factory=utcnow)
    updated_at: datetime = _ts(default_factory=utcnow)
    deleted_at: datetime | None = _ts(nullable=True, default=None)


class AgentTool(SQLModel, table=True):
    """A tool an agent may call, with its JSON config (e.g. `agent-invoke` limits)."""

    __tablename__ = "agent_tools"
    __table_args__ = (UniqueConstraint("agent_id", "tool_type", name="uq_agent_tools_agent_type"),)

    id: int | None = Field(default=None, primary_key=True)
    agent_id: int = Field(sa_column=Column(Integer, ForeignKey("agents.id", ondelete="CASCADE"), nullable=False))
    tool_type: str = Field(sa_type=String(64))
    config: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    enabled: bool = True
    created_at: datetime = _ts(default_factory=utcnow)


class AgentSession(SQLModel, table=True):
    """One conversation of a user with an agent (also the callee side of a delegated task)."""

    __tablename__ = "agent_sessions"
    __table_args__ = (Index("idx_agent_sessions_user_updated", "user_id", "updated_at"),)

    id: str = Field(default_factory=new_session_id, sa_column=Column(String(64), primary_key=True))
    user_id: int = Field(sa_column=Column(Integer, ForeignKey("users.id", ondelete="CASCADE"), nullable=False))
    agent_id: int = Field(sa_column=Column(Integer, ForeignKey("agents.id", ondelete="CASCADE"), nullable=False))
    title: str = Field(default="New chat", sa_type=String(200))
    created_at: datetime = _ts(default_factory=utcnow)
    updated_at: datetime = _ts(default_factory=utcnow)
    deleted_at: datetime | None = _ts(nullable=True, default=None)


class AgentMessage(SQLModel, table=True):
    """One message of a session. `source='a2a'` marks the messages of a delegated task."""

    __tablename__ = "agent_messages"
    __table_args__ = (
        Index("idx_agent_messages_source", "source"),
        Index("idx_agent_messages_session_order", "session_id", "sort_order", unique=True),  # migration 0008
        # The drafts of running turns only (migration 0009): a user's running turns are counted from them
        # (`sessions.count_running_turns`, a cluster's limit), and an agent's (`sessions_answering_with`).
        Index(
            "idx_agent_messages_streaming",
            "session_id",
            sqlite_where=text("status = 'streaming'"),
            postgresql_where=text("status = 'streaming'"),
        ),
        # A background task's notes, one per position of its log (migration 0010): the chat inbox reads a
        # task's injects by position, and a position already saved is not saved again.
        Index(
            "idx_agent_messages_inject_position",
            "session_id",
            "a2a_task_id",
            "inject_position",
            unique=True,
            sqlite_where=text("inject_position IS NOT NULL"),
            postgresql_where=text("inject_position IS NOT NULL"),
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(
        sa_column=Column(String(64), ForeignKey("agent_sessions.id", ondelete="CASCADE"), nullable=False)
    )
    role: str = Field(sa_type=String(16))
    content: str = Field(default="", sa_type=Text)
    model_id: str | None = Field(default=None, sa_type=String(255))
    input_tokens: int | None = None
    output_tokens: int | None = None
    # The model call's price at LiteLLM's list prices, US dollars (migration 0012); None: no price known.
    cost_usd: float | None = Field(default=None, sa_type=Float)
    sort_order: int = 0
    tool_calls: list[dict[str, Any]] | None = Field(default=None, sa_type=JSON)
    tool_results: list[dict[str, Any]] | None = Field(default=None, sa_type=JSON)
    # 'complete', or why the text stopped early: 'canceled', 'error', 'interrupted' (the server stopped or
    # crashed while it was written). 'streaming' while a turn writes it (core/chat/sessions.py: drafts).
    status: str = Field(default="complete", sa_column=Column(String(16), nullable=False, server_default="complete"))
    error: str | None = Field(default=None, sa_type=Text)
    source: str = Field(default="user", sa_column=Column(String(10), nullable=False, server_default="user"))
    a2a_task_id: str | None = Field(default=None, sa_type=String(64))
    caller_agent_id: int | None = Field(
        default=None, sa_column=Column(Integer, ForeignKey("agents.id", ondelete="SET NULL"), nullable=True)
    )
    caller_session_id: str | None = Field(default=None, sa_type=String(64))
    # Set on a message that arrived as an `inject_system_message` (seed 003): 'delay' (progress, kept
    # quietly) or 'auto' (a result the agent announces). Such a message has role 'system'.
    inject_mode: str | None = Field(default=None, sa_type=String(8))
    # The inject's position in its task's log (`core.broker.inject.RESULT_POSITION` for the result): the
    # chat inbox's own reading position of that task (migration 0010).
    inject_position: int | None = None
    # Files the message carries (migration 0014): [{"id", "name", "mime", "size"}], rows of `attachments`.
    attachments: list[dict[str, Any]] | None = Field(default=None, sa_type=JSON)
    created_at: datetime = _ts(default_factory=utcnow)


_RUNNING_TASK_STATES = "state IN ('submitted', 'working')"


class A2ATaskSession(SQLModel, table=True):
    """A delegated task: the callee's hidden session plus who called it and where it stands."""

    __tablename__ = "a2a_task_sessions"
    __table_args__ = (
        Index("idx_a2a_task_sessions_session", "session_id"),
        Index("idx_a2a_task_sessions_caller_session", "caller_session_id"),
        # Running tasks only (migration 0009): a user's are counted at every task start (`TaskRecords.count_running`).
        Index(
            "idx_a2a_task_sessions_running",
            "caller_user_id",
            sqlite_where=text(_RUNNING_TASK_STATES),
            postgresql_where=text(_RUNNING_TASK_STATES),
        ),
    )

    id: str = Field(default_factory=new_task_id, sa_column=Column(String(64), primary_key=True))
    session_id: str = Field(
        sa_column=Column(String(64), ForeignKey("agent_sessions.id", ondelete="CASCADE"), nullable=False)
    )
    callee_agent_id: int | None = Field(
        default=None, sa_column=Column(Integer, ForeignKey("agents.id", ondelete="SET NULL"), nullable=True)
    )
    callee_agent_slug: str = Field(sa_type=String(64))
    caller_user_id: int | None = Field(
        default=None, sa_column=Column(Integer, ForeignKey("users.id", ondelete="SET NULL"), nullable=True)
    )
    caller_agent_id: int | None = Field(
        default=None, sa_column=Column(Integer, ForeignKey("agents.id", ondelete="SET NULL"), nullable=True)
    )
    caller_session_id: str | None = Field(default=None, sa_type=String(64))
    parent_task_id: str | None = Field(default=None, sa_type=String(64))
    recursion_depth: int = 0
    state: str = Field(default="submitted", sa_type=String(24))
    error: str | None = Field(default=None, sa_type=Text)
    visible_in_sidebar: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default=text("0")))
    # What the caller asked, and the model's id for the call (links the chat's tool card to the task).
    input: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    tool_call_id: str | None = Field(default=None, sa_type=String(128))
    # The `messageId` an A2A client gave the input message (shown back in the task's history).
    input_message_id: str | None = Field(default=None, sa_type=String(255))
    # Totals of the callee's run, for the audit view.
    input_tokens: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default=text("0")))
    output_tokens: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default=text("0")))
    cost_usd: float | None = Field(default=None, sa_type=Float)  # the callee's run's price (migration 0012)
    created_at: datetime = _ts(default_factory=utcnow)
    updated_at: datetime = _ts(default_factory=utcnow)
    finished_at: datetime | None = _ts(nullable=True, default=None)


# -- A2A for outside callers (issue 6) ------------------------------------------------------


class ApiKey(SQLModel, table=True):
    """A key that an A2A client sends as `Authorization: Bearer <key>`; only its SHA-256 is kept."""

    __tablename__ = "api_keys"

    id: int | None = Field(default=None, primary_key=True)
    user_id: int = Field(sa_column=Column(Integer, ForeignKey("users.id", ondelete="CASCADE"), nullable=False))
    name: str = Field(sa_type=String(100))
    # The first characters of the key, shown in the UI so a key can be recognised without revealing it.
    prefix: str = Field(sa_type=String(16))
    key_hash: str = Field(sa_column=Column(String(64), unique=True, nullable=False))
    created_at: datetime = _ts(default_factory=utcnow)
    last_used_at: datetime | None = _ts(nullable=True, default=None)
    revoked_at: datetime | None = _ts(nullable=True, default=None)


class RemoteA2AAgent(SQLModel, table=True):
    """A remote A2A agent registered by the URL of its card; it rejoins the registry on start."""

    __tablename__ = "a2a_remote_agents"

    id: str = Field(sa_column=Column(String(64), primary_key=True))  # its id in the agent registry
    card_url: str = Field(sa_type=Text)
    card: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)  # the card as fetched at registration
    # Sent as `Authorization: Bearer <token>` to the remote agent, when it needs one.
    bearer_token: str | None = Field(default=None, sa_type=Text)
    created_by: int | None = Field(
        default=None, sa_column=Column(Integer, ForeignKey("users.id", ondelete="SET NULL"), nullable=True)
    )
    created_at: datetime = _ts(default_factory=utcnow)
    updated_at: datetime = _ts(default_factory=utcnow)


# -- A2A push notifications (issue 36) --------------------------------------------------------


class A2APushConfig(SQLModel, table=True):
    """Where an A2A caller wants a task's updates pushed (`CreateTaskPushNotificationConfig`), its own only.

    `token` and `auth_credentials` are sealed (`core/secret_box.py`): they go back to the caller's receiver.
    `deliveries` counts the notifications sent to this config (a task's total is capped).
    """

    __tablename__ = "a2a_push_configs"
    __table_args__ = (
        UniqueConstraint("task_id", "user_id", "config_id", name="uq_a2a_push_configs_task_user_config"),
        Index("idx_a2a_push_configs_task", "task_id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    task_id: str = Field(
        sa_column=Column(String(64), ForeignKey("a2a_task_sessions.id", ondelete="CASCADE"), nullable=False)
    )
    user_id: int = Field(sa_column=Column(Integer, ForeignKey("users.id", ondelete="CASCADE"), nullable=False))
    config_id: str = Field(sa_type=String(128))
    url: str = Field(sa_type=Text)
    token: str | None = Field(default=None, sa_type=Text)
    auth_scheme: str | None = Field(default=None, sa_type=String(64))
    auth_credentials: str | None = Field(default=None, sa_type=Text)
    deliveries: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default=text("0")))
    created_at: datetime = _ts(default_factory=utcnow)


class RemotePushWait(SQLModel, table=True):
    """A delegated task to a remote A2A agent that ends by push to `/a2a/push/{id}` (`A2A_REMOTE_PUSH`).

    Only the SHA-256 of the token the remote agent must send back is kept. `state` is `waiting` until the
    remote task's end arrives (by push, or read with `GetTask`), then its end state; `answer` is its result.
    """

    __tablename__ = "a2a_remote_push_waits"
    __table_args__ = (Index("idx_a2a_remote_push_waits_state", "state"),)

    id: str = Field(sa_column=Column(String(64), primary_key=True))
    task_id: str = Field(
        sa_column=Column(String(64), ForeignKey("a2a_task_sessions.id", ondelete="CASCADE"), nullable=False)
    )
    remote_agent_id: str = Field(sa_type=String(64))
    remote_task_id: str | None = Field(default=None, sa_type=String(255))
    token_hash: str = Field(sa_type=String(64))
    state: str = Field(default="waiting", sa_type=String(24))
    answer: str | None = Field(default=None, sa_type=Text)
    error: str | None = Field(default=None, sa_type=Text)
    created_at: datetime = _ts(default_factory=utcnow)
    finished_at: datetime | None = _ts(nullable=True, default=None)


# -- The broker's durable return path (issue 12) ---------------------------------------------


class BrokerTaskRecord(SQLModel, table=True):
    """A task dispatched through the broker (seed 003), kept so a restart can finish what it cut off.

    `finished_at` is empty while the task runs; its end (`state`, `finished_at` and the `result` inject's
    text) is written once, in one statement. At start, this instance's running tasks end with "interrupted
    by a server restart". `published_position` is how far the seed's injects reader has published the task
    to Redis (`core.broker.inject.RESULT_POSITION` once Redis has the result: until then it is sent again
    at the next start). `session_id` is set when the app's own chat dispatched the task: its notes belong in
    that chat session, where their positions say how far the chat inbox has read it.
    """

    __tablename__ = "broker_tasks"
    __table_args__ = (Index("idx_broker_tasks_running", "instance", "finished_at"),)

    id: str = Field(sa_column=Column(String(64), primary_key=True))
    instance: str = Field(sa_type=String(255))  # the app process that relays it (host:port)
    owner: str = Field(sa_type=String(64))  # `user:<id>`, `dispatch-token` or `open`
    target_agent: str = Field(sa_type=String(256))
    agent_name: str = Field(sa_type=String(200))
    chat_agent_id: Any = Field(sa_type=JSON)  # seed 003 `agentId`: 123 stays a number, "abc" a string
    chat_id: str = Field(sa_type=String(256))
    session_id: str | None = Field(default=None, sa_type=String(64))
    task: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    state: str = Field(default="submitted", sa_type=String(24))
    created_at: datetime = _ts(default_factory=utcnow)
    finished_at: datetime | None = _ts(nullable=True, default=None)
    result: str | None = Field(default=None, sa_type=Text)  # the `auto` inject's text, written with the end
    published_position: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default=text("0")))


# -- Files of chats and tasks (issue 36) ---------------------------------------------------------


def new_attachment_id() -> str:
    """Attachment ids are text with the `at_` prefix, like sessions' (`as_…`), unguessable."""
    return f"at_{secrets.token_hex(12)}"


class Attachment(SQLModel, table=True):
    """A file of a user's chat: attached to a message, or an artifact a delegated agent returned.

    Only its owner may read it (anyone else gets "not found"). The bytes are in `attachment_blobs`, so
    lists and messages never load them.
    """

    __tablename__ = "attachments"
    __table_args__ = (Index("idx_attachments_session", "session_id"),)

    id: str = Field(default_factory=new_attachment_id, sa_column=Column(String(64), primary_key=True))
    user_id: int = Field(sa_column=Column(Integer, ForeignKey("users.id", ondelete="CASCADE"), nullable=False))
    session_id: str | None = Field(
        default=None, sa_column=Column(String(64), ForeignKey("agent_sessions.id", ondelete="CASCADE"), nullable=True)
    )
    task_id: str | None = Field(default=None, sa_type=String(64))  # the delegated task that returned it
    name: str = Field(sa_type=String(255))
    mime: str = Field(sa_type=String(255))
    size: int = 0
    created_at: datetime = _ts(default_factory=utcnow)


class AttachmentBlob(SQLModel, table=True):
    """The bytes of one attachment."""

    __tablename__ = "attachment_blobs"

    id: str = Field(sa_column=Column(String(64), ForeignKey("attachments.id", ondelete="CASCADE"), primary_key=True))
    data: bytes = Field(sa_column=Column(LargeBinary, nullable=False))


__all__ = [
    "A2APushConfig",
    "A2ATaskSession",
    "Agent",
    "AgentMessage",
    "AgentSession",
    "AgentTool",
    "ApiKey",
    "Attachment",
    "AttachmentBlob",
    "BrokerTaskRecord",
    "ModelConnection",
    "RemoteA2AAgent",
    "RemotePushWait",
    "User",
    "new_attachment_id",
    "new_session_id",
    "new_task_id",
    "utcnow",
]


class ModelConnection(SQLModel, table=True):
    """The global model connection an admin set in the admin area (migration 0011); one row, id 1.

    Each field left empty falls back to the environment's (`DEFAULT_MODEL`, `LLM_API_BASE`, `LLM_API_KEY`).
    """

    __tablename__ = "model_connection"

    id: int | None = Field(default=None, primary_key=True)
    default_model: str | None = Field(default=None, sa_type=String(255))
    api_base: str | None = Field(default=None, sa_type=String(1000))
    api_key: str | None = Field(default=None, sa_type=Text)  # sealed by core/secret_box.py, never shown
    updated_at: datetime = _ts(default_factory=utcnow)
    updated_by: int | None = Field(default=None, sa_type=Integer)
