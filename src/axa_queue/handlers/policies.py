"""Retry policies: a handler's defaults, its backoff, and what a handler raises to steer
its job's next try (`Retry`, `Snooze`, `Discard`).

`@queue.handler("Report", max_attempts=5, timeout=60, priority=3, backoff=Exponential(),
retry_on=(TimeoutError,), discard_on=(ValueError,))` makes a `Policy`. Its
`max_attempts`, `timeout` and `priority` fill what a job leaves unset: when it is
queued by a queue that has the handler (stored on the row, so every worker, stale
recovery and the Rust crate honour them), and, for a job stored without them (queued
by another process, the crate or a schedule), by the worker that runs it. The backoff,
`retry_on` and `discard_on` are decided by the worker, when a run fails. Every
decision here is a plain function of its arguments (`judge`), tested without a database.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any, NamedTuple, TypedDict, Union

from ..errors import OptionsError
from ..jobs.model import SMALLINT, NewJob
from ..options import MAX_DURATION, MAX_INTEGER, Duration, to_seconds, to_timedelta
from .retries import MAX_BACKOFF, backoff

__all__ = [
    "Backoff",
    "Discard",
    "Exponential",
    "Policy",
    "PolicyOptions",
    "Retry",
    "Sleep",
    "Snooze",
    "Verdict",
    "judge",
    "policy_of",
]

Backoff = Union[Duration, Callable[[int], timedelta]]  # noqa: UP007 - a runtime alias on 3.10
"""How long a failed job waits before its next try: a fixed length (seconds or a
`timedelta`), or a function of the attempt that failed (1 for the first run) returning
a `timedelta`, such as `Exponential()`."""


@dataclass(frozen=True)
class Exponential:
    """Exponential backoff with jitter: the wait after attempt `n` is `base * 2**(n-1)`,
    at most `cap`, then shortened by a random part of up to `jitter` of itself (so
    retries of many jobs that failed together spread out, and never wait past `cap`).
    `Exponential()` waits about 1 s, 2 s, 4 s, ... up to an hour."""

    base: Duration = timedelta(seconds=1)
    cap: Duration = MAX_BACKOFF
    jitter: float = 0.25
    """The largest part of each wait that may be taken off at random, from 0 to 1."""
    draw: Callable[[], float] = field(default=random.random, repr=False, compare=False)
    """A random number in [0, 1): injectable, so tests can pin it."""

    def __post_init__(self) -> None:
        if to_seconds(self.base, "base") <= 0:
            raise OptionsError(
                f"expected the backoff's base to be more than zero, got: {self.base!r}"
            )
        if to_seconds(self.cap, "cap") < to_seconds(self.base, "base"):
            raise OptionsError(
                f"expected the backoff's cap to be at least its base, got: {self.cap!r}"
            )
        if (
            not isinstance(self.jitter, (int, float))
            or isinstance(self.jitter, bool)
            or not 0 <= self.jitter <= 1
        ):
            raise OptionsError(
                f"expected the backoff's jitter to be from 0 to 1, got: {self.jitter!r}"
            )

    def __call__(self, attempt: int) -> timedelta:
        doublings = min(max(attempt - 1, 0), 1000)  # 2.0 ** 1000 is still a float
        cap = to_seconds(self.cap, "cap")
        full = min(to_seconds(self.base, "base") * 2.0**doublings, cap)
        return timedelta(seconds=full * (1 - self.jitter * self.draw()))


class Retry(Exception):
    """Raised by a handler: try the job again (after `in_`, else the handler's backoff).
    The attempt counts: with none left, the job fails. Its text is kept as the job's
    error ("retry requested in 30.0 s: <reason>")."""

    def __init__(self, reason: str | None = None, *, in_: Duration | None = None) -> None:
        super().__init__(reason or "")
        self.reason = reason
        self.in_ = None if in_ is None else to_timedelta(in_, "in_")
        if self.in_ is not None and self.in_ < timedelta(0):
            raise OptionsError(f"expected Retry's in_ to be zero or more, got: {in_!r}")


class Snooze(Exception):
    """Raised by a handler: try the job again after `delay`, without counting this
    attempt against its limit. The attempt number still rises (it names each run), and
    the job's `max_attempts` rises with it, recorded on the row with the ending. Its
    error then says "snoozed for 30.0 s"."""

    def __init__(self, delay: Duration) -> None:
        self.delay = to_timedelta(delay, "delay")
        if self.delay < timedelta(0):
            raise OptionsError(f"expected Snooze's delay to be zero or more, got: {delay!r}")
        super().__init__(f"snoozed for {self.delay.total_seconds():.1f} s")


class Sleep(Snooze):
    """Raised by `JobContext.sleep` and `sleep_until` (never by hand): the job leaves its
    loop and is queued again after `delay`, its attempt not spent (a `Snooze`: its
    `max_attempts` rises with the attempt number) and its recorded steps kept. Its run's
    attempt says `slept`, its error "slept for 3600.0 s". Let it propagate: a handler
    that catches it (`except Exception`) stays in its loop instead of sleeping."""

    def __init__(self, delay: Duration) -> None:
        super().__init__(delay)
        self.args = (f"slept for {self.delay.total_seconds():.1f} s",)


class Discard(Exception):
    """Raised by a handler: fail the job now, with no more tries, whatever attempts it
    has left. Its error says "discarded: <reason>"."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Policy:
    """A handler's retry policy and defaults (see the module). Every field is optional."""

    max_attempts: int | None = None
    timeout: Duration | None = None
    priority: int | None = None
    backoff: Backoff | None = None
    retry_on: tuple[type[BaseException], ...] = ()
    """When given, only these exceptions are retried; any other fails the job at once."""
    discard_on: tuple[type[BaseException], ...] = ()
    """These exceptions fail the job at once ("discarded: ..."), before `retry_on`."""

    def check(self, name: str) -> Policy:
        """This policy, each field checked (an `OptionsError` naming the handler's job,
        the field and its bound, and of a value of the wrong kind only its type); the
        exception lists made tuples."""
        for field_name in ("max_attempts", "priority"):
            value = getattr(self, field_name)
            low, high = (1, MAX_INTEGER) if field_name == "max_attempts" else SMALLINT
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high
            ):
                kind = "a positive integer" if field_name == "max_attempts" else "an integer"
                raise OptionsError(
                    f"expected {field_name} of handler {name!r} to be {kind} from {low} to "
                    f"{high}, got: {_shown(value)}"
                )
        for field_name in ("timeout", "backoff"):
            value = getattr(self, field_name)
            if value is None or (field_name == "backoff" and callable(value)):
                continue
            try:
                seconds = to_seconds(value, field_name)
            except OptionsError:
                seconds = -1.0
            if seconds < 0 or (field_name == "timeout" and seconds == 0):
                least = "more than zero" if field_name == "timeout" else "zero or more"
                also = " or a function of the attempt" if field_name == "backoff" else ""
                raise OptionsError(
                    f"expected {field_name} of handler {name!r} to be a timedelta or a number "
                    f"of seconds{also}, {least} and at most {MAX_DURATION.days} days, "
                    f"got: {_shown(value)}"
                )
        for field_name in ("retry_on", "discard_on"):
            value = getattr(self, field_name)
            kinds: tuple[Any, ...] | None = None
            if isinstance(value, type):
                kinds = (value,)
            elif isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
                kinds = tuple(value)
            if kinds is None or not all(
                isinstance(k, type) and issubclass(k, BaseException) for k in kinds
            ):
                raise OptionsError(
                    f"expected {field_name} of handler {name!r} to be exception classes (a "
                    f"class, or a tuple of them), got: {_kinds(value, kinds)}"
                )
            object.__setattr__(self, field_name, kinds)
        return self

    @property
    def fills(self) -> bool:
        """Whether it has a default to fill into a job (max_attempts, timeout, priority)."""
        return (
            self.max_attempts is not None or self.timeout is not None or self.priority is not None
        )

    def fill(self, job: NewJob) -> NewJob:
        """`job` with this policy's `max_attempts`, `timeout` and `priority` where it
        left them unset (`None`); `job` itself when there is nothing to fill. The
        arguments, already encoded, are not encoded again."""
        if not self.fills or (
            (job.max_attempts is not None or self.max_attempts is None)
            and (job.timeout is not None or self.timeout is None)
            and (job.priority is not None or self.priority is None)
        ):
            return job
        filled = copy.copy(job)  # a value checked already: only unset fields change
        if job.max_attempts is None:
            object.__setattr__(filled, "max_attempts", self.max_attempts)
        if job.timeout is None:
            object.__setattr__(filled, "timeout", self.timeout)
        if job.priority is None:
            object.__setattr__(filled, "priority", self.priority)
        return filled

    def wait(
        self,
        attempt: int,
        default: timedelta,
        failed: Callable[[Exception], None] | None = None,
    ) -> timedelta:
        """How long a job whose attempt `attempt` failed waits: this policy's backoff,
        else the queue's (`default`, doubling, `retries.backoff`). A backoff function
        that raises gets the queue's too, and `failed` is told what it raised (the
        worker logs it): it must not cost the job its ending."""
        if self.backoff is None:
            return backoff(default, attempt)
        if callable(self.backoff):
            try:
                found = self.backoff(attempt)
            except Exception as error:
                if failed is not None:
                    failed(error)
                return backoff(default, attempt)
            if not isinstance(found, timedelta) or found < timedelta(0):
                return backoff(default, attempt)  # a backoff that returns nonsense
            return min(found, MAX_DURATION)
        return to_timedelta(self.backoff, "backoff")


def _shown(value: object) -> str:
    """How a refused option's value is shown: a number as itself, anything else by its
    type alone (a string given by mistake may hold anything)."""
    if isinstance(value, (int, float, timedelta)) and not isinstance(value, bool):
        return repr(value)
    return type(value).__name__


def _kinds(value: object, held: tuple[Any, ...] | None) -> str:
    """How a refused exception list is shown: its type, and the classes it holds or the
    types of what else it holds (`held`), never a value."""
    if held is None:
        return type(value).__name__
    inside = sorted({k.__name__ if isinstance(k, type) else type(k).__name__ for k in held})
    return f"a {type(value).__name__} of {', '.join(inside) or 'nothing'}"


def policy_of(name: str, options: Mapping[str, Any]) -> Policy:
    """The checked `Policy` of handler `name` from its keyword arguments
    (`PolicyOptions`): an `OptionsError` names an option that is not one of them, as
    it names a bad value."""
    known = [f.name for f in fields(Policy)]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise OptionsError(
            f"handler {name!r} was given options it does not take: {', '.join(unknown)} "
            f"(its options are {', '.join(known)})"
        )
    return Policy(**options).check(name)


class PolicyOptions(TypedDict, total=False):
    """A handler's policy as keyword arguments of `Queue.handler` and `Queue.handle`:
    the fields of `Policy`."""

    max_attempts: int | None
    timeout: Duration | None
    priority: int | None
    backoff: Backoff | None
    retry_on: tuple[type[BaseException], ...]
    discard_on: tuple[type[BaseException], ...]


NO_POLICY = Policy()
"""A handler's policy when it sets nothing."""


class Verdict(NamedTuple):
    """How a failed run is recorded: `status` (`queued` again or `failed`), the seconds
    before its next try, its error text, and the job's new `max_attempts` (a snooze),
    else `None`."""

    status: str
    delay: float
    error: str
    max_attempts: int | None = None


def judge(
    raised: BaseException | None,
    error: str,
    attempts: int,
    limit: int,
    policy: Policy,
    default_backoff: timedelta,
    backoff_failed: Callable[[Exception], None] | None = None,
) -> Verdict:
    """How a run that ended in failure (`error`, and what the handler `raised`, if it
    raised: a timeout raised nothing) is recorded, as `attempts` of `limit`, under the
    handler's `policy` (`backoff_failed` is told what its backoff function raised, if it
    did: see `Policy.wait`). A snooze raises the job's limit by one, up to the most an
    `integer` holds (`MAX_INTEGER`)."""
    if isinstance(raised, Snooze):
        return Verdict(
            "queued", raised.delay.total_seconds(), str(raised), min(limit + 1, MAX_INTEGER)
        )
    if isinstance(raised, Discard):
        return Verdict(
            "failed", 0.0, f"discarded: {raised.reason}" if raised.reason else "discarded"
        )
    if raised is not None and policy.discard_on and isinstance(raised, policy.discard_on):
        return Verdict("failed", 0.0, f"discarded: {error}")
    if isinstance(raised, Retry):
        wait = (
            raised.in_
            if raised.in_ is not None
            else policy.wait(attempts, default_backoff, backoff_failed)
        )
        text = f"retry requested in {wait.total_seconds():.1f} s"
        if raised.reason:
            text = f"{text}: {raised.reason}"
        if attempts < limit:
            return Verdict("queued", wait.total_seconds(), text)
        return Verdict("failed", 0.0, f"{text}, but no attempts were left")
    if raised is not None and policy.retry_on and not isinstance(raised, policy.retry_on):
        return Verdict("failed", 0.0, f"{error} (not retried: not in retry_on)")
    if attempts < limit:
        wait = policy.wait(attempts, default_backoff, backoff_failed)
        return Verdict("queued", wait.total_seconds(), error)
    return Verdict("failed", 0.0, error)
