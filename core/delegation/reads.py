"""A user's delegated tasks read back, for the pages and routes: `DelegationService`'s reads of its records."""

from __future__ import annotations

from core.delegation.tasks import TaskDetail, TaskRecords, TaskView
from models import A2ATaskSession


class TaskReads:
    """Mixed into `DelegationService`: what `TaskRecords` answers, for the task's owner only."""

    records: TaskRecords

    async def owned_task(self, user_id: int, task_id: str) -> A2ATaskSession | None:
        """The task if `user_id` owns the conversation it belongs to, else None."""
        return await self.records.owned_task(user_id, task_id)

    async def fail_interrupted(self) -> int:
        """At start-up: tasks still submitted or working were cut off by a stop; mark them failed."""
        return await self.records.fail_interrupted()

    async def tasks_of_session(self, user_id: int, session_id: str) -> list[TaskView]:
        """Every task started from a session, nested ones included, parents before children."""
        return await self.records.tasks_of_session(user_id, session_id)

    async def list_tasks(self, user_id: int, *, limit: int = 200) -> list[TaskView]:
        """A user's delegated tasks, newest first (the audit view)."""
        return await self.records.list_tasks(user_id, limit=limit)

    async def task_detail(self, user_id: int, task_id: str) -> TaskDetail | None:
        """One of the user's tasks with the callee's saved messages and its direct children."""
        return await self.records.task_detail(user_id, task_id)

    async def task_chain(self, user_id: int, task_id: str) -> list[TaskView]:
        """The whole delegation chain of one of the user's tasks, root first (the audit's waterfall)."""
        return await self.records.task_chain(user_id, task_id)
