"""What the dashboard reads, as `Call`s of named statements (`sql.WEB_*`, and the
queue's own `JOB`, `ACTS`, `SCHEDULES`, `WORKERS`). Never a job's
arguments or result: no statement here selects them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .. import sql
from ..acts import Act, ActKind, act_of
from ..db.calls import Call, Row
from ..jobs.model import JobInfo, JobState
from ..jobs.reads import gone_params, job_info

__all__ = [
    "COUNT_CAP",
    "PAGE_SIZE",
    "Finished",
    "LiveCounts",
    "Page",
    "acts_log_call",
    "clock_call",
    "estimate_call",
    "finished_call",
    "jobs_page_call",
    "live_counts_call",
]

PAGE_SIZE = 50
"""Rows on one page of a list."""

COUNT_CAP = 10_000
"""The most rows of each unfinished state the overview counts at a refresh; past it,
counts are "at least" and the totals the planner's estimates (`sql.WEB_LIVE_COUNTS`)."""


@dataclass(frozen=True)
class LiveCounts:
    """The jobs not finished, of one name."""

    name: str
    ready: int
    waiting: int
    running: int
    needs_review: int
    oldest_ready_seconds: float
    blocked: int = 0
    """Jobs waiting for the jobs they depend on (a workflow's)."""


def live_counts_call(cap: int = COUNT_CAP) -> Call[list[LiveCounts]]:
    """Jobs not finished, per name, reading at most `cap` of each state
    (`sql.WEB_LIVE_COUNTS`)."""
    return Call(
        sql.WEB_LIVE_COUNTS,
        {"now": None, "cap": cap},
        lambda rows, _n: [
            LiveCounts(
                r.name, r.ready, r.waiting, r.running, r.needs_review, r.oldest or 0.0, r.blocked
            )
            for r in rows
        ],
    )


def estimate_call(ready: bool) -> Call[int]:
    """The planner's estimate of the ready jobs (or, `ready` false, of those queued
    for later): `sql.WEB_ESTIMATE_READY` or `sql.WEB_ESTIMATE_WAITING`."""
    return Call(
        sql.WEB_ESTIMATE_READY if ready else sql.WEB_ESTIMATE_WAITING,
        (),
        lambda rows, _n: int(rows[0].QUERY_PLAN[0]["Plan"]["Plan Rows"]),
    )


@dataclass(frozen=True)
class Page:
    """One page of jobs, and the cursor of the next (None: this is the last)."""

    jobs: list[JobInfo]
    next_key: str | None
    next_after: str | None


def jobs_page_call(
    state: JobState,
    name: str | None,
    *,
    newest: bool,
    key: str | None,
    after: str | None,
    limit: int = PAGE_SIZE,
) -> Call[Page]:
    """One page of jobs of `state` (and `name`), after the cursor (`key`, `after`)."""

    def read(rows: list[Row], _n: int) -> Page:
        more = len(rows) > limit
        rows = rows[:limit]
        last = rows[-1] if more and rows else None
        return Page(
            [job_info(r) for r in rows],
            None if last is None else last.key,
            None if last is None else str(last.id),
        )

    return Call(
        sql.WEB_JOBS_NEWEST if newest else sql.WEB_JOBS_OLDEST,
        {
            "state": state.value,
            "name": name,
            "key": key,
            "after": after,
            "limit": limit + 1,
            **gone_params(),
        },
        read,
    )


@dataclass(frozen=True)
class Finished:
    """Jobs of one name that finished in one minute."""

    minute: int
    """The minute's start, in epoch seconds."""
    name: str
    completed: int
    failed: int
    cancelled: int


def finished_call(since: int, until: int | None) -> Call[list[Finished]]:
    """Jobs finished per minute and name in [since, until) (epoch seconds)."""
    return Call(
        sql.WEB_FINISHED_PER_MINUTE,
        {"since": since, "until": until},
        lambda rows, _n: [
            Finished(int(r.minute), r.name, r.completed, r.failed, r.cancelled) for r in rows
        ],
    )


def acts_log_call(
    by: str | None, act: ActKind | None, before: int | None, limit: int = PAGE_SIZE
) -> Call[list[Act]]:
    """One page of the acts log, newest first."""
    return Call(
        sql.WEB_ACTS,
        {"by": by, "act": None if act is None else act.value, "before": before, "limit": limit},
        lambda rows, _n: [act_of(r) for r in rows],
    )


def clock_call() -> Call[datetime]:
    """The call that reads the database's clock (`sql.CLOCK`)."""
    return Call(sql.CLOCK, (), lambda rows, _n: rows[0].now)
