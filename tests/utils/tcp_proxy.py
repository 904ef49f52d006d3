"""A TCP proxy to Redis that runs on a thread of its own, so processes started by a test can be cut off from Redis.

`TcpProxy` (tests/utils/broker.py) runs on the test's event loop, which a test that starts and waits for
`python app.py` replicas blocks; this one keeps proxying meanwhile. `cut()` closes every proxied connection and
stops listening (a new connection is refused: Redis looks down), `restore()` listens again on the same port.
Nothing touches the shared Redis server itself.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlparse

from tests.utils.broker import TcpProxy


class ThreadedTcpProxy:
    """`TcpProxy` on a daemon thread's event loop; `url` is the proxied Redis URL."""

    def __init__(self, redis_url: str) -> None:
        target = urlparse(redis_url)
        self._path = target.path or "/0"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="redis proxy", daemon=True)
        self._thread.start()
        self._proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 6379)
        self._run(self._proxy.start())

    @property
    def url(self) -> str:
        """The Redis URL through the proxy."""
        return f"redis://127.0.0.1:{self._proxy.port}{self._path}"

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=30)

    def cut(self) -> None:
        """Close every proxied connection and refuse new ones."""
        self._run(self._proxy.cut())

    def restore(self) -> None:
        """Accept connections again (on the same port)."""
        self._run(self._proxy.restore())

    def close(self) -> None:
        """Stop proxying and the thread."""
        self._run(self._proxy.cut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


@contextmanager
def threaded_proxy(redis_url: str) -> Iterator[ThreadedTcpProxy]:
    """A `ThreadedTcpProxy` to `redis_url`, closed at the end."""
    proxy = ThreadedTcpProxy(redis_url)
    try:
        yield proxy
    finally:
        proxy.close()
