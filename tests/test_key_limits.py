"""Per-key limits and turns across processes: at most N jobs of a name running per key
across every process (`Queue.limit_per_key`), proved with four worker processes
claiming two keys at once; and a key with 100,000 jobs waiting does not hold back a key
with 10 (`Queue.fair_by_key`)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from axa_queue import NewJob
from conftest import eventually, running
from processes import worker_script

WORKER_SCRIPT = worker_script(
    """
    queue = Queue(dsn, racing(int(sys.argv[2])))
    queue.limit_per_key("Report", int(sys.argv[3]))

    @queue.handler("Report")
    async def report(args):
        await asyncio.sleep(0.02)  # the work: long enough for runs to overlap
"""
)

PEAKS = """
CREATE TABLE peak_gate ();
CREATE TABLE peak_log (key TEXT, running INTEGER NOT NULL, everyone INTEGER NOT NULL);
CREATE FUNCTION peak_note() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- One claim at a time (held to its commit), then count with a fresh snapshot: the
    -- jobs of the key running at this claim, every process's, exactly.
    LOCK TABLE peak_gate IN EXCLUSIVE MODE;
    INSERT INTO peak_log
        SELECT NEW.key,
               count(*) FILTER (WHERE key = NEW.key), count(*)
        FROM axa_queue WHERE status = 'running' AND name = NEW.name;
    RETURN NULL;
END
$$;
CREATE TRIGGER peak_note AFTER UPDATE OF status ON axa_queue
    FOR EACH ROW WHEN (NEW.status = 'running' AND OLD.status <> 'running')
    EXECUTE FUNCTION peak_note();
"""
"""The test's own record of how many jobs of each key ran at each claim (a trigger, not
the product's; as in `tests/test_global_limits.py`)."""


async def test_a_per_key_limit_is_never_exceeded_by_four_processes_claiming_two_keys(
    worker_processes, make_queue, admin: psycopg.Connection[Any]
) -> None:
    queue = await make_queue()
    admin.execute(PEAKS)
    # Four processes of four loops each, with and without jobs claimed ahead.
    await worker_processes.start_all(WORKER_SCRIPT, [(prefetch, 2) for prefetch in (0, 0, 4, 16)])

    def drained() -> bool:
        row = admin.execute("SELECT count(*) FROM axa_queue WHERE status <> 'completed'").fetchone()
        return row is not None and row[0] == 0

    # Each burst wakes every idle process at once (one notification): all of them
    # claim the name's two keys in the same moment, the race a per-key limit must win.
    for _burst in range(30):
        await queue.enqueue_all(
            [NewJob("Report", {"n": n}, key=("tenant-a", "tenant-b")[n % 2]) for n in range(12)]
        )
        await eventually(drained, timeout=60)
    peaks = dict(admin.execute("SELECT key, max(running) FROM peak_log GROUP BY key").fetchall())
    assert peaks == {"tenant-a": 2, "tenant-b": 2}  # reached, never passed, for each key
    both = admin.execute("SELECT max(everyone) FROM peak_log").fetchone()
    assert both is not None and both[0] > 2  # per key, not for the name: 4 at once


async def test_a_key_with_ten_jobs_is_not_held_back_by_a_key_with_a_hundred_thousand(
    make_queue, admin: psycopg.Connection[Any]
) -> None:
    queue = await make_queue(workers=8)
    queue.fair_by_key("Report")
    started: list[str] = []
    all_of_b = asyncio.Event()

    @queue.handler("Report")
    async def report(args: Any) -> None:
        started.append(args["k"])
        if started.count("B") == 10:
            all_of_b.set()

    # 100,000 of A, the oldest, by COPY; then B's 10.
    for _chunk in range(10):
        await queue.enqueue_all([NewJob("Report", {"k": "A"}, key="tenant-a")] * 10_000)
    await queue.enqueue_all([NewJob("Report", {"k": "B"}, key="tenant-b") for _ in range(10)])
    row = admin.execute("SELECT count(*) FROM axa_queue WHERE key = 'tenant-a'").fetchone()
    assert row is not None and row[0] == 100_000
    async with running(queue):
        await asyncio.wait_for(all_of_b.wait(), 60)
    before = started[: max(i for i, k in enumerate(started) if k == "B") + 1]
    assert before.count("A") < 1_000, before.count("A")
