"""Full garbage collections between streams (core/web/full_collections.py): CPython's own ones are off meanwhile."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator

import pytest

from core.streaming.hub import StreamHub
from core.web.full_collections import FullCollections


class Cycle:
    def __init__(self) -> None:
        self.me = self


def make_cyclic_garbage(rounds: int = 100) -> None:
    """Enough cyclic garbage for many young collections (each bumps the old generation's count)."""
    for _ in range(rounds):
        for _ in range(2_000):
            Cycle()


async def eventually(condition, timeout_s: float = 5.0) -> None:
    """Wait until `condition()` holds (the check runs every 10 ms; a loaded machine is slower)."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


@pytest.fixture
def full_runs() -> Iterator[list[float]]:
    """The times of the full collections that run meanwhile."""
    runs: list[float] = []

    def note(phase: str, info: dict) -> None:
        if phase == "stop" and info["generation"] == 2:
            runs.append(asyncio.get_event_loop().time())

    # CPython's default thresholds: a pacer an earlier test left running would have deferred the old
    # generation, and this module's garbage would then never make a full collection due.
    thresholds = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    gc.collect()
    gc.callbacks.append(note)
    try:
        yield runs
    finally:
        gc.callbacks.remove(note)
        gc.set_threshold(*thresholds)


async def test_no_full_collection_while_streams_are_live_until_one_is_overdue(full_runs: list[float]) -> None:
    pacer = FullCollections(busy=lambda: True, check_s=0.01, max_interval_s=0.6)
    pacer.start()
    try:
        started = asyncio.get_running_loop().time()
        while asyncio.get_running_loop().time() - started < 0.4:
            make_cyclic_garbage(5)  # CPython would have run several full collections for this
            await asyncio.sleep(0.01)
        assert gc.get_count()[2] > 10 and full_runs == []
        await eventually(lambda: full_runs)  # past max_interval_s: one runs although streams are live
        assert len(full_runs) == 1 and pacer.collections == 1
    finally:
        await pacer.stop()


async def test_when_nothing_streams_full_collections_run_as_cpython_would(full_runs: list[float]) -> None:
    live = {"streams": 0}
    pacer = FullCollections(busy=lambda: live["streams"] > 0, check_s=0.01, max_interval_s=60, quiet_after_s=60)
    pacer.start()
    try:
        make_cyclic_garbage()
        await eventually(lambda: pacer.collections >= 1)
        assert len(full_runs) >= 1
        live["streams"] = 1
        runs = len(full_runs)
        make_cyclic_garbage()
        await asyncio.sleep(0.1)
        assert len(full_runs) == runs  # a stream started: they wait
        live["streams"] = 0
        await eventually(lambda: len(full_runs) > runs)  # it ended: the one that was due runs
        assert len(full_runs) == runs + 1
    finally:
        await pacer.stop()


async def test_stop_gives_full_collections_back_to_cpython() -> None:
    before = gc.get_threshold()
    pacer = FullCollections(busy=lambda: False)
    pacer.start()
    assert gc.get_threshold()[:2] == before[:2] and gc.get_threshold()[2] > 100_000
    await pacer.stop()
    assert gc.get_threshold() == before


async def test_a_failing_check_is_logged_and_the_task_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    calls = {"n": 0}

    def busy() -> bool:
        calls["n"] += 1
        raise RuntimeError("hub gone")

    pacer = FullCollections(busy=busy, check_s=0.01, max_interval_s=60, quiet_after_s=0)
    pacer.start()
    try:
        with caplog.at_level(logging.ERROR, logger="core.web.full_collections"):
            for _ in range(3):
                make_cyclic_garbage(3)
                await asyncio.sleep(0.03)
    finally:
        await pacer.stop()
    assert calls["n"] >= 2 and "check failed" in caplog.text


async def test_the_hub_counts_its_live_streams() -> None:
    hub = StreamHub()
    assert hub.live_streams() == 0
    await hub.create("a")
    await hub.create("b")
    await hub.append("a", "text-delta", {"delta": "hi"})
    assert hub.live_streams() == 2
    await hub.finish("a")
    assert hub.live_streams() == 1  # a finished buffer kept for replay is not live
    await hub.finish("b", error="gone")
    assert hub.live_streams() == 0
