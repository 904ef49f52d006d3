"""Server CPU and bytes sent to the browser for one 2,000-chunk streamed reply.

    .venv/bin/python bench/bench_render.py [--delays 0,5] [--words 2000] [--skip-naive]

For each demo-model delay (DEMO_MODEL_DELAY_MS), a fresh `python app.py` is
started (temporary DATA_DIR, free port on 127.0.0.1), then:

1. warm-up: one short turn through the REST API, so LiteLLM's import (3-5 s of
   CPU, normally started 1 s after start-up) is over before anything is measured;
2. engine only: the same `/lorem N` turn through the REST API with no page
   open (polled every 100 ms until it stops running): what the chat engine,
   LiteLLM and the database cost without any UI;
3. browser: headless Chromium opens `/`, waits for `window.socket.connected`,
   sends `/lorem N` through `[data-testid=msg-input]` + `[data-testid=send-btn]`
   and waits until `[data-testid=generating]` is hidden and the last
   `[data-testid=assistant-text]` holds all N words. Measured over that turn
   (click to done, plus 0.5 s for trailing updates): the server's user+sys CPU
   (/proc/<pid>/stat) and the payload bytes of the WebSocket frames the page
   received (CDP `Network.webSocketFrameReceived`; socket.io polling responses
   are counted too, should the transport fall back).

Then LiteLLM alone: `LLMGateway.stream` in this process (no hub, DB or UI), its
CPU per chunk and how long it keeps the event loop from running anything else.

Then the naive baseline, in this process without a browser: `markdown2.markdown()`
(as `ui.markdown` calls it: remove_indentation, extras fenced-code-blocks and
tables) of every prefix of the same N-token text, i.e. one `set_content` per
chunk; its CPU and total HTML bytes, against the browser turn.

Budget (docs/ARCHITECTURE.md): a long streamed reply under 1 s server CPU and under 1 MB sent.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cpu_seconds, http_json, running_server, table, wait_cpu_idle  # noqa: E402

from core.chat.demo_model import plan_reply  # noqa: E402

CPU_BUDGET_S = 1.0
BYTES_BUDGET = 1_000_000
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
SETTLE_S = 0.5


def reply_tokens(words: int) -> list[str]:
    return plan_reply([{"role": "user", "content": f"/lorem {words}"}], None).tokens


# -- REST turns -------------------------------------------------------------------------


def rest_turn(port: int, pid: int, text: str, timeout: float = 120.0) -> dict[str, float]:
    """Start a turn in a new session through the API and poll its status every 50 ms until it ends.

    Returns wall and server CPU seconds, and the slowest status response (a cheap GET whose
    latency shows how long the server's event loop was busy with something else).
    """
    status, session = http_json(port, "POST", "/api/sessions", {})
    assert status == 201, (status, session)
    sid = session["id"]
    latencies: list[float] = []
    cpu0, t0 = cpu_seconds(pid), time.perf_counter()
    status, body = http_json(port, "POST", f"/api/sessions/{sid}/messages", {"content": text})
    assert status == 202, (status, body)
    while True:
        time.sleep(0.05)
        t = time.perf_counter()
        status, info = http_json(port, "GET", f"/api/sessions/{sid}", timeout=timeout)
        latencies.append(time.perf_counter() - t)
        assert status == 200, (status, info)
        if not info["running"]:
            break
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"turn {text!r} still running after {timeout} s")
    latencies.sort()
    return {
        "wall_s": time.perf_counter() - t0,
        "cpu_s": cpu_seconds(pid) - cpu0,
        "polls": len(latencies),
        "max_poll_ms": latencies[-1] * 1000,
        "median_poll_ms": latencies[len(latencies) // 2] * 1000,
    }


# -- the browser turn ---------------------------------------------------------------------


@dataclass
class Frames:
    """What the page received (and sent) over its socket."""

    recv_bytes: int = 0
    recv_frames: int = 0
    sent_bytes: int = 0
    sent_frames: int = 0
    polling_bytes: int = 0
    polling_responses: int = 0
    _polling_ids: set[str] = field(default_factory=set)

    def reset(self) -> None:
        self.recv_bytes = self.recv_frames = self.sent_bytes = self.sent_frames = 0
        self.polling_bytes = self.polling_responses = 0

    @staticmethod
    def size(response: dict) -> int:
        payload = response.get("payloadData", "")
        if response.get("opcode") == 2:  # binary frames come base64-encoded
            return len(payload) * 3 // 4 - payload.count("=")
        return len(payload.encode("utf-8"))

    def on_received(self, params: dict) -> None:
        self.recv_frames += 1
        self.recv_bytes += self.size(params["response"])

    def on_sent(self, params: dict) -> None:
        self.sent_frames += 1
        self.sent_bytes += self.size(params["response"])

    def on_request(self, params: dict) -> None:
        if "/socket.io/" in params["request"]["url"] and "transport=polling" in params["request"]["url"]:
            self._polling_ids.add(params["requestId"])

    def on_loading_finished(self, params: dict) -> None:
        if params["requestId"] in self._polling_ids:
            self._polling_ids.discard(params["requestId"])
            self.polling_responses += 1
            self.polling_bytes += int(params.get("encodedDataLength", 0))


DONE_JS = """([n, last]) => {
  const els = document.querySelectorAll('[data-testid=assistant-text]');
  if (!els.length) return false;
  const words = els[els.length - 1].innerText.trim().split(/\\s+/);
  const gen = document.querySelector('[data-testid=generating]');
  const hidden = !gen || !gen.checkVisibility();
  return hidden && words.length === n && words[words.length - 1] === last;
}"""

WORDS_JS = """() => {
  const els = document.querySelectorAll('[data-testid=assistant-text]');
  return els.length ? els[els.length - 1].innerText.trim().split(/\\s+/) : [];
}"""


def browser_turn(port: int, pid: int, words: int, expected: list[str], timeout_s: float) -> dict[str, float]:
    from playwright.sync_api import sync_playwright

    frames = Frames()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 800})
            page = context.new_page()
            cdp = context.new_cdp_session(page)
            cdp.send("Network.enable")
            cdp.on("Network.webSocketFrameReceived", frames.on_received)
            cdp.on("Network.webSocketFrameSent", frames.on_sent)
            cdp.on("Network.requestWillBeSent", frames.on_request)
            cdp.on("Network.loadingFinished", frames.on_loading_finished)

            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_function("() => window.socket && window.socket.connected", timeout=30_000)
            page.fill("[data-testid=msg-input]", f"/lorem {words}")

            # Idle: the page open, nothing streaming (the 80 ms flush timer keeps ticking).
            page.wait_for_timeout(500)
            frames.reset()
            idle_cpu0 = cpu_seconds(pid)
            page.wait_for_timeout(2000)
            idle_cpu_per_s = (cpu_seconds(pid) - idle_cpu0) / 2.0
            idle_bytes_per_s = frames.recv_bytes / 2.0

            frames.reset()
            cpu0, t0 = cpu_seconds(pid), time.perf_counter()
            page.click("[data-testid=send-btn]")
            page.wait_for_function(DONE_JS, arg=[words, expected[-1]], timeout=timeout_s * 1000, polling=50)
            t_done = time.perf_counter()
            page.wait_for_timeout(SETTLE_S * 1000)  # trailing updates (session list) and CDP events
            cpu = cpu_seconds(pid) - cpu0
            got = page.evaluate(WORDS_JS)
            if got != expected:
                raise AssertionError(
                    f"final text differs: {len(got)} words, first mismatch at "
                    f"{next(i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b)}"
                )
            return {
                "wall_s": t_done - t0,
                "cpu_s": cpu,
                "recv_bytes": frames.recv_bytes + frames.polling_bytes,
                "recv_frames": frames.recv_frames,
                "polling_responses": frames.polling_responses,
                "sent_bytes": frames.sent_bytes,
                "idle_cpu_per_s": idle_cpu_per_s,
                "idle_bytes_per_s": idle_bytes_per_s,
            }
        finally:
            browser.close()


def measure(delay_ms: int, words: int, expected: list[str]) -> dict[str, float]:
    with running_server({"DEMO_MODEL_DELAY_MS": str(delay_ms)}) as server:
        warm = rest_turn(server.port, server.pid, "hello")  # includes LiteLLM's import
        wait_cpu_idle(server.pid)
        rest_turn(server.port, server.pid, f"/lorem {words}")  # warms the long-stream path; not counted
        wait_cpu_idle(server.pid)
        engine = rest_turn(server.port, server.pid, f"/lorem {words}")
        wait_cpu_idle(server.pid)
        turn_timeout = 60 + words * delay_ms / 1000 * 3
        result = browser_turn(server.port, server.pid, words, expected, turn_timeout)
        result.update(
            warm_wall=warm["wall_s"],
            warm_cpu=warm["cpu_s"],
            engine_wall=engine["wall_s"],
            engine_cpu=engine["cpu_s"],
            engine_max_poll_ms=engine["max_poll_ms"],
            engine_median_poll_ms=engine["median_poll_ms"],
            engine_polls=engine["polls"],
        )
        return result


# -- the model gateway alone --------------------------------------------------------------


def gateway_only(words: int) -> dict[str, float]:
    """`LLMGateway.stream` of `/lorem N` in this process (delay 0): LiteLLM's own cost per chunk.

    A ticker task (`await asyncio.sleep(0)` in a loop) measures how long the event
    loop goes without running anything else while the stream runs.
    """
    import asyncio
    import gc

    import core.chat.llm
    from core.chat.llm import LLMGateway, TextDelta, litellm_module

    t = time.process_time()
    litellm_module()
    import_cpu = time.process_time() - t
    tracked = len(gc.get_objects())

    build_times: list[float] = []
    original_build = core.chat.llm._build_result

    def timed_build(*a, **k):
        t0 = time.perf_counter()
        try:
            return original_build(*a, **k)
        finally:
            build_times.append(time.perf_counter() - t0)

    gc_pauses: list[tuple[int, float]] = []
    gc_started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_started[0] = time.perf_counter()
        else:
            gc_pauses.append((info["generation"], time.perf_counter() - gc_started[0]))

    async def run() -> dict[str, float]:
        gateway = LLMGateway(demo_delay_s=0)
        stop = False
        gaps: list[float] = []

        async def ticker() -> None:
            last = time.perf_counter()
            while not stop:
                await asyncio.sleep(0)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        async def stream() -> tuple[int, float, float]:
            chunks = 0
            cpu0, t0 = time.process_time(), time.perf_counter()
            async for event in gateway.stream("local/demo", [{"role": "user", "content": f"/lorem {words}"}]):
                chunks += isinstance(event, TextDelta)
            return chunks, time.process_time() - cpu0, time.perf_counter() - t0

        await stream()  # warm
        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        core.chat.llm._build_result = timed_build
        gc.callbacks.append(on_gc)
        try:
            chunks, cpu, wall = await stream()
        finally:
            gc.callbacks.remove(on_gc)
            core.chat.llm._build_result = original_build
        stop = True
        await tick
        gen2 = [d for g, d in gc_pauses if g == 2]
        return {
            "chunks": chunks,
            "cpu_s": cpu,
            "wall_s": wall,
            "longest_block_ms": max(gaps) * 1000,
            "ticks": len(gaps),
            "build_s": sum(build_times),
            "gen2": len(gen2),
            "gen2_max_ms": max(gen2, default=0) * 1000,
            "gc_total_s": sum(d for _, d in gc_pauses),
        }

    result = asyncio.run(run())
    result["import_cpu_s"] = import_cpu
    result["tracked"] = tracked
    return result


# -- the naive baseline --------------------------------------------------------------------


def naive(tokens: list[str]) -> dict[str, float]:
    """One full markdown render per chunk, as `ui.markdown.set_content` would do it."""
    import markdown2
    from nicegui.helpers import remove_indentation

    extras = ["fenced-code-blocks", "tables"]
    text = ""
    html_bytes = json_bytes = 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    for token in tokens:
        text += token
        html = markdown2.markdown(remove_indentation(text), extras=extras)
        html_bytes += len(html.encode("utf-8"))
        json_bytes += len(json.dumps(html).encode("utf-8"))  # as it travels inside a socket.io update
    return {
        "cpu_s": time.process_time() - cpu0,
        "wall_s": time.perf_counter() - t0,
        "html_bytes": html_bytes,
        "json_bytes": json_bytes,
        "final_html": len(html.encode("utf-8")),
        "final_text": len(text),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delays", default="0,5", help="DEMO_MODEL_DELAY_MS values, comma-separated")
    parser.add_argument("--words", type=int, default=2000, help="chunks (words) in the reply")
    parser.add_argument("--skip-naive", action="store_true")
    parser.add_argument("--skip-gateway", action="store_true", help="skip the in-process LiteLLM-only measurement")
    args = parser.parse_args()
    delays = [int(d) for d in args.delays.split(",") if d.strip()]

    tokens = reply_tokens(args.words)
    assert len(tokens) == args.words, len(tokens)
    expected = "".join(tokens).split()
    print(f"/lorem {args.words}: {len(tokens):,} chunks, {len(''.join(tokens)):,} characters of markdown\n")

    results = {d: measure(d, args.words, expected) for d in delays}

    rows = []
    for d, r in results.items():
        ui_cpu = r["cpu_s"] - r["engine_cpu"]
        rows.append(
            [
                f"{d} ms",
                f"{r['wall_s']:.2f}",
                f"{r['cpu_s']:.2f}",
                f"{r['engine_cpu']:.2f}",
                f"{ui_cpu:.2f}",
                f"{r['recv_bytes'] / 1e6:.3f}",
                f"{r['recv_frames']:,}",
                "ok" if r["cpu_s"] < CPU_BUDGET_S else "OVER",
                "ok" if r["recv_bytes"] < BYTES_BUDGET else "OVER",
            ]
        )
    print("Browser turn (server = python app.py; CPU = user+sys of the server process over the turn):\n")
    print(
        table(
            [
                "demo delay",
                "turn wall s",
                "server CPU s",
                "of which engine-only",
                "UI share s",
                "MB received",
                "WS frames",
                "CPU < 1 s",
                "bytes < 1 MB",
            ],
            rows,
        )
    )
    print("\nengine-only = the same turn through the REST API with no page open (chat engine + LiteLLM + DB);")
    print("UI share = server CPU - engine-only (what the page's subscription and rendering add).\n")
    detail = [
        [
            f"{d} ms",
            f"{r['engine_wall']:.2f}",
            f"{r['engine_median_poll_ms']:.0f} / {r['engine_max_poll_ms']:,.0f} ({r['engine_polls']})",
            f"{r['warm_cpu']:.2f}",
            f"{r['idle_cpu_per_s'] * 1000:.0f}",
            f"{r['idle_bytes_per_s']:.0f}",
            f"{r['sent_bytes']:,}",
            r["polling_responses"],
        ]
        for d, r in results.items()
    ]
    print(
        table(
            [
                "demo delay",
                "engine-only wall s",
                "status GET during it, median / max ms (n)",
                "warm-up turn CPU s (LiteLLM import)",
                "idle page CPU ms/s",
                "idle page B/s",
                "bytes sent by page",
                "socket.io polling responses",
            ],
            detail,
        )
    )
    print("(A status GET normally answers in a few ms; its max shows the longest the event loop was held.)")

    if not args.skip_gateway:
        g = gateway_only(args.words)
        print(
            f"\nModel gateway alone, in-process (LLMGateway.stream of /lorem {args.words}, demo delay 0; "
            "no hub, no DB, no UI):"
        )
        print(
            table(
                ["measure", "value"],
                [
                    ["chunks", f"{g['chunks']:,}"],
                    ["CPU s", f"{g['cpu_s']:.2f} ({g['cpu_s'] / g['chunks'] * 1e3:.2f} ms per chunk)"],
                    ["wall s", f"{g['wall_s']:.2f}"],
                    [
                        "longest event-loop block",
                        f"{g['longest_block_ms']:,.0f} ms ({g['ticks']:,} ticks of a sleep(0) ticker meanwhile)",
                    ],
                    [
                        "of which _build_result (litellm.stream_chunk_builder, one blocking call at the end)",
                        f"{g['build_s']:.2f} s",
                    ],
                    [
                        "GC during the stream",
                        f"{g['gc_total_s']:.2f} s; {g['gen2']} gen-2 collections, longest {g['gen2_max_ms']:,.0f} ms",
                    ],
                    ["litellm import CPU s (this process)", f"{g['import_cpu_s']:.2f}"],
                    ["objects tracked by the GC after the import", f"{g['tracked']:,}"],
                ],
            )
        )

    if not args.skip_naive:
        n = naive(tokens)
        print(f"\nNaive baseline (in-process, one full markdown2 render per chunk, {args.words:,} renders):")
        print(
            table(
                ["measure", "value"],
                [
                    ["CPU s", f"{n['cpu_s']:.2f}"],
                    ["HTML bytes (sum over renders)", f"{n['html_bytes']:,} ({n['html_bytes'] / 1e6:.1f} MB)"],
                    ["as JSON strings", f"{n['json_bytes']:,} ({n['json_bytes'] / 1e6:.1f} MB)"],
                    ["final HTML / final text", f"{n['final_html']:,} / {n['final_text']:,} bytes"],
                ],
            )
        )
        print("\nRatios, naive baseline / browser turn (higher = the app does better):\n")
        ratio_rows = []
        for d, r in results.items():
            ui_cpu = max(r["cpu_s"] - r["engine_cpu"], 0.01)
            ratio_rows.append(
                [
                    f"{d} ms",
                    f"{n['cpu_s'] / r['cpu_s']:.1f}×",
                    f"{n['cpu_s'] / ui_cpu:.1f}×",
                    f"{n['html_bytes'] / r['recv_bytes']:.1f}×",
                ]
            )
        print(
            table(
                ["demo delay", "CPU: naive / whole turn", "CPU: naive / UI share", "bytes: naive HTML / received"],
                ratio_rows,
            )
        )
        print(
            "(The naive figures count only the markdown rendering and the HTML: no engine, no LiteLLM, no JSON "
            "framing; the ratios are therefore conservative.)"
        )


if __name__ == "__main__":
    main()
