"""The four push notification config methods of the A2A request handler (issue 36), and the config of a send.

`CreateTaskPushNotificationConfig`, `GetTaskPushNotificationConfig`, `ListTaskPushNotificationConfigs` and
`DeleteTaskPushNotificationConfig` (v0.3: `tasks/pushNotificationConfig/set|get|list|delete`, through the SDK's
compat layer into the same methods). A config is the caller's own on the caller's own task: another key's
task, or another key's config, is answered as unknown (-32001), exactly like one that does not exist.
A webhook URL the outbound policy refuses is -32602 with the reason; one config more than
`A2A_PUSH_MAX_CONFIGS_PER_TASK` on a task is -32602 too. The sending is `core/a2a/push.py`.
"""

from __future__ import annotations

from typing import Any

from core.a2a import protocol as wire
from core.a2a.protocol.push import (
    PushConfig,
    list_push_configs,
    read_push_config,
    send_push_config,
    to_push_config,
)
from core.a2a.push import PushNotifier, push_refused_message
from core.a2a.push_store import PushConfigStore, TooManyPushConfigsError
from core.a2a.task_store import TaskSessionStore


class PushMethods:
    """Mixed into `AgentRequestHandler`: the push config methods over `PushConfigStore` and `PushNotifier`."""

    store: TaskSessionStore
    push_store: PushConfigStore
    notifier: PushNotifier

    async def on_create_task_push_notification_config(self, params: Any, context: wire.ServerCallContext) -> Any:
        """Set (or replace, by id) a config on the caller's task; its notifications start at once."""
        user_id = await self._own_task(params.task_id, context)
        config = await self.checked_push_config(read_push_config(params))
        await self._put(config, user_id)
        self.notifier.watch(config.task_id)
        return to_push_config(config)

    async def on_get_task_push_notification_config(self, params: Any, context: wire.ServerCallContext) -> Any:
        """One of the caller's configs of the task (its id; none: the one named after the task)."""
        user_id = await self._own_task(params.task_id, context)
        config = await self.push_store.get(params.task_id, params.id or params.task_id, user_id=user_id)
        if config is None:
            raise wire.TaskNotFoundError(message=_no_config(params.task_id, params.id or params.task_id))
        return to_push_config(config)

    async def on_list_task_push_notification_configs(self, params: Any, context: wire.ServerCallContext) -> Any:
        """The caller's configs of the task."""
        user_id = await self._own_task(params.task_id, context)
        return list_push_configs(await self.push_store.list(params.task_id, user_id=user_id))

    async def on_delete_task_push_notification_config(self, params: Any, context: wire.ServerCallContext) -> None:
        """Delete one of the caller's configs; no more notifications go to it."""
        user_id = await self._own_task(params.task_id, context)
        if not await self.push_store.delete(params.task_id, params.id or params.task_id, user_id=user_id):
            raise wire.TaskNotFoundError(message=_no_config(params.task_id, params.id or params.task_id))

    # -- a send's config ------------------------------------------------------------------

    async def send_config(self, params: Any) -> PushConfig | None:
        """The config a `SendMessage` carries, checked (before its task starts), for a task id still to come."""
        proto = send_push_config(params)
        if proto is None:
            return None
        return await self.checked_push_config(read_push_config(proto, task_id="-"))

    async def start_pushing(self, config: PushConfig | None, task_id: str, user_id: int) -> None:
        """Store a send's config for the task it started, and start its notifications."""
        if config is None:
            return
        own_id = task_id if config.config_id == "-" else config.config_id
        await self._put(
            PushConfig(
                config_id=own_id,
                task_id=task_id,
                url=config.url,
                token=config.token,
                auth_scheme=config.auth_scheme,
                auth_credentials=config.auth_credentials,
            ),
            user_id,
        )
        self.notifier.watch(task_id)

    async def checked_push_config(self, config: PushConfig) -> PushConfig:
        """The config when the outbound policy lets its URL be reached, else -32602 with the reason."""
        reason = await self.notifier.refusal(config.url)
        if reason is not None:
            raise wire.InvalidParamsError(message=push_refused_message(config.url, reason))
        return config

    async def _put(self, config: PushConfig, user_id: int) -> None:
        try:
            await self.push_store.put(config, user_id=user_id)
        except TooManyPushConfigsError as exc:
            raise wire.InvalidParamsError(message=str(exc), data={"code": exc.code}) from exc

    async def _own_task(self, task_id: str, context: wire.ServerCallContext) -> int:
        agent_id, user_id = context.state.get("agent_id"), context.state.get("user_id")
        assert agent_id and isinstance(user_id, int), "the route authenticates before dispatching"
        if not task_id or await self.store.snapshot(task_id, user_id=user_id, agent_id=agent_id) is None:
            raise wire.TaskNotFoundError(message=f"There is no task {task_id!r} for this agent and key.")
        return user_id


def _no_config(task_id: str, config_id: str) -> str:
    return f"There is no push notification config {config_id!r} of task {task_id!r} for this key."
