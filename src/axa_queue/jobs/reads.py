"""Reading jobs back: one job, its result, the newest jobs, and the counts, each a
`Call` that `Queue`, `SyncQueue`, the dashboard and the `*_on` functions send as it is.

Nothing here reads a job's arguments; a result is read only by `result_call`, for
the one who asks for it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from datetime import datetime, timedelta
from typing import Any, overload
from uuid import UUID

from .. import sql
from ..db.adapters import AnyConnection, SomeAsyncConnection, SomeSyncConnection, run
from ..db.calls import Call, Row, Steps, Work, ask
from ..errors import JobNotFoundError, NoResultError, OptionsError
from .attempts import runs_of
from .model import Counts, JobInfo, JobState, job_id_of, moment, optional_moment
from .steps import steps_of

__all__ = [
    "EXACT_UP_TO",
    "SAMPLE_ROWS",
    "FinishedCounts",
    "LiveCounts",
    "counts_by_name_call",
    "counts_call",
    "counts_from",
    "counts_on",
    "finished_counts_by_name_call",
    "gone_params",
    "job_call",
    "job_info",
    "job_on",
    "jobs_call",
    "jobs_on",
    "live_counts_by_name_call",
    "result_call",
]


def gone_params(now: datetime | None = None) -> dict[str, Any]:
    """The parameters of a read that says whether a running job's process is gone
    (`sql.workers.worker_gone`): the time (`now`: the database's clock) and the
    heartbeat interval to judge a process by that has no row (`sql.ABSENT_BEAT_MS`)."""
    return {"now": now, "beat_ms": sql.ABSENT_BEAT_MS}


def job_info(row: Row) -> JobInfo:
    """Read a row of `sql.JOB` or `sql.JOBS`."""
    return JobInfo(
        id=row.id,
        name=row.name,
        state=JobState(row.status),
        attempt=row.attempts,
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
        attempts=runs_of(getattr(row, "runs", None)),
        worker_gone=bool(getattr(row, "worker_gone", False)),
        steps=steps_of(getattr(row, "steps", None)),
    )


def job_call(job_id: UUID) -> Call[JobInfo | None]:
    """The call that reads one job."""
    job_id = job_id_of(job_id)
    return Call(
        sql.JOB,
        {"id": job_id, **gone_params()},
        lambda rows, _n: job_info(rows[0]) if rows else None,
    )


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
        {"state": state_text, "name": name, "limit": limit, **gone_params()},
        lambda rows, _n: [job_info(row) for row in rows],
    )


EXACT_UP_TO = 10_000
"""The most jobs of one state `counts` and `counts_by_name` count (reading at most one
more): past it, the state's number is the planner's estimate, named in
`Counts.estimated`. The finished jobs still in `axa_queue` count as one: past this many
in all, their three states are estimated (the history's are read each to its own)."""

_STATES = (
    "ready", "waiting", "running", "needs_review", "blocked", "completed", "failed", "cancelled",
)  # fmt: skip
_FINISHED = ("completed", "failed", "cancelled")


def counts_from(row: Row) -> Counts:
    """Read the counts columns of a row (`ready` ... `needs_review`, `oldest`), by name,
    every number exact."""
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


def _plan_rows(rows: list[Row], _n: int) -> int:
    plan = rows[0].QUERY_PLAN
    if isinstance(plan, str):  # asyncpg gives `json` as text
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


def _estimate(key: str) -> Call[int]:
    """The planner's estimate of one count (`sql.COUNT_ESTIMATES`)."""
    return Call(sql.COUNT_ESTIMATES[key], (), _plan_rows)


def _over(counted: dict[str, int], cap: int) -> list[str]:
    """The groups read to their cap: live states and the history's finished states
    (`moved_completed`...) each by its key, and `hot` (the finished jobs still in
    `axa_queue`) as a whole."""
    over = [
        s for s in ("ready", "waiting", "running", "needs_review", "blocked") if counted[s] > cap
    ]
    if sum(counted[s] for s in _FINISHED) > cap:
        over.append("hot")
    over.extend(f"moved_{s}" for s in _FINISHED if counted[f"moved_{s}"] > cap)
    return over


_KEYS = (*_STATES, *(f"moved_{s}" for s in _FINISHED))
"""What the bounded reads count: the states in `axa_queue`, and the history's (`moved_`)."""


def _group(key: str) -> str:
    """The group a count is read in (see `_over`)."""
    return "hot" if key in _FINISHED else key


def _estimates(over: list[str], counted: dict[str, int]) -> Steps[dict[str, int]]:
    """Each count of `_KEYS`: as read where its group was not read to the cap, else the
    planner's estimate (at least what was read)."""
    totals = {key: int(counted[key]) for key in _KEYS}
    for key in _KEYS:
        if _group(key) in over:
            totals[key] = max(totals[key], (yield from ask(_estimate(key))))
    return totals


def _estimated_states(over: list[str]) -> tuple[str, ...]:
    named = {key.removeprefix("moved_") for key in over}
    if "hot" in over:
        named.update(_FINISHED)
    return tuple(s for s in _STATES if s in named)


def _counts(now: datetime | None, cap: int) -> Steps[Counts]:
    row = yield from ask(Call(sql.COUNTS, {"now": now, "cap": cap}, lambda rows, _n: rows[0]))
    counted = row._asdict()
    over = _over(counted, cap)
    totals = yield from _estimates(over, counted)
    return Counts(
        **{s: totals[s] + totals.get(f"moved_{s}", 0) for s in _STATES},
        oldest_ready_seconds=row.oldest or 0.0,
        estimated=_estimated_states(over),
    )


def counts_call(now: datetime | None = None, cap: int = EXACT_UP_TO) -> Work[Counts]:
    """The work that counts jobs in each state: exactly up to `cap` jobs of a state,
    past it the planner's estimate (named in `Counts.estimated`)."""
    return _counts(now, cap)


SAMPLE_ROWS = 2 * EXACT_UP_TO
"""About how many of the history's rows `counts_by_name` samples past the cap."""


def _counts_by_name(cap: int) -> Steps[dict[str, Counts]]:
    rows = yield from ask(
        Call(sql.COUNTS_BY_NAME, {"now": None, "cap": cap}, lambda rows, _n: rows)
    )
    by_name = {row.name: row._asdict() for row in rows}
    counted = {key: sum(int(one[key]) for one in by_name.values()) for key in _KEYS}
    over = _over(counted, cap)
    totals = yield from _estimates(over, counted)
    # Each name's share of a count: of the rows read, scaled to the estimate; the
    # history's, read to its cap, from a sample of its pages instead of its first rows.
    share = {
        name: {key: float(one[key]) * totals[key] / max(counted[key], 1) for key in _KEYS}
        for name, one in by_name.items()
    }
    sampling = [s for s in _FINISHED if f"moved_{s}" in over]
    if sampling:
        # A state of the history read to its cap: its names' shares from a sample of
        # its pages (the first rows read are of a few days only); the states under the
        # cap keep their exact counts.
        pages = yield from ask(_estimate("moved"))
        percent = min(100.0, 100.0 * SAMPLE_ROWS / max(pages, 1))
        sample = yield from ask(
            Call(sql.COUNTS_SAMPLE_MOVED, {"percent": percent}, lambda rows, _n: rows)
        )
        sampled = {s: sum(int(r.n) for r in sample if r.status == s) for s in sampling}
        for one in share.values():
            for state in sampling:
                one[f"moved_{state}"] = 0.0
        for r in sample:
            if r.status not in sampled:
                continue
            one = share.setdefault(r.name, dict.fromkeys(_KEYS, 0.0))
            key = f"moved_{r.status}"
            one[key] += totals[key] * int(r.n) / max(sampled[r.status], 1)
    estimated = _estimated_states(over)
    return {
        name: Counts(
            **{s: round(share[name][s] + share[name].get(f"moved_{s}", 0.0)) for s in _STATES},
            oldest_ready_seconds=(by_name[name]["oldest"] if name in by_name else None) or 0.0,
            estimated=estimated,
        )
        for name in sorted(share)
    }


def counts_by_name_call(cap: int = EXACT_UP_TO) -> Work[dict[str, Counts]]:
    """The work that counts jobs in each state for each job name, as `counts_call`
    does: past the cap, a state's total estimated and shared among the names as the
    rows read (the history: a sample of its pages) share it."""
    return _counts_by_name(cap)


LiveCounts = tuple[int, int, int, int, float, int]
"""ready, waiting, running, needs_review, the oldest ready job's age in seconds, and
blocked."""
FinishedCounts = tuple[int, int, int]
"""completed, failed and cancelled."""


def live_counts_by_name_call() -> Call[dict[str, LiveCounts]]:
    """The call that counts the jobs not finished of each name, reading none that are."""
    return Call(
        sql.LIVE_COUNTS_BY_NAME,
        {"now": None},
        lambda rows, _n: {
            row.name: (
                row.ready,
                row.waiting,
                row.running,
                row.needs_review,
                row.oldest or 0.0,
                row.blocked,
            )
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
