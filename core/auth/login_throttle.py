"""Failed logins counted per client address and per account, in this process or across a cluster.

`PasswordLogin` (`core/auth/accounts.py`) asks `begin` before it checks a password: past
`max_failures` failures of either key in the last `window_s`, the attempt is refused
(`TooManyFailedLoginsError`) until the oldest of them leaves the window. Otherwise the attempt is
counted as a failure from its start (parallel guesses are throttled as a sequence would be), and
`succeeded` takes it back and clears the account's count (not the address's: an attacker's own
good login does not reset its budget).

- `LoginFailures`: the counts of this process (single-user and one-process modes).
- `RedisLoginFailures`: in cluster mode the replicas share the counts in Redis, so a guesser
  spreading attempts over replicas gets `max_failures` per window in all, not per replica
  (docs/ARCHITECTURE.md, "Cluster"). While Redis cannot be reached it counts in this process
  (logged): a guesser then gets at most `max_failures` per replica per window, and people can
  still log in, where refusing every login would lock everyone out for the length of an outage.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from core import metrics
from core.errors import AppError

log = logging.getLogger(__name__)


class TooManyFailedLoginsError(AppError):
    """Too many wrong passwords lately, from this address or for this account."""

    code = "too_many_failed_logins"

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"Too many failed logins; try again in {retry_after_s} s.")
        self.retry_after_s = retry_after_s


def _refusal(retry_after_s: float) -> TooManyFailedLoginsError:
    metrics.LOGINS_THROTTLED.inc()
    return TooManyFailedLoginsError(max(1, int(retry_after_s + 0.999)))


@dataclass(frozen=True, slots=True)
class Attempt:
    """One login attempt counted as a failure until it succeeds; `succeeded` takes it back."""

    keys: tuple[str, str]  # ("address:<ip>", "account:<name>")
    at: float  # when it was counted (`LoginFailures`)
    member: str = ""  # its entry in the shared counts (`RedisLoginFailures`); "" when counted in this process


class LoginFailures:
    """The failed logins of this process, per key, over `window_s`.

    Args:
        max_failures: failures allowed per key within `window_s`.
        window_s: how long a failure counts.
        clock: monotonic seconds (tests pass their own).
    """

    #: Counts kept at most: a spray of names or addresses does not grow memory without bound.
    FAILURES_MAX = 10_000

    def __init__(
        self, *, max_failures: int = 10, window_s: float = 300.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self._clock = clock
        self._failures: dict[str, deque[float]] = {}

    async def begin(self, keys: tuple[str, str]) -> Attempt:
        """Count an attempt as a failure (check and count, no await between them).

        Raises:
            TooManyFailedLoginsError: either key has failed `max_failures` times within the window.
        """
        return self.begin_now(keys)

    def begin_now(self, keys: tuple[str, str]) -> Attempt:
        """`begin`, synchronously."""
        now = self._clock()
        self._check(keys, now)
        if len(self._failures) >= self.FAILURES_MAX:
            self._forget_old(now)
        for key in keys:
            self._failures.setdefault(key, deque()).append(now)
        return Attempt(keys, now)

    async def succeeded(self, attempt: Attempt) -> None:
        """Take back the attempt's failure; clear the account's count."""
        self.succeeded_now(attempt)

    def succeeded_now(self, attempt: Attempt) -> None:
        """`succeeded`, synchronously."""
        address_key, account_key = attempt.keys
        self._failures.pop(account_key, None)
        failures = self._failures.get(address_key)
        if failures is not None:
            with contextlib.suppress(ValueError):
                failures.remove(attempt.at)
            if not failures:
                del self._failures[address_key]

    async def close(self) -> None:
        """Nothing to release."""

    def counts(self, key: str) -> int:
        """Failures of `key` in the window (for tests and logs)."""
        now = self._clock()
        return sum(1 for at in self._failures.get(key, ()) if at > now - self.window_s)

    def __len__(self) -> int:
        return len(self._failures)

    def _check(self, keys: tuple[str, ...], now: float) -> None:
        retry_after = 0.0
        for key in keys:
            failures = self._failures.get(key)
            if not failures:
                continue
            while failures and failures[0] <= now - self.window_s:
                failures.popleft()
            if not failures:
                del self._failures[key]
            elif len(failures) >= self.max_failures:
                retry_after = max(retry_after, failures[0] + self.window_s - now)
        if retry_after > 0:
            raise _refusal(retry_after)

    def _forget_old(self, now: float) -> None:
        """Make room: counts whose failures have all left the window go first.

        If that is not enough, the counts first started go (a flood that large is beyond what a
        per-process throttle stops).
        """
        for key in [k for k, failures in self._failures.items() if failures[-1] <= now - self.window_s]:
            del self._failures[key]
        for key in list(self._failures)[: max(0, len(self._failures) - self.FAILURES_MAX // 2)]:
            del self._failures[key]


# KEYS: the sorted sets of the attempt's keys (score: when, in Redis's own clock, ms). ARGV: window ms,
# max failures, the attempt's member. Returns 0 (counted) or the ms until the oldest failure of a key
# that is full leaves the window (refused, nothing counted). One script: check and count are atomic
# across replicas, as they are without an await in `LoginFailures`.
_BEGIN = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[1])
local retry = 0
for _, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  if redis.call('ZCARD', key) >= tonumber(ARGV[2]) then
    local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    retry = math.max(retry, tonumber(oldest[2]) + window - now)
  end
end
if retry > 0 then return retry end
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, now, ARGV[3])
  redis.call('PEXPIRE', key, window)
end
return 0
"""


class RedisLoginFailures:
    """The failed logins of every replica, in Redis: a sorted set per key of the failures' times.

    Keys are `<prefix>login-failures:<sha256 of the key>` (a typed name can be anything; its hash
    is short and plain), each expiring `window_s` after its newest failure, so Redis holds only
    what still counts. Times are Redis's own clock, so replicas whose clocks differ agree. While
    Redis fails, `fallback` (this process's counts) stands in; each change between the two is logged.

    Args:
        redis: a client of its own (short timeouts: a login must not hang on Redis).
        prefix: `redis.key_prefix`.
        max_failures: failures allowed per key within `window_s`.
        window_s: how long a failure counts.
        fallback: the counts used while Redis fails (default: `LoginFailures` with the same limits).
    """

    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str,
        max_failures: int = 10,
        window_s: float = 300.0,
        fallback: LoginFailures | None = None,
    ) -> None:
        self.redis = redis
        self.prefix = f"{prefix}login-failures:"
        self.max_failures = max_failures
        self.window_s = window_s
        self.fallback = fallback or LoginFailures(max_failures=max_failures, window_s=window_s)
        self._begin = redis.register_script(_BEGIN)
        self._redis_failing = False

    @classmethod
    def from_url(cls, url: str, *, prefix: str, max_failures: int, window_s: float) -> RedisLoginFailures:
        """A client of its own on `url`, with timeouts of 2 s."""
        client = Redis.from_url(url, decode_responses=True, socket_timeout=2.0, socket_connect_timeout=2.0)
        return cls(client, prefix=prefix, max_failures=max_failures, window_s=window_s)

    def key(self, key: str) -> str:
        """The Redis key of an `address:`/`account:` count."""
        return self.prefix + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()

    async def begin(self, keys: tuple[str, str]) -> Attempt:
        """Count an attempt as a failure in every replica's counts (this process's while Redis fails).

        Raises:
            TooManyFailedLoginsError: either key has failed `max_failures` times within the window.
        """
        member = secrets.token_hex(8)
        try:
            retry_ms = await self._begin(
                keys=[self.key(k) for k in keys], args=[int(self.window_s * 1000), self.max_failures, member]
            )
        except RedisError as exc:
            self._failing(exc)
            return self.fallback.begin_now(keys)
        self._working()
        if int(retry_ms) > 0:
            raise _refusal(int(retry_ms) / 1000)
        return Attempt(keys, 0.0, member)

    async def succeeded(self, attempt: Attempt) -> None:
        """Take back the attempt's failure; clear the account's count (in both counts)."""
        if not attempt.member:  # counted in this process, Redis failing
            self.fallback.succeeded_now(attempt)
            return
        address_key, account_key = attempt.keys
        self.fallback.succeeded_now(attempt)  # the account's count of an outage, if any
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.delete(self.key(account_key))
                pipe.zrem(self.key(address_key), attempt.member)
                await pipe.execute()
        except RedisError as exc:  # the attempt then counts as a failure until it leaves the window
            self._failing(exc)

    async def close(self) -> None:
        """Close the client's connections."""
        with contextlib.suppress(RedisError):
            await self.redis.aclose()

    def _failing(self, exc: Exception) -> None:
        if not self._redis_failing:
            self._redis_failing = True
            log.warning(
                "failed logins are counted in this process only while Redis fails (%s); each replica "
                "then allows its own %d per address and account",
                exc,
                self.max_failures,
            )

    def _working(self) -> None:
        if self._redis_failing:
            self._redis_failing = False
            log.info("failed logins are counted in Redis again, across replicas")
