"""Worker processes: which are running now, as each records itself in `axa_workers`.

A worker process makes its row when it starts, refreshes its last heartbeat and jobs in
progress once per `heartbeat_interval` (`worker.presence`), and deletes it when it stops
cleanly; housekeeping removes the rows of processes silent for `FORGET_AFTER`. Readers
call a process gone once it has been silent for `GONE_AFTER_BEATS` of its heartbeat
intervals (killed, its host lost, or cut off from the database), live until then; a row
that records no interval (written by an older version) is judged by `stale_after`
instead. The Rust crate's workers write no row: they simply do not appear.

The running jobs whose process is gone are `gone_jobs_call`'s (by name), and each job's
`JobInfo.worker_gone`. The job names no live process handles (`handled_names`) whose jobs have waited for
longer than `QueueOptions.unhandled_after` are `unhandled_call`'s: what `counts`, the
dashboard, the metrics and each worker's housekeeping warn about.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, overload
from uuid import UUID

import psycopg

from . import sql
from .db.adapters import run
from .db.calls import Call, Connection, Row, Steps, ask
from .jobs.model import moment

__all__ = [
    "FORGET_AFTER",
    "GONE_AFTER_BEATS",
    "UNHANDLED_CAP",
    "Unhandled",
    "WorkerInfo",
    "gone_jobs_call",
    "handled_names",
    "unhandled_call",
    "unhandled_steps",
    "workers_call",
    "workers_on",
]

FORGET_AFTER = 3600.0
"""Seconds after which housekeeping removes the row of a worker process never heard from
again (killed, or its host lost): long enough to see on the dashboard that it died."""

UNHANDLED_CAP = 10_000
"""The most jobs of one name `unhandled_call` counts: past it, "at least this many"."""

GONE_AFTER_BEATS = sql.GONE_AFTER_BEATS
"""Heartbeat intervals a process may miss before it is shown as gone: one late beat (a
slow write, a busy host) is not a death, three in a row are (the statements that say a
job's process is gone judge by the same number: `sql.workers.worker_gone`)."""


@dataclass(frozen=True)
class WorkerInfo:
    """One worker process, as its row in `axa_workers` says."""

    id: UUID
    """Made by the process when it starts; a new one each start."""
    host: str
    pid: int
    names: tuple[str, ...]
    """The job names it has handlers for."""
    loops: int
    """Its job loops (`QueueOptions.workers`): how many jobs it runs at once at most."""
    running: int
    """Jobs in progress at its last heartbeat."""
    version: str
    """The axa-queue version it runs."""
    started_at: datetime
    seen_at: datetime
    """Its last heartbeat, on the database's clock."""
    silent: float
    """Seconds since `seen_at`, on the database's clock."""
    beat: float | None = None
    """Its heartbeat interval in seconds, or `None` in a row written by a version that
    did not record it."""
    holding: int = 0
    """Jobs the table says it runs now (`running` under a claim it made): for a gone
    process, the runs it left, until stale recovery (or a person) decides them."""

    def gone_after(self, stale_after: float) -> float:
        """Seconds of silence after which it is gone: `GONE_AFTER_BEATS` heartbeat
        intervals, or `stale_after` when its row does not say its interval."""
        return stale_after if self.beat is None else GONE_AFTER_BEATS * self.beat

    def live(self, stale_after: float) -> bool:
        """Whether it was heard from lately (see `gone_after`)."""
        return self.silent < self.gone_after(stale_after)

    def state(self, stale_after: float) -> str:
        """`"live"`, or `"gone"` once silent for `gone_after(stale_after)` seconds."""
        return "live" if self.live(stale_after) else "gone"

    def in_progress(self, stale_after: float) -> int:
        """Its jobs in progress: as it said at its last heartbeat while it is live (its
        runs claimed ahead too), else the runs the table says it left (`holding`)."""
        return self.running if self.live(stale_after) else self.holding


def _read(rows: list[Row], _count: int) -> list[WorkerInfo]:
    return [
        WorkerInfo(
            id=r.id,
            host=r.host,
            pid=r.pid,
            names=tuple(r.names),
            loops=r.loops,
            running=r.running,
            version=r.version,
            started_at=moment(r.started_at),
            seen_at=moment(r.seen_at),
            silent=max(0.0, float(r.silent)),
            beat=None if r.beat_ms is None else r.beat_ms / 1000,
            holding=r.holding,
        )
        for r in rows
    ]


def workers_call(now: datetime | None = None) -> Call[list[WorkerInfo]]:
    """The call that reads every worker process's row."""
    return Call(sql.WORKERS, {"now": now}, _read)


@overload
def workers_on(conn: psycopg.AsyncConnection[Any]) -> Awaitable[list[WorkerInfo]]: ...
@overload
def workers_on(conn: psycopg.Connection[Any]) -> list[WorkerInfo]: ...
def workers_on(conn: Connection) -> list[WorkerInfo] | Awaitable[list[WorkerInfo]]:
    """Every worker process that has a row (live ones, and those silent for less than
    `FORGET_AFTER`), by host and pid."""
    return run(conn, workers_call())


def gone_jobs_call(now: datetime | None = None) -> Call[dict[str, int]]:
    """The call that counts, by job name, the running jobs whose worker process is gone
    (`sql.WORKER_GONE_JOBS`): shown as "worker gone" until stale recovery decides them."""
    return Call(
        sql.WORKER_GONE_JOBS,
        {"now": now, "beat_ms": sql.ABSENT_BEAT_MS},
        lambda rows, _n: {r.name: r.jobs for r in rows},
    )


def handled_names(workers: Iterable[WorkerInfo], stale_after: float) -> frozenset[str]:
    """The job names some live process of `workers` handles."""
    return frozenset(name for one in workers if one.live(stale_after) for name in one.names)


@dataclass(frozen=True)
class Unhandled:
    """A job name no live worker process handles, with jobs waiting for it."""

    name: str
    jobs: int
    """Its jobs due for longer than the threshold asked (`unhandled_after`), counted up
    to `UNHANDLED_CAP`."""
    oldest: float
    """Seconds the oldest of those counted has been due."""


def unhandled_call(
    handled: Iterable[str], after: float, now: datetime | None = None
) -> Call[list[Unhandled]]:
    """The call that reads the names not in `handled` with jobs due for longer than
    `after` seconds, by name."""
    return Call(
        sql.UNHANDLED_JOBS,
        {"handled": sorted(handled), "after": after, "cap": UNHANDLED_CAP, "now": now},
        lambda rows, _n: [Unhandled(r.name, r.jobs, max(0.0, float(r.oldest))) for r in rows],
    )


def unhandled_steps(
    stale_after: float, after: float, here: Iterable[str] = ()
) -> Steps[tuple[list[WorkerInfo], list[Unhandled]]]:
    """Read the worker processes, then the names none of the live ones handles (nor
    `here`: the caller's own, a worker whose row may not be written yet) whose jobs have
    been due for longer than `after` seconds (two small statements)."""
    found = yield from ask(workers_call())
    handled = handled_names(found, stale_after) | frozenset(here)
    return found, (yield from ask(unhandled_call(handled, after)))
