"""One bad value stops no one else: limits, counts and durations past what the tables and
statements hold are refused where they are given, and a value that reaches the
worker's shared statements anyway (written to the tables or the registry by hand)
fails, skips or clamps only its own job or name, logged once, while every other job
runs. A user callback that raises on the way of a run never ends the loop running it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from axa_queue import NewJob, OptionsError, Queue, QueueOptions, Snooze, current_job
from axa_queue.limits import MAX_RATE
from axa_queue.options import MAX_DURATION, MAX_INTEGER
from axa_queue.worker import Worker, decisions
from axa_queue.worker.exchange import Exchange
from axa_queue.worker.run import RunPhase
from axa_queue.worker.state import State
from axa_queue.worker.tasks import pause
from conftest import eventually, running, status_of

SECRET = "943 476 5919"
"""A value that must never show in a message."""

REFUSE = """
CREATE TABLE refused (id UUID NOT NULL, status TEXT NOT NULL);
CREATE FUNCTION refuse_ending() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM refused WHERE id = NEW.id AND status = NEW.status) THEN
        RAISE EXCEPTION 'refused by the test' USING ERRCODE = 'numeric_value_out_of_range';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER refuse_ending BEFORE UPDATE OF status ON axa_queue
    FOR EACH ROW WHEN (NEW.status <> OLD.status) EXECUTE FUNCTION refuse_ending();
"""
"""A stand-in for a value PostgreSQL cannot take: the update of a listed job to a listed
status fails with a data error, as a value out of range would."""


def refuse(admin: psycopg.Connection[Any], job_id: uuid.UUID, *statuses: str) -> None:
    """Make every write of `job_id`'s ending as one of `statuses` fail (`REFUSE`)."""
    if admin.execute("SELECT to_regclass('refused')").fetchone() == (None,):
        admin.execute(REFUSE)
    for status in statuses:
        admin.execute("INSERT INTO refused VALUES (%s, %s)", (job_id, status))


def insert(admin: psycopg.Connection[Any], name: str, **columns: Any) -> uuid.UUID:
    """Queue a job of `name` by hand, with `columns` as given (values the API refuses)."""
    job_id = uuid.uuid4()
    names = ["id", "name", "args", *columns]
    admin.execute(
        f"INSERT INTO axa_queue ({', '.join(names)}) "  # noqa: S608 - the test's own names
        f"VALUES ({', '.join(['%s'] * len(names))})",
        (job_id, name, "{}", *columns.values()),
    )
    return job_id


def completed(admin: psycopg.Connection[Any], *ids: uuid.UUID) -> Any:
    def check() -> bool:
        return all(status_of(admin, one)[0] == "completed" for one in ids)

    return check


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The messages of the worker's records at ERROR and above."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "axa_queue.worker" and r.levelno >= logging.ERROR
    ]


# --- refused where they are given ----------------------------------------------------


def test_limits_past_what_the_claim_can_hold_are_refused_naming_the_option_and_the_bound() -> None:
    queue = Queue("postgresql://unused")
    for scope in ("process", "global"):
        with pytest.raises(OptionsError, match=f"limit of job 'Call'.* at most {MAX_INTEGER}"):
            queue.limit("Call", 2**31, scope=scope)  # type: ignore[arg-type]
    for jobs in (MAX_RATE + 1, 2**31):
        with pytest.raises(OptionsError, match=f"rate limit of job 'Call'.* at most {MAX_RATE}"):
            queue.rate_limit("Call", jobs, per=timedelta(seconds=1))
    for per in (timedelta(days=3_652_500), timedelta.max):
        with pytest.raises(OptionsError, match=r"per= of the rate limit.* at most 36525 days"):
            queue.rate_limit("Call", 2, per=per)
    queue.limit("Call", MAX_INTEGER, scope="global")
    queue.rate_limit("Call", MAX_RATE, per=MAX_DURATION)
    assert queue.registry.limits.rate["Call"] == (MAX_RATE, 36525 * 86_400_000)


def test_counts_of_the_queue_options_past_an_integer_are_refused_naming_the_bound() -> None:
    for name in ("workers", "max_attempts", "pool_size", "prefetch"):
        with pytest.raises(OptionsError, match=f"expected {name} .*at most {MAX_INTEGER}"):
            QueueOptions(**{name: 2**31})
    assert QueueOptions(max_attempts=MAX_INTEGER).max_attempts == MAX_INTEGER


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"discard_on": 5}, "discard_on of handler 'X' to be exception classes.*got: int"),
        ({"retry_on": 5}, "retry_on of handler 'X' to be exception classes.*got: int"),
        ({"retry_on": (SECRET,)}, "retry_on of handler 'X'.*got: a tuple of str"),
        (
            {"discard_on": [ValueError, SECRET]},
            "discard_on of handler 'X'.*a list of ValueError, str",
        ),
        (
            {"max_attempts": SECRET},
            "max_attempts of handler 'X' to be a positive integer.*got: str",
        ),
        ({"max_attempts": 2**31}, f"max_attempts of handler 'X'.* to {MAX_INTEGER}, got: {2**31}"),
        ({"priority": SECRET}, "priority of handler 'X' to be an integer from -32768 to 32767"),
        ({"timeout": SECRET}, "timeout of handler 'X' to be a timedelta.*36525 days, got: str"),
        ({"timeout": timedelta.max}, "timeout of handler 'X'.* at most 36525 days"),
        ({"timeout": 0}, "timeout of handler 'X'.* more than zero"),
        ({"backoff": SECRET}, "backoff of handler 'X' to be a timedelta.*function.*got: str"),
        ({"backoff": -1}, "backoff of handler 'X'.* zero or more"),
        ({"max_attempt": 3}, "handler 'X' was given options it does not take: max_attempt"),
    ],
)
def test_a_handler_option_of_the_wrong_kind_or_past_its_bound_is_refused_naming_the_handler_and_the_field(
    options: dict[str, Any], says: str
) -> None:
    queue = Queue("postgresql://unused")
    with pytest.raises(OptionsError, match=says) as refused:
        queue.handle("X", lambda args: None, **options)
    assert SECRET not in str(refused.value)
    assert "X" not in queue.handlers


def test_exception_lists_are_taken_as_a_class_or_any_collection_of_classes() -> None:
    queue = Queue("postgresql://unused")
    handler = queue.handle(
        "X",
        lambda args: None,
        retry_on=ValueError,  # type: ignore[arg-type]
        discard_on=[KeyError, TypeError],  # type: ignore[arg-type]
    )
    assert handler.policy.retry_on == (ValueError,)
    assert handler.policy.discard_on == (KeyError, TypeError)


# --- values past the bounds that reach the shared statements anyway -------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"global": 2**31},
        {"rate": (2**31, 1000)},
        {"rate": (2, 10_000 * 365 * 86_400_000)},  # a window of 10,000 years
        {"rate": (2, timedelta.max // timedelta(milliseconds=1))},
    ],
    ids=["global limit 2**31", "rate 2**31", "per 10,000 years", "per timedelta.max"],
)
async def test_a_limit_past_its_bound_written_to_the_registry_by_hand_is_clamped_and_stops_no_other_name(
    make_queue, admin, caplog, bad: dict[str, Any]
) -> None:
    queue = await make_queue()

    @queue.handler("Ok")
    async def ok(args: Any) -> None:
        pass

    @queue.handler("Bad")
    async def bad_one(args: Any) -> None:
        pass

    if "global" in bad:
        queue.registry.limits.global_["Bad"] = bad["global"]
    else:
        queue.registry.limits.rate["Bad"] = bad["rate"]
    jobs = [await queue.enqueue("Bad", {}), await queue.enqueue("Ok", {})]
    async with running(queue):
        await eventually(completed(admin, *jobs))
    assert errors(caplog) == []


@pytest.mark.parametrize(
    "bad",
    [{"global": 1.5}, {"rate": (1.5, 1000)}, {"rate": (1, 1.5)}],
    ids=["global limit 1.5", "rate 1.5", "per_ms 1.5"],
)
async def test_a_limit_the_claim_cannot_read_skips_its_name_once_logged_while_the_others_run(
    make_queue, admin, caplog, bad: dict[str, Any]
) -> None:
    caplog.set_level(logging.INFO, "axa_queue.worker")
    queue = await make_queue()

    @queue.handler("Ok")
    async def ok(args: Any) -> None:
        pass

    @queue.handler("Bad")
    async def bad_one(args: Any) -> None:
        pass

    if "global" in bad:
        queue.registry.limits.global_["Bad"] = bad["global"]
    else:
        queue.registry.limits.rate["Bad"] = bad["rate"]
    skipped = await queue.enqueue("Bad", {})
    first = await queue.enqueue("Ok", {})
    async with running(queue):
        await eventually(completed(admin, first))
        later = await queue.enqueue("Ok", {})
        await eventually(completed(admin, later))
        assert status_of(admin, skipped)[0] == "queued"
        (said,) = errors(caplog)
        assert said.startswith("could not claim jobs of Bad: a value of its limits or of one ")
        assert said.endswith("; left out of claims for 60 s, the other names are claimed as usual")
        told = next(r for r in caplog.records if r.getMessage().startswith("could not claim"))
        assert told.job == "Bad"  # type: ignore[attr-defined]
        ok_now, why = await queue.health(stuck_after=0)
        assert not ok_now and "failed to claim jobs named 'Bad'" in why
        # Put right, the name is claimed again once its time out is up.
        if "global" in bad:
            queue.registry.limits.global_["Bad"] = 1
        else:
            queue.registry.limits.rate["Bad"] = (1, 1000)
        assert queue.worker is not None
        queue.worker.exchange.skips.skipped["Bad"] = (0.0, 0.0, "")  # its time is up now
        queue.worker.state.wake()
        await eventually(completed(admin, skipped))
        assert await queue.health(stuck_after=0) == (True, "ok")
    assert "jobs of Bad are claimed again" in [r.getMessage() for r in caplog.records]


async def test_a_snooze_of_a_job_at_the_most_attempts_an_integer_holds_is_queued_again(
    make_queue, admin, caplog
) -> None:
    queue = await make_queue()
    runs: list[int] = []

    @queue.handler("Patient")
    async def patient(args: Any) -> None:
        runs.append(current_job().attempt)
        if len(runs) == 1:
            raise Snooze(0)

    @queue.handler("Ok")
    async def ok(args: Any) -> None:
        pass

    snoozed = await queue.enqueue("Patient", {}, max_attempts=MAX_INTEGER)
    other = await queue.enqueue("Ok", {})
    async with running(queue):
        await eventually(completed(admin, snoozed, other))
    assert runs == [1, 2]
    assert admin.execute(
        "SELECT max_attempts FROM axa_queue WHERE id = %s", (snoozed,)
    ).fetchone() == (MAX_INTEGER,)
    assert errors(caplog) == []


async def test_a_job_at_the_most_attempts_an_integer_holds_is_failed_once_logged_and_its_name_runs_on(
    make_queue, admin, caplog
) -> None:
    queue = await make_queue()

    @queue.handler("Ok")
    async def ok(args: Any) -> None:
        pass

    @queue.handler("Other")
    async def other(args: Any) -> None:
        pass

    stuck = insert(admin, "Ok", attempts=MAX_INTEGER, run_at="-infinity")  # claimed first
    same = await queue.enqueue("Ok", {})
    another = await queue.enqueue("Other", {})
    async with running(queue):
        await eventually(completed(admin, same, another))
    assert status_of(admin, stuck) == (
        "failed",
        "its attempts are at the most a job can count (2147483647): no claim can take it again",
        MAX_INTEGER,
    )
    (said,) = errors(caplog)
    assert said.startswith("job failed: ") and f" {stuck} (attempt {MAX_INTEGER}): " in said
    assert said.endswith(
        "its attempts are at the most a job can count (2147483647), so no claim can take it again"
    )


async def test_jobs_due_at_minus_or_plus_infinity_written_by_hand_fail_no_claim(
    make_queue, admin, caplog
) -> None:
    queue = await make_queue()

    @queue.handler("Ok")
    async def ok(args: Any) -> None:
        pass

    first = insert(admin, "Ok", run_at="-infinity")
    never = insert(admin, "Ok", run_at="infinity")
    other = await queue.enqueue("Ok", {})
    async with running(queue):
        await eventually(completed(admin, first, other))
    assert status_of(admin, never)[0] == "queued"
    assert errors(caplog) == []


async def test_a_time_limit_of_thousands_of_years_written_by_hand_runs_with_no_deadline(
    make_queue, admin, caplog
) -> None:
    queue = await make_queue()
    deadlines: list[Any] = []

    @queue.handler("Ok")
    async def ok(args: Any) -> None:
        deadlines.append(current_job().deadline)

    job = insert(admin, "Ok", timeout_ms=9_000_000_000_000_000)  # 285,000 years
    async with running(queue):
        await eventually(completed(admin, job))
    assert deadlines == [None]
    assert errors(caplog) == []


async def test_a_time_limit_of_zero_or_less_written_by_hand_is_no_time_limit(
    make_queue, admin, caplog
) -> None:
    queue = await make_queue()
    deadlines: list[Any] = []

    @queue.handler("Ok")
    async def ok(args: Any) -> None:
        await asyncio.sleep(0.01)
        deadlines.append(current_job().deadline)

    jobs = [insert(admin, "Ok", timeout_ms=ms) for ms in (0, -1, -(2**63))]
    async with running(queue):
        await eventually(completed(admin, *jobs))
    assert deadlines == [None, None, None]
    assert errors(caplog) == []


async def test_a_rate_slot_stamped_at_infinity_by_hand_keeps_that_slot_busy_and_fails_no_claim(
    make_queue, admin, caplog
) -> None:
    queue = await make_queue()
    queue.rate_limit("Bad", 2, per=timedelta(milliseconds=100))

    @queue.handler("Bad")
    async def bad_one(args: Any) -> None:
        pass

    @queue.handler("Ok")
    async def ok(args: Any) -> None:
        pass

    admin.execute("INSERT INTO axa_rate_slots (name, slot, at) VALUES ('Bad', 0, 'infinity')")
    jobs = [await queue.enqueue("Bad", {}), await queue.enqueue("Bad", {})]
    other = await queue.enqueue("Ok", {})
    async with running(queue):
        await eventually(completed(admin, other, *jobs))
    assert admin.execute(
        "SELECT at = 'infinity' FROM axa_rate_slots WHERE name = 'Bad' AND slot = 0"
    ).fetchone() == (True,)
    assert errors(caplog) == []


async def test_a_stop_gives_back_a_job_claimed_ahead_at_the_most_attempts_with_the_others(
    make_queue, admin
) -> None:
    queue = await make_queue(workers=1, prefetch=3, shutdown_grace=0.2)
    started = asyncio.Event()

    @queue.handler("Forever")
    async def forever(args: Any) -> None:
        started.set()
        await asyncio.sleep(3600)

    await queue.enqueue("Forever", {}, priority=1)
    await queue.enqueue_all(
        [NewJob("Forever", {}, max_attempts=MAX_INTEGER), NewJob("Forever", {})]
    )
    stop = asyncio.Event()
    task = asyncio.create_task(queue.run(stop))
    await eventually(
        lambda: (
            admin.execute("SELECT count(*) FROM axa_queue WHERE status = 'running'").fetchone()
            == (3,)
        )
    )
    await asyncio.wait_for(started.wait(), 15)
    stop.set()
    await asyncio.wait_for(task, 15)
    assert admin.execute(
        "SELECT status, max_attempts, given_back FROM axa_queue WHERE status = 'queued' "
        "ORDER BY max_attempts"
    ).fetchall() == [("queued", 2, 1), ("queued", MAX_INTEGER, 1)]


async def test_stale_recovery_gives_back_a_job_at_the_most_attempts_with_the_others(
    make_queue, admin
) -> None:
    queue = await make_queue()
    ids = [
        insert(admin, "Report", status="running", attempts=1, ahead=1, max_attempts=limit,
               started_at="2000-01-01", updated_at="2000-01-01")
        for limit in (MAX_INTEGER, 3)
    ]  # fmt: skip
    recovered = await queue.recover_stale()
    assert {one.id for one in recovered} == set(ids)
    assert admin.execute(
        "SELECT status, max_attempts, given_back FROM axa_queue ORDER BY max_attempts"
    ).fetchall() == [("queued", 4, 1), ("queued", MAX_INTEGER, 1)]


# --- an ending that cannot be recorded --------------------------------------------------


async def test_an_ending_that_cannot_be_recorded_fails_its_job_once_logged_while_the_others_are_recorded(
    make_queue, admin, caplog
) -> None:
    queue = await make_queue(workers=2)

    @queue.handler("Ok")
    async def ok(args: Any) -> str:
        return "done"

    bad = await queue.enqueue("Ok", {})
    refuse(admin, bad, "completed")
    others = [await queue.enqueue("Ok", {}) for _ in range(5)]
    async with running(queue):
        await eventually(completed(admin, *others))
        await eventually(lambda: status_of(admin, bad)[0] == "failed")
    assert status_of(admin, bad)[1] == (
        "the worker could not record how this run ended (refused by the test), so it failed "
        "the job instead (the run ended as completed)"
    )
    (said,) = errors(caplog)
    assert said.startswith(
        f"could not record how a run ended; its job is failed instead: Ok {bad} (attempt 1): "
    )
    told = next(r for r in caplog.records if r.getMessage().startswith("could not record how"))
    assert told.job_id == str(bad)  # type: ignore[attr-defined]


async def test_an_ending_that_cannot_even_be_failed_is_kept_claimed_apart_and_recorded_once_it_can(
    make_queue, admin, caplog, monkeypatch
) -> None:
    monkeypatch.setattr(decisions, "RETRY_APART", 0.05)
    queue = await make_queue(workers=2)

    @queue.handler("Ok")
    async def ok(args: Any) -> None:
        pass

    bad = await queue.enqueue("Ok", {})
    refuse(admin, bad, "completed", "failed")
    async with running(queue):
        await eventually(lambda: queue.worker is not None)
        assert queue.worker is not None
        state = queue.worker.state
        await eventually(lambda: len(state.apart) == 1)
        later = [await queue.enqueue("Ok", {}) for _ in range(3)]
        await eventually(completed(admin, *later))
        # Kept claimed: its heartbeats go on, and the health check says what is wrong.
        beat = admin.execute("SELECT updated_at FROM axa_queue WHERE id = %s", (bad,)).fetchone()
        await eventually(
            lambda: (
                admin.execute("SELECT updated_at FROM axa_queue WHERE id = %s", (bad,)).fetchone()
                != beat
            )
        )
        assert status_of(admin, bad)[0] == "running"
        ok_now, why = await queue.health(stuck_after=0)
        assert not ok_now and "failed to record how 1 run ended" in why
        admin.execute("DELETE FROM refused")
        await eventually(lambda: status_of(admin, bad)[0] == "failed")
        await eventually(lambda: not state.apart)
        assert await queue.health(stuck_after=0) == (True, "ok")
    (said,) = errors(caplog)
    assert said.startswith(
        f"could not record how a run ended, nor fail its job: Ok {bad} (attempt 1): "
    )
    assert said.endswith(
        "; trying again on its own, while its claim is kept (stale recovery "
        "queues the job again if the worker stops first)"
    )


async def test_the_run_at_fault_among_many_endings_is_found_in_halves_and_a_run_that_lost_its_claim_stays_fenced(
    make_queue, admin, monkeypatch
) -> None:
    queue = await make_queue()

    @queue.handler("Ok")
    async def ok(args: Any) -> None:
        pass

    jobs = [await queue.enqueue("Ok", {"n": n}) for n in range(16)]
    worker = Worker(queue.registry, queue.connector, None, identity="test")
    exchange = worker.exchange
    claimed, _ = await exchange.send([], 16, [{"name": "Ok", "cap": 16}], [], 16)
    assert len(claimed) == 16
    at_fault, replaced = claimed[5], claimed[11]
    refuse(admin, uuid.UUID(at_fault.id), "completed")
    for one in claimed:
        one.phase = RunPhase.ENDED  # as if their handlers ran
    batch = [one.end("completed") for one in claimed]
    with pytest.raises(psycopg.DataError):
        await exchange.send(batch, 0, [])
    # Meanwhile another worker took one of the runs' claims (its attempt is now 2).
    admin.execute("UPDATE axa_queue SET attempts = 2 WHERE id = %s", (replaced.id,))
    sent: list[int] = []
    send = Exchange.send

    async def counted(self: Exchange, batch: list[Any], *rest: Any) -> Any:
        sent.append(len(batch))
        return await send(self, batch, *rest)

    monkeypatch.setattr(Exchange, "send", counted)
    assert await exchange.isolate(batch, [], [], 0, 0, psycopg.DataError()) == 0
    await asyncio.gather(*worker.claims.tasks)
    assert batch == [], "every ending was recorded, failed instead, or lost"
    assert len(sent) <= 2 * 4 + 2, f"halves, not one by one: {sent}"
    statuses = {job: status_of(admin, job) for job in jobs}
    assert statuses.pop(uuid.UUID(at_fault.id))[0] == "failed"
    # The lost run's ending never wrote over its replacement: MARK_LOST sent it to review.
    assert statuses.pop(uuid.UUID(replaced.id)) == (
        "needs_review",
        "stopped: it finished after another worker or recovery took its claim",
        2,
    )
    assert set(statuses.values()) == {("completed", None, 1)}
    assert worker.stats["completed"] == 14 and worker.stats["failed"] == 1
    await worker.connections.close()


async def test_the_statement_clamps_a_delay_past_100_years_and_a_limit_past_an_integer(
    make_queue, admin
) -> None:
    queue = await make_queue()

    @queue.handler("Ok")
    async def ok(args: Any) -> None:
        pass

    await queue.enqueue_all(NewJob("Ok", {}, max_attempts=5) for _ in range(2))
    worker = Worker(queue.registry, queue.connector, None, identity="test")
    claimed, _ = await worker.exchange.send([], 2, [{"name": "Ok", "cap": 2}], [], 2)
    late, raised = claimed
    late.end("queued", "later", 1e300)
    raised.end("queued", "snoozed", 0.0, 2**40)
    _, kept = await worker.exchange.send([late, raised], 0, [])
    assert kept is None, "both endings recorded"
    years = admin.execute(
        "SELECT extract(epoch FROM run_at - now()) / 86400 FROM axa_queue WHERE id = %s",
        (late.id,),
    ).fetchone()
    assert years is not None and 36524 < float(years[0]) <= 36525
    assert admin.execute(
        "SELECT max_attempts FROM axa_queue WHERE id = %s", (raised.id,)
    ).fetchone() == (MAX_INTEGER,)
    await worker.connections.close()


async def test_a_statement_that_goes_through_is_sent_once_with_no_isolation(
    make_queue, admin, monkeypatch
) -> None:
    sent: list[int] = []
    send = Exchange.send

    async def counted(self: Exchange, batch: list[Any], *rest: Any) -> Any:
        sent.append(len(batch))
        return await send(self, batch, *rest)

    async def never(self: Exchange, *args: Any) -> int:
        raise AssertionError("isolated without a failure")

    monkeypatch.setattr(Exchange, "send", counted)
    monkeypatch.setattr(Exchange, "isolate", never)
    queue = await make_queue(workers=1, prefetch=0)

    @queue.handler("Ok")
    async def ok(args: Any) -> None:
        pass

    job = await queue.enqueue("Ok", {})
    async with running(queue):
        await eventually(completed(admin, job))
    assert sent[:2] == [0, 1], "one claim, then one statement with the ending"


# --- user callbacks on the way of a run ---------------------------------------------------


async def test_a_backoff_that_raises_falls_back_to_the_queues_retry_backoff_once_logged(
    make_queue, admin, caplog
) -> None:
    queue = await make_queue()

    def broken(attempt: int) -> timedelta:
        raise ZeroDivisionError(SECRET)

    @queue.handler("Flaky", max_attempts=3, backoff=broken)
    async def flaky(args: Any) -> None:
        raise ValueError("no")

    job = await queue.enqueue("Flaky", {})
    result = await queue.drain()
    assert (result.retried, result.failed) == (1, 0)
    assert status_of(admin, job) == ("queued", "ValueError: no", 1)
    waits = admin.execute(
        "SELECT extract(epoch FROM run_at - updated_at) FROM axa_queue WHERE id = %s", (job,)
    ).fetchone()
    assert waits is not None and float(waits[0]) == pytest.approx(0.05)  # retry_backoff
    (said,) = errors(caplog)
    assert said.startswith(f"the handler's backoff failed: Flaky {job} (attempt 1): ")
    assert said.endswith("; the job waits the queue's retry_backoff instead")


class Raising(type):
    """A metaclass whose classes cannot be tested against: `isinstance` raises."""

    def __instancecheck__(cls, instance: object) -> bool:
        raise RuntimeError("cannot tell")


class Untestable(Exception, metaclass=Raising):
    pass


async def test_a_loop_whose_run_raised_past_every_guard_goes_on_records_the_try_and_health_says_so(
    make_queue, admin, caplog
) -> None:
    queue = await make_queue(workers=1)

    @queue.handler("Odd", discard_on=(Untestable,))
    async def odd(args: Any) -> None:
        raise ValueError("no")

    @queue.handler("Ok")
    async def ok(args: Any) -> None:
        pass

    failing = await queue.enqueue("Odd", {}, priority=1)
    after = await queue.enqueue("Ok", {})
    async with running(queue):
        await eventually(completed(admin, after))
        await eventually(lambda: status_of(admin, failing)[0] == "failed")
        ok_now, why = await queue.health()
        assert not ok_now and why.startswith("a job loop failed") and "RuntimeError" in why
        assert queue.worker is not None and queue.worker.stats["loop_failures"] == 1
        assert queue.worker.stats["failed"] == 1 and queue.worker.stats["completed"] == 1
    assert status_of(admin, failing) == (
        "failed",
        "the worker failed while running it: RuntimeError: cannot tell",
        1,
    )
    assert errors(caplog) == [
        f"a job loop failed running Odd {failing} (attempt 1): RuntimeError; it goes on with "
        "the next run, and the run is recorded as a failed try"
    ]


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


async def test_an_exception_whose_message_cannot_be_made_fails_its_run_and_nothing_else(
    make_queue, admin
) -> None:
    queue = await make_queue(workers=1)

    @queue.handler("Odd")
    async def odd(args: Any) -> None:
        raise Unprintable

    job = await queue.enqueue("Odd", {})
    result = await queue.drain()
    assert result.failed == 1
    assert status_of(admin, job) == ("failed", "Unprintable: (its message could not be read)", 1)


async def held_queue(make_queue: Any, workers: int) -> tuple[Queue, asyncio.Event, asyncio.Event]:
    """A queue whose `Held` handler says it `started`, then returns "done" once told to
    `finish`."""
    queue = await make_queue(workers=workers)
    started, finish = asyncio.Event(), asyncio.Event()

    @queue.handler("Held")
    async def held(args: dict[str, Any]) -> str:
        started.set()
        await finish.wait()
        return "done"

    return queue, started, finish


async def test_a_row_another_transaction_holds_delays_its_own_ending_and_no_other_run(
    make_queue, dsn, admin, caplog: pytest.LogCaptureFixture
) -> None:
    queue, started, finish = await held_queue(make_queue, workers=4)
    ran: list[str] = []

    @queue.handler("Quick")
    async def quick(args: dict[str, Any]) -> None:
        ran.append(str(current_job().id))

    held_id = await queue.enqueue("Held", {"secret": SECRET})
    holder = psycopg.connect(dsn)  # a person's open transaction, holding the job's row
    try:
        async with running(queue):
            await started.wait()
            holder.execute("SELECT 1 FROM axa_queue WHERE id = %s FOR UPDATE", (held_id,))
            finish.set()  # its ending now waits for the row
            quick_ids = [await queue.enqueue("Quick", {}) for _ in range(5)]

            async def quick_ones_done() -> bool:
                return (
                    all(status_of(admin, one)[0] == "completed" for one in quick_ids)
                    and "held by another transaction" in caplog.text
                )

            with caplog.at_level(logging.DEBUG, logger="axa_queue.worker"):
                await eventually(quick_ones_done)
                assert status_of(admin, held_id)[0] == "running"
                holder.commit()  # the row is free: the ending goes through
                await eventually(lambda: status_of(admin, held_id)[0] == "completed")
    finally:
        holder.close()
    assert await queue.result(held_id) == "done"
    assert sorted(ran) == sorted(str(one) for one in quick_ids)  # each once
    said = [r.getMessage() for r in caplog.records if str(held_id) in r.getMessage()]
    assert any("held by another transaction" in line for line in said), said
    assert any("free again" in line for line in said), said
    # Kept aside, not taken for a value at fault (no parts sent apart) nor a lost claim.
    assert "sending its parts apart" not in caplog.text
    assert "another worker or recovery took its claim" not in caplog.text
    assert SECRET not in caplog.text


async def test_a_run_whose_job_a_person_cancels_while_holding_its_row_records_nothing(
    make_queue, dsn, admin, caplog: pytest.LogCaptureFixture
) -> None:
    from axa_queue import cancel

    queue, started, finish = await held_queue(make_queue, workers=2)
    held_id = await queue.enqueue("Held", {})
    holder = psycopg.connect(dsn)
    try:
        async with running(queue):
            await started.wait()
            result = cancel(holder, held_id, "ops:alice", "INC-5")  # not yet committed
            assert result.applied
            with caplog.at_level(logging.INFO, logger="axa_queue.worker"):
                finish.set()  # its ending waits for the row: kept aside
                await eventually(lambda: "held by another transaction" in caplog.text)
            holder.commit()  # then the fence refuses it
            await eventually(lambda: status_of(admin, held_id)[0] == "cancelled")
    finally:
        holder.close()
    # The worker stopped once its endings were written or refused.
    row = admin.execute("SELECT status, result FROM axa_queue WHERE id = %s", (held_id,)).fetchone()
    assert row == ("cancelled", None)


async def test_an_exchange_that_keeps_failing_is_logged_once_a_while_and_its_end_once(
    make_queue, admin, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = await make_queue()

    @queue.handler("Ok")
    async def ok(args: Any) -> None:
        pass

    failures = 0
    real_send = Exchange.send

    async def failing_send(self: Exchange, *args: Any, **kwargs: Any) -> Any:
        nonlocal failures
        if failures < 8:  # an outage: every statement fails, for a while
            failures += 1
            raise psycopg.OperationalError("the server is down")
        return await real_send(self, *args, **kwargs)

    monkeypatch.setattr(Exchange, "send", failing_send)
    back = 0
    real_back = State.database_back

    def database_back(self: State) -> None:  # wakes the services waiting to try again
        nonlocal back
        back += 1
        real_back(self)

    monkeypatch.setattr(State, "database_back", database_back)
    job = await queue.enqueue("Ok", {})
    with caplog.at_level(logging.INFO, logger="axa_queue.worker"):
        async with running(queue):
            await eventually(completed(admin, job))
    said = [r.getMessage() for r in caplog.records if r.name == "axa_queue.worker"]
    failed = [line for line in said if line.startswith("could not record finished jobs")]
    assert failures == 8 and len(failed) == 1, said
    assert sum(line.startswith("recording and claiming again") for line in said) == 1, said
    assert back == 1


async def test_a_service_waiting_to_try_again_tries_at_once_when_the_database_is_back() -> None:
    state = State(workers=1, prefetch=0)
    waiting = asyncio.create_task(pause(3600, state.back))  # a backoff of an hour
    await asyncio.sleep(0)
    state.database_back()
    await asyncio.wait_for(waiting, 5)  # a guard: it ends at once
    assert not state.back.is_set(), "made anew for the next waits"
