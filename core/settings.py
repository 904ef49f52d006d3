"""Typed settings: environment > `.env` > `config/server.json` > defaults.

The order and the JSON keys come from seed 003 (the broker's README): `PORT=9000`
on the command line beats `.env`, which beats `config/server.json`, which beats
the defaults here. Nested JSON objects (`redis`, `auth`) are reached from the
environment with one underscore: `REDIS_HOST` sets `redis.host`, `REDIS_URL`
sets `redis.url`, `AUTH_MODE` sets `auth.mode`.

Both files are looked for in the working folder, where the app is started (as `DATA_DIR` is):
`./.env`, and `./config/server.json` when there is one, else the default one that ships with the
app (beside this package, in a checkout or in the installed package). `CONFIG_FILE` and `ENV_FILE`
choose other files (tests use them); a missing file is simply skipped.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from core.secret_box import write_private_file

PROJECT_ROOT = Path(__file__).resolve().parent.parent  # a checkout, or the installed package's folder
SHIPPED_CONFIG_FILE = PROJECT_ROOT / "config" / "server.json"
_WORKING_CONFIG_FILE = Path.cwd() / "config" / "server.json"
DEFAULT_CONFIG_FILE = _WORKING_CONFIG_FILE if _WORKING_CONFIG_FILE.is_file() else SHIPPED_CONFIG_FILE
DEFAULT_ENV_FILE = Path(".env")  # in the working folder


class RedisSettings(BaseModel):
    """Where Redis is. Unset (`url` and `host` empty) means: run without Redis."""

    url: str | None = None
    host: str | None = None
    port: int = 6379
    password: str | None = None
    db: int = 0
    key_prefix: str = "a2a:"

    @property
    def dsn(self) -> str | None:
        """The connection URL, built from `host`/`port`/`db` when `url` is not given."""
        if self.url:
            return self.url
        if self.host:
            auth = f":{self.password}@" if self.password else ""
            return f"redis://{auth}{self.host}:{self.port}/{self.db}"
        return None


class AuthSettings(BaseModel):
    """How remote agents authenticate on `/a2a` (seed 003 `auth.mode`)."""

    mode: Literal["none", "jwt"] = "none"
    public_keys: list[str] = Field(default_factory=list, description="PEM ES256 public keys accepted in jwt mode.")
    audience: str | None = Field(None, description="The `aud` a token must name (jwt mode); unset: not checked")
    leeway_s: int = Field(30, ge=0, le=300, description="Clock difference allowed when checking exp, nbf and iat")
    max_lifetime_s: int = Field(86_400, ge=60, description="Longest a token may be valid (exp - iat, or exp - now)")


class _JsonConfigSource(PydanticBaseSettingsSource):
    """Reads `config/server.json` (or `$CONFIG_FILE`); keys starting with `_` are comments."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        super().__init__(settings_cls)
        self.path = path

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover - unused
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return load_config_file(self.path)


def load_config_file(path: Path) -> dict[str, Any]:
    """Load a JSON config file, dropping `_comment`-style keys at every level.

    Raises:
        ValueError: the file exists but is not a JSON object.
    """
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); fix the file or remove it") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a JSON object")
    stripped: dict[str, Any] = _strip_comments(data)  # (a dict in, a dict out)
    return stripped


def _strip_comments(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_comments(v) for k, v in value.items() if not str(k).startswith("_")}
    return value


class Settings(BaseSettings):
    """Every setting of the app. See `config/server.json` for what each one does.

    Over 300 lines on purpose: one field per setting, each with its description, in the one place
    pydantic-settings reads them from (environment, `.env`, `config/server.json`).
    """

    model_config = SettingsConfigDict(
        env_nested_delimiter="_",
        env_nested_max_split=1,
        extra="ignore",
        case_sensitive=False,
        env_ignore_empty=True,
    )

    # Where the server listens. 127.0.0.1 by default: nothing listens beyond loopback unless asked.
    host: str = "127.0.0.1"
    port: int = Field(3100, ge=1, le=65535)
    public_base_url: str | None = Field(
        None, description="Absolute URL that remote clients use; default http://HOST:PORT"
    )
    trusted_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="More names the server answers to (Host header); * = any"
    )

    data_dir: Path = Path("data")
    database_url: str | None = Field(None, description="SQLAlchemy URL; default sqlite:///DATA_DIR/app.db")
    storage_secret: str | None = Field(None, description="Signs browser sessions; generated into DATA_DIR when unset")
    secret_key: str | None = Field(None, description="Encrypts stored secrets; generated into DATA_DIR when unset")

    default_model: str = "local/demo"
    default_agent: str = Field("general-assistant", description="Registry id of the agent a new chat starts with")
    demo_model_delay_ms: int = Field(30, ge=0, description="Delay between the demo model's tokens")
    llm_api_base: str | None = None
    llm_api_key: str | None = None
    llm_timeout_s: float = Field(60.0, gt=0, description="Longest wait for the next chunk from a model")
    turn_timeout_s: float = Field(600.0, gt=0, description="Longest a whole chat turn may run")
    max_turn_steps: int = Field(8, ge=1, le=50, description="Model calls per turn (tool loop bound)")
    max_message_chars: int = Field(20_000, ge=1)
    max_request_body_bytes: int = Field(
        1_048_576,
        ge=65_536,
        description="Largest request body of the REST API and the broker's HTTP routes (413 above; the A2A JSON-RPC "
        "endpoints cap their own at 1 MiB). A message of MAX_MESSAGE_CHARS characters, JSON-escaped, fits.",
    )
    upload_max_bytes: int = Field(
        10_485_760,
        ge=1024,
        le=104_857_600,
        description="Largest file attached to a chat message (413 attachment_too_large above); the upload route's "
        "body may be this plus 64 KiB of multipart framing, whatever MAX_REQUEST_BODY_BYTES says.",
    )
    upload_allowed_types: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: [
            "image/png",
            "image/jpeg",
            "image/gif",
            "image/webp",
            "text/*",
            "application/json",
            "application/pdf",
        ],
        description="MIME types a chat attachment may have (415 attachment_type_refused otherwise); `type/*` "
        "matches a whole family, `*/*` any type. Uploaded HTML and SVG are always served as downloads, never shown.",
    )
    a2a_file_inline_max_bytes: int = Field(
        1_048_576,
        ge=0,
        le=104_857_600,
        description="Largest attachment a delegation passes to a remote A2A agent as bytes in its file part; a larger "
        "one goes as a signed download link to it that works for a day (0: always a link).",
    )
    max_running_turns_per_user: int = Field(
        20, ge=1, description="Chat turns one account may have running at once (with accounts only); more get 429"
    )
    max_running_tasks_per_user: int = Field(
        50,
        ge=1,
        description="Delegated tasks one account may have submitted or working at once (with accounts "
        "only); more are refused",
    )
    login_max_failures: int = Field(10, ge=1, description="Wrong passwords per address and per account in the window")
    login_failure_window_s: float = Field(300.0, gt=0, description="How long a failed login counts")

    stream_buffer_max_events: int = Field(20_000, ge=10)
    stream_buffer_ttl_s: float = Field(300.0, ge=0, description="How long a finished buffer stays replayable")
    stream_subscriber_queue: int = Field(10_000, ge=10)

    # Seed 003 keys (milliseconds, as in the seed).
    request_timeout: int = Field(10_000, ge=1)
    task_idle_timeout: int = Field(120_000, ge=1)
    inject_min_interval: int = Field(1_000, ge=0)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    blacklist_ip: Annotated[list[str], NoDecode] = Field(default_factory=list, description="IPs refused on /a2a")
    trusted_proxies: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Proxies whose X-Forwarded-For is believed; empty: none"
    )
    # Slow and greedy clients (core/web/connections.py).
    http_header_timeout_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="How long a client may take to send a request's headers, from the "
        "connection's start or the next request's first byte; then it is closed",
    )
    max_connections_per_address: int = Field(
        2000,
        ge=1,
        description="Open connections one client address may hold; more are answered 429 and closed. "
        "TRUSTED_PROXIES are not counted (their users share their address). Above the "
        "1,010 broker agents bench/bench_broker.py connects from 127.0.0.1 and the ~400 "
        "streams of bench_capacity.py at N=200, and a busy office behind one NAT address",
    )
    # Broker limits beyond the seed's keys (core/broker).
    broker_max_line_bytes: int = Field(1_048_576, ge=1_024, description="Longest JSON-RPC line accepted from an agent")
    broker_heartbeat_interval: int = Field(60_000, ge=100, description="WebSocket ping period on /a2a (ms)")
    broker_pong_timeout: int = Field(20_000, ge=100, description="How long a ping may wait for its pong (ms)")
    broker_dispatch_token: str | None = Field(
        None, description="A token a chat system may dispatch with instead of a user's API key"
    )
    broker_open_dispatch: bool = Field(
        False, description="Seed 003's open mode: dispatch and cancel without credentials (trusted network only)"
    )
    broker_outbox_max: int = Field(10_000, ge=1, description="Injects kept while Redis is unreachable")
    instance_id: str = Field(
        "main",
        min_length=1,
        max_length=255,
        pattern=r"^[A-Za-z0-9._:-]+$",
        description="Names this process among app processes sharing one database: at start it ends only "
        "the broker tasks that it left running",
    )
    # Several replicas on one PostgreSQL database and one Redis (docs/ARCHITECTURE.md, "Cluster").
    cluster: bool = Field(
        False,
        description="Run as one of several replicas: shared streams, broker directory "
        "and leases on Redis and PostgreSQL",
    )
    replica_url: str | None = Field(
        None, description="How the other replicas reach this one, e.g. http://10.0.0.5:3100 (cluster mode)"
    )
    internal_token: str | None = Field(None, description="Shared secret replicas use to call each other (cluster mode)")
    cluster_lease_s: float = Field(
        15.0,
        ge=1.0,
        le=600.0,
        description="How long a replica's claim on a running "
        "turn or task lasts without renewal; another replica ends it after that (cluster)",
    )
    cluster_outage_buffer_events: int = Field(
        50_000,
        ge=0,
        description="Events of running turns and tasks a replica holds while Redis is out of reach, written "
        "to Redis when it is back; past it Redis skips them (the replica's own readers and the saved answers "
        "keep them) (cluster)",
    )
    cluster_append_gather_ms: float = Field(
        0.0,
        ge=0.0,
        le=50.0,
        description="While tokens keep coming, how long a replica lets a batch of stream appends "
        "fill before it sends it to Redis (cluster; 0: send each batch as soon as the last one is back)",
    )
    # Outbound fetches (agent cards, remote agents' endpoints, agents' model endpoints; core/web/outbound_policy.py):
    # non-public addresses are refused unless their host name, address or network is listed here; metadata never.
    outbound_allow_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host names, IPs or networks that card fetches, remote calls and agents' "
        "model endpoints (apiBase) may reach although they are loopback or private "
        "(a cloud metadata address never)",
    )

    # Push notifications (docs/ARCHITECTURE.md, "Push notifications"): served to A2A callers, used with remote agents.
    a2a_push_max_configs_per_task: int = Field(
        5, ge=1, le=100, description="Push notification configs one caller may set on one task; one more is refused"
    )
    a2a_push_max_deliveries_per_task: int = Field(
        50, ge=1, le=10_000, description="Notifications sent for one task, all its configs together; then no more"
    )
    a2a_push_attempts: int = Field(
        4, ge=1, le=10, description="Tries of one notification (the first and its retries) while the receiver fails"
    )
    a2a_push_first_retry_s: float = Field(
        0.5, ge=0.0, le=60.0, description="Wait before the first retry of a notification; doubled before each next one"
    )
    a2a_remote_push: bool = Field(
        False,
        description="Remote A2A agents whose card offers push notifications end long tasks by push to this app "
        "instead of a held stream",
    )
    a2a_remote_push_poll_s: float = Field(
        30.0, ge=0.1, le=3600.0, description="While a remote task ends by push: how often it is also read (GetTask)"
    )

    debug: str | None = None
    otel_exporter_otlp_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP collector for traces (spans go to <it>/v1/traces); unset: no traces. "
        "Your own configuration: any address but a cloud metadata one",
    )
    otel_service_name: str = Field("a2a-delegation-chat", description="service.name of this process's spans")
    metrics_token: str | None = Field(
        None, description="Bearer token GET /metrics needs (required once there are accounts; without it they are off)"
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="The least severe log lines written (DEBUG adds the detail DEBUG=... names too)"
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="text: one readable line each; json: one JSON object per line, for a log collector"
    )
    loop_probe: bool = Field(
        False,
        description="Measure the longest event-loop block (benchmarks; logged on SIGUSR1, core/web/loop_probe.py)",
    )

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _any_case(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        return (
            value.strip().upper()
            if value.strip().upper() in {"DEBUG", "INFO", "WARNING", "ERROR"}
            else value.strip().lower()
        )

    @field_validator(
        "blacklist_ip",
        "trusted_hosts",
        "outbound_allow_hosts",
        "trusted_proxies",
        "upload_allowed_types",
        mode="before",
    )
    @classmethod
    def _split_csv(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("blacklist_ip", "trusted_proxies", mode="after")
    @classmethod
    def _addresses_or_networks(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(
                    f"{entry[:60]!r} is not an IP address or network (such as 10.0.0.5 or 10.0.0.0/8)"
                ) from None
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Environment, then `.env`, then the JSON file, then defaults (seed 003's order)."""
        config_file = Path(os.environ.get("CONFIG_FILE") or DEFAULT_CONFIG_FILE)
        return (init_settings, env_settings, dotenv_settings, _JsonConfigSource(settings_cls, config_file))

    @property
    def database(self) -> str:
        """The database URL: `DATABASE_URL`, or the SQLite file in `DATA_DIR`."""
        return self.database_url or f"sqlite:///{(self.data_dir / 'app.db').as_posix()}"

    @property
    def base_url(self) -> str:
        """The absolute URL of this server as remote clients should use it."""
        if self.public_base_url:
            return self.public_base_url.rstrip("/")
        host = "127.0.0.1" if self.host in {"0.0.0.0", "::"} else self.host
        return f"http://{host}:{self.port}"

    @property
    def answering_hosts(self) -> list[str]:
        """The names a request may use to reach this server: loopback, HOST, PUBLIC_BASE_URL's, TRUSTED_HOSTS."""
        names = ["127.0.0.1", "localhost", "::1", *self.trusted_hosts]
        if self.host not in {"0.0.0.0", "::"}:
            names.append(self.host)
        if self.public_base_url:
            names.append(urlsplit(self.public_base_url).hostname or "")
        return [n.strip().lower() for n in dict.fromkeys(names) if n.strip()]

    @property
    def is_loopback(self) -> bool:
        """True when the server binds only to a loopback address."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def cluster_problems(self) -> list[str]:
        """What keeps this configuration from running as one of several replicas (empty: nothing).

        Each entry says what to set; `Services.prepare` refuses to start in cluster mode while any remain
        (docs/ARCHITECTURE.md, "Cluster"). The check of accounts needs the database and is made there.
        """
        problems = []
        if not self.database_url or not self.database_url.startswith(("postgresql", "postgres://")):
            problems.append(
                "DATABASE_URL must point at PostgreSQL (postgresql://...): replicas share one database, "
                "and SQLite is a file of one process"
            )
        if not self.redis.dsn:
            problems.append(
                "REDIS_URL (or REDIS_HOST) must be set: streams, running turns and cancels are shared through Redis"
            )
        if not self.storage_secret:
            problems.append(
                "STORAGE_SECRET must be set, the same on every replica: it signs browser sessions, "
                "so a login is valid on any replica"
            )
        if not self.replica_url:
            problems.append("REPLICA_URL must be set: how the other replicas reach this one, e.g. http://10.0.0.5:3100")
        if not self.internal_token:
            problems.append("INTERNAL_TOKEN must be set, the same on every replica: replicas call each other with it")
        if self.instance_id == "main":
            problems.append(
                "INSTANCE_ID must be set, different on every replica (e.g. app-1, app-2): a replica's "
                "turns, tasks and leases are recorded under it"
            )
        return problems

    def ensure_storage_secret(self) -> str:
        """Return the storage secret, creating and keeping one in `DATA_DIR` on first use."""
        if self.storage_secret:
            return self.storage_secret
        path = self.data_dir / ".storage_secret"
        if path.is_file():
            return path.read_text(encoding="utf-8").strip()
        secret = secrets.token_urlsafe(32)
        write_private_file(path, secret)
        return secret


def load_settings(**overrides: Any) -> Settings:
    """Build settings from the environment, `.env` (or `$ENV_FILE`) and the JSON config file."""
    env_file = os.environ.get("ENV_FILE") or DEFAULT_ENV_FILE
    return Settings(_env_file=env_file, **overrides)


def describe_redis(dsn: str | None) -> str:
    """`none`, or `host:port/db` of the Redis URL (never its password)."""
    if not dsn:
        return "none"
    parsed = urlsplit(dsn)
    db = parsed.path.lstrip("/") or "0"
    return f"{parsed.hostname or 'localhost'}:{parsed.port or 6379}/{db}"
