"""Queuing jobs: the statements that store them, and the operations that send them.

One job is one `Call` (`enqueue_call`); a batch is one INSERT of arrays, or a binary
COPY when it is big enough (`enqueue_many_call`); jobs with a unique key are `Steps`,
sent again for the jobs whose key's holder came after the statement's snapshot (a race
with another transaction, under READ COMMITTED) until each is queued or has its holder
(`enqueue_unique`). `enqueue_work` and `enqueue_all_work` choose among them; `Queue`,
`SyncQueue` and `enqueue_on` run what they choose, on their connection, as it is.

`enqueue_on` and `enqueue_all_on` take the caller's connection (psycopg's, sync or
async, Django's, SQLAlchemy's or asyncpg's: `adapters`), so a job commits or rolls back
with the caller's own work.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, overload
from uuid import UUID, uuid4

from .. import sql, tracing
from ..db.adapters import AnyConnection, SomeAsyncConnection, SomeSyncConnection, run
from ..db.calls import Call, Row, Steps, Work, ask
from ..errors import OptionsError
from .linked import Composition, Workflow, batch_of, linked_call, workflow_call
from .model import Duplicate, NewJob, columns_of

__all__ = [
    "COPY_FROM",
    "Answers",
    "UniqueEnqueue",
    "copies",
    "enqueue_all_on",
    "enqueue_all_work",
    "enqueue_call",
    "enqueue_many_call",
    "enqueue_on",
    "enqueue_unique",
    "enqueue_unique_call",
    "enqueue_unique_one",
    "enqueue_unique_one_call",
    "enqueue_work",
    "has_unique",
    "new_ids",
]


def enqueue_call(
    job: NewJob, now: datetime | None = None, job_id: UUID | None = None
) -> Call[UUID]:
    """The call that queues one job as `job_id` (default: an id made here), so it is
    known before it runs. A delay counts from `now` (default: the database's clock). A
    job with a unique key is not queued by this call: see `enqueue_unique_one`."""
    job_id = uuid4() if job_id is None else job_id
    sending = None if tracing.sender is None else tracing.sender((job.name,), (job_id,))
    return Call(
        sql.ENQUEUE if job.key is None else sql.ENQUEUE_KEYED,
        {
            "id": job_id,
            "name": job.name,
            "args": job.encoded_args(),
            "max_attempts": job.max_attempts,
            "priority": job.priority_value(),
            "at": job.run_at,
            "delay": job.delay_seconds(),
            "timeout_ms": job.timeout_ms(),
            "now": now,
            "trace_context": None if sending is None else sending.carrier,
            "key": job.key,
        },
        lambda _rows, _count: job_id,
        None if sending is None else sending.end,
    )


COPY_FROM = 8
"""The fewest jobs `enqueue_all` sends by binary COPY (`sql.ENQUEUE_COPY`) instead of
one INSERT of arrays (`sql.ENQUEUE_MANY`): one call in a transaction of its own measured
level at 2 to 8 jobs, 1.1x faster at 16, 1.4x at 100 and about 2x at 10,000
(docs/performance.md)."""

COPY_TYPES = ("uuid", "text", "jsonb", "int4", "int2", "int8", "jsonb")
"""The types of `sql.ENQUEUE_COPY`'s columns, in order, for binary COPY."""

KEYED_COPY_TYPES = (*COPY_TYPES, "text")
"""The types of `sql.ENQUEUE_COPY_KEYED`'s columns: `ENQUEUE_COPY`'s and the key."""


def copies(jobs: Sequence[NewJob], now: datetime | None = None) -> bool:
    """Whether `jobs` go by COPY: enough of them, all due at once on the database's
    clock (a delay or a time needs the expression `ENQUEUE_MANY` computes per row), and
    none with a unique key (those go by `ENQUEUE_UNIQUE`)."""
    return (
        len(jobs) >= COPY_FROM
        and now is None
        and all(
            job.run_in is None and job.run_at is None and job.unique_key is None for job in jobs
        )
    )


_VERSION_4 = (4 << 76) | (0x8000 << 48)
"""The version (4) and variant (RFC 4122) bits of a random UUID."""
_RANDOM_BITS = ~((0xF000 << 64) | (0xC000 << 48))
"""The bits of a UUID that are random in version 4: all but the version and variant."""


def new_ids(count: int) -> list[UUID]:
    """`count` random (version 4) job ids, as `uuid4()` makes them, from one read of
    `os.urandom` for them all: a read per id cost more than the rest of queuing one by
    COPY."""
    pool = os.urandom(16 * count)
    from_bytes = int.from_bytes
    return [
        UUID(int=from_bytes(pool[at : at + 16], "big") & _RANDOM_BITS | _VERSION_4)
        for at in range(0, 16 * count, 16)
    ]


_ROWS_PER_CHUNK = 1000
"""How many ids `_CopyRows` makes at a time."""


@dataclass(frozen=True)
class _CopyRows:
    """The rows `sql.ENQUEUE_COPY` sends, made as the COPY sends them (not all before
    it starts): the database stores each chunk while the next is made. The ids not
    made yet (`ids` holds those made, in order) are made here too, a chunk at a time."""

    jobs: Sequence[NewJob]
    ids: list[UUID]
    carrier: Any

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        jobs, ids, carrier = self.jobs, self.ids, self.carrier
        for start in range(0, len(jobs), _ROWS_PER_CHUNK):
            end = min(start + _ROWS_PER_CHUNK, len(jobs))
            if len(ids) < end:
                ids += new_ids(end - len(ids))
            for at in range(start, end):
                job = jobs[at]
                yield (
                    ids[at],
                    job.name,
                    job._args_json,  # encoded_args(), read directly: once per job
                    job.max_attempts,
                    0 if job.priority is None else job.priority,  # priority_value()
                    None if job.timeout is None else job.timeout_ms(),
                    carrier,
                )


@dataclass(frozen=True)
class _KeyedCopyRows(_CopyRows):
    """`_CopyRows` with each job's key last, for `sql.ENQUEUE_COPY_KEYED`."""

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        jobs = self.jobs
        for at, row in enumerate(super().__iter__()):
            yield (*row, jobs[at].key)


def keyed(jobs: Sequence[NewJob]) -> bool:
    """Whether any of `jobs` has a key (`NewJob.key`): then the batch goes by the keyed
    statements (`sql.ENQUEUE_MANY_KEYED`, `sql.ENQUEUE_COPY_KEYED`), else by the ones
    every queue sends, unchanged."""
    return any(job.key is not None for job in jobs)


def enqueue_many_call(
    jobs: Sequence[NewJob], now: datetime | None = None, *, copy: bool = False
) -> Call[list[UUID]]:
    """The call that queues many jobs in one statement; delays count from `now`. With
    `copy` (for a psycopg connection), jobs that `copies` says may go by COPY do; the
    INSERT of arrays is then made only where the COPY cannot go (`Call.instead`), and
    the ids as the rows are sent (unless a tracing hook wants them first)."""
    by_copy = copy and copies(jobs, now)
    ids = [] if by_copy and tracing.sender is None else new_ids(len(jobs))
    sending = (
        None
        if tracing.sender is None or not jobs
        else tracing.sender([job.name for job in jobs], ids)
    )
    carrier = None if sending is None else sending.carrier
    finished = None if sending is None else sending.end

    def made(_rows: list[Row], _count: int) -> list[UUID]:
        if len(ids) < len(jobs):  # for the INSERT (the COPY makes them as it sends)
            ids.extend(new_ids(len(jobs) - len(ids)))
        return ids

    with_keys = keyed(jobs)

    def insert(finished: Callable[[BaseException | None], None] | None = None) -> Call[list[UUID]]:
        params = {"id": made([], 0), **columns_of(jobs), "now": now, "trace_context": carrier}
        if with_keys:
            params["key"] = [job.key for job in jobs]
        return Call(
            sql.ENQUEUE_MANY_KEYED if with_keys else sql.ENQUEUE_MANY, params, made, finished
        )

    if by_copy:
        return Call(
            sql.ENQUEUE_COPY_KEYED if with_keys else sql.ENQUEUE_COPY,
            (),
            made,
            finished,
            copy_rows=(_KeyedCopyRows if with_keys else _CopyRows)(jobs, ids, carrier),
            copy_types=KEYED_COPY_TYPES if with_keys else COPY_TYPES,
            instead=insert,
        )
    return insert(finished)


Answers = list[UUID | None]
"""What `ENQUEUE_UNIQUE` says of each job sent: its id (queued), the holder's as a
`Duplicate`, or `None`: its holder came after the statement's snapshot, send it again."""


def enqueue_unique_call(
    jobs: Sequence[NewJob],
    ids: Sequence[UUID],
    now: datetime | None = None,
    traced: bool = True,
    carrier: Any = None,
) -> tuple[Call[Answers], Any]:
    """The call that queues `jobs` (their ids made by the caller, each key at most once
    among them) when some have a unique key, and the trace context it stores."""
    sending = (
        None
        if tracing.sender is None or not jobs or not traced
        else tracing.sender([job.name for job in jobs], list(ids))
    )
    if sending is not None:
        carrier = sending.carrier
    keys = [job.unique_key for job in jobs]

    def read(rows: list[Row], _count: int) -> Answers:
        queued = {row.id for row in rows if row.queued}
        held = {row.unique_key: row.id for row in rows if not row.queued}
        answers: Answers = []
        for job_id, key in zip(ids, keys, strict=True):
            if str(job_id) in queued:
                answers.append(job_id)
            elif key is not None and key in held:
                answers.append(Duplicate(held[key]))
            else:
                answers.append(None)
        return answers

    call = Call(
        sql.ENQUEUE_UNIQUE,
        {
            "id": list(ids),
            **columns_of(jobs),
            "unique_key": keys,
            "unique_for_ms": [job.unique_for_ms() for job in jobs],
            "key": [job.key for job in jobs],
            "now": now,
            "trace_context": carrier,
        },
        read,
        None if sending is None else sending.end,
    )
    return call, carrier


def enqueue_unique_one_call(
    job: NewJob,
    job_id: UUID,
    now: datetime | None = None,
    traced: bool = True,
    carrier: Any = None,
) -> tuple[Call[UUID | None], Any]:
    """The call that queues one job with a unique key (`sql.ENQUEUE_UNIQUE_ONE`, scalar
    parameters), and the trace context it stores. It reads `job_id` (queued), the
    holder's id as a `Duplicate`, or `None`: the holder came after the statement's
    snapshot, send it again (`traced` false, with the same `carrier`)."""
    sending = (
        None if tracing.sender is None or not traced else tracing.sender((job.name,), (job_id,))
    )
    if sending is not None:
        carrier = sending.carrier

    def read(rows: list[Row], _count: int) -> UUID | None:
        if not rows:
            return None
        row = rows[0]
        return job_id if row.queued else Duplicate(str(row.id))

    call = Call(
        sql.ENQUEUE_UNIQUE_ONE,
        {
            "id": job_id,
            "name": job.name,
            "args": job.encoded_args(),
            "max_attempts": job.max_attempts,
            "priority": job.priority_value(),
            "at": job.run_at,
            "delay": job.delay_seconds(),
            "timeout_ms": job.timeout_ms(),
            "unique_key": job.unique_key,
            "unique_for_ms": job.unique_for_ms(),
            "key": job.key,
            "now": now,
            "trace_context": carrier,
        },
        read,
        None if sending is None else sending.end,
    )
    return call, carrier


def enqueue_unique_one(job: NewJob, now: datetime | None = None) -> Steps[UUID]:
    """Queue `job`, which has a unique key, with `sql.ENQUEUE_UNIQUE_ONE`: its id, or its
    holder's as a `Duplicate`. Sent again only when the holder committed after the
    statement's snapshot."""
    job_id = uuid4()
    call, carrier = enqueue_unique_one_call(job, job_id, now)
    answer = yield from ask(call)
    while answer is None:
        call, _ = enqueue_unique_one_call(job, job_id, now, False, carrier)
        answer = yield from ask(call)
    return answer


class UniqueEnqueue:
    """Queuing a batch of jobs some of which have a unique key: one `ENQUEUE_UNIQUE` per
    batch, and one more for the jobs whose holder came after its snapshot (a race with
    another transaction, under READ COMMITTED), until each is queued or has its holder.

    Within the batch each key is sent once, for its first job; a later job of the same
    key gets the first one's answer as a `Duplicate`."""

    def __init__(self, jobs: Sequence[NewJob], now: datetime | None = None) -> None:
        self.jobs = list(jobs)
        self.now = now
        self.ids = [uuid4() for _ in self.jobs]
        self.first: dict[str, int] = {}
        """The place of the first job of each key."""
        self.sent: list[int] = []
        """The places of the jobs sent (the first of each key, and every unkeyed one)."""
        for place, job in enumerate(self.jobs):
            key = job.unique_key
            if key is None:
                self.sent.append(place)
            elif key not in self.first:
                self.first[key] = place
                self.sent.append(place)
        self.answers: list[UUID | None] = [None] * len(self.jobs)
        self.carrier: Any = None
        self.traced = True
        self.pending: list[int] = []
        """The places of the jobs in the statement last sent."""

    def call(self) -> Call[Answers] | None:
        """The statement to send next, or `None` once every job sent has its answer."""
        places = [p for p in self.sent if self.answers[p] is None]
        if not places:
            return None
        call, self.carrier = enqueue_unique_call(
            [self.jobs[p] for p in places],
            [self.ids[p] for p in places],
            self.now,
            self.traced,
            self.carrier,
        )
        self.traced = False  # a statement sent again is not a new enqueue
        self.pending = places
        return call

    def take(self, answers: Answers) -> None:
        """Keep what the statement said of each job it carried."""
        for place, answer in zip(self.pending, answers, strict=True):
            self.answers[place] = answer

    def result(self) -> list[UUID]:
        """Each job's id in order: queued (a `UUID`) or its key's holder (a `Duplicate`)."""
        found: list[UUID] = []
        for place, job in enumerate(self.jobs):
            key = job.unique_key
            if key is not None and self.first[key] != place:
                first = self.answers[self.first[key]]
                assert first is not None
                found.append(first if isinstance(first, Duplicate) else Duplicate(int=first.int))
            else:
                answer = self.answers[place]
                assert answer is not None
                found.append(answer)
        return found


def enqueue_unique(jobs: Sequence[NewJob], now: datetime | None = None) -> Steps[list[UUID]]:
    """Queue `jobs` (some with a unique key; `UniqueEnqueue`): their ids in order. A
    single keyed job takes the one-row statement (`enqueue_unique_one`)."""
    if len(jobs) == 1 and jobs[0].unique_key is not None:
        return [(yield from enqueue_unique_one(jobs[0], now))]
    batch = UniqueEnqueue(jobs, now)
    call = batch.call()
    while call is not None:
        batch.take((yield from ask(call)))
        call = batch.call()
    return batch.result()


def has_unique(jobs: Iterable[NewJob]) -> bool:
    """Whether any of `jobs` has a unique key (then `enqueue_unique` queues them)."""
    return any(job.unique_key is not None for job in jobs)


@overload
def enqueue_work(job: NewJob, now: datetime | None = None) -> Work[UUID]: ...
@overload
def enqueue_work(job: Composition, now: datetime | None = None) -> Work[Workflow]: ...
def enqueue_work(job: NewJob | Composition, now: datetime | None = None) -> Work[Any]:
    """Queuing `job`: one statement (`enqueue_call`), or, with a unique key, the steps
    that queue it or find its key's holder (`enqueue_unique_one`); a job with
    dependencies, or a workflow, one statement of its own (`linked`)."""
    if isinstance(job, Composition):
        return workflow_call(job, now)
    if job.after:
        one = linked_call([job], now=now)
        return Call(one.query, one.params, lambda rows, n: one.read(rows, n)[0], one.finished)
    if job.unique_key is not None:
        return enqueue_unique_one(job, now)
    return enqueue_call(job, now)


def enqueue_all_work(jobs: Sequence[NewJob]) -> Work[list[UUID]]:
    """Queuing `jobs` together: one statement (an INSERT of arrays, or a binary COPY
    where it can go: `enqueue_many_call`), or, when some have a unique key, the steps
    of `enqueue_unique`; when some have dependencies, the one statement that queues
    them (`linked_call`), which takes no unique key."""
    if any(job.after for job in jobs):
        for job in jobs:
            if job.unique_key is not None and not job.after:
                raise OptionsError(
                    f"job {job.name!r} has a unique_key and other jobs of the same "
                    "enqueue_all have dependencies (after=): jobs with dependencies are "
                    "queued by one statement that takes no unique key; queue the jobs "
                    "with a unique key in an enqueue_all of their own"
                )
        return linked_call(jobs)
    if has_unique(jobs):
        return enqueue_unique(jobs)
    return enqueue_many_call(jobs, copy=True)


@overload
def enqueue_on(conn: SomeAsyncConnection, job: NewJob) -> Awaitable[UUID]: ...
@overload
def enqueue_on(conn: SomeSyncConnection, job: NewJob) -> UUID: ...
@overload
def enqueue_on(conn: SomeAsyncConnection, job: Composition) -> Awaitable[Workflow]: ...
@overload
def enqueue_on(conn: SomeSyncConnection, job: Composition) -> Workflow: ...
def enqueue_on(conn: AnyConnection, job: NewJob | Composition) -> Any:
    """Queue `job` on the caller's connection and return its id (awaitable when async);
    a workflow (`chain`, `group`, `chord`) is queued whole and returns a `Workflow`.

    In the caller's transaction the job commits or rolls back with it; on an
    autocommit connection it is queued at once. One statement, one round trip. A job
    whose unique key is taken writes nothing and returns the holder's id as a
    `Duplicate`."""
    return run(conn, enqueue_work(job))


@overload
def enqueue_all_on(conn: SomeAsyncConnection, jobs: Iterable[NewJob]) -> Awaitable[list[UUID]]: ...
@overload
def enqueue_all_on(conn: SomeSyncConnection, jobs: Iterable[NewJob]) -> list[UUID]: ...
def enqueue_all_on(
    conn: AnyConnection, jobs: Iterable[NewJob]
) -> list[UUID] | Awaitable[list[UUID]]:
    """Queue every job in one statement on the caller's connection; ids in order.

    They commit or roll back together with the caller's transaction. A job whose unique
    key is taken (also by an earlier job of the same batch) is not queued: its place
    holds the holder's id as a `Duplicate`. A batch of `COPY_FROM` jobs or more, all due
    now and none with a unique key, goes by binary COPY on any psycopg connection
    (Django's and SQLAlchemy's `postgresql+psycopg` included), and by the INSERT of
    arrays on asyncpg's or in pipeline mode (`Call.instead`).
    """
    return run(conn, enqueue_all_work(batch_of(jobs)))
