"""Jobs: what a new job is (`NewJob`), what the queue tells of one (`JobInfo`,
`JobState`, `Counts`), and the checks of what a job is given.

Queuing is `enqueue`; reading jobs back is `reads`. Nothing here ever shows a job's
arguments: not `repr`, not `JobInfo`, not an error message.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, TypedDict
from uuid import UUID

from typing_extensions import Unpack

from ..errors import OptionsError
from ..options import Duration, to_seconds
from .arguments import MAX_ARGS_DEPTH, storable_problem, to_json
from .dependencies import check_after
from .ids import Duplicate as Duplicate
from .ids import job_id_of as job_id_of
from .keys import key_ok
from .moments import EARLIEST, LATEST, moment, optional_moment
from .steps import Step

__all__ = [
    "EARLIEST",
    "EARLIEST_RUN_AT",
    "LATEST",
    "LATEST_RUN_AT",
    "MAX_ARGS_DEPTH",
    "MAX_NAME_CHARS",
    "MAX_UNIQUE_KEY_CHARS",
    "Attempt",
    "Counts",
    "Duplicate",
    "JobInfo",
    "JobOptions",
    "JobState",
    "NewJob",
    "as_new_job",
    "check_name",
    "columns_of",
    "job_id_of",
    "moment",
    "optional_moment",
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
    if problem is None and isinstance(name, str):  # no problem: a str
        return name
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
    if problem is None and isinstance(key, str):  # no problem: a str
        return key
    raise OptionsError(
        f"the unique_key of job {job!r} cannot be used: {problem} (a unique key is 1 to "
        f"{MAX_UNIQUE_KEY_CHARS} characters, not blank, with no NUL character or lone surrogate)"
    )


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
    BLOCKED = "blocked"
    """Waiting for the jobs it depends on (`NewJob.after`, `chain`...); queued once
    they all completed, never claimed before."""

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
    never a secret. See docs/jobs.md. `key` (1 to 200 printable characters, `keys`)
    says who the job is for: a name claimed by key takes its keys' jobs in turn
    (`Queue.limit_per_key`, docs/handlers.md).
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
    after: tuple[UUID, ...] = ()
    on_parent_failure: str = "cancel"
    key: str | None = field(default=None, repr=False)
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
        after: Iterable[UUID | str] = (),
        on_parent_failure: str = "cancel",
        key: str | None = None,
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
            after=after or (),
            on_parent_failure=on_parent_failure,
            key=key,
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
            and not self.after
            and self.on_parent_failure == "cancel"
            and key_ok(self.key, name)
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
        if self.after or self.on_parent_failure != "cancel":
            object.__setattr__(
                self,
                "after",
                check_after(self.name, self.after, self.on_parent_failure, self.unique_key),
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
class Attempt:
    """One run of a job (`axa_queue_attempts`): when it started and ended, how, and the
    worker process that ran it. Never its arguments. Times are in UTC."""

    attempt: int
    """Its number: the job's `attempts` when it was claimed."""
    outcome: str | None
    """How it ended: `completed`, `failed`, `retried` (queued again), `snoozed`, `slept`,
    `cancelled` (by a person), `lost` (its claim was gone), `abandoned` (its process
    went silent: stale recovery), `given back` (claimed ahead, never started); `None`
    while it runs."""
    started_at: datetime | None
    """When it was claimed (`None`: unknown, a run from before its row was kept)."""
    ended_at: datetime | None
    """When its ending was written; `None` while it runs."""
    error_class: str | None = None
    """The class of what its handler raised (`ValueError`), when it failed so."""
    error: str | None = None
    """What its failure said (at most 2,000 characters), or why it was lost."""
    worker: UUID | None = None
    """The process that ran it: its id in `axa_workers` (`axa-queue workers`)."""
    host: str | None = None
    pid: int | None = None
    derived: bool = False
    """Read from its job's row, no row of its own kept: a run the Rust crate made (or
    one from before attempts were kept), with what that row says (no worker)."""

    @property
    def duration(self) -> timedelta | None:
        """How long it ran, from its claim to its ending; `None` while it runs or
        when its start is unknown."""
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at


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
    attempt: int
    """The number of its latest run (as `JobContext.attempt` numbers a run), so how many
    runs it has had: 0 until it is first claimed. Each claim adds one, a run given back
    (`given_back`) included."""
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
    attempts: tuple[Attempt, ...] = ()
    """Its runs, oldest first, each an `Attempt` (read by `job`; lists leave it
    empty). `attempt` is how many it has had."""
    worker_gone: bool = False
    """Running, and the worker process that claimed its current run is gone (not heard
    from for 3 of its heartbeat intervals, or its row in `axa_workers` removed): shown
    as "worker gone" until stale recovery decides the run (one claimed ahead and never
    started is queued again at once, its attempt given back). Read when the job is read;
    `False` for any job not running."""
    steps: tuple[Step, ...] = ()
    """The durable steps it recorded (`JobContext.step`), in the order recorded: name,
    attempt, start and when recorded, never their results (read by `job`; lists leave
    it empty)."""


@dataclass(frozen=True)
class Counts:
    """How many jobs are in each state, and how long the oldest ready job has waited;
    `estimated` names the numbers that are estimates (states of more than 10,000 jobs)."""

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
    blocked: int = 0
    """Waiting for the jobs they depend on (not counted in `waiting`)."""
    oldest_ready_seconds: float = 0.0
    """Seconds the oldest ready job has waited, or zero. Rising means nothing runs them."""
    estimated: tuple[str, ...] = ()
    """The fields above that are the planner's estimates, not counts, in field order: a
    state holding more than `jobs.reads.EXACT_UP_TO` jobs (10,000) is not counted, which
    would read every one of them, but estimated from the tables' statistics (and, for
    one name's counts, that name's share of the rows read). Empty: every number is
    exact."""


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
    after: Iterable[UUID | str]
    on_parent_failure: str
    key: str | None


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


def columns_of(jobs: Sequence[NewJob]) -> dict[str, list[Any]]:
    """The jobs' columns as the enqueue statements of arrays take them
    (`sql.ENQUEUE_MANY`, `sql.ENQUEUE_UNIQUE`, `sql.ENQUEUE_LINKED`), one array per
    column, the jobs in order: every column but the ids and what a statement adds."""
    return {
        "name": [job.name for job in jobs],
        "args": [job.encoded_args() for job in jobs],
        "max_attempts": [job.max_attempts for job in jobs],
        "priority": [job.priority_value() for job in jobs],
        "at": [job.run_at for job in jobs],
        "delay": [job.delay_seconds() for job in jobs],
        "timeout_ms": [job.timeout_ms() for job in jobs],
    }
