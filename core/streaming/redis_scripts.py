"""The Redis stream hub's layout: its keys, its Lua scripts and how a stream entry reads back as an event.

Per key, under `redis.key_prefix` + `hub:` (docs/ARCHITECTURE.md, "Cluster"): the stream `s:<key>`
(event N is the entry `N-0`; a buffer's end is the entry `<last>-<generation>`), the state hash
`h:<key>`, the set `open` of open keys, the channels `changes` and `cancel`, and `replica:<owner>`
(the name a live replica holds). Each write is one script, so it checks and changes in one step, except the
owner's appends under a valid lease: plain `XADD`s at the ids it counted (`redis_batches.py`), which is why the
scripts take the next id from the stream's newest entry as well as from the hash.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from core.streaming.hub import StreamEvent

END_TYPE = "__end__"
REPLAY_BATCH = 512
FOLLOW_BLOCK_MS = 1_000  # under the client's socket timeout
#: Connections the hub's commands share (appends, state, cancels); a command waits for a free one.
COMMAND_CONNECTIONS = 64
#: How long a command waits for a free connection before it fails.
COMMAND_WAIT_S = 10.0
#: Streams one replica can follow at once: one connection each, for its blocking read.
MAX_FOLLOWED_STREAMS = 10_000

# The next id of a buffer: the hash's `next` (set by `create`, `finish` and Redis-numbered appends) or past the
# stream's newest entry, whichever is higher: an owner's appends are plain `XADD`s at the ids it counted and do
# not touch the hash (docs/ARCHITECTURE.md, "Cluster", "What the shared services carry"). `nxt`: the hash's `next`,
# read by the caller with the other fields it needs (one `HMGET` per script, not one `HGET` per field).
_NEXT_ID = """
local function next_id(stream, nxt)
  nxt = tonumber(nxt or '1')
  local top = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
  if top then
    local number = tonumber(string.match(top[1], '^(%d+)'))
    if number + 1 > nxt then nxt = number + 1 end
  end
  return nxt
end
"""

# A change of a buffer is published on the changes channel with the state every replica mirrors (key, state,
# first id, last id, metadata JSON, error), so no replica reads the hash back per change (`redis_mirror.py`
# `BufferMirror.apply`). `last` is nil where the script does not know it (a metadata change): the receiver keeps
# the last id it has.
_ANNOUNCE = """
local function announce(channel, key, state, first, last, meta, err)
  redis.call('PUBLISH', channel, cjson.encode({k = key, s = state, f = tonumber(first), l = last, m = meta,
                                               e = err or ''}))
end
"""

# KEYS: stream, hash, open set; ARGV: key, meta JSON, owner, lease until (ms), channel
_CREATE = (
    _NEXT_ID
    + _ANNOUNCE
    + """
local state, nxt = unpack(redis.call('HMGET', KEYS[2], 'state', 'next'))
if state == 'open' then return -1 end
nxt = next_id(KEYS[1], nxt)
redis.call('HINCRBY', KEYS[2], 'gen', 1)
redis.call('HSET', KEYS[2], 'state', 'open', 'next', nxt, 'first', nxt, 'meta', ARGV[2], 'owner', ARGV[3],
           'lease', ARGV[4], 'cancel', '0', 'error', '')
redis.call('PERSIST', KEYS[2])
redis.call('PERSIST', KEYS[1])
if nxt > 1 then  -- the earlier buffers' events and end entries
  redis.call('XTRIM', KEYS[1], 'MINID', nxt .. '-0')
end
redis.call('SADD', KEYS[3], ARGV[1])
announce(ARGV[5], ARGV[1], 'open', nxt, nxt - 1, ARGV[2], '')
return nxt
"""
)

# KEYS: stream, hash; ARGV: type, data JSON, max events
_APPEND = (
    _NEXT_ID
    + """
local state, nxt = unpack(redis.call('HMGET', KEYS[2], 'state', 'next'))
if not state then return -2 end
if state ~= 'open' then return -1 end
local id = next_id(KEYS[1], nxt)
redis.call('HSET', KEYS[2], 'next', id + 1)
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], id .. '-0', 't', ARGV[1], 'd', ARGV[2])
return id
"""
)

# KEYS: stream, hash; ARGV: type, data JSON, max events, id, owner, strict ('1': refuse to skip ids).
# The owner's append at the id it counted, checked (docs/ARCHITECTURE.md, "Cluster", outages): the id, -1 (not
# open, or not this owner's any more), -2 (no buffer), -3 (strict, and an earlier id is not written yet). An id
# below the next is written already (a retry after a lost answer) and returns as written. Used where the owner's
# lease may have run out (after an outage, a stall): under a valid lease the owner's appends are plain `XADD`s
# (`redis_batches.py`).
_APPEND_AT = (
    _NEXT_ID
    + """
local state, owner, nxt = unpack(redis.call('HMGET', KEYS[2], 'state', 'owner', 'next'))
if not state then return -2 end
if state ~= 'open' or owner ~= ARGV[5] then return -1 end
local id = tonumber(ARGV[4])
nxt = next_id(KEYS[1], nxt)
if id < nxt then return id end
if id > nxt and ARGV[6] == '1' then return -3 end
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], id .. '-0', 't', ARGV[1], 'd', ARGV[2])
return id
"""
)

# KEYS: stream, hash, open set; ARGV: key, error ('' = none), ttl s, channel, the owner's next id (0: none; ids it
# counted but never wrote, past an outage's bound, are skipped). The last event's id (-1: not open).
_FINISH = (
    _NEXT_ID
    + _ANNOUNCE
    + """
local state, nxt, gen, first, meta = unpack(redis.call('HMGET', KEYS[2], 'state', 'next', 'gen', 'first', 'meta'))
if not state then return -2 end
if state ~= 'open' then return -1 end
nxt = math.max(next_id(KEYS[1], nxt), tonumber(ARGV[5] or '0'))
local last = nxt - 1
state = ARGV[2] ~= '' and 'error' or 'done'
redis.call('XADD', KEYS[1], last .. '-' .. gen, 't', '__end__', 'd', ARGV[2])
redis.call('HSET', KEYS[2], 'next', nxt, 'state', state, 'error', ARGV[2], 'lease', '0')
redis.call('SREM', KEYS[3], ARGV[1])
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  redis.call('EXPIRE', KEYS[1], ttl)
  redis.call('EXPIRE', KEYS[2], ttl)
else
  redis.call('DEL', KEYS[1], KEYS[2])
end
announce(ARGV[4], ARGV[1], state, first, last, meta, ARGV[2])
return last
"""
)

# KEYS: hash; ARGV: meta JSON to merge, channel, key
_UPDATE_META = (
    _ANNOUNCE
    + """
local state, first, meta = unpack(redis.call('HMGET', KEYS[1], 'state', 'first', 'meta'))
if state ~= 'open' then return -1 end
meta = cjson.decode(meta)
for k, v in pairs(cjson.decode(ARGV[1])) do meta[k] = v end
meta = cjson.encode(meta)
redis.call('HSET', KEYS[1], 'meta', meta)
announce(ARGV[2], ARGV[3], 'open', first, nil, meta, '')
return 1
"""
)

# KEYS: hash; ARGV: owner, lease until (ms). Returns the cancel flag (1/0), or -1 when not this owner's any more.
_RENEW = """
if redis.call('HGET', KEYS[1], 'state') ~= 'open' or redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return -1
end
redis.call('HSET', KEYS[1], 'lease', ARGV[2])
return tonumber(redis.call('HGET', KEYS[1], 'cancel'))
"""

# KEYS: hash; ARGV: new owner, now (ms), lease until (ms). 1 when the expired lease was taken over.
_TAKE_OVER = """
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'lease') or '0') >= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'lease', ARGV[3])
return 1
"""

# KEYS: hash; ARGV: cancel channel, key. The owner, or '' when the buffer is not open.
_REQUEST_CANCEL = """
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then return '' end
redis.call('HSET', KEYS[1], 'cancel', '1')
redis.call('PUBLISH', ARGV[1], ARGV[2])
return redis.call('HGET', KEYS[1], 'owner')
"""


def now_ms() -> int:
    """Milliseconds since the epoch (leases are compared across replicas, so wall-clock time)."""
    return int(time.time() * 1000)


def entry_id(raw: str) -> tuple[int, int]:
    """A stream entry id `N-S` as (event number, sequence); a sequence above 0 marks an end entry."""
    number, _, seq = raw.partition("-")
    return int(number), int(seq or 0)


@dataclass(frozen=True, slots=True)
class HubKeys:
    """The names of the hub's keys and channels under `prefix` (`<redis.key_prefix>hub:`)."""

    prefix: str

    def stream(self, key: str) -> str:
        """The Redis stream of the buffer `key`."""
        return f"{self.prefix}s:{key}"

    def hash(self, key: str) -> str:
        """The state hash of the buffer `key`."""
        return f"{self.prefix}h:{key}"

    def replica(self, owner: str) -> str:
        """The key a live replica named `owner` holds (one process per INSTANCE_ID)."""
        return f"{self.prefix}replica:{owner}"

    @property
    def changes_channel(self) -> str:
        """Where a buffer's key is published when it is opened, changed or finished."""
        return f"{self.prefix}changes"

    @property
    def cancel_channel(self) -> str:
        """Where a buffer's key is published when somebody asks its owner to stop it."""
        return f"{self.prefix}cancel"

    @property
    def open_set(self) -> str:
        """The set of open keys (the reaper's list)."""
        return f"{self.prefix}open"


def register_scripts(redis: Redis) -> dict[str, AsyncScript]:
    """The hub's scripts on `redis`, by name (loaded on first use, by `EVALSHA`)."""
    return {
        name: redis.register_script(body)
        for name, body in {
            "create": _CREATE,
            "append": _APPEND,
            "append_at": _APPEND_AT,
            "finish": _FINISH,
            "meta": _UPDATE_META,
            "renew": _RENEW,
            "take_over": _TAKE_OVER,
            "cancel": _REQUEST_CANCEL,
        }.items()
    }


def decode_event(number: int, fields: dict[str, str]) -> StreamEvent:
    """The event of a stream entry (`t`: type, `d`: JSON data); an end entry's data is `{"error": ...}`."""
    return StreamEvent(
        number,
        fields.get("t", ""),
        json.loads(fields.get("d") or "{}") if fields.get("t") != END_TYPE else {"error": fields.get("d") or None},
    )


def as_int(value: Any) -> int:
    """A script's integer reply (redis-py types script replies as Any)."""
    return int(value)
