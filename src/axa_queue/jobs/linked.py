"""Queuing jobs with dependencies: jobs given `after`, and workflows (`chain`, `group`,
`chord`, in `axa_queue.workflows`), in one statement of arrays whatever their number
(`sql.ENQUEUE_LINKED`).

A workflow is flattened here (`Flat`): its jobs in order, and for each job the jobs of
the same call it depends on, always given before it, so no cycle can be made. Each
job's own `after` (jobs queued before) comes first among its dependencies, then those
its place in the workflow gives it.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from .. import sql, tracing
from ..db.calls import Call, Row
from ..errors import OptionsError
from .model import NewJob, columns_of

__all__ = [
    "Composition",
    "Flat",
    "Workflow",
    "batch_of",
    "linked_call",
    "workflow_call",
    "workflow_refused",
]


@dataclass(frozen=True)
class Workflow:
    """A workflow queued: its id (`workflow_on`, `cancel_workflow`) and its jobs' ids, in
    the order its jobs were given (a chain's first job first, a group's in order, a
    chord's callback after its group)."""

    id: UUID
    jobs: tuple[UUID, ...]


class Composition(abc.ABC):
    """What `chain`, `group` and `chord` make: jobs and the dependencies among them,
    queued together by `enqueue_on`, `Queue.enqueue` or `SyncQueue.enqueue` (a
    `Workflow` back)."""

    @abc.abstractmethod
    def flatten(self) -> Flat:
        """Its jobs in order and the dependencies among them."""


@dataclass(frozen=True)
class Flat(Composition):
    """A composition flattened: `jobs` in order, and `parents[i]` the places (all less
    than `i`) of the jobs job `i` depends on, in order."""

    jobs: tuple[NewJob, ...]
    parents: tuple[tuple[int, ...], ...] = field(repr=False)

    def flatten(self) -> Flat:
        return self

    def filled(self, fill: Callable[[NewJob], NewJob]) -> Flat:
        """The same, each job passed through `fill` (a queue's handler defaults)."""
        return Flat(tuple(fill(job) for job in self.jobs), self.parents)


def _arrays(
    jobs: Sequence[NewJob], parents: Sequence[Sequence[int]], ids: list[UUID]
) -> dict[str, Any]:
    """`sql.ENQUEUE_LINKED`'s parameters but the workflow, the time and the trace."""
    child: list[UUID] = []
    parent: list[UUID] = []
    position: list[int] = []
    policy: list[str] = []
    inside: list[bool] = []
    outside: dict[UUID, None] = {}
    dependents = [False] * len(jobs)
    for place, job in enumerate(jobs):
        named = [*job.after, *(ids[p] for p in parents[place])]
        if len(set(named)) < len(named):
            raise OptionsError(
                f"job {job.name!r} (place {place} of the call) names a job twice among its "
                "dependencies: name each once"
            )
        for p in parents[place]:
            if not 0 <= p < place:
                raise OptionsError(
                    f"job {job.name!r} (place {place} of the call) depends on place {p}: a "
                    "job may depend only on jobs given before it"
                )
            dependents[p] = True
        for at, one in enumerate(named):
            child.append(ids[place])
            parent.append(one)
            position.append(at)
            policy.append(job.on_parent_failure)
            inside.append(at >= len(job.after))
        outside.update(dict.fromkeys(job.after))
    return {
        "id": ids,
        **columns_of(jobs),
        "dependents": dependents,
        "key": [job.key for job in jobs],
        "child": child,
        "parent": parent,
        "position": position,
        "policy": policy,
        "inside": inside,
        "outside": list(outside),
    }


def batch_of(jobs: Iterable[NewJob]) -> list[NewJob]:
    """`jobs` as a list, each a `NewJob`, else an `OptionsError` that says what to do
    (a workflow given to `enqueue_all` is queued by `enqueue`)."""
    batch = list(jobs)
    for place, job in enumerate(batch):
        if not isinstance(job, NewJob):
            kind = "a workflow" if isinstance(job, Composition) else "not a NewJob"
            raise OptionsError(
                f"enqueue_all takes NewJob items; place {place} is {kind} "
                f"({type(job).__name__}): queue a workflow (chain, group, chord) with "
                "enqueue, which returns its Workflow"
            )
    return batch


def linked_call(
    jobs: Sequence[NewJob],
    parents: Sequence[Sequence[int]] | None = None,
    workflow: UUID | None = None,
    now: datetime | None = None,
) -> Call[list[UUID]]:
    """The call that queues `jobs` with their dependencies (`parents`: see `Flat`; none
    by default) and, with `workflow`, as its members; their ids in order. A job with a
    unique key is refused (`OptionsError`): its key would be taken by a blocked job."""
    for job in jobs:
        if job.unique_key is not None:
            raise OptionsError(
                f"job {job.name!r} has a unique_key: a job queued with dependencies or in a "
                "workflow cannot have one; queue it on its own"
            )
    ids = [uuid4() for _ in jobs]
    params = _arrays(jobs, parents or [()] * len(jobs), ids)
    sending = (
        None
        if tracing.sender is None or not jobs
        else tracing.sender([job.name for job in jobs], ids)
    )
    return Call(
        sql.ENQUEUE_LINKED,
        {
            **params,
            "workflow": workflow,
            "now": now,
            "trace_context": None if sending is None else sending.carrier,
        },
        lambda _rows, _count: ids,
        None if sending is None else sending.end,
    )


def workflow_call(composition: Composition, now: datetime | None = None) -> Call[Workflow]:
    """The call that queues a workflow in one statement: a `Workflow` back."""
    flat = composition.flatten()
    workflow = uuid4()
    call = linked_call(flat.jobs, flat.parents, workflow, now)

    def read(rows: list[Row], count: int) -> Workflow:
        return Workflow(workflow, tuple(call.read(rows, count)))

    return Call(call.query, call.params, read, call.finished)


def workflow_refused(mode: str) -> str:
    """Why a queue does not take a workflow: in a mode that runs jobs here (`modes`), or
    given arguments or options beside it."""
    if mode != "queue":
        return (
            f"a workflow cannot be run in the {mode!r} mode: its jobs wait for each other "
            'in the database; use the "queue" mode (QueueOptions.mode)'
        )
    return "give a workflow (chain, group, chord) alone: its jobs carry their own arguments"
