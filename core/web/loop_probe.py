"""The event-loop probe: how long the loop was blocked at most, for the capacity benchmark.

Off by default (setting `LOOP_PROBE`, see docs/ARCHITECTURE.md "The streaming hot
path"); `bench/bench_capacity.py` turns it on. When on, a ticker task asks to be
woken every `interval_s`; how late it wakes is how long something held the loop
(a callback that ran without awaiting). It has no route: the figure is read by
sending the process `SIGUSR1`, which logs one line (wrapped here) and starts a new window::

    loop-probe: longest block 3.2 ms at 4.07 s over 12.41 s (1,873 ticks, 0 over 20 ms);
    longest gc 2.1 ms (generation 2), 3 full

"at" is when the longest block ended, counted from the window's start, and "over 20 ms" counts the
blocks longer than the issue 19 goal, so a block in the turns' start-up tells itself apart from
blocks while the streams run. Given a `busy` callable (the app: a stream is live), the line ends with
the same two figures for the blocks after which a stream was still live: a full garbage
collection that `core/web/full_collections.py` runs once the last stream has ended holds up no
stream, and is left out there (it still counts in the first figures)::

    ...; while streams run: longest 2.9 ms, 0 over 20 ms

`busy` is asked only after a block longer than `BUSY_ASKED_AFTER_S`, so the longest block while
streams run is exact from that length up (below it, the line shows 0.0).

The garbage collector's own pauses are timed too (`gc.callbacks`): the longest one in
the window, its generation, and how many full (generation 2) collections ran, so a
block can be told apart from a collection. Nothing is reachable over the network, on
or off. The ticker costs one wake-up per interval (200/s at the default 5 ms), which is
why it is not always on.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Callable
from typing import Any

from core.aio import cancel_and_wait

log = logging.getLogger(__name__)

LINE_PREFIX = "loop-probe: longest block"
#: Blocks longer than this are counted apart (the goal of issue 19: none at N=100).
LONG_BLOCK_S = 0.020
#: `busy` is asked only after a block longer than this: the app's answer walks the hub's buffers.
BUSY_ASKED_AFTER_S = 0.001


class LoopProbe:
    """A ticker that records the longest time the event loop did not run it when due.

    Args:
        interval_s: how often the ticker asks to run; blocks shorter than this may go unseen.
        busy: whether a stream is live now; when given, blocks after which one was are also
            counted apart ("while streams run").
    """

    def __init__(self, interval_s: float = 0.005, busy: Callable[[], bool] | None = None) -> None:
        self.interval_s = interval_s
        self.busy = busy
        self.longest_streaming_s = 0.0
        self.streaming_long_blocks = 0
        self.longest_s = 0.0
        self.longest_at_s = 0.0
        self.long_blocks = 0
        self.ticks = 0
        self.window_start = time.perf_counter()
        self.longest_gc_s = 0.0
        self.longest_gc_generation = -1
        self.full_collections = 0
        self._gc_started = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start ticking on the running loop, and report on SIGUSR1 (where the loop can take signals)."""
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._tick(), name="loop-probe")
        gc.callbacks.append(self._on_gc)
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread / Windows
            loop.add_signal_handler(signal.SIGUSR1, self.report)
        log.info("loop-probe: on (interval %.1f ms); send SIGUSR1 for the longest block", self.interval_s * 1000)

    async def stop(self) -> None:
        """Stop ticking (and listening to SIGUSR1), and log the last window."""
        if self._task is None:
            return
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_gc)
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            self._task.get_loop().remove_signal_handler(signal.SIGUSR1)
        await cancel_and_wait(self._task)
        self._task = None
        self.report()

    def report(self) -> str:
        """Log the longest block since the last report, and start a new window; returns the line."""
        now = time.perf_counter()
        line = (
            f"{LINE_PREFIX} {self.longest_s * 1000:.1f} ms at {self.longest_at_s:.2f} s "
            f"over {now - self.window_start:.2f} s ({self.ticks:,} ticks, {self.long_blocks} over "
            f"{LONG_BLOCK_S * 1000:.0f} ms); longest gc {self.longest_gc_s * 1000:.1f} ms "
            f"(generation {self.longest_gc_generation}), {self.full_collections} full"
        )
        if self.busy is not None:
            line += (
                f"; while streams run: longest {self.longest_streaming_s * 1000:.1f} ms, "
                f"{self.streaming_long_blocks} over {LONG_BLOCK_S * 1000:.0f} ms"
            )
        log.info("%s", line)
        self.longest_s, self.longest_at_s, self.long_blocks, self.ticks, self.window_start = 0.0, 0.0, 0, 0, now
        self.longest_streaming_s, self.streaming_long_blocks = 0.0, 0
        self.longest_gc_s, self.longest_gc_generation, self.full_collections = 0.0, -1, 0
        return line

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        took = time.perf_counter() - self._gc_started
        if info["generation"] == 2:
            self.full_collections += 1
        if took > self.longest_gc_s:
            self.longest_gc_s, self.longest_gc_generation = took, info["generation"]

    async def _tick(self) -> None:
        interval = self.interval_s
        due = time.perf_counter() + interval
        while True:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            now = time.perf_counter()
            late = now - due
            if late > self.longest_s:
                self.longest_s, self.longest_at_s = late, now - self.window_start
            if late > LONG_BLOCK_S:
                self.long_blocks += 1
            if late > BUSY_ASKED_AFTER_S and self.busy is not None and self.busy():
                self.longest_streaming_s = max(self.longest_streaming_s, late)
                if late > LONG_BLOCK_S:
                    self.streaming_long_blocks += 1
            self.ticks += 1
            due = now + interval
