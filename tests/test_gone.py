"""A worker process gone (silent for 3 heartbeat intervals): the jobs it was running are
shown "worker gone" (`JobInfo.worker_gone`, `show`, `jobs`, the metric), and the jobs it
had claimed ahead and never started are queued again at once, their attempts given back,
while a started run waits for stale recovery. Fencing stays exact: the process, if it was
only stalled and comes back, has its start mark, heartbeat and ending refused."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import uuid
from typing import Any, NamedTuple

import psycopg
import pytest
from click.testing import CliRunner
from psycopg.rows import namedtuple_row

from axa_queue import JobState, Recovered, sql
from axa_queue.cli import main
from axa_queue.db.calls import run_async
from axa_queue.limits import AttemptLimits
from axa_queue.maintenance import give_back_gone
from axa_queue.metrics import QueueCollector
from axa_queue.presence import gone_jobs_call
from axa_queue.worker.connections import Connections
from conftest import MovedClock, eventually, exchange_params, later, running
from test_crash import spawn  # noqa: F401  (the fixture: worker processes)
from test_fencing import Blocking


async def _holds_nothing(self: Connections) -> bool:
    """`Connections.hold_presence` of a process that cannot take its presence lock."""
    return False


class Rollback(Exception):
    """Raised to roll back a transaction (EXPLAIN ANALYZE really writes)."""


GHOST = uuid.UUID(int=0x6057)
"""The worker process a test plays by SQL: it claims, goes silent, and comes back."""


def exchange(admin: psycopg.Connection[Any], worker: uuid.UUID, **sent: Any) -> list[Any]:
    """Send `sql.EXCHANGE` as process `worker` (host `ghost`, pid 4242) does, with what
    `sent` says (nothing by default: no ending, no start mark, no claim)."""
    params = exchange_params(**{"worker": worker, "host": "ghost", "pid": 4242, **sent})
    return admin.cursor(row_factory=namedtuple_row).execute(sql.EXCHANGE, params).fetchall()


def claim_ahead(admin: psycopg.Connection[Any], name: str, worker: uuid.UUID) -> Any:
    """Claim one job of `name` ahead of the loops (`idle` 0), as `worker`'s exchange does."""
    [row] = exchange(admin, worker, free=1, wanted=json.dumps([{"name": name, "cap": 1}]))
    return row


def silent(admin: psycopg.Connection[Any], worker: uuid.UUID, seconds: float) -> None:
    """Make `worker` (its row in `axa_workers`, beating every 0.1 s) and its runs silent
    for `seconds`, as a process killed or stalled that long ago."""
    admin.execute(
        """INSERT INTO axa_workers (id, host, pid, names, loops, running, version, started_at,
            seen_at, beat_ms)
        VALUES (%(id)s, 'ghost', 4242, '{Pay}', 1, 1, 'test', now() - make_interval(secs => %(s)s),
            now() - make_interval(secs => %(s)s), 100)
        ON CONFLICT (id) DO UPDATE SET seen_at = EXCLUDED.seen_at""",
        {"id": worker, "s": seconds},
    )
    admin.execute(
        "UPDATE axa_queue SET updated_at = now() - make_interval(secs => %s) "
        "WHERE status = 'running'",
        (seconds,),
    )


def row_of(admin: psycopg.Connection[Any], job_id: uuid.UUID) -> Any:
    return (
        admin.cursor(row_factory=namedtuple_row)
        .execute(
            "SELECT status, attempts, max_attempts, ahead, given_back, error FROM axa_queue "
            "WHERE id = %s",
            (job_id,),
        )
        .fetchone()
    )


def attempt_rows(admin: psycopg.Connection[Any], job_id: uuid.UUID) -> list[Any]:
    """A job's attempts as the reads give them (`sql.ATTEMPTS`): the rows kept, and the
    run still going or completed read from the job's row (the claim's stamp)."""
    rows = admin.cursor(row_factory=namedtuple_row).execute(sql.ATTEMPTS, {"id": job_id})
    return [
        Run(
            row.attempt,
            None if row.worker is None else uuid.UUID(row.worker),
            row.outcome,
            row.error,
            row.ended_at is not None,
        )
        for row in rows.fetchall()
    ]


class Run(NamedTuple):
    """A run as the tests compare it."""

    attempt: int
    worker: uuid.UUID | None
    outcome: str | None
    error: str | None
    ended: bool


async def give_back(dsn: str, *, limit: int = 1, now: Any = None) -> list[Recovered]:
    """Send `GIVE_BACK_GONE` as a live worker process (another id, a 0.1 s heartbeat),
    at `now` (the database's clock by default)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await give_back_gone(conn, 0.1, AttemptLimits(limit), uuid.uuid4(), now=now)


# --- by SQL: the statement, and the process that comes back ---------------------------------


async def test_a_run_claimed_ahead_by_a_gone_process_is_queued_again_with_its_attempt_given_back(
    make_queue, admin, dsn: str
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Pay", {"card": "4111"}, max_attempts=1)
    claimed = claim_ahead(admin, "Pay", GHOST)
    assert (claimed.id, claimed.attempts) == (str(job_id), 1)
    assert row_of(admin, job_id).ahead == 1  # claimed ahead, never started

    silent(admin, GHOST, 0.2)  # less than three of its intervals: not gone yet
    assert await give_back(dsn) == []
    info = await queue.job(job_id)
    assert info is not None and (info.state, info.worker_gone) == (JobState.RUNNING, False)

    # Three intervals: shown gone; given back only a grace later (a beat comes late by
    # its round trip and its event loop's lag).
    silent(admin, GHOST, 0.4)
    info = await queue.job(job_id)
    assert info is not None and (info.state, info.worker_gone) == (JobState.RUNNING, True)
    assert await give_back(dsn) == []

    silent(admin, GHOST, 5)
    info = await queue.job(job_id)
    assert info is not None and (info.state, info.worker_gone) == (JobState.RUNNING, True)
    assert [j.worker_gone for j in await queue.jobs(JobState.RUNNING)] == [True]

    assert await give_back(dsn) == [Recovered(job_id, "Pay", 1, JobState.QUEUED)]
    # Its attempt number is kept (it fences the run); its limit rises by one instead.
    row = row_of(admin, job_id)
    assert (row.status, row.attempts, row.max_attempts, row.ahead, row.given_back) == (
        "queued",
        1,
        2,
        None,
        1,
    )
    [kept] = attempt_rows(admin, job_id)
    assert (kept.attempt, kept.worker, kept.outcome, kept.ended) == (1, GHOST, "given back", True)
    assert kept.error == "its worker process was gone before its handler started"
    info = await queue.job(job_id)
    assert info is not None and (info.state, info.worker_gone) == (JobState.QUEUED, False)
    assert [a.outcome for a in info.attempts] == ["given back"]
    assert await give_back(dsn) == []  # once


async def test_a_gone_process_that_comes_back_has_its_start_mark_heartbeat_and_ending_refused(
    make_queue, admin, dsn: str
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Pay", {}, max_attempts=1)
    claim_ahead(admin, "Pay", GHOST)
    silent(admin, GHOST, 5)
    assert [r.id for r in await give_back(dsn)] == [job_id]

    # It comes back before anyone claimed the job again: its start mark changes nothing.
    exchange(admin, GHOST, starts=f"{{{job_id}}}", started_attempts="{1}")
    assert (row_of(admin, job_id).status, row_of(admin, job_id).ahead) == ("queued", None)

    # Another process claims it: attempt 2, a number of its own.
    rescuer = uuid.uuid4()
    assert claim_ahead(admin, "Pay", rescuer).attempts == 2
    exchange(admin, rescuer, starts=f"{{{job_id}}}", started_attempts="{2}")
    assert (row_of(admin, job_id).status, row_of(admin, job_id).ahead) == ("running", None)

    # The late process: its start mark, heartbeat and ending of attempt 1 all refused.
    exchange(admin, GHOST, starts=f"{{{job_id}}}", started_attempts="{1}")
    beat = admin.execute(
        sql.HEARTBEAT, {"ids": f"{{{job_id}}}", "attempts": "{1}", "now": None}
    ).fetchall()
    assert beat == []  # its claim is gone
    ended = exchange(admin, GHOST, completed=f"{{{job_id}}}", completed_attempts="{1}")
    assert [r for r in ended if r.id is not None] == []  # no ending written
    failed = json.dumps([{"id": str(job_id), "attempts": 1, "status": "failed", "error": "late"}])
    exchange(admin, GHOST, endings=failed)
    row = row_of(admin, job_id)
    assert (row.status, row.attempts, row.error) == ("running", 2, None)
    assert [(a.attempt, a.worker, a.outcome) for a in attempt_rows(admin, job_id)] == [
        (1, GHOST, "given back"),
        (2, rescuer, None),
    ]

    # The replacement's own ending is written as usual.
    exchange(admin, rescuer, completed=f"{{{job_id}}}", completed_attempts="{2}")
    assert row_of(admin, job_id).status == "completed"


async def test_a_started_run_of_a_gone_process_waits_for_stale_recovery_shown_worker_gone(
    make_queue, admin, dsn: str
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Pay", {}, max_attempts=1)
    claim_ahead(admin, "Pay", GHOST)
    exchange(admin, GHOST, starts=f"{{{job_id}}}", started_attempts="{1}")  # started
    silent(admin, GHOST, 5)
    assert await give_back(dsn) == []
    assert row_of(admin, job_id).status == "running"
    info = await queue.job(job_id)
    assert info is not None and info.worker_gone
    async with queue.pool.connection() as conn:
        assert await run_async(conn, gone_jobs_call()) == {"Pay": 1}
    collector = QueueCollector(queue, registry=None)
    await collector.refresh()
    [family] = [f for f in collector.collect() if f.name == "axa_queue_worker_gone_jobs"]
    assert [(s.labels, s.value) for s in family.samples] == [({"job": "Pay"}, 1.0)]

    def cli(*args: str) -> str:
        done = CliRunner().invoke(main, [*args, "--dsn", dsn])
        assert done.exit_code == 0, done.output
        return done.output

    assert "running (worker gone)" in await asyncio.to_thread(cli, "show", str(job_id))
    found = json.loads(await asyncio.to_thread(cli, "show", str(job_id), "--json"))
    assert (found["state"], found["attempts"], found["worker_gone"]) == ("running", 1, True)
    assert [run["outcome"] for run in found["runs"]] == [None]
    # The keys docs/cli.md lists, `attempts` still the number of runs and `runs` the runs.
    assert list(found) == [
        *("id", "name", "state", "attempts", "max_attempts", "priority", "error", "timeout"),
        *("run_at", "started_at", "created_at", "updated_at", "unique_key", "unique_for"),
        *("given_back", "runs", "worker_gone", "steps"),
    ]
    assert list(found["runs"][0]) == [
        *("attempt", "outcome", "started_at", "ended_at", "error_class", "error", "worker"),
        *("host", "pid", "derived", "seconds"),
    ]
    listed = await asyncio.to_thread(cli, "jobs", "--state", "running", "--json")
    [one] = json.loads(listed)
    assert (one["attempts"], one["worker_gone"], one["runs"]) == (1, True, [])
    assert "running (worker gone)" in await asyncio.to_thread(cli, "jobs")


async def test_a_run_of_a_process_without_a_row_is_gone_only_once_it_too_is_silent(
    make_queue, admin, dsn: str
) -> None:
    # A process that has not written its row yet (it just started), or never does (a
    # `drain()`), renews its runs: never gone. One whose row went (a clean stop, or
    # forgotten after an hour) and whose runs are silent is.
    queue = await make_queue()
    job_id = await queue.enqueue("Pay", {}, max_attempts=1)
    claim_ahead(admin, "Pay", GHOST)
    assert await give_back(dsn) == []
    info = await queue.job(job_id)
    assert info is not None and not info.worker_gone
    admin.execute("UPDATE axa_queue SET updated_at = now() - interval '1 hour'")
    info = await queue.job(job_id)
    assert info is not None and info.worker_gone
    assert [r.id for r in await give_back(dsn)] == [job_id]


async def test_a_process_last_seen_before_the_server_started_keeps_its_runs_for_stale_recovery(
    make_queue, admin, dsn: str
) -> None:
    # A restart frees every process's presence lock; one whose event loop is blocked
    # across it cannot take its lock again until the loop runs: dead or blocked, its
    # runs are left to stale recovery.
    queue = await make_queue()
    job_id = await queue.enqueue("Pay", {}, max_attempts=1)
    claim_ahead(admin, "Pay", GHOST)
    silent(admin, GHOST, 5)
    admin.execute(
        "UPDATE axa_workers SET seen_at = pg_postmaster_start_time() - interval '1 second' "
        "WHERE id = %s",
        (GHOST,),
    )
    assert await give_back(dsn) == []
    assert row_of(admin, job_id).status == "running"

    silent(admin, GHOST, 5)  # it wrote its row since the start, then fell silent: gone
    assert [r.id for r in await give_back(dsn)] == [job_id]


async def test_a_process_never_gives_back_its_own_runs_nor_one_given_back_too_often(
    make_queue, admin, dsn: str
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Pay", {}, max_attempts=1)
    claim_ahead(admin, "Pay", GHOST)
    silent(admin, GHOST, 5)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        assert await give_back_gone(conn, 0.1, AttemptLimits(1), GHOST) == []
    admin.execute("UPDATE axa_queue SET given_back = %s", (sql.GIVE_BACK_LIMIT,))
    assert await give_back(dsn) == []  # left to stale recovery, which burns its attempt
    assert row_of(admin, job_id).status == "running"


# --- real worker processes -----------------------------------------------------------------


async def test_jobs_a_killed_process_claimed_ahead_are_queued_again_within_a_few_heartbeats(
    spawn,  # noqa: F811
    make_queue,
    admin,
    dsn: str,
) -> None:
    # One loop, three jobs claimed ahead: one runs, three wait. Stale recovery is an hour
    # away everywhere, so only the give-back of a gone process can free the three.
    queue = await make_queue()
    ids = [await queue.enqueue("Sleep", {"n": n}, max_attempts=1) for n in range(4)]
    doomed = await spawn(workers=1, prefetch=3, stale_after=3600)

    def claimed() -> bool:
        rows = admin.execute(
            "SELECT count(*) FILTER (WHERE ahead = attempts), count(*) FILTER (WHERE ahead IS NULL) "
            "FROM axa_queue WHERE status = 'running'"
        ).fetchone()
        return rows == (3, 1)

    await eventually(claimed)
    [started] = [
        i
        for (i,) in admin.execute(
            "SELECT id FROM axa_queue WHERE status = 'running' AND ahead IS NULL"
        ).fetchall()
    ]
    doomed.process.kill()  # SIGKILL: no cleanup, no final write
    assert await asyncio.wait_for(doomed.process.wait(), 10) == -signal.SIGKILL

    rescuer = await make_queue(
        workers=4, stale_after=3600, maintenance_interval=3600, give_back_gone=True
    )
    ran: list[int] = []
    rescuer.handle("Sleep", lambda args: ran.append(args["n"]))
    waiting = [i for i in ids if i != started]
    async with running(rescuer):
        await eventually(lambda: all(row_of(admin, i).status == "completed" for i in waiting))

        # The started run is left to stale recovery, shown as its worker's gone meanwhile:
        # once its own row, renewed by the last beat that reached it (which can land a
        # moment after the process's presence on a loaded machine), has been silent too.
        async def shown_gone() -> bool:
            info = await rescuer.job(started)
            assert info is not None and info.state is JobState.RUNNING
            return info.worker_gone

        await eventually(shown_gone)
    assert len(ran) == 3
    for job_id in waiting:
        row = row_of(admin, job_id)
        # Its given-back attempt 1 kept its number; attempt 2 ran, within the raised limit.
        assert (row.status, row.attempts, row.max_attempts, row.given_back) == (
            "completed",
            2,
            2,
            1,
        )
        assert [a.outcome for a in attempt_rows(admin, job_id)] == ["given back", "completed"]
    assert row_of(admin, started).status == "running"


# --- the plan: a busy table costs nothing while every process reports in --------------------


def plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += plan_nodes(child)
    return found


async def test_looking_for_gone_processes_reads_only_the_silent_running_rows(
    make_queue, admin
) -> None:
    # A run of a gone process, then 20,000 runs of live processes (claimed ahead, just
    # renewed: judged as of their last heartbeat, the statements' test clock, so that the
    # seconds this setup takes do not count as silence).
    await make_queue()
    admin.execute("INSERT INTO axa_queue (id, name, args) VALUES (gen_random_uuid(), 'Pay', '{}')")
    claim_ahead(admin, "Pay", GHOST)
    silent(admin, GHOST, 5)
    admin.execute(
        """INSERT INTO axa_queue (id, name, args, status, attempts, ahead, started_at, updated_at,
                                  run_worker, run_attempt)
        SELECT gen_random_uuid(), 'Pay', '{}', 'running', 1, 1, now(), now(), gen_random_uuid(), 1
        FROM generate_series(1, 20000)"""
    )
    admin.execute("ANALYZE axa_queue")
    [[beaten]] = admin.execute(
        "SELECT max(updated_at) FROM axa_queue WHERE status = 'running'"
    ).fetchall()
    pages = admin.execute(
        "SELECT relpages FROM pg_class WHERE oid = 'axa_queue'::regclass"
    ).fetchone()
    assert pages is not None and pages[0] > 100
    admin.execute("SET plan_cache_mode = force_generic_plan")
    params = {
        **AttemptLimits(1).params(),
        "give_back": sql.GIVE_BACK_LIMIT,
        "beat_ms": 100,
        "worker": uuid.uuid4(),
        "now": beaten,
    }
    for statement in (sql.GIVE_BACK_GONE, sql.WORKER_GONE_JOBS):
        with contextlib.suppress(Rollback), admin.transaction():
            [[explained]] = admin.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params
            ).fetchall()
            raise Rollback
        plan = explained[0]["Plan"]
        nodes = plan_nodes(plan)

        scans = {
            n.get("Index Name") or n["Node Type"]
            for n in nodes
            if n.get("Relation Name") == "axa_queue"
        }
        assert "Seq Scan" not in scans and "axa_queue_running" in scans, scans
        buffers = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
        assert buffers < pages[0] / 4, (statement[:30], buffers, pages[0])
        assert plan["Actual Rows"] == 1  # the gone process's run, given back or counted


# --- a real worker, stalled, taken for gone, coming back ---------------------------------------


def presence_locks(admin: psycopg.Connection[Any]) -> int:
    """How many presence locks (`sql.PRESENCE_HOLD`) this test's sessions hold (those
    named after its schema, as `admin` is)."""
    row = admin.execute(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s AND l.objsubid = 2 "
        "AND a.application_name = current_setting('application_name')",
        (sql.PRESENCE_LOCK,),
    ).fetchone()
    assert row is not None
    return int(row[0])


async def test_a_process_whose_event_loop_is_blocked_keeps_its_runs_claimed_ahead(
    make_queue, admin, dsn: str
) -> None:
    # One loop, one job running and one claimed ahead; the process falls silent (its
    # heartbeats seen an hour old), as one whose loop a handler blocks does. Its side
    # connection still holds its presence lock: nothing is given back.
    queue = await make_queue(workers=1, prefetch=1, heartbeat_interval=5.0, stale_after=600)
    first, second = Blocking(), Blocking()
    queue.handle("First", first)
    queue.handle("Second", second)
    await queue.enqueue("First", {}, priority=1, max_attempts=1)
    second_id = await queue.enqueue("Second", {}, max_attempts=1)
    async with running(queue):
        await asyncio.wait_for(first.started.wait(), 15)
        await eventually(lambda: row_of(admin, second_id).ahead == 1)
        # Its side connection is made at its first heartbeat and takes the lock then: a
        # moment after its first claim, which, on a loaded machine, the give-back below
        # could come before (as it could for a process stalled from its first moment).
        await eventually(lambda: presence_locks(admin) == 1)
        given = await give_back(dsn, now=later(admin, 3600))
        assert given == []
        assert row_of(admin, second_id).status == "running"
        first.release.set()
        second.release.set()
        await eventually(lambda: row_of(admin, second_id).status == "completed")
    assert (row_of(admin, second_id).attempts, row_of(admin, second_id).given_back) == (1, 0)


async def test_a_stalled_worker_whose_waiting_run_was_given_back_never_starts_it(
    make_queue, admin, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One loop, one job running and one claimed ahead. The worker stalls (its clock moves
    # on two of its heartbeat intervals, far less than half of stale_after): meanwhile
    # another process took it for gone and gave the waiting run back (it held no
    # presence lock: behind a transaction pooler, or its side connection made again).
    # So the check before the run starts finds its claim gone: its handler never starts
    # for attempt 1, and the job runs once, later, under attempt 2.
    monkeypatch.setattr(Connections, "hold_presence", _holds_nothing)
    beat = 5.0
    queue = await make_queue(workers=1, prefetch=1, heartbeat_interval=beat, stale_after=600)
    queue.connector.monotonic = clock = MovedClock()
    first, second = Blocking(), Blocking()
    queue.handle("First", first)
    queue.handle("Second", second)
    first_id = await queue.enqueue("First", {}, priority=1, max_attempts=1)
    second_id = await queue.enqueue("Second", {}, max_attempts=1)
    async with running(queue):
        await asyncio.wait_for(first.started.wait(), 15)
        await eventually(lambda: row_of(admin, second_id).ahead == 1)
        given = await give_back(dsn, now=later(admin, 3600))
        assert [r.id for r in given] == [second_id]  # the started one is left alone
        clock.move(2 * beat + 1)
        first.release.set()
        second.release.set()
        await eventually(
            lambda: second.calls == 1 and row_of(admin, second_id).status == "completed"
        )
    assert (row_of(admin, second_id).attempts, row_of(admin, second_id).given_back) == (2, 1)
    assert [a.outcome for a in attempt_rows(admin, second_id)] == ["given back", "completed"]
    assert row_of(admin, first_id).status == "completed"
