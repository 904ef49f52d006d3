"""The Redis commands a test's clients send, read off the wire (redis-py's `send_packed_command`).

Counted there, not where redis-py packs them (`Connection.pack_command`), because the hub packs its appends'
script calls itself (core/streaming/redis_wire.py). A script call is named by its script
(`EVALSHA xadd_many`), from the hub's scripts (core/streaming/redis_scripts.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import Connection

from core.streaming.redis_scripts import register_scripts

#: The hub's scripts by SHA (computed here: the client is never connected).
SCRIPT_NAMES = {script.sha: name for name, script in register_scripts(Redis()).items()}


def parse_commands(data: bytes) -> list[list[bytes]]:
    """The commands in `data` (RESP as a client sends them: arrays of bulk strings), each as its arguments."""
    commands: list[list[bytes]] = []
    at = 0
    while at < len(data):
        assert data[at : at + 1] == b"*", data[at : at + 20]
        end = data.index(b"\r\n", at)
        count, at = int(data[at + 1 : end]), end + 2
        args: list[bytes] = []
        for _ in range(count):
            assert data[at : at + 1] == b"$", data[at : at + 20]
            end = data.index(b"\r\n", at)
            length, at = int(data[at + 1 : end]), end + 2
            args.append(data[at : at + length])
            assert data[at + length : at + length + 2] == b"\r\n"
            at += length + 2
        commands.append(args)
    return commands


def command_name(args: list[bytes]) -> str:
    """`XADD`, `HSET`, ...; a script call with its script's name: `EVALSHA xadd_many`."""
    name = args[0].decode().upper()
    if name == "EVALSHA":
        return f"EVALSHA {SCRIPT_NAMES.get(args[1].decode(), args[1].decode())}"
    return name


def on_write(monkeypatch: pytest.MonkeyPatch, record: Callable[[str, list[list[bytes]]], None]) -> None:
    """`record(client, commands)` for every write of commands from now on (a pipeline's or a packed batch's is one);
    `client`: its connection's `_test_client` tag, or `other` (tests/test_redis_turn_start.py `label`).
    """
    send = Connection.send_packed_command

    async def recording(self: Connection, command: Any, check_health: bool = True) -> None:
        data = command.encode() if isinstance(command, str) else command
        data = data if isinstance(data, bytes) else b"".join(data)  # a list of chunks: a pipeline's
        record(getattr(self, "_test_client", "other"), parse_commands(data))
        await send(self, command, check_health)

    monkeypatch.setattr(Connection, "send_packed_command", recording)


def on_sent(monkeypatch: pytest.MonkeyPatch, record: Callable[[str, list[bytes]], None]) -> None:
    """`record(client, args)` for every command sent from now on (as `on_write`, one by one)."""

    def each(client: str, commands: list[list[bytes]]) -> None:
        for args in commands:
            record(client, args)

    on_write(monkeypatch, each)
