"""One claimed run of a job: `Run`, where it is (`RunPhase`) and why it was stopped
(`Stop`), if it was.

A run's phase only moves forward (docs/design.md draws them)::

    WAITING --a loop takes it--> STARTING --its handler called--> RUNNING --> ENDED
        \\                            \\
         +----------------------------+--> SKIPPED (its handler never called)

A stop (`Run.stop`: its claim lost, its time up, its job cancelled by a person) may
come in any phase before the end. It only says why (`Run.stopped`); while its loop has
it (`STARTING`, `RUNNING`) it also cancels the loop's task, a cancellation the loop
forgets once the run is over (`Run.cancelled`). Whether its handler was called
(`started`) and whether its loop is done with it (`done`) are read from the phase.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = [
    "CANCELLED",
    "ENDED",
    "LOST",
    "RUNNING",
    "SKIPPED",
    "STARTING",
    "TIMEOUT",
    "WAITING",
    "Run",
    "RunPhase",
    "Stop",
    "order_of",
]

CANCELLED = "cancelled"
"""The kind of stop of a run whose job a person cancelled (`Run.stopped`), and the
outcome observers are told: nothing of the run is written, the job stays cancelled."""

LOST = "lost"
"""The kind of stop of a run whose claim is gone (`Claims.lose` writes its fate)."""

TIMEOUT = "timeout"
"""The kind of stop of a run whose time is up (its ending: a failed try)."""


class RunPhase(enum.Enum):
    """Where a run is; it only moves forward (see the module's drawing)."""

    WAITING = "waiting"
    """Claimed, not yet on a loop: claimed ahead and waiting for one, or about to be
    taken by one. A stop now cancels nothing: its loop skips it."""
    STARTING = "starting"
    """On its loop, its handler not called yet (its claim proved first when in doubt).
    A stop now cancels its loop's task."""
    RUNNING = "running"
    """Its handler called and not yet returned. A stop now cancels its loop's task,
    which waits in this handler (nothing else of a run awaits before it is over)."""
    ENDED = "ended"
    """Over, after its handler was called: its ending made (an exchange writes it), or
    its loss or its cancellation on the way."""
    SKIPPED = "skipped"
    """Over without its handler called: stopped before it started, no handler, or the
    worker aborted before it started."""


WAITING = RunPhase.WAITING
STARTING = RunPhase.STARTING
RUNNING = RunPhase.RUNNING
ENDED = RunPhase.ENDED
SKIPPED = RunPhase.SKIPPED
# The phases as module constants too, for the code on the path of every run: a member
# read from its enum class costs about 0.1 µs (a global, a fifth of that), and a run
# reads or sets its phase several times.


class Stop(NamedTuple):
    """Why a run was stopped from outside: its `kind` (`LOST`, `TIMEOUT` or
    `CANCELLED`) and the reason, as the log and the job's error say it."""

    kind: str
    reason: str


@dataclass(eq=False, slots=True)
class Run:
    """One claimed run of a job, identified by its id (as text) and attempt; once it
    has ended, also how, waiting to be written (`status`, `error`, `delay`)."""

    id: str
    name: str
    attempts: int
    limit: int
    timeout: float | None
    args_text: str = field(repr=False)
    last_heard: float
    """When the last statement that proved its claim was sent, on the clock the worker
    times its claims by (`Connections.monotonic`)."""
    phase: RunPhase = WAITING
    stopped: Stop | None = None
    """Why the run was stopped from outside, if it was. `JobContext.cancelled` reads
    it from the handler's thread."""
    order: tuple[int, float] = (0, 0.0)
    """Claim order: (minus priority, run_at in epoch seconds)."""
    task: asyncio.Task[None] | None = None
    """The loop running it, once it runs; the same loop goes on to later runs."""
    timer: asyncio.TimerHandle | None = None
    seconds: float = 0.0
    """How long the handler ran, once it has ended."""
    status: str = "running"
    """How it ended: `completed`, `failed`, or `queued` again after `delay` seconds."""
    error: str | None = None
    delay: float = 0.0
    raises: int | None = None
    """The job's new `max_attempts` written with its ending (a snooze), else `None`."""
    slept: bool = False
    """Whether it left by `JobContext.sleep` (a snooze its attempt records as `slept`)."""
    ahead: bool = False
    """Whether it was claimed ahead of the loops (its row's `ahead` set): when its loop
    starts it, its start is marked by the next exchange (`State.starts`)."""
    trace_context: str | None = None
    """The trace context stored when the job was queued (JSON text), or `None`: what
    `JobContext.trace_context` is read from (see `tracing`)."""
    job_key: str | None = field(default=None, repr=False)
    """The job's key (`NewJob.key`), read only when the process logs keys
    (`QueueOptions.log_keys`) and the name is claimed by key; else `None`."""
    run_trace: str | None = field(default=None, repr=False)
    """The trace context of its run's span (JSON text of a W3C carrier), when a tracing
    middleware gave one (`context.trace_run`); written with its ending, for the spans of
    its dependents to link to (migration 20). `None` otherwise."""
    result: str | None = field(default=None, repr=False)
    """What its handler returned, as JSON text, once it has completed; `None` when it
    returned `None` (the row's result stays NULL). Private like the arguments."""

    @property
    def started(self) -> bool:
        """Whether its handler was called (a run stopped before that did no work)."""
        return self.phase is RUNNING or self.phase is ENDED

    @property
    def done(self) -> bool:
        """Whether it is over: its loop is done with it."""
        return self.phase is ENDED or self.phase is SKIPPED

    @property
    def cancelled(self) -> bool:
        """Whether a stop cancelled its loop's task (stopped while its loop had it): a
        cancellation its loop forgets before it goes on. Read before the run is over."""
        return self.stopped is not None and (self.phase is STARTING or self.phase is RUNNING)

    def over(self) -> None:
        """Its loop is done with it: `ENDED` if its handler was called, else `SKIPPED`."""
        phase = self.phase
        if phase is RUNNING:
            self.phase = ENDED
        elif phase is not ENDED:
            self.phase = SKIPPED

    def skip(self, kind: str, reason: str) -> None:
        """Its loop, which has it, found its claim or its job gone before its handler
        started (`Claims.prove`): stopped, and over without starting (no cancellation
        to forget: its loop is the one that found it)."""
        self.stopped = Stop(kind, reason)
        self.phase = SKIPPED

    def stop(self, kind: str, reason: str) -> None:
        """Stop this run's handler: its claim is gone, its time is up, or its job was
        cancelled."""
        if self.done or self.stopped is not None:
            return
        self.stopped = Stop(kind, reason)
        if self.phase is not WAITING and self.task is not None:
            # Its loop is waiting inside this run's handler or its proof (nothing else
            # of the run awaits before it is over), so the cancellation lands there.
            self.task.cancel()

    def lose(self, reason: str) -> None:
        """Stop this run: its claim is gone."""
        self.stop(LOST, reason)

    @property
    def key(self) -> tuple[str, int]:
        return (self.id, self.attempts)

    def fields(self) -> dict[str, Any]:
        """The log fields that name this run (never its arguments; its key only when
        the process logs keys: `job_key`)."""
        if self.job_key is not None:
            return {
                "job_id": self.id, "job": self.name, "attempt": self.attempts, "key": self.job_key
            }  # fmt: skip
        return {"job_id": self.id, "job": self.name, "attempt": self.attempts}

    def named(self) -> tuple[str, str, int]:
        """What names this run in a log message (`"%s %s (attempt %d)"`): its job's
        name, id and attempt, the values of `fields`, so a message stands alone where
        no formatter prints the fields (a script's stderr, without logging set up)."""
        return self.name, self.id, self.attempts

    def end(
        self,
        status: str,
        error: str | None = None,
        delay: float = 0.0,
        max_attempts: int | None = None,
    ) -> Run:
        """Say how the run ended (and, for a snooze, the job's new `max_attempts`); it
        is then written with the next exchange."""
        self.status = status
        self.error = error
        self.delay = delay
        self.raises = max_attempts
        return self


def order_of(one: Run) -> tuple[int, float]:
    """The sort key of runs waiting for a loop: best first."""
    return one.order
