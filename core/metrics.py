"""Prometheus metrics of this process (`GET /metrics`, docs/ARCHITECTURE.md, "Metrics").

The counters and histograms are module-level (one process serves one app; in a cluster each
replica serves its own), in a registry of their own so nothing else's metrics mix in. What is a
level rather than a count (turns and streams running, broker agents connected) is read when
scraped, from the `Services` that started last (`set_sources`), so no code path has to keep a
gauge in step.

Names follow Prometheus's conventions: `a2a_chat_` prefix, `_total` for counters, base units
(seconds). Labels are bounded sets: outcomes and states are the app's own words, agents and models
are the ones configured (never a person's text).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry(auto_describe=True)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TURNS_STARTED = Counter(
    "a2a_chat_turns_started_total",
    "Agent runs started: a chat turn, or a delegated task's run",
    ["kind"],
    registry=REGISTRY,
)
TURNS_FINISHED = Counter(
    "a2a_chat_turns_finished_total",
    "Agent runs ended, by outcome (complete, canceled, error)",
    ["kind", "outcome"],
    registry=REGISTRY,
)
TOKENS = Counter(
    "a2a_chat_model_tokens_total",
    "Model tokens, in (prompt) and out (answer), by agent and model",
    ["direction", "agent", "model"],
    registry=REGISTRY,
)
TIME_TO_FIRST_TOKEN = Histogram(
    "a2a_chat_time_to_first_token_seconds",
    "From a run's start to its first streamed token",
    ["kind"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
    registry=REGISTRY,
)
INTER_TOKEN_DELAY = Histogram(
    "a2a_chat_inter_token_delay_seconds",
    "Between two streamed tokens of one model call",
    buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 5),
    registry=REGISTRY,
)
DELEGATED_TASKS = Counter(
    "a2a_chat_delegated_tasks_total",
    "Delegated tasks ended, by end state and callee",
    ["state", "callee"],
    registry=REGISTRY,
)
BROKER_TASKS = Counter("a2a_chat_broker_tasks_total", "Broker tasks ended, by end state", ["state"], registry=REGISTRY)
OUTBOUND_REFUSED = Counter(
    "a2a_chat_outbound_refused_total",
    "Outgoing requests refused by the outbound policy",
    ["reason"],
    registry=REGISTRY,
)
EVENT_LOOP_BLOCKS = Counter(
    "a2a_chat_event_loop_blocks_total",
    "Times the event loop was held for more than 20 ms (streams stall meanwhile)",
    registry=REGISTRY,
)
LOGINS_THROTTLED = Counter(
    "a2a_chat_logins_throttled_total", "Login attempts refused for too many failures", registry=REGISTRY
)


@dataclass
class Sources:
    """Where the levels are read at a scrape (set by `Services.start`)."""

    turns_running: Callable[[], int]
    streams_open: Callable[[], int]
    broker_agents: Callable[[], int]
    broker_tasks_running: Callable[[], int]


_sources: Sources | None = None


def set_sources(sources: Sources | None) -> None:
    """The running app's levels (None when it stops)."""
    global _sources
    _sources = sources


class _Levels(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        if _sources is None:
            return
        for name, doc, read in (
            ("a2a_chat_turns_running", "Chat turns running in this process", _sources.turns_running),
            (
                "a2a_chat_streams_open",
                "Hub streams this process writes or reads for its subscribers",
                _sources.streams_open,
            ),
            ("a2a_chat_broker_agents_connected", "Broker agents connected to this process", _sources.broker_agents),
            ("a2a_chat_broker_tasks_running", "Broker tasks this process relays now", _sources.broker_tasks_running),
        ):
            yield GaugeMetricFamily(name, doc, value=read())


REGISTRY.register(_Levels())


BLOCK_THRESHOLD_S = 0.020  # a hold longer than this is a block: a token at 50/s is due every 20 ms
WATCH_INTERVAL_S = 0.1


async def watch_event_loop(interval_s: float = WATCH_INTERVAL_S, threshold_s: float = BLOCK_THRESHOLD_S) -> None:
    """Count the event loop's blocks: each wake-up later than `threshold_s` past its time is one.

    Ten wake-ups a second cost nothing measurable; `LOOP_PROBE` (core/web/loop_probe.py) measures
    finely for the benchmarks.
    """
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        if loop.time() - due > threshold_s:
            EVENT_LOOP_BLOCKS.inc()


def exposition() -> bytes:
    """The text a Prometheus scrape reads."""
    return generate_latest(REGISTRY)
