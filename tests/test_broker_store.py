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

from core.broker.inject import AUTO, RESULT_POSITION, Inject, InjectPublisher
from core.broker.store import INTERRUPTED, KEEP_FINISHED, BrokerStore
from core.services import Services
from models import BrokerTaskRecord, utcnow
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


async def rows(services: Services, model: type) -> list:
    async with services.db.session() as s:
        return list((await s.exec(select(model))).all())


async def test_a_tasks_end_and_result_are_one_row_and_its_published_position_moves_once_redis_has_it(
    services: Services, redis_url: str
) -> None:  # noqa: F811
    store = BrokerStore(services.db, "main")
    chat_agent = f"store-{uuid.uuid4().hex[:8]}"
    task_id = await add(store, chat_agent_id=chat_agent)
    [task] = await rows(services, BrokerTaskRecord)
    assert (task.state, task.finished_at, task.chat_agent_id, task.result) == ("submitted", None, chat_agent, None)

    await store.finish_task(task_id, "completed", "[出行助手] done", sent=False)
    [task] = await rows(services, BrokerTaskRecord)
    assert task.state == "completed" and task.finished_at is not None
    assert (task.result, task.published_position) == ("[出行助手] done", 0)
    assert [p.inject.log_position for p in await store.pending(redis=True)] == [RESULT_POSITION]

    publisher = InjectPublisher(redis_url, on_sent=store.mark_published)
    await publisher.start()
    try:
        async with RedisListener(redis_url, chat_agent) as listener:
            await publisher.publish(Inject(chat_agent, "chat-1", "[出行助手] done", AUTO, task_id))
            await listener.wait(lambda m: len(m) == 1)
            await publisher.flushed()
    finally:
        await publisher.stop()
    [task] = await rows(services, BrokerTaskRecord)
    assert task.published_position == RESULT_POSITION
    assert await store.pending(redis=True) == []


async def test_a_start_ends_only_this_instances_running_tasks_each_with_its_result(services: Services) -> None:
    mine, other = BrokerStore(services.db, "replica-a"), BrokerStore(services.db, "replica-b")
    running_task, other_task = await add(mine, chat_agent_id=7), await add(other)
    finished_task = await add(mine)
    await mine.finish_task(finished_task, "completed", "[出行助手] done", sent=False)

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
    await store.finish_task(outside, "completed", "[出行助手] done", sent=True)
    await store.finish_task(own, "completed", "[出行助手] done", sent=True)

    [pending] = await store.pending(redis=False)
    assert (pending.inject.task_id, pending.inject.session_id, pending.to_redis) == (own, chat.id, False)
    progress = {"content": "[出行助手] half way", "inject_mode": "delay", "a2a_task_id": own, "inject_position": 3}
    await services.chat.save_notes(chat.id, [progress])
    assert len(await store.pending(redis=False)) == 1  # progress is not the result's position
    note = {"content": "something else", "inject_mode": AUTO, "a2a_task_id": own, "inject_position": RESULT_POSITION}
    await services.chat.save_notes(chat.id, [note])
    assert await store.pending(redis=False) == []  # the position says it, whatever the text


async def test_a_start_deletes_what_is_a_week_old_and_sent_but_keeps_what_never_went_out(services: Services) -> None:
    store = BrokerStore(services.db, "main")
    sent_long_ago, unsent_long_ago, recent = await add(store), await add(store), await add(store)
    for task_id in (sent_long_ago, unsent_long_ago, recent):
        await store.finish_task(task_id, "completed", "[出行助手] done", sent=task_id != unsent_long_ago)
    old = utcnow() - KEEP_FINISHED - timedelta(hours=1)
    async with services.db.session() as s:
        for row in (await s.exec(select(BrokerTaskRecord))).all():
            if row.id != recent:
                row.finished_at = old
                s.add(row)
        await s.commit()

    await store.interrupt_running(sent=False)
    assert sorted(t.id for t in await rows(services, BrokerTaskRecord)) == sorted([unsent_long_ago, recent])
    assert [p.inject.task_id for p in await store.pending(redis=True)] == [unsent_long_ago]


async def test_a_dispatch_the_database_cannot_save_is_refused_and_nothing_starts(tmp_path: Path) -> None:
    async with running(tmp_path) as (host, services, broker, http):
        agent = await FakeAgent.connect(host, a2a_id="travel", wait_registered=broker)
        async with services.db.session() as s:
            await s.exec(text("DROP TABLE broker_tasks"))
            await s.commit()
        response = await http.post(
            "/a2a/tasks/dispatch", json={"task": "x", "targetAgent": "travel", "agentId": 123, "chatId": "abc"}
        )
        assert response.status_code == 503
        assert "could not save the task" in response.json()["detail"] and "Try again" in response.json()["detail"]
        assert broker.running_tasks() == [] and agent.requests.empty()
        await agent.close()


async def test_a_gone_instances_running_tasks_and_owed_results_become_this_ones_and_nothing_else(
    services: Services,
) -> None:
    gone, mine = BrokerStore(services.db, "gone"), BrokerStore(services.db, "main")
    chat = await services.workspace.create(services.auth.local_user_id, "general-assistant")
    owed, went_out, running = await add(gone, session_id=chat.id), await add(gone), await add(gone)
    await gone.finish_task(owed, "completed", "[出行助手] done", sent=True)  # its note never reached the chat
    await gone.finish_task(went_out, "completed", "[出行助手] done", sent=True)  # nothing owed: no chat of ours
    assert await mine.owing_instances() == {"gone"}

    adopted = await mine.adopt_running({"gone"}, sent=True)
    assert sorted((p.inject.task_id, p.inject.text, p.to_redis) for p in adopted) == sorted(
        [(running, f"[出行助手] {INTERRUPTED}", False), (owed, "[出行助手] done", False)]
    )
    tasks = {t.id: t for t in await rows(services, BrokerTaskRecord)}
    assert (tasks[owed].instance, tasks[running].instance, tasks[went_out].instance) == ("main", "main", "gone")
    assert await mine.adopt_running({"gone"}, sent=True) == []  # each once

    note = {"content": "x", "inject_mode": AUTO, "a2a_task_id": owed, "inject_position": RESULT_POSITION}
    await services.chat.save_notes(chat.id, [note])
    assert await mine.owing_instances() == set()  # the chat has it; nothing else is owed without Redis
