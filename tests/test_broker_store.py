"""The broker's durable part (core/broker/store.py) on SQLite and PostgreSQL.

What is saved, what a start sends again, what it leaves alone. The whole stop-and-start
story against `python app.py` is in security/test_results_survive_a_restart.py.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

from sqlalchemy import text
from sqlmodel import select

from core.broker.inject import AUTO, Inject, InjectPublisher
from core.broker.store import INTERRUPTED, KEEP_FINISHED, BrokerStore
from core.services import Services
from models import BrokerOutboxInject, BrokerTaskRecord, utcnow
from tests.test_broker import redis_url, running  # noqa: F401 - redis_url is a fixture
from tests.utils.broker import FakeAgent, RedisListener


async def add(store: BrokerStore, *, session_id: str | None = None, chat_agent_id: object = 123) -> str:
    task_id = uuid.uuid4().hex
    await store.add_task(
        task_id=task_id,
        owner="user:1",
        target_agent="travel",
        agent_name="出行助手",
        chat_agent_id=chat_agent_id,
        chat_id="chat-1",
        session_id=session_id,
        task="go",
    )
    return task_id


def result(task_id: str, chat_agent_id: object = 123, session_id: str | None = None) -> Inject:
    return Inject(
        agent_id=chat_agent_id,
        chat_id="chat-1",
        text="[出行助手] done",
        mode=AUTO,
        task_id=task_id,
        session_id=session_id,
    )


async def rows(services: Services, model: type) -> list:
    async with services.db.session() as s:
        return list((await s.exec(select(model))).all())


async def test_a_result_is_saved_with_the_tasks_end_and_marked_sent_once_redis_has_it(
    services: Services, redis_url: str
) -> None:  # noqa: F811
    store = BrokerStore(services.db, "main")
    chat_agent = f"store-{uuid.uuid4().hex[:8]}"
    task_id = await add(store, chat_agent_id=chat_agent)
    [task] = await rows(services, BrokerTaskRecord)
    assert (task.state, task.finished_at, task.chat_agent_id) == ("submitted", None, chat_agent)

    outbox_id = await store.finish_task(task_id, "completed", result(task_id, chat_agent), sent=False)
    [task], [saved] = await rows(services, BrokerTaskRecord), await rows(services, BrokerOutboxInject)
    assert task.state == "completed" and task.finished_at is not None
    assert (saved.id, saved.text, saved.mode, saved.sent_at) == (outbox_id, "[出行助手] done", AUTO, None)

    publisher = InjectPublisher(redis_url, on_sent=store.mark_sent)
    await publisher.start()
    try:
        async with RedisListener(redis_url, chat_agent) as listener:
            await publisher.publish(Inject(chat_agent, "chat-1", "[出行助手] done", AUTO, task_id, outbox_id=outbox_id))
            await listener.wait(lambda m: len(m) == 1)
            await publisher.flushed()
    finally:
        await publisher.stop()
    [saved] = await rows(services, BrokerOutboxInject)
    assert saved.sent_at is not None
    assert await store.pending(redis=True) == []


async def test_a_start_ends_only_this_instances_running_tasks_each_with_its_result(services: Services) -> None:
    mine, other = BrokerStore(services.db, "replica-a"), BrokerStore(services.db, "replica-b")
    running_task, other_task = await add(mine, chat_agent_id=7), await add(other)
    finished_task = await add(mine)
    await mine.finish_task(finished_task, "completed", result(finished_task), sent=False)

    assert await mine.interrupt_running(sent=False) == 1
    tasks = {t.id: t for t in await rows(services, BrokerTaskRecord)}
    assert tasks[running_task].state == "failed" and tasks[running_task].finished_at is not None
    assert tasks[other_task].finished_at is None  # another process's task: it may still be running there
    pending = await mine.pending(redis=True)
    assert [(p.inject.task_id, p.inject.text, p.inject.agent_id, p.to_redis) for p in pending] == [
        (finished_task, "[出行助手] done", 123, True),
        (running_task, f"[出行助手] {INTERRUPTED}", 7, True),
    ]
    assert await other.pending(redis=True) == []
    assert await mine.interrupt_running(sent=False) == 0  # a second start ends nothing twice


async def test_results_go_nowhere_twice_without_redis_but_the_apps_chat_gets_each_until_its_note_is_saved(
    services: Services,
) -> None:
    store = BrokerStore(services.db, "main")
    chat = await services.workspace.create(services.auth.local_user_id, "general-assistant")
    outside, own = await add(store), await add(store, session_id=chat.id)
    await store.finish_task(outside, "completed", result(outside), sent=True)
    await store.finish_task(own, "completed", result(own, session_id=chat.id), sent=True)

    [pending] = await store.pending(redis=False)
    assert (pending.inject.task_id, pending.inject.session_id, pending.to_redis) == (own, chat.id, False)
    await services.chat.save_notes(chat.id, [{"content": "[出行助手] done", "inject_mode": AUTO, "a2a_task_id": own}])
    assert await store.pending(redis=False) == []


async def test_a_start_deletes_what_is_a_week_old_and_sent_but_keeps_what_never_went_out(services: Services) -> None:
    store = BrokerStore(services.db, "main")
    sent_long_ago, unsent_long_ago, recent = await add(store), await add(store), await add(store)
    for task_id in (sent_long_ago, unsent_long_ago, recent):
        await store.finish_task(task_id, "completed", result(task_id), sent=task_id != unsent_long_ago)
    old = utcnow() - KEEP_FINISHED - timedelta(hours=1)
    async with services.db.session() as s:
        for row in (await s.exec(select(BrokerOutboxInject))).all():
            if row.task_id != recent:
                row.created_at, row.sent_at = old, old if row.sent_at else None
                s.add(row)
        for row in (await s.exec(select(BrokerTaskRecord))).all():
            if row.id != recent:
                row.finished_at = old
                s.add(row)
        await s.commit()

    await store.interrupt_running(sent=False)
    assert sorted(t.id for t in await rows(services, BrokerTaskRecord)) == sorted([unsent_long_ago, recent])
    assert sorted(o.task_id for o in await rows(services, BrokerOutboxInject)) == sorted([unsent_long_ago, recent])


async def test_a_dispatch_the_database_cannot_save_is_refused_and_nothing_starts(tmp_path: Path) -> None:
    async with running(tmp_path) as (host, services, broker, http):
        agent = await FakeAgent.connect(host, a2a_id="travel", wait_registered=broker)
        async with services.db.session() as s:
            await s.exec(text("DROP TABLE broker_outbox"))
            await s.exec(text("DROP TABLE broker_tasks"))
            await s.commit()
        response = await http.post(
            "/a2a/tasks/dispatch", json={"task": "x", "targetAgent": "travel", "agentId": 123, "chatId": "abc"}
        )
        assert response.status_code == 503
        assert "could not save the task" in response.json()["detail"] and "Try again" in response.json()["detail"]
        assert broker.running_tasks() == [] and agent.requests.empty()
        await agent.close()
