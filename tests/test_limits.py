"""Limits (`axa_queue.limits`): per-process limits per job name, with batched claims;
the bounds every limit is checked against; and the attempt limit, resolved in one
place and sent alike to the claim, a lost run and stale recovery."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest

from axa_queue import JobContext, JobState, NewJob, OptionsError, Recovered, sql
from axa_queue.limits import MAX_LIMIT, MAX_RATE, MAX_WINDOW, AttemptLimits, Limits
from conftest import eventually, later, running, status_of


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


# --- what limits.py owns -----------------------------------------------------------------


async def test_every_limit_is_kept_by_limits_and_checked_there(make_queue) -> None:
    queue = await make_queue(open=False)
    queue.limit("Local", 2)
    queue.limit("Shared", 3, scope="global")
    queue.rate_limit("Paced", 10, per=timedelta(milliseconds=1500))
    limits = queue.registry.limits
    assert (limits.process, limits.global_, limits.rate) == (
        {"Local": 2},
        {"Shared": 3},
        {"Paced": (10, 1500)},
    )
    assert queue.limits is limits.process
    assert limits.gated and limits.holds_places("Shared") and not limits.holds_places("Paced")
    assert limits.places("Local", 1, 5) == 1 and limits.places("Other", 9, 5) == 5
    for bad in (0, MAX_LIMIT + 1, True, 2.5):
        with pytest.raises(OptionsError, match=f"limit of job 'Local' .* at most {MAX_LIMIT}"):
            queue.limit("Local", bad)  # type: ignore[arg-type]
    with pytest.raises(OptionsError, match="scope of the limit of job 'Local'"):
        queue.limit("Local", 1, scope="everywhere")  # type: ignore[arg-type]
    with pytest.raises(
        OptionsError, match=f"per= of the rate limit of job 'Paced'.* {MAX_WINDOW.days}"
    ):
        queue.rate_limit("Paced", 1, per=MAX_WINDOW + timedelta(days=1))
    assert Limits().gated is False


def test_the_claim_statements_clamp_limits_to_the_bounds_limits_checks() -> None:
    window_ms = int(MAX_WINDOW / timedelta(milliseconds=1))
    assert f"least(w.global, {MAX_LIMIT})" in sql.EXCHANGE_LIMITED
    rated = sql.EXCHANGE_RATED
    assert f"WHEN r.global > {MAX_LIMIT} THEN {MAX_LIMIT}" in rated
    assert f"WHEN r.rate > {MAX_RATE} THEN {MAX_RATE}" in rated
    assert f"WHEN r.per_ms > {window_ms} THEN {window_ms}" in rated


# --- the attempt limit -------------------------------------------------------------------


def test_the_attempt_limit_is_the_jobs_own_else_its_handlers_else_the_queues() -> None:
    limits = AttemptLimits(1, {"Report": 3})
    assert limits.of("Report", 5) == 5, "the job's own wins"
    assert limits.of("Report", None) == 3, "else its handler's"
    assert limits.of("Other", None) == 1, "else the queue's"
    assert limits.params() == {"max": 1, "limits": '{"Report": 3}'}


def stored_without_limit(admin: psycopg.Connection[Any], name: str) -> UUID:
    """A job queued by a process without its handler (or the Rust crate): no
    `max_attempts` on its row."""
    job_id = admin.execute(
        "INSERT INTO axa_queue (id, name, args) VALUES (gen_random_uuid(), %s, '{}') RETURNING id",
        (name,),
    ).fetchone()[0]
    return UUID(str(job_id))


def run_by_hand(admin: psycopg.Connection[Any], job_id: UUID, *, ahead: bool = False) -> None:
    """Mark a job's first run running, as a process that then died would have left it
    (`ahead`: claimed ahead of the loops, its handler never started)."""
    admin.execute(
        "UPDATE axa_queue SET status = 'running', attempts = 1, started_at = now(), "
        "updated_at = now(), ahead = CASE WHEN %s THEN 1 END WHERE id = %s",
        (ahead, job_id),
    )


async def test_stale_recovery_counts_a_job_stored_without_a_limit_against_its_handlers(
    make_queue, admin
) -> None:
    # The claim gives such a job its handler's limit (3), so its run had tries left:
    # recovery must say the same, not the queue's default (1, no retries).
    queue = await make_queue(stale_after=0.5, max_attempts=1)
    queue.handle("Report", lambda args: None, max_attempts=3)
    handled = stored_without_limit(admin, "Report")
    unhandled = stored_without_limit(admin, "Other")
    own = stored_without_limit(admin, "Report")
    admin.execute("UPDATE axa_queue SET max_attempts = 1 WHERE id = %s", (own,))
    ahead = stored_without_limit(admin, "Report")
    for job_id in (handled, unhandled, own):
        run_by_hand(admin, job_id)
    run_by_hand(admin, ahead, ahead=True)
    after = later(admin, 0.6)
    expected = {
        Recovered(handled, "Report", 1, JobState.QUEUED),
        Recovered(unhandled, "Other", 1, JobState.FAILED),
        Recovered(own, "Report", 1, JobState.FAILED),
        Recovered(ahead, "Report", 1, JobState.QUEUED),
    }
    assert set(await queue.recover_stale(dry_run=True, now=after)) == expected
    assert set(await queue.recover_stale(now=after)) == expected
    assert status_of(admin, handled) == ("queued", None, 1)
    assert status_of(admin, unhandled) == ("failed", "abandoned by its worker", 1)
    # Its attempt given back: its limit rises by one from its handler's, not the default.
    row = admin.execute(
        "SELECT max_attempts, given_back FROM axa_queue WHERE id = %s", (ahead,)
    ).fetchone()
    assert row == (4, 1)


async def test_a_run_that_gave_up_its_claim_is_judged_by_the_limit_its_claim_gave_it(
    make_queue, admin
) -> None:
    # The run of a job stored without a limit gets its handler's (3) from the claim; when
    # it gives up its claim (it could not report in for stale_after), `MARK_LOST` must
    # judge it by that limit too: back to the queue, not failed by the default (1).
    queue = await make_queue(stale_after=1.0, heartbeat_interval=0.1, max_attempts=1)
    limits: list[int] = []
    started = asyncio.Event()
    stopped = asyncio.Event()

    async def hang(args: Any, job: JobContext) -> None:
        limits.append(job.max_attempts)
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopped.set()
            raise

    queue.handle("Hang", hang, max_attempts=3)
    job_id = stored_without_limit(admin, "Hang")
    async with running(queue):
        await asyncio.wait_for(started.wait(), 15)
        # Queued again, the job must stay so to be read: no claim of it from here on.
        await queue.pause("Hang", "ops:test", "read the job's fate")
        # Hold the job's row: the heartbeats wait for it and are given up, so the run
        # stops; what becomes of its job waits for the row too, until it is let go.
        with admin.transaction():
            admin.execute("SELECT 1 FROM axa_queue WHERE id = %s FOR UPDATE", (job_id,))
            await asyncio.wait_for(stopped.wait(), 15)
        await eventually(lambda: status_of(admin, job_id)[0] != "running")
    assert limits == [3]
    status, _, attempts = status_of(admin, job_id)
    assert (status, attempts) == ("queued", 1)


def test_a_handler_called_directly_gets_its_own_attempt_limit() -> None:
    from axa_queue import Queue, QueueOptions

    queue = Queue(options=QueueOptions(max_attempts=2))
    seen: list[int] = []

    @queue.handler("Own", max_attempts=5)
    def own(args: Any, job: JobContext) -> None:
        seen.append(job.max_attempts)

    @queue.handler("Plain")
    def plain(args: Any, job: JobContext) -> None:
        seen.append(job.max_attempts)

    own({})
    plain({})
    assert seen == [5, 2]


async def test_the_limit_that_applies_is_stored_when_a_job_is_claimed_and_shown(
    make_queue, admin, dsn
) -> None:
    # Queued without a limit of its own, its handler setting none: the queue's (3) is
    # the one that applies, and every reader shows it once the job was claimed.
    from click.testing import CliRunner

    from axa_queue.cli import main

    queue = await make_queue(max_attempts=3)
    failures: list[int] = []

    @queue.handler("Flaky")
    async def flaky(args: Any) -> None:
        failures.append(1)
        raise RuntimeError("partner down")

    job_id = stored_without_limit(admin, "Flaky")
    assert (await queue.job(job_id)).max_attempts is None  # type: ignore[union-attr]
    async with running(queue):
        await eventually(lambda: len(failures) >= 1)
    info = await queue.job(job_id)
    assert info is not None and info.max_attempts == 3
    runner = CliRunner(env={"AXA_QUEUE_DSN": dsn, "DATABASE_URL": None})
    shown = await asyncio.to_thread(  # the command runs its own event loop
        runner.invoke, main, ["show", str(job_id)], prog_name="axa-queue"
    )
    assert f"{info.attempt} of 3" in shown.output
