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
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

Mode = Literal["threads", "asyncio"]
Completion = Literal["fused", "transaction", "pipeline", "handler"]
"""How a worker finishes a claimed job (or batch):

* ``fused``: one autocommit statement ``WITH done AS (INSERT INTO bench_done ...)
  UPDATE axa_queue SET status = 'completed' ...`` -- 1 round trip (the floor).
* ``transaction``: ``BEGIN; INSERT ...; UPDATE ...; COMMIT`` as four round
  trips, i.e. a job body that runs its own statement and a separate
  completion statement in the same transaction.
* ``pipeline``: the same four statements in psycopg pipeline mode.
* ``handler``: what a queue does: each job's body runs its own autocommit
  ``INSERT`` (one statement and one commit per job, as a handler would), then one
  autocommit ``UPDATE`` marks the job (or the whole batch) completed.  Not atomic
  (a crash in between would run a job twice), like a queue's at-least-once.
"""
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
CREATE TABLE IF NOT EXISTS bench_done (job_id UUID PRIMARY KEY);
"""
# bench_done has a primary key, as the side table of bench/run.py's axa-queue
# workloads does, so both sides pay the same per-job write.  A job run twice then
# fails with a unique violation (raised from the drain); verify_exactly_once()
# catches the rest (jobs never run, never completed, or claimed twice).

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
_CLAIM_BATCH = """
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
RETURNING {returning}
"""
CLAIM_BATCH = _CLAIM_BATCH.format(returning="id")
CLAIM_BATCH_ARGS = _CLAIM_BATCH.format(returning="id, args")
"""CLAIM_BATCH returning each job's arguments too, as a worker that runs its jobs reads
them (bench/soak.py's floor workers find the enqueue time there)."""

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

# Finishing a job = its no-op body (one bench_done row) + marking it completed.
# "two statements" form, used by completion="transaction" / "pipeline":
DONE_ONE = "INSERT INTO bench_done (job_id) VALUES (%(id)s)"
COMPLETE_ONE = "UPDATE axa_queue SET status = 'completed', updated_at = now() WHERE id = %(id)s"
DONE_MANY = "INSERT INTO bench_done (job_id) SELECT unnest(%(ids)s::uuid[])"
COMPLETE_MANY = (
    "UPDATE axa_queue SET status = 'completed', updated_at = now() WHERE id = ANY(%(ids)s::uuid[])"
)
# single-statement form, used by completion="fused" (1 round trip, 1 commit):
FINISH_ONE = f"WITH done AS ({DONE_ONE}) {COMPLETE_ONE}"
FINISH_MANY = f"WITH done AS ({DONE_MANY}) {COMPLETE_MANY}"
INSERT_NOTIFY = "INSERT INTO axa_queue (id, name, args) VALUES (%s, %s, %s)"
INSERT_UNNEST = (
    "INSERT INTO axa_queue (id, name, args)"
    " SELECT * FROM unnest(%s::uuid[], %s::text[], %s::jsonb[])"
)
"""Many jobs in one statement: the ids, names and arguments as three arrays."""


def channel(schema: str) -> str:
    """The NOTIFY channel used by :func:`latency` for ``schema``.

    Channels are database-wide, not per schema: a fixed name such as
    ``axa_queue`` would cross-talk with any other run or test suite using
    the same database, so the channel is derived from the private schema.
    """
    return f"axa_queue_{schema}"


_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_PG_MAX_PARAMS = 65535


class ExactlyOnceError(AssertionError):
    """A drain did not run every enqueued job exactly once."""


@dataclass(frozen=True)
class DrainResult:
    """One drain measurement."""

    kind: str
    mode: str
    completion: str
    jobs: int
    connections: int
    batch: int
    seconds: float
    busy_seconds: float | None = None
    """CPU time the whole machine spent (every process) during the timed drain, from
    /proc/stat; None where there is none."""

    @property
    def jobs_per_s(self) -> float:
        """Throughput of the timed drain."""
        return self.jobs / self.seconds

    @property
    def cpu_us_per_job(self) -> float | None:
        """Machine-wide CPU microseconds per job during the timed drain."""
        return None if self.busy_seconds is None else self.busy_seconds / self.jobs * 1e6


@dataclass(frozen=True)
class LatencyResult:
    """Enqueue-to-start latency of an idle LISTEN/NOTIFY consumer.

    Latency is measured from the moment the producer starts its enqueue
    transaction (INSERT + NOTIFY + COMMIT, sent in psycopg pipeline mode) to the
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
def private_schema(dsn: str, schema: str, ddl: str | Sequence[str] = TABLE_DDL) -> Iterator[str]:
    """Create ``schema`` with the bench tables; drop it (CASCADE) on exit.

    ``ddl`` makes the tables (default :data:`TABLE_DDL`); a sequence of statements
    runs in one transaction.  Fails if the schema already exists, so it never drops
    someone else's.
    """
    _check_schema(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        with connect(dsn, schema) as conn, conn.transaction():
            for statement in [ddl] if isinstance(ddl, str) else ddl:
                conn.execute(statement)
        yield schema
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def machine_busy_seconds() -> float | None:
    """CPU seconds the machine has spent busy (all CPUs, all processes) since boot,
    from the first line of /proc/stat; None where there is no /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal (guest time is inside user)
    busy = sum(fields[:8]) - fields[3] - fields[4]
    return busy / os.sysconf("SC_CLK_TCK")


def _busy_since(before: float | None) -> float | None:
    after = machine_busy_seconds()
    return None if before is None or after is None else after - before


CHECKPOINTS: ContextVar[bool] = ContextVar(
    "checkpoints", default=os.environ.get("AXA_BENCH_CHECKPOINTS", "1") != "0"
)
"""Whether `checkpoint` runs CHECKPOINT: a smoke run of the benchmark (tests/test_bench.py)
sets it off, as its figures measure nothing and a CHECKPOINT flushes the whole server,
which every other session then waits on. `AXA_BENCH_CHECKPOINTS=0` turns it off in a
process and in the processes it starts (`against.py`'s cases): the tests set it."""


def checkpoint(conn: psycopg.Connection) -> bool:
    """Run CHECKPOINT if allowed (superuser or pg_checkpoint) and `CHECKPOINTS` is on;
    return whether it ran.

    Done before each timed run so that a checkpoint requested by earlier runs'
    WAL (max_wal_size) does not land in the middle of the measurement.
    """
    if not CHECKPOINTS.get():
        return False
    try:
        conn.execute("CHECKPOINT")
    except psycopg.errors.InsufficientPrivilege:
        return False
    return True


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


def _finish_statements(single: bool, completion: Completion) -> list[str]:
    if completion == "fused":
        return [FINISH_ONE if single else FINISH_MANY]
    if completion in ("transaction", "pipeline"):
        return [DONE_ONE, COMPLETE_ONE] if single else [DONE_MANY, COMPLETE_MANY]
    if completion == "handler":
        return [DONE_ONE, COMPLETE_ONE if single else COMPLETE_MANY]
    raise ValueError(f"unknown completion {completion!r}")


def _finish_params(ids: list[uuid.UUID], single: bool) -> dict[str, object]:
    return {"id": ids[0]} if single else {"ids": ids}


def _sync_worker(
    conn: psycopg.Connection,
    start: threading.Barrier,
    claim_sql: str,
    batch: int,
    completion: Completion,
) -> int:
    single = batch == 1
    claim_params = {} if single else {"batch": batch}
    stmts = _finish_statements(single, completion)
    n = 0
    cur = conn.cursor()
    start.wait()
    while True:
        ids = [r[0] for r in cur.execute(claim_sql, claim_params, prepare=True).fetchall()]
        if not ids:
            return n
        params = _finish_params(ids, single)
        if completion == "fused":
            cur.execute(stmts[0], params, prepare=True)
        elif completion == "handler":
            for job_id in ids:
                cur.execute(stmts[0], {"id": job_id}, prepare=True)
            cur.execute(stmts[1], params, prepare=True)
        elif completion == "transaction":
            with conn.transaction():
                for stmt in stmts:
                    cur.execute(stmt, params, prepare=True)
        else:
            with conn.pipeline(), conn.transaction():
                for stmt in stmts:
                    cur.execute(stmt, params, prepare=True)
        n += len(ids)


async def _async_worker(
    conn: psycopg.AsyncConnection,
    start: asyncio.Event,
    claim_sql: str,
    batch: int,
    completion: Completion,
) -> int:
    single = batch == 1
    claim_params = {} if single else {"batch": batch}
    stmts = _finish_statements(single, completion)
    n = 0
    cur = conn.cursor()
    await start.wait()
    while True:
        await cur.execute(claim_sql, claim_params, prepare=True)
        ids = [r[0] for r in await cur.fetchall()]
        if not ids:
            return n
        params = _finish_params(ids, single)
        if completion == "fused":
            await cur.execute(stmts[0], params, prepare=True)
        elif completion == "handler":
            for job_id in ids:
                await cur.execute(stmts[0], {"id": job_id}, prepare=True)
            await cur.execute(stmts[1], params, prepare=True)
        elif completion == "transaction":
            async with conn.transaction():
                for stmt in stmts:
                    await cur.execute(stmt, params, prepare=True)
        else:
            async with conn.pipeline(), conn.transaction():
                for stmt in stmts:
                    await cur.execute(stmt, params, prepare=True)
        n += len(ids)


def _drain_threads(
    dsn: str,
    schema: str,
    connections: int,
    claim_sql: str,
    batch: int,
    completion: Completion,
) -> tuple[float, int, float | None]:
    conns = [connect(dsn, schema) for _ in range(connections)]
    try:
        start = threading.Barrier(connections + 1)
        counts = [0] * connections
        errors: list[BaseException] = []

        def run(i: int) -> None:
            try:
                counts[i] = _sync_worker(conns[i], start, claim_sql, batch, completion)
            except BaseException as ex:  # re-raised below
                errors.append(ex)
                start.abort()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(connections)]
        for t in threads:
            t.start()
        busy = machine_busy_seconds()
        with suppress(threading.BrokenBarrierError):  # a worker failed; raised below
            start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        busy = _busy_since(busy)
        if errors:
            raise errors[0]
        return elapsed, sum(counts), busy
    finally:
        for c in conns:
            c.close()


async def _drain_asyncio(
    dsn: str,
    schema: str,
    connections: int,
    claim_sql: str,
    batch: int,
    completion: Completion,
) -> tuple[float, int, float | None]:
    conns = [await aconnect(dsn, schema) for _ in range(connections)]
    try:
        start = asyncio.Event()
        tasks = [
            asyncio.create_task(_async_worker(c, start, claim_sql, batch, completion))
            for c in conns
        ]
        await asyncio.sleep(0)  # let every task reach start.wait()
        busy = machine_busy_seconds()
        t0 = time.perf_counter()
        start.set()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        elapsed = time.perf_counter() - t0
        busy = _busy_since(busy)
        counts: list[int] = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
            counts.append(outcome)
        return elapsed, sum(counts), busy
    finally:
        for c in conns:
            await c.close()


def _drain(
    kind: str,
    dsn: str,
    schema: str,
    jobs: int,
    connections: int,
    *,
    claim_sql: str,
    batch: int,
    mode: Mode,
    completion: Completion,
    analyze: bool,
    pre_checkpoint: bool,
    ddl: str | Sequence[str],
) -> DrainResult:
    if connections < 1 or jobs < 1 or batch < 1:
        raise ValueError("jobs, connections and batch must be >= 1")
    _finish_statements(batch == 1, completion)  # validate before creating anything
    if mode not in ("threads", "asyncio"):
        raise ValueError(f"unknown mode {mode!r}")
    with private_schema(dsn, schema, ddl):
        with connect(dsn, schema) as conn:
            if pre_checkpoint:
                checkpoint(conn)
            enqueue(conn, jobs, analyze=analyze)
        if mode == "threads":
            elapsed, ran, busy = _drain_threads(
                dsn, schema, connections, claim_sql, batch, completion
            )
        else:
            elapsed, ran, busy = asyncio.run(
                _drain_asyncio(dsn, schema, connections, claim_sql, batch, completion)
            )
        with connect(dsn, schema) as conn:
            verify_exactly_once(conn, jobs)
        if ran != jobs:
            raise ExactlyOnceError(f"workers report {ran} jobs run, expected {jobs}")
    return DrainResult(kind, mode, completion, jobs, connections, batch, elapsed, busy)


def drain_one_at_a_time(
    dsn: str,
    schema: str,
    jobs: int,
    connections: int,
    *,
    mode: Mode = "threads",
    completion: Completion = "fused",
    analyze: bool = True,
    pre_checkpoint: bool = True,
    ddl: str | Sequence[str] = TABLE_DDL,
) -> DrainResult:
    """Drain ``jobs`` pre-enqueued jobs, claiming one per statement.

    Each of ``connections`` workers (threads or asyncio tasks, one connection
    each) loops: claim one job with :data:`CLAIM_ONE` (autocommit, 1 round
    trip), then atomically insert its ``bench_done`` row and mark it
    completed (see :data:`Completion`; default 1 round trip).  Stops when a
    claim returns nothing.  Enqueueing (COPY, then ANALYZE if ``analyze``,
    after a CHECKPOINT if ``pre_checkpoint``) is not timed; exactly-once is
    verified (raises :class:`ExactlyOnceError`).  ``ddl`` makes the tables (see
    :func:`private_schema`), e.g. to drain another table design.
    """
    return _drain(
        "one-at-a-time",
        dsn,
        schema,
        jobs,
        connections,
        claim_sql=CLAIM_ONE,
        batch=1,
        mode=mode,
        completion=completion,
        analyze=analyze,
        pre_checkpoint=pre_checkpoint,
        ddl=ddl,
    )


def drain_batched(
    dsn: str,
    schema: str,
    jobs: int,
    connections: int,
    batch: int = 100,
    *,
    mode: Mode = "threads",
    completion: Completion = "fused",
    claim_sql: str = CLAIM_BATCH,
    analyze: bool = True,
    pre_checkpoint: bool = True,
    ddl: str | Sequence[str] = TABLE_DDL,
) -> DrainResult:
    """Drain ``jobs`` pre-enqueued jobs, claiming up to ``batch`` per statement.

    The claim uses a MATERIALIZED CTE ``SELECT ... LIMIT ... FOR UPDATE SKIP
    LOCKED`` (:data:`CLAIM_BATCH`; pass ``claim_sql=CLAIM_BATCH_JOIN`` for the
    plan-sensitive join form).  The batch's ``bench_done`` rows are inserted
    with one statement and the jobs completed with one statement, atomically
    (see :data:`Completion`).  Enqueueing is not timed (as in
    :func:`drain_one_at_a_time`); exactly-once is verified (raises
    :class:`ExactlyOnceError`).
    """
    if batch < 2:
        raise ValueError("batch must be >= 2; use drain_one_at_a_time for 1")
    return _drain(
        "batched",
        dsn,
        schema,
        jobs,
        connections,
        claim_sql=claim_sql,
        batch=batch,
        mode=mode,
        completion=completion,
        analyze=analyze,
        pre_checkpoint=pre_checkpoint,
        ddl=ddl,
    )


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
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(schema))))
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
                    cur.execute(sql.SQL("NOTIFY {}").format(sql.Identifier(channel(schema))))
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
        await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(schema))))
        task = asyncio.create_task(consume(listener))
        cur = producer.cursor()
        for _ in range(samples):
            if task.done():
                break
            job_id = uuid.uuid4()
            t0 = time.perf_counter()
            async with producer.pipeline(), producer.transaction():
                await cur.execute(INSERT_NOTIFY, (job_id, "noop", Jsonb({})), prepare=True)
                await cur.execute(sql.SQL("NOTIFY {}").format(sql.Identifier(channel(schema))))
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


def bulk_insert(
    dsn: str, schema: str, jobs: int = 10_000, *, pre_checkpoint: bool = True
) -> BulkInsertResult:
    """Bulk-enqueue ``jobs`` jobs four ways into an empty table; jobs/s for each.

    Timing covers adaptation of ready-made Python tuples (uuid, str, dict)
    plus the transaction (commit included); building those tuples is not
    timed.  The table is truncated (untimed) before each method.
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
            INSERT_UNNEST,
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
        if pre_checkpoint:
            checkpoint(conn)
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


def _one_case(
    dsn: str, jobs: int, n: int, mode: Mode, completion: Completion
) -> Callable[[], DrainResult]:
    def run() -> DrainResult:
        return drain_one_at_a_time(dsn, fresh_schema(), jobs, n, mode=mode, completion=completion)

    return run


def _batched_case(
    dsn: str, jobs: int, n: int, batch: int, mode: Mode, completion: Completion
) -> Callable[[], DrainResult]:
    def run() -> DrainResult:
        return drain_batched(dsn, fresh_schema(), jobs, n, batch, mode=mode, completion=completion)

    return run


def run_suite(
    dsn: str,
    *,
    jobs: int = 5_000,
    batched_jobs: int = 50_000,
    connections: Sequence[int] = (1, 2, 4, 8),
    batch: int = 100,
    samples: int = 300,
    spacing_ms: float = 3.0,
    bulk_jobs: int = 10_000,
    repeats: int = 3,
    modes: Sequence[Mode] = ("threads", "asyncio"),
    completions: Sequence[Completion] = ("fused",),
    progress: Callable[[str], None] | None = None,
) -> SuiteResult:
    """Run every floor benchmark ``repeats`` times; return the median runs.

    Repeats are interleaved (round 1 of every case, then round 2, ...) so a
    transient disturbance on the machine spreads over cases instead of
    spoiling one.  ``jobs`` is the queue size for the one-at-a-time drains,
    ``batched_jobs`` for the batched drains (so that a run lasts ~1 s).
    """
    say = progress or (lambda _msg: None)
    drain_cases: list[tuple[str, Callable[[], DrainResult]]] = []
    for mode in modes:
        for completion in completions:
            for n in connections:
                drain_cases.append(
                    (
                        f"one-at-a-time {mode} {completion} x{n}",
                        _one_case(dsn, jobs, n, mode, completion),
                    )
                )
            for n in connections:
                drain_cases.append(
                    (
                        f"batched {mode} {completion} x{n}",
                        _batched_case(dsn, batched_jobs, n, batch, mode, completion),
                    )
                )
    drain_runs: list[list[DrainResult]] = [[] for _ in drain_cases]
    latency_runs: list[list[LatencyResult]] = [[] for _ in modes]
    bulk_runs: list[BulkInsertResult] = []
    for rnd in range(1, repeats + 1):
        for (label, case), runs in zip(drain_cases, drain_runs, strict=True):
            say(f"round {rnd}/{repeats}: drain {label}")
            runs.append(case())
        for mode, lat_runs in zip(modes, latency_runs, strict=True):
            say(f"round {rnd}/{repeats}: latency {mode}")
            lat_runs.append(latency(dsn, fresh_schema(), samples, spacing_ms=spacing_ms, mode=mode))
        say(f"round {rnd}/{repeats}: bulk insert")
        bulk_runs.append(bulk_insert(dsn, fresh_schema(), bulk_jobs))
    return SuiteResult(
        drains=[median_run(runs, key=_jobs_per_s) for runs in drain_runs],
        latencies=[_median_latency(runs) for runs in latency_runs],
        bulk=[_median_bulk(bulk_runs)],
    )


def format_suite(result: SuiteResult, repeats: int) -> str:
    """Render a :class:`SuiteResult` as a plain-text table."""
    lines = [f"axa-queue raw-SQL floor (median of {repeats} runs each)", ""]
    lines.append(
        f"{'drain':<15}{'mode':<9}{'completion':<12}{'conns':>6}{'batch':>6}{'jobs':>8}"
        f"{'jobs/s':>10}"
    )
    for d in result.drains:
        lines.append(
            f"{d.kind:<15}{d.mode:<9}{d.completion:<12}{d.connections:>6}{d.batch:>6}"
            f"{d.jobs:>8}{d.jobs_per_s:>10.0f}"
        )
    lines.append("")
    lines.append(
        f"{'latency enqueue->claimed':<26}{'mode':<9}{'samples':>8}"
        f"{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'enq p50':>9}"
    )
    for la in result.latencies:
        lines.append(
            f"{'LISTEN/NOTIFY, idle':<26}{la.mode:<9}{la.samples:>8}"
            f"{la.p50_ms:>9.3f}{la.p99_ms:>9.3f}{la.max_ms:>9.3f}{la.enqueue_p50_ms:>9.3f}"
        )
    lines.append("")
    lines.append(f"{'bulk insert (1 transaction)':<44}{'jobs':>8}{'jobs/s':>10}")
    for b in result.bulk:
        for label, value in (
            ("multi-row INSERT ... VALUES (1 statement)", b.values_jobs_per_s),
            ("executemany (pipeline mode)", b.executemany_jobs_per_s),
            ("INSERT ... SELECT FROM unnest(arrays)", b.unnest_jobs_per_s),
            ("COPY FROM STDIN", b.copy_jobs_per_s),
        ):
            lines.append(f"{label:<44}{b.jobs:>8}{value:>10.0f}")
    return "\n".join(lines)


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: run the suite and print a table of medians."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/test")
    parser.add_argument("--jobs", type=int, default=5_000, help="jobs per one-at-a-time drain")
    parser.add_argument("--batched-jobs", type=int, default=50_000, help="jobs per batched drain")
    parser.add_argument("--connections", default="1,2,4,8", help="comma-separated, e.g. 1,2,4,8")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--samples", type=int, default=300, help="latency samples per run")
    parser.add_argument("--spacing-ms", type=float, default=3.0, help="gap between samples")
    parser.add_argument("--bulk-jobs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mode", default="threads,asyncio", help="comma-separated")
    parser.add_argument(
        "--completion",
        default="fused",
        help="comma-separated: fused, transaction, pipeline, handler",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)
    mode_names: dict[str, Mode] = {"threads": "threads", "asyncio": "asyncio"}
    completion_names: dict[str, Completion] = {
        "fused": "fused",
        "transaction": "transaction",
        "pipeline": "pipeline",
        "handler": "handler",
    }
    for name in _csv(args.mode):
        if name not in mode_names:
            parser.error(f"unknown mode {name!r}")
    for name in _csv(args.completion):
        if name not in completion_names:
            parser.error(f"unknown completion {name!r}")
    modes = [mode_names[name] for name in _csv(args.mode)]
    completions = [completion_names[name] for name in _csv(args.completion)]

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    load_before = os.getloadavg()[0]
    result = run_suite(
        args.dsn,
        jobs=args.jobs,
        batched_jobs=args.batched_jobs,
        connections=[int(c) for c in _csv(args.connections)],
        batch=args.batch,
        samples=args.samples,
        spacing_ms=args.spacing_ms,
        bulk_jobs=args.bulk_jobs,
        repeats=args.repeats,
        modes=modes,
        completions=completions,
        progress=progress,
    )
    print(format_suite(result, args.repeats))
    print(
        f"\n(total {time.perf_counter() - t0:.1f}s on {os.cpu_count()} CPUs; 1-min load average"
        f" {load_before:.2f} before, {os.getloadavg()[0]:.2f} after -- anything well above"
        " the suite's own load means a noisy run)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
