"""Jobs: what a new job is, what the queue tells of one, and queuing on any connection.

`enqueue_on` and `enqueue_all_on` take the caller's connection (psycopg's, sync or
async, Django's, SQLAlchemy's or asyncpg's: `adapters`), so a job commits or rolls back
with the caller's own work. Nothing here ever
shows a job's arguments: not `repr`, not `JobInfo`, not an error message.
"""

from __future__ import annotations

import enum
import inspect
import os
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, TypedDict, cast, overload
from uuid import UUID, uuid4

from typing_extensions import Unpack

from .. import sql, tracing
from ..db.adapters import AnyConnection, SomeAsyncConnection, SomeSyncConnection, run
from ..db.calls import Call, Row
from ..errors import JobNotFoundError, NoResultError, OptionsError
from ..options import Duration, to_seconds
from .arguments import MAX_ARGS_DEPTH, storable_problem, to_json

__all__ = [
    "EARLIEST_RUN_AT",
    "LATEST_RUN_AT",
    "MAX_ARGS_DEPTH",
    "MAX_NAME_CHARS",
    "MAX_UNIQUE_KEY_CHARS",
    "Counts",
    "Duplicate",
    "JobInfo",
    "JobOptions",
    "JobState",
    "NewJob",
    "check_name",
    "counts_on",
    "enqueue_all_on",
    "enqueue_on",
    "job_id_of",
    "job_on",
    "jobs_on",
]

SMALLINT = (-32768, 32767)
"""The range of a job's priority, a PostgreSQL smallint."""

MAX_NAME_CHARS = 200
"""The longest job name, in characters (as for a schedule's): room for any dotted path,
and far below what the name's index can hold."""

MAX_UNIQUE_KEY_CHARS = 200
"""The longest unique key, in characters (`NewJob.unique_key`)."""

EARLIEST_RUN_AT = datetime(1970, 1, 1, tzinfo=timezone.utc)
"""The earliest `run_at` taken (an earlier time would run at once all the same)."""

LATEST_RUN_AT = datetime(9000, 1, 1, tzinfo=timezone.utc)
"""The first `run_at` refused: far enough from year 9999 that any session time zone,
and any delay the queue adds, still reads back as a Python `datetime`."""


def _text_problem(value: object, limit: int) -> str | None:
    """Why `value` cannot be stored as a name or a key (1 to `limit` characters, not
    blank, no NUL character or lone surrogate), or `None` when it can."""
    if not isinstance(value, str):
        return f"it is a {type(value).__name__}, not a string"
    if not value.strip():
        return "it is empty or blank"
    if len(value) > limit:
        return f"it is {len(value)} characters long"
    held = storable_problem(value)
    return None if held is None else f"it holds {held}"


def check_name(name: object, what: str = "job", limit: int = MAX_NAME_CHARS) -> str:
    """`name` when PostgreSQL can store it as a name: 1 to `limit` characters, not
    blank, with no NUL character or lone surrogate; else an `OptionsError` saying why."""
    problem = _text_problem(name, limit)
    if problem is None:
        return cast("str", name)  # a str: _text_problem said so
    shown = repr(name) if not isinstance(name, str) or len(name) <= 40 else f"{name[:40]!r}..."
    raise OptionsError(
        f"the {what} name {shown} cannot be used: {problem} (a {what} name is 1 to "
        f"{limit} characters, not blank, with no NUL character or lone surrogate)"
    )


def check_unique_key(key: object, job: str) -> str:
    """`key` when it can be a unique key: a string of 1 to `MAX_UNIQUE_KEY_CHARS`
    characters, not blank, with no NUL character or lone surrogate; else an
    `OptionsError` naming the job and saying why (never the key: it may name a customer)."""
    problem = _text_problem(key, MAX_UNIQUE_KEY_CHARS)
    if problem is None:
        return cast("str", key)  # a str: _text_problem said so
    raise OptionsError(
        f"the unique_key of job {job!r} cannot be used: {problem} (a unique key is 1 to "
        f"{MAX_UNIQUE_KEY_CHARS} characters, not blank, with no NUL character or lone surrogate)"
    )


class Duplicate(UUID):
    """What queuing a job returns when its unique key was taken: the id of the job that
    holds the key (queued, running, in review, or finished within its `unique_for`).
    Nothing was queued.

    It is a `UUID`, equal to the holder's id, so code that only wants an id to wait on
    or show needs no change; `isinstance(job_id, Duplicate)` tells which happened, with
    no second query. A job queued is returned as a plain `UUID`."""

    __slots__ = ()


def job_id_of(value: object) -> UUID:
    """`value` as a job id: a `UUID`, or its text. Anything else raises an `OptionsError`
    naming it, before anything is sent (a malformed id would abort the caller's
    transaction on the server)."""
    if isinstance(value, UUID):
        return value
    if isinstance(value, str):
        try:
            return UUID(value)
        except ValueError:
            pass
    shown = repr(value) if len(repr(value)) <= 60 else f"{repr(value)[:60]}..."
    raise OptionsError(
        f"expected a job id (a UUID, or its text like 0191f3c2-...), got: {shown}; nothing was sent"
    )


LATEST = datetime.max.replace(tzinfo=timezone.utc)
"""How a time after what Python's `datetime` holds (past year 9999, or `infinity`) is read."""
EARLIEST = datetime.min.replace(tzinfo=timezone.utc)
"""How a time before what Python's `datetime` holds (before year 1, or `-infinity`) is read."""

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_LATEST_MICROS = (LATEST - _EPOCH) // timedelta(microseconds=1)
_EARLIEST_MICROS = (EARLIEST - _EPOCH) // timedelta(microseconds=1)


def optional_moment(epoch: Decimal | float | None) -> datetime | None:
    """A time read as epoch seconds (how every read statement selects a `timestamptz`),
    as a UTC datetime; `None` stays `None`.

    PostgreSQL holds times Python's `datetime` cannot (past year 9999, before year 1,
    `infinity`), which rows written by the Rust crate or by hand may have; reading one
    directly would fail the whole statement, for every row it returns. Such a time is
    read as `LATEST` or `EARLIEST` (`datetime.max` or `datetime.min`, in UTC) instead.
    """
    if epoch is None:
        return None
    if isinstance(epoch, float):
        epoch = Decimal(repr(epoch)) if epoch == epoch else Decimal("NaN")
    if epoch.is_nan():
        return None
    if epoch.is_infinite():
        return LATEST if epoch > 0 else EARLIEST
    micros = int((epoch * 1_000_000).to_integral_value())
    if micros >= _LATEST_MICROS:
        return LATEST
    if micros <= _EARLIEST_MICROS:
        return EARLIEST
    return _EPOCH + timedelta(microseconds=micros)


def moment(epoch: Decimal | float | None) -> datetime:
    """`optional_moment` of a NOT NULL column."""
    found = optional_moment(epoch)
    return LATEST if found is None else found


class JobState(str, enum.Enum):
    """Where a job is. The values are the status strings in the `status` column."""

    QUEUED = "queued"
    """Waiting to be claimed, now or at its time."""
    RUNNING = "running"
    """Claimed by a job loop."""
    COMPLETED = "completed"
    """Finished."""
    FAILED = "failed"
    """Out of tries, or given up on."""
    CANCELLED = "cancelled"
    """Cancelled before it ran."""
    NEEDS_REVIEW = "needs_review"
    """Its run lost its claim and was stopped, so it may have run in part or twice.
    It is never retried by itself: a person looks, and calls `retry` to release it."""

    def __str__(self) -> str:
        return self.value


class _EmptyArgs:
    """`NewJob`'s default `args`: a new empty dict for each job."""

    def __repr__(self) -> str:
        return "{}"


_EMPTY_ARGS: Any = _EmptyArgs()

_CHECKED_NAMES: set[str] = set()
"""Job names `check_name` took already, so a batch of jobs of one name checks it once.
Emptied when it grows past `_CHECKED_NAMES_MAX`."""
_CHECKED_NAMES_MAX = 4096


@dataclass(frozen=True, init=False)
class NewJob:
    """A job to queue: the handler it is for, its arguments, and when and how it runs.

    `args` is any JSON value, or a dataclass instance (queued as its fields) or a
    pydantic model (as its `model_dump(mode="json")`), at the top or inside (see
    `arguments`); arguments that cannot be stored raise `ArgumentsError` here, before
    any SQL. They are encoded here, once: changing a mutable `args` later is not seen.
    They are never shown by `repr`. The name is 1 to `MAX_NAME_CHARS` characters.
    `run_in` (a delay on the database's clock, at most 100 years) and `run_at` (a
    timezone-aware time from `EARLIEST_RUN_AT` to before `LATEST_RUN_AT`) are
    exclusive. `max_attempts`, `timeout` and `priority` left as `None` take the
    handler's defaults when the queue that queues the job has its handler (see
    `policies`); else `max_attempts` and `timeout` stay NULL on the row, so each
    worker applies its handler's or its own default, as the crate does, and the
    priority is 0.

    `unique_key` (1 to `MAX_UNIQUE_KEY_CHARS` characters) makes the job unique: while
    another job with that key is queued, running or in review, queuing this one writes
    nothing and returns the holder's id as a `Duplicate`. With `unique_for`, the key
    stays taken that long after the job finished, whatever its ending ("at most once
    an hour"). The key is shown (`JobInfo`, the CLI, the dashboard): put an id in it,
    never a secret. See docs/jobs.md.
    """

    name: str
    args: Any = field(default_factory=dict, repr=False)
    priority: int | None = None
    run_in: Duration | None = None
    run_at: datetime | None = None
    max_attempts: int | None = None
    timeout: Duration | None = None
    unique_key: str | None = None
    unique_for: Duration | None = None
    _args_json: str = field(default="", init=False, repr=False, compare=False)
    """The arguments as JSON, made once when the job is made: what is checked is what
    is stored, and a job queued by a schedule at every tick is encoded once."""

    def __init__(
        self,
        name: str,
        args: Any = _EMPTY_ARGS,
        priority: int | None = None,
        run_in: Duration | None = None,
        run_at: datetime | None = None,
        max_attempts: int | None = None,
        timeout: Duration | None = None,
        unique_key: str | None = None,
        unique_for: Duration | None = None,
    ) -> None:
        # What dataclass's __init__ does for these fields, at a third of the cost of its
        # object.__setattr__ per field (a frozen class's): bulk enqueues make thousands.
        self.__dict__.update(
            name=name,
            args={} if args is _EMPTY_ARGS else args,
            priority=priority,
            run_in=run_in,
            run_at=run_at,
            max_attempts=max_attempts,
            timeout=timeout,
            unique_key=unique_key,
            unique_for=unique_for,
            _args_json="",
        )
        self.__post_init__()

    def __post_init__(self) -> None:
        name = self.name
        if type(name) is not str or name not in _CHECKED_NAMES:
            check_name(name)
            if type(name) is str:
                if len(_CHECKED_NAMES) >= _CHECKED_NAMES_MAX:
                    _CHECKED_NAMES.clear()
                _CHECKED_NAMES.add(name)
        if not (
            self.priority is None
            and self.max_attempts is None
            and self.run_in is None
            and self.run_at is None
            and self.timeout is None
            and self.unique_key is None
            and self.unique_for is None
        ):
            self._check_options()
        # Refuses what cannot be stored, before any SQL; later changes to a mutable
        # `args` are not seen: a NewJob is a value.
        object.__setattr__(self, "_args_json", to_json(self.args, name))

    def _check_options(self) -> None:
        """Raise `OptionsError` for the first option that cannot be used."""
        if self.priority is not None and (
            not isinstance(self.priority, int)
            or isinstance(self.priority, bool)
            or not SMALLINT[0] <= self.priority <= SMALLINT[1]
        ):
            raise OptionsError(
                f"expected priority of job {self.name!r} to be an integer from "
                f"{SMALLINT[0]} to {SMALLINT[1]}, got: {self.priority!r}"
            )
        if self.max_attempts is not None and (
            not isinstance(self.max_attempts, int)
            or isinstance(self.max_attempts, bool)
            or not 1 <= self.max_attempts <= 2**31 - 1
        ):
            raise OptionsError(
                f"expected max_attempts of job {self.name!r} to be a positive integer, "
                f"got: {self.max_attempts!r}"
            )
        if self.run_in is not None and self.run_at is not None:
            raise OptionsError(f"job {self.name!r} was given both run_in and run_at: give one")
        if self.run_in is not None:
            to_seconds(self.run_in, "run_in")
        if self.run_at is not None and (
            not isinstance(self.run_at, datetime) or self.run_at.utcoffset() is None
        ):
            raise OptionsError(
                f"expected run_at of job {self.name!r} to be a timezone-aware datetime, "
                f"got: {self.run_at!r}"
            )
        if self.run_at is not None and not EARLIEST_RUN_AT <= self.run_at < LATEST_RUN_AT:
            raise OptionsError(
                f"expected run_at of job {self.name!r} to be from "
                f"{EARLIEST_RUN_AT.isoformat()} to before {LATEST_RUN_AT.isoformat()}, "
                f"got: {self.run_at.isoformat()}"
            )
        if self.timeout is not None and to_seconds(self.timeout, "timeout") <= 0:
            raise OptionsError(
                f"expected timeout of job {self.name!r} to be more than zero, got: {self.timeout!r}"
            )
        if self.unique_key is not None:
            check_unique_key(self.unique_key, self.name)
        if self.unique_for is not None:
            if self.unique_key is None:
                raise OptionsError(
                    f"job {self.name!r} was given unique_for without a unique_key: give both"
                )
            if to_seconds(self.unique_for, "unique_for") <= 0:
                raise OptionsError(
                    f"expected unique_for of job {self.name!r} to be more than zero, "
                    f"got: {self.unique_for!r}"
                )

    def encoded_args(self) -> str:
        """The arguments as JSON text, as the `args` column will hold them, encoded (and
        checked: `ArgumentsError` naming the job and the problem, never a value) when
        the job was made."""
        return self._args_json

    def priority_value(self) -> int:
        """The priority stored: the job's, else 0."""
        return 0 if self.priority is None else self.priority

    def delay_seconds(self) -> float:
        """Seconds from now to the first run (zero unless `run_in` was given)."""
        return 0.0 if self.run_in is None else to_seconds(self.run_in, "run_in")

    def timeout_ms(self) -> int | None:
        """The time limit in milliseconds, as the `timeout_ms` column holds it."""
        if self.timeout is None:
            return None
        return max(1, round(to_seconds(self.timeout, "timeout") * 1000))

    def unique_for_ms(self) -> int | None:
        """How long the key stays taken after the job finished, in milliseconds, as
        the `unique_for_ms` column holds it."""
        if self.unique_for is None:
            return None
        return max(1, round(to_seconds(self.unique_for, "unique_for") * 1000))


@dataclass(frozen=True)
class JobInfo:
    """What the queue knows of one job. Its arguments are left out.

    `error` is whatever the job's failure said: it is for operators, not for clients.
    Times are in UTC. A time Python cannot hold (past year 9999, before year 1, or
    PostgreSQL's `infinity`, which rows written by other clients may have) is read as
    `datetime.max` or `datetime.min` in UTC, so one such row never breaks a read.
    """

    id: UUID
    name: str
    state: JobState
    attempts: int
    max_attempts: int | None
    priority: int
    error: str | None
    timeout: timedelta | None
    run_at: datetime
    started_at: datetime | None
    created_at: datetime
    updated_at: datetime
    unique_key: str | None = None
    """Its unique key, or `None`: while it holds it, no other job with it is queued."""
    unique_for: timedelta | None = None
    """How long its key stays taken after it finished, or `None`."""
    given_back: int = 0
    """How many of its attempts were given back, their handler never started: runs
    claimed ahead (`QueueOptions.prefetch`) by a process that died or stopped before it
    started them. Each also raised `max_attempts` by one."""


@dataclass(frozen=True)
class Counts:
    """How many jobs are in each state, and how long the oldest ready job has waited."""

    ready: int = 0
    """Queued and due."""
    waiting: int = 0
    """Queued for a later time."""
    running: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    needs_review: int = 0
    """Stopped after losing their claim, waiting for a person; never purged."""
    oldest_ready_seconds: float = 0.0
    """Seconds the oldest ready job has waited, or zero. Rising means nothing runs them."""


class JobOptions(TypedDict, total=False):
    """How and when a job runs, as keyword arguments to `enqueue` and `perform_later`;
    the same fields as `NewJob` has."""

    priority: int | None
    run_in: Duration | None
    run_at: datetime | None
    max_attempts: int | None
    timeout: Duration | None
    unique_key: str | None
    unique_for: Duration | None


def as_new_job(job: str | NewJob, args: Any = None, **options: Unpack[JobOptions]) -> NewJob:
    """`job` itself when it is a `NewJob`, else a `NewJob` of that name with these
    arguments and options (what `enqueue` takes)."""
    if isinstance(job, NewJob):
        if args is not None or options:
            raise OptionsError(
                "give either a NewJob or a name with arguments and options, not both"
            )
        return job
    return NewJob(job, {} if args is None else args, **options)


def enqueue_call(job: NewJob, now: datetime | None = None) -> Call[UUID]:
    """The call that queues one job; the id is made here, so it is known before it runs.
    A delay counts from `now` (default: the database's clock). A job with a unique key
    is not queued by this call: see `enqueue_unique_call`."""
    job_id = uuid4()
    sending = None if tracing.sender is None else tracing.sender((job.name,), (job_id,))
    return Call(
        sql.ENQUEUE,
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


def _columns(jobs: Sequence[NewJob]) -> dict[str, list[Any]]:
    """The columns of `sql.ENQUEUE_MANY` and `sql.ENQUEUE_UNIQUE` other than the ids,
    one array per column, the jobs in order."""
    return {
        "name": [job.name for job in jobs],
        "args": [job.encoded_args() for job in jobs],
        "max_attempts": [job.max_attempts for job in jobs],
        "priority": [job.priority_value() for job in jobs],
        "at": [job.run_at for job in jobs],
        "delay": [job.delay_seconds() for job in jobs],
        "timeout_ms": [job.timeout_ms() for job in jobs],
    }


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

    def insert(finished: Callable[[BaseException | None], None] | None = None) -> Call[list[UUID]]:
        return Call(
            sql.ENQUEUE_MANY,
            {"id": made([], 0), **_columns(jobs), "now": now, "trace_context": carrier},
            made,
            finished,
        )

    if by_copy:
        return Call(
            sql.ENQUEUE_COPY,
            (),
            made,
            finished,
            copy_rows=_CopyRows(jobs, ids, carrier),
            copy_types=COPY_TYPES,
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
            **_columns(jobs),
            "unique_key": keys,
            "unique_for_ms": [job.unique_for_ms() for job in jobs],
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
            "now": now,
            "trace_context": carrier,
        },
        read,
        None if sending is None else sending.end,
    )
    return call, carrier


def enqueue_unique_one_on(
    conn: AnyConnection, job: NewJob, now: datetime | None = None
) -> UUID | Awaitable[UUID]:
    """Queue `job`, which has a unique key, on `conn` with `sql.ENQUEUE_UNIQUE_ONE`: its
    id, or its holder's as a `Duplicate` (an awaitable of it on an async connection).
    Sent again only when the holder committed after the statement's snapshot."""
    job_id = uuid4()
    call, carrier = enqueue_unique_one_call(job, job_id, now)
    answer = run(conn, call)
    if inspect.isawaitable(answer):
        return _settle_one(conn, job, job_id, now, carrier, answer)
    while answer is None:
        call, _ = enqueue_unique_one_call(job, job_id, now, False, carrier)
        answer = run(conn, call)
    return cast("UUID", answer)


async def _settle_one(
    conn: AnyConnection,
    job: NewJob,
    job_id: UUID,
    now: datetime | None,
    carrier: Any,
    first: Awaitable[UUID | None],
) -> UUID:
    answer = await first
    while answer is None:
        call, _ = enqueue_unique_one_call(job, job_id, now, False, carrier)
        answer = await cast("Awaitable[UUID | None]", run(conn, call))
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


def enqueue_unique_on(
    conn: AnyConnection, jobs: Sequence[NewJob], now: datetime | None = None
) -> list[UUID] | Awaitable[list[UUID]]:
    """Queue `jobs` (some with a unique key) on `conn` (`UniqueEnqueue`): their ids in
    order, or an awaitable of them on an async connection. A single keyed job takes
    the one-row statement (`enqueue_unique_one_on`)."""
    if len(jobs) == 1 and jobs[0].unique_key is not None:
        one = enqueue_unique_one_on(conn, jobs[0], now)
        if inspect.isawaitable(one):
            return _listed(one)
        return [one]
    batch = UniqueEnqueue(jobs, now)
    call = batch.call()
    if call is None:
        return []
    answers = run(conn, call)
    if inspect.isawaitable(answers):
        return _settle(conn, batch, answers)
    while True:
        batch.take(answers)  # type: ignore[arg-type]
        call = batch.call()
        if call is None:
            return batch.result()
        answers = run(conn, call)


async def _listed(one: Awaitable[UUID]) -> list[UUID]:
    return [await one]


async def _settle(
    conn: AnyConnection, batch: UniqueEnqueue, first: Awaitable[Answers]
) -> list[UUID]:
    answers = await first
    while True:
        batch.take(answers)
        call = batch.call()
        if call is None:
            return batch.result()
        answers = await cast("Awaitable[Answers]", run(conn, call))


def has_unique(jobs: Iterable[NewJob]) -> bool:
    """Whether any of `jobs` has a unique key (then `enqueue_unique_on` queues them)."""
    return any(job.unique_key is not None for job in jobs)


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
    )


def job_call(job_id: UUID) -> Call[JobInfo | None]:
    """The call that reads one job."""
    job_id = job_id_of(job_id)
    return Call(sql.JOB, (job_id,), lambda rows, _n: job_info(rows[0]) if rows else None)


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
    return Call(sql.RESULT, (job_id,), lambda rows, _n: _result_of(job_id, rows))


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
def enqueue_on(conn: SomeAsyncConnection, job: NewJob) -> Awaitable[UUID]: ...
@overload
def enqueue_on(conn: SomeSyncConnection, job: NewJob) -> UUID: ...
def enqueue_on(conn: AnyConnection, job: NewJob) -> UUID | Awaitable[UUID]:
    """Queue `job` on the caller's connection and return its id (awaitable when async).

    In the caller's transaction the job commits or rolls back with it; on an
    autocommit connection it is queued at once. One statement, one round trip. A job
    whose unique key is taken writes nothing and returns the holder's id as a
    `Duplicate`."""
    if job.unique_key is not None:
        return enqueue_unique_one_on(conn, job)
    return run(conn, enqueue_call(job))


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
    batch = list(jobs)
    if has_unique(batch):
        return enqueue_unique_on(conn, batch)
    return run(conn, enqueue_many_call(batch, copy=True))


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
