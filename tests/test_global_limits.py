"""Global limits: at most N jobs of a name running across every process, checked by the
claim statement; proved with several worker processes claiming one name at once."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from axa_queue import NewJob, OptionsError, Queue, QueueOptions, sql
from axa_queue.limits import Limits
from axa_queue.worker import decisions
from conftest import eventually, running, status_of
from processes import worker_script

WORKER_SCRIPT = worker_script(
    """
    queue = Queue(dsn, racing(int(sys.argv[2])))
    if int(sys.argv[3]):  # 0: no global limit
        queue.limit("Report", int(sys.argv[3]), scope="global")

    @queue.handler("Report")
    async def report(args):
        await asyncio.sleep(0.02)  # the work: long enough for runs to overlap

    @queue.handler("Free")
    async def free(args):
        await asyncio.sleep(0.02)
"""
)

PEAKS = """
CREATE TABLE peak_gate ();
CREATE TABLE peak_log (name TEXT NOT NULL, running INTEGER NOT NULL);
CREATE FUNCTION peak_note() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- One claim at a time (held to its commit), then count with a fresh snapshot: the
    -- jobs of the name running at this claim, every process's, exactly.
    LOCK TABLE peak_gate IN EXCLUSIVE MODE;
    INSERT INTO peak_log
        SELECT NEW.name, count(*) FROM axa_queue WHERE status = 'running' AND name = NEW.name;
    RETURN NULL;
END
$$;
CREATE TRIGGER peak_note AFTER UPDATE OF status ON axa_queue
    FOR EACH ROW WHEN (NEW.status = 'running' AND OLD.status <> 'running')
    EXECUTE FUNCTION peak_note();
"""
"""The test's own record of how many jobs of a name ran at each claim (a trigger, not
the product's: a claim of the statement under test takes the gate after the name's
lock, so the two never wait for each other the other way round)."""


def peak(admin: psycopg.Connection[Any], name: str) -> int:
    row = admin.execute("SELECT max(running) FROM peak_log WHERE name = %s", (name,)).fetchone()
    assert row is not None and row[0] is not None
    return int(row[0])


async def test_a_global_limit_is_never_exceeded_by_several_processes_claiming_one_name(
    worker_processes, make_queue, admin
) -> None:
    queue = await make_queue()
    admin.execute(PEAKS)
    # Four processes of four loops each, with and without jobs claimed ahead.
    await worker_processes.start_all(WORKER_SCRIPT, [(prefetch, 3) for prefetch in (0, 0, 4, 16)])

    def drained() -> bool:
        row = admin.execute("SELECT count(*) FROM axa_queue WHERE status <> 'completed'").fetchone()
        return row is not None and row[0] == 0

    # Each burst wakes every idle process at once (one notification): all of them
    # claim the same name in the same moment, the race a global limit must win.
    for _burst in range(30):
        await queue.enqueue_all([NewJob("Report", {"n": n}) for n in range(12)])
        await eventually(drained, timeout=60)
    await queue.enqueue_all([NewJob("Free", {"n": n}) for n in range(48)])
    await eventually(drained, timeout=60)
    assert peak(admin, "Report") == 3  # reached, never passed
    assert peak(admin, "Free") > 3  # the record sees concurrency beyond it


async def test_a_global_limit_counts_the_running_jobs_of_every_process_even_a_crashed_ones(
    make_queue, admin
) -> None:
    queue = await make_queue(workers=4)
    queue.limit("Report", 2, scope="global")
    ran: list[Any] = []
    queue.handle("Report", ran.append)
    stuck = await queue.enqueue("Report", {"n": 0})
    # Another process holds one (or died holding it: its row stays running until
    # stale recovery frees it).
    admin.execute(
        "UPDATE axa_queue SET status = 'running', attempts = 1, started_at = now() WHERE id = %s",
        (stuck,),
    )
    started, release = asyncio.Event(), asyncio.Event()
    running_now: list[int] = []

    @queue.handler("Report", replace=True)
    async def report(args: Any) -> None:
        running_now.append(args["n"])
        started.set()
        await release.wait()

    ids = [await queue.enqueue("Report", {"n": n}) for n in range(1, 4)]
    async with running(queue):
        await asyncio.wait_for(started.wait(), 15)
        await eventually(lambda: len(running_now) >= 1)
        # One place left of two: the other two stay queued while it runs.
        states = [status_of(admin, one)[0] for one in ids]
        assert sorted(states) == ["queued", "queued", "running"]
        assert len(running_now) == 1
        release.set()
        await eventually(lambda: all(status_of(admin, one)[0] == "completed" for one in ids))
    assert status_of(admin, stuck)[0] == "running"


def test_a_limit_refuses_an_unknown_scope() -> None:
    queue = Queue("postgresql://unused")
    with pytest.raises(OptionsError, match='"process" or "global"'):
        queue.limit("Report", 3, scope="everywhere")  # type: ignore[arg-type]


def test_only_a_process_with_a_global_limit_claims_through_the_gate_and_only_for_its_names() -> (
    None
):
    assert "axa_queue_room" not in sql.EXCHANGE  # a process without one: as before
    assert "CASE WHEN w.global IS NULL THEN least(w.cap, %(free)s)" in sql.EXCHANGE_LIMITED
    wanted = decisions.wanted(["B", "A"], Limits(global_={"B": 2}), {}, 4)
    assert wanted == [{"name": "A", "cap": 4}, {"name": "B", "cap": 4, "global": 2}]


async def test_a_global_limit_holds_for_a_queue_given_its_schema_with_no_search_path(
    database_url: str, schema: str, admin
) -> None:
    # The count then reads the table named by the claim (`EXECUTE`), not the path's.
    dsn = psycopg.conninfo.make_conninfo(
        database_url, options="-c search_path=", application_name=schema
    )
    queue = Queue(dsn, QueueOptions(schema=schema, poll_interval=0.05, workers=4))
    queue.limit("Report", 1, scope="global")
    started, release = asyncio.Event(), asyncio.Event()
    ran: list[int] = []

    @queue.handler("Report")
    async def report(args: Any) -> None:
        ran.append(args["n"])
        started.set()
        await release.wait()

    async with queue:
        ids = [await queue.enqueue("Report", {"n": n}) for n in range(3)]
        async with running(queue):
            await asyncio.wait_for(started.wait(), 15)
            states = sorted(status_of(admin, one)[0] for one in ids)
            assert states == ["queued", "queued", "running"] and len(ran) == 1
            release.set()
            await eventually(lambda: all(status_of(admin, i)[0] == "completed" for i in ids))
