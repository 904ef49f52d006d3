"""Who holds a session's turn: the claims `ChatEngine` takes before a turn writes anything.

One turn at a time per session: `TurnClaims.claim` takes the session's turn in one step
(a check and a set with no await between them), so concurrent sends in this process
cannot both pass, and refuses a user who has `limit` turns claimed here. In a cluster
(`shared`), `claim_shared` also opens the session's buffer in the shared hub, which is
atomic across replicas. A claim is released when its turn ends, or when starting the
turn failed (`release_unlaunched`).

Also the two records a turn's start hands out: `TurnStarted` (to its caller) and
`SessionChange` (to the pages watching the session).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.chat.errors import TooManyRunningTurnsError, TurnInProgressError
from core.i18n import format_number, ngettext
from core.streaming.backend import StreamHubBackend
from core.streaming.hub import StreamBusyError
from models import AgentMessage

log = logging.getLogger(__name__)

__all__ = ["SessionChange", "TurnClaim", "TurnClaims", "TurnStarted"]


@dataclass(frozen=True, slots=True)
class TurnStarted:
    """What `ChatEngine.start_turn` returns at once.

    Attributes:
        session_id: the session.
        user_message_id: the saved user message.
        stream_key: the hub key of the turn's events.
        after_event_id: subscribe after this id to receive exactly this turn's events.
    """

    session_id: str
    user_message_id: int
    stream_key: str
    after_event_id: int


@dataclass(frozen=True, slots=True)
class SessionChange:
    """What changed in a session, for the pages showing it (`ChatEngine.watch`).

    Attributes:
        session_id: the session.
        messages: rows saved outside a page's own turn (a turn's user message, background task notes).
        turn: the turn that started, if one did (follow its events from `turn.after_event_id`).
        rewound: the chat was rewound to its last user message (regenerate, edit and send again): show it
            again from its saved messages before following the turn.
    """

    session_id: str
    messages: list[AgentMessage] = field(default_factory=list)
    turn: TurnStarted | None = None
    rewound: bool = False


@dataclass(slots=True, eq=False)
class TurnClaim:
    """A session's turn, from its claim (before anything is saved) until it ends."""

    ended: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[Any] | None = None  # set once the turn runs
    shared: bool = False  # its buffer was opened in a cluster's shared hub by the claim
    user_id: int | None = None  # whose turn it is (`max_running_turns_per_user`)


class TurnClaims:
    """The claimed turns of this process, by session id.

    Args:
        hub: where a cluster's claim opens the session's buffer.
        shared: the hub is a cluster's shared hub (claims are opened there too).
    """

    def __init__(self, hub: StreamHubBackend, *, shared: bool) -> None:
        self.hub = hub
        self.shared = shared
        self._by_session: dict[str, TurnClaim] = {}

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._by_session

    def __len__(self) -> int:
        return len(self._by_session)

    def get(self, session_id: str) -> TurnClaim | None:
        """The session's claim in this process, if any."""
        return self._by_session.get(session_id)

    def claim(
        self, session_id: str, busy_message: str, *, user_id: int | None = None, limit: int | None = None
    ) -> TurnClaim:
        """Take the session's turn, or raise TurnInProgressError(busy_message) when it is taken.

        With a `limit`, raise TooManyRunningTurnsError when `user_id` has that many turns claimed here.

        Atomic because nothing awaits between the checks and the set: concurrent sends (the
        same event loop) cannot both pass. This guards one process; a cluster's replicas also
        claim the session in the shared hub (`claim_shared`) and count the user's turns in the
        database (`ChatEngine.start_turn`).
        """
        if session_id in self._by_session:
            raise TurnInProgressError(busy_message)
        if limit is not None and sum(1 for c in self._by_session.values() if c.user_id == user_id) >= limit:
            raise TooManyRunningTurnsError(limit_message(limit))
        claim = self._by_session[session_id] = TurnClaim(user_id=user_id)
        return claim

    async def claim_shared(
        self, session_id: str, busy_message: str, *, user_id: int | None = None, limit: int | None = None
    ) -> TurnClaim:
        """`claim`, and in a cluster the session's buffer opened in the shared hub (atomic across replicas)."""
        claim = self.claim(session_id, busy_message, user_id=user_id, limit=limit)
        if self.shared:
            try:
                await self.hub.create(session_id, meta={})
            except BaseException as exc:
                self.release(session_id, claim)
                if isinstance(exc, StreamBusyError):
                    raise TurnInProgressError(busy_message) from exc
                raise
            claim.shared = True
        return claim

    def release(self, session_id: str, claim: TurnClaim) -> None:
        """The claim's turn is over: the session takes a new one, and whoever waits for the end is woken."""
        if self._by_session.get(session_id) is claim:
            del self._by_session[session_id]
        claim.ended.set()

    async def release_unlaunched(self, session_id: str, claim: TurnClaim) -> None:
        """On the way out of a start: a claim whose turn never ran is given back (a running turn gives back its own)."""
        if claim.task is None:
            self.release(session_id, claim)
            if claim.shared:  # the buffer opened for the claim ends with nothing in it
                with contextlib.suppress(Exception):
                    await self.hub.finish(session_id)


def limit_message(limit: int) -> str:
    """The refusal of a turn over the user's limit of running turns."""
    return ngettext(
        "You already have {limit} answer being written, the most one account may have at once. "
        "Wait for it to finish, or stop it, then send again.",
        "You already have {limit} answers being written, the most one account may have at once. "
        "Wait for one to finish, or stop one, then send again.",
        limit,
    ).format(limit=format_number(limit))


class SessionWatchers:
    """The pages watching each session (`ChatEngine.watch`), and telling them of a change."""

    def __init__(self) -> None:
        self._by_session: dict[str, list[Callable[[SessionChange], None]]] = {}

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._by_session

    def add(self, session_id: str, listener: Callable[[SessionChange], None]) -> Callable[[], None]:
        """Call `listener` for each change of the session; returns the unwatch."""
        self._by_session.setdefault(session_id, []).append(listener)

        def unwatch() -> None:
            listeners = self._by_session.get(session_id, [])
            if listener in listeners:
                listeners.remove(listener)
            if not listeners:
                self._by_session.pop(session_id, None)

        return unwatch

    def notify(self, change: SessionChange) -> None:
        """Tell the session's watchers; one that fails is logged, the others are still told."""
        for listener in list(self._by_session.get(change.session_id, ())):
            try:
                listener(change)
            except Exception:  # a page's bug must not break the turn
                log.exception("a watcher of session %s failed", change.session_id)
