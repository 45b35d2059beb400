"""Heartbeats, stale recovery and fencing: a run is identified by its attempt, so one
that was given up on stops, goes to review, and never overwrites its replacement."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
import pytest

from axa_queue import JobState, QueueOptions, Recovered
from axa_queue.db.connector import Connector
from axa_queue.worker.connections import Connections
from conftest import MovedClock, eventually, exchange_waits, later, running, status_of

# A heartbeat that never comes during a test, for runs that must finish unobserved.
SLOW_BEAT = dict(heartbeat_interval=30, stale_after=60)


def updated_at(admin: psycopg.Connection[Any], job_id: UUID) -> datetime:
    row = admin.execute("SELECT updated_at FROM axa_queue WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row[0]


def take_claim(admin: psycopg.Connection[Any], job_id: UUID, how: str) -> None:
    """Do to a running job what a stale recovery (and a re-claim elsewhere) would."""
    if how == "reclaimed":
        statement = "UPDATE axa_queue SET attempts = attempts + 1, updated_at = now() WHERE id = %s"
    else:
        statement = (
            "UPDATE axa_queue SET status = 'queued', started_at = NULL, updated_at = now() "
            "WHERE id = %s"
        )
    assert admin.execute(statement, (job_id,)).rowcount == 1


def claim_by_hand(admin: psycopg.Connection[Any], job_id: UUID, attempts: int = 1) -> None:
    """Mark a job running as a process that then died would have left it."""
    admin.execute(
        "UPDATE axa_queue SET status = 'running', attempts = %s, started_at = now(), "
        "updated_at = now() WHERE id = %s",
        (attempts, job_id),
    )


class Blocking:
    """A handler that signals when it starts and runs until released or cancelled."""

    def __init__(self, outcome: str = "return") -> None:
        self.outcome = outcome
        self.calls = 0
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.finished = asyncio.Event()

    async def __call__(self, args: Any) -> None:
        self.calls += 1
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        self.finished.set()
        if self.outcome == "raise":
            raise RuntimeError("told to fail")


# --- heartbeats ------------------------------------------------------------------------


async def test_a_running_job_reports_in_every_heartbeat_interval(make_queue, admin) -> None:
    queue = await make_queue(heartbeat_interval=0.1, stale_after=0.5)
    handler = Blocking()
    queue.handle("Long", handler)
    job_id = await queue.enqueue("Long", {})
    async with running(queue):
        await asyncio.wait_for(handler.started.wait(), 15)
        seen = [updated_at(admin, job_id)]

        def moved() -> bool:
            now = updated_at(admin, job_id)
            if now > seen[-1]:
                seen.append(now)
            return len(seen) >= 4

        await eventually(moved, timeout=5)
        # Reporting in keeps it alive well past the stale period: wait until it has
        # reported in for longer than that since it started (seen in its row).
        started = admin.execute(
            "SELECT started_at FROM axa_queue WHERE id = %s", (job_id,)
        ).fetchone()
        assert started is not None
        await eventually(lambda: (updated_at(admin, job_id) - started[0]).total_seconds() > 0.7)
        assert await queue.recover_stale() == []
        assert status_of(admin, job_id) == ("running", None, 1)
        handler.release.set()
        await eventually(lambda: status_of(admin, job_id)[0] == "completed")
    assert handler.calls == 1
    assert status_of(admin, job_id) == ("completed", None, 1)


# --- stale recovery --------------------------------------------------------------------


async def test_a_job_not_heard_from_for_stale_after_is_queued_again_when_it_has_attempts_left(
    make_queue, admin
) -> None:
    queue = await make_queue(stale_after=0.5)
    job_id = await queue.enqueue("Lost", {}, max_attempts=2)
    claim_by_hand(admin, job_id)
    assert await queue.recover_stale() == [], "not stale yet"
    after = later(admin, 0.6)  # let the stale period pass
    recovered = await queue.recover_stale(now=after)
    assert recovered == [Recovered(job_id, "Lost", 1, JobState.QUEUED)]
    row = admin.execute(
        "SELECT status, error, attempts, started_at FROM axa_queue WHERE id = %s", (job_id,)
    ).fetchone()
    assert row == ("queued", None, 1, None)
    assert await queue.recover_stale(now=after) == [], "recovered once"


async def test_a_job_not_heard_from_for_stale_after_with_no_attempts_left_fails(
    make_queue, admin
) -> None:
    queue = await make_queue(stale_after=0.5)
    own_limit = await queue.enqueue("Lost", {}, max_attempts=2)
    default_limit = await queue.enqueue("Lost", {})  # the queue's max_attempts, one
    claim_by_hand(admin, own_limit, attempts=2)
    claim_by_hand(admin, default_limit, attempts=1)
    recovered = await queue.recover_stale(now=later(admin, 0.6))
    assert sorted(recovered, key=lambda r: r.id) == sorted(
        [
            Recovered(own_limit, "Lost", 2, JobState.FAILED),
            Recovered(default_limit, "Lost", 1, JobState.FAILED),
        ],
        key=lambda r: r.id,
    )
    assert status_of(admin, own_limit) == ("failed", "abandoned by its worker", 2)
    assert status_of(admin, default_limit) == ("failed", "abandoned by its worker", 1)


async def test_stale_recovery_counts_attempts_against_the_recovering_queues_default(
    make_queue, admin
) -> None:
    queue = await make_queue(stale_after=0.5, max_attempts=3)
    job_id = await queue.enqueue("Lost", {})
    claim_by_hand(admin, job_id, attempts=2)
    after = later(admin, 0.6)
    assert await queue.recover_stale(now=after) == [Recovered(job_id, "Lost", 2, JobState.QUEUED)]
    assert status_of(admin, job_id) == ("queued", None, 2)


async def test_a_dry_run_of_stale_recovery_says_what_it_would_do_and_changes_nothing(
    make_queue, admin
) -> None:
    queue = await make_queue(stale_after=0.5)
    again = await queue.enqueue("Lost", {}, max_attempts=2)
    out = await queue.enqueue("Lost", {})
    claim_by_hand(admin, again)
    claim_by_hand(admin, out)
    after = later(admin, 0.6)
    before = admin.execute("SELECT * FROM axa_queue ORDER BY id").fetchall()
    assert await queue.recover_stale(dry_run=True) == [], "not stale yet"
    planned = await queue.recover_stale(dry_run=True, now=after)
    assert {(r.id, r.state) for r in planned} == {
        (again, JobState.QUEUED),
        (out, JobState.FAILED),
    }
    assert admin.execute("SELECT * FROM axa_queue ORDER BY id").fetchall() == before
    assert await queue.recover_stale(dry_run=True, now=after) == planned
    done = await queue.recover_stale(now=after)
    assert {(r.id, r.state) for r in done} == {(r.id, r.state) for r in planned}
    assert status_of(admin, again)[0] == "queued"
    assert status_of(admin, out)[0] == "failed"


async def test_any_running_queue_recovers_a_stale_job_and_runs_it_again(make_queue, admin) -> None:
    queue = await make_queue(stale_after=0.5, maintenance_interval=0.1)
    ran: list[Any] = []
    queue.handle("Lost", ran.append)
    job_id = await queue.enqueue("Lost", {"n": 1}, max_attempts=2)
    claim_by_hand(admin, job_id)  # a process that claimed it and died
    async with running(queue):
        await eventually(lambda: status_of(admin, job_id)[0] == "completed")
    assert ran == [{"n": 1}]
    assert status_of(admin, job_id) == ("completed", None, 2)


# --- fencing ---------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["reclaimed", "requeued"])
async def test_a_run_that_finds_its_claim_taken_stops_its_handler_and_goes_to_review(
    make_queue, admin, how: str
) -> None:
    # One loop and nothing claimed ahead, so this process cannot claim the job again
    # itself.
    queue = await make_queue(workers=1, prefetch=0, heartbeat_interval=0.1, stale_after=5)
    handler = Blocking()
    queue.handle("Long", handler)
    job_id = await queue.enqueue("Long", {}, max_attempts=3)
    async with running(queue):
        await asyncio.wait_for(handler.started.wait(), 15)
        take_claim(admin, job_id, how)
        await asyncio.wait_for(handler.cancelled.wait(), 5)
        await eventually(lambda: status_of(admin, job_id)[0] == "needs_review")
    assert not handler.finished.is_set()
    assert handler.calls == 1
    status, error, _ = status_of(admin, job_id)
    assert status == "needs_review"
    assert error is not None and error.startswith("stopped:"), error
    info = await queue.job(job_id)
    assert info is not None and info.state is JobState.NEEDS_REVIEW


@pytest.mark.parametrize(
    ("outcome", "max_attempts"),
    [("return", 1), ("raise", 3), ("raise", 1)],
    ids=["completed", "failed-with-attempts-left", "failed-for-good"],
)
async def test_a_run_that_finishes_after_losing_its_claim_cannot_record_its_result(
    make_queue, admin, outcome: str, max_attempts: int
) -> None:
    queue = await make_queue(workers=1, **SLOW_BEAT)
    handler = Blocking(outcome)
    queue.handle("Long", handler)
    job_id = await queue.enqueue("Long", {}, max_attempts=max_attempts)
    async with running(queue):
        await asyncio.wait_for(handler.started.wait(), 15)
        take_claim(admin, job_id, "reclaimed")
        handler.release.set()
        await eventually(lambda: status_of(admin, job_id)[0] == "needs_review")
    assert handler.finished.is_set() and handler.calls == 1
    status, error, attempts = status_of(admin, job_id)
    assert (status, attempts) == ("needs_review", 2)
    assert error is not None and error.startswith("stopped:"), error
    assert "finished after" in error


async def test_a_job_in_review_is_never_retried_by_itself(make_queue, admin) -> None:
    queue = await make_queue(
        workers=1, heartbeat_interval=0.1, stale_after=0.5, maintenance_interval=0.1
    )
    handler = Blocking()
    queue.handle("Long", handler)
    job_id = await queue.enqueue("Long", {}, max_attempts=5)
    async with running(queue):
        await asyncio.wait_for(handler.started.wait(), 15)
        take_claim(admin, job_id, "reclaimed")
        await eventually(lambda: status_of(admin, job_id)[0] == "needs_review")
        in_review = status_of(admin, job_id)
        # Housekeeping rounds run: proven by canaries they act on, a run left stale
        # (queued again) and a job finished long ago (purged).
        stale = await queue.enqueue("Canary", {}, max_attempts=2)
        claim_by_hand(admin, stale)
        admin.execute(
            "UPDATE axa_queue SET updated_at = now() - interval '1 hour' WHERE id = %s", (stale,)
        )
        old = await queue.enqueue("Canary", {})
        admin.execute(
            "UPDATE axa_queue SET status = 'completed', updated_at = now() - interval '1000 days' "
            "WHERE id = %s",
            (old,),
        )
        await eventually(lambda: status_of(admin, stale)[0] == "queued")
        await eventually(
            lambda: (
                admin.execute("SELECT 1 FROM axa_queue WHERE id = %s", (old,)).fetchone() is None
            )
        )
        admin.execute("DELETE FROM axa_queue WHERE id = %s", (stale,))
        assert status_of(admin, job_id) == in_review
        assert await queue.recover_stale(now=later(admin, 3600)) == []
    assert await queue.purge(older_than=0, now=later(admin, 3600)) == 0
    assert status_of(admin, job_id) == in_review
    assert handler.calls == 1
    counts = await queue.counts()
    assert counts.needs_review == 1 and counts.ready == 0 and counts.running == 0


@pytest.mark.parametrize("outcome", ["return", "raise"])
async def test_a_stale_run_can_never_overwrite_the_result_of_its_replacement(
    make_queue, admin, outcome: str
) -> None:
    # The old run: one loop, nothing claimed ahead (so its process never claims the job
    # again), and no heartbeat during the test, so it never notices.
    old_queue = await make_queue(workers=1, prefetch=0, **SLOW_BEAT)
    old = Blocking(outcome)
    old_queue.handle("Job", old)
    # The replacement, in another "process", recovers and reruns the job.
    new_queue = await make_queue(workers=1, stale_after=0.5)
    new_runs: list[Any] = []
    new_queue.handle("Job", new_runs.append)

    job_id = await old_queue.enqueue("Job", {}, max_attempts=2)
    async with running(old_queue):
        await asyncio.wait_for(old.started.wait(), 15)
        # The old run goes quiet, as if its process hung (stale to the new queue only).
        admin.execute(
            "UPDATE axa_queue SET updated_at = now() - interval '10 s' WHERE id = %s",
            (job_id,),
        )
        assert await new_queue.recover_stale() == [Recovered(job_id, "Job", 1, JobState.QUEUED)]
        async with running(new_queue):
            await eventually(lambda: status_of(admin, job_id)[0] == "completed")
        replaced = admin.execute("SELECT * FROM axa_queue WHERE id = %s", (job_id,)).fetchone()
        old.release.set()  # the old run now ends; stopping waits for its write
    assert old.finished.is_set()
    assert new_runs == [{}]
    assert status_of(admin, job_id) == ("completed", None, 2)
    assert admin.execute("SELECT * FROM axa_queue WHERE id = %s", (job_id,)).fetchone() == replaced


async def test_a_run_that_finishes_after_losing_its_claim_stops_its_replacement_too(
    make_queue, admin
) -> None:
    # Nothing claimed ahead: the old process never claims the job again itself.
    old_queue = await make_queue(workers=1, prefetch=0, **SLOW_BEAT)
    old = Blocking()
    old_queue.handle("Job", old)
    new_queue = await make_queue(workers=1, heartbeat_interval=0.1, stale_after=0.5)
    new = Blocking()
    new_queue.handle("Job", new)

    job_id = await old_queue.enqueue("Job", {}, max_attempts=2)
    async with running(old_queue):
        await asyncio.wait_for(old.started.wait(), 15)
        admin.execute(
            "UPDATE axa_queue SET updated_at = now() - interval '10 s' WHERE id = %s",
            (job_id,),
        )
        assert len(await new_queue.recover_stale()) == 1
        async with running(new_queue):
            await asyncio.wait_for(new.started.wait(), 15)
            assert status_of(admin, job_id) == ("running", None, 2)
            old.release.set()
            # The old run finds its claim gone and sends the job to review; the
            # replacement sees that at its next report and is stopped too.
            await asyncio.wait_for(new.cancelled.wait(), 10)
    assert not new.finished.is_set()
    status, error, attempts = status_of(admin, job_id)
    assert (status, attempts) == ("needs_review", 2)
    assert error is not None and error.startswith("stopped:")


async def test_fencing_is_per_run_so_other_jobs_of_the_process_carry_on(make_queue, admin) -> None:
    queue = await make_queue(workers=2, heartbeat_interval=0.1, stale_after=5)
    lost = Blocking()
    kept = Blocking()
    queue.handle("Lost", lost)
    queue.handle("Kept", kept)
    lost_id = await queue.enqueue("Lost", {})
    kept_id = await queue.enqueue("Kept", {})
    async with running(queue):
        await asyncio.wait_for(lost.started.wait(), 15)
        await asyncio.wait_for(kept.started.wait(), 15)
        take_claim(admin, lost_id, "reclaimed")
        await eventually(lambda: status_of(admin, lost_id)[0] == "needs_review")
        assert not kept.cancelled.is_set()
        assert status_of(admin, kept_id)[0] == "running"
        kept.release.set()
        await eventually(lambda: status_of(admin, kept_id)[0] == "completed")
    assert status_of(admin, kept_id) == ("completed", None, 1)


async def test_endings_gathered_in_one_statement_are_each_fenced_by_their_own_attempt(
    make_queue, admin
) -> None:
    # Jobs claimed ahead keep both loops busy, so endings gather before they are sent;
    # the one whose claim was taken in the meantime goes to review, the others complete.
    queue = await make_queue(workers=2, prefetch=8, **SLOW_BEAT)
    victim: list[UUID] = []

    @queue.handler("Short")
    async def short(args: dict[str, int]) -> None:
        await asyncio.sleep(0.002)
        if args["n"] == 5:
            take_claim(admin, victim[0], "reclaimed")

    ids = [await queue.enqueue("Short", {"n": n}, priority=20 - n) for n in range(20)]
    victim.append(ids[5])
    async with running(queue):
        await eventually(
            lambda: (
                admin.execute(
                    "SELECT count(*) FROM axa_queue WHERE status IN ('queued', 'running')"
                ).fetchone()
                == (0,)
            )
        )
    status, error, attempts = status_of(admin, ids[5])
    assert (status, attempts) == ("needs_review", 2)
    assert error is not None and "finished after" in error
    assert admin.execute(
        "SELECT count(*), max(attempts) FROM axa_queue WHERE status = 'completed'"
    ).fetchone() == (19, 1)


# --- stalls: a claim held up, a loop blocked, a claim gone before its run starts ------------


async def test_a_claim_held_up_behind_a_lock_longer_than_stale_after_is_not_stale_when_it_lands(
    make_queue, admin, dsn
) -> None:
    # No heartbeat and no proof before the run starts (both would stamp the row again):
    # what the rescuer judges is the claim's own stamp.
    queue = await make_queue(workers=1, **SLOW_BEAT)
    handler = Blocking()
    queue.handle("Long", handler)
    job_id = await queue.enqueue("Long", {})
    rescuer = await make_queue(**SLOW_BEAT)
    with psycopg.connect(dsn) as holder:
        # An application's transaction holds a lock every claim needs.
        holder.execute("LOCK TABLE axa_queue IN SHARE MODE")
        async with running(queue):
            await eventually(lambda: exchange_waits(admin) > 0)
            # The rescuer looks stale_after after this moment, which is after the
            # claim's statement began: to it, the claim waited longer than stale_after.
            waited = later(admin, SLOW_BEAT["stale_after"])
            holder.rollback()
            await asyncio.wait_for(handler.started.wait(), 15)
            # Right after it lands, no one may take it for abandoned.
            assert await rescuer.recover_stale(now=waited) == []
            assert status_of(admin, job_id) == ("running", None, 1)
            handler.release.set()
            await eventually(lambda: status_of(admin, job_id)[0] == "completed")
    assert handler.calls == 1


async def test_a_refused_ending_never_claims_the_same_job_again_in_its_statement(
    make_queue, admin, caplog
) -> None:
    # One loop, nothing claimed ahead (no free place to claim the job again before its
    # ending is refused) and no heartbeat during the test: the run ends after another
    # process's recovery queued its job again, as a worker whose event loop was
    # blocked would.
    queue = await make_queue(workers=1, prefetch=0, **SLOW_BEAT)
    handler = Blocking()
    queue.handle("Long", handler)
    job_id = await queue.enqueue("Long", {}, max_attempts=3)
    async with running(queue):
        await asyncio.wait_for(handler.started.wait(), 15)
        take_claim(admin, job_id, "requeued")
        handler.release.set()
        await eventually(lambda: status_of(admin, job_id)[0] == "needs_review")
    assert handler.calls == 1, "the job ran again after its run lost its claim"
    assert status_of(admin, job_id)[2] == 1
    assert any("now waits for review" in r.getMessage() for r in caplog.records)


async def test_a_claimed_job_whose_claim_is_gone_before_a_loop_takes_it_never_starts(
    make_queue, admin, caplog
) -> None:
    # One loop and one job claimed ahead; no heartbeat comes in time (the worker's clock
    # moves past half of stale_after, as when its event loop is blocked), so only the
    # check before it starts can tell.
    queue = await make_queue(workers=1, prefetch=1, **SLOW_BEAT)
    queue.connector.monotonic = clock = MovedClock()
    first = Blocking()
    second = Blocking()
    queue.handle("First", first)
    queue.handle("Second", second)
    first_id = await queue.enqueue("First", {}, priority=1)
    second_id = await queue.enqueue("Second", {})
    async with running(queue):
        await asyncio.wait_for(first.started.wait(), 15)
        await eventually(lambda: status_of(admin, second_id) == ("running", None, 1))
        take_claim(admin, second_id, "reclaimed")  # another worker runs it now
        clock.move(SLOW_BEAT["stale_after"] / 2 + 1)
        first.release.set()
        await eventually(lambda: status_of(admin, first_id)[0] == "completed")
        await eventually(lambda: any("attempt 2" in r.getMessage() for r in caplog.records))
    assert second.calls == 0, "a handler started after its claim was gone"
    # It never ran here, so nothing needs a person: the other run goes on.
    assert status_of(admin, second_id) == ("running", None, 2)


async def test_a_run_whose_job_another_run_completed_leaves_it_completed_and_says_so(
    make_queue, admin, caplog
) -> None:
    queue = await make_queue(workers=1, **SLOW_BEAT)
    handler = Blocking()
    queue.handle("Long", handler)
    job_id = await queue.enqueue("Long", {}, max_attempts=3)
    async with running(queue):
        await asyncio.wait_for(handler.started.wait(), 15)
        # Recovered, claimed and completed elsewhere while this run went on.
        admin.execute(
            "UPDATE axa_queue SET status = 'completed', attempts = 2, updated_at = now() "
            "WHERE id = %s",
            (job_id,),
        )
        handler.release.set()
        await eventually(
            lambda: any("attempt 2, which completed" in r.getMessage() for r in caplog.records)
        )
    assert status_of(admin, job_id) == ("completed", None, 2)
    assert not any("waits for review" in r.getMessage() for r in caplog.records)


async def test_a_schedule_tick_never_leaves_a_transaction_open_between_statements(
    make_queue, monkeypatch
) -> None:
    from axa_queue import NewJob, Schedule

    queue = await make_queue()
    queue.schedule(Schedule.every("tick", 1, NewJob("Tick", {})))
    left_open: list[str] = []
    real = psycopg.AsyncCursor.execute

    async def watched(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        result = await real(self, query, *args, **kwargs)
        if self.connection.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            left_open.append(str(query)[:40])
        return result

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", watched)
    assert await queue.tick_schedules() == 1
    assert left_open == [], "a transaction stayed open while the event loop went on"


async def test_stale_recovery_never_takes_back_a_run_the_recovering_process_holds(
    make_queue, admin, dsn
) -> None:
    from axa_queue import maintenance
    from axa_queue.limits import AttemptLimits

    queue = await make_queue(stale_after=0.5)
    job_id = await queue.enqueue("Lost", {}, max_attempts=3)
    claim_by_hand(admin, job_id, attempts=2)
    admin.execute(
        "UPDATE axa_queue SET updated_at = now() - interval '10 s' WHERE id = %s", (job_id,)
    )
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        # This process runs attempt 2 itself (its heartbeats were only late).
        mine = (f"{{{job_id}}}", "{2}")
        assert await maintenance.recover_stale(conn, 0.5, AttemptLimits(3), held=mine) == []
        assert status_of(admin, job_id) == ("running", None, 2)
        # An older attempt of the same job is not this run: the row is recovered.
        older = (f"{{{job_id}}}", "{1}")
        assert await maintenance.recover_stale(conn, 0.5, AttemptLimits(3), held=older) == [
            Recovered(job_id, "Lost", 2, JobState.QUEUED)
        ]


async def test_a_side_statement_the_database_never_answers_is_given_up_and_its_connection_dropped(
    dsn: str,
) -> None:
    # A connection cut without a word (a network partition) leaves a statement waiting
    # for hours: heartbeats must fail within stale_after, so a run that cannot report in
    # stops before a peer recovers its job. The server's pg_sleep stands in for silence.
    connections = Connections(Connector(QueueOptions(), dsn), stale=2.0)
    try:
        assert (await connections.on_side("SELECT 1 AS one", None))[0].one == 1
        first = connections.side
        assert first is not None
        with pytest.raises(psycopg.OperationalError, match="did not answer within 1 s"):
            await connections.on_side("SELECT pg_sleep(60)", None)
        assert connections.side is None and first.closed
        assert connections.broken_at > 0
        assert (await connections.on_side("SELECT 1 AS one", None))[0].one == 1
    finally:
        await connections.close()


# --- runs claimed ahead ----------------------------------------------------------------


def exchange(
    admin: psycopg.Connection[Any],
    *,
    completed: list[UUID] = (),  # type: ignore[assignment]
    starts: list[UUID] = (),  # type: ignore[assignment]
    attempts: int = 1,
    wanted: str = "[]",
    free: int = 0,
    idle: int = 0,
) -> list[Any]:
    """Send `sql.EXCHANGE` as a worker would: completed runs, start marks (each of
    `attempts`), and a claim."""
    from axa_queue import sql

    return admin.execute(
        sql.EXCHANGE,
        {
            "completed": "{" + ",".join(map(str, completed)) + "}",
            "completed_attempts": "{" + ",".join(str(attempts) for _ in completed) + "}",
            "endings": "[]",
            "free": free,
            "wanted": wanted,
            "losing": "{}",
            "now": None,
            "idle": idle,
            "starts": "{" + ",".join(map(str, starts)) + "}",
            "started_attempts": "{" + ",".join(str(attempts) for _ in starts) + "}",
            "worker": None,
            "host": "test",
            "pid": 1,
            "limits": "{}",
            "max": None,
        },
    ).fetchall()


def ahead_of(admin: psycopg.Connection[Any], job_id: UUID) -> tuple[Any, ...]:
    row = admin.execute(
        "SELECT status, attempts, ahead, max_attempts, given_back FROM axa_queue WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    return tuple(row)


async def test_a_claim_starts_as_many_jobs_as_loops_are_idle_and_stamps_the_others_ahead(
    make_queue, admin
) -> None:
    queue = await make_queue()
    first = await queue.enqueue("Ahead", {}, priority=2)
    second = await queue.enqueue("Ahead", {}, priority=1)
    third = await queue.enqueue("Ahead", {})
    rows = exchange(admin, wanted='[{"name": "Ahead", "cap": 3}]', free=3, idle=1)
    assert sorted((row[0], row[-1]) for row in rows) == sorted(
        [(str(first), False), (str(second), True), (str(third), True)]
    )
    assert ahead_of(admin, first) == ("running", 1, None, None, 0)
    assert ahead_of(admin, second) == ("running", 1, 1, None, 0)
    # A loop takes the second: the next statement marks its start, and only its own.
    exchange(admin, starts=[second])
    assert ahead_of(admin, second) == ("running", 1, None, None, 0)
    assert ahead_of(admin, third) == ("running", 1, 1, None, 0)


async def test_a_stalled_process_whose_waiting_runs_were_given_back_can_neither_mark_nor_end_them(
    make_queue, admin
) -> None:
    queue = await make_queue(stale_after=1.0)
    job_id = await queue.enqueue("Ahead", {}, max_attempts=1)
    exchange(admin, wanted='[{"name": "Ahead", "cap": 1}]', free=1, idle=0)
    assert ahead_of(admin, job_id) == ("running", 1, 1, 1, 0)
    # Its process stalls; recovery gives the attempt back, keeping the attempt number.
    [back] = await queue.recover_stale(now=later(admin, 3600))
    assert (back.attempts, back.state) == (1, JobState.QUEUED)
    assert ahead_of(admin, job_id) == ("queued", 1, 1, 2, 1)
    # The process wakes: its start mark and its ending of attempt 1 are refused.
    assert exchange(admin, starts=[job_id]) == []
    assert ahead_of(admin, job_id) == ("queued", 1, 1, 2, 1)
    assert exchange(admin, completed=[job_id]) == [], "an ending of a given-back run landed"
    assert ahead_of(admin, job_id) == ("queued", 1, 1, 2, 1)
    # Claimed again (attempt 2, started at once), the old run is fenced all the same.
    exchange(admin, wanted='[{"name": "Ahead", "cap": 1}]', free=1, idle=1)
    assert ahead_of(admin, job_id) == ("running", 2, None, 2, 1)
    assert exchange(admin, starts=[job_id], completed=[job_id]) == []
    assert ahead_of(admin, job_id) == ("running", 2, None, 2, 1)


async def test_a_waiting_run_whose_attempt_was_given_back_never_starts_and_its_job_runs_again(
    make_queue, admin, caplog
) -> None:
    # One loop and one job claimed ahead; the worker's clock moves past half of
    # stale_after (as when its event loop is blocked) while recovery gives the waiting
    # run's attempt back, so the check before it starts finds its claim gone: its
    # handler never starts, and the job runs once, later, under a new attempt, its
    # attempts intact.
    queue = await make_queue(workers=1, prefetch=1, **SLOW_BEAT)
    queue.connector.monotonic = clock = MovedClock()
    first = Blocking()
    second = Blocking()
    queue.handle("First", first)
    queue.handle("Second", second)
    first_id = await queue.enqueue("First", {}, priority=1, max_attempts=5)
    second_id = await queue.enqueue("Second", {}, max_attempts=1)
    async with running(queue):
        await asyncio.wait_for(first.started.wait(), 15)
        await eventually(lambda: ahead_of(admin, second_id) == ("running", 1, 1, 1, 0))
        other = await make_queue(**SLOW_BEAT)
        recovered = await other.recover_stale(now=later(admin, 3600))
        assert {(r.id, r.state) for r in recovered} == {
            (first_id, JobState.QUEUED),
            (second_id, JobState.QUEUED),
        }
        clock.move(SLOW_BEAT["stale_after"] / 2 + 1)
        first.release.set()
        second.release.set()
        await eventually(
            lambda: second.calls == 1 and status_of(admin, second_id)[0] == "completed"
        )
    assert status_of(admin, second_id) == ("completed", None, 2)
    assert ahead_of(admin, second_id)[3:] == (2, 1)  # its attempt given back once


def test_a_job_given_back_says_so_in_its_info_on_the_command_line_and_on_the_dashboard(
    dsn: str, admin
) -> None:
    from starlette.testclient import TestClient

    from axa_queue import Queue, SyncQueue
    from axa_queue.web.app import create_app
    from test_cli import cli
    from test_web import ORIGIN, TOKEN

    async def setup() -> None:
        async with Queue(dsn):
            pass

    asyncio.run(setup())
    with SyncQueue(dsn) as jobs:
        given = jobs.enqueue("Report")
        plain = jobs.enqueue("Report")
        admin.execute("UPDATE axa_queue SET given_back = 2 WHERE id = %s", (given,))
        info = jobs.job(given)
        assert info is not None and info.given_back == 2
        plain_info = jobs.job(plain)
        assert plain_info is not None and plain_info.given_back == 0
    shown = cli("show", str(given), dsn=dsn).stdout
    assert "given back" in shown and "never started" in shown
    assert "given back" not in cli("show", str(plain), dsn=dsn).stdout
    assert json.loads(cli("show", str(given), "--json", dsn=dsn).stdout)["given_back"] == 2
    board = TestClient(create_app(dsn, token=TOKEN))
    board.post("/signin", data={"token": TOKEN, "name": "alice"}, headers=ORIGIN)
    assert '<dd id="job-given-back">2 tries' in board.get(f"/jobs/{given}").text
    assert "job-given-back" not in board.get(f"/jobs/{plain}").text
