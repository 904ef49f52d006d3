"""The one free-port helper of the tests, the e2e tests and the benchmarks: the testing kit's.

`scripts/smoke_check.py` keeps its own copy on purpose: it runs with a bare interpreter, before
and without the project installed, to check the environment it is given.
"""

from __future__ import annotations

from a2a_chat_testing.app import free_port

__all__ = ["free_port"]
