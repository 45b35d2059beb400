"""QueueOptions: how a queue runs, checked when it is made.

Durations take a `timedelta` or a number of seconds and are kept as `timedelta`: each
duration option is a `DurationOption` (an optional one an `OptionalDurationOption`),
which converts and checks what it is given and reads back typed, so mypy knows
`options.stale_after` is a `timedelta` (a misspelt option fails in mypy, not at run
time). A value that makes no sense is refused at construction with an `OptionsError`
naming the option and the value, so a typo fails at import time, not at 3 a.m.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, Union, get_args, overload

from .db import dsns
from .errors import OptionsError

__all__ = [
    "DSN_VARIABLES",
    "MAX_DURATION",
    "MAX_INTEGER",
    "MODE_VARIABLE",
    "POOLER_VARIABLE",
    "SCHEMA_VARIABLE",
    "Duration",
    "DurationOption",
    "Mode",
    "OptionalDurationOption",
    "Pooler",
    "QueueOptions",
    "UnknownNames",
    "dsn_from_environment",
    "to_seconds",
    "to_timedelta",
]

Duration = Union[timedelta, float, int]  # noqa: UP007 - a runtime alias on Python 3.10
"""A length of time: a `timedelta`, or a number of seconds."""

Mode = Literal["queue", "inline", "background"]
"""What queuing a job (`enqueue`, `enqueue_all`, `perform_later`) does: store a row, run
it now in the caller, or run it in the background here (see `modes`)."""

MODE_VARIABLE = "AXA_QUEUE_MODE"
"""The environment variable that picks the mode when `QueueOptions.mode` is not set."""

_MODES: tuple[str, ...] = get_args(Mode)

Pooler = Literal["direct", "session", "transaction"]
"""What stands between the queue and PostgreSQL: nothing (`direct`), or a connection
pooler such as PgBouncer in `session` or in `transaction` mode."""

POOLER_VARIABLE = "AXA_QUEUE_POOLER"
"""The environment variable that says the pooler when `QueueOptions.pooler` is not set."""

_POOLERS: tuple[str, ...] = get_args(Pooler)

UnknownNames = Literal["accept", "refuse"]
"""What `enqueue` does with a job name the queue has no handler for: queue it (another
process may handle it), or refuse it with an `OptionsError`."""

_UNKNOWN_NAMES: tuple[str, ...] = get_args(UnknownNames)

SCHEMA_VARIABLE = "AXA_QUEUE_SCHEMA"
"""The environment variable that names the schema when `QueueOptions.schema` is not set."""

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

DSN_VARIABLES = ("AXA_QUEUE_DSN", "DATABASE_URL")
"""Environment variables read, in order, when no DSN is given."""


def dsn_from_environment() -> str | None:
    """The DSN the environment gives (`AXA_QUEUE_DSN`, then `DATABASE_URL`), if any, as
    libpq reads it (`dsns.normalized`: a SQLAlchemy `postgresql+asyncpg://` URL is read
    as `postgresql://`; an `OptionsError` names the variable of one it cannot read)."""
    name = next((v for v in DSN_VARIABLES if os.environ.get(v)), None)
    return None if name is None else dsns.normalized(os.environ[name], name)


MAX_DURATION = timedelta(days=36525)
"""The longest duration any option takes: 100 years. Past it, a time counted from now
leaves what PostgreSQL and Python can both read back (or overflows on the way), and
nobody means it: it is a typo, or a stand-in for "never"."""


MAX_INTEGER = 2**31 - 1
"""The largest count any option takes (attempts, loops, limits): PostgreSQL's
`integer`, which the columns and statements that hold them use. Past it, a value
cannot be stored, and a statement that carried it would fail for every job it
carries."""


def to_timedelta(value: Duration, name: str = "duration") -> timedelta:
    """`value` as a `timedelta`, refusing what is not a finite, non-negative length of
    at most `MAX_DURATION`, with an `OptionsError` naming the option and the bound."""
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise OptionsError(f"expected {name} to be a finite number of seconds, got: {value!r}")
        if abs(value) > MAX_DURATION.total_seconds():  # before timedelta() can overflow
            raise OptionsError(_too_long(name, value))
        result = timedelta(seconds=value)
    else:
        raise OptionsError(
            f"expected {name} to be a timedelta or a number of seconds, got: {value!r}"
        )
    if result < timedelta(0):
        raise OptionsError(f"expected {name} to be zero or more, got: {value!r}")
    if result > MAX_DURATION:
        raise OptionsError(_too_long(name, value))
    return result


def _too_long(name: str, value: Duration) -> str:
    return (
        f"expected {name} to be at most 100 years ({MAX_DURATION.days} days, "
        f"{MAX_DURATION.total_seconds():.0f} seconds), got: {value!r}"
    )


def to_seconds(value: Duration, name: str = "duration") -> float:
    """`value` as seconds, refusing what is not a finite, non-negative length of at
    most `MAX_DURATION`."""
    return to_timedelta(value, name).total_seconds()


class DurationOption:
    """A duration option of `QueueOptions`: given a `timedelta` or a number of seconds
    (checked by `to_timedelta`, the error naming the option), kept and read back as a
    `timedelta`. Read on the class, it is the default."""

    def __init__(self, default: Duration) -> None:
        self.name = "duration"
        self.default = to_timedelta(default)

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type[Any] | None = None) -> timedelta: ...
    @overload
    def __get__(self, instance: object, owner: type[Any] | None = None) -> timedelta: ...
    def __get__(self, instance: object | None, owner: type[Any] | None = None) -> timedelta:
        if instance is None:
            return self.default
        value: timedelta = instance.__dict__[self.name]
        return value

    def __set__(self, instance: object, value: Duration) -> None:
        # Only the dataclass's `__init__` gets here: a frozen instance refuses any later set.
        instance.__dict__[self.name] = to_timedelta(value, self.name)


class OptionalDurationOption:
    """A duration option of `QueueOptions` that may be `None` (no bound): else given
    and read back as `DurationOption` does. Its default is `None`."""

    def __init__(self) -> None:
        self.name = "duration"

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type[Any] | None = None) -> None: ...
    @overload
    def __get__(self, instance: object, owner: type[Any] | None = None) -> timedelta | None: ...
    def __get__(self, instance: object | None, owner: type[Any] | None = None) -> timedelta | None:
        if instance is None:
            return None
        value: timedelta | None = instance.__dict__[self.name]
        return value

    def __set__(self, instance: object, value: Duration | None) -> None:
        instance.__dict__[self.name] = None if value is None else to_timedelta(value, self.name)


@dataclass(frozen=True)
class QueueOptions:
    """How a queue runs. The defaults are the reference crate's.

    Every duration takes a `timedelta` or seconds, and reads back as a `timedelta`
    (typed so: `options.stale_after.total_seconds()`). docs/configuration.md describes
    every option with its default.
    """

    workers: int = 2
    """Job loops: the most jobs this process runs at once."""
    poll_interval: DurationOption = DurationOption(timedelta(seconds=1))
    """Longest wait before looking for work again, and between schedule ticks.
    With notifications on, new jobs start sooner than this."""
    heartbeat_interval: DurationOption = DurationOption(timedelta(minutes=1))
    """How often running jobs report in (one statement for all of this process's jobs)."""
    stale_after: DurationOption = DurationOption(timedelta(minutes=60))
    """A running job not heard from for this long is taken for lost with its worker."""
    max_attempts: int = 1
    """Tries a job gets, including the first, unless it was queued with its own limit.
    The default, 1, means no retries: a job that raises once is failed."""
    retry_backoff: DurationOption = DurationOption(timedelta(seconds=30))
    """The wait before the first retry; each later one waits twice as long, up to an hour."""
    retention: DurationOption = DurationOption(timedelta(days=7))
    """How long completed, failed and cancelled rows are kept (in the history, by whole
    UTC days: a moved job is kept from `retention` to `retention` and a day)."""
    keep_recent: DurationOption = DurationOption(timedelta(minutes=1))
    """How long a finished job stays in `axa_queue` before housekeeping moves it to the
    history table (`axa_queue_history`), where every read still finds it; a job whose
    unique key is held (`unique_for`) stays until its time passes. Short, so the hot
    table holds live work and the last minute or so of endings (docs/configuration.md)."""
    maintenance_interval: DurationOption = DurationOption(timedelta(minutes=5))
    """How often to recover stale jobs, purge old rows and archive unused schedules."""
    prefetch: int | Literal["auto"] = "auto"
    """Jobs claimed ahead of the loops, so a loop coming free starts its next job without
    waiting for the database: more jobs per statement, more throughput for short jobs.
    They count as `running` (and report in) while they wait, and a stop runs them. Their
    handler not started, a crash (stale recovery) or a stop past its grace gives their
    attempt back (docs/design.md, Runs claimed ahead). `"auto"` lets each name have
    waiting what the loops would start within 50 ms at the pace its runs take here, at
    most 200, counting only the loops not held by a long run (or one of a name not
    timed yet): many for short jobs, none for long or new ones, which one busy process
    would otherwise hold while another is idle (a name may have one waiting while
    others do, so it is not left behind them). A number claims that many ahead
    whatever runs take; `0` turns it off."""
    mode: Mode | None = None
    """What queuing a job on the queue's own connection does (`enqueue`, `enqueue_all`,
    `perform_later`, of `Queue` and `SyncQueue`; see `modes`); `None` reads
    `AXA_QUEUE_MODE`, else `"queue"`. `enqueue_on` always stores its job."""
    listen: bool = True
    """Wake on LISTEN/NOTIFY as well as polling. Behind a transaction pooler, which
    cannot carry LISTEN, workers only poll (`pooler="transaction"` says so once)."""
    prepare: bool | None = None
    """Use server-side prepared statements; `None` for yes, unless `pooler` is
    `"transaction"`. Give `True` there only with PgBouncer 1.21 or later and its
    `max_prepared_statements` set (older ones mix them up between clients)."""
    pool_size: int | None = None
    """Connections in the queue's pool; `None` for `workers + 4`, at least 6."""
    shutdown_grace: OptionalDurationOption = OptionalDurationOption()
    """On stop, how long to wait for jobs in progress before aborting them (they are
    then left for stale recovery), and for sync handlers whose run was stopped
    (cancelled, timed out) to return from their threads; `None` waits for as long as
    they take."""
    pooler: Pooler | None = None
    """What is between the queue and PostgreSQL: `"direct"` (nothing), `"session"` (a
    pooler such as PgBouncer in session mode) or `"transaction"` (one in transaction
    mode); `None` reads `AXA_QUEUE_POOLER`, else `"direct"`. `"transaction"` turns off
    what a transaction pooler cannot carry: prepared statements, LISTEN (workers poll
    every `poll_interval`; a warning says so once when `listen` is on) and the session
    settings; see docs/production.md."""
    schema: str | None = None
    """The schema of the queue's tables: every statement the queue sends names it, so
    it works behind any pooler (which refuses `options=-c search_path=...`). A plain
    lowercase name (letters, digits, `_`; at most 63). `None` reads `AXA_QUEUE_SCHEMA`,
    else the connection's `search_path` decides. Statements sent on your own
    connection (`enqueue_on`, `cancel`, ...) still follow its `search_path`."""
    setup_lock_timeout: DurationOption = DurationOption(timedelta(seconds=5))
    """How long setup (`open(setup=True)`) may wait for a lock on the tables, when it has
    something to change, before it gives up with a `SchemaError`; zero waits as long as
    it takes. With nothing to change, setup takes no lock at all."""
    wait_for_database: DurationOption = DurationOption(timedelta(0))
    """How long `open()` keeps trying, with backoff, while the database cannot be
    reached, before it raises; zero fails at once. `axa-queue worker` waits 60 s
    unless told otherwise (`--wait-for-database`)."""
    log_tracebacks: bool = False
    """Add the traceback to the log line of a run that raised (`job failed`, `job
    failed, will retry`). Off by default: a traceback shows source lines and every
    exception message in the chain in full, which may hold whatever the handler put in
    them (`axa-queue worker --log-tracebacks` turns it on)."""
    log_keys: bool = False
    """Add a job's key (`NewJob.key`) to the log records of its runs (`key`), for the
    names this process claims by key. Off by default: a key is not an argument, but it
    may name a customer."""
    rebuild_indexes: bool = True
    """Rebuild (`REINDEX INDEX CONCURRENTLY`), in housekeeping's rounds, an index of
    `axa_queue` grown past twice what a fresh build would take: after a long
    transaction held vacuum back, so that claims and counts walk as few pages as before
    it. One process at a time, never while a snapshot is held, and only where the
    workers' role owns the table (docs/production.md, indexes after a long
    transaction)."""
    give_back_gone: bool = True
    """Give back at once, every heartbeat interval, the runs a gone worker process claimed
    ahead and never started, rather than leave them to stale recovery (`stale_after`).
    A process is gone when it has been silent for 3 of its heartbeat intervals and a
    second more and its presence lock (held by its side connection for as long as that
    session lives) is free: a killed process's runs go back within seconds, while one
    whose event loop a handler blocks keeps them. Behind a transaction pooler a process
    holds no presence lock and silence alone decides: there a blocked event loop could
    have a run it had just started (its start not yet written) given back and run twice,
    its job sent to review; turn it off where that matters (docs/design.md, runs of a
    gone process)."""
    unhandled_after: DurationOption = DurationOption(timedelta(minutes=10))
    """How long a job may wait, due, under a job name no live worker process handles
    before it is warned about: on the dashboard, in `axa-queue counts`, by the
    `axa_queue_unhandled_jobs` metric and in each worker's log (once per name)."""
    unknown_names: UnknownNames = "accept"
    """What `enqueue` and `enqueue_all` (of `Queue` and `SyncQueue`) do with a job name
    this queue has no handler for: `"accept"` queues it (another process may handle
    it); `"refuse"` raises `OptionsError`, for an application that queues and works in
    one codebase, so a misspelt name fails at once instead of waiting for ever.
    `enqueue_on` does not look."""

    def __post_init__(self) -> None:
        _positive_int("workers", self.workers)
        _positive_int("max_attempts", self.max_attempts)
        if self.prefetch != "auto" and (
            not isinstance(self.prefetch, int)
            or isinstance(self.prefetch, bool)
            or not 0 <= self.prefetch <= MAX_INTEGER
        ):
            raise OptionsError(
                'expected prefetch to be "auto", zero or a positive integer of at most '
                f"{MAX_INTEGER}, got: {self.prefetch!r}"
            )
        if self.pool_size is not None:
            _positive_int("pool_size", self.pool_size)
        for name, length in (
            ("poll_interval", self.poll_interval),
            ("heartbeat_interval", self.heartbeat_interval),
            ("stale_after", self.stale_after),
            ("maintenance_interval", self.maintenance_interval),
        ):
            if length <= timedelta(0):
                raise OptionsError(f"expected {name} to be more than zero, got: {length}")
        if self.heartbeat_interval >= self.stale_after:
            raise OptionsError(
                "expected heartbeat_interval to be shorter than stale_after, got: "
                f"heartbeat_interval={self.heartbeat_interval}, stale_after={self.stale_after} "
                "(a job must report in several times before it counts as lost)"
            )
        if self.mode is not None and self.mode not in _MODES:
            raise OptionsError(
                f"expected mode to be one of {', '.join(_MODES)}, got: {self.mode!r}"
            )
        if self.unknown_names not in _UNKNOWN_NAMES:
            raise OptionsError(
                f"expected unknown_names to be one of {', '.join(_UNKNOWN_NAMES)}, "
                f"got: {self.unknown_names!r}"
            )
        if self.pooler is not None and self.pooler not in _POOLERS:
            raise OptionsError(
                f"expected pooler to be one of {', '.join(_POOLERS)}, got: {self.pooler!r}"
            )
        if self.schema is not None:
            _schema_name("schema", self.schema)
        if not isinstance(self.listen, bool):
            raise OptionsError(f"expected listen to be True or False, got: {self.listen!r}")
        if not isinstance(self.log_tracebacks, bool):
            raise OptionsError(
                f"expected log_tracebacks to be True or False, got: {self.log_tracebacks!r}"
            )
        if not isinstance(self.log_keys, bool):
            raise OptionsError(f"expected log_keys to be True or False, got: {self.log_keys!r}")
        if self.prepare is not None and not isinstance(self.prepare, bool):
            raise OptionsError(f"expected prepare to be True, False or None, got: {self.prepare!r}")

    def resolved_mode(self) -> Mode:
        """The mode in force: the option, else `AXA_QUEUE_MODE`, else `"queue"`."""
        if self.mode is not None:
            return self.mode
        value = os.environ.get(MODE_VARIABLE, "").strip().lower()
        if not value:
            return "queue"
        if value not in _MODES:
            raise OptionsError(
                f"expected {MODE_VARIABLE} to be one of {', '.join(_MODES)}, got: {value!r}"
            )
        return value  # type: ignore[return-value]

    def resolved_pooler(self) -> Pooler:
        """The pooler in force: the option, else `AXA_QUEUE_POOLER`, else `"direct"`."""
        if self.pooler is not None:
            return self.pooler
        value = os.environ.get(POOLER_VARIABLE, "").strip().lower()
        if not value:
            return "direct"
        if value not in _POOLERS:
            raise OptionsError(
                f"expected {POOLER_VARIABLE} to be one of {', '.join(_POOLERS)}, got: {value!r}"
            )
        return value  # type: ignore[return-value]

    def resolved_schema(self) -> str | None:
        """The schema in force: the option, else `AXA_QUEUE_SCHEMA`, else `None` (the
        connection's `search_path` decides)."""
        if self.schema is not None:
            return self.schema
        value = os.environ.get(SCHEMA_VARIABLE, "").strip()
        return _schema_name(SCHEMA_VARIABLE, value) if value else None

    @property
    def connections(self) -> int:
        """Connections the queue's pool may open."""
        return self.pool_size if self.pool_size is not None else max(self.workers + 4, 6)


def _schema_name(name: str, value: object) -> str:
    if not isinstance(value, str) or not _SCHEMA_NAME.fullmatch(value):
        raise OptionsError(
            f"expected {name} to be a schema name of lowercase letters, digits and _ "
            f"(not starting with a digit, at most 63), got: {value!r}"
        )
    return value


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise OptionsError(f"expected {name} to be a positive integer, got: {value!r}")
    if not 1 <= value <= MAX_INTEGER:
        raise OptionsError(
            f"expected {name} to be a positive integer of at most {MAX_INTEGER}, got: {value!r}"
        )
