"""Peers: pgqueuer and procrastinate on the same workloads as axa-queue, in one run.

Installed by the bench-only extra (`pip install "axa-queue[bench]"`); `available()`
says which are, and `bench/run.py` leaves out the rows of a missing one.

Each peer runs with its defaults, as a user who sets nothing gets them, and the same
job as axa-queue's: write its key to `bench_done(job_id uuid primary key)` on a
connection of a pool of 10, so a second run of a job would fail. After a drain every
job must have run exactly once and succeeded, else `floor.ExactlyOnceError`.

- **bulk enqueue**: a list of keys to committed rows, in one call: pgqueuer's
  `Queries.enqueue` of lists on its asyncpg driver (its fastest path), procrastinate's
  `batch_defer_async`.
- **drain**: pre-queued jobs run by `QueueManager.run(mode=drain)` (pgqueuer,
  `batch_size` 10, its default) and `run_worker_async(concurrency=10, wait=False)`
  (procrastinate), until the queue is empty.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
import uuid
from typing import Any, Literal

import psycopg
from psycopg_pool import AsyncConnectionPool

import floor
import integrations

Peer = Literal["pgqueuer", "procrastinate"]
PEERS: tuple[Peer, ...] = ("pgqueuer", "procrastinate")
DONE = "INSERT INTO bench_done (job_id) VALUES (%s)"
DONE_ASYNCPG = "INSERT INTO bench_done (job_id) VALUES ($1)"
BENCH_DONE = "CREATE TABLE IF NOT EXISTS bench_done (job_id UUID PRIMARY KEY)"
JOB = "noop"
POOL = 10
"""Connections of the pool the jobs write on (axa-queue's handlers use its pool)."""


def available() -> list[Peer]:
    """The peers installed here."""
    return [peer for peer in PEERS if importlib.util.find_spec(peer) is not None]


# --- pgqueuer ------------------------------------------------------------------------------


async def _pgqueuer_driver(dsn: str) -> Any:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver

    return AsyncpgDriver(await asyncpg.connect(**integrations.asyncpg_kwargs(dsn)))


async def _pgqueuer_install(dsn: str) -> None:
    from pgqueuer.queries import Queries

    driver = await _pgqueuer_driver(dsn)
    try:
        await Queries(driver).install()
    finally:
        await driver._connection.close()


async def _pgqueuer_enqueue(dsn: str, keys: list[str]) -> float:
    from pgqueuer.queries import Queries

    driver = await _pgqueuer_driver(dsn)
    try:
        queries = Queries(driver)
        t0 = time.perf_counter()
        await queries.enqueue([JOB] * len(keys), [key.encode() for key in keys], [0] * len(keys))
        return time.perf_counter() - t0
    finally:
        await driver._connection.close()


async def _pgqueuer_drain(dsn: str, jobs: int) -> float:
    import asyncpg
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    driver = await _pgqueuer_driver(dsn)
    pool = await asyncpg.create_pool(
        min_size=POOL, max_size=POOL, **integrations.asyncpg_kwargs(dsn)
    )
    try:
        manager = QueueManager(Queries(driver))

        @manager.entrypoint(JOB)
        async def noop(job: Job) -> None:
            assert job.payload is not None
            async with pool.acquire() as conn:
                await conn.execute(DONE_ASYNCPG, uuid.UUID(job.payload.decode()))

        t0 = time.perf_counter()
        await manager.run(mode=QueueExecutionMode.drain)
        return time.perf_counter() - t0
    finally:
        await pool.close()
        await driver._connection.close()


def _pgqueuer_verify(dsn: str, jobs: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            """SELECT (SELECT count(*) FROM pgqueuer),
                      (SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'),
                      (SELECT count(*) FROM pgqueuer_log WHERE status = 'exception'),
                      (SELECT count(*) FROM bench_done)"""
        ).fetchone()
    if row != (0, jobs, 0, jobs):
        raise floor.ExactlyOnceError(
            f"pgqueuer: expected {jobs} jobs each run exactly once: (left, successful, "
            f"failed, rows written) = {row}"
        )


# --- procrastinate -------------------------------------------------------------------------


def _procrastinate_app(dsn: str, pool: AsyncConnectionPool | None = None) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name=JOB)
    async def noop(k: str) -> None:
        assert pool is not None
        async with pool.connection() as conn:
            await conn.execute(DONE, (k,))

    return app


async def _procrastinate_install(dsn: str) -> None:
    app = _procrastinate_app(dsn)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def _procrastinate_enqueue(dsn: str, keys: list[str]) -> float:
    app = _procrastinate_app(dsn)
    async with app.open_async():
        task = app.tasks[JOB]
        t0 = time.perf_counter()
        await task.batch_defer_async(*({"k": key} for key in keys))
        return time.perf_counter() - t0


async def _procrastinate_drain(dsn: str, jobs: int) -> float:
    async with AsyncConnectionPool(dsn, min_size=POOL, max_size=POOL, open=False) as pool:
        await pool.wait()
        app = _procrastinate_app(dsn, pool)
        async with app.open_async():
            t0 = time.perf_counter()
            await app.run_worker_async(concurrency=10, wait=False, install_signal_handlers=False)
            return time.perf_counter() - t0


def _procrastinate_verify(dsn: str, jobs: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            """SELECT (SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'),
                      (SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'),
                      (SELECT count(*) FROM procrastinate_jobs WHERE attempts > 1),
                      (SELECT count(*) FROM bench_done)"""
        ).fetchone()
    if row != (jobs, 0, 0, jobs):
        raise floor.ExactlyOnceError(
            f"procrastinate: expected {jobs} jobs each run exactly once: (succeeded, other, "
            f"retried, rows written) = {row}"
        )


# --- the workloads -------------------------------------------------------------------------


def install(dsn: str, peer: Peer) -> None:
    """The peer's tables, and the side table, in the schema `dsn` resolves to."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(BENCH_DONE)
    asyncio.run(_pgqueuer_install(dsn) if peer == "pgqueuer" else _procrastinate_install(dsn))


def enqueue_bulk(dsn: str, peer: Peer, jobs: int) -> float:
    """Jobs/s of queuing `jobs` jobs in one call into the peer's empty tables (`install`
    first), from a list of keys to committed rows."""
    keys = [str(uuid.uuid4()) for _ in range(jobs)]
    run = _pgqueuer_enqueue if peer == "pgqueuer" else _procrastinate_enqueue
    return jobs / asyncio.run(run(dsn, keys))


def queue_untimed(dsn: str, peer: Peer, jobs: int, chunk: int = 10_000) -> None:
    """Queue `jobs` jobs (untimed setup of a drain)."""
    for start in range(0, jobs, chunk):
        enqueue_bulk(dsn, peer, min(chunk, jobs - start))


def drain(dsn: str, peer: Peer, jobs: int) -> float:
    """Jobs/s of the peer's worker draining `jobs` pre-queued jobs (`queue_untimed`
    first); raises `floor.ExactlyOnceError` unless each ran once."""
    if peer == "pgqueuer":
        seconds = asyncio.run(_pgqueuer_drain(dsn, jobs))
        _pgqueuer_verify(dsn, jobs)
    else:
        seconds = asyncio.run(_procrastinate_drain(dsn, jobs))
        _procrastinate_verify(dsn, jobs)
    return jobs / seconds
