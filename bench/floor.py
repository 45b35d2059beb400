"""Raw-SQL floor benchmarks for axa-queue.

These measure what plain psycopg 3 + hand-written SQL can do against the
``axa_queue`` table of the reference design, so that the queue library can
later be measured side by side with the same methodology in the same run.

Every measurement runs in its own private schema (``CREATE SCHEMA``, connect
with ``options='-c search_path=<schema>'``, ``DROP SCHEMA ... CASCADE``
afterwards).  Each no-op job writes one row into ``bench_done`` so the drain
benchmarks can verify that every job ran exactly once; they raise
:class:`ExactlyOnceError` if not.

Public API (each function does one measurement and returns a frozen
dataclass; :func:`median_run` picks the median of repeated runs):

* :func:`drain_one_at_a_time` -> :class:`DrainResult`
* :func:`drain_batched` -> :class:`DrainResult`
* :func:`latency` -> :class:`LatencyResult`
* :func:`bulk_insert` -> :class:`BulkInsertResult`
* :func:`run_suite` runs everything and returns the medians.

Run ``python bench/floor.py --dsn postgresql://root@127.0.0.1:5432/test`` to
print a table of medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

Mode = Literal["threads", "asyncio"]
T = TypeVar("T")

TABLE_DDL = """
CREATE TABLE IF NOT EXISTS axa_queue (
    id UUID PRIMARY KEY,
    name TEXT NOT NULL,
    args JSONB NOT NULL,
    status TEXT NOT NULL DEFAULT 'queued',
    error TEXT,
    run_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER,
    priority SMALLINT NOT NULL DEFAULT 0,
    timeout_ms BIGINT
);
CREATE INDEX IF NOT EXISTS axa_queue_claim
    ON axa_queue (priority DESC, run_at) WHERE status = 'queued';
CREATE TABLE IF NOT EXISTS bench_done (job_id UUID NOT NULL);
"""
# bench_done deliberately has no primary key: duplicates are detected by
# verify_exactly_once() afterwards instead of by a unique violation that would
# kill a worker half-way (and the PK index would add to the measured cost).

CLAIM_ONE = """
UPDATE axa_queue
   SET status = 'running', attempts = attempts + 1,
       started_at = now(), updated_at = now()
 WHERE id = (
        SELECT id FROM axa_queue
         WHERE status = 'queued' AND run_at <= now()
         ORDER BY priority DESC, run_at
           FOR UPDATE SKIP LOCKED
         LIMIT 1)
RETURNING id
"""

# Pitfall: the natural form ``UPDATE ... FROM c WHERE q.id = c.id`` gets a
# Hash Join over a Seq Scan of the whole table once the table has been
# ANALYZEd (the CTE is estimated at LIMIT rows, the table at N rows), so every
# batch costs O(table).  ``id = ANY(ARRAY(SELECT id FROM c))`` keeps it on the
# primary key index whatever the statistics say.
CLAIM_BATCH = """
WITH c AS MATERIALIZED (
    SELECT id FROM axa_queue
     WHERE status = 'queued' AND run_at <= now()
     ORDER BY priority DESC, run_at
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED)
UPDATE axa_queue
   SET status = 'running', attempts = attempts + 1,
       started_at = now(), updated_at = now()
 WHERE id = ANY(ARRAY(SELECT id FROM c))
RETURNING id
"""

# The plan-sensitive variant, kept for comparison (see CLAIM_BATCH).
CLAIM_BATCH_JOIN = """
WITH c AS MATERIALIZED (
    SELECT id FROM axa_queue
     WHERE status = 'queued' AND run_at <= now()
     ORDER BY priority DESC, run_at
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED)
UPDATE axa_queue q
   SET status = 'running', attempts = q.attempts + 1,
       started_at = now(), updated_at = now()
  FROM c
 WHERE q.id = c.id
RETURNING q.id
"""

DONE_ONE = "INSERT INTO bench_done (job_id) VALUES (%s)"
COMPLETE_ONE = "UPDATE axa_queue SET status = 'completed', updated_at = now() WHERE id = %s"
DONE_MANY = "INSERT INTO bench_done (job_id) SELECT unnest(%s::uuid[])"
COMPLETE_MANY = (
    "UPDATE axa_queue SET status = 'completed', updated_at = now() WHERE id = ANY(%s::uuid[])"
)
INSERT_NOTIFY = "INSERT INTO axa_queue (id, name, args) VALUES (%s, %s, %s)"
CHANNEL = "axa_queue"

_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_PG_MAX_PARAMS = 65535


class ExactlyOnceError(AssertionError):
    """A drain did not run every enqueued job exactly once."""


@dataclass(frozen=True)
class DrainResult:
    """One drain measurement."""

    kind: str
    mode: str
    jobs: int
    connections: int
    batch: int
    seconds: float

    @property
    def jobs_per_s(self) -> float:
        """Throughput of the timed drain."""
        return self.jobs / self.seconds


@dataclass(frozen=True)
class LatencyResult:
    """Enqueue-to-start latency of an idle LISTEN/NOTIFY consumer.

    Latency is measured from the moment the producer starts its enqueue
    transaction (INSERT + NOTIFY + COMMIT, one pipelined round trip) to the
    moment the consumer's claim statement has returned the job, both on the
    same ``time.perf_counter`` clock.  ``enqueue_p50_ms`` is the producer's
    own enqueue round trip, for reference.
    """

    mode: str
    samples: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    enqueue_p50_ms: float


@dataclass(frozen=True)
class BulkInsertResult:
    """Bulk enqueue throughput (jobs/s) by method, one transaction each."""

    jobs: int
    values_jobs_per_s: float
    """One multi-row ``INSERT ... VALUES (...), (...)`` statement."""
    executemany_jobs_per_s: float
    """``cursor.executemany`` of a single-row INSERT (psycopg pipeline mode)."""
    unnest_jobs_per_s: float
    """One ``INSERT ... SELECT FROM unnest(%s::uuid[], %s::text[], %s::jsonb[])``."""
    copy_jobs_per_s: float
    """``COPY axa_queue (id, name, args) FROM STDIN`` with ``write_row``."""


@dataclass
class SuiteResult:
    """Medians of a full run, plus the raw runs."""

    drains: list[DrainResult] = field(default_factory=list)
    latencies: list[LatencyResult] = field(default_factory=list)
    bulk: list[BulkInsertResult] = field(default_factory=list)


# --------------------------------------------------------------------------
# connections and schema


def _check_schema(schema: str) -> None:
    if not _SCHEMA_RE.match(schema):
        raise ValueError(f"schema name must match {_SCHEMA_RE.pattern}: {schema!r}")


def _options(schema: str, jit: bool) -> str:
    opts = f"-c search_path={schema}"
    if not jit:
        opts += " -c jit=off"
    return opts


def connect(
    dsn: str, schema: str, *, autocommit: bool = True, jit: bool = False
) -> psycopg.Connection:
    """Open a sync connection whose search_path is ``schema``."""
    _check_schema(schema)
    return psycopg.connect(dsn, options=_options(schema, jit), autocommit=autocommit)


async def aconnect(
    dsn: str, schema: str, *, autocommit: bool = True, jit: bool = False
) -> psycopg.AsyncConnection:
    """Open an async connection whose search_path is ``schema``."""
    _check_schema(schema)
    return await psycopg.AsyncConnection.connect(
        dsn, options=_options(schema, jit), autocommit=autocommit
    )


@contextmanager
def private_schema(dsn: str, schema: str) -> Iterator[str]:
    """Create ``schema`` with the bench tables; drop it (CASCADE) on exit.

    Fails if the schema already exists, so it never drops someone else's.
    """
    _check_schema(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        with connect(dsn, schema) as conn:
            conn.execute(TABLE_DDL)
        yield schema
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _job_rows(jobs: int) -> list[tuple[uuid.UUID, str, dict[str, object]]]:
    return [(uuid.uuid4(), "noop", {"i": i}) for i in range(jobs)]


def enqueue(conn: psycopg.Connection, jobs: int, *, analyze: bool = True) -> None:
    """Enqueue ``jobs`` no-op jobs with COPY (untimed setup for the drains).

    ``analyze`` runs ANALYZE afterwards so the plans are the ones a
    long-lived, autovacuumed queue table gets (see CLAIM_BATCH).
    """
    with (
        conn.transaction(),
        conn.cursor() as cur,
        cur.copy("COPY axa_queue (id, name, args) FROM STDIN") as copy,
    ):
        for job_id, name, args in _job_rows(jobs):
            copy.write_row((job_id, name, Jsonb(args)))
    if analyze:
        conn.execute("ANALYZE axa_queue")


def verify_exactly_once(conn: psycopg.Connection, jobs: int) -> None:
    """Raise :class:`ExactlyOnceError` unless every job ran exactly once."""
    row = conn.execute(
        """
        SELECT (SELECT count(*) FROM axa_queue),
               (SELECT count(*) FROM bench_done),
               (SELECT count(DISTINCT job_id) FROM bench_done),
               (SELECT count(*) FROM bench_done d
                 WHERE NOT EXISTS (SELECT 1 FROM axa_queue q WHERE q.id = d.job_id)),
               (SELECT count(*) FROM axa_queue
                 WHERE status <> 'completed' OR attempts <> 1)
        """
    ).fetchone()
    assert row is not None
    queued, done, distinct, stray, unfinished = row
    if (queued, done, distinct, stray, unfinished) != (jobs, jobs, jobs, 0, 0):
        raise ExactlyOnceError(
            f"expected {jobs} jobs each done once; table has {queued} jobs, "
            f"bench_done has {done} rows / {distinct} distinct ids, "
            f"{stray} ids not in the queue, {unfinished} jobs not completed "
            f"with attempts = 1"
        )


# --------------------------------------------------------------------------
# drain workers


def _sync_worker_one(conn: psycopg.Connection, start: threading.Barrier) -> int:
    n = 0
    cur = conn.cursor()
    start.wait()
    while True:
        row = cur.execute(CLAIM_ONE, prepare=True).fetchone()
        if row is None:
            return n
        # the job body (bench_done row) and completion: one transaction,
        # pipelined into a single round trip
        with conn.pipeline(), conn.transaction():
            cur.execute(DONE_ONE, (row[0],), prepare=True)
            cur.execute(COMPLETE_ONE, (row[0],), prepare=True)
        n += 1


def _sync_worker_batch(
    conn: psycopg.Connection, start: threading.Barrier, batch: int, claim_sql: str
) -> int:
    n = 0
    cur = conn.cursor()
    start.wait()
    while True:
        ids = [r[0] for r in cur.execute(claim_sql, {"batch": batch}, prepare=True).fetchall()]
        if not ids:
            return n
        with conn.pipeline(), conn.transaction():
            cur.execute(DONE_MANY, (ids,), prepare=True)
            cur.execute(COMPLETE_MANY, (ids,), prepare=True)
        n += len(ids)


async def _async_worker_one(conn: psycopg.AsyncConnection, start: asyncio.Event) -> int:
    n = 0
    cur = conn.cursor()
    await start.wait()
    while True:
        row = await (await cur.execute(CLAIM_ONE, prepare=True)).fetchone()
        if row is None:
            return n
        async with conn.pipeline(), conn.transaction():
            await cur.execute(DONE_ONE, (row[0],), prepare=True)
            await cur.execute(COMPLETE_ONE, (row[0],), prepare=True)
        n += 1


async def _async_worker_batch(
    conn: psycopg.AsyncConnection, start: asyncio.Event, batch: int, claim_sql: str
) -> int:
    n = 0
    cur = conn.cursor()
    await start.wait()
    while True:
        await cur.execute(claim_sql, {"batch": batch}, prepare=True)
        ids = [r[0] for r in await cur.fetchall()]
        if not ids:
            return n
        async with conn.pipeline(), conn.transaction():
            await cur.execute(DONE_MANY, (ids,), prepare=True)
            await cur.execute(COMPLETE_MANY, (ids,), prepare=True)
        n += len(ids)


def _drain_threads(
    dsn: str, schema: str, connections: int, batch: int, claim_sql: str
) -> tuple[float, int]:
    conns = [connect(dsn, schema) for _ in range(connections)]
    try:
        start = threading.Barrier(connections + 1)
        counts = [0] * connections
        errors: list[BaseException] = []

        def run(i: int) -> None:
            try:
                if batch == 1:
                    counts[i] = _sync_worker_one(conns[i], start)
                else:
                    counts[i] = _sync_worker_batch(conns[i], start, batch, claim_sql)
            except BaseException as ex:  # re-raised below
                errors.append(ex)
                start.abort()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(connections)]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        if errors:
            raise errors[0]
        return elapsed, sum(counts)
    finally:
        for c in conns:
            c.close()


async def _drain_asyncio(
    dsn: str, schema: str, connections: int, batch: int, claim_sql: str
) -> tuple[float, int]:
    conns = [await aconnect(dsn, schema) for _ in range(connections)]
    try:
        start = asyncio.Event()
        if batch == 1:
            tasks = [asyncio.create_task(_async_worker_one(c, start)) for c in conns]
        else:
            tasks = [
                asyncio.create_task(_async_worker_batch(c, start, batch, claim_sql)) for c in conns
            ]
        await asyncio.sleep(0)  # let every task reach start.wait()
        t0 = time.perf_counter()
        start.set()
        counts = await asyncio.gather(*tasks)
        return time.perf_counter() - t0, sum(counts)
    finally:
        for c in conns:
            await c.close()


def _drain(
    kind: str,
    dsn: str,
    schema: str,
    jobs: int,
    connections: int,
    batch: int,
    mode: Mode,
    claim_sql: str,
    analyze: bool,
) -> DrainResult:
    if connections < 1 or jobs < 1 or batch < 1:
        raise ValueError("jobs, connections and batch must be >= 1")
    with private_schema(dsn, schema):
        with connect(dsn, schema) as conn:
            enqueue(conn, jobs, analyze=analyze)
        if mode == "threads":
            elapsed, ran = _drain_threads(dsn, schema, connections, batch, claim_sql)
        elif mode == "asyncio":
            elapsed, ran = asyncio.run(_drain_asyncio(dsn, schema, connections, batch, claim_sql))
        else:
            raise ValueError(f"unknown mode {mode!r}")
        with connect(dsn, schema) as conn:
            verify_exactly_once(conn, jobs)
        if ran != jobs:
            raise ExactlyOnceError(f"workers report {ran} jobs run, expected {jobs}")
    return DrainResult(kind, mode, jobs, connections, batch, elapsed)


def drain_one_at_a_time(
    dsn: str,
    schema: str,
    jobs: int,
    connections: int,
    *,
    mode: Mode = "threads",
    analyze: bool = True,
) -> DrainResult:
    """Drain ``jobs`` pre-enqueued jobs, claiming one per statement.

    Each of ``connections`` workers loops: claim one job with
    :data:`CLAIM_ONE` (autocommit, 1 round trip), then in one pipelined
    transaction insert its ``bench_done`` row and mark it completed
    (1 round trip).  Enqueueing is not timed; exactly-once is verified.
    """
    return _drain("one-at-a-time", dsn, schema, jobs, connections, 1, mode, CLAIM_ONE, analyze)


def drain_batched(
    dsn: str,
    schema: str,
    jobs: int,
    connections: int,
    batch: int = 100,
    *,
    mode: Mode = "threads",
    claim_sql: str = CLAIM_BATCH,
    analyze: bool = True,
) -> DrainResult:
    """Drain ``jobs`` pre-enqueued jobs, claiming up to ``batch`` per statement.

    Claim uses a MATERIALIZED CTE ``SELECT ... LIMIT ... FOR UPDATE SKIP
    LOCKED`` (:data:`CLAIM_BATCH`); the batch's ``bench_done`` rows are
    inserted with one statement and the jobs completed with one statement,
    in one pipelined transaction.  Enqueueing is not timed; exactly-once is
    verified.
    """
    if batch < 2:
        raise ValueError("batch must be >= 2; use drain_one_at_a_time for 1")
    return _drain("batched", dsn, schema, jobs, connections, batch, mode, claim_sql, analyze)


# --------------------------------------------------------------------------
# latency


def _percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil
    return ordered[int(rank) - 1]


def _latency_result(
    mode: str,
    enq_start: dict[uuid.UUID, float],
    enq_end: dict[uuid.UUID, float],
    started: dict[uuid.UUID, float],
    samples: int,
) -> LatencyResult:
    if set(started) != set(enq_start) or len(started) != samples:
        raise ExactlyOnceError(f"latency: {len(enq_start)} enqueued, {len(started)} claimed")
    lat = [(started[k] - enq_start[k]) * 1000.0 for k in enq_start]
    enq = [(enq_end[k] - enq_start[k]) * 1000.0 for k in enq_start]
    return LatencyResult(
        mode=mode,
        samples=samples,
        p50_ms=_percentile(lat, 50),
        p99_ms=_percentile(lat, 99),
        max_ms=max(lat),
        enqueue_p50_ms=_percentile(enq, 50),
    )


def _latency_threads(
    dsn: str, schema: str, samples: int, spacing_s: float, timeout_s: float
) -> LatencyResult:
    enq_start: dict[uuid.UUID, float] = {}
    enq_end: dict[uuid.UUID, float] = {}
    started: dict[uuid.UUID, float] = {}
    ready = threading.Event()
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            with connect(dsn, schema) as conn:
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
                cur = conn.cursor()
                ready.set()
                while len(started) < samples:
                    woken = False
                    for _ in conn.notifies(timeout=timeout_s, stop_after=1):
                        woken = True
                    if not woken:
                        raise TimeoutError("no notification within timeout")
                    # claim until empty: one NOTIFY may stand for several jobs
                    while row := cur.execute(CLAIM_ONE, prepare=True).fetchone():
                        started[row[0]] = time.perf_counter()
        except BaseException as ex:  # re-raised below
            errors.append(ex)
            ready.set()

    consumer = threading.Thread(target=consume)
    consumer.start()
    ready.wait()
    try:
        with connect(dsn, schema) as conn:
            cur = conn.cursor()
            for _ in range(samples):
                if errors:
                    break
                job_id = uuid.uuid4()
                t0 = time.perf_counter()
                with conn.pipeline(), conn.transaction():
                    cur.execute(INSERT_NOTIFY, (job_id, "noop", Jsonb({})), prepare=True)
                    cur.execute(sql.SQL("NOTIFY {}").format(sql.Identifier(CHANNEL)))
                enq_end[job_id] = time.perf_counter()
                enq_start[job_id] = t0
                time.sleep(spacing_s)
    finally:
        consumer.join(timeout_s + 1.0)
    if errors:
        raise errors[0]
    return _latency_result("threads", enq_start, enq_end, started, samples)


async def _latency_asyncio(
    dsn: str, schema: str, samples: int, spacing_s: float, timeout_s: float
) -> LatencyResult:
    enq_start: dict[uuid.UUID, float] = {}
    enq_end: dict[uuid.UUID, float] = {}
    started: dict[uuid.UUID, float] = {}

    async def consume(conn: psycopg.AsyncConnection) -> None:
        cur = conn.cursor()
        while len(started) < samples:
            woken = False
            async for _ in conn.notifies(timeout=timeout_s, stop_after=1):
                woken = True
            if not woken:
                raise TimeoutError("no notification within timeout")
            while True:
                await cur.execute(CLAIM_ONE, prepare=True)
                row = await cur.fetchone()
                if row is None:
                    break
                started[row[0]] = time.perf_counter()

    listener = await aconnect(dsn, schema)
    producer = await aconnect(dsn, schema)
    try:
        await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
        task = asyncio.create_task(consume(listener))
        cur = producer.cursor()
        for _ in range(samples):
            if task.done():
                break
            job_id = uuid.uuid4()
            t0 = time.perf_counter()
            async with producer.pipeline(), producer.transaction():
                await cur.execute(INSERT_NOTIFY, (job_id, "noop", Jsonb({})), prepare=True)
                await cur.execute(sql.SQL("NOTIFY {}").format(sql.Identifier(CHANNEL)))
            enq_end[job_id] = time.perf_counter()
            enq_start[job_id] = t0
            await asyncio.sleep(spacing_s)
        await asyncio.wait_for(task, timeout_s + 1.0)
    finally:
        await listener.close()
        await producer.close()
    return _latency_result("asyncio", enq_start, enq_end, started, samples)


def latency(
    dsn: str,
    schema: str,
    samples: int,
    *,
    spacing_ms: float = 3.0,
    mode: Mode = "threads",
    timeout_s: float = 5.0,
) -> LatencyResult:
    """Enqueue-to-start latency (p50/p99 ms) of an idle LISTEN/NOTIFY consumer.

    One listener connection waits in ``notifies()`` and, when woken, claims
    with :data:`CLAIM_ONE` until the queue is empty.  A producer connection
    enqueues one job at a time (INSERT + NOTIFY in one transaction) and sleeps
    ``spacing_ms`` between jobs so the consumer is idle when each arrives.
    """
    if samples < 1:
        raise ValueError("samples must be >= 1")
    with private_schema(dsn, schema):
        if mode == "threads":
            return _latency_threads(dsn, schema, samples, spacing_ms / 1000, timeout_s)
        if mode == "asyncio":
            return asyncio.run(_latency_asyncio(dsn, schema, samples, spacing_ms / 1000, timeout_s))
        raise ValueError(f"unknown mode {mode!r}")


# --------------------------------------------------------------------------
# bulk insert


def _timed(conn: psycopg.Connection, fn: Callable[[psycopg.Cursor], None]) -> float:
    conn.execute("TRUNCATE axa_queue")
    with conn.cursor() as cur:
        t0 = time.perf_counter()
        with conn.transaction():
            fn(cur)
        return time.perf_counter() - t0


def bulk_insert(dsn: str, schema: str, jobs: int = 10_000) -> BulkInsertResult:
    """Bulk-enqueue ``jobs`` jobs four ways; jobs/s for each.

    Timing covers adaptation of ready-made Python tuples (uuid, str, dict)
    plus the transaction; building those tuples is not timed.
    """
    rows = _job_rows(jobs)
    if jobs * 3 > _PG_MAX_PARAMS:
        raise ValueError(f"one multi-row INSERT takes at most {_PG_MAX_PARAMS // 3} jobs")

    def values(cur: psycopg.Cursor) -> None:
        query = sql.SQL("INSERT INTO axa_queue (id, name, args) VALUES {}").format(
            sql.SQL(",").join([sql.SQL("(%s,%s,%s)")] * len(rows))
        )
        params: list[object] = []
        for job_id, name, args in rows:
            params += (job_id, name, Jsonb(args))
        cur.execute(query, params)

    def executemany(cur: psycopg.Cursor) -> None:
        # psycopg 3.1+ runs executemany in pipeline mode (libpq >= 14)
        cur.executemany(INSERT_NOTIFY, [(i, n, Jsonb(a)) for i, n, a in rows])

    def unnest(cur: psycopg.Cursor) -> None:
        cur.execute(
            "INSERT INTO axa_queue (id, name, args)"
            " SELECT * FROM unnest(%s::uuid[], %s::text[], %s::jsonb[])",
            (
                [r[0] for r in rows],
                [r[1] for r in rows],
                [Jsonb(r[2]) for r in rows],
            ),
        )

    def copy(cur: psycopg.Cursor) -> None:
        with cur.copy("COPY axa_queue (id, name, args) FROM STDIN") as cp:
            for job_id, name, args in rows:
                cp.write_row((job_id, name, Jsonb(args)))

    with private_schema(dsn, schema), connect(dsn, schema) as conn:
        times = {
            "values": _timed(conn, values),
            "executemany": _timed(conn, executemany),
            "unnest": _timed(conn, unnest),
            "copy": _timed(conn, copy),
        }
        count = conn.execute("SELECT count(*) FROM axa_queue").fetchone()
        if count is None or count[0] != jobs:
            raise AssertionError(f"bulk insert left {count} rows, expected {jobs}")
    return BulkInsertResult(
        jobs=jobs,
        values_jobs_per_s=jobs / times["values"],
        executemany_jobs_per_s=jobs / times["executemany"],
        unnest_jobs_per_s=jobs / times["unnest"],
        copy_jobs_per_s=jobs / times["copy"],
    )


# --------------------------------------------------------------------------
# repetition and the command line

_counter = 0


def fresh_schema(prefix: str = "bench_floor") -> str:
    """A schema name unique to this process and call."""
    global _counter
    _counter += 1
    return f"{prefix}_{os.getpid()}_{_counter}"


def median_run(runs: Sequence[T], key: Callable[[T], float]) -> T:
    """Return the run whose ``key`` is the median (the lower one for even counts)."""
    if not runs:
        raise ValueError("no runs")
    ordered = sorted(runs, key=key)
    return ordered[(len(ordered) - 1) // 2]


def _jobs_per_s(result: DrainResult) -> float:
    return result.jobs_per_s


def _median_latency(runs: list[LatencyResult]) -> LatencyResult:
    return LatencyResult(
        mode=runs[0].mode,
        samples=runs[0].samples,
        p50_ms=statistics.median(r.p50_ms for r in runs),
        p99_ms=statistics.median(r.p99_ms for r in runs),
        max_ms=statistics.median(r.max_ms for r in runs),
        enqueue_p50_ms=statistics.median(r.enqueue_p50_ms for r in runs),
    )


def _median_bulk(runs: list[BulkInsertResult]) -> BulkInsertResult:
    return BulkInsertResult(
        jobs=runs[0].jobs,
        values_jobs_per_s=statistics.median(r.values_jobs_per_s for r in runs),
        executemany_jobs_per_s=statistics.median(r.executemany_jobs_per_s for r in runs),
        unnest_jobs_per_s=statistics.median(r.unnest_jobs_per_s for r in runs),
        copy_jobs_per_s=statistics.median(r.copy_jobs_per_s for r in runs),
    )


def run_suite(
    dsn: str,
    *,
    jobs: int = 10_000,
    connections: Sequence[int] = (1, 2, 4),
    batch: int = 100,
    samples: int = 300,
    bulk_jobs: int = 10_000,
    repeats: int = 3,
    modes: Sequence[Mode] = ("threads",),
) -> SuiteResult:
    """Run every floor benchmark ``repeats`` times; return the medians."""
    out = SuiteResult()
    for mode in modes:
        for n in connections:
            runs = [
                drain_one_at_a_time(dsn, fresh_schema(), jobs, n, mode=mode) for _ in range(repeats)
            ]
            out.drains.append(median_run(runs, key=_jobs_per_s))
        for n in connections:
            runs = [
                drain_batched(dsn, fresh_schema(), jobs, n, batch, mode=mode)
                for _ in range(repeats)
            ]
            out.drains.append(median_run(runs, key=_jobs_per_s))
        out.latencies.append(
            _median_latency(
                [latency(dsn, fresh_schema(), samples, mode=mode) for _ in range(repeats)]
            )
        )
    out.bulk.append(
        _median_bulk([bulk_insert(dsn, fresh_schema(), bulk_jobs) for _ in range(repeats)])
    )
    return out


def format_suite(result: SuiteResult, repeats: int) -> str:
    """Render a :class:`SuiteResult` as a plain-text table."""
    lines = [f"axa-queue raw-SQL floor (median of {repeats})", ""]
    lines.append(f"{'benchmark':<28}{'mode':<9}{'conns':>6}{'batch':>6}{'jobs':>8}{'jobs/s':>10}")
    for d in result.drains:
        lines.append(
            f"{'drain ' + d.kind:<28}{d.mode:<9}{d.connections:>6}{d.batch:>6}"
            f"{d.jobs:>8}{d.jobs_per_s:>10.0f}"
        )
    lines.append("")
    lines.append(
        f"{'latency (LISTEN/NOTIFY)':<28}{'mode':<9}{'samples':>8}"
        f"{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'enq p50':>9}"
    )
    for la in result.latencies:
        lines.append(
            f"{'enqueue -> claimed':<28}{la.mode:<9}{la.samples:>8}"
            f"{la.p50_ms:>9.3f}{la.p99_ms:>9.3f}{la.max_ms:>9.3f}{la.enqueue_p50_ms:>9.3f}"
        )
    lines.append("")
    lines.append(f"{'bulk insert':<44}{'jobs':>8}{'jobs/s':>10}")
    for b in result.bulk:
        for label, value in (
            ("multi-row INSERT ... VALUES (1 statement)", b.values_jobs_per_s),
            ("executemany (pipeline mode)", b.executemany_jobs_per_s),
            ("INSERT ... SELECT unnest(arrays)", b.unnest_jobs_per_s),
            ("COPY FROM STDIN", b.copy_jobs_per_s),
        ):
            lines.append(f"{label:<44}{b.jobs:>8}{value:>10.0f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: run the suite and print a table of medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/test")
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs per drain")
    parser.add_argument(
        "--connections",
        default="1,2,4",
        help="comma-separated worker connection counts for the drains",
    )
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--samples", type=int, default=300, help="latency samples")
    parser.add_argument("--bulk-jobs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--mode",
        default="threads",
        help="comma-separated: threads, asyncio",
    )
    args = parser.parse_args(argv)
    modes: list[Mode] = []
    for m in args.mode.split(","):
        if m == "threads" or m == "asyncio":
            modes.append(m)
        else:
            parser.error(f"unknown mode {m!r}")
    t0 = time.perf_counter()
    result = run_suite(
        args.dsn,
        jobs=args.jobs,
        connections=[int(c) for c in args.connections.split(",")],
        batch=args.batch,
        samples=args.samples,
        bulk_jobs=args.bulk_jobs,
        repeats=args.repeats,
        modes=modes,
    )
    print(format_suite(result, args.repeats))
    print(f"\n(total {time.perf_counter() - t0:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
