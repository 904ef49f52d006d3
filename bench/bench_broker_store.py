"""What durability costs the broker: the writes of `core/broker/store.py`, on a real database.

    .venv/bin/python bench/bench_broker_store.py [--tasks 300] [--database-url postgresql://...]

Each dispatch saves its task before the ack (`add_task`), each end saves the state and the `auto`
result's text in the task's row (`finish_task`), and the Redis sender moves the published position of
the results Redis has, per batch (`mark_published`). Measured one at a time (the latency a lone
dispatch pays) and N at once (what a busy broker pays: the store writes what arrives during one
commit in the next). Wall and CPU time of this process, which is where the app's event loop and the
SQLite driver thread run. SQLite by default (a file in a temporary folder, WAL, as the app uses it).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.broker.store import BrokerStore  # noqa: E402
from core.db import Database  # noqa: E402


async def measure(store: BrokerStore, n: int, *, concurrent: bool) -> list[str]:
    """One table row: n tasks added, finished and marked sent, one at a time or all at once."""
    ids = [uuid.uuid4().hex for _ in range(n)]

    async def add(task_id: str) -> None:
        await store.add_task(
            task_id=task_id,
            owner="user:1",
            target_agent="travel",
            agent_name="出行助手",
            chat_agent_id=123,
            chat_id="chat",
            session_id=None,
            task="查明天的高铁",
        )

    async def finish(task_id: str) -> None:
        await store.finish_task(task_id, "completed", "[出行助手] done", sent=False)

    async def run(calls: list) -> tuple[float, float, list]:
        wall, cpu = time.perf_counter(), time.process_time()
        if concurrent:
            results = await asyncio.gather(*calls)
        else:
            results = [await call for call in calls]
        return time.perf_counter() - wall, time.process_time() - cpu, list(results)

    add_wall, add_cpu, _ = await run([add(i) for i in ids])
    end_wall, end_cpu, _ = await run([finish(i) for i in ids])
    batches = [ids[k : k + 50] for k in range(0, n, 50)]  # the sender's batches are up to 500
    sent_wall, sent_cpu, _ = await run([store.mark_published(b) for b in batches])
    per = 1000 / n
    return [
        f"{n} {'at once' if concurrent else 'one at a time'}",
        f"{add_wall * per:.2f}",
        f"{add_cpu * per:.2f}",
        f"{end_wall * per:.2f}",
        f"{end_cpu * per:.2f}",
        f"{sent_wall * per:.3f}",
        f"{1000 * add_wall:.0f}",
        f"{1000 * end_wall:.0f}",
    ]


async def main(args: argparse.Namespace) -> None:
    """Migrate a fresh database, measure both cases, print the table."""
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{tmp}/bench.db"
        db = Database(url)
        db.migrate()
        rows = []
        try:
            for concurrent in (False, True):
                rows.append(
                    await measure(BrokerStore(db, f"bench-{uuid.uuid4().hex[:6]}"), args.tasks, concurrent=concurrent)
                )
        finally:
            await db.close()
    head = [
        "case",
        "add ms/task",
        "add CPU ms",
        "finish ms/task",
        "finish CPU ms",
        "published ms/result",
        "all adds ms",
        "all finishes ms",
    ]
    print(f"\n## Broker store on {db.dialect}\n")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(
            "| "
            + " | ".join([r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)])
            + " |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--database-url", help="default: a SQLite file in a temporary folder")
    asyncio.run(main(parser.parse_args()))
