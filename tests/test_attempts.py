"""Every run of a job is kept in `axa_queue_attempts`: its start, end, outcome, error and
the worker process that ran it, written by the statements that claim and end runs, read
back by `JobInfo.attempts`, `attempts_on` and `show`, and gone with its job."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import uuid
from datetime import timedelta
from typing import Any

import psycopg
from click.testing import CliRunner
from psycopg.rows import namedtuple_row

import seed_crate as crate
from axa_queue import Attempt, JobState, NewJob, attempts_on, cancel, retry, sql
from axa_queue.cli import main
from conftest import eventually, later, running, set_up


def rows_of(admin: psycopg.Connection[Any], job_id: uuid.UUID) -> list[Any]:
    return (
        admin.cursor(row_factory=namedtuple_row)
        .execute(
            "SELECT attempt, worker, host, pid, started_at, ended_at, outcome, error_class, "
            "error FROM axa_queue_attempts WHERE job_id = %s ORDER BY attempt",
            (job_id,),
        )
        .fetchall()
    )


def claim(admin: psycopg.Connection[Any], name: str, *, idle: int = 1, worker: Any = None) -> Any:
    """Claim one job of `name` as a worker's exchange does, as process `worker` on host
    `test`, pid 4242."""
    [row] = (
        admin.cursor(row_factory=namedtuple_row)
        .execute(
            sql.EXCHANGE,
            {
                "completed": "{}",
                "completed_attempts": "{}",
                "endings": "[]",
                "free": 1,
                "wanted": json.dumps([{"name": name, "cap": 1}]),
                "losing": "{}",
                "now": None,
                "idle": idle,
                "starts": "{}",
                "started_attempts": "{}",
                "worker": worker or uuid.uuid4(),
                "host": "test",
                "pid": 4242,
                "limits": "{}",
                "max": None,
            },
        )
        .fetchall()
    )
    return row


def retried(admin: psycopg.Connection[Any], name: str) -> None:
    """End every running run of `name` `retried`, due at once, as a worker's exchange does."""
    running_ = admin.execute(
        "SELECT id, attempts FROM axa_queue WHERE name = %s AND status = 'running'", (name,)
    ).fetchall()
    endings = [
        {"id": str(i), "attempts": a, "status": "queued", "error": "E: again", "delay": 0}
        for i, a in running_
    ]
    admin.execute(
        sql.EXCHANGE,
        {
            "completed": "{}", "completed_attempts": "{}", "endings": json.dumps(endings),
            "free": 0, "wanted": "[]", "losing": "{}", "now": None, "idle": 0, "starts": "{}",
            "started_attempts": "{}", "worker": None, "host": "test", "pid": 1, "limits": "{}",
            "max": None,
        },
    )  # fmt: skip


async def test_a_job_that_failed_then_completed_shows_both_attempts_with_errors_durations_and_worker(
    make_queue, admin, dsn: str
) -> None:
    queue = await make_queue(max_attempts=3)
    tries: list[int] = []

    @queue.handler("Flaky")
    async def flaky(args: Any) -> None:
        tries.append(1)
        if len(tries) == 1:
            raise ValueError("the partner answered 502")

    job_id = await queue.enqueue("Flaky", {"card": "4111 1111 1111 1111"})
    async with running(queue):

        async def done() -> bool:
            info = await queue.job(job_id)
            return info is not None and info.state is JobState.COMPLETED

        await eventually(done)
    info = await queue.job(job_id)
    assert info is not None and info.attempt == 2
    first, second = info.attempts
    assert (first.attempt, first.outcome, first.error_class) == (1, "retried", "ValueError")
    assert first.error == "ValueError: the partner answered 502"
    assert (second.attempt, second.outcome, second.error_class, second.error) == (
        2,
        "completed",
        None,
        None,
    )
    for one in info.attempts:
        assert one.host == socket.gethostname() and one.pid == os.getpid()
        assert one.worker is not None and not one.derived
        assert one.duration is not None and timedelta(0) <= one.duration < timedelta(seconds=30)
        assert one.started_at is not None and one.ended_at is not None
    assert first.ended_at is not None and second.started_at is not None
    assert first.ended_at <= second.started_at
    # The worker id is the process's row in axa_workers while it runs (its presence).
    assert first.worker == second.worker

    # The same, on any connection: async and sync.
    async with queue.connection() as conn:
        assert await attempts_on(conn, job_id) == list(info.attempts)
    with psycopg.connect(dsn) as sync_conn:
        assert attempts_on(sync_conn, job_id) == list(info.attempts)

    # `show` prints them, as a table and in --json; never the arguments.
    runner = CliRunner(env={"AXA_QUEUE_DSN": dsn, "DATABASE_URL": None})
    shown = await asyncio.to_thread(runner.invoke, main, ["show", str(job_id)])
    assert shown.exit_code == 0, shown.output
    assert "ValueError: the partner answered 502" in shown.output
    assert "retried" in shown.output and "completed" in shown.output
    assert f"{socket.gethostname()}:{os.getpid()}" in shown.output
    assert "4111" not in shown.output
    as_json = await asyncio.to_thread(runner.invoke, main, ["show", str(job_id), "--json"])
    data = json.loads(as_json.stdout)
    assert [a["outcome"] for a in data["runs"]] == ["retried", "completed"]
    assert data["runs"][0]["error_class"] == "ValueError"
    assert data["runs"][0]["host"] == socket.gethostname()
    assert data["runs"][0]["seconds"] is not None
    assert "4111" not in as_json.stdout


async def test_a_failed_run_keeps_its_error_bounded_and_a_timeout_has_no_class(
    make_queue, admin
) -> None:
    queue = await make_queue(max_attempts=2)

    @queue.handler("Slow", timeout=0.05)
    async def slow(args: Any) -> None:
        await asyncio.sleep(30)

    @queue.handler("Loud", max_attempts=1)
    async def loud(args: Any) -> None:
        raise RuntimeError("x" * 10_000)

    slow_id = await queue.enqueue("Slow", {})
    loud_id = await queue.enqueue("Loud", {})
    async with running(queue):

        async def done() -> bool:
            a, b = await queue.job(slow_id), await queue.job(loud_id)
            return a is not None and b is not None and a.state == b.state == JobState.FAILED

        await eventually(done)
    slow_runs = rows_of(admin, slow_id)
    assert [(r.outcome, r.error_class) for r in slow_runs] == [("retried", None), ("failed", None)]
    assert all(r.error.startswith("timed out") for r in slow_runs)
    [loud_run] = rows_of(admin, loud_id)
    assert (loud_run.outcome, loud_run.error_class) == ("failed", "RuntimeError")
    assert len(loud_run.error) <= 2000


async def test_cancelling_a_running_job_ends_its_attempt_cancelled(make_queue, admin) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Long", {})
    worker = uuid.uuid4()
    claim(admin, "Long", worker=worker)
    async with queue.connection() as conn:
        assert await cancel(conn, job_id, "ops:alice", "customer_asked")
    [row] = rows_of(admin, job_id)
    assert (row.attempt, row.worker, row.host, row.pid, row.outcome) == (
        1,
        worker,
        "test",
        4242,
        "cancelled",
    )
    assert row.ended_at >= row.started_at


def test_cancel_all_ends_each_running_jobs_attempt_cancelled_and_leaves_queued_ones_none(
    admin,
) -> None:
    from axa_queue import cancel_all

    set_up(admin)
    ids = [uuid.uuid4() for _ in range(3)]
    for job_id in ids:
        admin.execute("INSERT INTO axa_queue (id, name, args) VALUES (%s, 'Bulk', '{}')", (job_id,))
    claim(admin, "Bulk")
    claim(admin, "Bulk")
    result = cancel_all(admin, by="ops:bob", reason="incident_42", name="Bulk")
    assert result.changed == 3
    outcomes = sorted(r.outcome for j in ids for r in rows_of(admin, j))
    assert outcomes == ["cancelled", "cancelled"]  # the queued job had no run


async def test_stale_recovery_ends_an_abandoned_run_and_keeps_who_ran_it(make_queue, admin) -> None:
    queue = await make_queue(max_attempts=3)
    job_id = await queue.enqueue("Crashy", {})
    worker = uuid.uuid4()
    claim(admin, "Crashy", worker=worker)
    [recovered] = await queue.recover_stale(now=later(admin, 3600))
    assert recovered.state is JobState.QUEUED
    [row] = rows_of(admin, job_id)
    assert (row.worker, row.host, row.pid, row.outcome, row.error) == (
        worker,
        "test",
        4242,
        "abandoned",
        "abandoned by its worker",
    )


async def test_a_run_claimed_ahead_and_never_started_is_given_back(make_queue, admin) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Ahead", {})
    claimed = claim(admin, "Ahead", idle=0)
    assert claimed.ahead
    await queue.recover_stale(now=later(admin, 3600))
    [row] = rows_of(admin, job_id)
    assert (row.outcome, row.error) == ("given back", None)

    # A stopping worker's give-back says the same, as the process that gave it.
    claim(admin, "Ahead", idle=0)
    admin.execute(
        sql.GIVE_BACK,
        {
            "ids": f"{{{job_id}}}",
            "attempts": "{2}",
            "limits": "{3}",
            "now": None,
            "worker": None,
            "host": "test",
            "pid": 4242,
        },
    )
    assert [(r.attempt, r.outcome) for r in rows_of(admin, job_id)] == [
        (1, "given back"),
        (2, "given back"),
    ]


async def test_a_lost_run_ends_its_attempt_lost_unless_its_ending_was_written(
    make_queue, admin
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Lost", {})
    claim(admin, "Lost")
    params = {
        "id": job_id, "attempts": 1, "started": True, "gave_up": True, "ending": None,
        "ending_error": None, "error": "stopped: could not report in", "max": 3, "now": None,
        "worker": None, "host": "test", "pid": 4242,
    }  # fmt: skip
    admin.execute(sql.MARK_LOST, params)
    [row] = rows_of(admin, job_id)
    assert (row.outcome, row.error) == ("lost", "stopped: could not report in")

    # An ending already written (the exchange's answer lost, then sent again) stays.
    done = await queue.enqueue("Done", {})
    claim(admin, "Done")
    admin.execute(
        sql.EXCHANGE,
        {
            "completed": f"{{{done}}}", "completed_attempts": "{1}", "endings": "[]",
            "free": 0, "wanted": "[]", "losing": "{}", "now": None, "idle": 0,
            "starts": "{}", "started_attempts": "{}", "worker": None, "host": "test", "pid": 1, "limits": "{}",
            "max": None,
        },
    )  # fmt: skip
    admin.execute(sql.MARK_LOST, {**params, "id": done, "ending": "completed"})
    # A completion writes no row (its job's row says it), and a lost run's row is not made
    # for a job completed under the run's own attempt.
    assert rows_of(admin, done) == []
    assert [r.outcome for r in await queue.attempts(done)] == ["completed"]


async def test_a_run_the_rust_crate_made_appears_with_what_the_crate_writes(
    make_queue, admin
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Report", {})
    assert admin.execute(crate.CLAIM, crate.params(["Report"])).fetchone() is not None
    info = await queue.job(job_id)
    assert info is not None
    [run] = info.attempts
    assert (run.attempt, run.outcome, run.derived, run.worker, run.ended_at) == (
        1,
        None,
        True,
        None,
        None,
    )
    assert run.started_at == info.started_at
    admin.execute(crate.RETRY, crate.params(job_id, 1, "boom", 0))
    assert admin.execute(crate.CLAIM, crate.params(["Report"])).fetchone() is not None
    admin.execute(crate.FINISH, crate.params(job_id, 2, "failed", "KeyError: 'x'"))
    [run] = await queue.attempts(job_id)
    assert (run.attempt, run.outcome, run.error_class, run.error, run.derived) == (
        2,
        "failed",
        "KeyError",
        "KeyError: 'x'",
        True,
    )
    assert run.duration is not None and run.duration >= timedelta(0)
    assert isinstance(run, Attempt)
    assert rows_of(admin, job_id) == []  # the crate writes none
    # A person retries it, then cancels it before it runs again: the crate's run
    # failed, it was not cancelled.
    async with queue.connection() as conn:
        assert (await retry(conn, job_id, "ops:alice", "INC-1")).applied
        assert (await cancel(conn, job_id, "ops:alice", "INC-2")).applied
    [run] = await queue.attempts(job_id)
    assert (run.attempt, run.outcome, run.error_class, run.ended_at) == (
        2,
        "retried",
        "KeyError",
        None,
    )


async def test_attempts_leave_with_their_job_when_it_is_purged_or_its_day_dropped(
    make_queue, admin
) -> None:
    queue = await make_queue()
    hot, moved, kept = [await queue.enqueue("Gone", {"n": n}) for n in range(3)]
    for _ in range(3):
        claim(admin, "Gone")
    retried(admin, "Gone")  # each job's first run ended `retried`: a row each
    for _ in range(3):
        claim(admin, "Gone")
    finished = (
        "UPDATE axa_queue SET status = 'completed', updated_at = now() - interval '3 days' "
        "WHERE id = %s"
    )
    admin.execute(finished, (moved,))
    assert (await queue.move_history(timedelta(0))).moved == 1  # to its day, 3 days ago
    admin.execute(finished, (hot,))  # finished, still in axa_queue
    assert all(len(rows_of(admin, j)) == 1 for j in (hot, moved, kept))
    assert await queue.purge(older_than=timedelta(days=1)) == 2
    assert rows_of(admin, hot) == [] and rows_of(admin, moved) == []
    assert [r.outcome for r in rows_of(admin, kept)] == ["retried"]  # running again

    # A drop given up (its lock not had) keeps the attempts with their job.
    admin.execute(finished, (kept,))
    assert (await queue.move_history(timedelta(0))).moved == 1
    with psycopg.connect(admin.info.dsn) as holder, holder.transaction():
        holder.execute("LOCK TABLE axa_queue_history IN ACCESS SHARE MODE")
        with contextlib.suppress(psycopg.errors.LockNotAvailable):
            await queue.purge(older_than=timedelta(days=1))
        assert len(rows_of(admin, kept)) == 1


async def test_the_exchange_writes_attempts_by_primary_key(make_queue, admin) -> None:
    # The start and the end are one index probe each: no scan of the attempts table.
    queue = await make_queue()
    await queue.enqueue_all(NewJob("Many", {"n": n}) for n in range(2000))
    for _ in range(5):
        claim(admin, "Many")
    admin.execute("ANALYZE axa_queue_attempts")
    job = admin.execute("SELECT id FROM axa_queue WHERE status = 'running' LIMIT 1").fetchone()
    assert job is not None
    failed = json.dumps(
        [{"id": str(job[0]), "attempts": 1, "status": "failed", "error": "E: x", "delay": 0}]
    )
    plan = "\n".join(
        r[0]
        for r in admin.execute(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql.EXCHANGE,
            {
                "completed": "{}", "completed_attempts": "{}", "endings": failed, "free": 1,
                "wanted": json.dumps([{"name": "Many", "cap": 1}]), "losing": "{}",
                "now": None, "idle": 1, "starts": "{}", "started_attempts": "{}",
                "worker": None, "host": "test", "pid": 1, "limits": "{}",
            "max": None,
            },
        ).fetchall()
    )  # fmt: skip
    assert "Seq Scan on axa_queue_attempts" not in plan, plan
    assert [r.outcome for r in rows_of(admin, job[0])] == ["failed"]


async def test_a_claim_and_a_completion_write_no_attempt_row_and_the_jobs_row_names_its_process(
    make_queue, admin
) -> None:
    # The run that ends as nearly every run ends costs no row of `axa_queue_attempts`: the
    # claim stamps its process on its job's row (migration 16), a completion writes nothing
    # more, and the attempts are read back from the job's row, process and all.
    queue = await make_queue()
    job_id = await queue.enqueue("Quick", {})
    worker = uuid.uuid4()
    claim(admin, "Quick", worker=worker)
    assert rows_of(admin, job_id) == []
    [run] = await queue.attempts(job_id)
    assert (run.attempt, run.worker, run.host, run.pid, run.outcome, run.derived) == (
        1, worker, "test", 4242, None, False,
    )  # fmt: skip
    admin.execute(
        sql.EXCHANGE,
        {
            "completed": f"{{{job_id}}}", "completed_attempts": "{1}", "endings": "[]",
            "free": 0, "wanted": "[]", "losing": "{}", "now": None, "idle": 0,
            "starts": "{}", "started_attempts": "{}", "worker": None, "host": "test", "pid": 1,
            "limits": "{}", "max": None,
        },
    )  # fmt: skip
    assert rows_of(admin, job_id) == []
    [run] = await queue.attempts(job_id)
    assert (run.worker, run.host, run.pid, run.outcome) == (worker, "test", 4242, "completed")
    assert run.duration is not None and run.duration >= timedelta(0)
    # Moved to the history, it still says so.
    assert (await queue.move_history(timedelta(0))).moved == 1
    [run] = await queue.attempts(job_id)
    assert (run.worker, run.host, run.pid, run.outcome) == (worker, "test", 4242, "completed")


async def test_a_stamp_left_by_an_earlier_run_never_names_the_process_of_a_crate_run(
    make_queue, admin
) -> None:
    # A run of ours retried, then claimed by the Rust crate (which stamps nothing): the
    # stamp speaks of attempt 1, so attempt 2 shows no process (`derived`).
    queue = await make_queue()
    job_id = await queue.enqueue("Mixed", {})
    claim(admin, "Mixed", worker=uuid.uuid4())
    retried(admin, "Mixed")
    assert admin.execute(crate.CLAIM, crate.params(["Mixed"])).fetchone() is not None
    first, second = await queue.attempts(job_id)
    assert (first.outcome, first.host, first.pid) == ("retried", "test", 1)
    assert (second.attempt, second.worker, second.host, second.pid, second.derived) == (
        2, None, None, None, True,
    )  # fmt: skip
