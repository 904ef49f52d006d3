"""The long-lived services of one app process, built once by `app.py`.

Routes reach the few they use through FastAPI dependencies (`core/auth/deps.py` and a
`deps.py` beside each package's services), which read `app.state.services`; pages get
theirs from `ui.register_pages`, each page only what it uses. Nothing in `core` reads a global.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from redis.exceptions import RedisError

from core import metrics, tracing
from core.a2a.api_keys import ApiKeys
from core.a2a.remote_agents import REMOTE_AGENT, RemoteAgentDirectory
from core.admin import AdminArea, ModelConnectionAdmin
from core.auth import accounts
from core.auth.account_mark import AccountsMark
from core.auth.deps import AuthState
from core.auth.login_throttle import RedisLoginFailures
from core.broker import Broker
from core.broker.inbox import ChatInbox
from core.broker.tools import BrokerDispatchTools
from core.chat import agents as agents_store
from core.chat.attachments import attachment_link
from core.chat.engine import ChatEngine
from core.chat.llm import DEMO_PROVIDER, LLMGateway
from core.chat.tools import ToolRegistry
from core.chat.workspace import Workspace
from core.db import MIGRATION_LOCK_KEY, REAPER_LOCK_KEY, Database, describe_database
from core.db_events import RegistryEvents
from core.delegation.agent_admin import LOCAL_AGENT, AgentAdmin
from core.delegation.questions import AskUserTool
from core.delegation.registry import AgentRegistry
from core.delegation.service import DelegationService
from core.delegation.tool import AgentInvokeTool
from core.errors import AppError
from core.i18n import _
from core.secret_box import LazySecretBox, make_data_dir_private
from core.settings import Settings, describe_redis
from core.streaming.backend import StreamHubBackend
from core.streaming.background import BackgroundTasks
from core.streaming.hub import StreamHub
from core.streaming.redis_hub import DuplicateReplicaError, RedisStreamHub
from core.streaming.redis_replica import check_redis_settings
from core.web.outbound_policy import OPERATOR_CONFIGURED, AllowList, url_refusal
from models import User

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 30.0


class StartupRefusedError(AppError, RuntimeError):
    """The configuration is unsafe or unusable; the message says how to fix it."""

    code = "startup_refused"


@dataclass(slots=True)
class Services:
    """Everything a page or route needs.

    Over 300 lines on purpose: the composition root's one class, one field per service and the
    order they start and stop in, which is read best in one place; routes and pages take the few
    services they use (`core/*/deps.py`), not this class.
    """

    settings: Settings
    db: Database
    hub: StreamHubBackend
    llm: LLMGateway
    tools: ToolRegistry
    chat: ChatEngine
    delegation: DelegationService
    registry: AgentRegistry
    workspace: Workspace
    auth: AuthState = field(default_factory=lambda: AuthState(multi_user=False, local_user_id=None))
    background: BackgroundTasks = field(default_factory=BackgroundTasks)
    # Standard A2A (issue 6): remote agents registered by card URL; the JSON-RPC server, built on first use.
    remote_agents: RemoteAgentDirectory = None  # type: ignore[assignment]  # set in __post_init__
    a2a_server: Any = None
    api_keys: ApiKeys = None  # type: ignore[assignment]  # set in __post_init__
    broker: Broker | None = None  # the seed-003 broker under /a2a (core/broker)
    inbox: ChatInbox | None = None  # injects of the app's own background tasks, back into their chats
    registry_events: RegistryEvents | None = None  # cluster mode: registry changes to and from the other replicas
    logins: accounts.PasswordLogin = None  # type: ignore[assignment]  # set in __post_init__
    agent_admin: AgentAdmin = None  # type: ignore[assignment]  # set in build: agents as people edit them
    admin: AdminArea = None  # type: ignore[assignment]  # set in build: the admin area (accounts, model, health)
    end_traces: Callable[[], None] | None = None  # flushes the spans (set by `start` when traces are on)

    def __post_init__(self) -> None:
        if self.remote_agents is None:
            self.remote_agents = RemoteAgentDirectory(self.db, self.registry, self.settings)
        if self.api_keys is None:
            self.api_keys = ApiKeys(self.db)
        if self.logins is None:
            self.logins = accounts.PasswordLogin(
                self.db.read,
                max_failures=self.settings.login_max_failures,
                window_s=self.settings.login_failure_window_s,
            )
        # A remembered Basic credential's account as `AuthState` keeps it (issue 41: no read of the caller's
        # row per request; a change here or on another replica forgets it, `AdminArea`).
        self.logins.account = self._kept_account

    async def _kept_account(self, user_id: int) -> User | None:
        # `self.auth` is replaced by `prepare` (single-user or accounts): read it at each call.
        return await self.auth.account(self.db, user_id)

    @classmethod
    def build(cls, settings: Settings) -> Services:
        """Wire the services from settings (no I/O yet; see `prepare` and `start`)."""
        db = Database(settings.database)
        hub: StreamHubBackend
        if settings.cluster and settings.redis.dsn:  # several replicas (docs/ARCHITECTURE.md, "Cluster")
            hub = RedisStreamHub.from_url(
                settings.redis.dsn,
                prefix=settings.redis.key_prefix,
                owner=settings.instance_id,
                lease_s=settings.cluster_lease_s,
                outage_events=settings.cluster_outage_buffer_events,
                max_events=settings.stream_buffer_max_events,
                ttl_s=settings.stream_buffer_ttl_s,
                subscriber_queue=settings.stream_subscriber_queue,
                append_gather_s=settings.cluster_append_gather_ms / 1000,
            )
        else:
            hub = StreamHub(
                max_events=settings.stream_buffer_max_events,
                ttl_s=settings.stream_buffer_ttl_s,
                subscriber_queue=settings.stream_subscriber_queue,
            )
        llm = LLMGateway(
            demo_delay_s=settings.demo_model_delay_ms / 1000,
            api_base=settings.llm_api_base,
            api_key=settings.llm_api_key,
            timeout_s=settings.llm_timeout_s,
            allow=AllowList.parse(settings.outbound_allow_hosts),  # an agent's apiBase is an outbound fetch
        )
        tools = ToolRegistry()
        secrets = LazySecretBox(settings.data_dir, settings.secret_key)  # agents' API keys
        chat = ChatEngine(
            db,
            hub,
            llm,
            tools,
            max_steps=settings.max_turn_steps,
            turn_timeout_s=settings.turn_timeout_s,
            max_message_chars=settings.max_message_chars,
            open_secret=secrets.open,
        )
        registry = AgentRegistry(db)
        registry.on_change(chat.agents.forget)  # an agent changed, here or on another replica: read it again
        delegation = DelegationService(db, hub, chat, tools, registry)
        delegation.files.inline_max_bytes = settings.a2a_file_inline_max_bytes
        delegation.files.link = partial(attachment_link, settings.base_url.rstrip("/"), secrets)
        tools.register(AgentInvokeTool(delegation))
        tools.register(AskUserTool(delegation.questions))
        broker = Broker(settings, registry, hub)
        # Every replica's inbox saves the notes of the tasks it relays (docs/ARCHITECTURE.md, "One task, one log").
        inbox = ChatInbox(chat, broker.injects.bus, shared_turns=bool(settings.cluster and settings.redis.dsn))
        tools.register_family(BrokerDispatchTools(broker, delegation))
        workspace = Workspace(db, hub, chat, settings.default_agent)
        agent_admin = AgentAdmin(db, registry, llm, secrets, settings.default_model)
        failures = None
        if settings.cluster and settings.redis.dsn:  # wrong passwords counted across replicas (the same limits)
            failures = RedisLoginFailures.from_url(
                settings.redis.dsn,
                prefix=settings.redis.key_prefix,
                max_failures=settings.login_max_failures,
                window_s=settings.login_failure_window_s,
            )
        logins = accounts.PasswordLogin(
            db.read,
            max_failures=settings.login_max_failures,
            window_s=settings.login_failure_window_s,
            failures=failures,
        )
        services = cls(
            settings=settings,
            db=db,
            hub=hub,
            llm=llm,
            tools=tools,
            chat=chat,
            delegation=delegation,
            registry=registry,
            workspace=workspace,
            broker=broker,
            inbox=inbox,
            logins=logins,
            agent_admin=agent_admin,
        )
        model_connection = ModelConnectionAdmin(db, settings, llm, agent_admin, secrets)
        services.admin = AdminArea(db, settings, services.auth, chat, broker, model_connection)
        services.remote_agents.push.records = delegation.records  # ends tasks resumed after a restart (issue 36)
        if broker.cluster is not None:  # docs/ARCHITECTURE.md, "Cluster: the broker across replicas"
            events = services.registry_events = RegistryEvents(db, broker.cluster.replica_id, enabled=True)
            services.remote_agents.notify = agent_admin.notify = events.notify
            events.on(REMOTE_AGENT, services.remote_agents.sync)
            events.on(LOCAL_AGENT, registry.changed)
            events.on_reconnect(services.remote_agents.sync_all)
            events.on_reconnect(chat.agents.forget_soon)  # notices may have been missed meanwhile
            services.admin.follow(events)  # accounts' state and the model connection, the same on every replica
        else:  # a single app: the command line's account changes (`users promote`) are seen without a restart
            services.admin.watch_command_line(AccountsMark(settings.data_dir))
        return services

    def prepare(self) -> None:
        """Blocking set-up before serving: migrate, seed, decide the auth mode.

        Raises:
            StartupRefusedError: no accounts exist and the host is not a loopback address; in cluster mode, a
                setting a replica needs is missing, no account exists, or another running replica has
                this INSTANCE_ID.
        """
        if self.settings.cluster:
            problems = self.settings.cluster_problems()
            if problems:
                raise StartupRefusedError(
                    "Refusing to start in cluster mode (CLUSTER=true):\n  - "
                    + "\n  - ".join(problems)
                    + "\nSet them, or unset CLUSTER to run as one process."
                )
        if isinstance(self.hub, RedisStreamHub) and self.settings.redis.dsn:
            try:
                self.hub.claim_name(self.settings.redis.dsn)
            except DuplicateReplicaError as exc:
                raise StartupRefusedError(f"Refusing to start in cluster mode: {exc}.") from exc
            except RedisError as exc:
                raise StartupRefusedError(
                    f"Refusing to start in cluster mode: Redis at "
                    f"{describe_redis(self.settings.redis.dsn)} is not reachable ({exc})."
                ) from exc
            check_redis_settings(self.settings.redis.dsn)  # a WARNING when persistence or eviction is unsafe
        try:
            self._prepare_serving()
        except BaseException:
            if isinstance(self.hub, RedisStreamHub) and self.settings.redis.dsn:
                with contextlib.suppress(RedisError):
                    self.hub.release_name(self.settings.redis.dsn)
            raise

    def _prepare_serving(self) -> None:
        make_data_dir_private(self.settings.data_dir)
        self.db.migrate()
        make_data_dir_private(self.settings.data_dir)  # the database file may be new
        # A thread of its own: `prepare` may be called where a loop already runs (NiceGUI's User fixture).
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prepare") as pool:
            try:
                self.auth = pool.submit(asyncio.run, self._seed_and_auth()).result()
            except DuplicateReplicaError as exc:
                raise StartupRefusedError(str(exc)) from None
        # Per-user limits of running work protect the accounts from each other; the one user of single-user
        # mode is the person at the machine (the benchmarks run 100 turns as that user), who has none.
        if self.auth.multi_user:
            self.chat.max_running_turns_per_user = self.settings.max_running_turns_per_user
            self.delegation.max_running_tasks_per_user = self.settings.max_running_tasks_per_user
        if self.settings.cluster and not self.auth.multi_user:
            raise StartupRefusedError(
                "Refusing to start in cluster mode: there are no user accounts, and single-user mode is one process "
                "on a loopback address. Create an account first (python app.py users add NAME --admin)."
            )
        if not self.auth.multi_user and not self.settings.is_loopback:
            raise StartupRefusedError(
                f"Refusing to listen on {self.settings.host}: there are no user accounts, and single-user mode "
                "is only allowed on a loopback address. Create an account first "
                "(python app.py users add NAME), or set HOST=127.0.0.1."
            )

    def describe(self) -> str:
        """One line for the person who started the app: mode, database, Redis, default model (no secrets)."""
        mode = _("accounts (log in with a password)") if self.auth.multi_user else _("single-user (local, no login)")
        model = self.settings.default_model
        if model.startswith(f"{DEMO_PROVIDER}/"):
            model += " " + _("(offline demo model)")
        return _("mode: {mode} · database: {database} · Redis: {redis} · default model: {model}").format(
            mode=mode,
            database=describe_database(self.settings.database),
            redis=describe_redis(self.settings.redis.dsn),
            model=model,
        )

    async def _seed_and_auth(self) -> AuthState:
        try:
            # Replicas started together seed one after the other (the migration's lock, held for the session).
            async with self.db.advisory_lock(MIGRATION_LOCK_KEY):
                return await self._seed_and_auth_locked()
        finally:
            await self.db.close()  # this loop ends here; the serving loop opens its own connections

    async def _seed_and_auth_locked(self) -> AuthState:
        sealed = await self.remote_agents.seal_stored_tokens()
        if sealed:
            log.info("encrypted %d remote agents' bearer tokens stored before encryption", sealed)
        # In a cluster, running turns and tasks may belong to other replicas: the reaper ends those whose
        # replica's lease expired (`_reap_forever`), not every one it finds.
        interrupted = 0 if self.settings.cluster else await self.delegation.fail_interrupted()
        if interrupted:
            log.warning("%d delegated tasks were running when the server stopped; marked failed", interrupted)
        if self.broker is not None:
            ended = await self.broker.recover()
            if ended:
                log.warning(
                    "%d broker tasks were running when the server stopped; their chats are told they were interrupted",
                    ended,
                )
        cut_off = 0 if self.settings.cluster else await self.chat.fail_interrupted()
        if cut_off:
            log.warning(
                "%d chat answers were being written when the server stopped; kept what they had "
                "said, marked interrupted",
                cut_off,
            )
        async with self.db.session() as s:
            await agents_store.seed_agents(s, model=self.settings.default_model)
            if await accounts.has_accounts(s):
                auth = AuthState(multi_user=True, local_user_id=None)
            else:
                local = await accounts.ensure_local_user(s)
                auth = AuthState(multi_user=False, local_user_id=local.id)
        if self.admin is not None:  # disabled accounts, admins, the model connection an admin saved
            self.admin.auth = auth
            await self.admin.load()
        return auth

    async def start(self) -> None:
        """Start periodic housekeeping (call on the serving loop)."""
        await self._start_traces()
        broker = self.broker
        metrics.set_sources(
            metrics.Sources(
                turns_running=self.chat.running_here,
                streams_open=self.hub.live_streams,
                broker_agents=lambda: len(broker.sockets.connections) if broker else 0,
                broker_tasks_running=lambda: len(broker.relay.tasks) if broker else 0,
            )
        )
        self.background.spawn(metrics.watch_event_loop(), name="event-loop blocks")
        if isinstance(self.hub, RedisStreamHub):
            await self.hub.start()
            self.background.spawn(self._reap_forever(self.hub), name="cluster reaper")
        self.background.spawn(self._sweep_forever(), name="hub sweep")
        if self.registry_events is not None:
            await self.registry_events.start()  # before the restore: no registration is missed in between
        # Off the start-up path: it imports the a2a-sdk.
        self.background.spawn(self.remote_agents.restore(), name="restore remote A2A agents")
        if self.inbox is not None:
            await self.inbox.start()
        if self.broker is not None:
            await self.broker.start()

    def stopping(self) -> None:
        """A stop signal came: what ends from now on ends because the app stops (then `stop` runs)."""
        if self.broker is not None:
            self.broker.stopping()

    async def _start_traces(self) -> None:
        """Traces on when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (the operator's: any address but a metadata one)."""
        endpoint = self.settings.otel_exporter_otlp_endpoint
        if not endpoint or self.end_traces is not None:
            return
        refusal = await url_refusal(tracing.traces_url(endpoint), OPERATOR_CONFIGURED)
        if refusal is not None:
            log.error("traces are off: OTEL_EXPORTER_OTLP_ENDPOINT %s is not allowed (%s)", endpoint, refusal)
            return
        self.end_traces = tracing.configure(
            endpoint, service_name=self.settings.otel_service_name, instance_id=self.settings.instance_id
        )

    async def stop(self) -> None:
        """Stop turns (saving what they have), housekeeping and the database."""
        metrics.set_sources(None)
        await self.delegation.shutdown_external_tasks()
        if self.a2a_server is not None:  # push notifications still being sent to A2A callers (issue 36)
            await self.a2a_server.notifier.aclose()
        if self.registry_events is not None:
            await self.registry_events.stop()
        await self.remote_agents.close()
        if self.inbox is not None:
            await self.inbox.stop()  # first: no announcement turns while everything stops
        if self.broker is not None:
            await self.broker.stop()
        await self.chat.shutdown()
        await self.background.shutdown()
        if isinstance(self.hub, RedisStreamHub):
            await self.hub.stop()
        await self.logins.close()
        await self.db.close()
        if self.end_traces is not None:  # the last spans, sent (the exporter blocks: off the loop)
            await asyncio.to_thread(self.end_traces)
            self.end_traces = None

    async def _reap_forever(self, hub: RedisStreamHub) -> None:
        """A cluster's reaper (one replica at a time): end the turns and tasks whose replica's lease expired.

        And the broker's tasks of replicas that are gone (`Broker.reap_gone_replicas`, the logic of start-up
        recovery): a replica killed for good would otherwise leave them running until some replica starts.
        """
        interval = max(0.5, hub.lease_s / 2)
        while True:
            try:
                async with self.db.advisory_lock(REAPER_LOCK_KEY, wait=False) as held:
                    # Not within a lease of a Redis outage: every live replica takes its leases (and its broker
                    # key) back first (docs/ARCHITECTURE.md, "Cluster", "Redis out of reach").
                    if held and hub.reach.quiet_for(hub.lease_s):
                        await self.reap_expired(hub)
                        if self.broker is not None:
                            await self.broker.reap_gone_replicas()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("the reaper of expired leases failed; it tries again in %.1f s", interval)
            await asyncio.sleep(interval)

    async def reap_expired(self, hub: RedisStreamHub) -> int:
        """End every open stream whose owner's lease expired (saved with what it streamed); returns how many."""
        ended = 0
        for key in await hub.expired():
            if not await hub.take_over(key):
                continue  # renewed, or ended, in between
            log.warning("the replica running %s stopped renewing its lease; ending it here", key)
            if key.startswith("a2a_"):
                await self.delegation.end_orphan(key.removeprefix("a2a_"))
            else:
                await self.chat.end_orphan(key)
            ended += 1
        return ended

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            evicted = self.hub.sweep()
            if evicted:
                log.debug("evicted %d finished stream buffers", evicted)
