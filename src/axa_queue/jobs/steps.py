"""Durable steps: `Step`, a step as `JobInfo.steps` shows it (never its result), and
what `JobContext.step` does, written once for async and sync handlers.

A run's steps are kept in a `StepBook`, made on its first `step`. Its protocol does no
I/O: `look` is `Steps` (`db.calls`) that reads the job's recorded steps once (one
statement, `sql.STEPS_RECORDED`, kept for the run) and says whether the step was
recorded; `record` is the `Call` that records it, fenced by the run's attempt
(`sql.STEP_RECORD`). `JobContext.step` drives them on the worker's event loop, awaited
by an async handler, waited for by a sync one in its thread: only that waiting differs.
A run without a row (inline, or a handler called directly) has no book: its steps'
functions simply run.

What durable means here: a step's result is recorded once its function returned, in
its own statement. A process that dies after the function ran and before that
statement committed leaves no record, and the job's next attempt runs the function
again: at least once, never recorded twice (docs/handlers.md).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from .. import sql
from ..db.calls import Call, Row, Steps, ask
from ..errors import ClaimLostError, StepError
from .arguments import result_json, storable_problem
from .moments import moment

__all__ = ["MAX_STEP_NAME", "RunLink", "Step", "StepBook", "steps_of"]

MAX_STEP_NAME = 200
"""The longest step name, in characters."""


@dataclass(frozen=True)
class Step:
    """A step a job recorded (`JobContext.step`): its name, the attempt whose run
    recorded it, when its function started and when its result was recorded (UTC).
    Never its result, which only the job's own runs read."""

    name: str
    attempt: int
    """The run that recorded it (`JobContext.attempt`)."""
    started_at: datetime
    recorded_at: datetime

    @property
    def duration(self) -> timedelta:
        """How long its function took, from its start to its result recorded."""
        return self.recorded_at - self.started_at


def _epoch(value: Any) -> Any:
    """Epoch seconds from JSON (an infinite time arrives as text)."""
    return Decimal(value) if isinstance(value, str) else Decimal(repr(float(value)))


def steps_of(steps: Any) -> tuple[Step, ...]:
    """`sql.JOB`'s `steps` column (a JSON array; its text from asyncpg; `None` from a
    statement without it), oldest first."""
    if isinstance(steps, (str, bytes)):
        steps = json.loads(steps)
    return tuple(
        Step(
            one["name"],
            one["attempt"],
            moment(_epoch(one["started_at"])),
            moment(_epoch(one["recorded_at"])),
        )
        for one in steps or ()
    )


class RunLink:
    """What a run of a stored job reaches the worker through, for its `JobContext`:
    `send` runs a `Call` on the worker's event loop `loop` (on the connection lent to
    an async run, else one of the pool's), and `book` keeps its steps once it has one.
    Made per run by the worker, at the cost of the closure it replaces."""

    __slots__ = ("attempt", "book", "job_id", "loop", "send")

    def __init__(
        self,
        send: Callable[[Call[Any]], Any],
        loop: asyncio.AbstractEventLoop,
        job_id: UUID,
        attempt: int,
    ) -> None:
        self.send = send
        self.loop = loop
        self.job_id = job_id
        self.attempt = attempt
        self.book: StepBook | None = None

    def steps(self) -> StepBook:
        """The run's book of steps, made on its first step."""
        book = self.book
        if book is None:
            book = self.book = StepBook(self.job_id, self.attempt)
        return book


_ABSENT = object()


def _recorded(rows: list[Row], _count: int) -> dict[str, str]:
    return {row.name: row.result for row in rows}


class StepBook:
    """One run's steps: the job's recorded steps (read on the first `look`) and the
    names this run has taken."""

    __slots__ = ("attempt", "job_id", "recorded", "taken")

    def __init__(self, job_id: UUID, attempt: int) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.recorded: dict[str, str] | None = None
        """Each recorded step's result as JSON text, once read."""
        self.taken: set[str] = set()

    def look(self, name: str) -> Steps[tuple[bool, Any]]:
        """Take `name` for this run and say whether it was recorded, with its result:
        `(True, result)`, or `(False, None)`: run its function, then `record`. A name
        taken twice in a run is a `StepError`."""
        self.take(name)
        try:
            if self.recorded is None:
                self.recorded = yield from ask(
                    Call(sql.STEPS_RECORDED, {"id": self.job_id}, _recorded)
                )
        except BaseException:
            self.taken.discard(name)
            raise
        text = self.recorded.get(name, _ABSENT)
        if text is _ABSENT:
            return False, None
        return True, None if text is None else json.loads(str(text))

    def take(self, name: str) -> None:
        """Check `name` and take it for this run (see `look`)."""
        check_name(name, self.job_id)
        if name in self.taken:
            raise StepError(
                f"step {name!r} of job {self.job_id} was taken twice in one run: a job's "
                "step names are unique (each records one result); give each step its own "
                'name, such as f"charge-{order_id}" in a loop'
            )
        self.taken.add(name)

    def give_up(self, name: str) -> None:
        """Its function raised, or its record failed: nothing is recorded, so the name
        may be tried again."""
        self.taken.discard(name)

    def record(self, name: str, value: Any, seconds: float) -> tuple[Call[None], Any]:
        """The call that records step `name` with what its function returned (`value`)
        after `seconds`, fenced by the run's attempt, and the value as it reads back
        (its JSON, decoded: what a later attempt's `step` returns). Raises `StepError`
        for a value JSON cannot hold (never showing it); its call raises
        `ClaimLostError` when the run lost its claim."""
        text, problem = result_json(value, "step")
        if text is None:
            raise StepError(
                f"cannot record step {name!r} of job {self.job_id}: "
                + str(problem)
                .replace("job 'step' returned", "its function returned", 1)
                .replace("as its result", "as its result here", 1)
            )
        job_id, attempt = self.job_id, self.attempt

        def read(rows: list[Row], _count: int) -> None:
            row = rows[0]
            if not row.held:
                raise ClaimLostError(job_id, attempt, name)
            if not row.kept:
                raise StepError(
                    f"step {name!r} of job {job_id} is recorded already, by another run "
                    "than this one; nothing was changed (a step is recorded once)"
                )

        params = {
            "id": job_id,
            "attempt": attempt,
            "name": name,
            "result": text,
            "seconds": max(seconds, 0.0),
            "now": None,
        }
        return Call(sql.STEP_RECORD, params, read), json.loads(text)


def check_name(name: object, job_id: UUID | None) -> None:
    """Refuse a step name that is not a non-empty string of at most `MAX_STEP_NAME`
    characters that PostgreSQL can store."""
    whose = "" if job_id is None else f" of job {job_id}"
    if not isinstance(name, str) or not name or len(name) > MAX_STEP_NAME:
        raise StepError(
            f"expected a step name{whose} to be a string of 1 to {MAX_STEP_NAME} "
            f"characters, got: {type(name).__name__} of length {len(name) if isinstance(name, str) else '-'}"
        )
    problem = storable_problem(name)
    if problem is not None:
        raise StepError(f"a step name{whose} holds {problem}")
