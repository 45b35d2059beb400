"""A workflow read (`workflow_on`: every member's state) and cancelled
(`cancel_workflow`: every member not finished, one act each), on any connection."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import overload
from uuid import UUID

from .. import sql
from ..acts.records import check_code
from ..db.adapters import AnyConnection, SomeAsyncConnection, SomeSyncConnection, run
from ..db.calls import Call, Row
from ..jobs.model import JobState, job_id_of

__all__ = ["Member", "WorkflowInfo", "cancel_workflow", "workflow_of_call", "workflow_on"]


@dataclass(frozen=True)
class Member:
    """A job of a workflow: its id, name, state (`None` once purged) and the ids of the
    jobs it depends on, in order. Never its arguments or result."""

    id: UUID
    name: str | None
    state: JobState | None
    parents: tuple[UUID, ...]


@dataclass(frozen=True)
class WorkflowInfo:
    """A workflow's members, in the order they were given."""

    id: UUID
    members: tuple[Member, ...]

    @property
    def finished(self) -> bool:
        """Whether every member has finished (completed, failed or cancelled)."""
        return all(
            m.state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, None)
            for m in self.members
        )

    def states(self) -> dict[UUID, JobState | None]:
        """Each member's state, by id."""
        return {m.id: m.state for m in self.members}


def _member(row: Row) -> Member:
    return Member(
        id=UUID(row.id),
        name=row.name,
        state=None if row.status is None else JobState(row.status),
        parents=tuple(UUID(p) for p in row.parents),
    )


def workflow_call(workflow_id: UUID) -> Call[WorkflowInfo | None]:
    """The call that reads a workflow's members (`None`: no such workflow)."""
    found = job_id_of(workflow_id)

    def read(rows: list[Row], _count: int) -> WorkflowInfo | None:
        return WorkflowInfo(found, tuple(_member(r) for r in rows)) if rows else None

    return Call(sql.WORKFLOW, {"workflow": found}, read)


def workflow_of_call(some_id: UUID) -> Call[UUID | None]:
    """The call that finds the workflow `some_id` names: the one a job of that id is a
    member of, else the workflow of that id (`None`: neither)."""

    def read(rows: list[Row], _count: int) -> UUID | None:
        return None if rows[0].workflow is None else UUID(rows[0].workflow)

    return Call(sql.WORKFLOW_OF, {"id": job_id_of(some_id)}, read)


@overload
def workflow_on(conn: SomeAsyncConnection, workflow_id: UUID) -> Awaitable[WorkflowInfo | None]: ...
@overload
def workflow_on(conn: SomeSyncConnection, workflow_id: UUID) -> WorkflowInfo | None: ...
def workflow_on(
    conn: AnyConnection, workflow_id: UUID
) -> WorkflowInfo | Awaitable[WorkflowInfo | None] | None:
    """The workflow `workflow_id` (`Workflow.id`): every member's state and
    dependencies, on any connection (awaitable when async); `None` if there is none."""
    return run(conn, workflow_call(workflow_id))


def cancel_workflow_call(workflow_id: UUID, by: str, reason: str) -> Call[int]:
    """The call that cancels a workflow's unfinished members (how many it cancelled)."""
    params = {
        "workflow": job_id_of(workflow_id),
        "by": check_code(by, "by"),
        "reason": check_code(reason, "reason"),
        "now": None,
    }
    return Call(sql.CANCEL_WORKFLOW, params, lambda rows, _n: int(rows[0].cancelled))


@overload
def cancel_workflow(
    conn: SomeAsyncConnection, workflow_id: UUID, by: str, reason: str
) -> Awaitable[int]: ...
@overload
def cancel_workflow(conn: SomeSyncConnection, workflow_id: UUID, by: str, reason: str) -> int: ...
def cancel_workflow(
    conn: AnyConnection, workflow_id: UUID, by: str, reason: str
) -> int | Awaitable[int]:
    """Cancel every member of workflow `workflow_id` not finished yet (queued, running,
    blocked or in review) as `cancel` cancels one, one act of `by` for `reason` each, in
    the caller's transaction, in one statement; returns how many it cancelled. Running
    members are stopped once the caller commits. Dependents outside the workflow meet
    their own `on_parent_failure`."""
    return run(conn, cancel_workflow_call(workflow_id, by, reason))
