"""The chat list by day, as chat apps show it: Today, Yesterday, Previous 7 days, Older.

A chat goes under the day of its `updated_at` (its last message) in the reader's local time: the
browser's time zone when the page knows it (`core.i18n.current_timezone`, which `ui/language.py`
learns from the browser once it has connected), else UTC. "Previous 7 days" are the seven days
before today without yesterday (2 to 7 days ago); a time after now (another machine's clock) counts
as today. The titles are marked for translation here and translated where they are shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from core.i18n import N_, current_timezone

__all__ = ["DAY_GROUPS", "GROUP_TITLES", "day_group", "group_by_day"]

TODAY = "today"
YESTERDAY = "yesterday"
PREVIOUS_7_DAYS = "previous-7-days"
OLDER = "older"
DAY_GROUPS = (TODAY, YESTERDAY, PREVIOUS_7_DAYS, OLDER)  # in the order the list shows them
GROUP_TITLES = {
    TODAY: N_("Today"),
    YESTERDAY: N_("Yesterday"),
    PREVIOUS_7_DAYS: N_("Previous 7 days"),
    OLDER: N_("Older"),
}


class _Dated(Protocol):
    @property
    def updated_at(self) -> datetime: ...


T = TypeVar("T", bound=_Dated)


def _zone(name: str | None) -> ZoneInfo:
    try:
        return ZoneInfo(name or current_timezone())
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def day_group(moment: datetime, *, now: datetime | None = None, zone: str | None = None) -> str:
    """Which group a time falls in, for a reader in `zone` (default: the reader's, UTC when unknown).

    Naive times are UTC, as the database keeps them.
    """
    tz = _zone(zone)
    now = now or datetime.now(UTC)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    days = (now.astimezone(tz).date() - moment.astimezone(tz).date()).days
    if days <= 0:
        return TODAY
    if days == 1:
        return YESTERDAY
    if days <= 7:
        return PREVIOUS_7_DAYS
    return OLDER


def group_by_day(
    rows: Sequence[T], *, now: datetime | None = None, zone: str | None = None
) -> list[tuple[str, list[T]]]:
    """The rows (newest first, as `sessions.list_sessions` gives them) under their groups, empty groups left out."""
    now = now or datetime.now(UTC)
    by_group: dict[str, list[T]] = {}
    for row in rows:
        by_group.setdefault(day_group(row.updated_at, now=now, zone=zone), []).append(row)
    return [(group, by_group[group]) for group in DAY_GROUPS if group in by_group]
