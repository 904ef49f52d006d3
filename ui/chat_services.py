"""The services the chat page and its parts use, and nothing more of the composition."""

from __future__ import annotations

from dataclasses import dataclass

from core.auth import AuthState
from core.chat.engine import ChatEngine
from core.chat.workspace import Workspace
from core.delegation import DelegationService
from core.settings import Settings
from core.streaming.backend import StreamHubBackend


@dataclass(frozen=True, slots=True)
class ChatServices:
    """What `ChatPage` reads: built once by `ui.register_pages` from `core.services.Services`."""

    auth: AuthState
    chat: ChatEngine
    delegation: DelegationService
    hub: StreamHubBackend
    settings: Settings
    workspace: Workspace
