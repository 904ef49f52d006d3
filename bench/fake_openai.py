r"""A fake OpenAI-compatible chat-completions server for the benches: streaming on a fixed clock.

    .venv/bin/python bench/fake_openai.py --port 8100 [--delay-ms 20] [--words 150]

`POST /v1/chat/completions` with `stream: true` answers one word per chunk, a chunk every
`--delay-ms` on a fixed clock (the n-th word is due at start + n × delay, so a slow reader
does not slow the clock down), then a chunk with `finish_reason`, a usage chunk when the
request asks for `stream_options.include_usage`, and `[DONE]`. The first chunk carries the
role, as OpenAI's do. How many words: `/lorem N` in the last user message (as the demo model
reads it), else `--words`.

Tool calls on demand: a last user message `/tool NAME {json}` is answered with one call of
the tool NAME (its arguments split over three fragments, only the first with the id and the
name, as OpenAI sends them) and `finish_reason: tool_calls`; the request after the tool's
result (a last message of role `tool`) gets the words.

Without `stream` the same reply comes as one `chat.completion` object. Anything else is 404.

It is plain asyncio (HTTP/1.1, keep-alive, chunked bodies), not a web framework, so its own
CPU per chunk stays small next to the app's: the bench runs it on the load client's CPU.
Only 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from typing import Any

LOREM = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et dolore "
    "magna aliqua ut enim ad minim veniam quis nostrud exercitation ullamco laboris nisi ut aliquip ex ea commodo"
).split()
_LOREM_ASK = re.compile(r"^/lorem\s+(\d+)")
_TOOL_ASK = re.compile(r"^/tool\s+(\S+)\s*(.*)$", re.S)


def _last(messages: list[dict[str, Any]]) -> tuple[str, str]:
    """The role and text of the last message."""
    if not messages:
        return "", ""
    last = messages[-1]
    content = last.get("content") or ""
    if isinstance(content, list):  # parts
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(last.get("role") or ""), str(content).strip()


class Reply:
    """What one request is answered: words, or one tool call."""

    def __init__(self, body: dict[str, Any], default_words: int) -> None:
        role, content = _last(list(body.get("messages") or []))
        self.words = default_words
        self.call: tuple[str, str] | None = None
        if role == "user":
            if m := _LOREM_ASK.match(content):
                self.words = int(m.group(1))
            elif m := _TOOL_ASK.match(content):
                self.call = (m.group(1), m.group(2).strip() or "{}")
        self.prompt_tokens = sum(len(str(m.get("content") or "").split()) for m in body.get("messages") or [])

    def text(self) -> list[str]:
        return [LOREM[i % len(LOREM)] + " " for i in range(self.words)]


class FakeOpenAI:
    """The server; `await serve()` runs it until cancelled."""

    def __init__(self, port: int, delay_s: float, default_words: int = 150) -> None:
        self.port = port
        self.delay_s = delay_s
        self.default_words = default_words
        self.count = 0

    async def serve(self) -> None:
        server = await asyncio.start_server(self._connection, "127.0.0.1", self.port, backlog=1024)
        async with server:
            await server.serve_forever()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: httpx reuses its connections
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                if method != "POST" or not path.rstrip("/").endswith("/chat/completions"):
                    self._json(writer, 404, {"error": {"message": "not found", "type": "not_found"}})
                else:
                    await self._completion(writer, json.loads(raw or b"{}"))
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    @staticmethod
    def _json(writer: asyncio.StreamWriter, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data
        )

    async def _completion(self, writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
        self.count += 1
        reply = Reply(body, self.default_words)
        cid, model, created = f"chatcmpl-bench{self.count}", str(body.get("model") or "fake"), int(time.time())
        words = [] if reply.call else reply.text()
        usage = {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": len(words) or 3,
            "total_tokens": reply.prompt_tokens + (len(words) or 3),
        }
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": "".join(words) or None}
            if reply.call:
                name, args = reply.call
                message["tool_calls"] = [
                    {"id": "call_1", "type": "function", "function": {"name": name, "arguments": args}}
                ]
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if reply.call else "stop"}
            obj = {"id": cid, "object": "chat.completion", "created": created, "model": model}
            self._json(writer, 200, {**obj, "choices": [choice], "usage": usage})
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        prefix = f'{{"id":"{cid}","object":"chat.completion.chunk","created":{created},"model":{json.dumps(model)},'

        def send(rest: str) -> None:
            event = f"data: {prefix}{rest}}}\n\n".encode()
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))

        def delta(d: dict[str, Any], finish: str | None = None) -> str:
            choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}
            return '"choices":' + json.dumps([choice])

        send(delta({"role": "assistant", "content": ""}))
        start = time.monotonic()
        if reply.call:
            name, args = reply.call
            third = -(-len(args) // 3) or 1
            pieces = [args[i : i + third] for i in range(0, len(args), third)] or [""]
            for n, piece in enumerate(pieces):
                fragment: dict[str, Any] = {"index": 0, "function": {"arguments": piece}}
                if n == 0:
                    fragment.update(id="call_1", type="function", function={"name": name, "arguments": piece})
                send(delta({"tool_calls": [fragment]}))
        for i, word in enumerate(words):
            due = start + (i + 1) * self.delay_s - time.monotonic()
            if due > 0:
                await writer.drain()
                await asyncio.sleep(due)
            send(delta({"content": word}))
        send(delta({}, "tool_calls" if reply.call else "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            send('"choices":[],"usage":' + json.dumps(usage))
        done = b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))


def main() -> None:
    parser = argparse.ArgumentParser(description="A fake OpenAI-compatible server streaming on a fixed clock")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=20.0, help="between words (20 ms: 50 tokens/s)")
    parser.add_argument("--words", type=int, default=150, help="words when the request does not say /lorem N")
    args = parser.parse_args()
    try:
        asyncio.run(FakeOpenAI(args.port, args.delay_ms / 1000, args.words).serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
