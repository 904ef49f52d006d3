r"""What a cluster replica costs against one process, and what Redis and PostgreSQL carry (issue 41, items 1-2).

    .venv/bin/python bench/bench_cluster.py --cost [--sizes 50 100] [--tokens 150] [--delay-ms 20] [--runs 2]
                                                   [--pin] [--profile N] [--no-pg-proxy]
    (or: .venv/bin/python bench/bench_cluster_cost.py [the same options])

Interleaved in each run, on the same work, one after the other:

- **process**: `python app.py` in its default mode (SQLite, the in-memory hub), with an account;
- **replica**: one `python app.py` with `CLUSTER=true` on a PostgreSQL database of the run's own
  and a Redis key prefix of its own (`tests/utils/cluster.py`), with an account.

With `--replica-env NAME=VALUE ...`, a third app in each run: a replica with those settings too
(mode `replica*`; e.g. `CLUSTER_APPEND_GATHER_MS=0`), to measure one setting within one run.

For each N, two phases, each on N chats made before the clock (HTTP Basic, the same account):

- **start**: N turns of `/lorem 1` at once (one token each): what a turn start costs;
- **stream**: N turns of `/lorem <tokens>` at once at `--delay-ms` per token (20 ms: 50 tokens/s),
  each stream read to its end (bench_capacity.py's raw-socket client), with the added gap p99.

Per phase, before/after deltas of: the app's CPU (utime+stime of its process, /proc); Redis's CPU
(`INFO cpu` used_cpu_sys + used_cpu_user), bytes (`INFO stats` total_net_input/output_bytes) and
commands (`INFO commandstats` calls); the CPU of the PostgreSQL backends serving the run's database
(their pids from `pg_stat_activity`, /proc) and of all postgres processes; the statements, round
trips and bytes the app sent PostgreSQL (a counting proxy between them, `bench/_pg_wire.py`: Execute
and simple-query messages, Syncs; `--no-pg-proxy` connects directly). Redis and PostgreSQL are
shared with whoever else uses them on this machine: their figures are as measured, others' work
included (the process's rows show that background: it uses neither).

Printed per (run, N, mode): tokens/s, added p99, and per streamed token (stream phase / tokens)
and per turn start (start phase / N) each cost; then per (run, N) the ratio replica / process of
the app's own CPU per token, and with Redis's and PostgreSQL's CPU added (issue 41's goals: ≤ 1.15
and ≤ 1.3). `--pin`: the app on CPU 1, this client (and the proxy) on CPU 0; Redis and PostgreSQL run
where the kernel puts them. `--profile N`: py-spy records each app during its stream phase at N.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (  # noqa: E402
    CLK_TCK,
    PYTHON,
    ROOT,
    clean_env,
    cpu_seconds,
    free_port,
    spawn,
    stop,
    table,
    wait_cpu_idle,
    wait_first_200,
)
from bench._pg_wire import read_counts  # noqa: E402
from bench.bench_capacity import StreamRecord, chat_token, load, percentile, read_stream  # noqa: E402

MODES = ("process", "replica")
ACCOUNT = ("admin", "bench-cost-password-1")
AUTH = {"Authorization": "Basic " + base64.b64encode(f"{ACCOUNT[0]}:{ACCOUNT[1]}".encode()).decode()}


# -- the shared services' counters ------------------------------------------------------------------


class Services:
    """Where the replica keeps its state, and how the bench reads Redis's and PostgreSQL's counters."""

    def __init__(self, admin_url: str, database_url: str, redis_url: str, prefix: str, proxy_port: int | None):
        import psycopg
        import redis

        self.database_url, self.redis_url, self.prefix = database_url, redis_url, prefix
        self.db_name = database_url.rsplit("/", 1)[1]
        self.redis = redis.Redis.from_url(redis_url)
        self.pg = psycopg.connect(admin_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
        self.proxy_port = proxy_port

    def snapshot(self) -> dict[str, float]:
        cpu, stats, commands = self.redis.info("cpu"), self.redis.info("stats"), self.redis.info("commandstats")
        out = {
            "redis_cpu": float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
            "redis_in": float(stats["total_net_input_bytes"]),
            "redis_out": float(stats["total_net_output_bytes"]),
            "redis_calls": float(sum(v["calls"] for v in commands.values())),
            **{f"cmd_{name[8:]}": float(v["calls"]) for name, v in commands.items()},
            **_postgres_cpu(),
        }
        self.pg.execute("select pg_stat_clear_snapshot()")
        row = self.pg.execute(
            "select xact_commit + xact_rollback, tup_returned + tup_fetched, tup_inserted + tup_updated + tup_deleted "
            "from pg_stat_database where datname = %s",
            (self.db_name,),
        ).fetchone()
        out["pg_xacts"], out["pg_tup_read"], out["pg_tup_written"] = (float(v or 0) for v in row or (0, 0, 0))
        pids = [p for (p,) in self.pg.execute("select pid from pg_stat_activity where datname = %s", (self.db_name,))]
        for pid in pids:
            with contextlib.suppress(OSError):
                out[f"pid{pid}"] = cpu_seconds(pid)
        if self.proxy_port is not None:
            for key, value in read_counts(self.proxy_port).items():
                out[f"wire_{key}"] = float(value)
        return out

    def close(self) -> None:
        self.redis.close()
        self.pg.close()


def _postgres_cpu() -> dict[str, float]:
    """CPU seconds of every postgres process on the machine (all databases, its background workers), by pid."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                raw = f.read().decode()
            if "(postgres)" not in raw[: raw.index(")") + 1]:
                continue
            fields = raw[raw.rindex(")") + 2 :].split()
            out[f"pgp{entry.name}"] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The deltas after - before; processes' CPU summed (one started meanwhile counts from zero, one gone is lost)."""
    out = {k: after[k] - before.get(k, 0.0) for k in after if not k.startswith(("pid", "pgp"))}
    out["pg_db_cpu"] = sum(v - before.get(k, 0.0) for k, v in after.items() if k.startswith("pid"))
    out["pg_all_cpu"] = sum(v - before.get(k, 0.0) for k, v in after.items() if k.startswith("pgp"))
    out["pg_statements"] = out.get("wire_msg_E", 0.0) + out.get("wire_msg_Q", 0.0)
    out["pg_round_trips"] = out.get("wire_msg_S", 0.0) + out.get("wire_msg_Q", 0.0)
    out["pg_bytes"] = out.get("wire_bytes_to_server", 0.0) + out.get("wire_bytes_to_client", 0.0)
    out["redis_bytes"] = out["redis_in"] + out["redis_out"]
    return out


# -- the load -----------------------------------------------------------------------------------------


async def request(port: int, method: str, path: str, payload: object | None = None) -> tuple[int, dict]:
    """One JSON request with the account's Basic credentials (a raw socket, like the streams)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        body = b"" if payload is None else json.dumps(payload).encode()
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
        head += f"Authorization: {AUTH['Authorization']}\r\n"
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body)
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
    top, _, rest = raw.partition(b"\r\n\r\n")
    return int(top.split(b" ", 2)[1]), json.loads(rest) if rest.strip() else {}


async def new_chats(port: int, n: int) -> list[str]:
    out = []
    for _ in range(n):
        status, created = await request(port, "POST", "/api/sessions", {})
        assert status == 201, (status, created)
        out.append(created["id"])
    return out


async def turns(port: int, sessions: list[str], text: str) -> list[StreamRecord]:
    """Each chat sent `text` at once; each turn's stream read to its end."""
    records = [StreamRecord() for _ in sessions]

    async def one(session_id: str, record: StreamRecord) -> None:
        status, turn = await request(port, "POST", f"/api/sessions/{session_id}/messages", {"content": text})
        if status != 202:
            record.error = f"send: {status} {turn}"
            return
        await read_stream(port, "GET", turn["streamUrl"], None, AUTH, b"\n\n", chat_token, record)

    await asyncio.gather(*(one(s, r) for s, r in zip(sessions, records, strict=True)))
    return records


async def phase(server, services: Services, n: int, text: str, spy_path: Path | None = None) -> dict[str, float]:
    """N turns of `text` at once: the deltas of every counter, the tokens and the added gap p99."""
    sessions = await new_chats(server.port, n)
    wait_cpu_idle(server.pid, timeout=30)
    spy = None
    if spy_path is not None:
        spy = subprocess.Popen(
            [str(Path(PYTHON).parent / "py-spy"), "record", "--pid", str(server.pid), "--format", "raw"]
            + ["--rate", "200", "--nonblocking", "--output", str(spy_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)
    before = services.snapshot()
    app0, t0 = cpu_seconds(server.pid), time.perf_counter()
    records = await turns(server.port, sessions, text)
    wall = time.perf_counter() - t0
    app = cpu_seconds(server.pid) - app0
    await asyncio.sleep(1.2)  # PostgreSQL's backends report their counters at most once a second
    out = delta(before, services.snapshot())
    if spy is not None:
        spy.send_signal(2)
        spy.wait(30)
    gaps = sorted(b - a for r in records for a, b in zip(r.token_times, r.token_times[1:], strict=False))
    out.update(
        app_cpu=app,
        wall=wall,
        tokens=float(sum(len(r.token_times) for r in records)),
        gap_p99_ms=percentile(gaps, 0.99) * 1000,
        short=float(sum(1 for r in records if r.error or not r.token_times)),
    )
    errors = [r.error for r in records if r.error]
    if errors:
        print(f"    {len(errors)} errors, first: {errors[0]}", flush=True)
    return out


# -- the two apps -------------------------------------------------------------------------------------


def add_account(data_dir: Path, **env: str) -> None:
    """`python app.py users add admin --admin` (migrates the database first)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [PYTHON, "app.py", "users", "add", ACCOUNT[0], "--admin"],
        cwd=ROOT,
        env=clean_env(data_dir, free_port(), APP_USER_PASSWORD=ACCOUNT[1], **env),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0 and "exists" not in (done.stdout + done.stderr):
        raise RuntimeError(f"users add failed:\n{done.stdout}\n{done.stderr}")


async def one_app(mode: str, args, services: Services, tmp: Path, run_no: int) -> dict[int, dict]:
    """The sizes on a fresh app of this mode: per N, the start and stream phases."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # One account sends every turn: no per-user limit on running turns (config/server.json's is 20).
    env = {"DEMO_MODEL_DELAY_MS": str(args.delay_ms), "PUBLIC_BASE_URL": url, "MAX_RUNNING_TURNS_PER_USER": "100000"}
    data = tmp / f"{mode.rstrip('*')}{len(mode)}-{run_no}" / "data"
    if mode == "process":
        add_account(data)
    else:
        db_url = services.database_url
        if services.proxy_port is not None:
            db_url = db_url.replace("127.0.0.1:5432", f"127.0.0.1:{args.pg_listen}")
        env.update(
            CLUSTER="true",
            DATABASE_URL=db_url,
            REDIS_URL=services.redis_url,
            REDIS_KEY_PREFIX=services.prefix,
            STORAGE_SECRET="bench-cost-secret-" + services.prefix,
            INTERNAL_TOKEN="bench-cost-token-" + services.prefix,
            INSTANCE_ID=f"bench-cost-{run_no}-{len(mode)}",
            REPLICA_URL=url,
        )
    if mode == "replica*":  # the variant: the replica with these settings too
        env.update(item.split("=", 1) for item in args.replica_env)
    server = spawn(data, port=port, env_extra=env)
    if args.pin:
        os.sched_setaffinity(server.proc.pid, {1})
    out: dict[int, dict] = {}
    try:
        wait_first_200(server, path="/a2a/health", timeout=90)
        await turns(port, await new_chats(port, 2), "/lorem 5")  # warm-up: LiteLLM's import and first call
        await asyncio.sleep(1.0)
        for n in args.sizes:
            start = await phase(server, services, n, "/lorem 1")
            spy = None
            if args.profile == n and shutil.which("py-spy", path=str(Path(PYTHON).parent)):
                spy = (Path(args.profile_dir) if args.profile_dir else tmp) / f"profile-{mode}-{run_no}-{n}.txt"
            stream = await phase(server, services, n, f"/lorem {args.tokens}", spy)
            out[n] = {"start": start, "stream": stream, "load": load()}
            print(
                f"  run {run_no} {mode} N={n}: {stream['tokens'] / stream['wall']:,.0f} tokens/s, "
                f"{stream['app_cpu'] / max(stream['tokens'], 1) * 1e6:.0f} µs/token, "
                f"added p99 {stream['gap_p99_ms'] - args.delay_ms:.1f} ms, load {out[n]['load']}",
                flush=True,
            )
            if spy is not None and spy.exists():
                from bench.bench_model_path import profile_report

                print(f"py-spy of the {mode} at N={n} (stream phase):\n{profile_report(spy)}", flush=True)
    finally:
        stop(server)
    return out


# -- the report ---------------------------------------------------------------------------------------

# (label, key, scale) of what is shown per streamed token and per turn start.
FIGURES = [
    ("app CPU µs", "app_cpu", 1e6),
    ("Redis CPU µs", "redis_cpu", 1e6),
    ("PG backends CPU µs", "pg_db_cpu", 1e6),
    ("all postgres CPU µs", "pg_all_cpu", 1e6),
    ("PG statements", "pg_statements", 1),
    ("PG round trips", "pg_round_trips", 1),
    ("PG xacts", "pg_xacts", 1),
    ("PG connections", "wire_connections", 1),
    ("PG bytes", "pg_bytes", 1),
    ("Redis commands (and in scripts)", "redis_calls", 1),
    ("Redis bytes", "redis_bytes", 1),
]


def per_token(f: dict) -> dict[str, float]:
    tokens = max(f["stream"]["tokens"], 1)
    return {key: f["stream"].get(key, 0.0) * scale / tokens for _, key, scale in FIGURES}


def marginal(f: dict) -> dict[str, float]:
    """Per token beyond a turn's start: (stream phase - start phase) / (their difference in tokens)."""
    tokens = max(f["stream"]["tokens"] - f["start"]["tokens"], 1)
    return {key: (f["stream"].get(key, 0.0) - f["start"].get(key, 0.0)) * scale / tokens for _, key, scale in FIGURES}


def per_start(f: dict, n: int) -> dict[str, float]:
    return {key: f["start"].get(key, 0.0) * scale / n for _, key, scale in FIGURES}


def report(results: list[dict[str, dict[int, dict]]], args) -> None:
    rows, ratios, margins = [], [], []
    for run_no, got in enumerate(results, 1):
        for n in args.sizes:
            for mode in got:
                f = got[mode][n]
                s = f["stream"]
                tok, start = per_token(f), per_start(f, n)
                rows.append(
                    [run_no, n, mode, f"{s['tokens'] / s['wall']:,.0f}", f"{s['gap_p99_ms'] - args.delay_ms:.1f}"]
                    + [f"{tok[key]:,.1f} / {start[key]:,.0f}" for _, key, _ in FIGURES]
                    + [int(s["short"]), f["load"]]
                )
                m = marginal(f)
                margins.append([run_no, n, mode] + [f"{m[key]:,.2f}" for _, key, _ in FIGURES])
            p = per_token(got["process"][n])
            for mode in got:
                if mode == "process":
                    continue
                r = per_token(got[mode][n])
                own = r["app_cpu"] / p["app_cpu"]
                with_services = (r["app_cpu"] + r["redis_cpu"] + r["pg_db_cpu"]) / p["app_cpu"]
                with_all = (r["app_cpu"] + r["redis_cpu"] + r["pg_all_cpu"]) / (p["app_cpu"] + p["pg_all_cpu"])
                ratios.append([run_no, n, mode, f"{own:.2f}", f"{with_services:.2f}", f"{with_all:.2f}"])
    print(f"\nper streamed token / per turn start: N chats at once, /lorem {args.tokens} at {args.delay_ms} ms a token")
    head = ["run", "N", "mode", "tokens/s", "added p99 ms"] + [label for label, _, _ in FIGURES] + ["short", "load"]
    print(table(head, rows))
    print("\nper token beyond the turn's start: (stream phase - start phase) / their difference in tokens")
    print(table(["run", "N", "mode"] + [label for label, _, _ in FIGURES], margins))
    print("\nRedis commands of the replica's phases (and those its scripts ran), per turn start / per streamed token:")
    for run_no, got in enumerate(results, 1):
        for n in args.sizes:
            f = got["replica"][n]
            start, stream = f["start"], f["stream"]
            names = sorted((k for k in stream if k.startswith("cmd_")), key=lambda k: -stream[k])[:10]
            print(
                f"  run {run_no} N={n}: "
                + ", ".join(
                    f"{k[4:]} {start.get(k, 0) / n:.1f} / {stream[k] / max(stream['tokens'], 1):.2f}" for k in names
                )
            )
    print("\nreplica / process, CPU per streamed token (goals: own ≤ 1.15; with Redis and PostgreSQL ≤ 1.3)")
    print(
        table(
            [
                "run",
                "N",
                "mode",
                "app's own",
                "+ Redis + PG backends of its db",
                "+ Redis + all postgres (each side's)",
            ],
            ratios,
        )
    )


async def run(args: argparse.Namespace) -> None:
    from tests.conftest import DEFAULT_POSTGRES_URL, create_postgres_database, drop_postgres_database
    from tests.utils.broker import redis_test_url
    from tests.utils.cluster import delete_prefix

    print(f"load average at start: {load()}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: the finally blocks still clean up
    all_cpus = os.sched_getaffinity(0)
    if args.pin:
        os.sched_setaffinity(0, {0})  # the proxy (started below) inherits it
    server_url = os.environ.get("TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    db = create_postgres_database(server_url, prefix="a2a_bench_cost")
    prefix = f"bench-cost-{secrets.token_hex(4)}:"
    proxy = None
    control = None
    if not args.no_pg_proxy:
        args.pg_listen, control = free_port(), free_port()
        proxy = subprocess.Popen(
            [PYTHON, str(ROOT / "bench" / "_pg_wire.py"), str(args.pg_listen), "127.0.0.1", "5432", str(control)]
            + ([args.pg_log] if args.pg_log else []),
            stdin=subprocess.DEVNULL,
        )
        time.sleep(0.5)
    services = Services(server_url, db, redis_test_url(), prefix, control)
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-cluster-cost-") as tmpdir:
            add_account(Path(tmpdir) / "cli" / "data", DATABASE_URL=db)
            for run_no in range(1, args.runs + 1):
                modes = [*MODES, *(["replica*"] if args.replica_env else [])]
                results.append({mode: await one_app(mode, args, services, Path(tmpdir), run_no) for mode in modes})
    finally:
        services.close()
        if proxy is not None:
            proxy.terminate()
            proxy.wait(5)
        delete_prefix(redis_test_url(), prefix)
        drop_postgres_database(server_url, db)
        os.sched_setaffinity(0, all_cpus)
    report(results, args)
    print(f"load average at end: {load()}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="A cluster replica's cost against one process, with Redis and PostgreSQL")
    p.add_argument("--sizes", type=int, nargs="+", default=[50, 100], help="turns at once")
    p.add_argument("--tokens", type=int, default=150, help="words per reply in the stream phase")
    p.add_argument("--delay-ms", type=int, default=20, help="between tokens (20 ms: 50 tokens/s)")
    p.add_argument("--runs", type=int, default=2, help="interleaved runs (process, then replica, each run)")
    p.add_argument("--pin", action="store_true", help="the app on CPU 1; this client and the proxy on CPU 0")
    p.add_argument("--profile", type=int, default=None, help="py-spy each app during its stream phase at this N")
    p.add_argument(
        "--replica-env",
        nargs="+",
        default=None,
        metavar="NAME=VALUE",
        help="also run a variant replica (mode replica*) with these settings, interleaved",
    )
    p.add_argument("--profile-dir", default=None, help="keep py-spy's raw profiles here (default: dropped)")
    p.add_argument("--pg-log", default=None, help="the proxy writes each statement's first bytes to this file")
    p.add_argument("--no-pg-proxy", action="store_true", help="no counting proxy: no statements or bytes for PG")
    return p


if __name__ == "__main__":
    asyncio.run(run(parser().parse_args()))
