"""Full garbage collections between streams, not in the middle of them (docs/ARCHITECTURE.md "The streaming hot path").

A full (generation 2) collection walks every tracked object the process holds and runs on the
event loop. With the start-up heap frozen (`app.py`), what is left is what the running turns
hold: with 100 streams, 70,000-80,000 objects and 25-60 ms measured here, in which no stream
moves. CPython starts one whenever enough objects have survived the young collections, which
under steady streaming is every few seconds, in the middle of whatever is streaming.

`FullCollections` takes that decision over: CPython keeps its young collections (cheap, and
they find most cyclic garbage), and full ones run from a task of their own when no stream is
live: as often as CPython would have asked for them, and once the last one is `quiet_after_s`
old. Under streaming that never pauses, one still runs every `max_interval_s`, so cyclic garbage
that reached the old generation is freed within that time whatever the load.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable

from core.aio import cancel_and_wait

log = logging.getLogger(__name__)

#: The old generation's threshold while the task decides: CPython never reaches it by itself.
_DEFERRED = 1_000_000


class FullCollections:
    """Run full garbage collections when nothing streams (and at least every `max_interval_s`).

    Args:
        busy: whether a stream is live now (the app: a hub buffer written or followed here).
        check_s: how often the task looks.
        max_interval_s: with streams live all the time, the longest time between two full collections.
        quiet_after_s: when nothing streams, a full collection runs once the last one is this old
            (if the young ones ran since), even before CPython would ask for one.
    """

    def __init__(
        self,
        busy: Callable[[], bool],
        *,
        check_s: float = 0.25,
        max_interval_s: float = 60.0,
        quiet_after_s: float = 5.0,
    ) -> None:
        self.busy = busy
        self.check_s = check_s
        self.max_interval_s = max_interval_s
        self.quiet_after_s = quiet_after_s
        self.collections = 0
        self._due_after = 10  # young collections between two full ones: CPython's own default threshold
        self._saved_thresholds: tuple[int, int, int] | None = None
        self._last = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Take full collections over from CPython, on the running loop."""
        young, middle, old = gc.get_threshold()
        self._saved_thresholds = (young, middle, old)
        self._due_after = old
        gc.set_threshold(young, middle, _DEFERRED)
        self._last = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="full garbage collections")

    async def stop(self) -> None:
        """Give full collections back to CPython."""
        await cancel_and_wait(self._task)
        self._task = None
        if self._saved_thresholds is not None:
            gc.set_threshold(*self._saved_thresholds)
            self._saved_thresholds = None

    def collect_if_due(self) -> bool:
        """One look: a full collection when CPython would want one and nothing streams, or when it is overdue."""
        young_collections = gc.get_count()[2]  # since the last full collection
        if young_collections == 0:
            return False
        since = time.monotonic() - self._last
        overdue = since >= self.max_interval_s
        if not overdue:
            if self.busy():
                return False
            # Quiet: what CPython would do, or sooner once the last one is a while back, so that
            # streams that start later begin with the longest time before one is overdue.
            if young_collections < self._due_after and since < self.quiet_after_s:
                return False
        started = time.perf_counter()
        gc.collect(2)
        self._last = time.monotonic()
        self.collections += 1
        log.debug(
            "full garbage collection: %.1f ms%s",
            (time.perf_counter() - started) * 1000,
            " (overdue)" if overdue else "",
        )
        return True

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.check_s)
            try:
                self.collect_if_due()
            except Exception:  # a `busy` that fails must not end full collections for good
                log.exception("the full garbage collection check failed")
