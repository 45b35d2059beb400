"""Running jobs: claims, exactly-once, priority, delays, attempts, timeouts."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any

from axa_queue import JobState, NewJob
from conftest import eventually, running, status_of


async def test_a_queued_job_runs_once_and_is_marked_completed(make_queue, admin) -> None:
    queue = await make_queue()
    seen: list[Any] = []

    @queue.handler("Report")
    async def report(args: dict[str, Any]) -> None:
        seen.append(args)

    job_id = await queue.enqueue("Report", {"id": 7})
    async with running(queue):
        await eventually(lambda: status_of(admin, job_id)[0] == "completed")
    assert seen == [{"id": 7}]
    info = await queue.job(job_id)
    assert info is not None and info.state is JobState.COMPLETED and info.attempt == 1


async def test_a_job_with_no_handler_here_stays_queued(make_queue, admin) -> None:
    queue = await make_queue()
    queue.handle("Known", lambda args: None)
    other = await queue.enqueue("Unknown", {})
    known = await queue.enqueue("Known", {})
    async with running(queue):
        await eventually(lambda: status_of(admin, known)[0] == "completed")
    assert status_of(admin, other)[0] == "queued"


async def test_higher_priority_runs_first_then_oldest(make_queue) -> None:
    queue = await make_queue(workers=1)
    order: list[str] = []
    queue.handle("J", lambda args: order.append(args["tag"]))
    await queue.enqueue("J", {"tag": "low-old"}, priority=-1)
    await queue.enqueue("J", {"tag": "mid-old"})
    await queue.enqueue("J", {"tag": "high"}, priority=5)
    await queue.enqueue("J", {"tag": "mid-new"})
    async with running(queue):
        await eventually(lambda: len(order) == 4)
    assert order == ["high", "mid-old", "mid-new", "low-old"]


async def test_a_failing_job_is_retried_with_backoff_until_its_attempts_run_out(
    make_queue, admin
) -> None:
    queue = await make_queue(max_attempts=3)
    calls: list[float] = []

    @queue.handler("Flaky")
    async def flaky(args: Any) -> None:
        calls.append(asyncio.get_running_loop().time())
        raise RuntimeError("told to fail")

    job_id = await queue.enqueue("Flaky", {})
    async with running(queue):
        await eventually(lambda: status_of(admin, job_id)[0] == "failed")
    _, error, attempts = status_of(admin, job_id)
    assert attempts == 3 and len(calls) == 3
    assert error == "RuntimeError: told to fail"
    # Each wait doubles from retry_backoff: at least 0.05 s, then at least 0.1 s.
    assert calls[1] - calls[0] >= 0.05 * 0.9
    assert calls[2] - calls[1] >= 0.1 * 0.9


async def test_a_job_past_its_timeout_is_stopped_and_fails(make_queue, admin) -> None:
    queue = await make_queue()

    @queue.handler("Slow")
    async def slow(args: Any) -> None:
        await asyncio.sleep(30)

    job_id = await queue.enqueue("Slow", {}, timeout=0.2)
    async with running(queue):
        await eventually(lambda: status_of(admin, job_id)[0] == "failed")
    assert status_of(admin, job_id)[1] == "timed out after 0.2 s"


async def test_a_delayed_job_waits_for_its_time_on_the_database_clock(make_queue, admin) -> None:
    queue = await make_queue()
    queue.handle("Later", lambda args: None)
    soon = await queue.enqueue("Later", {}, run_in=0.5)
    far = await queue.enqueue("Later", {}, run_at=datetime.now(timezone.utc) + timedelta(hours=1))
    async with running(queue):
        # A job queued after it, with no delay, has been claimed and run: the worker
        # has looked for work since, and left the delayed one.
        now = await queue.enqueue("Later", {})
        await eventually(lambda: status_of(admin, now)[0] == "completed")
        assert status_of(admin, soon)[0] == "queued"
        await eventually(lambda: status_of(admin, soon)[0] == "completed")
    assert status_of(admin, far)[0] == "queued"


async def test_many_loops_run_each_of_many_jobs_exactly_once(make_queue, admin) -> None:
    queue = await make_queue(workers=8)
    seen: list[int] = []

    @queue.handler("Count")
    async def count(args: dict[str, int]) -> None:
        await asyncio.sleep(0.001)
        seen.append(args["n"])

    await queue.enqueue_all(NewJob("Count", {"n": n}) for n in range(500))
    async with running(queue):
        await eventually(lambda: len(seen) >= 500)

        async def all_recorded() -> bool:
            return (await queue.counts()).completed == 500

        # Every ending is written: a completed job is never claimed again, so no run
        # can come after this.
        await eventually(all_recorded)
    assert sorted(seen) == list(range(500))
    counts = await queue.counts()
    assert counts.completed == 500 and counts.ready == 0 and counts.running == 0


async def test_a_worker_keeps_claiming_while_jobs_remain_without_polls_or_notifications(
    make_queue,
) -> None:
    # No poll within the test's time and no LISTEN: only the worker's own sense that
    # more work is waiting keeps it claiming.
    queue = await make_queue(workers=2, poll_interval=600, listen=False)
    seen: list[int] = []
    queue.handle("Step", lambda args: seen.append(args["n"]))
    await queue.enqueue_all(NewJob("Step", {"n": n}) for n in range(40))
    async with running(queue):
        await eventually(lambda: len(seen) == 40)
    assert sorted(seen) == list(range(40))
