"""Retry policies: a handler's defaults, its backoff, and `Retry`, `Snooze` and `Discard`
raised by a handler; each decision as a plain function, then through a real worker,
where fencing stays exact (every run its own attempt number)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from axa_queue import (
    Discard,
    Exponential,
    JobContext,
    JobState,
    NewJob,
    OptionsError,
    Retry,
    Snooze,
    enqueue_on,
)
from axa_queue.handlers.policies import NO_POLICY, Policy, judge
from conftest import status_of

BASE = timedelta(seconds=2)


# --- decisions, without a database --------------------------------------------------------


def test_a_failed_run_is_queued_again_with_the_queues_backoff_until_out_of_attempts() -> None:
    assert judge(None, "boom", 1, 3, NO_POLICY, BASE)[:3] == ("queued", 2.0, "boom")
    assert judge(None, "boom", 2, 3, NO_POLICY, BASE)[:3] == ("queued", 4.0, "boom")
    assert judge(None, "boom", 3, 3, NO_POLICY, BASE)[:3] == ("failed", 0.0, "boom")


def test_a_handlers_backoff_replaces_the_queues() -> None:
    fixed = Policy(backoff=7)
    assert judge(ValueError(), "boom", 1, 3, fixed, BASE).delay == 7.0
    by_attempt = Policy(backoff=lambda attempt: timedelta(minutes=attempt))
    assert judge(ValueError(), "boom", 2, 3, by_attempt, BASE).delay == 120.0


def test_retry_waits_as_asked_counts_the_attempt_and_fails_when_none_are_left() -> None:
    asked = Retry("the partner is busy", in_=timedelta(seconds=30))
    verdict = judge(asked, "Retry: ...", 1, 3, NO_POLICY, BASE)
    assert verdict == ("queued", 30.0, "retry requested in 30.0 s: the partner is busy", None)
    assert judge(Retry(), "Retry", 2, 3, NO_POLICY, BASE)[:3] == (
        "queued",
        4.0,
        "retry requested in 4.0 s",
    )
    last = judge(asked, "Retry: ...", 3, 3, NO_POLICY, BASE)
    assert last.status == "failed" and last.error.endswith("but no attempts were left")


def test_snooze_waits_and_raises_the_jobs_limit_by_one_even_on_its_last_attempt() -> None:
    verdict = judge(Snooze(timedelta(seconds=30)), "Snooze", 3, 3, NO_POLICY, BASE)
    assert verdict == ("queued", 30.0, "snoozed for 30.0 s", 4)


def test_discard_and_discard_on_fail_at_once_with_attempts_left() -> None:
    assert judge(Discard("invoice was deleted"), "x", 1, 5, NO_POLICY, BASE)[:3] == (
        "failed",
        0.0,
        "discarded: invoice was deleted",
    )
    policy = Policy(discard_on=(KeyError,)).check("X")
    verdict = judge(KeyError("gone"), "KeyError: 'gone'", 1, 5, policy, BASE)
    assert verdict[:3] == ("failed", 0.0, "discarded: KeyError: 'gone'")
    assert judge(ValueError(), "ValueError", 1, 5, policy, BASE).status == "queued"


def test_retry_on_retries_only_those_exceptions_and_timeouts() -> None:
    policy = Policy(retry_on=(TimeoutError, ConnectionError)).check("X")
    assert judge(ConnectionResetError(), "reset", 1, 5, policy, BASE).status == "queued"
    refused = judge(ValueError("bad"), "ValueError: bad", 1, 5, policy, BASE)
    assert refused[:3] == ("failed", 0.0, "ValueError: bad (not retried: not in retry_on)")
    assert judge(None, "timed out after 1 s", 1, 5, policy, BASE).status == "queued"
    both = Policy(retry_on=(LookupError,), discard_on=(KeyError,)).check("X")
    assert judge(KeyError(), "KeyError", 1, 5, both, BASE).error.startswith("discarded")


@given(
    attempt=st.integers(min_value=1, max_value=200),
    draw=st.floats(min_value=0, max_value=1, exclude_max=True),
    base=st.floats(min_value=0.001, max_value=3600),
    jitter=st.floats(min_value=0, max_value=1),
)
def test_exponential_backoff_stays_within_its_jitter_below_the_cap(
    attempt: int, draw: float, base: float, jitter: float
) -> None:
    cap = timedelta(hours=1)
    backoff = Exponential(base=base, cap=max(cap, timedelta(seconds=base)), jitter=jitter)
    pinned = Exponential(backoff.base, backoff.cap, jitter, draw=lambda: draw)
    exact = timedelta(seconds=base).total_seconds()  # a duration is kept to the microsecond
    full = min(exact * 2.0 ** (attempt - 1), max(3600.0, exact))
    wait = pinned(attempt).total_seconds()
    assert full * (1 - jitter) - 1e-6 <= wait <= full + 1e-6
    assert backoff(attempt) <= backoff.cap  # type: ignore[operator]


def test_exponential_backoff_doubles_from_its_base() -> None:
    exact = Exponential(base=timedelta(seconds=1), jitter=0)
    assert [exact(n).total_seconds() for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert exact(100) == timedelta(hours=1)
    with pytest.raises(OptionsError, match="jitter to be from 0 to 1"):
        Exponential(jitter=2)


def test_a_handlers_policy_is_checked_when_it_is_registered(make_queue: Any) -> None:
    from axa_queue import Queue

    queue = Queue()
    with pytest.raises(OptionsError, match="max_attempts of handler 'X' to be a positive"):
        queue.handle("X", lambda args: None, max_attempts=0)
    with pytest.raises(OptionsError, match="retry_on of handler 'X' to be exception classes"):
        queue.handle("X", lambda args: None, retry_on=("ValueError",))  # type: ignore[arg-type]
    handler = queue.handle("X", lambda args: None, retry_on=ValueError)  # type: ignore[arg-type]
    assert handler.policy.retry_on == (ValueError,)


# --- through a real worker ----------------------------------------------------------------


def row(admin: Any, job_id: Any) -> tuple[Any, ...]:
    found = admin.execute(
        "SELECT max_attempts, timeout_ms, priority, attempts, status, error FROM axa_queue "
        "WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert found is not None
    return tuple(found)


async def test_handler_defaults_fill_what_a_job_leaves_unset_when_it_is_queued(
    make_queue: Any, admin: Any
) -> None:
    queue = await make_queue()

    @queue.handler("Report", max_attempts=5, timeout=60, priority=3)
    async def report(args: dict[str, Any]) -> None:
        pass

    filled = await queue.enqueue("Report", {})
    own = await report.perform_later({}, max_attempts=2, priority=0, timeout=1)
    assert row(admin, filled)[:3] == (5, 60_000, 3)
    assert row(admin, own)[:3] == (2, 1_000, 0)
    with queue.sync() as jobs:
        assert row(admin, jobs.enqueue("Report"))[:3] == (5, 60_000, 3)
    async with queue.connection() as conn:
        from_handler = await enqueue_on(conn, report.job({}))
        bare = await enqueue_on(conn, NewJob("Report"))
    assert row(admin, from_handler)[:3] == (5, 60_000, 3)
    assert row(admin, bare)[:3] == (None, None, 0), "a bare NewJob on your connection: as given"


async def test_the_worker_applies_its_handlers_limit_and_timeout_to_jobs_stored_without(
    make_queue: Any, admin: Any
) -> None:
    queue = await make_queue(max_attempts=9)
    seen: list[JobContext] = []

    @queue.handler("Flaky", max_attempts=2, timeout=30)
    async def flaky(args: dict[str, Any], job: JobContext) -> None:
        seen.append(job)
        raise ValueError("flaky")

    async with queue.connection() as conn:
        job_id = await enqueue_on(conn, NewJob("Flaky"))  # stored with NULL limits
    result = await queue.drain(include_delayed=True)
    assert (result.retried, result.failed) == (1, 1)
    assert [j.max_attempts for j in seen] == [2, 2] and seen[0].deadline is not None
    assert status_of(admin, job_id) == ("failed", "ValueError: flaky", 2)


async def test_retry_snooze_and_discard_are_recorded_and_every_run_keeps_its_own_attempt(
    make_queue: Any, admin: Any
) -> None:
    queue = await make_queue(max_attempts=2)
    attempts: list[tuple[int, int]] = []

    @queue.handler("Sync")
    async def sync(args: dict[str, Any], job: JobContext) -> None:
        attempts.append((job.attempt, job.max_attempts))
        if job.attempt <= 2:
            raise Snooze(timedelta(seconds=30))
        if job.attempt == 3:
            raise Retry("the partner is busy", in_=timedelta(seconds=5))

    job_id = await queue.enqueue("Sync")
    await queue.drain()
    assert row(admin, job_id)[:] == (3, None, 0, 1, "queued", "snoozed for 30.0 s")
    info = await queue.job(job_id)
    assert info is not None and info.error == "snoozed for 30.0 s" and info.state is JobState.QUEUED
    await queue.drain(include_delayed=True)
    assert attempts == [(1, 2), (2, 3), (3, 4), (4, 4)], "each run its own attempt"
    assert row(admin, job_id)[3:5] == (4, "completed")
    assert row(admin, job_id)[0] == 4, "two snoozes: the limit rose by two"

    @queue.handler("Gone")
    async def gone(args: dict[str, Any]) -> None:
        raise Discard("the invoice was deleted")

    discarded = await queue.enqueue("Gone")
    await queue.drain()
    assert status_of(admin, discarded) == ("failed", "discarded: the invoice was deleted", 1)


async def test_a_retry_requested_says_so_and_fails_when_no_attempts_are_left(
    make_queue: Any, admin: Any
) -> None:
    queue = await make_queue(max_attempts=1)

    @queue.handler("Once")
    async def once(args: dict[str, Any]) -> None:
        raise Retry(in_=60)

    job_id = await queue.enqueue("Once")
    await queue.drain()
    assert status_of(admin, job_id) == (
        "failed",
        "retry requested in 60.0 s, but no attempts were left",
        1,
    )


async def test_retry_on_and_discard_on_decide_for_a_libraries_exceptions(
    make_queue: Any, admin: Any
) -> None:
    queue = await make_queue(max_attempts=3)

    @queue.handler("Call", retry_on=(ConnectionError,), discard_on=(PermissionError,))
    def call(args: dict[str, str]) -> None:
        raise {"reset": ConnectionResetError, "no": PermissionError, "bad": ValueError}[
            args["raise"]
        ](args["raise"])

    reset = await queue.enqueue("Call", {"raise": "reset"})
    denied = await queue.enqueue("Call", {"raise": "no"})
    bad = await queue.enqueue("Call", {"raise": "bad"})
    await queue.drain()
    assert status_of(admin, reset)[0] == "queued"
    assert status_of(admin, denied) == ("failed", "discarded: PermissionError: no", 1)
    assert status_of(admin, bad) == ("failed", "ValueError: bad (not retried: not in retry_on)", 1)


async def test_a_handlers_exponential_backoff_sets_when_the_job_runs_again(
    make_queue: Any, admin: Any
) -> None:
    queue = await make_queue(max_attempts=3)

    @queue.handler("Later", backoff=Exponential(base=timedelta(minutes=10), jitter=0))
    async def later(args: dict[str, Any]) -> None:
        raise ValueError("not yet")

    job_id = await queue.enqueue("Later")
    await queue.drain()
    waits = admin.execute(
        "SELECT EXTRACT(EPOCH FROM run_at - updated_at)::float8 FROM axa_queue WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert waits is not None and abs(waits[0] - 600) < 1
