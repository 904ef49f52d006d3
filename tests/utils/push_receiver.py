"""A webhook that records the A2A push notifications it gets, on a live port of 127.0.0.1 (issue 36)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.utils.live_server import live_server


@dataclass
class Receiver:
    """What came: each notification's headers and JSON body, in order; `fail_first` answers 500 that many times."""

    url: str = ""
    fail_first: int = 0
    got: list[tuple[dict[str, str], Any]] = field(default_factory=list)
    refused: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bodies(self) -> list[Any]:
        """The bodies taken (the 500s left out)."""
        with self.lock:
            return [body for _, body in self.got]

    def states(self) -> list[str]:
        """The task state of each notification taken."""
        return [b.get("task", {}).get("status", {}).get("state", "") for b in self.bodies()]

    def wait_for(self, state: str, timeout: float = 20.0) -> None:
        """Until a notification with this state came."""
        deadline = time.monotonic() + timeout
        while state not in self.states():
            assert time.monotonic() < deadline, f"no {state} notification, got {self.states()}"
            time.sleep(0.05)


@contextmanager
def push_receiver(*, fail_first: int = 0) -> Iterator[Receiver]:
    """Serve a receiver at `<url>/hook` until the block ends."""
    receiver = Receiver(fail_first=fail_first)

    async def hook(request: Request) -> Response:
        body = await request.json()
        with receiver.lock:
            if receiver.refused < receiver.fail_first:
                receiver.refused += 1
                return JSONResponse({"error": "not now"}, status_code=500)
            receiver.got.append((dict(request.headers), body))
        return Response(status_code=204)

    with live_server(Starlette(routes=[Route("/hook", hook, methods=["POST"])])) as url:
        receiver.url = f"{url}/hook"
        yield receiver
