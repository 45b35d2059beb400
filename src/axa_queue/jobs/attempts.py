"""A job's attempts read back (`axa_queue_attempts`): each run's start, end, outcome,
error and worker, as `Attempt`s, through `attempts_on` on any connection, and in
`JobInfo.attempts` (read with the job by `sql.JOB`)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from decimal import Decimal
from typing import Any, overload
from uuid import UUID

from .. import sql
from ..db.adapters import AnyConnection, SomeAsyncConnection, SomeSyncConnection, run
from ..db.calls import Call, Row
from .model import Attempt, job_id_of, optional_moment

__all__ = ["SHOWN_RUNS", "attempt_of", "attempts_call", "attempts_on", "latest", "runs_of"]

SHOWN_RUNS = 50
"""The most attempts `axa-queue show` and the dashboard's job page list (the latest);
the others are counted. A job that retried or slept thousands of times made a page of
10 MB and a `show` of 7 s; `show --json` and `attempts_on` give every one."""


def latest(runs: tuple[Attempt, ...]) -> tuple[int, tuple[Attempt, ...]]:
    """How many of `runs` (oldest first) are left out, and the latest `SHOWN_RUNS`."""
    left_out = max(len(runs) - SHOWN_RUNS, 0)
    return left_out, runs[left_out:]


def _epoch(value: Any) -> Any:
    """Epoch seconds as `optional_moment` takes them: JSON writes an infinite `numeric`
    (a time of `infinity`, written by another client) as the text `"Infinity"`."""
    return Decimal(value) if isinstance(value, str) else value


def attempt_of(row: Row | Mapping[str, Any]) -> Attempt:
    """Read one attempt: a row of `sql.ATTEMPTS`, or an element of `sql.JOB`'s `runs`
    (the same columns, as a JSON object)."""
    get: Callable[[str], Any] = (
        row.get if isinstance(row, Mapping) else lambda name: getattr(row, name)
    )
    worker = get("worker")
    return Attempt(
        attempt=get("attempt"),
        outcome=get("outcome"),
        started_at=optional_moment(_epoch(get("started_at"))),
        ended_at=optional_moment(_epoch(get("ended_at"))),
        error_class=get("error_class"),
        error=get("error"),
        worker=None if worker is None else UUID(str(worker)),
        host=get("host"),
        pid=get("pid"),
        derived=bool(get("derived")),
    )


def runs_of(runs: Any) -> tuple[Attempt, ...]:
    """`sql.JOB`'s `runs` column (a JSON array, or `None` from a statement without it;
    its text, from a driver that leaves `json` undecoded: asyncpg)."""
    if isinstance(runs, (str, bytes)):
        runs = json.loads(runs)
    return tuple(attempt_of(one) for one in runs or ())


def attempts_call(job_id: UUID) -> Call[list[Attempt]]:
    """The call that reads a job's attempts, oldest first."""
    return Call(
        sql.ATTEMPTS,
        {"id": job_id_of(job_id)},
        lambda rows, _n: [attempt_of(r) for r in rows],
    )


@overload
def attempts_on(conn: SomeAsyncConnection, job_id: UUID) -> Awaitable[list[Attempt]]: ...
@overload
def attempts_on(conn: SomeSyncConnection, job_id: UUID) -> list[Attempt]: ...
def attempts_on(conn: AnyConnection, job_id: UUID) -> list[Attempt] | Awaitable[list[Attempt]]:
    """Every run of job `job_id`, oldest first, each an `Attempt` (its start, end,
    outcome, error and the worker process that ran it), on any connection the package
    takes (psycopg, sync or async, Django's, SQLAlchemy's, asyncpg's); an empty list for
    a job that is gone (its attempts leave with it). A run the Rust crate made has no
    row of its own: its job's last one is read from the job's row (`Attempt.derived`)."""
    return run(conn, attempts_call(job_id))
