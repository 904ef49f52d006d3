"""The event-loop probe (core/web/loop_probe.py) that bench/bench_capacity.py reads: it sees a blocked loop."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import signal
import time

import pytest

from core.settings import Settings
from core.web.loop_probe import LINE_PREFIX, LoopProbe

BLOCK_WHERE = re.compile(r" ms at (?P<at>[0-9.]+) s over [0-9.]+ s \([0-9,]+ ticks, (?P<over_20>[0-9]+) over 20 ms\)")
GC_FIGURES = re.compile(r"longest gc (?P<ms>[0-9.]+) ms \(generation (?P<generation>-?[0-9])\), (?P<full>[0-9]+) full")


async def test_a_callback_that_holds_the_loop_is_reported_and_the_window_starts_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    probe = LoopProbe(interval_s=0.002)
    probe.start()
    try:
        await asyncio.sleep(0.05)  # the ticker runs
        time.sleep(0.12)  # holds the loop, as a long synchronous step would
        await asyncio.sleep(0.02)
        with caplog.at_level(logging.INFO, logger="core.web.loop_probe"):
            first = probe.report()
        await asyncio.sleep(0.05)
        second = probe.report()
        counted_after_report = probe.long_blocks
    finally:
        await probe.stop()

    assert first in caplog.text and first.startswith(LINE_PREFIX)
    blocked_ms = float(first.removeprefix(LINE_PREFIX).split()[0])
    assert blocked_ms >= 100  # the 120 ms block (less the interval it was due in)
    assert float(second.removeprefix(LINE_PREFIX).split()[0]) < blocked_ms  # a new window
    where = BLOCK_WHERE.search(first)
    assert where is not None, first
    assert 0.15 <= float(where["at"]) < 0.5  # it ended after the 50 ms of ticking and the 120 ms hold
    assert int(where["over_20"]) >= 1  # the hold (a busy machine may add a late tick of its own)
    assert BLOCK_WHERE.search(second) is not None and counted_after_report == 0  # a new window counts anew


STREAMING = re.compile(r"; while streams run: longest (?P<ms>[0-9.]+) ms, (?P<over_20>[0-9]+) over 20 ms$")


async def test_blocks_after_which_no_stream_is_live_are_left_out_of_the_streaming_figures() -> None:
    live = {"streams": True}
    probe = LoopProbe(interval_s=0.002, busy=lambda: live["streams"])
    probe.start()
    try:
        await asyncio.sleep(0.03)
        time.sleep(0.03)  # a block while streams run
        await asyncio.sleep(0.03)
        live["streams"] = False
        await asyncio.sleep(0.01)
        time.sleep(0.08)  # a longer one once they have ended (the app's full collection, say)
        await asyncio.sleep(0.03)
        line = probe.report()
        quiet = probe.report()
    finally:
        await probe.stop()

    overall_ms = float(line.removeprefix(LINE_PREFIX).split()[0])
    streaming = STREAMING.search(line)
    assert streaming is not None, line
    assert overall_ms >= 70  # the block after the streams ended is in the window's figures
    assert 25 <= float(streaming["ms"]) < 70, line  # and not in the streaming ones
    assert int(streaming["over_20"]) >= 1 and int(BLOCK_WHERE.search(line)["over_20"]) >= 2
    assert STREAMING.search(quiet)["over_20"] == "0"  # a new window
    assert STREAMING.search(LoopProbe().report()) is None  # without `busy`, the line is as before


async def test_garbage_collections_are_timed_apart_from_the_loop() -> None:
    probe = LoopProbe(interval_s=0.005)
    probe.start()
    try:
        probe.report()
        garbage = [[[] for _ in range(50)] for _ in range(20_000)]  # a heap a full collection has to walk
        gc.collect()
        del garbage
        line = probe.report()
        quiet = probe.report()
    finally:
        await probe.stop()
    found = GC_FIGURES.search(line)
    assert found is not None, line
    assert float(found["ms"]) > 0 and found["generation"] == "2" and int(found["full"]) >= 1
    assert GC_FIGURES.search(quiet)["full"] == "0"  # a new window
    assert probe._on_gc not in gc.callbacks  # stop() took the callback out


async def test_sigusr1_logs_the_window(caplog: pytest.LogCaptureFixture) -> None:
    probe = LoopProbe(interval_s=0.005)
    probe.start()
    try:
        with caplog.at_level(logging.INFO, logger="core.web.loop_probe"):
            await asyncio.sleep(0.03)
            os.kill(os.getpid(), signal.SIGUSR1)
            await asyncio.sleep(0.05)
    finally:
        await probe.stop()
    assert LINE_PREFIX in caplog.text
    assert signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None)  # stop() gave the signal back


def test_the_probe_is_off_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOP_PROBE", raising=False)
    assert Settings(_env_file=None).loop_probe is False
    monkeypatch.setenv("LOOP_PROBE", "1")
    assert Settings(_env_file=None).loop_probe is True
