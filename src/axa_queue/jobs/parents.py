"""What a job's dependencies returned, for its handler (`JobContext.parent_results`)
or anyone holding its id (`parent_results_on`): private like arguments, never logged
or shown."""

from __future__ import annotations

import json
from collections.abc import Awaitable
from typing import Any, overload
from uuid import UUID

from .. import sql
from ..db.adapters import AnyConnection, SomeAsyncConnection, SomeSyncConnection, run
from ..db.calls import Call, Row
from .ids import job_id_of

__all__ = ["parent_results_call", "parent_results_on", "results_of"]


def results_of(rows: list[Any]) -> list[Any]:
    """The results `PARENT_RESULTS` returned, decoded (`None` where a parent has none)."""
    return [None if row.result is None else json.loads(row.result) for row in rows]


def _results(rows: list[Row], _count: int) -> list[Any]:
    return results_of(rows)


def parent_results_call(job_id: UUID) -> Call[list[Any]]:
    """The call that reads what each job `job_id` depends on returned, in order."""
    return Call(sql.PARENT_RESULTS, {"id": job_id_of(job_id)}, _results)


@overload
def parent_results_on(conn: SomeAsyncConnection, job_id: UUID) -> Awaitable[list[Any]]: ...
@overload
def parent_results_on(conn: SomeSyncConnection, job_id: UUID) -> list[Any]: ...
def parent_results_on(conn: AnyConnection, job_id: UUID) -> list[Any] | Awaitable[list[Any]]:
    """What each job `job_id` depends on returned, in the order of its dependencies (its
    own `after` first, then those its place in a workflow gave it: a chord's callback
    reads its group's results in the group's order). `None` for a parent that returned
    nothing, or did not complete (a dependency that says `run`). On any connection,
    awaitable when async; empty for a job without dependencies."""
    return run(conn, parent_results_call(job_id))
