"""A person's acts on one job, kept as records: `cancel`, `retry` (which releases a job
in review), the acts read back, and what every act shares (`Act`, `ActKind`,
`ActResult`, `check_code`).

A job row is state: it changes as the job runs, and retention deletes it. What a
person does to a job is a record. `cancel` stops a queued or running job; `retry` queues a
failed one again (act `retried`) or releases one from review (act `released`). Each
takes the caller's connection and a `by` and `reason`, and changes the job and
appends the act in one statement, so the act, the change and the caller's own audit
row commit together or not at all. There is no form that takes a pool.

`axa_job_acts` is only ever inserted into: its triggers refuse UPDATE, DELETE and
TRUNCATE from anyone, and fire even under `session_replication_role = replica`. Each
act also records the database role that inserted it (`Act.role`), which no insert can
choose; `by` is the application's claim (docs/design.md: what acts prove and what not).
`by` and `reason` are visible codes: `check_code` gives the exact rule.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import datetime
from typing import overload
from uuid import UUID

from .. import sql
from ..db.adapters import AnyConnection, SomeAsyncConnection, SomeSyncConnection, run
from ..db.calls import Call, Row, Steps, ask
from ..errors import NotACodeError
from ..jobs.model import JobState, job_id_of, moment

__all__ = [
    "CANCELS",
    "MAX_REASON_CHARS",
    "NIL_JOB",
    "RETRIES",
    "Act",
    "ActKind",
    "ActResult",
    "act_of",
    "acts_call",
    "acts_on",
    "cancel",
    "check_code",
    "retry",
]

MAX_REASON_CHARS = 200
"""The longest `by` or `reason` kept on an act, in characters."""

NIL_JOB = UUID(int=0)
"""The `job_id` of an act on a job name (`paused`, `resumed`) rather than on a job."""


class ActKind(str, enum.Enum):
    """What a person did to a job. The values are the `act` column's."""

    CANCELLED = "cancelled"
    """Cancelled it while it was queued or running."""
    RETRIED = "retried"
    """Queued it again after it failed."""
    RELEASED = "released"
    """Released it from review, to run again."""
    PAUSED = "paused"
    """Paused a job name (`pause`): an act on a name, not a job."""
    RESUMED = "resumed"
    """Resumed a paused job name (`resume`): an act on a name, not a job."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Act:
    """One act of a person on a job, as `axa_job_acts` keeps it; it outlives the job."""

    id: int
    """The act's row; it rises with each act."""
    job_id: UUID
    job_name: str
    kind: ActKind
    attempts: int
    """The job's runs so far when the act was done."""
    by: str
    reason: str
    at: datetime
    """When, on the database's clock, in UTC (read as `JobInfo` reads times)."""
    role: str | None = None
    """The database role that inserted the act (`current_user`), recorded by the table
    itself whoever's statement it was (the Rust crate's too), and not to be chosen by
    the insert. `None` for an act kept before setup added the column. Unlike `by`,
    which is the application's claim, this is PostgreSQL's word."""


@dataclass(frozen=True)
class ActResult:
    """What an act did: `applied` (also its truth value), the act kept, and the state the
    job was in (`None` when there is no such job), which says why an act did not apply."""

    applied: bool
    kind: ActKind | None
    found: JobState | None

    def __bool__(self) -> bool:
        return self.applied


def check_code(text: object, what: str) -> str:
    """Refuse `text` as a `by` or `reason` unless it is a visible, printable code:

    - a `str` of 1 to 200 characters (`MAX_REASON_CHARS`);
    - every character printable, as Python's `str.isprintable` says: none of Unicode's
      control characters (Cc: tab, line breaks, ESC, C1 controls), format characters
      (Cf: zero-width U+200B..U+200D, bidi controls U+200E/U+200F, U+202A..U+202E,
      U+2066..U+2069, U+FEFF, soft hyphen, tag characters), surrogates (Cs), private-use
      (Co) or unassigned (Cn) code points, line or paragraph separators (U+2028,
      U+2029), or spaces (Zs) other than the ASCII space, such as U+00A0 and U+3000;
    - no ASCII space first or last (so never blank).

    Letters, marks, digits, punctuation and symbols of any script are codes, and so are
    words with single or several ASCII spaces between them. The refused text is never
    echoed. The table itself refuses the control, zero-width and bidi characters and
    leading or trailing spaces as well, for rows other clients write.
    """
    if (
        not isinstance(text, str)
        or not text
        or len(text) > MAX_REASON_CHARS
        or not text.isprintable()
        or text[0] == " "
        or text[-1] == " "
    ):
        raise NotACodeError(what, MAX_REASON_CHARS)
    return text


def _read_result(rows: list[Row], _count: int) -> ActResult:
    kind, found = rows[0].act, rows[0].found
    return ActResult(
        applied=kind is not None,
        kind=None if kind is None else ActKind(kind),
        found=None if found is None else JobState(found),
    )


def _act_call(
    statement: str, job_id: UUID, by: str, reason: str, now: datetime | None = None
) -> Call[ActResult]:
    params = {
        "id": job_id_of(job_id),
        "by": check_code(by, "by"),
        "reason": check_code(reason, "reason"),
        "now": now,
    }
    return Call(statement, params, _read_result)


RESENDS = 3
"""How many times an act is sent at most (`_act`)."""

CANCELS = (JobState.QUEUED, JobState.RUNNING, JobState.BLOCKED, JobState.NEEDS_REVIEW)
"""The states `cancel` applies to (`sql.CANCEL`'s `target`)."""

RETRIES = (JobState.FAILED, JobState.NEEDS_REVIEW)
"""The states `retry` applies to (`sql.RETRY`'s `target`)."""


def _act(call: Call[ActResult], applies: tuple[JobState, ...]) -> Steps[ActResult]:
    """Send an act's `call`, and send it again while it changed nothing yet found the job
    in a state it applies to: the job's row changed while the statement waited for its
    lock (its run ended, another person acted, or housekeeping moved it to the history,
    whose new row the statement's snapshot cannot see), and the statement's snapshot
    still shows the state before. Sent again (READ COMMITTED: a new snapshot), it reads
    the row as it is now and acts on it, or says the state that kept it from acting. In
    a REPEATABLE READ or SERIALIZABLE transaction such a row is a serialization failure
    instead, raised by the first statement."""
    result = yield from ask(call)
    for _ in range(RESENDS - 1):
        if result.applied or result.found not in applies:
            break
        result = yield from ask(call)
    return result


@overload
def cancel(
    conn: SomeAsyncConnection, job_id: UUID, by: str, reason: str
) -> Awaitable[ActResult]: ...
@overload
def cancel(conn: SomeSyncConnection, job_id: UUID, by: str, reason: str) -> ActResult: ...
def cancel(
    conn: AnyConnection, job_id: UUID, by: str, reason: str
) -> ActResult | Awaitable[ActResult]:
    """Cancel job `job_id` if it is queued, running, blocked or in review, as an act of
    `by` for `reason`, in the caller's transaction. Its dependents' fate is decided in
    the same statement (docs/workflows.md). A job in any other state, or no such job, changes
    nothing and writes no act; the result says so (`found`: the state it was in).

    A running job is stopped once the caller commits: the process running it is told
    at once (a notification; its next heartbeat otherwise), cancels an async handler
    (which sees `asyncio.CancelledError`) and sets `current_job().cancelled` for a sync
    one, which runs on until it returns (a handler that ignores it is stopped at its
    timeout). Whatever the run does afterwards is refused by the fence: the job stays
    `cancelled`. A Rust crate worker running it runs on to its end, and its ending is
    refused the same way. Rolled back, nothing happens and the job runs on. The job's
    row stays locked until the transaction ends.

    Raises `NotACodeError` before anything is sent when `by` or `reason` is not a
    visible code (the rule is `check_code`'s: 1 to 200 printable characters, no
    control, zero-width or bidi characters, no space first or last).
    """
    return run(conn, _act(_act_call(sql.CANCEL, job_id, by, reason), CANCELS))


@overload
def retry(
    conn: SomeAsyncConnection, job_id: UUID, by: str, reason: str
) -> Awaitable[ActResult]: ...
@overload
def retry(conn: SomeSyncConnection, job_id: UUID, by: str, reason: str) -> ActResult: ...
def retry(
    conn: AnyConnection, job_id: UUID, by: str, reason: str
) -> ActResult | Awaitable[ActResult]:
    """Queue job `job_id` again now for one more try if it failed (act `retried`) or waits
    for review (act `released`), as an act of `by` for `reason`, in the caller's
    transaction. A job in any other state, or no such job, changes nothing and writes
    no act. Its last error stays until it next runs.

    Raises `NotACodeError` before anything is sent when `by` or `reason` is not a
    visible code (the rule is `check_code`'s: 1 to 200 printable characters, no
    control, zero-width or bidi characters, no space first or last).
    """
    return run(conn, _act(_act_call(sql.RETRY, job_id, by, reason), RETRIES))


def act_of(row: Row) -> Act:
    """An act from a row naming the acts table's columns (`sql.ACTS`, `sql.WEB_ACTS`)."""
    return Act(
        id=row.id,
        job_id=row.job_id,
        job_name=row.job_name,
        kind=ActKind(row.act),
        attempts=row.attempts,
        by=row.by,
        reason=row.reason,
        at=moment(row.at),
        role=row.db_role,
    )


def acts_call(job_id: UUID) -> Call[list[Act]]:
    """The call that reads a job's acts, oldest first."""
    return Call(sql.ACTS, (job_id_of(job_id),), lambda rows, _n: [act_of(r) for r in rows])


@overload
def acts_on(conn: SomeAsyncConnection, job_id: UUID) -> Awaitable[list[Act]]: ...
@overload
def acts_on(conn: SomeSyncConnection, job_id: UUID) -> list[Act]: ...
def acts_on(conn: AnyConnection, job_id: UUID) -> list[Act] | Awaitable[list[Act]]:
    """Every act done to job `job_id`, oldest first, kept after its row is purged."""
    return run(conn, acts_call(job_id))
