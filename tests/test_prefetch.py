"""`prefetch="auto"` (the default): what a worker claims ahead of its loops follows how
long its runs take, in all and name by name."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg

from axa_queue import NewJob, Queue
from conftest import eventually, running


def held(admin: psycopg.Connection[Any], name: str) -> int:
    """How many jobs of `name` are claimed (`running` in the table), waiting or not."""
    row = admin.execute(
        "SELECT count(*) FROM axa_queue WHERE name = %s AND status = 'running'", (name,)
    ).fetchone()
    assert row is not None
    return int(row[0])


async def at_most(admin: psycopg.Connection[Any], name: str, most: int, seconds: float) -> None:
    """Check, for `seconds` (many poll intervals of the worker's), that no more than
    `most` jobs of `name` are claimed: a bound that holds whenever it is looked at."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert held(admin, name) <= most
        await asyncio.sleep(0.02)


def short(queue: Queue, done: list[int]) -> None:
    @queue.handler("Short")
    async def run(args: dict[str, int]) -> None:
        done.append(args["n"])


async def test_a_worker_claims_many_short_jobs_ahead_once_it_knows_they_are_short(
    make_queue, admin
) -> None:
    queue = await make_queue(workers=2)
    done: list[int] = []
    peak = 0

    @queue.handler("Short")
    async def run(args: dict[str, int]) -> None:
        nonlocal peak
        if len(done) % 20 == 10:  # now and then: how many this worker holds
            async with queue.pool.connection() as conn:
                cursor = await conn.execute(
                    "SELECT count(*) FROM axa_queue WHERE status = 'running'"
                )
                row = await cursor.fetchone()
                assert row is not None
                peak = max(peak, row[0])
        done.append(args["n"])

    await queue.enqueue_all(NewJob("Short", {"n": n}) for n in range(600))
    async with running(queue):
        await eventually(lambda: len(done) == 600)
    assert sorted(done) == list(range(600))
    assert peak > 10, "short jobs were claimed ahead of the two loops"


async def test_a_worker_whose_loops_are_busy_with_long_jobs_holds_no_others_for_them(
    make_queue, admin
) -> None:
    queue = await make_queue(workers=2)
    done: list[int] = []
    short(queue, done)
    started = 0
    both = asyncio.Event()
    release = asyncio.Event()

    @queue.handler("Long")
    async def long(args: dict[str, int]) -> None:
        nonlocal started
        started += 1
        if started == 2:
            both.set()
        await release.wait()

    # It learns that its short jobs are short ...
    await queue.enqueue_all(NewJob("Short", {"n": n}) for n in range(50))
    async with running(queue):
        await eventually(lambda: len(done) == 50)
        # ... then ten jobs of a name it has never timed come: it takes what its loops
        # start now, and claims nothing ahead for loops that may stay busy for long (a
        # running average over every name would have taken all ten at the short pace).
        await queue.enqueue_all(NewJob("Long", {"n": n}) for n in range(10))
        await asyncio.wait_for(both.wait(), 15)
        await at_most(admin, "Long", 2, 0.5)
        # Short jobs queued meanwhile wait in the table for any process's free loop.
        await queue.enqueue_all(NewJob("Short", {"n": n}) for n in range(50, 100))
        await at_most(admin, "Short", 0, 0.5)
        release.set()
        await eventually(lambda: len(done) == 100)
    assert held(admin, "Long") == 0


async def test_among_short_jobs_a_name_of_long_ones_has_at_most_one_waiting(
    make_queue, admin
) -> None:
    queue = await make_queue(workers=3)
    done: list[int] = []
    short(queue, done)
    started = 0
    release = asyncio.Event()

    @queue.handler("Long")
    async def long(args: dict[str, int]) -> None:
        nonlocal started
        started += 1
        if started == 1:  # its first run takes long, so the worker learns its pace
            await asyncio.sleep(0.3)
            return
        await release.wait()

    await queue.enqueue_all(NewJob("Short", {"n": n}) for n in range(50))
    await queue.enqueue("Long", {"n": 0})
    async with running(queue):
        await eventually(lambda: len(done) == 50 and started == 1)
        await eventually(lambda: held(admin, "Long") == 0)
        # A long job holds one loop; the two others run short jobs, claimed ahead in
        # numbers; ten more long jobs come among them: each waits in this process one
        # at a time at most, so the others stay in the table for other processes.
        await queue.enqueue("Long", {"n": 1})
        await eventually(lambda: started == 2)
        past = datetime.now(timezone.utc) - timedelta(minutes=1)
        await queue.enqueue_all(  # due in this order: a long job every thirty
            NewJob(
                "Long" if n % 30 == 0 else "Short",
                {"n": n},
                run_at=past + timedelta(milliseconds=n),
            )
            for n in range(100, 400)
        )
        # The three loops end up busy with long jobs, and one more may wait.
        await eventually(lambda: started == 4)
        await at_most(admin, "Long", 4, 0.5)
        release.set()
        await eventually(lambda: len(done) == 50 + 290)
    assert held(admin, "Long") == 0


async def test_a_new_name_with_more_jobs_than_loops_runs_them_all_without_waiting_for_the_poll(
    make_queue,
) -> None:
    # A new name's first claim fills only the idle loops; another name asked for in the
    # same claim found nothing. The worker must not take that as "no more work" and
    # wait for the poll interval (an hour here): a loop coming free looks again.
    queue = await make_queue(workers=4, poll_interval=3600)
    ran: list[str] = []
    queue.handle("Report", lambda args: ran.append("Report"))
    queue.handle("Free", lambda args: ran.append("Free"))
    async with running(queue):
        await queue.enqueue_all([NewJob("Free", {"n": n}) for n in range(20)])
        await eventually(lambda: ran.count("Free") == 20)  # its pace known: room ahead
        await queue.enqueue_all([NewJob("Report", {"n": n}) for n in range(9)])
        await eventually(lambda: ran.count("Report") == 9)
