"""Pausing a job name: a person's act, kept in the acts table in the caller's
transaction; the claim of every worker process reads it in the same statement, so a
paused name's jobs stay queued while other names' run, and running ones finish."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from axa_queue import (
    NIL_JOB,
    ActKind,
    NewJob,
    NotACodeError,
    OptionsError,
    name_acts_on,
    pause,
    paused_on,
    resume,
)
from conftest import eventually, running, status_of
from processes import worker_script

WORKER_SCRIPT = worker_script(
    """
    queue = Queue(
        dsn, QueueOptions(workers=4, poll_interval=0.05, heartbeat_interval=0.5, stale_after=30)
    )

    @queue.handler("Report")
    async def report(args):
        pass

    @queue.handler("Free")
    async def free(args):
        pass
"""
)


def states(admin: psycopg.Connection[Any], name: str) -> dict[str, int]:
    rows = admin.execute(
        "SELECT status, count(*) FROM axa_queue WHERE name = %s GROUP BY status", (name,)
    ).fetchall()
    return {status: count for status, count in rows}


async def test_a_pause_and_a_resume_are_acts_kept_with_who_why_and_the_role(
    make_queue, dsn
) -> None:
    await make_queue()
    with psycopg.connect(dsn) as conn:
        with conn.transaction():
            first = pause(conn, "Report", by="ops:alice", reason="partner_api_down")
        again = pause(conn, "Report", by="ops:bob", reason="also_down")
        listed = paused_on(conn)
        with conn.transaction():
            resumed = resume(conn, "Report", by="ops:alice", reason="partner_back")
        not_paused = resume(conn, "Report", by="ops:alice", reason="twice")
        acts = name_acts_on(conn, "Report")
        role = conn.execute("SELECT current_user").fetchone()
    assert first.applied and first.kind is ActKind.PAUSED and first.found is None
    assert not again  # paused already: nothing changed, no act
    assert [(p.name, p.by, p.reason) for p in listed] == [
        ("Report", "ops:alice", "partner_api_down")
    ]
    assert resumed.applied and resumed.kind is ActKind.RESUMED
    assert not not_paused
    assert [(a.kind, a.by, a.reason, a.job_id, a.job_name) for a in acts] == [
        (ActKind.PAUSED, "ops:alice", "partner_api_down", NIL_JOB, "Report"),
        (ActKind.RESUMED, "ops:alice", "partner_back", NIL_JOB, "Report"),
    ]
    assert role is not None and {a.role for a in acts} == {role[0]}


async def test_a_pause_rolled_back_leaves_no_pause_and_no_act(make_queue, dsn) -> None:
    await make_queue()
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        async with conn.transaction(force_rollback=True):
            assert await pause(conn, "Report", by="ops:alice", reason="trying")
            assert [p.name for p in await paused_on(conn)] == ["Report"]
        assert await paused_on(conn) == []
        assert await name_acts_on(conn, "Report") == []


async def test_a_pause_act_like_every_act_can_never_be_changed(make_queue, admin) -> None:
    queue = await make_queue()
    await queue.pause("Report", by="ops:alice", reason="partner_api_down")
    with pytest.raises(psycopg.errors.RaiseException, match="refused"):
        admin.execute("DELETE FROM axa_job_acts WHERE act = 'paused'")


async def test_a_pause_refuses_a_by_that_is_not_a_code_and_a_name_that_is_not_one(
    make_queue, dsn
) -> None:
    await make_queue()
    with psycopg.connect(dsn) as conn:
        with pytest.raises(NotACodeError):
            pause(conn, "Report", by="ops:\u200balice", reason="x")
        with pytest.raises(OptionsError):
            pause(conn, "", by="ops:alice", reason="x")
        assert paused_on(conn) == []


async def test_a_paused_name_is_not_claimed_while_other_names_run_and_resume_wakes_workers(
    make_queue, admin
) -> None:
    queue = await make_queue(workers=4, poll_interval=30)  # a resume must wake, not a poll
    ran: list[str] = []
    queue.handle("Report", lambda args: ran.append("Report"))
    queue.handle("Free", lambda args: ran.append("Free"))
    await queue.pause("Report", by="ops:alice", reason="partner_api_down")
    reports = await queue.enqueue_all([NewJob("Report", {"n": n}) for n in range(5)])
    async with running(queue):
        await queue.enqueue_all([NewJob("Free", {"n": n}) for n in range(5)])
        await eventually(lambda: ran.count("Free") == 5)
        assert ran.count("Report") == 0
        assert states(admin, "Report") == {"queued": 5}
        assert all(status_of(admin, one)[2] == 0 for one in reports)  # no attempt spent
        assert await queue.resume("Report", by="ops:alice", reason="partner_back")
        try:
            await eventually(lambda: ran.count("Report") == 5)
        except AssertionError:
            print(
                "DBG",
                admin.execute(
                    "SELECT status, attempts, ahead FROM axa_queue WHERE name = %s", ("Report",)
                ).fetchall(),
            )
            raise
    assert states(admin, "Report") == {"completed": 5}


async def test_a_job_running_when_its_name_is_paused_finishes(make_queue, admin) -> None:
    queue = await make_queue(workers=2)
    started, release = asyncio.Event(), asyncio.Event()

    @queue.handler("Report")
    async def report(args: Any) -> None:
        started.set()
        await release.wait()

    first = await queue.enqueue("Report", {"n": 0})
    async with running(queue):
        await asyncio.wait_for(started.wait(), 15)
        await queue.pause("Report", by="ops:alice", reason="partner_api_down")
        second = await queue.enqueue("Report", {"n": 1})
        release.set()
        await eventually(lambda: status_of(admin, first)[0] == "completed")
        assert status_of(admin, second)[0] == "queued"


@pytest.mark.alone
async def test_a_paused_name_is_claimed_by_none_of_several_worker_processes_while_others_are(
    worker_processes, make_queue, admin
) -> None:
    queue = await make_queue()
    await queue.pause("Report", by="ops:alice", reason="partner_api_down")
    await worker_processes.start_all(WORKER_SCRIPT, [()] * 3)
    await queue.enqueue_all([NewJob("Report", {"n": n}) for n in range(40)])
    for burst in range(1, 6):
        await queue.enqueue_all([NewJob("Free", {"n": n}) for n in range(40)])
        done = {"completed": 40 * burst}
        await eventually(lambda done=done: states(admin, "Free") == done)
    assert states(admin, "Report") == {"queued": 40}
    row = admin.execute("SELECT max(attempts) FROM axa_queue WHERE name = 'Report'").fetchone()
    assert row is not None and row[0] == 0  # never claimed, not even claimed ahead
    await queue.resume("Report", by="ops:alice", reason="partner_back")
    await eventually(lambda: states(admin, "Report") == {"completed": 40}, timeout=30)
