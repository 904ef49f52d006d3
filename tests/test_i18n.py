"""Languages (docs/ARCHITECTURE.md, "Languages"): the core of core/i18n, the API and the demo model.

Choosing a language, plurals, numbers and dates, task state labels, the REST API's errors in the
caller's Accept-Language, and the demo model answering in the user's language.
"""

from __future__ import annotations

from datetime import datetime

import httpx
import pytest

from core.chat.demo_model import plan_reply, reply_language
from core.delegation.states import CONNECTION_LOST, TIMED_OUT, state_label
from core.i18n import (
    _,
    current_language,
    format_datetime,
    format_number,
    negotiate,
    ngettext,
    normalize,
    use_language,
    use_timezone,
)
from core.services import Services
from core.web.errors import install_error_handlers
from tests.conftest import make_settings
from tests.test_broker import chat_agent_id, redis_url  # noqa: F401 (the Redis fixture)
from tests.utils.broker import DISPATCH_HEADERS, FakeAgent, RedisListener, broker_app, serve_app, task_event


@pytest.mark.parametrize(
    ("header", "language"),
    [
        ("zh-CN", "zh_CN"),
        ("zh-CN,zh;q=0.9,en;q=0.8", "zh_CN"),
        ("zh", "zh_CN"),
        ("zh-Hans-CN", "zh_CN"),
        ("en-US,en;q=0.9", "en"),
        ("fr-FR, en;q=0.5, zh-CN;q=0.7", "zh_CN"),
        ("de, *;q=0.1", "en"),
        ("zh-CN;q=0, en", "en"),
        ("zh-TW", None),
        ("fr", None),
        ("", None),
        (None, None),
        ("zh-CN;q=abc", None),
    ],
)
def test_accept_language_picks_the_best_catalog(header: str | None, language: str | None) -> None:
    assert negotiate(header) == language


def test_language_tags_are_normalized() -> None:
    assert [normalize(t) for t in ("zh-CN", "zh_CN", "zh_CN.UTF-8", "en-GB", "EN", "zh-Hant", "ja", "")] == [
        "zh_CN",
        "zh_CN",
        "zh_CN",
        "en",
        "en",
        None,
        None,
        None,
    ]


def test_english_is_the_default_and_a_block_changes_the_language() -> None:
    assert current_language() == "en" and _("completed") == "completed"
    with use_language("zh-CN"):
        assert current_language() == "zh_CN" and _("completed") == "完成"
    assert current_language() == "en"


def test_plurals_and_numbers_in_both_languages() -> None:
    def tasks(n: int) -> str:
        return ngettext("{count} delegated task", "{count} delegated tasks", n).format(count=format_number(n))

    assert [tasks(1), tasks(2), tasks(1200)] == ["1 delegated task", "2 delegated tasks", "1,200 delegated tasks"]
    with use_language("zh_CN"):
        assert [tasks(1), tasks(2)] == ["1 个委派任务", "2 个委派任务"]
        assert format_number(1234.5, decimals=1) == "1,234.5"


def test_dates_are_written_in_the_readers_locale_and_time_zone() -> None:
    moment = datetime(2026, 3, 1, 23, 30)  # naive: UTC, as the database keeps it
    assert format_datetime(moment) == "Mar 1, 2026, 11:30:00\u202fPM"
    with use_language("zh_CN"), use_timezone("Asia/Shanghai"):
        assert format_datetime(moment) == "2026年3月2日 07:30:00"
    with use_timezone("Not/AZone"):  # a browser's odd answer falls back to UTC
        assert format_datetime(moment).startswith("Mar 1, 2026")


def test_task_state_labels_use_the_seeds_words_in_chinese_and_the_state_in_english() -> None:
    cases = [
        dict(state="submitted"),
        dict(state="working", has_text=False),
        dict(state="working", has_text=True),
        dict(state="completed"),
        dict(state="failed"),
        dict(state="failed", reason=TIMED_OUT),
        dict(state="failed", reason=CONNECTION_LOST),
        dict(state="canceled"),
    ]
    english = [state_label(**c) for c in cases]
    assert english == ["submitted", "working", "working", "completed", "failed", "failed", "failed", "canceled"]
    with use_language("zh_CN"):
        chinese = [state_label(**c) for c in cases]
    assert chinese == ["等待回复…", "等待回复…", "生成中…", "完成", "失败", "任务超时", "连接中断", "已停止"]


# -- the demo model ------------------------------------------------------------------------------


def test_the_demo_model_answers_chinese_in_chinese_and_english_in_english() -> None:
    chinese = "".join(plan_reply([{"role": "user", "content": "请介绍一下你自己"}], None).tokens)
    assert chinese.startswith("你写了 1 个词：") and "离线演示模型" in chinese and "You wrote" not in chinese
    english = "".join(plan_reply([{"role": "user", "content": "tell me about you"}], None).tokens)
    assert english.startswith("You wrote 4 words:") and "offline demo model" in english
    # Whatever the page's language: the message decides.
    with use_language("zh_CN"):
        assert "".join(plan_reply([{"role": "user", "content": "hello"}], None).tokens).startswith("You wrote 1 word:")


def test_the_demo_models_delegation_and_hang_phrases_follow_the_users_language() -> None:
    tools = [{"type": "function", "function": {"name": "agent_invoke"}}]
    delegating = plan_reply([{"role": "user", "content": "@coding-assistant 写一个函数"}], tools)
    assert "".join(delegating.tokens).startswith("正在委派给 @coding-assistant。")
    assert delegating.tool_calls and "写一个函数" in delegating.tool_calls[0].arguments
    hang = plan_reply([{"role": "system", "content": "x"}, {"role": "user", "content": "请等一下 /hang"}], None)
    assert reply_language([{"role": "user", "content": "请等一下 /hang"}]) == "zh_CN"
    assert "".join(hang.tokens).startswith("你写了")  # not the /hang command (it is not the whole message)
    assert "".join(plan_reply([{"role": "user", "content": "/hang"}], None).tokens).startswith("Working on it")


@pytest.mark.chat_app_settings(DEMO_MODEL_DELAY_MS="0")
def test_a_chinese_message_gets_a_chinese_answer_end_to_end(chat_app) -> None:
    session = chat_app.new_session("general-assistant")
    chat_app.send(session, "你好！请用中文回答")
    events = list(chat_app.stream(session))
    assert events[-1]["type"] == "finish"
    answer = [m for m in chat_app.messages(session) if m["role"] == "assistant"][-1]["content"]
    assert answer.startswith("你写了 1 个词：") and "离线演示模型" in answer


# -- the REST API's errors -----------------------------------------------------------------------


@pytest.mark.chat_app_settings(DEMO_MODEL_DELAY_MS="0")
def test_api_errors_come_in_the_callers_language_with_the_same_code(chat_app) -> None:
    http = chat_app.http
    english = http.get("/api/sessions/as_nope")
    chinese = http.get("/api/sessions/as_nope", headers={"Accept-Language": "zh-CN,zh;q=0.9"})
    assert english.status_code == chinese.status_code == 404
    assert english.json() == {"detail": "There is no such chat session.", "code": "session_not_found"}
    assert chinese.json() == {"detail": "没有这个对话会话。", "code": "session_not_found"}
    # A language without a catalog gets English.
    assert (
        http.get("/api/sessions/as_nope", headers={"Accept-Language": "fr"}).json()["detail"]
        == "There is no such chat session."
    )

    unknown_agent = http.post("/api/sessions", json={"agentId": "nobody"}, headers={"Accept-Language": "zh-CN"})
    assert unknown_agent.status_code == 404
    assert unknown_agent.json() == {"detail": "没有智能体 'nobody'。", "code": "agent_not_found"}

    session = chat_app.new_session("general-assistant")
    empty = http.post(
        f"/api/sessions/{session}/messages", json={"content": "   "}, headers={"Accept-Language": "zh-CN"}
    )
    assert empty.status_code == 422
    assert empty.json() == {"detail": "消息为空；请先输入内容。", "code": "invalid_message"}

    task = http.get("/api/tasks/nope", headers={"Accept-Language": "zh-CN"})
    assert task.status_code == 404 and task.json()["code"] == "task_not_found"
    assert task.json()["detail"] == "你的对话中没有这个任务。"

    invalid = http.post("/api/sessions", json={"agentId": 5, "extra": 1})
    assert invalid.status_code == 422 and invalid.json()["code"] == "invalid_request"
    assert isinstance(invalid.json()["detail"], list)


# -- background tasks ----------------------------------------------------------------------------


async def test_a_broker_timeout_note_is_in_the_dispatchers_language(tmp_path, redis_url: str) -> None:  # noqa: F811
    """Seed 003's 「任务超时」: a task dispatched with Accept-Language zh-CN times out in Chinese."""
    services = Services.build(make_settings(tmp_path, redis={"url": redis_url}, task_idle_timeout=300))
    services.prepare()
    app = broker_app(services)
    install_error_handlers(app)  # as app.py: the request's language comes from Accept-Language
    chat_agent = chat_agent_id()
    async with (
        serve_app(app) as host,
        RedisListener(redis_url, chat_agent) as listener,
        httpx.AsyncClient(base_url=f"http://{host}", headers=DISPATCH_HEADERS, timeout=10) as http,
    ):
        agent = await FakeAgent.connect(host, a2a_id="travel", wait_registered=services.broker)
        response = await http.post(
            "/a2a/tasks/dispatch",
            headers={"Accept-Language": "zh-CN"},
            json={"task": "查车次", "targetAgent": "travel", "agentId": chat_agent, "chatId": "abc"},
        )
        assert response.status_code == 200, response.text
        request = await agent.next_request("message/stream")
        await agent.result(request["id"], task_event("t-slow", "working"))
        cancel = await agent.next_request("tasks/cancel", timeout=3)
        [note] = await listener.wait(lambda m: len(m) == 1)
        assert note["mode"] == "auto"
        assert note["text"] == "[出行助手] 任务超时：出行助手 已有 0.3 秒没有进度。"
        await agent.result(cancel["id"], task_event("t-slow", "canceled"))
        await agent.close()


# -- the start-up line ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lang", "expected"),
    [
        ("zh_CN.UTF-8", "模式：单用户模式（本地，无需登录） · 数据库：SQLite"),
        ("en_US.UTF-8", "mode: single-user (local, no login) · database: SQLite"),
        ("C.UTF-8", "mode: single-user (local, no login) · database: SQLite"),
    ],
)
def test_the_start_up_line_follows_the_shells_language(tmp_path, monkeypatch, capsys, lang: str, expected: str) -> None:
    from app import print_start_up_line

    services = Services.build(make_settings(tmp_path))
    services.prepare()
    for name in ("LC_ALL", "LC_MESSAGES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LANG", lang)
    print_start_up_line(services, "http://127.0.0.1:8080")
    first, second = capsys.readouterr().out.splitlines()
    assert first.startswith(f"A2A Delegation Chat: {expected}")
    assert second == ("打开 http://127.0.0.1:8080" if lang.startswith("zh") else "Open http://127.0.0.1:8080")
