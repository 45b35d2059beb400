"""Wire compatibility: the Rust crate's own statements on our tables, and back.

`seed_crate` holds the crate's SQL verbatim. A Rust service and a Python service
share one queue only if every statement of the crate works on the schema our setup
makes, if each side runs the other's jobs, and if a schema made by the crate alone
is one we can open.
"""

from __future__ import annotations

import asyncio
import re
import time
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg.types.json import Jsonb

import axa_queue
import seed_crate as crate
from axa_queue import ActKind, JobState, NewJob, SchemaError, cancel, retry
from conftest import eventually, running, status_of


def crate_enqueue(
    conn: psycopg.Connection[Any],
    name: str,
    args: Any,
    *,
    max_attempts: int | None = None,
    priority: int = 0,
    at: datetime | None = None,
    delay: float = 0.0,
    timeout_ms: int | None = None,
) -> UUID:
    """Queue a job exactly as the crate's `enqueue_on` does."""
    job_id = uuid4()
    conn.execute(
        crate.ENQUEUE,
        crate.params(job_id, name, Jsonb(args), max_attempts, priority, at, delay, timeout_ms),
    )
    return job_id


def crate_claim(conn: psycopg.Connection[Any], *names: str) -> tuple[Any, ...] | None:
    """Claim one job as the crate's `run_one` does."""
    return conn.execute(crate.CLAIM, crate.params(list(names))).fetchone()


def crate_setup(conn: psycopg.Connection[Any]) -> None:
    """Make the tables as the crate's `Queue::connect` does."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (crate.SETUP_LOCK,))
        for statement in crate.SETUP_STATEMENTS:
            conn.execute(statement)


def add_acts_role(conn: psycopg.Connection[Any]) -> None:
    """Our setup's changes to the crate's tables that our code needs: each act's database
    role, and the columns, tables and indexes of migration 3 on (trace context, results,
    workers, cron schedules, unique keys)."""
    ours = [m for m in axa_queue.schema.migrations.MIGRATIONS if m.version >= 3]
    for statement in (*ACTS_ROLE_STATEMENTS, *(s for m in ours for s in m.statements)):
        conn.execute(statement)


ACTS_ROLE_STATEMENTS = (
    axa_queue.schema.migrations.SETUP_ACTS_ROLE,
    axa_queue.schema.migrations.SETUP_ACTS_ROLE_FUNCTION,
    axa_queue.schema.migrations.SETUP_ACTS_ROLE_TRIGGER,
    axa_queue.schema.migrations.SETUP_ACTS_ROLE_ALWAYS,
)


def updated_at(conn: psycopg.Connection[Any], job_id: UUID) -> datetime:
    row = conn.execute("SELECT updated_at FROM axa_queue WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row[0]


def squeeze(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def test_our_first_fourteen_setup_statements_are_the_crates_own() -> None:
    ours = [squeeze(s) for s in axa_queue.SETUP_STATEMENTS[:14]]
    assert ours == [squeeze(s) for s in crate.SETUP_STATEMENTS]


async def test_the_crate_claims_reports_in_and_finishes_a_job_on_our_schema(
    make_queue, admin
) -> None:
    await make_queue()
    at = datetime.now(timezone.utc) - timedelta(seconds=1)
    job_id = crate_enqueue(admin, "Report", {"id": 7}, max_attempts=3, priority=2, at=at)
    crate_enqueue(admin, "Later", {}, delay=3600.0)

    row = admin.execute(crate.STATUS, crate.params(job_id)).fetchone()
    assert row is not None
    assert row[1:7] == ("Report", "queued", 0, 3, 2, None)
    assert row[8] == at

    claimed = crate_claim(admin, "Report", "Later")
    assert claimed == (job_id, "Report", {"id": 7}, 1, 3, None)
    assert crate_claim(admin, "Report", "Later") is None, "the delayed job is not due"

    before = updated_at(admin, job_id)
    assert admin.execute(crate.HEARTBEAT, crate.params(job_id, 1)).rowcount == 1
    assert updated_at(admin, job_id) > before
    # A run that lost its claim (an older attempt) changes nothing.
    assert admin.execute(crate.HEARTBEAT, crate.params(job_id, 0)).rowcount == 0
    stale = crate.params(job_id, 0, "completed", None)
    assert admin.execute(crate.FINISH, stale).rowcount == 0

    done = crate.params(job_id, 1, "completed", None)
    assert admin.execute(crate.FINISH, done).rowcount == 1
    assert status_of(admin, job_id) == ("completed", None, 1)


async def test_the_crate_retries_recovers_and_marks_lost_jobs_on_our_schema(
    make_queue, admin
) -> None:
    queue = await make_queue()
    retried = crate_enqueue(admin, "J", {}, max_attempts=2)
    assert crate_claim(admin, "J") is not None
    assert admin.execute(crate.RETRY, crate.params(retried, 1, "boom", 0.0)).rowcount == 1
    assert status_of(admin, retried) == ("queued", "boom", 1)

    # Two runs abandoned by their worker: one with a try left, one without.
    assert crate_claim(admin, "J") is not None  # `retried`, second try: none left
    again = crate_enqueue(admin, "J", {}, max_attempts=2)
    assert crate_claim(admin, "J") is not None
    admin.execute("UPDATE axa_queue SET updated_at = now() - interval '2 hours'")
    assert admin.execute(crate.FAIL_STALE, crate.params(60, 1)).rowcount == 1
    assert admin.execute(crate.REQUEUE_STALE, crate.params(60, 1)).rowcount == 1
    assert status_of(admin, retried) == ("failed", "abandoned by its worker", 2)
    assert status_of(admin, again) == ("queued", None, 1)

    lost = crate_enqueue(admin, "J", {})
    assert admin.execute(crate.MARK_LOST, crate.params(lost, "worker error: stopped")).rowcount
    info = await queue.job(lost)
    assert info is not None and info.state is JobState.NEEDS_REVIEW


async def test_the_crate_counts_and_purges_on_our_schema(make_queue, admin) -> None:
    queue = await make_queue()
    crate_enqueue(admin, "J", {})
    crate_enqueue(admin, "J", {}, delay=600.0)
    old = crate_enqueue(admin, "J", {})
    crate_claim(admin, "J")  # the first job: the oldest ready one
    admin.execute(
        "UPDATE axa_queue SET status = 'completed', updated_at = now() - interval '8 days' "
        "WHERE id = %s",
        (old,),
    )
    row = admin.execute(crate.COUNTS).fetchone()
    assert row is not None
    assert row[:7] == (0, 1, 1, 1, 0, 0, 0)
    ours = await queue.counts()
    assert (ours.ready, ours.waiting, ours.running, ours.completed) == (0, 1, 1, 1)

    assert admin.execute(crate.PURGE, crate.params(7)).rowcount == 1
    assert await queue.job(old) is None


async def test_the_crate_ticks_a_schedule_on_our_schema_and_we_read_it(make_queue, admin) -> None:
    queue = await make_queue()
    first = datetime.now(timezone.utc) - timedelta(seconds=3)
    admin.execute(crate.SCHEDULE_CREATE, crate.params("nightly", first, 60_000))
    with admin.transaction():
        row = admin.execute(crate.SCHEDULE_LOCK, crate.params("nightly")).fetchone()
        assert row == (None, True)
        job_id = crate_enqueue(admin, "Report", {"id": 0})
        busy = admin.execute(crate.SCHEDULE_BUSY, crate.params(job_id)).fetchone()
        assert busy == (True,)
        admin.execute(crate.SCHEDULE_ADVANCE, crate.params("nightly", 60.0, job_id))

    listed = admin.execute(crate.SCHEDULES).fetchall()
    assert [(r[0], r[1], r[2], r[3], r[7]) for r in listed] == [
        ("nightly", 60_000, first + timedelta(seconds=60), job_id, "queued")
    ]
    (info,) = await queue.schedules()
    assert info.name == "nightly" and info.interval == timedelta(seconds=60)
    assert info.due_at == first + timedelta(seconds=60)
    assert info.last_job == job_id and info.last_state is JobState.QUEUED

    admin.execute("UPDATE axa_schedule SET seen_at = now() - interval '2 hours'")
    assert admin.execute(crate.SCHEDULE_ARCHIVE, crate.params(["other"], 60)).rowcount == 1
    (info,) = await queue.schedules()
    assert info.archived_at is not None
    # The crate's upsert restores it, as ours does.
    admin.execute(crate.SCHEDULE_CREATE, crate.params("nightly", None, 60_000))
    (info,) = await queue.schedules()
    assert info.archived_at is None


async def test_a_schedule_we_tick_is_not_queued_again_by_the_crate(make_queue, admin) -> None:
    queue = await make_queue()
    first = datetime.now(timezone.utc) - timedelta(seconds=1)
    queue.schedule(axa_queue.Schedule.every("s", 3600, NewJob("J"), first_at=first))
    assert await queue.tick_schedules() == 1
    admin.execute(crate.SCHEDULE_CREATE, crate.params("s", None, 3_600_000))
    with admin.transaction():
        row = admin.execute(crate.SCHEDULE_LOCK, crate.params("s")).fetchone()
        assert row is not None and row[1] is False, "the due time was taken already"


async def test_the_crate_lists_a_cron_schedule_as_one_without_interval_and_leaves_it_alone(
    make_queue, admin
) -> None:
    queue = await make_queue()
    queue.schedule(axa_queue.Schedule.cron("nightly", "0 3 * * *", NewJob("J")))
    assert await queue.tick_schedules() == 0
    before = admin.execute("SELECT due_at, cron, timezone FROM axa_schedule").fetchone()
    listed = admin.execute(crate.SCHEDULES).fetchall()
    assert [(r[0], r[1]) for r in listed] == [("nightly", None)], "interval_ms is NULL"
    # A crate process without it in code archives only rows unseen for its stale period.
    assert admin.execute(crate.SCHEDULE_ARCHIVE, crate.params(["other"], 60)).rowcount == 0
    after = admin.execute("SELECT due_at, cron, timezone FROM axa_schedule").fetchone()
    assert before == after and after is not None and after[1:] == ("0 3 * * *", "UTC")


async def test_a_job_queued_by_the_crate_wakes_our_worker_well_before_its_poll_interval(
    make_queue, admin, schema
) -> None:
    queue = await make_queue(poll_interval=5)
    done = asyncio.Event()
    queue.handle("Report", lambda args: done.set())
    assert queue.notifies

    async with running(queue):

        def idle_and_listening() -> bool:
            listening = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                "AND query = 'LISTEN axa_queue'",
                (schema,),
            ).fetchone()
            worker = queue.worker
            return bool(listening and listening[0]) and worker is not None and not worker.look

        await eventually(idle_and_listening, timeout=10)
        started = time.monotonic()
        job_id = crate_enqueue(admin, "Report", {"id": 1})
        await asyncio.wait_for(done.wait(), 10)
        await eventually(lambda: status_of(admin, job_id)[0] == "completed", timeout=10)
        took = time.monotonic() - started
    assert took < 2.0, f"took {took:.2f} s: the insert trigger did not wake the worker"


async def test_our_insert_trigger_notifies_once_for_a_statement_the_crate_sends(
    make_queue, admin, schema
) -> None:
    await make_queue()
    admin.execute("LISTEN axa_queue")
    crate_enqueue(admin, "Later", {}, delay=30.0)
    notes = [n for n in admin.notifies(timeout=2, stop_after=1) if n.payload.startswith(schema)]
    assert len(notes) == 1
    there, delay = notes[0].payload.split(" ")
    assert there == schema and 29.0 < float(delay) <= 30.0


async def test_a_job_we_queue_is_claimed_reported_and_finished_by_the_crate(
    make_queue, admin
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Report", {"id": 7}, priority=4, max_attempts=3, timeout=5)
    later = await queue.enqueue("Report", {"id": 8}, run_in=3600)
    (many,) = await queue.enqueue_all([NewJob("Batch", [1, "two", None])])

    assert crate_claim(admin, "Report") == (job_id, "Report", {"id": 7}, 1, 3, 5000)
    assert crate_claim(admin, "Report") is None, f"{later} is not due"
    assert admin.execute(crate.HEARTBEAT, crate.params(job_id, 1)).rowcount == 1
    done = crate.params(job_id, 1, "completed", None)
    assert admin.execute(crate.FINISH, done).rowcount == 1
    info = await queue.job(job_id)
    assert info is not None and info.state is JobState.COMPLETED and info.attempt == 1

    # A job with the queue's defaults leaves them NULL, for each worker to apply its own.
    assert crate_claim(admin, "Batch") == (many, "Batch", [1, "two", None], 1, None, None)


async def test_a_run_the_crate_retried_is_finished_by_our_worker(make_queue, admin) -> None:
    queue = await make_queue()
    queue.handle("J", lambda args: None)
    job_id = await queue.enqueue("J", {}, max_attempts=2)
    assert crate_claim(admin, "J") is not None
    assert admin.execute(crate.RETRY, crate.params(job_id, 1, "worker error: x", 0.0)).rowcount
    async with running(queue):
        await eventually(lambda: status_of(admin, job_id)[0] == "completed")
    assert status_of(admin, job_id) == ("completed", None, 2)  # as the crate clears it


async def test_our_worker_honours_the_limits_the_crate_queued_with(make_queue, admin) -> None:
    queue = await make_queue(max_attempts=1)

    @queue.handler("Flaky")
    async def flaky(args: Any) -> None:
        raise RuntimeError("no")

    @queue.handler("Slow")
    async def slow(args: Any) -> None:
        await asyncio.sleep(30)

    flaky_id = crate_enqueue(admin, "Flaky", {}, max_attempts=2)
    slow_id = crate_enqueue(admin, "Slow", {}, timeout_ms=200)
    async with running(queue):
        await eventually(lambda: status_of(admin, flaky_id)[0] == "failed")
        await eventually(lambda: status_of(admin, slow_id)[0] == "failed")
    assert status_of(admin, flaky_id) == ("failed", "RuntimeError: no", 2)
    assert status_of(admin, slow_id)[1] == "timed out after 0.2 s"


async def test_a_schema_made_by_the_crates_setup_passes_our_check_once_our_columns_are_added(
    make_queue, admin
) -> None:
    crate_setup(admin)
    with pytest.raises(SchemaError, match="trace_context"):  # our columns are not there yet
        await make_queue(setup=False)
    add_acts_role(admin)
    queue = await make_queue(setup=False)
    assert not queue.notifies, "the notify trigger is ours, and optional"
    queue.handle("J", lambda args: None)
    job_id = crate_enqueue(admin, "J", {})
    async with running(queue):  # found by polling
        await eventually(lambda: status_of(admin, job_id)[0] == "completed")


async def test_our_setup_on_top_of_the_crates_schema_keeps_its_rows_and_adds_ours(
    make_queue, admin
) -> None:
    crate_setup(admin)
    job_id = crate_enqueue(admin, "J", {"keep": True}, priority=-3)
    columns = admin.execute(
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = current_schema() ORDER BY 1, 2"
    ).fetchall()
    queue = await make_queue()
    assert queue.notifies
    after = admin.execute(
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = current_schema() ORDER BY 1, 2"
    ).fetchall()
    added = sorted(set(after) - set(columns))
    # our record, our workers table, the rate limits' slots, the history, the paused
    # names, the attempts, the workflows' tables and the steps, which the crate ignores
    ours = (
        "axa_schema_version",
        "axa_workers",
        "axa_rate_slots",
        "axa_queue_history",
        "axa_paused",
        "axa_queue_attempts",
        "axa_queue_deps",
        "axa_workflows",
        "axa_queue_steps",
    )
    added = [c for c in added if c[0] not in ours]
    assert added == [
        ("axa_job_acts", "db_role", "text"),
        ("axa_queue", "ahead", "integer"),
        ("axa_queue", "dependents", "boolean"),
        ("axa_queue", "given_back", "integer"),
        ("axa_queue", "key", "text"),
        ("axa_queue", "result", "jsonb"),
        ("axa_queue", "run_attempt", "integer"),
        ("axa_queue", "run_host", "text"),
        ("axa_queue", "run_pid", "integer"),
        ("axa_queue", "run_trace", "jsonb"),
        ("axa_queue", "run_worker", "uuid"),
        ("axa_queue", "trace_context", "jsonb"),
        ("axa_queue", "unique_for_ms", "bigint"),
        ("axa_queue", "unique_key", "text"),
        ("axa_schedule", "cron", "text"),
        ("axa_schedule", "timezone", "text"),
    ], (
        "our setup adds to the crate's tables only an act's role, a result, a trace context, "
        "a unique key, a cron schedule's expression and zone, a run claimed ahead's "
        "columns, whether a job has dependents, a job's key, and the process and span of a job's "
        "last run"
    )
    assert set(columns) <= set(after)
    missing = admin.execute(crate.MISSING_TRIGGERS, crate.params(crate.ACTS_TRIGGERS)).fetchall()
    assert missing == []
    assert crate_claim(admin, "J") == (job_id, "J", {"keep": True}, 1, None, None)


async def test_the_crates_acts_on_our_jobs_are_read_back_by_our_acts(make_queue, admin) -> None:
    queue = await make_queue()
    queued = await queue.enqueue("Report", {})
    with admin.transaction():
        kept = admin.execute(crate.CANCEL, crate.params(queued, "ops:alice", "customer_asked"))
        assert kept.rowcount == 1

    failed = await queue.enqueue("Report", {})
    crate_claim(admin, "Report")
    admin.execute(crate.FINISH, crate.params(failed, 1, "failed", "worker error: x"))
    assert admin.execute(crate.RETRY_FAILED, crate.params(failed, "ops:bob", "fixed")).rowcount
    admin.execute(crate.MARK_LOST, crate.params(failed, "worker error: stopped"))
    assert admin.execute(crate.RETRY_FAILED, crate.params(failed, "ops:bob", "checked")).rowcount
    # An act that does not apply writes nothing.
    assert admin.execute(crate.CANCEL, crate.params(failed, "ops:bob", "late")).rowcount == 1
    assert admin.execute(crate.CANCEL, crate.params(failed, "ops:bob", "again")).rowcount == 0

    (act,) = await queue.acts(queued)
    assert (act.job_id, act.job_name, act.kind, act.attempts) == (
        queued,
        "Report",
        ActKind.CANCELLED,
        0,
    )
    assert (act.by, act.reason) == ("ops:alice", "customer_asked")
    acts = await queue.acts(failed)
    assert [(a.kind, a.attempts, a.reason) for a in acts] == [
        (ActKind.RETRIED, 1, "fixed"),
        (ActKind.RELEASED, 1, "checked"),
        (ActKind.CANCELLED, 1, "late"),
    ]
    info = await queue.job(failed)
    assert info is not None and info.state is JobState.CANCELLED and info.max_attempts == 2


async def test_our_acts_are_read_back_by_the_crates_acts(make_queue, admin) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Report", {})
    async with queue.connection() as conn:
        assert await cancel(conn, job_id, "ops:alice", "customer_asked")
        assert not await retry(conn, job_id, "ops:alice", "oops")
    rows = admin.execute(crate.ACTS, crate.params(job_id)).fetchall()
    assert [r[1:7] for r in rows] == [
        (job_id, "Report", "cancelled", 0, "ops:alice", "customer_asked")
    ]
    with pytest.raises(psycopg.errors.RaiseException):
        admin.execute("DELETE FROM axa_job_acts")


async def test_a_crate_schema_with_an_acts_trigger_turned_off_is_refused(make_queue, admin) -> None:
    crate_setup(admin)
    add_acts_role(admin)
    admin.execute("ALTER TABLE axa_job_acts DISABLE TRIGGER axa_job_acts_refuse")
    missing = admin.execute(crate.MISSING_TRIGGERS, crate.params(crate.ACTS_TRIGGERS)).fetchall()
    assert missing == [("axa_job_acts_refuse",)]
    with pytest.raises(SchemaError, match="axa_job_acts_refuse"):
        await make_queue(setup=False)
