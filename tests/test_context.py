"""A handler knows its job (`current_job()`, or a second parameter), middleware wraps
every run, and every log record made during a run carries the job's fields."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest

from axa_queue import JobContext, NotInAJobError, OptionsError, Queue, QueueOptions, current_job
from axa_queue.logs import JsonFormatter
from axa_queue.middleware import CallNext
from conftest import eventually, running, status_of

SECRET = "4111-1111-1111-1111"
"""A card number in a job's arguments: it must appear in no log line."""


@dataclass
class Receipt:
    order: int


class Seen:
    """What handlers saw, and an event set once a run has been seen."""

    def __init__(self) -> None:
        self.jobs: list[JobContext] = []
        self.threads: list[str] = []
        self.values: list[Any] = []
        self.order: list[str] = []
        self.done = asyncio.Event()


async def finished(admin, job_id: UUID, status: str = "completed") -> None:
    await eventually(lambda: status_of(admin, job_id)[0] == status)


class Lines(logging.Handler):
    """Keeps the records it is given, and their JSON lines."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.out = io.StringIO()
        self.setFormatter(JsonFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.out.write(self.format(record) + "\n")

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.getvalue().splitlines()]


@pytest.fixture
def lines() -> Any:
    """Every record of every logger (the root's), at DEBUG, for the test."""
    handler = Lines()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield handler
    root.removeHandler(handler)
    root.setLevel(level)


# --- the context -------------------------------------------------------------------------


def test_current_job_outside_a_job_raises_an_error_that_says_where_it_works() -> None:
    with pytest.raises(NotInAJobError) as raised:
        current_job()
    assert "only inside a handler" in str(raised.value)
    assert "second parameter" in str(raised.value)
    assert isinstance(raised.value, LookupError)


async def test_an_async_handler_sees_its_job_through_current_job(make_queue, admin) -> None:
    queue = await make_queue()
    seen = Seen()

    @queue.handler("Mail")
    async def mail(args: dict[str, Any]) -> None:
        seen.jobs.append(current_job())

    job_id = await queue.enqueue("Mail", {"to": SECRET}, max_attempts=4)
    async with running(queue):
        await finished(admin, job_id)
    [job] = seen.jobs
    assert (job.id, job.name, job.attempt, job.max_attempts) == (job_id, "Mail", 1, 4)
    assert job.deadline is None and not job.is_last_attempt
    assert SECRET not in repr(job)


async def test_a_sync_handler_sees_its_job_in_its_thread(make_queue, admin) -> None:
    queue = await make_queue(max_attempts=3)
    seen = Seen()

    @queue.handler("Resize")
    def resize(args: dict[str, Any]) -> None:
        seen.threads.append(threading.current_thread().name)
        seen.jobs.append(current_job())

    job_id = await queue.enqueue("Resize", {})
    async with running(queue):
        await finished(admin, job_id)
    [job] = seen.jobs
    assert seen.threads[0].startswith("axa-queue-job")
    assert (job.id, job.name, job.attempt, job.max_attempts) == (job_id, "Resize", 1, 3)


async def test_a_handler_with_a_second_parameter_is_given_its_job(make_queue, admin) -> None:
    queue = await make_queue()
    seen = Seen()

    @queue.handler("Send")
    async def send(args: Receipt, job: JobContext) -> None:
        seen.values.append(args)
        seen.jobs.append(job)
        assert job is current_job()

    @queue.handler("SendSync")
    def send_sync(args: dict[str, Any], job: JobContext) -> None:
        seen.jobs.append(job)

    @queue.handler("One")
    def one(args: dict[str, Any], retries: int = 5) -> None:  # a default: not the job
        seen.values.append(retries)

    first = await queue.enqueue("Send", Receipt(order=7))
    second = await queue.enqueue("SendSync", {})
    third = await queue.enqueue("One", {})
    assert (send.takes_job, send_sync.takes_job, one.takes_job) == (True, True, False)
    async with running(queue):
        for job_id in (first, second, third):
            await finished(admin, job_id)
    assert Receipt(order=7) in seen.values and 5 in seen.values
    assert sorted(job.name for job in seen.jobs) == ["Send", "SendSync"]
    assert {job.id for job in seen.jobs} == {first, second}


async def test_the_last_try_knows_it_is_the_last(make_queue, admin) -> None:
    queue = await make_queue()
    seen = Seen()

    @queue.handler("Flaky")
    def flaky(args: dict[str, Any], job: JobContext) -> None:
        seen.jobs.append(job)
        raise RuntimeError("still down")

    job_id = await queue.enqueue("Flaky", {}, max_attempts=3)
    async with running(queue):
        await finished(admin, job_id, "failed")
    assert [(j.attempt, j.is_last_attempt) for j in seen.jobs] == [
        (1, False),
        (2, False),
        (3, True),
    ]


async def test_a_job_with_a_timeout_has_a_deadline_in_utc(make_queue, admin) -> None:
    queue = await make_queue()
    seen = Seen()

    @queue.handler("Timed")
    async def timed(args: dict[str, Any]) -> None:
        seen.jobs.append(current_job())

    before = datetime.now(timezone.utc)
    job_id = await queue.enqueue("Timed", {}, timeout=600)
    async with running(queue):
        await finished(admin, job_id)
    deadline = seen.jobs[0].deadline
    assert deadline is not None and deadline.tzinfo is not None
    assert (
        before + timedelta(seconds=590)
        < deadline
        <= datetime.now(timezone.utc) + timedelta(seconds=600)
    )


async def test_an_inline_run_gets_a_job_of_its_own(make_queue) -> None:
    queue = await make_queue(mode="inline", max_attempts=2)
    seen = Seen()

    @queue.handler("Inline")
    def inline(args: dict[str, Any], job: JobContext) -> None:
        seen.jobs.append(job)
        seen.jobs.append(current_job())

    run_id = await inline.perform_later({})  # the inline run's id, which no row has
    first, same = seen.jobs
    assert (
        first is same
        and first.id == run_id
        and (first.attempt, first.max_attempts, first.name) == (1, 2, "Inline")
    )
    with pytest.raises(NotInAJobError):
        current_job()

    @queue.handler("Direct")
    def direct(args: dict[str, Any], job: JobContext) -> UUID:
        return job.id

    assert direct({}) != first.id  # called directly: a fresh job as its second argument


async def test_a_background_run_gets_a_job_of_its_own_in_its_task(make_queue) -> None:
    queue = await make_queue(mode="background")
    seen = Seen()

    @queue.handler("Later")
    async def later(args: dict[str, Any]) -> None:
        seen.jobs.append(current_job())
        seen.done.set()

    run_id = await later.perform_later({})
    await asyncio.wait_for(seen.done.wait(), 10)
    [job] = seen.jobs
    assert (job.id, job.name, job.attempt) == (run_id, "Later", 1)
    with pytest.raises(NotInAJobError):
        current_job()  # the caller's context is untouched


# --- middleware --------------------------------------------------------------------------


async def test_middleware_wraps_async_and_sync_runs_the_first_registered_outermost(
    make_queue, admin
) -> None:
    queue = await make_queue()
    seen = Seen()

    @queue.middleware
    async def outer(job: JobContext, call_next: CallNext) -> Any:
        seen.order.append(f"outer in {job.name}")
        value = await call_next()
        seen.order.append(f"outer out {job.name} {value}")
        return value

    @queue.middleware
    async def inner(job: JobContext, call_next: CallNext) -> Any:
        assert current_job() is job
        seen.order.append(f"inner in {job.name}")
        return await call_next()

    @queue.handler("Async")
    async def run_async(args: dict[str, Any]) -> int:
        seen.order.append("async handler")
        return 41

    @queue.handler("Sync")
    def run_sync(args: dict[str, Any]) -> str:
        seen.order.append(f"sync handler {current_job().name}")
        return "done"

    first = await queue.enqueue("Async", {})
    async with running(queue):
        await finished(admin, first)
        second = await queue.enqueue("Sync", {})
        await finished(admin, second)
    assert seen.order == [
        "outer in Async",
        "inner in Async",
        "async handler",
        "outer out Async 41",
        "outer in Sync",
        "inner in Sync",
        "sync handler Sync",
        "outer out Sync done",
    ]


async def test_what_a_middleware_raises_fails_the_run_and_the_job_is_retried(
    make_queue, admin, lines: Lines
) -> None:
    queue = await make_queue()
    seen = Seen()

    @queue.middleware
    async def refuse_first(job: JobContext, call_next: CallNext) -> Any:
        if job.attempt == 1:
            raise PermissionError("rate limited")
        return await call_next()

    @queue.handler("Guarded")
    def guarded(args: dict[str, Any], job: JobContext) -> None:
        seen.jobs.append(job)

    job_id = await queue.enqueue("Guarded", {}, max_attempts=2)
    async with running(queue):
        await finished(admin, job_id)
    assert [job.attempt for job in seen.jobs] == [2]  # the first never reached the handler
    assert status_of(admin, job_id)[::2] == ("completed", 2)
    [retried] = [e for e in lines.events() if e["message"].startswith("job failed, will retry:")]
    assert retried["error"] == "PermissionError: rate limited" and retried["attempt"] == 1


async def test_a_middleware_that_catches_a_failure_completes_the_run(make_queue, admin) -> None:
    queue = await make_queue()

    @queue.middleware
    async def swallow(job: JobContext, call_next: CallNext) -> Any:
        try:
            return await call_next()
        except ValueError:
            return None

    @queue.handler("Bad")
    async def bad(args: dict[str, Any]) -> None:
        raise ValueError("a known, harmless failure")

    job_id = await queue.enqueue("Bad", {})
    async with running(queue):
        await finished(admin, job_id)


async def test_the_timeout_applies_around_the_whole_chain(make_queue, admin) -> None:
    queue = await make_queue()
    seen = Seen()

    @queue.middleware
    async def slow(job: JobContext, call_next: CallNext) -> Any:
        try:
            await asyncio.Event().wait()  # never set: only the timeout ends it
        except asyncio.CancelledError:
            seen.order.append("cancelled in the middleware")
            raise
        return await call_next()

    @queue.handler("Never")
    async def never(args: dict[str, Any]) -> None:
        seen.order.append("handler")

    job_id = await queue.enqueue("Never", {}, timeout=0.2)
    async with running(queue):
        await finished(admin, job_id, "failed")
    assert status_of(admin, job_id)[1] == "timed out after 0.2 s"
    assert seen.order == ["cancelled in the middleware"]


def test_a_middleware_must_be_an_async_function() -> None:
    queue = Queue()

    def plain(job: JobContext, call_next: CallNext) -> Any:
        return call_next()

    with pytest.raises(OptionsError, match="expected a middleware to be an async function"):
        queue.middleware(plain)  # type: ignore[arg-type]
    assert queue.registry.middleware == []


async def test_calling_call_next_twice_fails_the_run_saying_why(make_queue, admin) -> None:
    queue = await make_queue()

    @queue.middleware
    async def twice(job: JobContext, call_next: CallNext) -> Any:
        await call_next()
        return await call_next()

    @queue.handler("Once")
    async def once(args: dict[str, Any]) -> None:
        pass

    job_id = await queue.enqueue("Once", {})
    async with running(queue):
        await finished(admin, job_id, "failed")
    assert "call_next() was called twice" in (status_of(admin, job_id)[1] or "")


# --- logs --------------------------------------------------------------------------------


async def test_a_third_party_loggers_records_carry_the_job_in_async_and_sync_handlers(
    make_queue, admin, lines: Lines
) -> None:
    queue = await make_queue()
    library = logging.getLogger("cardlib.client")

    @queue.handler("AsyncCharge")
    async def charge(args: dict[str, Any]) -> None:
        library.info("charging a card")

    @queue.handler("SyncCharge")
    def charge_sync(args: dict[str, Any]) -> None:
        library.info("charging a card in a thread")
        # axa-queue's own lines name their job themselves (here another one): no clash
        logging.getLogger("axa_queue.maintenance").info("recovered", extra={"job_id": "other"})

    first = await queue.enqueue("AsyncCharge", {"card": SECRET})
    second = await queue.enqueue("SyncCharge", {"card": SECRET})
    async with running(queue):
        await finished(admin, first)
        await finished(admin, second)
    said = {r.getMessage(): r for r in lines.records if r.name == "cardlib.client"}
    for message, job_id, name in (
        ("charging a card", first, "AsyncCharge"),
        ("charging a card in a thread", second, "SyncCharge"),
    ):
        record: Any = said[message]
        assert (record.job_id, record.job_name, record.job_attempt) == (str(job_id), name, 1)
    events = [e for e in lines.events() if e["logger"] == "cardlib.client"]
    assert {(e["job_id"], e["job_name"], e["job_attempt"]) for e in events} == {
        (str(first), "AsyncCharge", 1),
        (str(second), "SyncCharge", 1),
    }
    [ours] = [r for r in lines.records if r.getMessage() == "recovered"]
    assert ours.job_id == "other" and not hasattr(ours, "job_name")  # type: ignore[attr-defined]
    outside = logging.getLogger("cardlib.client").makeRecord("x", logging.INFO, "", 0, "", (), None)
    assert not hasattr(outside, "job_id")  # outside a run, nothing is added
    assert SECRET not in lines.out.getvalue()


async def test_a_completed_run_is_logged_at_debug_with_its_duration(
    make_queue, admin, lines: Lines
) -> None:
    queue = await make_queue()

    @queue.handler("Quick")
    async def quick(args: dict[str, Any]) -> None:
        pass

    job_id = await queue.enqueue("Quick", {"card": SECRET})
    async with running(queue):
        await finished(admin, job_id)
    [event] = [e for e in lines.events() if e["message"].startswith("job completed:")]
    assert event["level"] == "debug" and event["job_id"] == str(job_id)
    assert event["job"] == "Quick" and event["attempt"] == 1
    assert isinstance(event["duration"], float) and event["duration"] >= 0
    assert SECRET not in lines.out.getvalue()


async def test_a_failed_runs_line_carries_its_traceback_only_when_asked(
    make_queue, admin, lines: Lines
) -> None:
    for asked in (False, True):
        queue = await make_queue(log_tracebacks=asked)

        @queue.handler("Broken")
        def broken(args: dict[str, Any]) -> None:
            raise KeyError("missing_setting")

        job_id = await queue.enqueue("Broken", {"card": SECRET})
        async with running(queue):
            await finished(admin, job_id, "failed")
        [event] = [
            e
            for e in lines.events()
            if e["message"].startswith("job failed:") and e["job_id"] == str(job_id)
        ]
        assert event["error"] == "KeyError: 'missing_setting'"
        if asked:
            assert event["exception"].startswith("Traceback (most recent call last):")
            assert 'raise KeyError("missing_setting")' in event["exception"]
        else:
            assert "exception" not in event
    assert SECRET not in lines.out.getvalue()


def test_log_tracebacks_must_be_true_or_false() -> None:
    with pytest.raises(OptionsError, match="expected log_tracebacks to be True or False"):
        QueueOptions(log_tracebacks="yes")  # type: ignore[arg-type]
