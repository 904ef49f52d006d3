"""Push notification configs of A2A callers (issue 36): the rows of `a2a_push_configs`, one caller's own only.

A config belongs to the task and to the caller (the API key's user) that set it: another caller's config,
like another caller's task, is not there for them. The token and the credentials a config carries are
sealed at rest (`core/secret_box.py`) and opened only to be sent to the config's own URL.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any

from sqlalchemy import func, update
from sqlmodel import col, select

from core.a2a.protocol.push import PushConfig
from core.errors import AppError
from models import A2APushConfig


class TooManyPushConfigsError(AppError, ValueError):
    """A caller set as many configs on a task as `A2A_PUSH_MAX_CONFIGS_PER_TASK` allows."""

    code = "too_many_push_configs"


class PushConfigStore:
    """Configs by task and caller.

    Args:
        db: the database.
        seal: makes the stored form of a secret; `unseal` reads it back.
        max_per_task: configs one caller may have on one task.
    """

    def __init__(self, db: Any, *, seal: Callable[[str], str], unseal: Callable[[str], str], max_per_task: int) -> None:
        self.db = db
        self._seal = seal
        self._unseal = unseal
        self.max_per_task = max_per_task

    async def put(self, config: PushConfig, *, user_id: int) -> PushConfig:
        """Create the config, or replace the caller's config of the same id on the task.

        Raises:
            TooManyPushConfigsError: a new config over the cap.
        """
        async with self.db.session() as s:
            row = await self._row(s, config.task_id, user_id, config.config_id)
            if row is None:
                count = (
                    await s.exec(
                        select(func.count())
                        .select_from(A2APushConfig)
                        .where(A2APushConfig.task_id == config.task_id, A2APushConfig.user_id == user_id)
                    )
                ).one()
                if count >= self.max_per_task:
                    raise TooManyPushConfigsError(
                        f"Task {config.task_id} already has {count} push notification configs of yours, the most "
                        f"allowed: delete one (DeleteTaskPushNotificationConfig) or replace one by its id."
                    )
                row = A2APushConfig(task_id=config.task_id, user_id=user_id, config_id=config.config_id, url="")
            row.url = config.url
            row.token = self._seal(config.token) if config.token else None
            row.auth_scheme = config.auth_scheme
            row.auth_credentials = self._seal(config.auth_credentials) if config.auth_credentials else None
            s.add(row)
            await s.commit()
        return config

    async def get(self, task_id: str, config_id: str, *, user_id: int) -> PushConfig | None:
        """The caller's config, or None."""
        async with self.db.read() as s:
            row = await self._row(s, task_id, user_id, config_id)
            return self._plain(row) if row is not None else None

    async def list(self, task_id: str, *, user_id: int) -> list[PushConfig]:
        """The caller's configs of the task, oldest first."""
        async with self.db.read() as s:
            rows = (
                await s.exec(
                    select(A2APushConfig)
                    .where(A2APushConfig.task_id == task_id, A2APushConfig.user_id == user_id)
                    .order_by(col(A2APushConfig.id))
                )
            ).all()
        return [self._plain(r) for r in rows]

    async def delete(self, task_id: str, config_id: str, *, user_id: int) -> bool:
        """Delete the caller's config; False when there was none."""
        async with self.db.session() as s:
            row = await self._row(s, task_id, user_id, config_id)
            if row is None:
                return False
            await s.delete(row)
            await s.commit()
        return True

    async def for_dispatch(self, task_id: str) -> tuple[builtins.list[PushConfig], int]:
        """Every caller's configs of the task, and the notifications already sent for it (all configs)."""
        async with self.db.read() as s:
            rows = (
                await s.exec(
                    select(A2APushConfig).where(A2APushConfig.task_id == task_id).order_by(col(A2APushConfig.id))
                )
            ).all()
        return [self._plain(r) for r in rows], sum(r.deliveries for r in rows)

    async def count_delivery(self, config: PushConfig) -> None:
        """One more notification sent to `config` (it may have been deleted meanwhile: then nothing)."""
        async with self.db.session() as s:
            await s.exec(
                update(A2APushConfig)
                .where(
                    col(A2APushConfig.task_id) == config.task_id,
                    col(A2APushConfig.config_id) == config.config_id,
                )
                .values(deliveries=A2APushConfig.deliveries + 1)
            )
            await s.commit()

    @staticmethod
    async def _row(s: Any, task_id: str, user_id: int, config_id: str) -> A2APushConfig | None:
        row: A2APushConfig | None = (
            await s.exec(
                select(A2APushConfig).where(
                    A2APushConfig.task_id == task_id,
                    A2APushConfig.user_id == user_id,
                    A2APushConfig.config_id == config_id,
                )
            )
        ).first()
        return row

    def _plain(self, row: A2APushConfig) -> PushConfig:
        return PushConfig(
            config_id=row.config_id,
            task_id=row.task_id,
            url=row.url,
            token=self._unseal(row.token) if row.token else None,
            auth_scheme=row.auth_scheme,
            auth_credentials=self._unseal(row.auth_credentials) if row.auth_credentials else None,
        )
