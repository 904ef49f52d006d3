"""Delegation's services as FastAPI dependencies, for the routes that use them (ground floor: `core.auth.deps`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from core.auth.deps import get_services
from core.delegation.agent_admin import AgentAdmin
from core.delegation.service import DelegationService


async def get_agent_admin(request: Request) -> AgentAdmin:
    """Agents as people list, create, change and delete them."""
    admin: AgentAdmin = get_services(request).agent_admin
    return admin


async def get_delegation(request: Request) -> DelegationService:
    """Delegated tasks: running them, and reading them back for their owner."""
    delegation: DelegationService = get_services(request).delegation
    return delegation


AgentAdminDep = Annotated[AgentAdmin, Depends(get_agent_admin)]
DelegationDep = Annotated[DelegationService, Depends(get_delegation)]
