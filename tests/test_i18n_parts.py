"""Issue 40, item 5: texts built from parts (states, reasons, labels) are Chinese on Chinese screens too.

`tests/test_i18n_catalog.py` checks every *marked* text is translated. A text put together from
parts that were never marked (a state word the broker reports, Redis's state, an exception's
reason, a "(agent deleted)" mark glued to a name) passes that check and still shows English. These
tests build each such text the way the pages do, in zh_CN, for every value its parts can take, and
fail on any English word left in it.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from core.broker.relay import TIMEOUT
from core.delegation import STATE_WORDS, state_label
from core.delegation.runs import RemoteRun
from core.delegation.states import CONNECTION_LOST, TIMED_OUT
from core.delegation.tasks import DELETED_MARK
from core.i18n import _, use_language
from ui import broker_page
from ui.agents_page import KIND_LABELS, LIMITS

# Words a Chinese screen may keep: names and ids of agents, and product words.
ALLOWED = {"Redis", "Echo", "A2A", "LiteLLM", "HTTP"}
_LATIN_WORD = re.compile(r"[A-Za-z]{2,}")


def english_left(text: str) -> list[str]:
    """The Latin words in `text` that a Chinese reader should not see."""
    return [w for w in _LATIN_WORD.findall(text) if w not in ALLOWED]


# Every state a broker task can be in: A2A's words, the broker's own `timeout`, and its counters' `running`.
BROKER_STATES = sorted({*STATE_WORDS, TIMEOUT, "running"})
REDIS_STATES = ["disabled", "up", "down"]


def test_every_state_and_reason_of_a_delegation_reads_in_chinese() -> None:
    with use_language("zh_CN"):
        for state in [*STATE_WORDS, None]:
            for has_text in (True, False):
                for reason in (None, TIMED_OUT, CONNECTION_LOST):
                    label = state_label(state, has_text=has_text, reason=reason)
                    assert not english_left(label), (state, has_text, reason, label)


@pytest.mark.parametrize("state", BROKER_STATES)
def test_every_broker_state_reads_in_chinese(state: str) -> None:
    with use_language("zh_CN"):
        assert not english_left(broker_page.state_text(state)), broker_page.state_text(state)


@pytest.mark.parametrize("redis", REDIS_STATES)
def test_the_broker_counters_read_in_chinese_whatever_the_states(redis: str) -> None:
    """/broker's counters: "Tasks finished" lists each state with its count, "Redis" its state."""
    stats = {
        "agentsOnline": 1,
        "tasks": {"byState": {state: 1 for state in BROKER_STATES}},
        "eventsRelayed": 3,
        "injects": {"sent": 2, "throttled": 0, "dropped": 0},
        "connections": {"total": 1, "refused": 0},
    }
    broker = SimpleNamespace(stats=lambda: stats, health=lambda: {"redis": redis, "outbox": 2})
    with use_language("zh_CN"):
        for title, value in broker_page.counters(broker):  # type: ignore[arg-type]
            shown = f"{_(title)} {value}"
            assert not english_left(shown), shown


def test_the_redis_states_are_the_inject_publishers() -> None:
    """The page has a word for each state `InjectPublisher.state` can take."""
    from core.broker.inject import InjectPublisher

    publisher = InjectPublisher.__new__(InjectPublisher)
    seen = set()
    for url, up in ((None, False), ("redis://x", True), ("redis://x", False)):
        publisher.redis_url, publisher._up = url, up
        seen.add(publisher.state)
    assert seen == set(REDIS_STATES) == set(broker_page.REDIS_STATES)


def test_the_deleted_agent_mark_and_the_pages_labels_read_in_chinese() -> None:
    with use_language("zh_CN"):
        for part in [DELETED_MARK, *KIND_LABELS.values(), *(label for _key, label in LIMITS)]:
            assert not english_left(_(part)), part


class _Hub:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any] | None]] = []

    async def append(self, key: str, type: str, data: dict[str, Any] | None = None) -> int:
        self.events.append((type, data))
        return len(self.events)


class _LostAgent:
    """A broker agent whose socket closes mid-stream (the broker's own English reason)."""

    name = "Echo"

    async def stream(self, text: str, *, task_id: str, ask: Any = None) -> AsyncIterator[Any]:
        raise ConnectionError("Echo disconnected (the agent disconnected)")
        yield  # an async generator


@pytest.mark.parametrize("failure", ["lost", "no final state"])
async def test_a_remote_agents_failure_reads_in_chinese(failure: str) -> None:
    """Was English on a Chinese screen: "Echo is unreachable: … (the agent disconnected)"."""

    class _NoEnd(_LostAgent):
        async def stream(self, text: str, *, task_id: str, ask: Any = None) -> AsyncIterator[Any]:
            for _i in ():
                yield _i

    record = RemoteRun(agent_id="echo", fields={})
    hub = _Hub()
    with use_language("zh_CN"):
        await record.relay(hub, "a2a_t1", _LostAgent() if failure == "lost" else _NoEnd(), "hi", "t1")  # type: ignore[arg-type]
    assert record.state == "failed" and record.error
    assert not english_left(record.error), record.error
    [(kind, data)] = [e for e in hub.events if e[0] == "error"]
    assert data and not english_left(str(data.get("errorText"))), data
