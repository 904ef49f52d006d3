"""Start to first page: spawn `python app.py`, poll `GET /` every 20 ms, stop at the first 200.

    .venv/bin/python bench/bench_startup.py [--runs 5] [--no-warmup-probe]

Each run: a clean environment (no PYTEST_CURRENT_TEST / NICEGUI_USER_SIMULATION,
CONFIG_FILE and ENV_FILE pointing to files that do not exist), a free port on
127.0.0.1, then SIGTERM.

- "new DB":      every run in a new, empty DATA_DIR (migrations create the schema, seeding, secret).
- "existing DB": every run on one DATA_DIR that an earlier run already migrated.

The two series alternate (new, existing, new, ...).

The first run of the whole script is also the coldest for the OS file cache.
Then one more server is kept up for a few seconds and `GET /` is timed
repeatedly: LiteLLM is imported in a thread 1 s after start-up (`warm_up`),
and that import competes with requests for the GIL.

Last, one run under `python -X importtime` lists the imports that sit on the
path to the first page.

Budget (docs/ARCHITECTURE.md): start to first page under 2 s.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cpu_seconds, http_get, median, spawn, stop, table, wait_first_200  # noqa: E402

BUDGET_S = 2.0


def one_run(data_dir: Path) -> tuple[float, float]:
    """Seconds from spawn to the first 200 of GET /, and the server's CPU seconds by then."""
    server = spawn(data_dir)
    try:
        elapsed = wait_first_200(server, interval=0.02)
        cpu = cpu_seconds(server.pid)
        return elapsed, cpu
    finally:
        stop(server)


def warmup_probe(data_dir: Path, seconds: float) -> list[list[object]]:
    """GET / latency and server CPU per second after the first 200, while LiteLLM's import runs in a thread."""
    server = spawn(data_dir)
    rows = []
    try:
        first = wait_first_200(server, interval=0.02)
        slices: dict[int, list[float]] = {}
        cpu_at: dict[int, float] = {}
        end = server.spawned_at + first + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            second = int(t0 - server.spawned_at)
            cpu_at.setdefault(second, cpu_seconds(server.pid))
            status, _ = http_get(server.port, "/", timeout=10)
            latency = time.perf_counter() - t0
            if status == 200:
                slices.setdefault(second, []).append(latency)
            time.sleep(0.05)
        seconds_seen = sorted(cpu_at)
        for a, b in zip(seconds_seen, seconds_seen[1:], strict=False):
            lat = slices.get(a, [])
            rows.append(
                [
                    f"{a}–{b} s",
                    len(lat),
                    f"{median(lat) * 1000:,.1f}",
                    f"{max(lat) * 1000:,.1f}",
                    f"{(cpu_at[b] - cpu_at[a]) / (b - a):.2f}",
                ]
            )
    finally:
        stop(server)
    return rows


def import_profile(data_dir: Path, top: int = 12) -> tuple[float, list[list[object]]]:
    """`python -X importtime app.py` until its first 200: the imports on the path to the first page."""
    server = spawn(data_dir, python_args=["-X", "importtime"])
    try:
        first = wait_first_200(server, interval=0.02)
    finally:
        stop(server)
    entries = []  # (indent, module, cumulative µs), children are printed before their parent
    for line in server.log_path.read_text(errors="replace").splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m:
            entries.append((len(m.group(3)), m.group(4), int(m.group(2)), int(m.group(1))))
    total_self = sum(e[3] for e in entries)
    top_level = sorted((e for e in entries if e[0] <= 1), key=lambda e: -e[2])[:top]
    rows = [[name, f"{cum / 1000:,.0f}", f"{cum / total_self:.0%}"] for _, name, cum, _ in top_level]
    return first, [*rows, ["(all imports, sum of self times)", f"{total_self / 1000:,.0f}", "100%"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-warmup-probe", action="store_true", help="skip the GET / latency probe")
    parser.add_argument("--probe-seconds", type=float, default=10.0)
    parser.add_argument("--no-import-profile", action="store_true", help="skip the -X importtime run")
    args = parser.parse_args()

    load_before = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        base = Path(tmp)
        results: dict[str, list[tuple[float, float]]] = {"new DB": [], "existing DB": []}
        existing = base / "existing" / "data"
        for i in range(args.runs):  # interleaved, so drifts in machine load hit both series alike
            results["new DB"].append(one_run(base / f"fresh-{i}" / "data"))
            if i == 0:
                one_run(existing)  # creates and migrates the database; not counted
            results["existing DB"].append(one_run(existing))

        rows = []
        for label, runs in results.items():
            for i, (elapsed, cpu) in enumerate(runs, 1):
                note = " (first of the script: cold cache)" if label == "new DB" and i == 1 else ""
                rows.append([label + note, i, f"{elapsed:.3f}", f"{cpu:.2f}", "ok" if elapsed < BUDGET_S else "OVER"])
        print(
            f"Start to first 200 of GET / (poll every 20 ms), budget {BUDGET_S:.1f} s; "
            f"{os.cpu_count()} CPUs, load average before: {load_before}\n"
        )
        print(table(["DATA_DIR", "run", "seconds", "server CPU s", "budget"], rows))
        print()
        summary = []
        for label, runs in results.items():
            times = [t for t, _ in runs]
            med = median(times)
            summary.append(
                [
                    label,
                    f"{med:.3f}",
                    f"{min(times):.3f}",
                    f"{max(times):.3f}",
                    f"{med / BUDGET_S:.0%}",
                    "ok" if med < BUDGET_S else "OVER",
                ]
            )
        print(table(["DATA_DIR", "median s", "min s", "max s", "median / budget", "budget"], summary))

        if not args.no_warmup_probe:
            print(
                f"\nGET / latency after the first page, {args.probe_seconds:g} s (LiteLLM import starts 1 s after "
                "start-up in a thread), existing DB:\n"
            )
            print(
                table(
                    ["since spawn", "GET / requests", "median ms", "max ms", "server CPU s/s"],
                    warmup_probe(existing, args.probe_seconds),
                )
            )

        if not args.no_import_profile:
            first, rows = import_profile(existing)
            print(
                f"\nImports on the path to the first page (python -X importtime app.py; first 200 after "
                f"{first:.2f} s, slower than above because of the tracing):\n"
            )
            print(table(["top-level import", "cumulative ms", "share"], rows))


if __name__ == "__main__":
    main()
