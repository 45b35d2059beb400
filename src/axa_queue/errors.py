"""The errors axa-queue raises, one base class and a short tree.

::

    AxaQueueError
     ├── OptionsError (ValueError)      an option or argument makes no sense
     │    ├── ArgumentsError (TypeError) a job's arguments cannot be stored as JSON
     │    ├── NotACodeError             a person's `by` or `reason` is not a short code
     │    └── ScheduleError             a schedule is malformed or registered twice
     ├── SchemaError                    the tables, columns or triggers are missing or off
     ├── NotOpenError                   the queue was used before `open()`
     ├── DrainError                     a drain (tests) timed out, or could not start
     ├── NotInAJobError (LookupError)   `current_job()` outside a job's run
     ├── StepError                      a durable step misused: a name twice in a run, a
     │                                  result JSON cannot hold
     ├── ClaimLostError                 a run that lost its claim tried to record a step
     ├── JobNotFoundError (LookupError) no job with that id (retention may have deleted it)
     ├── NoResultError (LookupError)    the job has not completed, so it has no result
     └── WaitTimeoutError (TimeoutError) `wait()` ran out of time before the job finished

Database failures are psycopg's own errors (`psycopg.Error` and its subclasses), passed
through unchanged so their `sqlstate` and diagnostics stay available.
"""

from __future__ import annotations

from uuid import UUID

__all__ = [
    "ArgumentsError",
    "AxaQueueError",
    "ClaimLostError",
    "DrainError",
    "JobNotFoundError",
    "NoResultError",
    "NotACodeError",
    "NotInAJobError",
    "NotOpenError",
    "OptionsError",
    "ScheduleError",
    "SchemaError",
    "StepError",
    "WaitTimeoutError",
]


class AxaQueueError(Exception):
    """The base of every error axa-queue raises itself."""


class OptionsError(AxaQueueError, ValueError):
    """An option or argument makes no sense; the message names it and its value."""


class ArgumentsError(OptionsError, TypeError):
    """A job's arguments cannot be stored: not JSON, a NUL character or lone surrogate
    in a string or key, or nested too deep. Raised when the job is made, before any SQL.

    The message names the job and the problem, never a value or a key. It is a
    `TypeError` too, as arguments of the wrong kind always were.
    """


class NotACodeError(OptionsError):
    """A person's `by` or `reason` is not a visible code: empty or blank, too long, or
    with a character that is not printable (a control, zero-width or bidi character, a
    line separator, a space other than the ASCII space) or a space first or last. The
    exact rule is `acts.check_code`'s.

    The refused text is never echoed: it may be something a person typed.
    """

    def __init__(self, what: str, limit: int) -> None:
        super().__init__(
            f"`{what}` must be 1 to {limit} visible characters (letters, digits, "
            "punctuation, symbols, and ASCII spaces between them): no control, zero-width "
            "or bidi characters (line breaks, tabs, ESC, U+200B, U+202E...), no other "
            "blanks, no space first or last; nothing was written"
        )
        self.what = what


class ScheduleError(OptionsError):
    """A schedule has a bad name or interval, or its name was registered twice."""


class SchemaError(AxaQueueError):
    """The queue's tables, columns or triggers are missing, out of date, or turned off."""


class NotOpenError(AxaQueueError):
    """The queue was asked for database work before `await queue.open()`."""

    def __init__(self) -> None:
        super().__init__(
            "the queue is not open: call `await queue.open()` (or use `async with queue:`) "
            "before enqueueing or inspecting jobs"
        )


class DrainError(AxaQueueError):
    """`queue.drain()` could not finish: jobs were still ready or running when its
    timeout ran out (a stuck handler, or jobs that keep queuing jobs), or it could not
    start (the queue's worker already runs in this process, a name it has no handler
    for). The message says which, with the counts so far; never a job's arguments."""


class JobNotFoundError(AxaQueueError, LookupError):
    """No job has this id: it never existed, or retention deleted its finished row."""

    def __init__(self, job_id: UUID) -> None:
        super().__init__(
            f"no job {job_id}: it does not exist, or retention deleted it after it finished"
        )
        self.job_id = job_id


class NoResultError(AxaQueueError, LookupError):
    """The job has no result yet, or never will: it has not completed (`state` says
    where it is). A completed job whose handler returned `None` has a result, `None`."""

    def __init__(self, job_id: UUID, state: str) -> None:
        why = {
            "queued": "it is queued; wait for it with `wait()` first",
            "running": "it is running; wait for it with `wait()` first",
            "failed": "it failed; its error is in `job(id).error`",
            "cancelled": "it was cancelled before it ran",
            "needs_review": "it waits for review (its run lost its claim); a person "
            "releases it with `retry()`",
        }.get(state, f"it is {state}")
        super().__init__(f"job {job_id} has no result: {why}")
        self.job_id = job_id
        self.state = state


class StepError(AxaQueueError):
    """A durable step (`JobContext.step`) misused: its name given twice in one run, not
    a short name, or its function returned what JSON cannot hold. The message names the
    job and the step, never the step's result."""


class ClaimLostError(AxaQueueError):
    """A run tried to record a step (`JobContext.step`) after losing its claim: its
    job is no longer `running` under its attempt (stale recovery took it, a person
    cancelled it, or a later attempt runs). Nothing is recorded and the run stops: let
    it propagate; the job's next attempt, if any, runs the step again."""

    def __init__(self, job_id: UUID, attempt: int, step: str) -> None:
        super().__init__(
            f"cannot record step {step!r} of job {job_id} (attempt {attempt}): the run lost "
            "its claim (the job is no longer running under this attempt), so nothing is "
            "recorded; let this error end the run"
        )
        self.job_id = job_id
        self.attempt = attempt
        self.step = step


class WaitTimeoutError(AxaQueueError, TimeoutError):
    """`wait()` ran out of time before the job finished; the job goes on as it was."""

    def __init__(self, job_id: UUID, seconds: float, state: str) -> None:
        super().__init__(
            f"job {job_id} did not finish within {seconds:g} s: it is still {state}; "
            "wait again, or give a longer timeout"
        )
        self.job_id = job_id
        self.state = state


class NotInAJobError(AxaQueueError, LookupError):
    """`current_job()` was called outside a job's run."""

    def __init__(self) -> None:
        super().__init__(
            "no job is running here: current_job() works only inside a handler (or a "
            "middleware) while it runs a job, in its task or its thread; outside one, "
            "take the job as the handler's second parameter instead"
        )
