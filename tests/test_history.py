"""The history: finished jobs leave `axa_queue` for `axa_queue_history` (partitioned by
day) in bounded batches after `keep_recent`, every read finds them as before, and
retention drops whole days."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta, timezone
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg.rows import namedtuple_row
from psycopg.types.json import Jsonb

import seed_crate as crate
from axa_queue import ActKind, JobState, Queue, cancel, history, retry, sql
from axa_queue.cli import main
from axa_queue.web import create_app
from conftest import acting_role, eventually, later, lock_waits, running, status_of
from moves import WEEK, make_days, move_all
from test_big_reads import nodes
from test_compat import crate_claim, crate_enqueue
from test_web import ORIGIN, SECRET, TOKEN, csrf_of, seed, signed_in


def seed_finished(admin: psycopg.Connection[Any], count: int, ago: str = "1 hour") -> None:
    """`count` finished jobs (completed, failed, cancelled in turn), finished `ago`."""
    admin.execute(
        """INSERT INTO axa_queue (id, name, args, status, attempts, created_at, updated_at)
        SELECT gen_random_uuid(), 'Old', '{}', (ARRAY['completed', 'failed', 'cancelled'])[1 + g %% 3],
               1, now() - %(ago)s::interval, now() - %(ago)s::interval
        FROM generate_series(1, %(count)s) g""",
        {"count": count, "ago": ago},
    )


def days_through_ahead(admin: psycopg.Connection[Any], ago: str) -> int:
    """How many day partitions run from the day of `ago` (UTC) to `AHEAD_DAYS` after
    today: what a move makes when the oldest finished job finished `ago`."""
    row = admin.execute(
        "SELECT (now() AT TIME ZONE 'UTC')::date - ((now() - %s::interval) AT TIME ZONE 'UTC')::date",
        (ago,),
    ).fetchone()
    assert row is not None
    return int(row[0]) + 1 + history.AHEAD_DAYS


def where(admin: psycopg.Connection[Any], job_id: uuid.UUID) -> tuple[int, int]:
    """How many rows of the job `axa_queue` and the history hold."""
    hot = admin.execute("SELECT count(*) FROM axa_queue WHERE id = %s", (job_id,)).fetchone()
    moved = admin.execute(
        "SELECT count(*) FROM axa_queue_history WHERE id = %s", (job_id,)
    ).fetchone()
    assert hot is not None and moved is not None
    return int(hot[0]), int(moved[0])


def finish(admin: psycopg.Connection[Any], job_id: uuid.UUID, status: str, ago: str) -> None:
    admin.execute(
        "UPDATE axa_queue SET status = %s, attempts = 1, updated_at = now() - %s::interval "
        "WHERE id = %s",
        (status, ago, job_id),
    )


async def connect(dsn: str) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(dsn, autocommit=True)


# --- moving --------------------------------------------------------------------------------


async def test_finished_jobs_move_in_bounded_batches_and_live_ones_stay(
    make_queue, admin, dsn: str
) -> None:
    queue = await make_queue()
    seed_finished(admin, 45)
    queued = await queue.enqueue("Live", {})
    review = await queue.enqueue("Review", {})
    finish(admin, review, "needs_review", "1 hour")
    async with await connect(dsn) as conn:
        first = await history.move(conn, 60, WEEK, batch=10, most=25)
        # The oldest finished job's day (an hour ago), today and 2 ahead: not a week back.
        assert first.moved == 25 and first.made == days_through_ahead(admin, "1 hour")
        rest = await history.move(conn, 60, WEEK, batch=10)
        assert (rest.moved, rest.made) == (20, 0)
    counts = admin.execute(
        "SELECT (SELECT count(*) FROM axa_queue), (SELECT count(*) FROM axa_queue_history)"
    ).fetchone()
    assert counts == (2, 45)
    assert where(admin, queued) == (1, 0) and where(admin, review) == (1, 0)


async def test_a_job_finished_less_than_keep_recent_ago_stays_hot(
    make_queue, admin, dsn: str
) -> None:
    queue = await make_queue()
    job = await queue.enqueue("Quick", {})
    finish(admin, job, "completed", "30 seconds")
    async with await connect(dsn) as conn:
        assert (await history.move(conn, 60, WEEK)).moved == 0
        assert (await history.move(conn, 60, WEEK, dry_run=True)).moved == 0
        assert (await history.move(conn, 60, WEEK, now=later(admin, 31), dry_run=True)).moved == 1
        assert (await history.move(conn, 60, WEEK, now=later(admin, 31))).moved == 1
    assert where(admin, job) == (0, 1)


async def test_the_move_reads_the_finished_index_in_order_a_batch_at_a_time(
    make_queue, admin
) -> None:
    await make_queue()
    seed_finished(admin, 20_000)
    admin.execute("INSERT INTO axa_queue (id, name, args) "
                  "SELECT gen_random_uuid(), 'Live', '{}' FROM generate_series(1, 20000)")  # fmt: skip
    admin.execute("ANALYZE axa_queue")
    since = make_days(admin)
    with admin.transaction(force_rollback=True):
        plan = "\n".join(
            r[0]
            for r in admin.execute(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql.HISTORY_MOVE,
                {"keep": 60, "since": since, "batch": 100, "now": None},
            )
        )
    assert "axa_queue_finished" in plan, plan
    assert "Seq Scan on axa_queue " not in plan, plan
    assert "Index Scan using axa_queue_finished on axa_queue" in plan, plan


async def test_a_moves_next_batch_starts_where_the_last_ended_past_jobs_it_must_keep(
    make_queue, admin
) -> None:
    await make_queue()
    # 2,000 jobs whose unique key is still held (they stay), finished before 1,500 that move.
    admin.execute(
        """INSERT INTO axa_queue (id, name, args, status, attempts, created_at, updated_at,
               unique_key, unique_for_ms)
           SELECT gen_random_uuid(), 'Held', '{}', 'completed', 1, now() - interval '2 hours',
                  now() - interval '2 hours', 'key-' || g, 86400000
           FROM generate_series(1, 2000) g"""
    )
    seed_finished(admin, 1_500)
    admin.execute("ANALYZE axa_queue")
    since = make_days(admin)
    params = {"keep": 60, "since": since, "batch": 1000, "now": None}
    row = admin.execute(sql.HISTORY_MOVE, params).fetchone()
    assert row is not None and row[0] == 1000
    with admin.transaction(force_rollback=True):
        plan = admin.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + sql.HISTORY_MOVE, {**params, "since": row[1]}
        ).fetchone()
    assert plan is not None
    scans = [n for n in nodes(plan[0][0]["Plan"]) if n.get("Index Name") == "axa_queue_finished"]
    # The next batch starts at the newest job the first moved: it reads the 500 left,
    # not the 2,000 held ones again (each batch walked them, doubling a long move).
    assert scans and all(int(n.get("Rows Removed by Filter", 0)) == 0 for n in scans), scans
    assert sum(int(n["Actual Rows"]) for n in scans) == 500
    assert move_all(admin, keep=60) == 500
    assert admin.execute("SELECT count(*) FROM axa_queue").fetchone() == (2000,)


async def test_concurrent_movers_move_each_job_exactly_once(make_queue, admin, dsn: str) -> None:
    await make_queue()
    seed_finished(admin, 12_000)
    async with await connect(dsn) as first:
        await history.make_days(first, WEEK)  # made once, before the race
    conns = [await connect(dsn) for _ in range(4)]
    try:
        done = await asyncio.gather(*(history.move(c, 60, WEEK, batch=500) for c in conns))
    finally:
        for conn in conns:
            await conn.close()
    assert sum(d.moved for d in done) == 12_000
    row = admin.execute("SELECT count(*), count(DISTINCT id) FROM axa_queue_history").fetchone()
    assert row == (12_000, 12_000)
    assert admin.execute("SELECT count(*) FROM axa_queue").fetchone() == (0,)


async def test_a_job_holding_its_unique_key_stays_hot_until_unique_for_passes(
    make_queue, admin, dsn: str
) -> None:
    queue = await make_queue()
    job = await queue.enqueue("Mail", {}, unique_key="mail:1", unique_for=timedelta(hours=1))
    finish(admin, job, "completed", "10 minutes")
    async with await connect(dsn) as conn:
        assert (await history.move(conn, 60, WEEK)).moved == 0
        # While held, the key still refuses a second job, as before.
        assert await queue.enqueue("Mail", {}, unique_key="mail:1") == job
        assert (await history.move(conn, 60, WEEK, now=later(admin, 3600))).moved == 1
    assert where(admin, job) == (0, 1)
    # Moved, the key is free: the next job of the key is queued.
    again = await queue.enqueue("Mail", {}, unique_key="mail:1")
    assert again != job and where(admin, again) == (1, 0)


async def test_a_job_the_rust_crate_queued_and_finished_is_moved_like_any_other(
    make_queue, admin, dsn: str
) -> None:
    queue = await make_queue()
    job = crate_enqueue(admin, "Crate", {"n": 1})
    claimed = crate_claim(admin, "Crate")
    assert claimed is not None and claimed[0] == job
    admin.execute(crate.FINISH, crate.params(job, 1, "completed", None))
    assert admin.execute(crate.STATUS, crate.params(job)).fetchone() is not None
    async with await connect(dsn) as conn:
        assert (await history.move(conn, 60, WEEK, now=later(admin, 61))).moved == 1
    # Ours finds it; the crate's `job()` finds a job only while it is in axa_queue.
    info = await queue.job(job)
    assert info is not None and info.state == JobState.COMPLETED
    assert admin.execute(crate.STATUS, crate.params(job)).fetchone() is None


# --- reads see both tables ------------------------------------------------------------------


async def reads(queue: Queue, ids: list[uuid.UUID]) -> list[Any]:
    """Everything the public reads answer about `ids` and the whole queue."""
    return [
        [await queue.job(i) for i in ids],
        [await queue.result(i) for i in ids if (await queue.job(i)).state.value == "completed"],  # type: ignore[union-attr]
        await queue.jobs(limit=100),
        await queue.jobs(state="completed"),
        await queue.jobs(state="failed", name="B"),
        await queue.jobs(state="queued"),
        await queue.counts(),
        await queue.counts_by_name(),
    ]


async def test_every_read_answers_the_same_once_the_finished_jobs_moved(
    make_queue, admin, dsn: str
) -> None:
    queue = await make_queue()
    ids = []
    for n, (name, status) in enumerate(
        [("A", "completed"), ("B", "failed"), ("A", "cancelled"), ("B", "completed"),
         ("A", "queued"), ("B", "needs_review"), ("B", "failed")]
    ):  # fmt: skip
        job = await queue.enqueue(name, {"n": n})
        if status != "queued":
            finish(admin, job, status, f"{10 + n} minutes")
        ids.append(job)
    admin.execute(
        "UPDATE axa_queue SET result = %s WHERE status = 'completed'", (Jsonb({"ok": 1}),)
    )
    # Due in an hour: the counts hold no time that passes between the two reads.
    admin.execute("UPDATE axa_queue SET run_at = now() + interval '1 hour' WHERE status = 'queued'")
    before = await reads(queue, ids)
    assert move_all(admin, keep=60) == 5
    assert await reads(queue, ids) == before
    # A wait for a moved job ends at once, with the job.
    waited = await queue.wait(ids[0], timeout=5)
    assert waited.state == JobState.COMPLETED


async def test_the_dashboards_pages_and_minutes_see_moved_jobs(make_queue, admin) -> None:
    await make_queue()
    seed_finished(admin, 30, "20 minutes")
    page = {"state": "completed", "name": None, "key": None, "after": None, "limit": 50}
    page |= {"now": None, "beat_ms": sql.ABSENT_BEAT_MS}  # worker gone: none, none running
    minutes = {"since": 0, "until": None}
    before = (
        admin.execute(sql.WEB_JOBS_NEWEST, page).fetchall(),
        admin.execute(sql.WEB_JOBS_OLDEST, page).fetchall(),
        sorted(admin.execute(sql.WEB_FINISHED_PER_MINUTE, minutes).fetchall()),
    )
    assert len(before[0]) == 10
    assert move_all(admin, keep=60) == 30
    after = (
        admin.execute(sql.WEB_JOBS_NEWEST, page).fetchall(),
        admin.execute(sql.WEB_JOBS_OLDEST, page).fetchall(),
        sorted(admin.execute(sql.WEB_FINISHED_PER_MINUTE, minutes).fetchall()),
    )
    assert after == before


# --- acts ------------------------------------------------------------------------------------


async def test_a_moved_failed_job_retried_comes_back_queued_with_its_act(
    make_queue, admin, dsn: str
) -> None:
    queue = await make_queue()
    job = await queue.enqueue("Flaky", {"n": 1}, unique_key="flaky:1")
    finish(admin, job, "failed", "10 minutes")
    assert move_all(admin, keep=60) == 1
    async with await connect(dsn) as conn:
        result = await retry(conn, job, "ops:alice", "fixed_upstream")
    assert result.applied and result.found == JobState.FAILED
    assert where(admin, job) == (1, 0)
    row = admin.execute(
        "SELECT status, attempts, max_attempts, args, unique_key FROM axa_queue WHERE id = %s",
        (job,),
    ).fetchone()
    assert row == ("queued", 1, 2, {"n": 1}, None)
    [act] = await queue.acts(job)
    assert (act.by, act.reason) == ("ops:alice", "fixed_upstream")


async def test_a_retry_that_waited_for_a_move_of_its_job_retries_it_from_the_history(
    make_queue, admin, dsn: str
) -> None:
    queue = await make_queue()
    job = await queue.enqueue("Flaky", {"n": 1})
    finish(admin, job, "failed", "10 minutes")
    since = make_days(admin)
    params = {"keep": 60, "since": since, "batch": history.MOVE_BATCH, "now": None}
    with psycopg.connect(dsn) as mover:  # the move holds the row until it commits
        assert mover.execute(sql.HISTORY_MOVE, params).rowcount == 1
        async with await connect(dsn) as conn:
            retried = asyncio.ensure_future(retry(conn, job, "ops:alice", "INC-7"))
            await eventually(lambda: lock_waits(admin, "WITH target AS") == 1)
            mover.commit()
            result = await retried
    assert result.applied and result.kind is ActKind.RETRIED and result.found == JobState.FAILED
    assert where(admin, job) == (1, 0)
    assert status_of(admin, job)[0] == "queued"


async def test_a_moved_job_cannot_be_cancelled_and_says_how_it_finished(
    make_queue, admin, dsn: str
) -> None:
    queue = await make_queue()
    job = await queue.enqueue("Done", {})
    finish(admin, job, "completed", "10 minutes")
    assert move_all(admin, keep=60) == 1
    async with await connect(dsn) as conn:
        result = await cancel(conn, job, "ops:alice", "too_late")
        again = await retry(conn, job, "ops:alice", "again")
    assert not result.applied and result.found == JobState.COMPLETED
    assert not again.applied and again.found == JobState.COMPLETED
    assert where(admin, job) == (0, 1)
    assert await queue.acts(job) == []


# --- partitions and retention ------------------------------------------------------------


def partitions(admin: psycopg.Connection[Any]) -> list[str]:
    return [
        r[0]
        for r in admin.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'axa_queue_history'::regclass ORDER BY 1"
        )
    ]


async def test_partitions_are_made_ahead_and_dropped_whole_past_retention(
    make_queue, admin, dsn: str
) -> None:
    queue = await make_queue()
    seed_finished(admin, 6, "3 days")
    seed_finished(admin, 4, "1 hour")
    async with await connect(dsn) as conn:
        made, _ = await history.make_days(conn, WEEK)
        assert made == days_through_ahead(admin, "3 days") == len(partitions(admin))
        assert (await history.make_days(conn, WEEK))[0] == 0
        assert (await history.move(conn, 60, WEEK)).moved == 10
    # Two days on, a retention of 3 days drops every day that ended before the one a day
    # ago began: the three-day-old jobs' day and the days before it, whole; the jobs of
    # an hour ago (today's, or yesterday's) are kept.
    now = later(admin, 2 * 86400)
    assert await queue.purge(3 * 86400, dry_run=True, now=now) == 6
    deleted_before = admin.execute(
        "SELECT coalesce(sum(n_tup_del), 0) FROM pg_stat_user_tables "
        "WHERE relname LIKE 'axa_queue_history%%'"
    ).fetchone()
    assert await queue.purge(3 * 86400, now=now) == 6
    assert admin.execute("SELECT count(*) FROM axa_queue_history").fetchone() == (4,)
    left = partitions(admin)
    assert len(left) == 4  # yesterday, today and the two ahead
    deleted_after = admin.execute(
        "SELECT coalesce(sum(n_tup_del), 0) FROM pg_stat_user_tables "
        "WHERE relname LIKE 'axa_queue_history%%'"
    ).fetchone()
    assert deleted_after == deleted_before  # dropped, never deleted row by row


PARTITIONS_LOCK = """SELECT pg_advisory_xact_lock(hashtextextended(
    'axa_queue_history'::regclass::oid::text || ' partitions', 1635213689))"""
"""The lock `axa_queue_history_days` and `axa_queue_history_drop` take (migration 10)."""


async def test_with_every_day_in_place_a_move_or_a_round_takes_no_lock_on_the_days(
    make_queue, admin, dsn: str
) -> None:
    await make_queue()
    async with await connect(dsn) as conn:
        made, since = await history.make_days(conn, WEEK)
        assert made == 1 + history.AHEAD_DAYS
        with psycopg.connect(dsn) as other:  # another process, making or dropping days
            other.execute(PARTITIONS_LOCK)  # held until its transaction ends
            # Waiting for it would fail after DDL_LOCK_TIMEOUT: neither asks for it.
            assert await history.make_days(conn, WEEK) == (0, since)
            assert await history.drop_days(conn, WEEK) == 0
            other.rollback()


async def test_partitions_are_made_from_the_oldest_finished_jobs_day_not_for_every_day_of_retention(
    make_queue, admin, dsn: str
) -> None:
    await make_queue()
    async with await connect(dsn) as conn:
        # Nothing finished yet: today and the days ahead, whatever the retention.
        made, since = await history.make_days(conn, 90 * 86400.0)
        assert made == 1 + history.AHEAD_DAYS == len(partitions(admin))
        today = admin.execute("SELECT date_trunc('day', now() AT TIME ZONE 'UTC')").fetchone()
        assert today is not None and since.astimezone(timezone.utc).replace(tzinfo=None) == today[0]
        # A database upgraded with jobs finished 20 days ago: their day on, and no
        # earlier than the retention's first day.
        seed_finished(admin, 3, "20 days")
        made, _ = await history.make_days(conn, 90 * 86400.0)
        assert made == days_through_ahead(admin, "20 days") - 1 - history.AHEAD_DAYS
        assert (await history.move(conn, 60, 90 * 86400.0)).moved == 3
        seed_finished(admin, 2, "40 days")
        made, _ = await history.make_days(conn, 30 * 86400.0)
        assert made == 0  # 40 days back is past a retention of 30: left to purge
        assert (await history.move(conn, 60, 30 * 86400.0)).moved == 0


async def test_a_finished_row_older_than_the_first_day_kept_is_left_to_purge(
    make_queue, admin, dsn: str
) -> None:
    queue = await make_queue()
    seed_finished(admin, 3, "9 days")
    async with await connect(dsn) as conn:
        assert (await history.move(conn, 60, WEEK)).moved == 0
    assert await queue.purge() == 3
    assert admin.execute("SELECT count(*) FROM axa_queue").fetchone() == (0,)


# --- the worker, and the command ------------------------------------------------------------


async def test_a_worker_moves_its_finished_jobs_after_keep_recent(make_queue, admin) -> None:
    queue = await make_queue(keep_recent=0)
    done = asyncio.Event()

    async def quick(args: Any) -> None:
        done.set()

    queue.handle("Quick", quick)
    job = await queue.enqueue("Quick", {})
    async with running(queue):
        await asyncio.wait_for(done.wait(), 15)
        for _ in range(300):
            if where(admin, job) == (0, 1):
                break
            await asyncio.sleep(0.05)
    assert where(admin, job) == (0, 1)
    info = await queue.job(job)
    assert info is not None and info.state == JobState.COMPLETED


def test_move_history_moves_an_upgraded_tables_finished_jobs_a_step_at_a_time(
    admin, dsn: str
) -> None:
    runner = CliRunner(env={"AXA_QUEUE_DSN": dsn, "DATABASE_URL": None})

    def cli(*args: str) -> Any:
        return runner.invoke(main, list(args), prog_name="axa-queue", catch_exceptions=False)

    assert cli("setup").exit_code == 0  # the migration makes the table, and moves nothing
    seed_finished(admin, 70)
    assert admin.execute("SELECT count(*) FROM axa_queue_history").fetchone() == (0,)
    dry = cli("move-history", "--dry-run")
    assert dry.exit_code == 0 and "70 finished jobs would be moved" in dry.stdout
    step = cli("move-history", "--most", "30")
    assert step.exit_code == 0 and "moved 30 finished jobs" in step.stdout
    rest = cli("move-history", "--json")
    assert rest.exit_code == 0 and '"moved": 40' in rest.stdout
    assert admin.execute("SELECT count(*) FROM axa_queue").fetchone() == (0,)
    assert cli("move-history", "--most", "0").exit_code == 2


@pytest.mark.parametrize("keep", [-1.0])
def test_move_history_refuses_a_negative_keep_recent(dsn: str, keep: float) -> None:
    runner = CliRunner(env={"AXA_QUEUE_DSN": dsn, "DATABASE_URL": None})
    refused = runner.invoke(main, ["move-history", "--keep-recent", str(keep)])
    assert refused.exit_code == 2 and "--keep-recent" in refused.output


# --- a run that lost its claim, its job moved meanwhile ----------------------------------


def mark_lost(admin: psycopg.Connection[Any], job_id: uuid.UUID, attempts: int) -> Any:
    """What a run of `attempts`, started and still running, that lost its claim writes."""
    params = {
        "id": job_id, "attempts": attempts, "started": True, "gave_up": False,
        "ending": None, "ending_error": None, "error": "lost its claim", "max": 3, "now": None,
        "worker": None, "host": "test", "pid": 1,
    }  # fmt: skip
    return admin.cursor(row_factory=namedtuple_row).execute(sql.MARK_LOST, params).fetchone()


async def test_a_lost_run_whose_job_failed_and_moved_sends_it_back_for_review(
    make_queue, admin
) -> None:
    queue = await make_queue()
    job = await queue.enqueue("Long", {}, unique_key="long:1")
    admin.execute(
        "UPDATE axa_queue SET status = 'failed', attempts = 2, updated_at = now() - "
        "interval '10 minutes' WHERE id = %s",
        (job,),
    )  # attempt 2, another worker's, failed it; then it moved
    assert move_all(admin, keep=60) == 1
    found = mark_lost(admin, job, 1)
    assert (found.status, found.attempts, found.became) == ("failed", 2, "needs_review")
    assert where(admin, job) == (1, 0)
    row = admin.execute(
        "SELECT status, error, unique_key FROM axa_queue WHERE id = %s", (job,)
    ).fetchone()
    assert row == ("needs_review", "lost its claim", None)


async def test_a_lost_run_whose_cancelled_job_moved_finds_it_cancelled_and_leaves_it(
    make_queue, admin
) -> None:
    queue = await make_queue()
    job = await queue.enqueue("Long", {})
    finish(admin, job, "cancelled", "10 minutes")
    assert move_all(admin, keep=60) == 1
    found = mark_lost(admin, job, 1)
    assert (found.status, found.attempts, found.became) == ("cancelled", 1, None)
    assert where(admin, job) == (0, 1)


# --- the dashboard, and the worker's role ---------------------------------------------------


def test_the_dashboard_shows_and_retries_a_moved_failed_job(admin, dsn: str) -> None:
    runner = CliRunner(env={"AXA_QUEUE_DSN": dsn, "DATABASE_URL": None})
    assert runner.invoke(main, ["setup"]).exit_code == 0
    [job] = seed(admin, "Mail", "failed")
    admin.execute(
        "UPDATE axa_queue SET updated_at = now() - interval '10 minutes' WHERE id = %s", (job,)
    )
    assert move_all(admin, keep=60) == 1
    with signed_in(create_app(dsn, token=TOKEN)) as web:
        for page in (f"/jobs/{job}", "/jobs?state=failed", "/failed"):
            shown = web.get(page)
            assert shown.status_code == 200 and str(job) in shown.text, page
            assert SECRET not in shown.text
        answer = web.post(
            "/act",
            data={"act": "retry", "id": str(job), "reason": "OPS-1", "csrf": csrf_of(shown.text)},
            headers=ORIGIN,
        )
        assert answer.status_code == 200
    assert where(admin, job) == (1, 0)
    assert admin.execute("SELECT status FROM axa_queue WHERE id = %s", (job,)).fetchone() == (
        "queued",
    )


async def test_the_workers_documented_grants_are_enough_to_make_days_move_and_drop(
    make_queue, admin, dsn: str, schema: str
) -> None:
    queue = await make_queue()
    seed_finished(admin, 10, "1 hour")
    with acting_role(admin, dsn, worker_of=schema) as (_, as_worker):
        async with await connect(as_worker) as conn:
            done = await history.move(conn, 60, WEEK)
            assert (done.moved, done.made) == (10, days_through_ahead(admin, "1 hour"))
            assert await history.drop_days(conn, 0, now=later(admin, 3 * 86400)) == 10
    assert admin.execute("SELECT count(*) FROM axa_queue_history").fetchone() == (0,)
    assert (await queue.counts()).completed == 0
