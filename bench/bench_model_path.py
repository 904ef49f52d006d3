r"""The real model path beside the demo model (issue 38): the same capacity test, in one run, and the ratio.

    .venv/bin/python bench/bench_model_path.py [--sizes 50 100] [--tokens 200] [--delay-ms 20] [--pin]
                                               [--runs 1] [--profile N]
    (or: .venv/bin/python bench/bench_capacity.py --model openai [the same options])

For each run, two `python app.py` one after the other, each with N chats (made before the
clock) sent `/lorem <tokens>` at once and their streams read to the end, as
`bench_capacity.py`'s chat stream (its client and its figures):

- **demo**: the offline demo model at `--delay-ms` between tokens (`DEFAULT_MODEL=local/demo`);
- **openai**: `DEFAULT_MODEL=openai/bench-fake` with `LLM_API_BASE` at the bundled fake
  OpenAI-compatible server (`bench/fake_openai.py`, one word per chunk on a fixed clock of
  `--delay-ms`, a usage chunk at the end): every token goes through LiteLLM, the openai SDK and
  a real HTTP stream, as with a provider.

Printed per model and N: tokens/s, server CPU per token, time to first token p50 / p99 (from the
first request), added gap p99; then per N the ratio openai / demo of the CPU per token (issue 38's
goal: at most 1.3 at N = 100) and of tokens/s. `--pin` puts the app on CPU 1, the load client and
the fake server on CPU 0. `--profile N` records the openai server with py-spy (when installed)
during its N run and prints the functions with the most samples (own and with callees).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import PYTHON, ROOT, free_port, http_json, spawn, stop, table, wait_first_200  # noqa: E402
from bench.bench_capacity import chat_run, load, measure, new_chats  # noqa: E402

MODELS = ("demo", "openai")


def start_fake(port: int, delay_ms: float, words: int) -> subprocess.Popen:
    """The fake OpenAI-compatible server in its own process, answering once it listens."""
    proc = subprocess.Popen(
        [PYTHON, str(ROOT / "bench" / "fake_openai.py"), "--port", str(port), "--delay-ms", str(delay_ms)]
        + ["--words", str(words)],
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            status, _ = http_json(port, "GET", "/")
            if status == 404:
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the fake OpenAI server did not start")


def profile_report(path: Path, top: int = 25) -> str:
    """The functions with the most samples of a py-spy `--format raw` file: own samples and with callees."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 2)[-1] for f in stack.split(";")
        ]
        own[frames[-1]] += n
        for frame in set(frames):
            total[frame] += n
    rows = [[f"{c / samples * 100:.1f} %", name] for name, c in own.most_common(top)]
    rows_total = [[f"{c / samples * 100:.1f} %", name] for name, c in total.most_common(top * 2)]
    return (
        f"{samples} samples\n\nown:\n"
        + table(["share", "function (file"], rows)
        + "\n\nwith callees:\n"
        + table(["share", "function (file"], rows_total)
    )


async def one_model(model: str, args: argparse.Namespace, fake_port: int, tmp: Path) -> dict[int, dict]:
    """The sizes on a fresh app with this model: the figures per N."""
    port = free_port()
    env = {"DEMO_MODEL_DELAY_MS": str(args.delay_ms), "PUBLIC_BASE_URL": f"http://127.0.0.1:{port}", "LOOP_PROBE": "1"}
    if model == "openai":
        env.update(
            DEFAULT_MODEL="openai/bench-fake",
            LLM_API_BASE=f"http://127.0.0.1:{fake_port}/v1",
            LLM_API_KEY="sk-bench-fake",
        )
    server = spawn(tmp / f"data-{model}-{port}", port=port, env_extra=env)
    if args.pin:
        os.sched_setaffinity(server.proc.pid, {1})
    out: dict[int, dict] = {}
    try:
        wait_first_200(server, path="/api/me", timeout=60)
        await chat_run(port, new_chats(port, 2), "/lorem 5")  # warm-up: LiteLLM's import and first call
        probe_lines = 0
        for n in args.sizes:
            spy = None
            if args.profile == n and model == "openai" and shutil.which("py-spy", path=str(Path(PYTHON).parent)):
                raw = tmp / f"profile-{n}.txt"
                spy = subprocess.Popen(
                    [str(Path(PYTHON).parent / "py-spy"), "record", "--pid", str(server.pid), "--format", "raw"]
                    + ["--rate", "200", "--nonblocking", "--output", str(raw)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(1.0)
            _, figures, probe_lines = await measure(
                server, "chat", n, f"/lorem {args.tokens}", args.tokens, args.delay_ms, "", probe_lines
            )
            figures["load"] = load()
            out[n] = figures
            print(
                f"  {model} N={n}: {figures['rate']:,.0f} tokens/s, {figures['cpu_us']:.0f} µs/token, first token "
                f"p50 {figures['first_p50']:.2f} s / p99 {figures['first_p99']:.2f} s (send accepted p50 "
                f"{figures['accept_p50']:.2f} / p99 {figures['accept_p99']:.2f} s), short {figures['short']} "
                f"{figures['errors'][:1]}, load {figures['load']}",
                flush=True,
            )
            if spy is not None:
                spy.send_signal(2)
                spy.wait(30)
                if (tmp / f"profile-{n}.txt").exists():
                    print(profile_report(tmp / f"profile-{n}.txt"))
    finally:
        stop(server)
    return out


async def run(args: argparse.Namespace) -> None:
    """All runs; the tables and the ratios."""
    print(f"load average at start: {load()}")
    all_cpus = os.sched_getaffinity(0)
    if args.pin:
        os.sched_setaffinity(0, {0})  # the fake server (started below) inherits it
    rows, ratios = [], []
    with tempfile.TemporaryDirectory(prefix="bench-model-path-") as tmpdir:
        tmp = Path(tmpdir)
        fake_port = free_port()
        fake = start_fake(fake_port, args.delay_ms, args.tokens)
        try:
            for run_no in range(1, args.runs + 1):
                got = {model: await one_model(model, args, fake_port, tmp) for model in MODELS}
                for n in args.sizes:
                    for model in MODELS:
                        f = got[model][n]
                        rows.append(
                            [
                                run_no,
                                n,
                                model,
                                f"{f['rate']:,.0f}",
                                f"{f['cpu_us']:.0f}",
                                f"{f['first_p50']:.2f} / {f['first_p99']:.2f}",
                                f"{f['accept_p50']:.2f} / {f['accept_p99']:.2f}",
                                f"{f['added']:.1f}",
                                f"{f['bursts'] * 100:.0f} %",
                                f["short"],
                                f["load"],
                            ]
                        )
                    demo, real = got["demo"][n], got["openai"][n]
                    ratio = real["cpu_us"] / demo["cpu_us"]
                    ratios.append([run_no, n, f"{ratio:.2f}", f"{real['rate'] / demo['rate']:.2f}"])
        finally:
            fake.terminate()
            fake.wait(5)
            os.sched_setaffinity(0, all_cpus)
    print(
        f"\nchat turns at once, each /lorem {args.tokens} at {args.delay_ms} ms per token"
        + (" (pinned)" if args.pin else "")
    )
    headers = [
        "run",
        "N",
        "model",
        "tokens/s",
        "server CPU µs/token",
        "first token p50 / p99 s",
        "send accepted p50 / p99 s",
    ]
    print(table(headers + ["added gap p99 ms", "gaps < 2 ms", "short streams", "load"], rows))
    print("\nopenai / demo (goal: CPU per token ≤ 1.3 at N = 100)")
    print(table(["run", "N", "CPU per token ratio", "tokens/s ratio"], ratios))
    print(f"load average at end: {load()}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="The LiteLLM path to a fake OpenAI-compatible server beside the demo model")
    p.add_argument("--sizes", type=int, nargs="+", default=[50, 100])
    p.add_argument("--tokens", type=int, default=200, help="words per reply")
    p.add_argument("--delay-ms", type=int, default=20, help="between tokens, both models (20 ms: 50 tokens/s)")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--pin", action="store_true", help="the app on CPU 1; this client and the fake server on CPU 0")
    p.add_argument("--profile", type=int, default=None, help="py-spy the openai server during this N")
    return p


if __name__ == "__main__":
    asyncio.run(run(parser().parse_args()))
