"""Moving every finished job to the history on a sync connection, as `history.move`
does: for tests of the history and of what reads it (the Django admin, whose tests run
where the dashboard's extra may not be installed)."""

from __future__ import annotations

from typing import Any

import psycopg

from axa_queue import history, sql

WEEK = 7 * 86400.0
"""A retention of a week, in seconds."""


def make_days(admin: psycopg.Connection[Any], now: Any = None) -> Any:
    """Make the day partitions a move needs, on a sync connection, as `history.make_days`
    does (a week's retention); returns when their first day began (`since`)."""
    days = {"now": now, "retention": WEEK, "most": history.MOST_DAYS, "ahead": history.AHEAD_DAYS}
    first = admin.execute(sql.HISTORY_FIRST_DAY, days).fetchone()
    assert first is not None
    row = admin.execute(sql.HISTORY_DAYS, {**days, "first_day": first[0]}).fetchone()
    assert row is not None
    return row[1]


def move_all(admin: psycopg.Connection[Any], keep: float = 0.0, now: Any = None) -> int:
    """Move every finished job older than `keep` seconds, on a sync connection, as
    `history.move` does; returns how many moved."""
    params = {"keep": keep, "since": make_days(admin, now), "batch": history.MOVE_BATCH, "now": now}
    total = 0
    while True:
        row = admin.execute(sql.HISTORY_MOVE, params).fetchone()
        assert row is not None
        moved, params["since"] = row
        total += moved
        if moved < history.MOVE_BATCH:
            return total
