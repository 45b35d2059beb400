"""The worker's decisions, as plain functions: what to send now, how long to wait, how
a run that is over is taken (`outcome`).

Nothing here does I/O or reads a clock: each takes what it decides from as arguments,
so `tests/test_decisions.py` tests them without a database or an event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any, Literal, NamedTuple

from ..handlers.policies import Discard, Policy, Retry, Sleep, Snooze, judge
from ..handlers.retries import cut_error, kind
from ..limits import Limits
from .run import CANCELLED, LOST, Stop

__all__ = [
    "AUTO_PREFETCH",
    "COMPLETED",
    "HOLD_ENDINGS",
    "PREFETCH_HORIZON",
    "RETRY_APART",
    "RUN_SECONDS_WEIGHT",
    "SERVICE_RETRY_MAX",
    "SKIP_NAME",
    "VALUE_ERRORS",
    "Outcome",
    "OutcomeKind",
    "ahead",
    "blames_values",
    "due",
    "fate",
    "free_places",
    "gives_up",
    "holds",
    "low_water",
    "needs_proof",
    "next_retry",
    "outcome",
    "room",
    "wanted",
]

HOLD_ENDINGS = 0.020
"""Seconds an ending may wait for others to share its statement, only while every loop
is busy and enough claimed jobs wait for them (`prefetch`); else it is written at once."""

SERVICE_RETRY_MAX = 60.0
"""The longest wait before a failing background service (maintenance, the listener)
tries again; it starts at the poll interval and doubles."""

VALUE_ERRORS = ("22", "23", "54")
"""The SQLSTATE classes of a statement that failed because of a value it carried or
read (data exception, integrity constraint violation, program limit exceeded): one
job's or one limit's, maybe, so the exchange sends its parts apart to find which
(`Exchange.isolate`). Any other failure (a connection, a lock, a privilege, a table)
is everyone's, and the same statement is sent again after a pause."""

SKIP_NAME = 60.0
"""Seconds a job name whose claim fails even alone (a value of its own limits, or of
one of its jobs) is left out of the claims, the other names claimed as usual; then it
is tried again."""

RETRY_APART = 5.0
"""Seconds between tries of an ending that could be recorded neither as it was nor as
a failure, sent on its own so it holds up no other."""

AUTO_PREFETCH = 200
"""The most jobs `prefetch="auto"` (the default) claims ahead of the loops."""

PREFETCH_HORIZON = 0.050
"""Seconds of the loops' work `prefetch="auto"` claims ahead: as many jobs of a name as
the loops would start in that time at the pace its runs take (`ahead`)."""

RUN_SECONDS_WEIGHT = 0.1
"""The weight of each run's time in its name's running average (`prefetch="auto"`)."""


def ahead(workers: int, run_seconds: float | None, most: int) -> int:
    """How many jobs of a name whose runs take `run_seconds` on average (`None`: not
    known yet) `prefetch="auto"` lets wait ahead of `workers` loops: what they would
    start within `PREFETCH_HORIZON` if they ran only that name, at most `most`; none
    while its pace is not known, nor for runs longer than `workers` x
    `PREFETCH_HORIZON` (a tenth of a second with 2 loops, half a second with 10)."""
    if run_seconds is None or workers <= 0:
        return 0
    if run_seconds <= 0:
        return most
    return min(most, int(workers * PREFETCH_HORIZON / run_seconds))


def room(workers: int, prefetch: int) -> int:
    """Runs a process may hold: its loops, and the jobs claimed ahead for them."""
    return workers + prefetch


def low_water(workers: int, prefetch: int) -> int:
    """With no more jobs claimed ahead than this waiting, claim more now (`due`): the
    loops, or a quarter of `prefetch` if more (enough while a statement is in flight)."""
    return max(workers, prefetch // 4)


def free_places(stopping: bool, room: int, held: int) -> int:
    """How many jobs the next exchange may claim: none once stopping, nor while it holds
    more than its room (`prefetch="auto"` lowered it)."""
    return 0 if stopping else max(room - held, 0)


def due(
    *,
    stopping: bool,
    active: int,
    slots: int,
    waiting: int,
    low_water: int,
    endings: int,
    room: int,
) -> bool:
    """Whether the next exchange should go now rather than let endings gather.

    Only with `prefetch` can it wait: while every loop is busy and more jobs claimed
    ahead wait than `low_water`, nothing needs the database yet, so endings gather (for
    up to `HOLD_ENDINGS`) and one statement records them all and claims as many. A loop
    coming free, the waiting jobs running low, or stopping makes it due at once."""
    return stopping or active < slots or waiting <= low_water or endings >= room


def holds(*, due: bool, endings: int, now: float, since: float) -> bool:
    """Whether the exchange loop waits rather than sends: not due, and the oldest ending
    (gathered at `since`) has waited less than `HOLD_ENDINGS` (or there is none)."""
    return not due and (not endings or now < since + HOLD_ENDINGS)


def wanted(
    names: Iterable[str],
    limits: Limits,
    in_use: Mapping[str, int],
    free: int,
    *,
    paced: Mapping[str, int] | None = None,
    waiting: Mapping[str, int] | None = None,
    idle: int = 0,
) -> list[dict[str, Any]]:
    """The names to claim, each with how many it may take now (its free places under a
    per-name limit, else all free places: `Limits.places`), as `sql.EXCHANGE` reads
    them; a name with a global or a rate limit also carries it (`Limits.gate`), which
    the statement checks against every process's running jobs or the name's slots.
    With global or rate limits the names come sorted, so every process takes the
    names' locks in the same order.

    With `prefetch="auto"`, `paced` says how many jobs of each name may wait ahead (see
    `ahead`; a name not in it, none) and `waiting` how many of each wait now: a name
    takes at most what fills the `idle` loops, or what it may still have waiting if
    more; and while any job waits, every name may have one waiting, so a name of long
    or new jobs is not left behind those of short ones."""
    least = 1 if waiting else 0
    found: list[dict[str, Any]] = []
    for name in names:
        cap = limits.places(name, in_use.get(name, 0), free)
        if paced is not None:
            may_wait = max(paced.get(name, 0), least) - (waiting or {}).get(name, 0)
            cap = min(cap, max(idle, may_wait))
        if cap > 0:
            found.append({"name": name, "cap": cap})
    if limits.gated:
        for one in found:
            limits.gate(one)
        found.sort(key=lambda one: str(one["name"]))
    return found


def nothing_more(
    wanted: list[dict[str, Any]], free: int, got: int, by_name: Mapping[str, int] | None
) -> bool:
    """Whether a claim shows there is no more work for this process now: it took fewer
    jobs than `free`, and no wanted name took as many as its cap (a name held to its
    cap may have more ready: a new name's first claim fills only the idle loops). With
    `by_name` unknown (the claim went in parts), fewer than it asked for in all."""
    if got >= free:
        return False
    if by_name is None:
        return got < min(free, sum(int(one["cap"]) for one in wanted))
    return all(by_name.get(one["name"], 0) < min(int(one["cap"]), free) for one in wanted)


def held_back(
    names: Iterable[str], wanted: list[dict[str, Any]], by_name: Mapping[str, int] | None
) -> frozenset[str]:
    """The names a claim held back: left out of `wanted` (their pace or limit), or given
    as many jobs as their cap (all of them when the claim went in parts: `by_name`
    unknown). Their jobs may be ready still, so a loop coming free looks again."""
    caps = {one["name"]: one["cap"] for one in wanted}
    return frozenset(
        name
        for name in names
        if name not in caps or by_name is None or by_name.get(name, 0) >= caps[name]
    )


def blames_values(sqlstate: str | None) -> bool:
    """Whether a statement that failed with `sqlstate` may have failed because of one of
    the values it carried or read (`VALUE_ERRORS`), rather than for every statement."""
    return sqlstate is not None and sqlstate[:2] in VALUE_ERRORS


def needs_proof(
    *, now: float, last_heard: float, stale: float, broken_at: float, beat: float
) -> bool:
    """Whether a run's claim may be gone before it starts: proved (claimed, a heartbeat sent)
    `stale`/2 or 2 `beat`s ago (`sql.GIVE_BACK_GONE` takes 3), or a connection broke since."""
    return now - last_heard >= min(stale / 2, 2 * beat) or last_heard <= broken_at


def gives_up(*, started: bool, now: float, last_heard: float, stale: float) -> bool:
    """Whether a run whose heartbeats fail stops: once started, when a replacement may have
    started (its last report sent `stale_after` ago). One not started waits, to prove it."""
    return started and now - last_heard >= stale


def next_retry(retry: float, cap: float = SERVICE_RETRY_MAX) -> float:
    """The wait before a failing service's next try: double the last, up to `cap`."""
    return min(retry * 2, cap)


FOUND = {
    "completed": "which completed",
    "running": "which is running",
    "queued": "which is queued",
    "failed": "which failed",
    "cancelled": "which was cancelled",
    "needs_review": "which waits for review",
}
"""How the log says what became of a job replaced by a later attempt."""


def fate(
    *,
    started: bool,
    attempts: int,
    ending: str,
    status: str | None,
    found_attempts: int | None,
    became: str | None,
) -> tuple[int, str]:
    """The level and message logging what became of the job of a run (of `attempts`,
    ended as `ending`) that lost its claim, from what `sql.MARK_LOST` found (`status`,
    `found_attempts`) and changed it to (`became`)."""
    head = "job stopped" if started else "job not started"
    if status is None or found_attempts is None:
        return logging.WARNING, f"{head}: its claim was gone, and so is its job (deleted)"
    if became == "needs_review":
        return logging.ERROR, (
            f"{head}: another worker or recovery took its claim while it ran (found it "
            f"{status}, attempt {found_attempts}); it now waits for review"
        )
    if became is not None:
        now = "queued again" if became == "queued" else "failed: no attempts left"
        return logging.WARNING, f"{head}: no one had taken its claim, so it is {now}"
    if found_attempts == attempts and status == "cancelled":
        return logging.INFO, f"{head}: a person cancelled its job while it ran; it stays cancelled"
    if found_attempts > attempts:
        return (
            logging.WARNING,
            f"{head}: replaced by attempt {found_attempts}, {FOUND.get(status, f'which is {status}')}",
        )
    if found_attempts == attempts and status == ending:
        return logging.INFO, f"{head}: its ending had been recorded after all ({status})"
    if status == "needs_review":
        return logging.WARNING, f"{head}: its claim was gone; the job already waits for review"
    return logging.WARNING, f"{head}: its claim was gone; the job is now {status}"


OutcomeKind = Literal["completed", "snoozed", "slept", "retried", "failed", "lost", "cancelled"]


class Outcome(NamedTuple):
    """How a run that is over is taken (`outcome`): what its ending writes, if
    anything, and what the log says of it. (A named tuple: made once per run, it costs
    a fifth of a frozen dataclass.)"""

    kind: OutcomeKind
    """`completed`, `snoozed`, `slept`, `retried` or `failed`: an ending to write (`status`,
    `error`, `delay`, `max_attempts`); `lost`: its claim is gone, and `Claims.lose`
    writes its fate (`error`: why); `cancelled`: a person cancelled its job under this
    attempt, and nothing is written."""
    status: str = "running"
    """What its ending writes: `completed`, `queued` again after `delay`, or `failed`."""
    error: str | None = None
    delay: float = 0.0
    max_attempts: int | None = None
    """The job's new `max_attempts` (a snooze), else `None`."""
    cause: str | None = None
    """What the log message says of a failure: the class of what the handler raised
    (`raised ValueError`), or the error itself when nothing was raised (a timeout, a
    result that cannot be stored, no handler)."""
    traceback: bool = False
    """Whether what the handler raised is worth its traceback in the log: not a
    `Retry`, `Snooze` or `Discard` it asked for."""


COMPLETED = Outcome("completed", "completed")
"""The outcome of a run whose handler returned (nearly every run's): made once."""


def outcome(
    *,
    stopped: Stop | None,
    error: str | None,
    raised: BaseException | None,
    attempts: int,
    limit: int,
    policy: Policy,
    backoff: timedelta,
    backoff_failed: Callable[[Exception], None] | None = None,
) -> Outcome:
    """How a run that is over is taken: one `stopped` from outside (a person cancelled
    its job, its claim is gone, or its time is up), else one that ended with `error`
    (`None`: it completed) and, if its handler raised, what it `raised`, as `attempts`
    of `limit`. A failure is judged by the handler's `policy` (`policies.judge`, with
    the queue's `backoff` for handlers without one; `backoff_failed` is told what a
    backoff function raised) and its error cut to what a row keeps. A timeout is a
    failure that raised nothing, even when the handler swallowed its cancellation."""
    if stopped is not None and stopped.kind == CANCELLED:
        return Outcome("cancelled")
    if stopped is not None and stopped.kind == LOST:
        return Outcome("lost", error=f"stopped: {stopped.reason}")
    if stopped is not None:  # its time is up
        error, raised = stopped.reason, None
    if error is None:
        return COMPLETED
    verdict = judge(raised, error, attempts, limit, policy, backoff, backoff_failed)
    taken: OutcomeKind = (
        ("slept" if isinstance(raised, Sleep) else "snoozed")
        if verdict.max_attempts is not None
        else "retried"
        if verdict.status == "queued"
        else "failed"
    )
    return Outcome(
        taken,
        verdict.status,
        cut_error(verdict.error),
        verdict.delay,
        verdict.max_attempts,
        cause=error if raised is None else f"raised {kind(raised)}",
        traceback=raised is not None and not isinstance(raised, (Retry, Snooze, Discard)),
    )
