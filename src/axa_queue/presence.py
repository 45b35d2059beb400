"""Worker processes: which are running now, as each records itself in `axa_workers`.

A worker process makes its row when it starts, refreshes its last heartbeat and jobs in
progress once per `heartbeat_interval` (`worker.presence`), and deletes it when it stops
cleanly; housekeeping removes the rows of processes silent for `FORGET_AFTER`. Readers
call a process live while it was heard from within `stale_after`. The Rust crate's
workers write no row: they simply do not appear.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, overload
from uuid import UUID

import psycopg

from . import sql
from .db.adapters import run
from .db.calls import Call, Connection, Row
from .jobs.model import moment

__all__ = ["FORGET_AFTER", "WorkerInfo", "workers_call", "workers_on"]

FORGET_AFTER = 3600.0
"""Seconds after which housekeeping removes the row of a worker process never heard from
again (killed, or its host lost): long enough to see on the dashboard that it died."""


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

    def live(self, stale_after: float) -> bool:
        """Whether it was heard from within `stale_after` seconds."""
        return self.silent < stale_after


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
