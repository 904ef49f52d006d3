"""Push notifications served to A2A callers (issue 36): each task update POSTed to the callers' webhooks.

A caller sets a config on its task (`CreateTaskPushNotificationConfig`, or inside `SendMessage`); from then
on, `PushNotifier.watch` follows the task's hub buffer (`a2a_<taskId>`) and at each change of its state
(submitted, working, its end) POSTs the task as it stands to every config of the task: the body the
a2a-sdk's own sender posts (`{"task": {...}}`, `protocol.push.notification_body`), with the config's token
in `X-A2A-Notification-Token` and its credentials, if any, in `Authorization`.

Where it may go: the webhook URL is checked against the outbound policy when it is set (a refusal is
-32602 with the reason) and again at every POST (`core.a2a.outbound.guarded_client`: the address checked is
the one connected to, no redirects followed, the answer's body capped).

How hard it tries: a notification that fails (no connection, timeout, HTTP 5xx or 429) is tried again after
`A2A_PUSH_FIRST_RETRY_S`, doubled each time, at most `A2A_PUSH_ATTEMPTS` tries in all; another 4xx is not
retried. A task sends at most `A2A_PUSH_MAX_DELIVERIES_PER_TASK` notifications, all configs together.
Delivery is best effort: a receiver that never answers changes nothing of the task.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from core.a2a import outbound
from core.a2a.protocol.push import NOTIFICATION_TOKEN_HEADER, PushConfig, notification_body
from core.a2a.push_store import PushConfigStore
from core.a2a.task_store import TaskSessionStore
from core.delegation.tasks import TERMINAL_STATES, task_stream_key
from core.streaming import events as ev
from core.streaming.backend import StreamHubBackend
from core.streaming.hub import SubscriberOverflowError, UnknownStreamError
from core.web.outbound_policy import AllowList, OutboundError, url_refusal
from models import A2ATaskSession

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0
RETRIED_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


class PushNotifier:
    """Sends the notifications of the tasks that have configs.

    Args:
        db: the database (to read a task whatever its caller).
        store: the configs.
        tasks: the task store (snapshots).
        hub: the stream hub (the tasks' buffers).
        allow: hosts and networks a webhook may be on although they are not public (`OUTBOUND_ALLOW_HOSTS`).
        max_deliveries: notifications one task may send, all configs together.
        attempts: tries of one notification.
        retry_base_s: the wait before the first retry, doubled before each next one.
    """

    def __init__(
        self,
        *,
        db: Any,
        store: PushConfigStore,
        tasks: TaskSessionStore,
        hub: StreamHubBackend,
        allow: AllowList,
        max_deliveries: int,
        attempts: int,
        retry_base_s: float,
    ) -> None:
        self.db = db
        self.store = store
        self.tasks = tasks
        self.hub = hub
        self.allow = allow
        self.max_deliveries = max_deliveries
        self.attempts = attempts
        self.retry_base_s = retry_base_s
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._http = outbound.guarded_client(allow, timeout=TIMEOUT_S)

    async def refusal(self, url: str) -> str | None:
        """Why the policy refuses `url` as a webhook ("not allowed: a loopback address"), or None."""
        return await url_refusal(url, self.allow)

    def watch(self, task_id: str) -> None:
        """Notify the task's configs of its state now and at each change until it ends (once per task)."""
        if task_id in self._watchers:
            return
        watcher = asyncio.get_running_loop().create_task(self._watch(task_id), name=f"push {task_id}")
        self._watchers[task_id] = watcher
        watcher.add_done_callback(lambda _: self._watchers.pop(task_id, None))

    async def wait_idle(self, task_id: str) -> None:
        """Wait until the task's notifications are all sent (tests and shutdown)."""
        watcher = self._watchers.get(task_id)
        if watcher is not None:
            await asyncio.wait({watcher})

    async def aclose(self) -> None:
        """Stop watching and close the connections."""
        for watcher in list(self._watchers.values()):
            watcher.cancel()
        await asyncio.gather(*self._watchers.values(), return_exceptions=True)
        await self._http.aclose()

    async def _watch(self, task_id: str) -> None:
        try:
            last = await self._notify(task_id, None)
            if last is None or last in TERMINAL_STATES:
                return
            key, after = task_stream_key(task_id), None
            while True:
                try:
                    subscription = self.hub.subscribe(key, after)
                except UnknownStreamError:
                    break
                try:
                    async for event in subscription:
                        after = event.id
                        try:
                            typed = ev.from_stream(event.type, event.data)
                        except ev.EventFormatError:
                            continue
                        if isinstance(typed, ev.TaskState | ev.TaskDone):
                            last = await self._notify(task_id, last)
                            if last is None or last in TERMINAL_STATES:
                                return
                    break
                except SubscriberOverflowError:
                    continue
                finally:
                    subscription.close()
            await self._notify(task_id, last)  # the buffer ended or was evicted: its end, from the database
        except Exception:  # best effort: a failure here must not touch the task
            log.exception("push notifications of task %s stopped", task_id)

    async def _notify(self, task_id: str, last: str | None) -> str | None:
        """Post the task to its configs when its state is not `last`; the state it has (None: no task)."""
        async with self.db.read() as s:
            row = await s.get(A2ATaskSession, task_id)
        if row is None:
            return None
        snap = await self.tasks.snapshot(task_id, user_id=row.caller_user_id, agent_id=row.callee_agent_slug)
        if snap is None or snap.state == last:
            return last if snap is not None else None
        configs, sent = await self.store.for_dispatch(task_id)
        body = notification_body(snap)
        sends = []
        for config in configs:
            if sent >= self.max_deliveries:
                log.info("task %s sent its %d push notifications; no more", task_id, self.max_deliveries)
                break
            sent += 1
            await self.store.count_delivery(config)
            sends.append(self._deliver(config, body))
        await asyncio.gather(*sends)
        return snap.state

    async def _deliver(self, config: PushConfig, body: dict[str, Any]) -> bool:
        """POST `body` to the config's URL, retrying a failure with backoff; True when it was taken."""
        headers = {"Content-Type": "application/json"}
        if config.token:
            headers[NOTIFICATION_TOKEN_HEADER] = config.token
        http = self._http
        if config.auth_scheme and config.auth_credentials:  # Bearer only (`read_push_config`), to the URL's origin
            http = outbound.guarded_client(
                self.allow,
                bearer_token=config.auth_credentials,
                token_origin=outbound.origin(config.url),
                timeout=TIMEOUT_S,
            )
        try:
            return await self._post(http, config, body, headers)
        finally:
            if http is not self._http:
                await http.aclose()

    async def _post(self, http: httpx.AsyncClient, config: PushConfig, body: Any, headers: dict[str, str]) -> bool:
        wait = self.retry_base_s
        why = ""
        for attempt in range(1, self.attempts + 1):
            try:
                response = await http.post(config.url, json=body, headers=headers)
                await response.aclose()
                if response.is_success:
                    return True
                why = f"HTTP {response.status_code}"
                if response.status_code not in RETRIED_STATUSES:
                    break
            except OutboundError as exc:
                why = exc.category
                if exc.category.startswith("not allowed"):
                    break
            except httpx.HTTPError as exc:
                why = type(exc).__name__
            if attempt < self.attempts:
                await asyncio.sleep(wait)
                wait *= 2
        log.info(
            "push notification of task %s to %s not delivered: %s",
            config.task_id,
            outbound.shorten(config.url),
            why,
        )
        return False


def push_refused_message(url: str, reason: str) -> str:
    """The JSON-RPC error's message for a webhook the outbound policy refuses."""
    return (
        f"The push notification url {outbound.shorten(url, 200)!r} is refused ({reason}): notifications go only "
        "to public addresses unless the server's OUTBOUND_ALLOW_HOSTS lists the host."
    )
