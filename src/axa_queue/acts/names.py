"""A person's acts on a job name: `pause` stops the claiming of its jobs until
`resume` (they stay queued, those running finish). Both take the caller's connection,
a `by` and a `reason`, and keep their act in the acts table, with the nil UUID
(`NIL_JOB`) as its job and the name as its job name; `paused_on` lists the names
paused now. Workers of this package read the pauses in their claim statement; the Rust
crate's workers do not."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import datetime
from typing import overload

from .. import sql
from ..db.adapters import AnyConnection, SomeAsyncConnection, SomeSyncConnection, run
from ..db.calls import Call, Row
from ..jobs.model import check_name, moment
from .records import Act, ActKind, ActResult, act_of, check_code

__all__ = [
    "Pause",
    "name_acts_call",
    "name_acts_on",
    "pause",
    "pause_call",
    "paused_call",
    "paused_on",
    "resume",
    "resume_call",
]


@dataclass(frozen=True)
class Pause:
    """A job name paused now, as `axa_paused` says: who paused it, why and since when.
    The act itself, with the database role that kept it, is in the acts table
    (`name_acts_on`)."""

    name: str
    by: str
    reason: str
    at: datetime
    """When it was paused, on the database's clock, in UTC."""


def _name_call(statement: str, name: str, by: str, reason: str, kind: ActKind) -> Call[ActResult]:
    params = {
        "name": check_name(name),
        "by": check_code(by, "by"),
        "reason": check_code(reason, "reason"),
        "now": None,
    }

    def read(rows: list[Row], _count: int) -> ActResult:
        applied = rows[0].act is not None
        return ActResult(applied=applied, kind=kind if applied else None, found=None)

    return Call(statement, params, read)


def pause_call(name: str, by: str, reason: str) -> Call[ActResult]:
    """The call that pauses `name` (see `pause`)."""
    return _name_call(sql.PAUSE, name, by, reason, ActKind.PAUSED)


def resume_call(name: str, by: str, reason: str) -> Call[ActResult]:
    """The call that resumes `name` (see `resume`)."""
    return _name_call(sql.RESUME, name, by, reason, ActKind.RESUMED)


@overload
def pause(conn: SomeAsyncConnection, name: str, by: str, reason: str) -> Awaitable[ActResult]: ...
@overload
def pause(conn: SomeSyncConnection, name: str, by: str, reason: str) -> ActResult: ...
def pause(conn: AnyConnection, name: str, by: str, reason: str) -> ActResult | Awaitable[ActResult]:
    """Pause job name `name`, as an act of `by` for `reason`, in the caller's transaction:
    once committed, no worker of this package claims its jobs until `resume`. Its jobs
    stay queued (and may still be queued); those running finish as usual. Applied
    (`ActResult.applied`) unless the name is paused already, which changes nothing and
    keeps no act. The Rust crate's workers do not read pauses.

    Raises `NotACodeError` before anything is sent when `by` or `reason` is not a
    visible code, and `OptionsError` when `name` could not be a job's name.
    """
    return run(conn, pause_call(name, by, reason))


@overload
def resume(conn: SomeAsyncConnection, name: str, by: str, reason: str) -> Awaitable[ActResult]: ...
@overload
def resume(conn: SomeSyncConnection, name: str, by: str, reason: str) -> ActResult: ...
def resume(
    conn: AnyConnection, name: str, by: str, reason: str
) -> ActResult | Awaitable[ActResult]:
    """Resume paused job name `name`, as an act of `by` for `reason`, in the caller's
    transaction; workers are woken on commit and claim its jobs at once. A name not
    paused changes nothing and keeps no act (`applied` false)."""
    return run(conn, resume_call(name, by, reason))


def _read_pauses(rows: list[Row], _count: int) -> list[Pause]:
    return [Pause(name=r.name, by=r.by, reason=r.reason, at=moment(r.at)) for r in rows]


def paused_call() -> Call[list[Pause]]:
    """The call that reads the names paused now, by name."""
    return Call(sql.PAUSED, (), _read_pauses)


@overload
def paused_on(conn: SomeAsyncConnection) -> Awaitable[list[Pause]]: ...
@overload
def paused_on(conn: SomeSyncConnection) -> list[Pause]: ...
def paused_on(conn: AnyConnection) -> list[Pause] | Awaitable[list[Pause]]:
    """The job names paused now, in name order."""
    return run(conn, paused_call())


def name_acts_call(name: str) -> Call[list[Act]]:
    """The call that reads the acts on job name `name` (pauses, resumes), oldest first."""
    return Call(sql.NAME_ACTS, (check_name(name),), lambda rows, _n: [act_of(r) for r in rows])


@overload
def name_acts_on(conn: SomeAsyncConnection, name: str) -> Awaitable[list[Act]]: ...
@overload
def name_acts_on(conn: SomeSyncConnection, name: str) -> list[Act]: ...
def name_acts_on(conn: AnyConnection, name: str) -> list[Act] | Awaitable[list[Act]]:
    """Every act on job name `name` (each pause and resume), oldest first."""
    return run(conn, name_acts_call(name))
