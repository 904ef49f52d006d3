"""The one free-port helper of the tests, the e2e tests and the benchmarks (standard library only).

`scripts/smoke_check.py` keeps its own copy on purpose: it runs with a bare interpreter, before
and without the project installed, to check the environment it is given.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
