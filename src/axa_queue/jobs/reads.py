"""Reading jobs back: one job, its result, the newest jobs, and the counts, each a
`Call` that `Queue`, `SyncQueue`, the dashboard and the `*_on` functions send as it is.

Nothing here reads a job's arguments; a result is read only by `result_call`, for
the one who asks for it.
"""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import datetime, timedelta
from typing import Any, overload
from uuid import UUID

from .. import sql
from ..db.adapters import AnyConnection, SomeAsyncConnection, SomeSyncConnection, run
from ..db.calls import Call, Row
from ..errors import JobNotFoundError, NoResultError, OptionsError
from .attempts import runs_of
from .model import Counts, JobInfo, JobState, job_id_of, moment, optional_moment

__all__ = [
    "FinishedCounts",
    "LiveCounts",
    "counts_by_name_call",
    "counts_call",
    "counts_from",
    "counts_on",
    "finished_counts_by_name_call",
    "job_call",
    "job_info",
    "job_on",
    "jobs_call",
    "jobs_on",
    "live_counts_by_name_call",
    "result_call",
]


def job_info(row: Row) -> JobInfo:
    """Read a row of `sql.JOB` or `sql.JOBS`."""
    return JobInfo(
        id=row.id,
        name=row.name,
        state=JobState(row.status),
        attempts=row.attempts,
        max_attempts=row.max_attempts,
        priority=row.priority,
        error=row.error,
        timeout=None if row.timeout_ms is None else timedelta(milliseconds=row.timeout_ms),
        run_at=moment(row.run_at),
        started_at=optional_moment(row.started_at),
        created_at=moment(row.created_at),
        updated_at=moment(row.updated_at),
        unique_key=row.unique_key,
        unique_for=None if row.unique_for_ms is None else timedelta(milliseconds=row.unique_for_ms),
        given_back=row.given_back,
        runs=runs_of(getattr(row, "runs", None)),
    )


def job_call(job_id: UUID) -> Call[JobInfo | None]:
    """The call that reads one job."""
    job_id = job_id_of(job_id)
    return Call(sql.JOB, {"id": job_id}, lambda rows, _n: job_info(rows[0]) if rows else None)


def _result_of(job_id: UUID, rows: list[Row]) -> Any:
    if not rows:
        raise JobNotFoundError(job_id)
    row = rows[0]
    if row.status != JobState.COMPLETED.value:
        raise NoResultError(job_id, row.status)
    return row.result


def result_call(job_id: UUID) -> Call[Any]:
    """The call that reads a completed job's result: what its handler returned, as JSON
    values (`None` when it returned `None`; a dataclass or pydantic model comes back as
    a dict of its fields). `JobNotFoundError` for no such job, `NoResultError` for one not completed."""
    job_id = job_id_of(job_id)
    return Call(sql.RESULT, {"id": job_id}, lambda rows, _n: _result_of(job_id, rows))


def jobs_call(
    state: JobState | str | None = None, name: str | None = None, limit: int = 50
) -> Call[list[JobInfo]]:
    """The call that lists the newest jobs, optionally of one state and name."""
    state_text = None if state is None else JobState(state).value
    if not isinstance(limit, int) or limit < 1:
        raise OptionsError(f"expected limit to be a positive integer, got: {limit!r}")
    return Call(
        sql.JOBS,
        {"state": state_text, "name": name, "limit": limit},
        lambda rows, _n: [job_info(row) for row in rows],
    )


def counts_from(row: Row) -> Counts:
    """Read the counts columns of a row of `sql.COUNTS` or `sql.COUNTS_BY_NAME`, by name."""
    return Counts(
        ready=row.ready,
        waiting=row.waiting,
        running=row.running,
        completed=row.completed,
        failed=row.failed,
        cancelled=row.cancelled,
        needs_review=row.needs_review,
        oldest_ready_seconds=row.oldest or 0.0,
    )


def counts_call(now: datetime | None = None) -> Call[Counts]:
    """The call that counts jobs in each state."""
    return Call(sql.COUNTS, {"now": now}, lambda rows, _n: counts_from(rows[0]))


def counts_by_name_call() -> Call[dict[str, Counts]]:
    """The call that counts jobs in each state for each job name."""
    return Call(
        sql.COUNTS_BY_NAME,
        {"now": None},
        lambda rows, _n: {row.name: counts_from(row) for row in rows},
    )


LiveCounts = tuple[int, int, int, int, float]
"""ready, waiting, running, needs_review and the oldest ready job's age in seconds."""
FinishedCounts = tuple[int, int, int]
"""completed, failed and cancelled."""


def live_counts_by_name_call() -> Call[dict[str, LiveCounts]]:
    """The call that counts the jobs not finished of each name, reading none that are."""
    return Call(
        sql.LIVE_COUNTS_BY_NAME,
        {"now": None},
        lambda rows, _n: {
            row.name: (row.ready, row.waiting, row.running, row.needs_review, row.oldest or 0.0)
            for row in rows
        },
    )


def finished_counts_by_name_call() -> Call[dict[str, FinishedCounts]]:
    """The call that counts the finished jobs of each name (a scan of them all)."""
    return Call(
        sql.FINISHED_COUNTS_BY_NAME,
        (),
        lambda rows, _n: {row.name: (row.completed, row.failed, row.cancelled) for row in rows},
    )


@overload
def job_on(conn: SomeAsyncConnection, job_id: UUID) -> Awaitable[JobInfo | None]: ...
@overload
def job_on(conn: SomeSyncConnection, job_id: UUID) -> JobInfo | None: ...
def job_on(conn: AnyConnection, job_id: UUID) -> JobInfo | Awaitable[JobInfo | None] | None:
    """What the queue knows of job `job_id`, or `None` (awaitable when async)."""
    return run(conn, job_call(job_id))


@overload
def jobs_on(
    conn: SomeAsyncConnection,
    state: JobState | str | None = None,
    name: str | None = None,
    limit: int = 50,
) -> Awaitable[list[JobInfo]]: ...
@overload
def jobs_on(
    conn: SomeSyncConnection,
    state: JobState | str | None = None,
    name: str | None = None,
    limit: int = 50,
) -> list[JobInfo]: ...
def jobs_on(
    conn: AnyConnection,
    state: JobState | str | None = None,
    name: str | None = None,
    limit: int = 50,
) -> list[JobInfo] | Awaitable[list[JobInfo]]:
    """The newest jobs, optionally of one state and name (awaitable when async)."""
    return run(conn, jobs_call(state, name, limit))


@overload
def counts_on(conn: SomeAsyncConnection) -> Awaitable[Counts]: ...
@overload
def counts_on(conn: SomeSyncConnection) -> Counts: ...
def counts_on(conn: AnyConnection) -> Counts | Awaitable[Counts]:
    """How many jobs are in each state (awaitable when async)."""
    return run(conn, counts_call())
