"""The dashboard's database time, next to a big table: what each page's statements cost
with 1M finished and 100k queued rows (`docs/performance.md` has the figures).

It makes a schema of its own on `--dsn`, sets the queue's tables up, fills them with
`generate_series` (finished jobs spread over the last day, queued ones over the last
hour, a few running and in review, acts, workers, schedules), vacuums and analyzes, and
then times every statement a page sends as the dashboard sends it: on a connection
with the queue's session settings (generic plans forced, JIT off), prepared. It prints
the median and worst of `--samples` runs per statement and per page, and drops the
schema afterwards.

    python bench/web.py --dsn postgresql://postgres@127.0.0.1:5432/postgres
    python bench/web.py --dsn ... --finished 10000 --queued 1000   # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

from axa_queue import Queue, sql
from axa_queue.jobs.reads import gone_params

NAMES = 10
"""Job names in the generated rows."""


@dataclass(frozen=True)
class Timed:
    """One statement's times over the samples, in milliseconds."""

    page: str
    what: str
    median: float
    worst: float


@contextmanager
def schema_on(dsn: str) -> Iterator[str]:
    """A schema of its own on `dsn`, dropped afterwards; yields a DSN resolving to it."""
    name = f"bench_web_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE SCHEMA {}").format(pgsql.Identifier(name)))
    try:
        yield make_conninfo(dsn, options=f"-c search_path={name}")
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP SCHEMA {} CASCADE").format(pgsql.Identifier(name)))


def fill(dsn: str, finished: int, queued: int) -> None:
    """Set the tables up and fill them (generate_series, one statement each)."""

    async def setup() -> None:
        queue = Queue(dsn)
        await queue.open()
        await queue.close()

    asyncio.run(setup())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO axa_queue (id, name, args, status, attempts, error, run_at,
                   started_at, created_at, updated_at)
               SELECT gen_random_uuid(), 'job.' || (i %% %(names)s), '{"secret": 1}'::jsonb,
                   CASE WHEN i %% 100 < 95 THEN 'completed'
                        WHEN i %% 100 < 99 THEN 'failed' ELSE 'cancelled' END,
                   1, CASE WHEN i %% 100 BETWEEN 95 AND 98 THEN 'boom' END,
                   t - interval '2 seconds', t - interval '1 second', t - interval '2 seconds', t
               FROM generate_series(1, %(n)s) AS i,
                    LATERAL (SELECT now() - interval '1 day' * (i::float8 / %(n)s)) AS x(t)""",
            {"n": finished, "names": NAMES},
        )
        conn.execute(
            """INSERT INTO axa_queue (id, name, args, run_at, created_at, updated_at)
               SELECT gen_random_uuid(), 'job.' || (i %% %(names)s), '{}'::jsonb, t, t, t
               FROM generate_series(1, %(n)s) AS i,
                    LATERAL (SELECT now() - interval '1 hour' * (i::float8 / %(n)s)) AS x(t)""",
            {"n": queued, "names": NAMES},
        )
        conn.execute(
            """INSERT INTO axa_queue (id, name, args, status, attempts, started_at)
               SELECT gen_random_uuid(), 'job.' || (i %% %(names)s), '{}'::jsonb,
                   CASE WHEN i %% 2 = 0 THEN 'running' ELSE 'needs_review' END, 1, now()
               FROM generate_series(1, 200) AS i""",
            {"names": NAMES},
        )
        conn.execute(
            """INSERT INTO axa_job_acts (job_id, job_name, act, attempts, by, reason)
               SELECT gen_random_uuid(), 'job.1', 'retried', 1,
                   'person' || (i % 20), 'INC-' || i
               FROM generate_series(1, 10000) AS i"""
        )
        conn.execute(
            """INSERT INTO axa_workers (id, host, pid, names, loops, version)
               SELECT gen_random_uuid(), 'host' || i, i, '{job.1,job.2}', 10, 'bench'
               FROM generate_series(1, 20) AS i"""
        )
        conn.execute(
            """INSERT INTO axa_schedule (name, due_at, interval_ms)
               SELECT 'schedule.' || i, now(), 60000 FROM generate_series(1, 20) AS i"""
        )
        conn.execute("VACUUM ANALYZE axa_queue")
        conn.execute("VACUUM ANALYZE axa_job_acts")


def statements(conn: psycopg.Connection[Any], finished: int) -> list[tuple[str, str, str, Any]]:
    """(page, what, statement, parameters) for every statement the pages send."""
    row = conn.execute(
        "SELECT id, to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US') "
        "FROM axa_queue WHERE status = 'completed' ORDER BY updated_at LIMIT 1 OFFSET %s",
        (finished // 2,),
    ).fetchone()
    assert row is not None
    deep_id, deep_key = str(row[0]), row[1]
    row = conn.execute("SELECT id FROM axa_queue WHERE status = 'failed' LIMIT 1").fetchone()
    assert row is not None
    job = row[0]
    now = time.time()
    minute = int(now // 60 * 60)
    gone = gone_params()  # whether a running job's worker process is gone

    def page_of(
        state: str, name: str | None = None, key: str | None = None, after: str | None = None
    ) -> dict[str, Any]:
        return {"state": state, "name": name, "key": key, "after": after, "limit": 51, **gone}

    return [
        (
            "overview (every refresh)",
            "live counts per name, capped",
            sql.WEB_LIVE_COUNTS,
            {"now": None, "cap": 10_000},
        ),
        ("overview (every refresh)", "estimate of ready jobs", sql.WEB_ESTIMATE_READY, None),
        ("overview (every refresh)", "estimate of delayed jobs", sql.WEB_ESTIMATE_WAITING, None),
        (
            "overview (every refresh)",
            "finished, last two minutes",
            sql.WEB_FINISHED_PER_MINUTE,
            {"since": minute - 60, "until": None},
        ),
        (
            "overview (every refresh)",
            "finished, 10 past minutes (backfill)",
            sql.WEB_FINISHED_PER_MINUTE,
            {"since": minute - 660, "until": minute - 60},
        ),
        ("jobs", "queued, newest first", sql.WEB_JOBS_NEWEST, page_of("queued")),
        ("jobs", "queued, oldest first", sql.WEB_JOBS_OLDEST, page_of("queued")),
        (
            "jobs",
            "queued of one name, oldest first",
            sql.WEB_JOBS_OLDEST,
            page_of("queued", "job.3"),
        ),
        ("jobs", "completed, newest first", sql.WEB_JOBS_NEWEST, page_of("completed")),
        (
            "jobs",
            "completed, half-way deep",
            sql.WEB_JOBS_NEWEST,
            page_of("completed", None, deep_key, deep_id),
        ),
        (
            "jobs",
            "completed of one name, half-way deep",
            sql.WEB_JOBS_NEWEST,
            page_of("completed", "job.3", deep_key, deep_id),
        ),
        ("jobs", "cancelled (1 in 100), newest first", sql.WEB_JOBS_NEWEST, page_of("cancelled")),
        ("failed", "failed, newest first", sql.WEB_JOBS_NEWEST, page_of("failed")),
        ("needs review", "in review, newest first", sql.WEB_JOBS_NEWEST, page_of("needs_review")),
        ("job", "the job", sql.JOB, {"id": job, **gone}),
        ("job", "its acts", sql.ACTS, (job,)),
        ("schedules", "schedules", sql.SCHEDULES, None),
        ("workers", "workers", sql.WORKERS, {"now": None}),
        (
            "acts",
            "acts log, newest first",
            sql.WEB_ACTS,
            {"by": None, "act": None, "before": None, "limit": 50},
        ),
        (
            "acts",
            "acts log of one person",
            sql.WEB_ACTS,
            {"by": "person7", "act": None, "before": None, "limit": 50},
        ),
    ]


def measure(dsn: str, samples: int, finished: int) -> list[Timed]:
    found: list[Timed] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SESSION_SETTINGS)
        for page, what, statement, params in statements(conn, finished):
            times = []
            for _ in range(samples + 5):  # the first runs prepare it, as a pool's would
                started = time.perf_counter()
                conn.execute(statement, params, prepare=True).fetchall()
                times.append((time.perf_counter() - started) * 1000)
            kept = times[5:]
            found.append(Timed(page, what, statistics.median(kept), max(kept)))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=20)
    given = parser.parse_args(argv)
    with schema_on(given.dsn) as dsn:
        started = time.perf_counter()
        fill(dsn, given.finished, given.queued)
        print(
            f"filled {given.finished:,} finished and {given.queued:,} queued rows "
            f"in {time.perf_counter() - started:.0f} s; {given.samples} samples each"
        )
        print(f"{'page':<30} {'statement':<38} {'median ms':>10} {'worst ms':>9}")
        found = measure(dsn, given.samples, given.finished)
        for one in found:
            print(f"{one.page:<30} {one.what:<38} {one.median:>10.2f} {one.worst:>9.2f}")
        print("\nper page (what one request sends: the sum of its statements' medians)")
        pages: dict[str, float] = {}
        for one in found:
            if one.page != "jobs":  # the jobs page sends one of its statements
                pages[one.page] = pages.get(one.page, 0.0) + one.median
        pages["jobs (the slowest of its pages)"] = max(
            one.median for one in found if one.page == "jobs"
        )
        for page, total in pages.items():
            print(f"{page:<40} {total:>8.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
