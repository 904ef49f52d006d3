"""The project's exception base: every error the app raises on purpose is an `AppError`.

Each subclass names a stable machine `code` (a class attribute, snake_case, unique across the project) so
that a handler, a log line or a test can tell errors apart without reading their messages, which are for
people and may be translated. Some errors also keep the base a library expects (`ValueError`, Starlette's
`HTTPException`, httpx's `TransportError`, the A2A SDK's `A2AError`): they inherit from both, `AppError`
first. This module is the bottom of the `core` layering (pyproject.toml, `[tool.importlinter]`): any core
module may import it, and it imports nothing of the app.
"""

from __future__ import annotations

__all__ = ["AppError"]


class AppError(Exception):
    """The root of the app's own errors; `code` is stable for machines, the message is for people."""

    code: str = "app_error"
