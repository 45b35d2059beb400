"""Per-process limits per job name, with batched claims."""

from __future__ import annotations

import asyncio
from typing import Any

from axa_queue import NewJob
from conftest import eventually, running


async def test_a_limited_name_never_runs_more_than_its_limit_while_others_keep_the_loops_busy(
    make_queue,
) -> None:
    queue = await make_queue(workers=6)
    now = {"Slow": 0, "Fast": 0}
    peak = {"Slow": 0, "Fast": 0}
    done: list[str] = []

    def handler(name: str):
        async def run(args: Any) -> None:
            now[name] += 1
            peak[name] = max(peak[name], now[name])
            await asyncio.sleep(0.05 if name == "Slow" else 0.01)
            now[name] -= 1
            done.append(name)

        return run

    queue.handle("Slow", handler("Slow"))
    queue.handle("Fast", handler("Fast"))
    queue.limit("Slow", 2)
    await queue.enqueue_all(NewJob("Slow", {}) for _ in range(12))
    await queue.enqueue_all(NewJob("Fast", {}) for _ in range(60))
    async with running(queue):
        await eventually(lambda: len(done) == 72)
    assert peak["Slow"] == 2
    assert peak["Fast"] >= 3, "the other loops ran other names meanwhile"


async def test_a_limit_of_one_runs_jobs_of_that_name_one_at_a_time_in_priority_order(
    make_queue,
) -> None:
    queue = await make_queue(workers=4)
    order: list[int] = []
    active = 0
    overlap = False

    @queue.handler("Single")
    async def single(args: dict[str, int]) -> None:
        nonlocal active, overlap
        active += 1
        overlap = overlap or active > 1
        await asyncio.sleep(0.01)
        order.append(args["p"])
        active -= 1

    queue.limit("Single", 1)
    await queue.enqueue_all(NewJob("Single", {"p": p}, priority=p) for p in (1, 5, 3, 9, 0))
    async with running(queue):
        await eventually(lambda: len(order) == 5)
    assert not overlap
    assert order == [9, 5, 3, 1, 0]


async def test_limits_hold_across_many_batched_claims_under_load(make_queue, admin) -> None:
    queue = await make_queue(workers=10)
    active = {"A": 0, "B": 0}
    peak = {"A": 0, "B": 0}
    finished = 0

    def handler(name: str):
        async def run(args: Any) -> None:
            nonlocal finished
            active[name] += 1
            peak[name] = max(peak[name], active[name])
            await asyncio.sleep(0)
            active[name] -= 1
            finished += 1

        return run

    queue.handle("A", handler("A"))
    queue.handle("B", handler("B"))
    queue.handle("C", lambda args: None)
    queue.limit("A", 3)
    queue.limit("B", 1)
    jobs = [NewJob(name, {}) for _ in range(150) for name in ("A", "B", "C")]
    await queue.enqueue_all(jobs)
    async with running(queue):
        await eventually(
            lambda: (
                admin.execute(
                    "SELECT count(*) FROM axa_queue WHERE status = 'completed'"
                ).fetchone()[0]
                == 450
            ),
            timeout=60,
        )
    assert peak["A"] <= 3 and peak["B"] == 1
    assert finished == 300


async def test_jobs_claimed_ahead_wait_for_a_loop_and_each_runs_once_within_its_limit(
    make_queue, admin
) -> None:
    queue = await make_queue(workers=3, prefetch=3)
    active = 0
    peak = 0
    seen: list[int] = []

    @queue.handler("Ahead")
    async def ahead(args: dict[str, int]) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.005)
        seen.append(args["n"])
        active -= 1

    queue.handle("Limited", lambda args: seen.append(-1))
    queue.limit("Limited", 1)
    await queue.enqueue_all(NewJob("Ahead", {"n": n}) for n in range(60))
    await queue.enqueue_all(NewJob("Limited", {}) for _ in range(5))
    async with running(queue):
        await eventually(lambda: len(seen) == 65)
    assert peak <= 3, "no more handlers at once than loops"
    assert sorted(n for n in seen if n >= 0) == list(range(60))
    row = admin.execute(
        "SELECT count(*), max(attempts) FROM axa_queue WHERE status = 'completed'"
    ).fetchone()
    assert row == (65, 1)


async def test_a_stop_runs_the_jobs_claimed_ahead_too(make_queue, admin) -> None:
    queue = await make_queue(workers=1, prefetch=4)
    gate = asyncio.Event()
    seen: list[int] = []

    @queue.handler("Held")
    async def held(args: dict[str, int]) -> None:
        await gate.wait()
        seen.append(args["n"])

    await queue.enqueue_all(NewJob("Held", {"n": n}) for n in range(5))
    stop = asyncio.Event()
    task = asyncio.create_task(queue.run(stop))
    await eventually(
        lambda: (
            admin.execute("SELECT count(*) FROM axa_queue WHERE status = 'running'").fetchone()[0]
            == 5
        )
    )
    stop.set()
    gate.set()
    await asyncio.wait_for(task, 15)
    assert sorted(seen) == [0, 1, 2, 3, 4]
    assert admin.execute(
        "SELECT count(*) FROM axa_queue WHERE status = 'completed'"
    ).fetchone() == (5,)
