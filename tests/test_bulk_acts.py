"""Bulk acts: `cancel_all`, `retry_all` and `release_all` apply to each job a filter
matches exactly what the single act would, one act row per job changed, in the
caller's transaction, one statement per bounded batch; a rollback leaves nothing."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from axa_queue import NotACodeError, OptionsError, cancel_all, release_all, retry_all
from axa_queue.acts import bulk
from conftest import eventually, running, status_of


def seed(
    admin: psycopg.Connection[Any], name: str, status: str, n: int, error: str | None = None
) -> None:
    admin.execute(
        """INSERT INTO axa_queue (id, name, args, status, error, attempts, max_attempts, updated_at)
        SELECT gen_random_uuid(), %s, '{}', %s, %s,
               CASE WHEN %s IN ('queued') THEN 0 ELSE 1 END, 1, now()
        FROM generate_series(1, %s)""",
        (name, status, error, status, n),
    )


def states(admin: psycopg.Connection[Any], name: str) -> dict[str, int]:
    rows = admin.execute(
        "SELECT status, count(*) FROM axa_queue WHERE name = %s GROUP BY status", (name,)
    ).fetchall()
    return dict(rows)


def acts(admin: psycopg.Connection[Any], act: str) -> int:
    row = admin.execute("SELECT count(*) FROM axa_job_acts WHERE act = %s", (act,)).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.alone
async def test_retry_all_of_ten_thousand_failed_jobs_commits_ten_thousand_acts_and_a_rollback_none(
    make_queue, dsn, admin
) -> None:
    await make_queue()
    seed(admin, "Pay", "failed", 10_000, error="PartnerDown: 503")
    seed(admin, "Pay", "completed", 5)
    with psycopg.connect(dsn) as conn:
        with conn.transaction(force_rollback=True):
            undone = retry_all(conn, by="ops:alice", reason="INC-1", name="Pay")
            assert undone.changed == 10_000
        assert states(admin, "Pay") == {"failed": 10_000, "completed": 5}
        assert acts(admin, "retried") == 0
        dry = retry_all(conn, by="ops:alice", reason="INC-1", name="Pay", dry_run=True)
        assert (dry.changed, dry.left_alone, dry.dry_run) == (10_000, {"completed": 5}, True)
        with conn.transaction():
            done = retry_all(conn, by="ops:alice", reason="INC-1", name="Pay")
    assert (done.changed, done.left_alone, done.matched) == (10_000, {"completed": 5}, 10_005)
    assert states(admin, "Pay") == {"queued": 10_000, "completed": 5}
    assert acts(admin, "retried") == 10_000
    row = admin.execute(
        "SELECT count(*) FROM axa_queue WHERE name = 'Pay' AND status = 'queued' "
        "AND max_attempts = attempts + 1"
    ).fetchone()
    assert row == (10_000,)  # as `retry` does: one more try


async def test_cancel_all_stops_queued_and_running_jobs_and_says_why_it_left_the_others(
    make_queue, admin
) -> None:
    queue = await make_queue(workers=2)
    started, release = asyncio.Event(), asyncio.Event()
    ran: list[str] = []
    stopped: list[str] = []

    @queue.handler("Mail")
    async def mail(args: Any) -> None:
        ran.append("started")
        started.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            stopped.append("cancelled")
            raise

    running_job = await queue.enqueue("Mail", {})
    async with running(queue):
        await asyncio.wait_for(started.wait(), 15)
        seed(admin, "Mail", "queued", 3)
        seed(admin, "Mail", "completed", 2)
        seed(admin, "Other", "queued", 4)
        async with queue.connection() as conn:
            result = await cancel_all(conn, by="ops:bob", reason="INC-2", name="Mail")
        assert (result.changed, result.left_alone) == (4, {"completed": 2})
        # Every run of them (the free loop may have started one of the three) is told
        # at once and stopped, as `cancel` stops one.
        await eventually(lambda: len(stopped) == len(ran))
    assert status_of(admin, running_job)[0] == "cancelled"
    assert states(admin, "Mail") == {"cancelled": 4, "completed": 2}
    assert states(admin, "Other") == {"queued": 4}
    assert acts(admin, "cancelled") == 4


async def test_release_all_releases_jobs_in_review_by_name_error_and_time(
    make_queue, dsn, admin
) -> None:
    await make_queue()
    seed(admin, "Sync", "needs_review", 3, error="LostClaim")
    seed(admin, "Sync", "needs_review", 2, error="Other")
    admin.execute(
        "UPDATE axa_queue SET updated_at = now() - interval '2 hours' WHERE error = 'Other'"
    )
    since = datetime.now(timezone.utc) - timedelta(hours=1)
    with psycopg.connect(dsn) as conn:
        matched = release_all(
            conn, by="ops:carol", reason="INC-3", name="Sync", finished_after=since
        )
        assert matched.changed == 3
        later = release_all(conn, by="ops:carol", reason="INC-3", error_like="Oth%")
        assert later.changed == 2
        nothing = release_all(conn, by="ops:carol", reason="INC-3", state="failed")
        assert nothing.matched == 0
    assert states(admin, "Sync") == {"queued": 5}
    assert acts(admin, "released") == 5


async def test_a_limit_and_ids_bound_what_a_bulk_act_matches(
    make_queue, dsn, admin, monkeypatch
) -> None:
    await make_queue()
    monkeypatch.setattr(bulk, "BULK_BATCH", 3)  # several batches
    seed(admin, "Pay", "failed", 10)
    ids = [r[0] for r in admin.execute("SELECT id FROM axa_queue ORDER BY id").fetchall()]
    with psycopg.connect(dsn) as conn:
        some = retry_all(conn, by="ops:alice", reason="INC-4", name="Pay", limit=7)
        assert some.changed == 7
        chosen = retry_all(conn, by="ops:alice", reason="INC-4", ids=ids[:9])
        assert (chosen.changed, chosen.left_alone) == (2, {"queued": 7})
    assert states(admin, "Pay") == {"queued": 9, "failed": 1}


async def test_retry_all_brings_back_failed_jobs_moved_to_the_history(
    make_queue, dsn, admin
) -> None:
    queue = await make_queue(keep_recent=1)
    seed(admin, "Pay", "failed", 4)
    seed(admin, "Pay", "completed", 3)
    admin.execute("UPDATE axa_queue SET updated_at = now() - interval '1 minute'")
    moved = await queue.move_history()
    assert moved.moved == 7 and states(admin, "Pay") == {}
    with psycopg.connect(dsn) as conn:
        dry = retry_all(conn, by="ops:alice", reason="INC-5", name="Pay", dry_run=True)
        assert (dry.changed, dry.left_alone) == (4, {"completed": 3})
        done = retry_all(conn, by="ops:alice", reason="INC-5", name="Pay")
    assert (done.changed, done.left_alone) == (4, {"completed": 3})
    assert states(admin, "Pay") == {"queued": 4}
    assert acts(admin, "retried") == 4


async def test_cancel_all_counts_the_jobs_moved_to_the_history_as_left_alone_as_before(
    make_queue, dsn, admin
) -> None:
    queue = await make_queue(keep_recent=1)
    seed(admin, "Mix", "failed", 6)
    admin.execute("UPDATE axa_queue SET updated_at = now() - interval '1 minute'")
    assert (await queue.move_history()).moved == 6
    seed(admin, "Mix", "queued", 10)
    seed(admin, "Mix", "failed", 3)
    with psycopg.connect(dsn) as conn:
        dry = cancel_all(conn, by="ops:alice", reason="INC-9", name="Mix", dry_run=True)
        assert (dry.changed, dry.left_alone) == (10, {"failed": 9})
        only = cancel_all(
            conn, by="ops:alice", reason="INC-9", name="Mix", state="failed", dry_run=True
        )
        assert (only.changed, only.left_alone) == (0, {"failed": 9})
        capped = cancel_all(
            conn, by="ops:alice", reason="INC-9", name="Mix", limit=15, dry_run=True
        )
        assert capped.matched == 15  # the jobs table's 13 first, then 2 of the history's
        done = cancel_all(conn, by="ops:alice", reason="INC-9", name="Mix")
    assert (done.changed, done.left_alone) == (10, {"failed": 9})
    assert states(admin, "Mix") == {"cancelled": 10, "failed": 3}


async def test_cancel_all_cancels_jobs_in_review_as_cancel_does_and_counts_ids_no_job_has(
    make_queue, dsn, admin
) -> None:
    queue = await make_queue(keep_recent=1)
    seed(admin, "Rev", "completed", 2)
    admin.execute("UPDATE axa_queue SET updated_at = now() - interval '1 minute'")
    assert (await queue.move_history()).moved == 2
    seed(admin, "Rev", "needs_review", 3)
    rows = admin.execute("SELECT id FROM axa_queue_history UNION ALL SELECT id FROM axa_queue")
    ids = [row[0] for row in rows.fetchall()]
    nobody = uuid.uuid4()
    with psycopg.connect(dsn) as conn:
        released = release_all(
            conn, by="ops:alice", reason="INC-4", ids=[*ids, nobody], dry_run=True
        )
        assert (released.changed, released.left_alone, released.missing) == (3, {"completed": 2}, 1)
        done = cancel_all(conn, by="ops:alice", reason="INC-4", ids=[*ids, nobody, nobody])
    assert (done.changed, done.left_alone, done.missing, done.matched) == (
        3,
        {"completed": 2},
        1,
        5,
    )
    assert states(admin, "Rev") == {"cancelled": 3}
    assert acts(admin, "cancelled") == 3


def test_a_bulk_act_filtered_on_a_state_no_finished_job_is_in_never_reads_the_history() -> None:
    from types import SimpleNamespace

    from axa_queue import sql
    from axa_queue.db.calls import drive

    sent: list[str] = []

    def send(call: Any) -> Any:
        sent.append(call.query)
        return call.read([SimpleNamespace(applies=2, left_alone="{}")], 1)

    for state in ("queued", "running"):
        sent.clear()
        given = bulk._given("ops:alice", "INC-1", {"state": state, "name": "Mail"})
        assert drive(send, bulk._cancel_steps(given, True)).changed == 2
        assert sent == [sql.MATCHING], state  # not MATCHING_MOVED
    sent.clear()
    given = bulk._given("ops:alice", "INC-1", {"state": "needs_review"})
    drive(send, bulk._retry_steps(given, "needs_review", True))
    assert sent == [sql.MATCHING]


async def test_a_bulk_act_refuses_no_filter_a_bad_filter_and_a_reason_that_is_not_a_code(
    make_queue, dsn
) -> None:
    await make_queue()
    with psycopg.connect(dsn) as conn:
        with pytest.raises(OptionsError, match="needs a filter"):
            cancel_all(conn, by="ops:alice", reason="INC-6")
        with pytest.raises(OptionsError, match="state must be one of"):
            cancel_all(conn, by="ops:alice", reason="INC-6", state="done")
        with pytest.raises(OptionsError, match="timezone-aware"):
            cancel_all(conn, by="ops:alice", reason="INC-6", finished_after=datetime(2026, 1, 1))
        with pytest.raises(OptionsError, match="no filter colour"):
            cancel_all(conn, by="ops:alice", reason="INC-6", colour="red")  # type: ignore[call-arg]
        with pytest.raises(NotACodeError):
            cancel_all(conn, by="ops:alice", reason="two\nlines", name="Mail")
