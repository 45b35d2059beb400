"""Side-by-side benchmark: axa-queue against a raw-SQL floor, in one run.

    python bench/run.py --dsn postgresql://root@127.0.0.1:5432/test          # ~5 minutes
    python bench/run.py --dsn postgresql://root@127.0.0.1:5432/test --quick  # ~1 minute

Every workload runs against axa-queue (through its public API: `Queue`, `QueueOptions`,
`NewJob`, `enqueue_all`, `run(stop)`) and against hand-written SQL (`bench/floor.py`),
repeated in interleaved rounds (round 1 of every case, then round 2, ...), and the
table shows medians and ratios:

- **enqueue**: sequential single `enqueue` calls (and a libpq protocol trace proving
  each is one statement in one round trip) against a raw single-row INSERT;
  `enqueue_all` of 10,000 jobs against one multi-row `INSERT ... VALUES`, `COPY` and
  `INSERT ... SELECT FROM unnest(...)`, all into the same (axa-queue's) table.
- **integrations**: `enqueue_on` one by one and `enqueue_all_on` of 100 on each kind
  of connection accepted (Django's, SQLAlchemy's sync and async on psycopg and on
  asyncpg, asyncpg's; `bench/integrations.py`) against psycopg's own connection.
- **drain**: pre-queued no-op jobs run by axa-queue with 1, 10 and 50 loops in one
  process and with 2 processes x 10 loops, against the floor's (a) claim-one, (b)
  claim-a-batch-of-100-with-one-statement-per-job and (fused) claim-a-batch-and-finish-
  it-in-one-statement drains on 10 connections. Every job writes one row to
  `bench_done(job_id uuid primary key)`; after every drain each job must have run
  exactly once and completed on its first attempt, else `ExactlyOnceError` is raised.
- **latency**: enqueue -> handler start (axa-queue, idle worker with 10 loops) against
  enqueue -> claimed (raw LISTEN/NOTIFY consumer), p50 and p99. The producer is a
  separate process enqueuing one job every few ms; both clocks are CLOCK_MONOTONIC.
- **big table**: with 1,000,000 finished and 100,000 delayed rows present, the database
  time of axa-queue's claim statement (`axa_queue.sql.EXCHANGE` as a generic prepared
  plan, with the library's session settings) when jobs are ready and when none is,
  and the crate's one-row claim for comparison.

Each measurement works in a schema of its own (`options=-c search_path=<schema>`),
dropped afterwards. Jobs are queued untimed, then ANALYZE and CHECKPOINT run before the
timed part (autovacuum may be off). Making and dropping those schemas leaves dead rows in
the system catalogs, which with autovacuum off slow everything that follows, so the
catalogs are VACUUMed before each round (untimed; `--no-vacuum-catalogs` to skip).

Other work on the machine spoils figures: the load average is printed before and
after; between cases (when this benchmark is idle) the machine's CPU use and the
sessions of others on the server are sampled, and a run that saw either is marked
BUSY: run it again (`--wait-idle` first waits for a quiet machine).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.util
import json
import multiprocessing
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any, Literal

import psycopg
from psycopg import pq
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

from axa_queue import SETUP_STATEMENTS, NewJob, Queue, QueueOptions, enqueue_on
from axa_queue import sql as axa_sql
from axa_queue.worker.decisions import AUTO_PREFETCH

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import floor  # noqa: E402  (bench/floor.py, beside this file)
import integrations  # noqa: E402  (bench/integrations.py, beside this file)
import peers  # noqa: E402  (bench/peers.py, beside this file)

DEFAULT_DSN = "postgresql://root@127.0.0.1:5432/test"
BUSY_LIMIT = 0.2
"""Checks between cases finding the machine busier than this (at least two, and 5% of
the checks: one may catch the server finishing our own last case) mark a run BUSY."""
DONE = "INSERT INTO bench_done (job_id) VALUES (%s)"
"""What every benchmark job does: one row in the side table, keyed by the job."""
BENCH_DONE = "CREATE TABLE bench_done (job_id UUID PRIMARY KEY)"

RATE_NOT_BINDING = 100
"""The rate limit of the bench case where it never binds: claims of the job a millisecond."""
BENCH_KEYS = 50
"""How many keys the jobs of the keyed drain (`Queue.limit_per_key`) are spread over."""
PER_KEY = 5
"""The per-key limit of the keyed drain: 50 keys x 5 places hold the loops and the jobs
claimed ahead (which count as running), so it binds only a key that gets ahead."""
KEY_INDEXES = ("axa_queue_keyed", "axa_queue_running_keys")
"""Migration 15's indexes, dropped for the drain that measures what a queue that uses no
keys pays for them (`drain_axa(..., without_key_indexes=True)`)."""
JOB = "noop"
ExactlyOnceError = floor.ExactlyOnceError
SPAWN = multiprocessing.get_context("spawn")
BulkMethod = Literal["axa", "unique", "values", "copy", "unnest", "unique_unnest"]
FloorDrain = Literal["one", "batch", "fused"]


# --- schemas and connections ---------------------------------------------------------------


def schema_dsn(dsn: str, schema: str) -> str:
    """`dsn` with its tables in `schema` (and `schema` as its application name)."""
    return make_conninfo(dsn, options=f"-c search_path={schema}", application_name=schema)


@contextlib.contextmanager
def scratch_schema(dsn: str, prefix: str = "bench_axa") -> Iterator[str]:
    """Make a fresh schema; yield a DSN whose tables live in it; drop it afterwards."""
    schema = floor.fresh_schema(prefix)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE SCHEMA {}").format(pgsql.Identifier(schema)))
    try:
        yield schema_dsn(dsn, schema)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s AND pid <> pg_backend_pid()",
                (schema,),
            )
            conn.execute(
                pgsql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pgsql.Identifier(schema))
            )


def setup_tables(dsn: str, *, done_table: bool = True) -> None:
    """axa-queue's tables (its own setup statements) and the side table."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():
            for statement in SETUP_STATEMENTS:
                conn.execute(statement)
        if done_table:
            conn.execute(BENCH_DONE)


def prepare_for_timing(dsn: str) -> None:
    """ANALYZE the jobs table and CHECKPOINT, so neither lands in a timed section."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE axa_queue")
        floor.checkpoint(conn)


def verify_axa(dsn: str, jobs: int) -> None:
    """Raise `ExactlyOnceError` unless each of `jobs` jobs ran once and completed.

    Each job's arguments carry a key `k` that its run writes to `bench_done`, whose
    primary key refuses a second write (the second run would fail). A job is in
    `axa_queue` or, once housekeeping moved it (a long run: `bench/soak.py`), in
    `axa_queue_history`: both are read."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            """WITH jobs AS MATERIALIZED (
                   SELECT args->>'k' AS k, status, attempts, error FROM axa_queue
                   UNION ALL
                   SELECT args->>'k', status, attempts, error FROM axa_queue_history
               )
               SELECT (SELECT count(*) FROM jobs),
                      (SELECT count(DISTINCT k) FROM jobs),
                      (SELECT count(*) FROM jobs WHERE status <> 'completed'),
                      (SELECT count(*) FROM jobs WHERE attempts <> 1),
                      (SELECT count(*) FROM bench_done),
                      (SELECT count(*) FROM bench_done d WHERE NOT EXISTS (
                          SELECT 1 FROM jobs q WHERE q.k::uuid = d.job_id)),
                      (SELECT min(error) FROM jobs WHERE error IS NOT NULL)"""
        ).fetchone()
    assert row is not None
    queued, keys, unfinished, retried, done, stray, error = row
    if (queued, keys, unfinished, retried, done, stray) != (jobs, jobs, 0, 0, jobs, 0):
        raise ExactlyOnceError(
            f"expected {jobs} jobs each run exactly once: the table has {queued} jobs "
            f"({keys} distinct keys), {unfinished} not completed, {retried} with "
            f"attempts <> 1; bench_done has {done} rows, {stray} not of a job"
            + (f"; an error: {error}" if error else "")
        )


def machine_busy(seconds: float = 0.25) -> float | None:
    """The fraction of all CPUs busy over the next `seconds` (between cases, when this
    benchmark itself is idle, that is everyone else's load); None without /proc/stat."""
    before = floor.machine_busy_seconds()
    time.sleep(seconds)
    busy = floor._busy_since(before)
    return None if busy is None else busy / seconds / (os.cpu_count() or 1)


def wait_until_idle(
    limit: float = 0.15, timeout: float = 600.0, say: Callable[[str], None] = print
) -> bool:
    """Wait (up to `timeout` s) until the machine has been under `limit` busy for three
    seconds running; False if it never was."""
    deadline = time.monotonic() + timeout
    calm = 0
    while time.monotonic() < deadline:
        busy = machine_busy(1.0)
        if busy is None:
            return True
        calm = calm + 1 if busy < limit else 0
        if calm >= 3:
            return True
        if calm == 0:
            say(f"waiting for the machine to be idle: {busy:.0%} busy")
    return False


CHURNED_CATALOGS = (
    "pg_attribute",
    "pg_class",
    "pg_depend",
    "pg_shdepend",
    "pg_type",
    "pg_index",
    "pg_constraint",
    "pg_trigger",
    "pg_proc",
    "pg_namespace",
    "pg_attrdef",
    "pg_statistic",
    "pg_description",
    "pg_rewrite",
)
"""System catalogs that making and dropping a schema per measurement fills with dead
rows (tens of thousands a run)."""


def vacuum_catalogs(dsn: str) -> bool:
    """VACUUM the catalogs this benchmark's schemas churn. With autovacuum off, their
    dead rows pile up run after run and slow every later connection, plan and DDL, so
    rounds would get slower as the run goes on. Needs a superuser (or the owner);
    returns whether it ran."""
    names = pgsql.SQL(", ").join(pgsql.Identifier("pg_catalog", name) for name in CHURNED_CATALOGS)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(pgsql.SQL("VACUUM {}").format(names))
    except psycopg.errors.InsufficientPrivilege:
        return False
    return True


def foreign_activity(dsn: str, ours: str | None = None) -> int:
    """Sessions of others busy on the server right now: every busy session but this
    one, and but those named `ours` (their application name), if given."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
            "AND pid <> pg_backend_pid() AND state IS DISTINCT FROM 'idle' "
            "AND application_name IS DISTINCT FROM %s",
            (ours,),
        ).fetchone()
    return int(row[0]) if row else 0


def was_busy(others: Sequence[float], foreign: Sequence[int]) -> bool:
    """Whether checks of the machine's CPU use by others (`others`, fractions) and of
    other sessions busy on the server (`foreign`) saw anything else working: any
    session, or the machine over `BUSY_LIMIT` at two checks and 5% of them."""
    hot = sum(1 for x in others if x > BUSY_LIMIT)
    return any(foreign) or hot >= max(2, len(others) // 20)


# --- the axa-queue side: a queue whose one job writes its row --------------------------------


def most_ahead() -> int:
    """The most jobs the default `prefetch` claims ahead of the loops."""
    prefetch = QueueOptions().prefetch
    return AUTO_PREFETCH if prefetch == "auto" else prefetch


def bench_queue(
    dsn: str,
    loops: int,
    started: dict[str, float] | None = None,
    prefetch: int | None = None,
    held: list[psycopg.AsyncCursor[Any]] | None = None,
    global_limit: int | None = None,
    rate_limit: int | None = None,
    per_key: int | None = None,
) -> Queue:
    """A queue with `loops` loops (and `prefetch` jobs claimed ahead) whose `noop` job
    writes its key to `bench_done` on one of the queue's own connections, as a handler
    would (`queue.pool.connection()`: inside a run, the connection lent to its loop); or, given `held` (a cursor per loop, each on its own connection), with a
    cursor it holds, as the floor's workers do. `started` gets each key's start time.
    `global_limit` limits the job across processes (`scope="global"`); `rate_limit`
    limits its claims to that many a millisecond (`Queue.rate_limit`); `per_key` limits
    each key's jobs running at once (`Queue.limit_per_key`), claimed by key. `prefetch`
    None is the default (`QueueOptions.prefetch`)."""
    options = QueueOptions(workers=loops)
    queue = Queue(
        dsn, options if prefetch is None else dataclasses.replace(options, prefetch=prefetch)
    )
    if global_limit is not None:
        queue.limit(JOB, global_limit, scope="global")
    if rate_limit is not None:
        queue.rate_limit(JOB, rate_limit, per=timedelta(milliseconds=1))
    if per_key is not None:
        queue.limit_per_key(JOB, per_key)

    @queue.handler(JOB)
    async def noop(args: dict[str, Any]) -> None:
        if started is not None:
            started[args["k"]] = time.monotonic()
        if held is None:
            async with queue.pool.connection() as conn:
                await conn.execute(DONE, (args["k"],))
            return
        cursor = held.pop()
        try:
            await cursor.execute(DONE, (args["k"],), prepare=True)
        finally:
            held.append(cursor)

    return queue


def new_jobs(count: int, keys: int | None = None) -> list[NewJob]:
    """`count` benchmark jobs, each with a fresh key in its arguments; with `keys`, each
    with a `NewJob.key` too, in turn among that many."""
    if keys is None:
        return [NewJob(JOB, {"k": str(uuid.uuid4())}) for _ in range(count)]
    return [NewJob(JOB, {"k": str(uuid.uuid4())}, key=f"tenant-{n % keys}") for n in range(count)]


async def warm_pool(queue: Queue, timeout: float = 30.0) -> None:
    """Open every connection the queue's pool may have, as a long-running worker's
    pool has, so the timed part does not pay for connecting."""
    size = queue.options.connections
    held = 0
    full = asyncio.Event()

    async def hold() -> None:
        nonlocal held
        async with queue.pool.connection():
            held += 1
            if held >= size:
                full.set()
            await full.wait()

    await asyncio.wait_for(asyncio.gather(*(hold() for _ in range(size))), timeout)


async def queue_jobs(queue: Queue, jobs: int, chunk: int = 10_000, keys: int | None = None) -> None:
    """Queue `jobs` benchmark jobs with `enqueue_all` (untimed setup), with keys among
    `keys` when given."""
    for start in range(0, jobs, chunk):
        await queue.enqueue_all(new_jobs(min(chunk, jobs - start), keys))


# --- enqueue ---------------------------------------------------------------------------------


async def _enqueue_single_axa(dsn: str, jobs: int, warmup: int) -> float:
    async with Queue(dsn) as queue:
        for _ in range(warmup):
            await queue.enqueue(JOB, {"k": str(uuid.uuid4())})
        args = [{"k": str(uuid.uuid4())} for _ in range(jobs)]
        t0 = time.perf_counter()
        for one in args:
            await queue.enqueue(JOB, one)
        return jobs / (time.perf_counter() - t0)


async def _enqueue_single_unique(dsn: str, jobs: int, warmup: int) -> float:
    """`_enqueue_single_axa` with a unique key on every job (each its own, so each is
    queued): what the unique index and `ENQUEUE_UNIQUE` cost."""
    async with Queue(dsn) as queue:
        for _ in range(warmup):
            await queue.enqueue(JOB, {"k": str(uuid.uuid4())}, unique_key=str(uuid.uuid4()))
        args = [{"k": str(uuid.uuid4())} for _ in range(jobs)]
        keys = [f"key:{one['k']}" for one in args]
        t0 = time.perf_counter()
        for one, key in zip(args, keys, strict=True):
            await queue.enqueue(JOB, one, unique_key=key)
        return jobs / (time.perf_counter() - t0)


async def _enqueue_single_raw(dsn: str, jobs: int, warmup: int) -> float:
    query = "INSERT INTO axa_queue (id, name, args) VALUES (%s, %s, %s)"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = conn.cursor()
        for _ in range(warmup):
            await cur.execute(query, (uuid.uuid4(), JOB, Jsonb({"k": "w"})), prepare=True)
        args = [{"k": str(uuid.uuid4())} for _ in range(jobs)]
        t0 = time.perf_counter()
        for one in args:
            await cur.execute(query, (uuid.uuid4(), JOB, Jsonb(one)), prepare=True)
        return jobs / (time.perf_counter() - t0)


UNIQUE_FLOOR = """INSERT INTO axa_queue (id, name, args, unique_key) VALUES (%s, %s, %s, %s)
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL
        AND (status IN ('queued', 'running', 'needs_review') OR unique_for_ms IS NOT NULL)
    DO NOTHING RETURNING id"""
"""The floor of a keyed enqueue: the one-row INSERT ... ON CONFLICT DO NOTHING the unique
index needs, an index probe and an index entry more than the raw INSERT."""


async def _enqueue_single_unique_raw(dsn: str, jobs: int, warmup: int) -> float:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = conn.cursor()
        for _ in range(warmup):
            key = str(uuid.uuid4())
            await cur.execute(
                UNIQUE_FLOOR, (uuid.uuid4(), JOB, Jsonb({"k": "w"}), key), prepare=True
            )
            await cur.fetchall()
        args = [{"k": str(uuid.uuid4())} for _ in range(jobs)]
        keys = [f"key:{one['k']}" for one in args]
        t0 = time.perf_counter()
        for one, key in zip(args, keys, strict=True):
            await cur.execute(UNIQUE_FLOOR, (uuid.uuid4(), JOB, Jsonb(one), key), prepare=True)
            await cur.fetchall()
        return jobs / (time.perf_counter() - t0)


def enqueue_through(dsn: str, kind: str, jobs: int, batch: int) -> integrations.Rate:
    """Jobs/s of `jobs` jobs queued on a connection of `kind` (`integrations.KINDS`) in
    one transaction, one by one (`batch` 1) or `batch` at a time, in a fresh schema."""
    with scratch_schema(dsn) as sdsn:
        setup_tables(sdsn, done_table=False)
        prepare_for_timing(sdsn)
        rate = integrations.enqueue_rate(kind, sdsn, jobs, batch)
        with psycopg.connect(sdsn) as conn:
            row = conn.execute("SELECT count(*) FROM axa_queue WHERE name = 'noop'").fetchone()
        if row is None or row[0] != jobs:
            raise AssertionError(f"expected {jobs} queued jobs through {kind}, found {row}")
        return rate


SingleSide = Literal["axa", "raw", "unique", "unique_raw"]


def enqueue_single(dsn: str, jobs: int, side: SingleSide, warmup: int = 20) -> float:
    """Jobs/s of `jobs` sequential single enqueues into axa-queue's table, each
    awaited before the next: `Queue.enqueue`, the same with a unique key per job, or a
    raw prepared one-row INSERT, without or with a key (`UNIQUE_FLOOR`)."""
    with scratch_schema(dsn) as sdsn:
        setup_tables(sdsn, done_table=False)
        prepare_for_timing(sdsn)
        run = {
            "axa": _enqueue_single_axa,
            "raw": _enqueue_single_raw,
            "unique": _enqueue_single_unique,
            "unique_raw": _enqueue_single_unique_raw,
        }[side]
        rate = asyncio.run(run(sdsn, jobs, warmup))
        with psycopg.connect(sdsn) as conn:
            row = conn.execute("SELECT count(*) FROM axa_queue").fetchone()
        if row is None or row[0] != jobs + warmup:
            raise AssertionError(f"expected {jobs + warmup} queued jobs, found {row}")
        return rate


@dataclass(frozen=True)
class Trace:
    """What a libpq protocol trace of some enqueues saw."""

    enqueues: int
    statements: int
    """Execute (extended protocol) and Query (simple protocol) messages sent."""
    round_trips: int
    """ReadyForQuery messages received: one per request/response exchange."""


async def _trace_enqueues(dsn: str, jobs: int) -> Trace:
    async with Queue(dsn) as queue:
        for _ in range(10):  # past psycopg's prepare threshold, as in steady state
            await queue.enqueue(JOB, {"k": str(uuid.uuid4())})
        if queue.pool.get_stats().get("pool_size") != 1:
            raise AssertionError("expected the queue's pool to hold a single connection")
        with tempfile.TemporaryFile("w+") as log:
            async with queue.pool.connection() as conn:
                conn.pgconn.trace(log.fileno())
                conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
            for _ in range(jobs):
                await queue.enqueue(JOB, {"k": str(uuid.uuid4())})
            async with queue.pool.connection() as conn:
                conn.pgconn.untrace()
            log.seek(0)
            lines = log.read().splitlines()
    sent = [line.split("\t") for line in lines if line.startswith("F\t")]
    received = [line.split("\t") for line in lines if line.startswith("B\t")]
    statements = sum(1 for parts in sent if parts[2] in ("Execute", "Query"))
    round_trips = sum(1 for parts in received if parts[2] == "ReadyForQuery")
    return Trace(jobs, statements, round_trips)


def enqueue_trace(dsn: str, jobs: int = 200) -> Trace:
    """Trace the wire protocol of `jobs` `Queue.enqueue` calls (after warm-up) and
    raise unless each sent exactly one statement in exactly one round trip."""
    with scratch_schema(dsn) as sdsn:
        setup_tables(sdsn, done_table=False)
        trace = asyncio.run(_trace_enqueues(sdsn, jobs))
    if trace.statements != jobs or trace.round_trips != jobs:
        raise AssertionError(
            f"{jobs} enqueues sent {trace.statements} statements in {trace.round_trips} "
            "round trips; expected one of each per enqueue"
        )
    return trace


def _raw_bulk(
    conn: psycopg.Connection[Any], method: BulkMethod, args: list[dict[str, Any]]
) -> None:
    rows = [(uuid.uuid4(), JOB, Jsonb(one)) for one in args]
    with conn.cursor() as cur:
        if method == "values":
            query = pgsql.SQL("INSERT INTO axa_queue (id, name, args) VALUES {}").format(
                pgsql.SQL(",").join([pgsql.SQL("(%s,%s,%s)")] * len(rows))
            )
            cur.execute(query, [value for row in rows for value in row])
        elif method == "unnest":
            cur.execute(
                floor.INSERT_UNNEST,
                ([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]),
            )
        elif method == "unique_unnest":
            cur.execute(
                "INSERT INTO axa_queue (id, name, args, unique_key)"
                " SELECT * FROM unnest(%s::uuid[], %s::text[], %s::jsonb[], %s::text[])"
                " ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND (status IN"
                " ('queued', 'running', 'needs_review') OR unique_for_ms IS NOT NULL)"
                " DO NOTHING RETURNING id",
                (
                    [r[0] for r in rows],
                    [r[1] for r in rows],
                    [r[2] for r in rows],
                    [f"key:{one['k']}" for one in args],
                ),
            )
            cur.fetchall()
        elif method == "copy":
            with cur.copy("COPY axa_queue (id, name, args) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            raise ValueError(f"unknown method {method!r}")


async def _bulk_axa(dsn: str, args: list[dict[str, Any]], unique: bool = False) -> float:
    async with Queue(dsn) as queue:
        t0 = time.perf_counter()
        if unique:
            await queue.enqueue_all(
                [NewJob(JOB, one, unique_key=f"key:{one['k']}") for one in args]
            )
        else:
            await queue.enqueue_all([NewJob(JOB, one) for one in args])
        return time.perf_counter() - t0


def enqueue_bulk(dsn: str, jobs: int, method: BulkMethod) -> float:
    """Jobs/s of queuing `jobs` jobs at once into an empty axa-queue table, from a list
    of argument dicts to committed rows (ids made and arguments encoded in the timed
    part): `Queue.enqueue_all` (`unique`: each job with a unique key of its own), or raw
    `values` (one multi-row INSERT), `copy` or `unnest` (one INSERT ... SELECT FROM
    unnest of arrays), or `unique_unnest` (the same with a key per job, ON CONFLICT DO
    NOTHING: the floor of `unique`)."""
    if method == "values" and jobs * 3 > 65_535:
        raise ValueError("one multi-row INSERT takes at most 21,845 jobs")
    args = [{"k": str(uuid.uuid4())} for _ in range(jobs)]
    with scratch_schema(dsn) as sdsn:
        setup_tables(sdsn, done_table=False)
        prepare_for_timing(sdsn)
        if method in ("axa", "unique"):
            seconds = asyncio.run(_bulk_axa(sdsn, args, unique=method == "unique"))
        else:
            with psycopg.connect(sdsn, autocommit=True) as conn:
                t0 = time.perf_counter()
                with conn.transaction():
                    _raw_bulk(conn, method, args)
                seconds = time.perf_counter() - t0
        with psycopg.connect(sdsn) as conn:
            row = conn.execute("SELECT count(*) FROM axa_queue").fetchone()
        if row is None or row[0] != jobs:
            raise AssertionError(f"{method}: expected {jobs} queued jobs, found {row}")
    return jobs / seconds


# --- drain -----------------------------------------------------------------------------------


class DrainTimeout(RuntimeError):
    """A drain did not finish in time."""


@dataclass(frozen=True)
class Drain:
    """One drain's figures."""

    jobs_per_s: float
    cpu_us_per_job: float | None
    """CPU microseconds the whole machine (workers, PostgreSQL, kernel) spent per job
    while the drain was timed; None without /proc/stat."""


def _per_job(busy: float | None, jobs: int) -> float | None:
    return None if busy is None else busy / jobs * 1e6


async def _drain_in_process(
    dsn: str,
    jobs: int,
    loops: int,
    timeout: float,
    prefetch: int | None = None,
    hold: bool = False,
    global_limit: int | None = None,
    rate_limit: int | None = None,
    per_key: int | None = None,
) -> Drain:
    connections = [
        await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        for _ in range(loops if hold else 0)
    ]
    held = [conn.cursor() for conn in connections] if hold else None
    queue = bench_queue(
        dsn,
        loops,
        prefetch=prefetch,
        held=held,
        global_limit=global_limit,
        rate_limit=rate_limit,
        per_key=per_key,
    )
    await queue.open()
    try:
        await queue_jobs(queue, jobs, keys=None if per_key is None else BENCH_KEYS)
        prepare_for_timing(dsn)
        await warm_pool(queue)
        stop = asyncio.Event()
        outcomes: Counter[str] = Counter()
        ended = 0
        last = 0.0
        busy: float | None = None

        def seen(_name: str, outcome: str, _seconds: float) -> None:
            # Kept cheap: the floor has no observer to pay for.
            nonlocal ended, last, busy
            outcomes[outcome] += 1
            ended += 1
            if ended >= jobs:
                last = time.monotonic()
                busy = floor._busy_since(busy_before)
                stop.set()

        queue.observe(seen)
        busy_before = floor.machine_busy_seconds()
        t0 = time.monotonic()
        running = asyncio.ensure_future(queue.run(stop))
        finished = asyncio.ensure_future(stop.wait())
        await asyncio.wait([running, finished], timeout=timeout, return_when="FIRST_COMPLETED")
        stop.set()
        await running
        finished.cancel()
        if outcomes["completed"] != jobs:
            raise DrainTimeout(f"{loops} loops ran {dict(outcomes)} of {jobs} jobs in {timeout}s")
        return Drain(jobs / (last - t0), _per_job(busy, jobs))
    finally:
        await queue.close()
        for conn in connections:
            await conn.close()


def _drain_child(
    dsn: str,
    loops: int,
    ready: Any,
    go: Any,
    stop: Any,
    counter: Any,
    results: Pipe,
) -> None:
    """One worker process of a multi-process drain (see `drain_axa`): open the queue,
    say it is ready, run from `go` until `stop`, and send back its outcomes and when
    it recorded its last ending."""
    try:
        results.send(asyncio.run(_drain_child_main(dsn, loops, ready, go, stop, counter)))
    except BaseException as error:  # reported to the parent, which raises
        results.send(f"{type(error).__name__}: {error}")
    finally:
        results.close()


async def _drain_child_main(
    dsn: str, loops: int, ready: Any, go: Any, stop: Any, counter: Any
) -> tuple[dict[str, int], float]:
    queue = bench_queue(dsn, loops)
    await queue.open(setup=False)
    try:
        await warm_pool(queue)
        outcomes: Counter[str] = Counter()
        last = 0.0

        def seen(_name: str, outcome: str, _seconds: float) -> None:
            nonlocal last
            outcomes[outcome] += 1
            last = time.monotonic()
            with counter.get_lock():
                counter.value += 1

        queue.observe(seen)
        ready.release()
        if not await asyncio.to_thread(go.wait, 120):
            raise TimeoutError("never told to start")
        stopping = asyncio.Event()
        running = asyncio.ensure_future(queue.run(stopping))
        told = asyncio.ensure_future(asyncio.to_thread(stop.wait, 600))
        await asyncio.wait([running, told], return_when="FIRST_COMPLETED")
        stopping.set()
        await running
        told.cancel()
        return dict(outcomes), last
    finally:
        await queue.close()


def _child_error(pipes: list[Pipe]) -> str | None:
    """The first error a child process sent, if any."""
    for pipe in pipes:
        if pipe.poll(1):
            got = pipe.recv()
            if isinstance(got, str):
                return f"a worker process failed: {got}"
    return None


def _drain_processes(dsn: str, jobs: int, loops: int, processes: int, timeout: float) -> Drain:
    async def setup() -> None:
        queue = bench_queue(dsn, loops)
        async with queue:
            await queue_jobs(queue, jobs)

    asyncio.run(setup())
    prepare_for_timing(dsn)
    ready = SPAWN.Semaphore(0)
    go = SPAWN.Event()
    stop = SPAWN.Event()
    counter = SPAWN.Value("q", 0)
    pipes: list[Pipe] = []
    children = []
    for _ in range(processes):
        mine, theirs = SPAWN.Pipe(duplex=False)
        child = SPAWN.Process(
            target=_drain_child,
            args=(dsn, loops, ready, go, stop, counter, theirs),
            daemon=True,
        )
        child.start()
        theirs.close()
        pipes.append(mine)
        children.append(child)
    try:
        waiting = processes
        deadline = time.monotonic() + 120
        while waiting:
            if ready.acquire(timeout=0.1):
                waiting -= 1
            elif time.monotonic() > deadline or not all(c.is_alive() for c in children):
                raise RuntimeError(_child_error(pipes) or "a worker process did not start")
        busy = floor.machine_busy_seconds()
        t0 = time.monotonic()
        go.set()
        deadline = t0 + timeout
        while counter.value < jobs and time.monotonic() < deadline:
            if not all(child.is_alive() for child in children):
                break
            time.sleep(0.002)
        busy = floor._busy_since(busy)
        stop.set()
        outcomes: Counter[str] = Counter()
        last = 0.0
        for pipe in pipes:
            if not pipe.poll(60):
                raise DrainTimeout("a worker process did not report")
            got = pipe.recv()
            if isinstance(got, str):
                raise RuntimeError(f"a worker process failed: {got}")
            outcomes.update(got[0])
            last = max(last, got[1])
        if outcomes["completed"] != jobs:
            raise DrainTimeout(
                f"{processes} x {loops} loops ran {dict(outcomes)} of {jobs} jobs in {timeout}s"
            )
        return Drain(jobs / (last - t0), _per_job(busy, jobs))
    finally:
        stop.set()
        for child in children:
            child.join(30)
            if child.is_alive():
                child.kill()
                child.join()


def drain_axa(
    dsn: str,
    jobs: int,
    loops: int,
    processes: int = 1,
    prefetch: int | None = None,
    *,
    hold: bool = False,
    global_limit: int | None = None,
    rate_limit: int | None = None,
    per_key: int | None = None,
    without_key_indexes: bool = False,
) -> Drain:
    """Jobs/s of axa-queue running `jobs` pre-queued no-op jobs with `loops` loops in
    each of `processes` processes (this one when 1, else spawned children), from the
    start of `run` to the last ending recorded; then checks exactly-once. `prefetch`
    (one process only) claims that many jobs ahead of the loops; `hold` (one process
    only) has the handler write on a connection it holds, not one from the pool;
    `global_limit` (one process only) limits the job across processes, which every
    claim then checks (`axa_queue_room`); `rate_limit` (one process only) limits its
    claims to that many a millisecond, which every claim checks and stamps
    (`axa_queue_rate_room`, `axa_rate_slots`); `per_key` (one process only) spreads the
    jobs over `BENCH_KEYS` keys and limits each key's running jobs (the keyed claim,
    `EXCHANGE_KEYED`); `without_key_indexes` drops migration 15's indexes first (the
    tables as a queue without keys had them before)."""
    timeout = max(60.0, jobs / 50)
    with scratch_schema(dsn) as sdsn:
        setup_tables(sdsn)
        if without_key_indexes:
            with psycopg.connect(sdsn, autocommit=True) as conn:
                for index in KEY_INDEXES:
                    conn.execute(pgsql.SQL("DROP INDEX {}").format(pgsql.Identifier(index)))
        if processes == 1:
            rate = asyncio.run(
                _drain_in_process(
                    sdsn, jobs, loops, timeout, prefetch, hold, global_limit, rate_limit, per_key
                )
            )
        else:
            rate = _drain_processes(sdsn, jobs, loops, processes, timeout)
        verify_axa(sdsn, jobs)
    return rate


def drain_floor(
    dsn: str,
    jobs: int,
    kind: FloorDrain,
    connections: int = 10,
    batch: int = 100,
    mode: floor.Mode = "asyncio",
    *,
    axa_table: bool = False,
) -> Drain:
    """Jobs/s of a raw-SQL drain (bench/floor.py; it checks exactly-once) of the
    reference design's table (the crate's columns, its claim index), or with
    `axa_table` of axa-queue's own (its setup statements: more indexes, a trigger):

    - `one`: claim one job per `UPDATE ... SKIP LOCKED`, insert its done row, mark it
      completed: three statements per job;
    - `batch`: claim `batch` per statement, each job inserts its own done row with
      its own statement (as a handler would), one statement completes the batch;
    - `fused`: claim `batch`, and insert all done rows and complete the batch in one
      statement: a stronger floor than any queue whose handlers write on their own.
    """
    schema = floor.fresh_schema("bench_floor")
    ddl = [*SETUP_STATEMENTS, BENCH_DONE] if axa_table else floor.TABLE_DDL
    if kind == "one":
        result = floor.drain_one_at_a_time(
            dsn, schema, jobs, connections, mode=mode, completion="handler", ddl=ddl
        )
    elif kind == "batch":
        result = floor.drain_batched(
            dsn, schema, jobs, connections, batch, mode=mode, completion="handler", ddl=ddl
        )
    elif kind == "fused":
        result = floor.drain_batched(
            dsn, schema, jobs, connections, batch, mode=mode, completion="fused", ddl=ddl
        )
    else:
        raise ValueError(f"unknown floor drain {kind!r}")
    return Drain(result.jobs_per_s, result.cpu_us_per_job)


def peer_enqueue_bulk(dsn: str, peer: peers.Peer, jobs: int) -> float:
    """Jobs/s of the peer queuing `jobs` jobs in one call (`bench/peers.py`), in a
    schema of its own, as `enqueue_bulk` measures axa-queue's."""
    with scratch_schema(dsn, "bench_peer") as sdsn:
        peers.install(sdsn, peer)
        prepare_peer(sdsn)
        return peers.enqueue_bulk(sdsn, peer, jobs)


def peer_drain(dsn: str, peer: peers.Peer, jobs: int) -> float:
    """Jobs/s of the peer's worker draining `jobs` pre-queued jobs, each writing its
    row to `bench_done`; checks exactly-once (`bench/peers.py`)."""
    with scratch_schema(dsn, "bench_peer") as sdsn:
        peers.install(sdsn, peer)
        peers.queue_untimed(sdsn, peer, jobs)
        prepare_peer(sdsn)
        return peers.drain(sdsn, peer, jobs)


def prepare_peer(dsn: str) -> None:
    """ANALYZE and CHECKPOINT before the timed part, as `prepare_for_timing` does."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE")
        floor.checkpoint(conn)


# --- latency ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Latency:
    """Enqueue -> start latencies of one run, in milliseconds."""

    samples: int
    p50_ms: float
    p99_ms: float
    max_ms: float


def _latency_of(sent: dict[str, float], started: dict[str, float], warmup: int) -> Latency:
    if set(sent) != set(started):
        raise ExactlyOnceError(f"latency: {len(sent)} queued, {len(started)} started")
    ordered = sorted(sent, key=sent.__getitem__)[warmup:]
    ms = [(started[k] - sent[k]) * 1000 for k in ordered]
    return Latency(len(ms), floor._percentile(ms, 50), floor._percentile(ms, 99), max(ms))


def _producer(
    dsn: str, kind: str, channel: str, count: int, spacing: float, start: Any, results: Pipe
) -> None:
    """Queue `count` jobs one by one, `spacing` seconds apart, noting the monotonic
    time just before each; send {key: time} back. `kind` is `axa` (`enqueue_on`,
    whose trigger notifies) or `floor` (INSERT and NOTIFY in one transaction)."""
    sent: dict[str, float] = {}
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            cur = conn.cursor()
            notify = pgsql.SQL("NOTIFY {}").format(pgsql.Identifier(channel))
            start.wait(60)
            for _ in range(count):
                key = uuid.uuid4()
                t0 = time.monotonic()
                if kind == "axa":
                    enqueue_on(conn, NewJob(JOB, {"k": str(key)}))
                else:
                    with conn.pipeline(), conn.transaction():
                        cur.execute(floor.INSERT_NOTIFY, (key, JOB, Jsonb({})), prepare=True)
                        cur.execute(notify)
                sent[str(key)] = t0
                time.sleep(spacing)
        results.send(sent)
    except BaseException as error:  # reported to the parent, which raises
        results.send(f"{type(error).__name__}: {error}")
    finally:
        results.close()


class _Producer:
    """A producer process, started early (spawning is slow) and released by `go`."""

    def __init__(self, dsn: str, kind: str, channel: str, count: int, spacing: float) -> None:
        self.start = SPAWN.Barrier(2)
        self.pipe, theirs = SPAWN.Pipe(duplex=False)
        self.process = SPAWN.Process(
            target=_producer,
            args=(dsn, kind, channel, count, spacing, self.start, theirs),
            daemon=True,
        )
        self.process.start()
        theirs.close()

    async def run(self, timeout: float) -> dict[str, float]:
        await asyncio.to_thread(self.start.wait, 60)
        if not await asyncio.to_thread(self.pipe.poll, timeout):
            raise TimeoutError("the producer did not finish")
        got = self.pipe.recv()
        if isinstance(got, str):
            raise RuntimeError(f"the producer failed: {got}")
        assert isinstance(got, dict)
        return got

    def close(self) -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            self.start.abort()
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


async def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def listening(dsn: str, query: str, timeout: float = 15.0, sessions: int = 1) -> None:
    """Wait until `sessions` sessions of this schema have run `query` (their LISTEN)."""
    name = psycopg.conninfo.conninfo_to_dict(dsn).get("application_name")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        deadline = time.monotonic() + timeout
        while True:
            cursor = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                "AND query = %s AND pid <> pg_backend_pid()",
                (name, query),
            )
            row = await cursor.fetchone()
            if row and row[0] >= sessions:
                return
            if time.monotonic() > deadline:
                raise TimeoutError("the listener did not start listening")
            await asyncio.sleep(0.01)


async def _latency_axa(
    dsn: str, total: int, spacing: float, loops: int, prefetch: int | None = None
) -> tuple[dict[str, float], dict[str, float]]:
    started: dict[str, float] = {}
    producer = _Producer(dsn, "axa", axa_sql.CHANNEL, total, spacing)
    queue = bench_queue(dsn, loops, started, prefetch=prefetch)
    try:
        await queue.open()
        await warm_pool(queue)
        ended = 0

        def seen(_name: str, _outcome: str, _seconds: float) -> None:
            nonlocal ended
            ended += 1

        queue.observe(seen)
        stop = asyncio.Event()
        running = asyncio.ensure_future(queue.run(stop))
        try:
            await listening(dsn, axa_sql.LISTEN)
            await asyncio.sleep(0.2)  # idle: the first claim and housekeeping are done
            sent = await producer.run(timeout=60 + total * spacing * 2)
            await _until(lambda: ended >= total, 30, "every job to end")
        finally:
            stop.set()
            await running
        return sent, started
    finally:
        producer.close()
        await queue.close()


def latency_axa(
    dsn: str,
    samples: int,
    *,
    spacing_ms: float = 5.0,
    warmup: int = 10,
    loops: int = 10,
    prefetch: int | None = None,
) -> Latency:
    """Enqueue -> handler start of an idle axa-queue worker with `loops` loops (and the
    default `prefetch` unless given), the jobs queued by another process with
    `enqueue_on`, one every `spacing_ms`; the first `warmup` samples are left out."""
    with scratch_schema(dsn) as sdsn:
        setup_tables(sdsn)
        total = samples + warmup
        sent, started = asyncio.run(_latency_axa(sdsn, total, spacing_ms / 1000, loops, prefetch))
        verify_axa(sdsn, total)
    return _latency_of(sent, started, warmup)


async def _latency_floor(
    dsn: str, schema: str, total: int, spacing: float, timeout: float = 10.0
) -> tuple[dict[str, float], dict[str, float]]:
    started: dict[str, float] = {}
    channel = floor.channel(schema)
    producer = _Producer(dsn, "floor", channel, total, spacing)
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(channel)))
            cur = conn.cursor()

            async def consume() -> None:
                while len(started) < total:
                    woken = False
                    async for _ in conn.notifies(timeout=timeout, stop_after=1):
                        woken = True
                    if not woken:
                        raise TimeoutError("no notification within the timeout")
                    while True:  # one notification may stand for several jobs
                        await cur.execute(floor.CLAIM_ONE, prepare=True)
                        row = await cur.fetchone()
                        if row is None:
                            break
                        started[str(row[0])] = time.monotonic()
                        await cur.execute(floor.DONE_ONE, {"id": row[0]}, prepare=True)
                        await cur.execute(floor.COMPLETE_ONE, {"id": row[0]}, prepare=True)

            consumer = asyncio.ensure_future(consume())
            try:
                sent = await producer.run(timeout=60 + total * spacing * 2)
                await asyncio.wait_for(asyncio.shield(consumer), timeout)
            finally:
                consumer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await consumer
        return sent, started
    finally:
        producer.close()


def latency_floor(dsn: str, samples: int, *, spacing_ms: float = 5.0, warmup: int = 10) -> Latency:
    """Enqueue -> claimed of a raw LISTEN/NOTIFY consumer (claim one per wake-up until
    none is left, then write the done row and complete, as a handler would), the jobs
    queued by another process (INSERT and NOTIFY in one transaction) one every
    `spacing_ms`; the first `warmup` samples are left out."""
    schema = floor.fresh_schema("bench_floor")
    total = samples + warmup
    with floor.private_schema(dsn, schema):
        sdsn = schema_dsn(dsn, schema)
        sent, started = asyncio.run(_latency_floor(sdsn, schema, total, spacing_ms / 1000))
        with floor.connect(dsn, schema) as conn:
            floor.verify_exactly_once(conn, total)
    return _latency_of(sent, started, warmup)


# --- the claim on a big table ----------------------------------------------------------------


CLAIM_PARAMETERS = (
    "completed", "completed_attempts", "endings", "free", "wanted", "losing", "now", "idle",
    "starts", "started_attempts", "worker", "host", "pid", "limits", "max",
)  # fmt: skip
"""`sql.EXCHANGE`'s named parameters, in the order of `$1..$10` of the PREPAREd form."""

CLAIM_TYPES = (
    "uuid[], int[], json, int, json, uuid[], timestamptz, int, uuid[], int[], uuid, text, int, "
    "jsonb, int"
)
"""Their types, for PREPARE."""


def claim_params(free: int, names: list[str], caps: list[int]) -> dict[str, Any]:
    """`sql.EXCHANGE`'s parameters for a claim of `free` jobs that records no endings,
    `caps` giving each name's most (all `free` for a name with no limit)."""
    wanted = [{"name": name, "cap": cap} for name, cap in zip(names, caps, strict=True)]
    return {
        "completed": "{}",
        "completed_attempts": "{}",
        "endings": "[]",
        "free": free,
        "wanted": json.dumps(wanted),
        "losing": "{}",
        "now": None,
        "idle": free,
        "starts": "{}",
        "started_attempts": "{}",
        "worker": None,
        "host": "bench",
        "pid": 0,
        "limits": "{}",
        "max": 1,
    }


def wanted_names(params: dict[str, Any]) -> list[str]:
    """The job names a claim's parameters ask for."""
    return [one["name"] for one in json.loads(params["wanted"])]


def numbered(query: str, names: Sequence[str]) -> str:
    """`query` with psycopg's `%(name)s` placeholders as `$n` (n from `names`)."""
    return re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", query)


def prepare_claim(conn: psycopg.Connection[Any], statement: str = axa_sql.EXCHANGE) -> None:
    """PREPARE `statement` (`sql.EXCHANGE` or one of its variants, `sql.CLAIM` say) as
    `bench_claim`, its parameters typed as the library's connections send them."""
    conn.execute(
        pgsql.SQL("PREPARE bench_claim({}) AS {}").format(
            pgsql.SQL(CLAIM_TYPES), pgsql.SQL(numbered(statement, CLAIM_PARAMETERS))
        )
    )


def claim_execute(params: dict[str, Any]) -> pgsql.Composed:
    """`EXECUTE bench_claim(...)` of `prepare_claim`, with `params` as typed literals."""
    args = pgsql.SQL(", ").join(
        pgsql.SQL("{}::{}").format(pgsql.Literal(params[name]), pgsql.SQL(kind))
        for name, kind in zip(CLAIM_PARAMETERS, CLAIM_TYPES.split(", "), strict=True)
    )
    return pgsql.SQL("EXECUTE bench_claim({})").format(args)


def crate_claim() -> str | None:
    """The crate's one-row claim (`tests/seed_crate.py`'s CLAIM) with `$1`, if present."""
    path = HERE.parent / "tests" / "seed_crate.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location("bench_seed_crate", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return numbered(str(module.CLAIM), ["p1"])


@dataclass(frozen=True)
class ClaimCase:
    """The claim's cost in one state of the big table, in milliseconds (medians)."""

    label: str
    db_ms: float
    """EXPLAIN ANALYZE's execution time of the PREPAREd generic plan, rolled back."""
    client_ms: float | None
    """One execution as the library sends it (psycopg, prepared, autocommit, generic
    plan), round trip included; it really claims."""
    claimed: int
    """Rows one claim returned (it asks for 10)."""
    crate_db_ms: float | None
    """The crate's one-row claim in the same state, for comparison."""


@dataclass(frozen=True)
class ClaimTimes:
    """The claim on a big table: `finished` completed and `delayed` future rows."""

    finished: int
    delayed: int
    ready: int
    backlog: int
    cases: list[ClaimCase]
    plans: dict[str, str] = field(default_factory=dict, compare=False)

    def case(self, label: str) -> ClaimCase | None:
        return next((c for c in self.cases if c.label == label), None)


def _execution_ms(conn: psycopg.Connection[Any], explain: str) -> tuple[float, str]:
    """Run `explain` (an EXPLAIN ANALYZE) in a transaction rolled back; its execution
    time in ms and the plan text."""
    with conn.transaction(force_rollback=True):
        lines = [row[0] for row in conn.execute(explain).fetchall()]
    for line in lines:
        if line.startswith("Execution Time:"):
            return float(line.split()[2]), "\n".join(lines)
    raise AssertionError("EXPLAIN ANALYZE gave no execution time")


def _claim_case(
    label: str,
    explainer: psycopg.Connection[Any],
    library: psycopg.Connection[Any] | None,
    params: dict[str, Any],
    samples: int,
    crate: bool,
    plans: dict[str, str],
) -> ClaimCase:
    """Time the claim in the table's present state: its database time (EXPLAIN
    ANALYZE of the PREPAREd statement, rolled back), then, with `library`, as the
    library runs it (which claims for real)."""
    explain = pgsql.SQL("EXPLAIN (ANALYZE, TIMING OFF) ") + claim_execute(params)
    explain_text = explain.as_string(explainer)
    db = [_execution_ms(explainer, explain_text)[0] for _ in range(samples)]
    plans[label] = _execution_ms(explainer, explain_text.replace("TIMING OFF", "BUFFERS"))[1]
    crate_ms = None
    if crate:
        crate_explain = pgsql.SQL(
            "EXPLAIN (ANALYZE, TIMING OFF) EXECUTE bench_crate_claim({})"
        ).format(pgsql.Literal(wanted_names(params)))
        crate_ms = statistics.median(
            _execution_ms(explainer, crate_explain.as_string(explainer))[0] for _ in range(samples)
        )
    client = None
    claimed = -1
    if library is not None:
        cur = library.cursor()
        times = []
        for _ in range(samples + 2):  # the first two prepare the statement
            t0 = time.perf_counter()
            claimed = len(cur.execute(axa_sql.EXCHANGE, params, prepare=True).fetchall())
            times.append((time.perf_counter() - t0) * 1000)
        client = statistics.median(times[2:])
    return ClaimCase(label, statistics.median(db), client, claimed, crate_ms)


BIG_IDLE = "none ready"
BIG_READY = "jobs ready"
BIG_BACKLOG = "a backlog ready"
BIG_FOREIGN = "behind other names' backlog"
BIG_LIMITED = "a limited name behind a backlog"


def claim_big_table(
    dsn: str,
    finished: int = 1_000_000,
    delayed: int = 100_000,
    ready: int = 1_000,
    samples: int = 30,
    backlog: int = 100_000,
) -> ClaimTimes:
    """The claim's time with `finished` completed and `delayed` future rows present
    (made by one INSERT ... SELECT generate_series each, then ANALYZE; the delayed
    rows have priorities 0, 1 and 2): with no job ready, then with `ready` jobs ready
    (priority 0). With `backlog`, two more states, for information: `backlog` older
    ready jobs of a name the claim does not ask for; and that backlog asked for while
    the newer ready jobs' name is limited (`queue.limit`).

    The statement is PREPAREd on a connection with the library's session settings
    (`SESSION_SETTINGS`: no JIT, generic plans) and the exchange connection's
    (`CLAIM_SETTINGS`: no sort where an index gives the order), as the worker runs it.
    """
    crate = crate_claim()
    plans: dict[str, str] = {}
    cases: list[ClaimCase] = []
    with scratch_schema(dsn) as sdsn:
        setup_tables(sdsn, done_table=False)
        with (
            psycopg.connect(sdsn, autocommit=True, prepare_threshold=None) as explainer,
            psycopg.connect(sdsn, autocommit=True) as library,
        ):
            explainer.execute("SET axa_queue.notify = off")
            explainer.execute(
                """INSERT INTO axa_queue (id, name, args, status, run_at, started_at,
                       created_at, updated_at, attempts, priority)
                   SELECT gen_random_uuid(), %s, '{}', 'completed',
                       now() - make_interval(secs => g), now() - make_interval(secs => g),
                       now() - make_interval(secs => g), now() - make_interval(secs => g),
                       1, (g %% 3)::smallint
                   FROM generate_series(1, %s) g""",
                (JOB, finished),
            )
            explainer.execute(
                """INSERT INTO axa_queue (id, name, args, run_at, priority)
                   SELECT gen_random_uuid(), %s, '{}',
                       now() + interval '1 hour' + make_interval(secs => g), (g %% 3)::smallint
                   FROM generate_series(1, %s) g""",
                (JOB, delayed),
            )

            for conn in (explainer, library):  # as the worker's exchange connection
                conn.execute(axa_sql.SESSION_SETTINGS)
                conn.execute(axa_sql.CLAIM_SETTINGS)
            prepare_claim(explainer)
            if crate is not None:
                explainer.execute(
                    pgsql.SQL("PREPARE bench_crate_claim(text[]) AS ") + pgsql.SQL(crate)
                )

            def settle() -> None:
                # ANALYZE invalidates the cached plans: each is planned again, generic.
                explainer.execute("ANALYZE axa_queue")
                floor.checkpoint(explainer)

            settle()
            asked = claim_params(10, [JOB], [10])
            has_crate = crate is not None
            cases.append(
                _claim_case(BIG_IDLE, explainer, library, asked, samples, has_crate, plans)
            )
            explainer.execute(
                """INSERT INTO axa_queue (id, name, args, run_at)
                   SELECT gen_random_uuid(), %s, '{}', now() - make_interval(secs => g)
                   FROM generate_series(1, %s) g""",
                (JOB, ready),
            )
            settle()
            cases.append(
                _claim_case(BIG_READY, explainer, library, asked, samples, has_crate, plans)
            )
            if backlog:
                explainer.execute(
                    """INSERT INTO axa_queue (id, name, args, run_at)
                       SELECT gen_random_uuid(), 'other', '{}',
                           now() - interval '1 day' + make_interval(secs => g / 1000.0)
                       FROM generate_series(1, %s) g""",
                    (backlog,),
                )
                settle()
                cases.append(
                    _claim_case(BIG_FOREIGN, explainer, None, asked, samples, has_crate, plans)
                )
                limited = claim_params(10, ["other", JOB], [10, 10])
                cases.append(
                    _claim_case(BIG_LIMITED, explainer, None, limited, samples, False, plans)
                )
    for case in cases:
        if case.label == BIG_IDLE and case.claimed != 0:
            raise AssertionError(f"the claim took {case.claimed} jobs when none was ready")
        if case.label == BIG_READY and case.claimed != min(10, ready):
            raise AssertionError(f"the claim took {case.claimed} of {ready} ready jobs")
    if backlog:
        cases.append(claim_backlog(dsn, delayed, backlog, samples, plans))
    return ClaimTimes(finished, delayed, ready, backlog, cases, plans)


def claim_backlog(
    dsn: str, delayed: int, backlog: int, samples: int, plans: dict[str, str]
) -> ClaimCase:
    """The claim's database time, for information, in a table of its own holding
    `delayed` future rows at priorities 0, 1 and 2 and a backlog of `backlog` ready
    jobs at priority 0 (a queue that is behind, with some jobs scheduled)."""
    crate = crate_claim()
    with (
        scratch_schema(dsn) as sdsn,
        psycopg.connect(sdsn, autocommit=True, prepare_threshold=None) as explainer,
    ):
        setup_tables(sdsn, done_table=False)
        explainer.execute("SET axa_queue.notify = off")
        explainer.execute(
            """INSERT INTO axa_queue (id, name, args, run_at, priority)
               SELECT gen_random_uuid(), %s, '{}',
                   now() + interval '1 hour' + make_interval(secs => g), (g %% 3)::smallint
               FROM generate_series(1, %s) g""",
            (JOB, delayed),
        )
        explainer.execute(
            """INSERT INTO axa_queue (id, name, args, run_at)
               SELECT gen_random_uuid(), %s, '{}', now() - make_interval(secs => g / 1000.0)
               FROM generate_series(1, %s) g""",
            (JOB, backlog),
        )
        explainer.execute("ANALYZE axa_queue")
        floor.checkpoint(explainer)
        explainer.execute(axa_sql.SESSION_SETTINGS)
        explainer.execute(axa_sql.CLAIM_SETTINGS)
        prepare_claim(explainer)
        if crate is not None:
            explainer.execute(pgsql.SQL("PREPARE bench_crate_claim(text[]) AS ") + pgsql.SQL(crate))
        asked = claim_params(10, [JOB], [10])
        return _claim_case(BIG_BACKLOG, explainer, None, asked, samples, crate is not None, plans)


# --- the whole run -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """What one run measures, and how much."""

    dsn: str = DEFAULT_DSN
    repeats: int = 5
    single_jobs: int = 3_000
    bulk_jobs: int = 10_000
    trace_jobs: int = 200
    drain_jobs: int = 20_000
    drain_jobs_one_loop: int = 3_000
    loops: tuple[int, ...] = (1, 10, 50)
    processes: int = 2
    process_loops: int = 10
    prefetch: int = 100
    """Jobs claimed ahead in the prefetch drains (of `process_loops` loops)."""
    floor_connections: int = 10
    floor_batch: int = 100
    floor_mode: floor.Mode = "asyncio"
    latency_samples: int = 500
    latency_warmup: int = 10
    spacing_ms: float = 5.0
    big_finished: int = 1_000_000
    big_delayed: int = 100_000
    big_ready: int = 1_000
    big_backlog: int = 100_000
    big_samples: int = 30
    integration_jobs: int = 2_000
    """Jobs queued one by one on each kind of connection (ten times as many in batches)."""
    integration_batch: int = 100
    """Jobs per `enqueue_all_on` through each kind of connection."""
    workloads: tuple[str, ...] = (
        "enqueue",
        "integrations",
        "drain",
        "latency",
        "bigtable",
        "peers",
    )
    vacuum_catalogs: bool = True
    """VACUUM the system catalogs the schemas churn before each round (untimed)."""
    checkpoints: bool = True
    """CHECKPOINT before each timed part (`floor.CHECKPOINTS`); a smoke run skips them."""
    idle_sample: float = 0.25
    """Seconds the machine's CPU use is sampled between cases, to see what else runs
    (`Report.others`); 0: not sampled (a smoke run, whose figures measure nothing)."""


QUICK = {
    "repeats": 3,
    "single_jobs": 1_000,
    "drain_jobs": 5_000,
    "drain_jobs_one_loop": 1_000,
    "latency_samples": 200,
    "big_finished": 300_000,
    "big_delayed": 30_000,
    "big_samples": 15,
    "integration_jobs": 500,
}
"""What `--quick` changes: a smoke run of about a minute."""


@dataclass
class Report:
    """Every sample of a run, by metric, and what the run saw around it."""

    config: Config
    samples: dict[str, list[float]] = field(default_factory=dict)
    trace: Trace | None = None
    claim: ClaimTimes | None = None
    foreign: list[int] = field(default_factory=list)
    """Sessions of others found busy on the server, at each check between cases."""
    others: list[float] = field(default_factory=list)
    """The fraction of the machine's CPUs busy, at each check between cases."""
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    seconds: float = 0.0

    def add(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.samples.setdefault(key, []).append(value)

    def median(self, key: str) -> float | None:
        values = self.samples.get(key)
        return statistics.median(values) if values else None

    @property
    def busy(self) -> bool:
        """Whether anything else was seen working on the machine or the server."""
        return was_busy(self.others, self.foreign)

    def check(self, dsn: str) -> None:
        """Note what else runs now (this benchmark is idle between cases)."""
        self.foreign.append(foreign_activity(dsn))
        if not self.config.idle_sample:
            return
        busy = machine_busy(self.config.idle_sample)
        if busy is not None:
            self.others.append(busy)


Case = Callable[[], dict[str, float]]
"""One measurement: runs, and returns its figures by metric name."""


def _rate(key: str, run: Callable[[], float]) -> Case:
    return lambda: {key: run()}


def _through(key: str, run: Callable[[], integrations.Rate]) -> Case:
    def measure() -> dict[str, float]:
        got = run()
        return {key: got.jobs_per_s, f"cpu.{key}": got.cpu_us_per_job}

    return measure


def _drained(key: str, run: Callable[[], Drain]) -> Case:
    def measure() -> dict[str, float]:
        got = run()
        out = {key: got.jobs_per_s}
        if got.cpu_us_per_job is not None:
            out[f"cpu.{key}"] = got.cpu_us_per_job
        return out

    return measure


def _latency(key: str, run: Callable[[], Latency]) -> Case:
    def measure() -> dict[str, float]:
        got = run()
        return {f"{key}.p50": got.p50_ms, f"{key}.p99": got.p99_ms, f"{key}.max": got.max_ms}

    return measure


def cases(config: Config) -> list[tuple[str, Case]]:
    """Every repeated measurement of `config`, as (label, run) in round order."""
    dsn = config.dsn
    found: list[tuple[str, Case]] = []
    if "enqueue" in config.workloads:
        sides: tuple[SingleSide, ...] = ("axa", "raw", "unique", "unique_raw")
        for side in sides:
            found.append(
                (
                    f"enqueue single {side}",
                    _rate(
                        f"enqueue.single.{side}",
                        partial(enqueue_single, dsn, config.single_jobs, side),
                    ),
                )
            )
        methods: tuple[BulkMethod, ...] = (
            "axa",
            "unique",
            "values",
            "copy",
            "unnest",
            "unique_unnest",
        )
        for method in methods:
            found.append(
                (
                    f"enqueue bulk {method}",
                    _rate(
                        f"enqueue.bulk.{method}",
                        partial(enqueue_bulk, dsn, config.bulk_jobs, method),
                    ),
                )
            )
    if "integrations" in config.workloads:
        for kind in integrations.KINDS:
            for mode, batch in (("single", 1), ("batch", config.integration_batch)):
                jobs = config.integration_jobs * (1 if batch == 1 else 10)
                found.append(
                    (
                        f"enqueue through {kind}, {mode}",
                        _through(
                            f"integrations.{kind}.{mode}",
                            partial(enqueue_through, dsn, kind, jobs, batch),
                        ),
                    )
                )
    if "drain" in config.workloads:
        for loops in config.loops:
            jobs = config.drain_jobs_one_loop if loops == 1 else config.drain_jobs
            found.append(
                (
                    f"drain axa 1 x {loops} loops",
                    _drained(f"drain.axa.1x{loops}", partial(drain_axa, dsn, jobs, loops)),
                )
            )
        pl, pf = config.process_loops, config.prefetch
        found.append(
            (
                f"drain axa 1 x {pl} loops, prefetch {pf}",
                _drained(
                    f"drain.axa.1x{pl}p",
                    partial(drain_axa, dsn, config.drain_jobs, pl, 1, pf),
                ),
            )
        )
        found.append(
            (
                f"drain axa 1 x {pl} loops, prefetch {pf}, handler on a held connection",
                _drained(
                    f"drain.axa.1x{pl}ph",
                    partial(drain_axa, dsn, config.drain_jobs, pl, 1, pf, hold=True),
                ),
            )
        )
        # Global limits: one as high as the loops and the jobs claimed ahead, which count
        # as running (it never binds: the gate's cost alone), and one of half the loops
        # (it binds: the drain runs at most that many at once).
        for limit, suffix in ((pl + most_ahead(), "g"), (max(pl // 2, 1), "gh")):
            found.append(
                (
                    f"drain axa 1 x {pl} loops, global limit {limit}",
                    _drained(
                        f"drain.axa.1x{pl}{suffix}",
                        partial(drain_axa, dsn, config.drain_jobs, pl, global_limit=limit),
                    ),
                )
            )
        # A rate limit that never binds (100 claims a millisecond): the gate's and the
        # slots' cost alone.
        found.append(
            (
                f"drain axa 1 x {pl} loops, rate limit {RATE_NOT_BINDING}/ms",
                _drained(
                    f"drain.axa.1x{pl}r",
                    partial(drain_axa, dsn, config.drain_jobs, pl, rate_limit=RATE_NOT_BINDING),
                ),
            )
        )
        # Keys: the jobs spread over 50 keys under a per-key limit (the keyed claim), and
        # the plain drain on tables without migration 15's indexes (what a queue that
        # uses no keys pays for them: nothing else of its path changed).
        found.append(
            (
                f"drain axa 1 x {pl} loops, {BENCH_KEYS} keys, per-key limit {PER_KEY}",
                _drained(
                    f"drain.axa.1x{pl}k",
                    partial(drain_axa, dsn, config.drain_jobs, pl, per_key=PER_KEY),
                ),
            )
        )
        found.append(
            (
                f"drain axa 1 x {pl} loops, without the key indexes",
                _drained(
                    f"drain.axa.1x{pl}n",
                    partial(drain_axa, dsn, config.drain_jobs, pl, without_key_indexes=True),
                ),
            )
        )
        if config.processes > 1:
            key = f"{config.processes}x{config.process_loops}"
            found.append(
                (
                    f"drain axa {config.processes} x {config.process_loops} loops",
                    _drained(
                        f"drain.axa.{key}",
                        partial(
                            drain_axa,
                            dsn,
                            config.drain_jobs,
                            config.process_loops,
                            config.processes,
                        ),
                    ),
                )
            )
        floor_args = (config.floor_connections, config.floor_batch, config.floor_mode)
        found.append(
            (
                "drain floor batch on axa-queue's table",
                _drained(
                    "drain.floor.batch_axa_table",
                    partial(
                        drain_floor, dsn, config.drain_jobs, "batch", *floor_args, axa_table=True
                    ),
                ),
            )
        )
        kinds: tuple[FloorDrain, ...] = ("one", "batch", "fused")
        for kind in kinds:
            found.append(
                (
                    f"drain floor {kind}",
                    _drained(
                        f"drain.floor.{kind}",
                        partial(drain_floor, dsn, config.drain_jobs, kind, *floor_args),
                    ),
                )
            )
    if "peers" in config.workloads:
        for peer in peers.available():
            found.append(
                (
                    f"enqueue bulk {peer}",
                    _rate(
                        f"enqueue.bulk.{peer}",
                        partial(peer_enqueue_bulk, dsn, peer, config.bulk_jobs),
                    ),
                )
            )
            found.append(
                (
                    f"drain {peer}",
                    _rate(f"drain.{peer}", partial(peer_drain, dsn, peer, config.drain_jobs)),
                )
            )
    if "latency" in config.workloads:
        samples = config.latency_samples
        spacing, warmup = config.spacing_ms, config.latency_warmup
        found.append(
            (
                "latency axa",
                _latency(
                    "latency.axa",
                    partial(latency_axa, dsn, samples, spacing_ms=spacing, warmup=warmup),
                ),
            )
        )
        found.append(
            (
                "latency floor",
                _latency(
                    "latency.floor",
                    partial(latency_floor, dsn, samples, spacing_ms=spacing, warmup=warmup),
                ),
            )
        )
    return found


def run_benchmark(config: Config, progress: Callable[[str], None] | None = None) -> Report:
    """Run every case of `config` in `config.repeats` interleaved rounds, then the
    big-table claim once; collect every sample."""
    checkpoints = floor.CHECKPOINTS.set(config.checkpoints)
    try:
        return _run_benchmark(config, progress or (lambda _message: None))
    finally:
        floor.CHECKPOINTS.reset(checkpoints)


def _run_benchmark(config: Config, say: Callable[[str], None]) -> Report:
    report = Report(config, load_before=os.getloadavg())
    t0 = time.perf_counter()
    todo = cases(config)
    if "enqueue" in config.workloads:
        say("enqueue: tracing the wire protocol of single enqueues")
        report.trace = enqueue_trace(config.dsn, config.trace_jobs)
    for round_ in range(1, config.repeats + 1):
        if config.vacuum_catalogs:
            vacuum_catalogs(config.dsn)
        for label, run in todo:
            report.check(config.dsn)
            say(f"round {round_}/{config.repeats}: {label}")
            report.add(run())
    if "bigtable" in config.workloads:
        if config.vacuum_catalogs:
            vacuum_catalogs(config.dsn)
        report.check(config.dsn)
        say(f"big table: {config.big_finished:,} finished and {config.big_delayed:,} delayed rows")
        report.claim = claim_big_table(
            config.dsn,
            config.big_finished,
            config.big_delayed,
            config.big_ready,
            config.big_samples,
            config.big_backlog,
        )
    report.check(config.dsn)
    report.seconds = time.perf_counter() - t0
    report.load_after = os.getloadavg()
    return report


# --- the table -------------------------------------------------------------------------------


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def goals(report: Report) -> list[tuple[str, str, bool | None]]:
    """Each goal of the issue: (goal, what was measured, met?); None when not measured."""
    m = report.median
    c = report.config
    out: list[tuple[str, str, bool | None]] = []

    def goal(text: str, value: float | None, limit: float, above: bool, unit: str = "") -> None:
        if value is None:
            out.append((text, "not measured", None))
            return
        met = value >= limit if above else value < limit
        out.append((text, f"{value:.2f}{unit}", met))

    if report.trace is not None:
        t = report.trace
        out.append(
            (
                "enqueue is one statement, one round trip",
                f"{t.statements} statements, {t.round_trips} round trips / {t.enqueues}",
                t.statements == t.enqueues and t.round_trips == t.enqueues,
            )
        )
    for kind in integrations.KINDS:
        if integrations.BASELINE[kind] == kind:
            continue
        for mode in ("single", "batch"):
            goal(
                f"enqueue through {kind}, {mode}, >= 0.9 x psycopg",
                _ratio(
                    m(f"integrations.{kind}.{mode}"),
                    m(f"integrations.{integrations.BASELINE[kind]}.{mode}"),
                ),
                0.9,
                True,
                "x",
            )
    goal(
        "enqueue_all >= raw multi-row INSERT (ratio >= 1)",
        _ratio(m("enqueue.bulk.axa"), m("enqueue.bulk.values")),
        1.0,
        True,
        "x",
    )
    goal(
        "enqueue_all >= 1.5 x the INSERT of arrays it sent before COPY (raw unnest)",
        _ratio(m("enqueue.bulk.axa"), m("enqueue.bulk.unnest")),
        1.5,
        True,
        "x",
    )
    for peer in peers.PEERS:
        if m(f"enqueue.bulk.{peer}") is not None:
            goal(
                f"enqueue_all above {peer}'s bulk enqueue (ratio > 1)",
                _ratio(m("enqueue.bulk.axa"), m(f"enqueue.bulk.{peer}")),
                1.0 + 1e-9,
                True,
                "x",
            )
    goal(
        f"drain with defaults (1 x {c.process_loops} loops) >= 0.7 x floor (b)",
        _ratio(m(f"drain.axa.1x{c.process_loops}"), m("drain.floor.batch")),
        0.7,
        True,
        "x",
    )
    goal(
        "handler through the pool within 10% of one on a held connection (ratio >= 0.9)",
        _ratio(m(f"drain.axa.1x{c.process_loops}p"), m(f"drain.axa.1x{c.process_loops}ph")),
        0.9,
        True,
        "x",
    )
    # Floor (b)'s workers write each job's row on the connection they hold; so does the
    # handler of the like-for-like drain. Through the queue's pool, each job also pays a
    # pool checkout, in the handler's own code: shown for information.
    goal(
        f"drain 1 x {c.process_loops} loops, prefetch {c.prefetch}, like for like "
        ">= 0.7 x floor (b)",
        _ratio(m(f"drain.axa.1x{c.process_loops}ph"), m("drain.floor.batch")),
        0.7,
        True,
        "x",
    )
    for text, key in (
        ("  the same, handler through the pool (information)", f"1x{c.process_loops}p"),
        (
            f"  the default prefetch ({QueueOptions().prefetch}), through the pool (information)",
            f"1x{c.process_loops}",
        ),
    ):
        ratio = _ratio(m(f"drain.axa.{key}"), m("drain.floor.batch"))
        out.append((text, "not measured" if ratio is None else f"{ratio:.2f}x", None))
    goal(
        f"drain 1 x {c.process_loops} loops, prefetch {c.prefetch}, like for like >= 5,000 jobs/s",
        m(f"drain.axa.1x{c.process_loops}ph"),
        5000.0,
        True,
        " jobs/s",
    )
    pooled = m(f"drain.axa.1x{c.process_loops}p")
    out.append(
        (
            "  the same, handler through the pool (information)",
            "not measured" if pooled is None else f"{pooled:.0f} jobs/s",
            None,
        )
    )
    goal(
        f"{c.processes} processes beat 1 (x {c.process_loops} loops; ratio > 1)",
        _ratio(
            m(f"drain.axa.{c.processes}x{c.process_loops}"), m(f"drain.axa.1x{c.process_loops}")
        ),
        1.0 + 1e-9,
        True,
        "x",
    )
    goal(
        f"keys: {BENCH_KEYS} keys under a per-key limit drain >= 0.8 x as fast as no keys",
        _ratio(m(f"drain.axa.1x{c.process_loops}k"), m(f"drain.axa.1x{c.process_loops}")),
        0.8,
        True,
        "x",
    )
    goal(
        "keys: a queue without keys pays nothing for them (>= 0.97 x the drain without "
        "migration 15's indexes)",
        _ratio(m(f"drain.axa.1x{c.process_loops}"), m(f"drain.axa.1x{c.process_loops}n")),
        0.97,
        True,
        "x",
    )
    goal(
        "latency p50 within 1.3 x the floor's",
        _ratio(m("latency.axa.p50"), m("latency.floor.p50")),
        1.3 + 1e-9,
        False,
        "x",
    )
    goal("latency p99 < 10 ms", m("latency.axa.p99"), 10.0, False, " ms")
    if report.claim is not None:
        for label in (BIG_READY, BIG_IDLE):
            case = report.claim.case(label)
            goal(
                f"claim, {label}: well under 1 ms (database time)",
                None if case is None else case.db_ms,
                1.0,
                False,
                " ms",
            )
    return out


def format_report(report: Report) -> str:
    """The table of medians, ratios and goals."""
    c = report.config
    m = report.median
    lines = [
        f"axa-queue vs raw-SQL floor: medians of {c.repeats} interleaved round(s); "
        f"{os.cpu_count()} CPUs",
        "",
        f"{'workload':<52}{'axa-queue':>12}{'floor':>12}{'ratio':>8}",
    ]

    def row(label: str, axa: float | None, base: float | None, digits: int = 0) -> None:
        ratio = _ratio(axa, base)
        lines.append(
            f"{label:<52}{_fmt(axa, digits):>12}{_fmt(base, digits):>12}"
            f"{_fmt(ratio, 2) if ratio is not None else '-':>8}"
        )

    if "enqueue" in c.workloads:
        lines.append("enqueue (jobs/s)")
        row(
            f"  single, sequential ({c.single_jobs:,}) vs raw INSERT",
            m("enqueue.single.axa"),
            m("enqueue.single.raw"),
        )
        row(
            f"  enqueue_all {c.bulk_jobs:,} vs multi-row INSERT",
            m("enqueue.bulk.axa"),
            m("enqueue.bulk.values"),
        )
        row(
            "  single, sequential, unique keys vs without",
            m("enqueue.single.unique"),
            m("enqueue.single.axa"),
        )
        row(
            f"  enqueue_all {c.bulk_jobs:,}, unique keys vs without",
            m("enqueue.bulk.unique"),
            m("enqueue.bulk.axa"),
        )
        row(
            "  single, unique keys vs raw INSERT ... ON CONFLICT (floor)",
            m("enqueue.single.unique"),
            m("enqueue.single.unique_raw"),
        )
        row(
            "  floor: raw INSERT ... ON CONFLICT vs raw INSERT (information)",
            m("enqueue.single.unique_raw"),
            m("enqueue.single.raw"),
        )
        row(
            f"  enqueue_all {c.bulk_jobs:,}, unique keys vs INSERT unnest ON CONFLICT (floor)",
            m("enqueue.bulk.unique"),
            m("enqueue.bulk.unique_unnest"),
        )
        row(
            f"  enqueue_all {c.bulk_jobs:,} vs COPY (information)",
            m("enqueue.bulk.axa"),
            m("enqueue.bulk.copy"),
        )
        row(
            f"  enqueue_all {c.bulk_jobs:,} vs INSERT unnest (information)",
            m("enqueue.bulk.axa"),
            m("enqueue.bulk.unnest"),
        )
        if report.trace is not None:
            t = report.trace
            lines.append(
                f"  wire trace of {t.enqueues} enqueues: {t.statements} statements, "
                f"{t.round_trips} round trips"
            )
    if "integrations" in c.workloads:
        lines.append(
            "enqueue through each integration (jobs/s; floor: psycopg's connection, sync for "
            "sync kinds, async for async ones)"
        )
        for kind in integrations.KINDS:
            for mode in ("single", "batch"):
                size = c.integration_jobs if mode == "single" else c.integration_jobs * 10
                how = (
                    f"one by one ({size:,})"
                    if mode == "single"
                    else (f"enqueue_all_on {c.integration_batch} ({size:,})")
                )
                row(
                    f"  {kind}, {how}",
                    m(f"integrations.{kind}.{mode}"),
                    m(f"integrations.{integrations.BASELINE[kind]}.{mode}"),
                )
        lines.append(
            "  client CPU per job (microseconds; the integration's own cost, which other "
            "work moves little)"
        )
        for kind in integrations.KINDS:
            for mode in ("single", "batch"):
                row(
                    f"  {kind}, {mode}",
                    m(f"cpu.integrations.{kind}.{mode}"),
                    m(f"cpu.integrations.{integrations.BASELINE[kind]}.{mode}"),
                    1,
                )
    if "drain" in c.workloads:
        lines.append(f"drain (jobs/s; floor: {c.floor_connections} connections, {c.floor_mode})")
        base = m("drain.floor.batch")
        for loops in c.loops:
            jobs = c.drain_jobs_one_loop if loops == 1 else c.drain_jobs
            row(
                f"  axa 1 process x {loops} loops ({jobs:,}) vs floor (b)",
                m(f"drain.axa.1x{loops}"),
                base,
            )
        row(
            f"  axa 1 process x {c.process_loops} loops, prefetch {c.prefetch} vs floor (b)",
            m(f"drain.axa.1x{c.process_loops}p"),
            base,
        )
        row(
            f"  axa 1 x {c.process_loops}, prefetch {c.prefetch}, like for like vs (b)",
            m(f"drain.axa.1x{c.process_loops}ph"),
            base,
        )
        row(
            f"  axa 1 x {c.process_loops}, global limit {c.process_loops + most_ahead()} vs no limit",
            m(f"drain.axa.1x{c.process_loops}g"),
            m(f"drain.axa.1x{c.process_loops}"),
        )
        row(
            f"  axa 1 x {c.process_loops}, global limit {max(c.process_loops // 2, 1)} vs no limit",
            m(f"drain.axa.1x{c.process_loops}gh"),
            m(f"drain.axa.1x{c.process_loops}"),
        )
        row(
            f"  axa 1 x {c.process_loops}, rate limit not binding vs no limit",
            m(f"drain.axa.1x{c.process_loops}r"),
            m(f"drain.axa.1x{c.process_loops}"),
        )
        row(
            f"  axa 1 x {c.process_loops}, {BENCH_KEYS} keys, per-key limit {PER_KEY} vs no keys",
            m(f"drain.axa.1x{c.process_loops}k"),
            m(f"drain.axa.1x{c.process_loops}"),
        )
        row(
            f"  axa 1 x {c.process_loops}, no keys vs no keys without the key indexes",
            m(f"drain.axa.1x{c.process_loops}"),
            m(f"drain.axa.1x{c.process_loops}n"),
        )
        if c.processes > 1:
            row(
                f"  axa {c.processes} processes x {c.process_loops} loops vs floor (b)",
                m(f"drain.axa.{c.processes}x{c.process_loops}"),
                base,
            )
            row(
                f"  axa {c.processes} x {c.process_loops} vs 1 x {c.process_loops} loops",
                m(f"drain.axa.{c.processes}x{c.process_loops}"),
                m(f"drain.axa.1x{c.process_loops}"),
            )
        axa10 = m(f"drain.axa.1x{c.process_loops}")
        row("  floor (a) claim one, 3 statements per job", axa10, m("drain.floor.one"))
        row(f"  floor (b) claim {c.floor_batch}, a statement per job", axa10, base)
        row(
            f"  floor fused: claim {c.floor_batch}, finish in 1 (information)",
            axa10,
            m("drain.floor.fused"),
        )
        row(
            "  floor (b) on axa-queue's own table (information)",
            axa10,
            m("drain.floor.batch_axa_table"),
        )
        lines.append(
            f"  (the last four rows: axa-queue 1 x {c.process_loops} loops against each floor)"
        )
        if m("cpu.drain.floor.batch") is not None:
            lines.append("drain CPU per job (microseconds of CPU, whole machine, while timed)")
            cpu_b = m("cpu.drain.floor.batch")
            for loops in c.loops:
                row(
                    f"  axa 1 process x {loops} loops vs floor (b)",
                    m(f"cpu.drain.axa.1x{loops}"),
                    cpu_b,
                )
            if c.processes > 1:
                row(
                    f"  axa {c.processes} processes x {c.process_loops} loops vs floor (b)",
                    m(f"cpu.drain.axa.{c.processes}x{c.process_loops}"),
                    cpu_b,
                )
            cpu10 = m(f"cpu.drain.axa.1x{c.process_loops}")
            row(f"  axa 1 x {c.process_loops} loops vs floor (a)", cpu10, m("cpu.drain.floor.one"))
            row(
                f"  axa 1 x {c.process_loops} loops vs floor fused",
                cpu10,
                m("cpu.drain.floor.fused"),
            )
            row(
                f"  axa 1 x {c.process_loops} loops vs floor (b) on axa-queue's table",
                cpu10,
                m("cpu.drain.floor.batch_axa_table"),
            )
    if "peers" in c.workloads and any(m(f"drain.{peer}") for peer in peers.PEERS):
        lines.append("peers, same jobs, same run (jobs/s; ratio: axa-queue / the peer)")
        for peer in peers.PEERS:
            row(
                f"  enqueue_all {c.bulk_jobs:,} vs {peer}'s bulk enqueue",
                m("enqueue.bulk.axa"),
                m(f"enqueue.bulk.{peer}"),
            )
        for peer in peers.PEERS:
            row(
                f"  axa 1 x {c.process_loops} loops (defaults) vs {peer} drain",
                m(f"drain.axa.1x{c.process_loops}"),
                m(f"drain.{peer}"),
            )
        for peer in peers.PEERS:
            row(
                f"  {peer} drain vs floor (b) (information)",
                m(f"drain.{peer}"),
                m("drain.floor.batch"),
            )
    if "latency" in c.workloads:
        lines.append(
            f"latency enqueue -> start (ms; {c.latency_samples} samples, {c.spacing_ms:g} ms apart)"
        )
        row("  p50 vs LISTEN/NOTIFY floor", m("latency.axa.p50"), m("latency.floor.p50"), 3)
        row("  p99 vs LISTEN/NOTIFY floor", m("latency.axa.p99"), m("latency.floor.p99"), 3)
        row("  max vs LISTEN/NOTIFY floor", m("latency.axa.max"), m("latency.floor.max"), 3)
    if report.claim is not None:
        k = report.claim
        lines.append(
            f"claim on a big table (ms; {k.finished:,} finished and {k.delayed:,} delayed "
            "rows; floor: the crate's one-row claim)"
        )
        for case in k.cases:
            note = f"{k.ready:,} ready, " if case.label == BIG_READY else ""
            if case.label in (BIG_FOREIGN, BIG_LIMITED):
                note = f"{k.backlog:,} older, information; "
            if case.label == BIG_BACKLOG:
                note = f"{k.backlog:,}, own table, information; "
            row(f"  db time, {case.label} ({note}median)", case.db_ms, case.crate_db_ms, 3)
            if case.client_ms is not None:
                row(
                    f"  as the library sends it, {case.label} (round trip)", case.client_ms, None, 3
                )
    lines += ["", "goals"]
    for text, value, met in goals(report):
        verdict = "-" if met is None else ("met" if met else "NOT MET")
        lines.append(f"  {text:<56}{value:>28}  {verdict}")
    lines += [
        "",
        f"total {report.seconds:.0f} s; load average (1, 5, 15 min) "
        f"{' '.join(f'{x:.2f}' for x in report.load_before)} before, "
        f"{' '.join(f'{x:.2f}' for x in report.load_after)} after",
    ]
    if report.others:
        lines.append(
            f"the machine was {max(report.others):.0%} busy at most, "
            f"{statistics.median(report.others):.0%} at the median, "
            f"in {len(report.others)} checks between cases"
        )
    if report.busy:
        seen = sum(1 for f in report.foreign if f)
        hot = sum(1 for x in report.others if x > BUSY_LIMIT)
        lines.append(
            f"BUSY: something else was working (other sessions on the server at {seen}, "
            f"the machine over {BUSY_LIMIT:.0%} busy at {hot} of {len(report.others)} checks "
            "between cases): the figures may be spoiled; run again (--wait-idle waits first)"
        )
    return "\n".join(lines)


# --- the command line ------------------------------------------------------------------------


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the table (and, with --json, write every sample)."""
    parser = argparse.ArgumentParser(description="axa-queue against a raw-SQL floor, side by side.")
    d = Config()
    parser.add_argument("--dsn", default=d.dsn)
    parser.add_argument("--quick", action="store_true", help="a smoke run of about a minute")
    parser.add_argument("--repeats", type=int, help=f"interleaved rounds (default {d.repeats})")
    parser.add_argument(
        "--single-jobs", type=int, help=f"sequential enqueues (default {d.single_jobs})"
    )
    parser.add_argument(
        "--bulk-jobs", type=int, help=f"jobs per enqueue_all (default {d.bulk_jobs})"
    )
    parser.add_argument("--drain-jobs", type=int, help=f"jobs per drain (default {d.drain_jobs})")
    parser.add_argument(
        "--drain-jobs-one-loop",
        type=int,
        help=f"jobs per 1-loop drain (default {d.drain_jobs_one_loop})",
    )
    parser.add_argument("--loops", help="loop counts of one process, e.g. 1,10,50")
    parser.add_argument(
        "--processes",
        type=int,
        help=f"processes of the multi-process drain (default {d.processes})",
    )
    parser.add_argument(
        "--prefetch",
        type=int,
        help=f"jobs claimed ahead in the prefetch drains (default {d.prefetch})",
    )
    parser.add_argument("--floor-mode", choices=["asyncio", "threads"], help="the floor's workers")
    parser.add_argument("--latency-samples", type=int, help=f"default {d.latency_samples}")
    parser.add_argument(
        "--spacing-ms", type=float, help=f"gap between enqueues (default {d.spacing_ms})"
    )
    parser.add_argument("--big-finished", type=int, help=f"default {d.big_finished}")
    parser.add_argument("--big-delayed", type=int, help=f"default {d.big_delayed}")
    parser.add_argument(
        "--big-backlog", type=int, help=f"0 leaves out the backlog states (default {d.big_backlog})"
    )
    parser.add_argument(
        "--only",
        help="comma-separated workloads: enqueue, integrations, drain, latency, bigtable, peers",
    )
    parser.add_argument("--plans", action="store_true", help="print the claim's plans")
    parser.add_argument(
        "--no-vacuum-catalogs",
        dest="vacuum_catalogs",
        action="store_false",
        help="do not VACUUM the system catalogs the schemas churn before each round",
    )
    parser.add_argument(
        "--wait-idle",
        action="store_true",
        help="first wait (up to 10 minutes) until the machine is idle",
    )
    parser.add_argument("--json", metavar="PATH", help="write every sample as JSON")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)

    changes: dict[str, Any] = dict(QUICK) if args.quick else {}
    for name in (
        "repeats",
        "single_jobs",
        "bulk_jobs",
        "drain_jobs",
        "drain_jobs_one_loop",
        "processes",
        "prefetch",
        "floor_mode",
        "latency_samples",
        "spacing_ms",
        "big_finished",
        "big_delayed",
        "big_backlog",
    ):
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    if args.loops:
        changes["loops"] = _ints(args.loops)
    if args.only:
        wanted = tuple(part.strip() for part in args.only.split(",") if part.strip())
        unknown = set(wanted) - set(d.workloads)
        if unknown:
            parser.error(f"unknown workload(s): {', '.join(sorted(unknown))}")
        changes["workloads"] = wanted
    config = dataclasses.replace(d, dsn=args.dsn, vacuum_catalogs=args.vacuum_catalogs, **changes)
    t0 = time.perf_counter()

    def progress(message: str) -> None:
        if not args.quiet:
            print(f"[{time.perf_counter() - t0:6.1f}s] {message}", file=sys.stderr, flush=True)

    progress(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.wait_idle and not wait_until_idle(say=progress):
        progress("the machine did not become idle; running anyway")
    report = run_benchmark(config, progress)
    print(format_report(report))
    if args.plans and report.claim is not None:
        for name, plan in report.claim.plans.items():
            print(f"\n-- {name}\n{plan}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "config": dataclasses.asdict(config) | {"dsn": "(not written)"},
                    "samples": report.samples,
                    "trace": None if report.trace is None else dataclasses.asdict(report.trace),
                    "claim": None if report.claim is None else dataclasses.asdict(report.claim),
                    "foreign": report.foreign,
                    "others": report.others,
                    "load_before": report.load_before,
                    "load_after": report.load_after,
                    "seconds": report.seconds,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
