"""The chat's services as FastAPI dependencies, for the routes that use them (ground floor: `core.auth.deps`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from core.auth.deps import get_services
from core.chat.engine import ChatEngine


async def get_chat(request: Request) -> ChatEngine:
    """The chat engine: turns, their cancelling and whether one runs."""
    chat: ChatEngine = get_services(request).chat
    return chat


ChatDep = Annotated[ChatEngine, Depends(get_chat)]
