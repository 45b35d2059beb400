"""Reads at 10 million rows: what `counts`, `counts_by_name`, `jobs` and the dashboard's
pages cost with 10,000,000 finished jobs in the history and 1,000,000 ready ones
(`docs/performance.md`, "Reads at 10 million rows", has the figures).

It makes a database of its own (`bench_bigreads_<pid>`, dropped at the end unless
`--keep`), sets the queue's tables up with the library (`Queue.open`), makes the
history's day partitions with the library's statement (`sql.HISTORY_DAYS`), loads the
history (`--history` rows spread over the last ten days, a few names, mostly completed, some
failed and cancelled) and `axa_queue` (`--ready` ready jobs queued over the last hour, a
few delayed, running, in review and just finished), in chunks of `INSERT ... SELECT
generate_series`, then vacuums and analyzes each table and each day partition as
autovacuum would (the server's is off here; no server setting is changed).

Then it times each read as a caller sends it: the public API (`Queue.counts`,
`counts_by_name`, `jobs`) and the dashboard's pages through starlette's `TestClient`
(`/`, `/live`, `/names`, `/jobs?state=...`, `/failed`, `/jobs/{id}` of a moved job):
the median and first of `--runs` runs, and, for one more run, every statement it sent,
`EXPLAIN (ANALYZE, BUFFERS)` of it prepared as the queue's connections prepare it
(generic plans forced): the buffers they touched, summed.

    python bench/bigreads.py                                  # 10M + 1M: ~10 minutes, ~4 GB
    python bench/bigreads.py --history 20000 --ready 2000     # a quick look
    python bench/bigreads.py --keep                           # keep the database...
    python bench/bigreads.py --database bench_bigreads_123    # ...and time it again (no load)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from axa_queue import Queue, QueueOptions, history, sql
from axa_queue.db import calls

NAMES = ("email.send", "report.build", "image.resize", "webhook.post")
"""The job names of the generated rows (a few, as most queues have)."""

DAYS = 10
"""Days of history the finished rows are spread over."""

CHUNK = 500_000
"""Rows per `INSERT ... SELECT`: each its own transaction."""

DEFAULT_DSN = "postgresql://root@127.0.0.1:5432/test"


@dataclass(frozen=True)
class Timed:
    """One read's times (milliseconds) and what its statements touched."""

    read: str
    median: float
    first: float
    statements: int
    buffers: int | None
    """Shared buffers hit and read by its statements (None: a statement could not be
    explained)."""
    plan_ms: float


@contextmanager
def database(dsn: str, name: str | None, keep: bool) -> Iterator[tuple[str, bool]]:
    """A database of its own (made and, unless `keep`, dropped), or `name` as it is;
    yields a DSN to it and whether it was made now."""
    made = name is None
    name = name or f"bench_bigreads_{os.getpid()}"
    if made:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    try:
        yield make_conninfo(dsn, dbname=name), made
    finally:
        if made and not keep:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    pgsql.SQL("DROP DATABASE {} WITH (FORCE)").format(pgsql.Identifier(name))
                )


def chunks(total: int) -> Iterator[tuple[int, int]]:
    """(first, last) row numbers of each chunk of `total`."""
    for first in range(1, total + 1, CHUNK):
        yield first, min(first + CHUNK - 1, total)


def load(dsn: str, finished: int, ready: int, say: Callable[[str], None]) -> None:
    """Set the tables up with the library and fill them (see the module's docstring)."""

    async def setup() -> None:
        queue = Queue(dsn, QueueOptions(pool_size=1))
        await queue.open()
        await queue.close()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            # The days this loads the history with: housekeeping makes only those of the
            # finished jobs left in `axa_queue` (none here), with the same statement.
            await conn.execute(
                sql.HISTORY_DAYS,
                {
                    "now": None,
                    "first_day": datetime.now(timezone.utc).date() - timedelta(days=DAYS + 1),
                    "ahead": history.AHEAD_DAYS,
                },
            )

    asyncio.run(setup())
    names = list(NAMES)
    with psycopg.connect(dsn, autocommit=True) as conn:
        started = time.perf_counter()
        for first, last in chunks(finished):
            # Row i finished at now - DAYS days * (1 - i / n) - 5 minutes: oldest first.
            conn.execute(
                """INSERT INTO axa_queue_history (id, name, args, status, error, run_at,
                       started_at, created_at, updated_at, attempts, priority, given_back, moved_at)
                   SELECT gen_random_uuid(), (%(names)s::text[])[1 + i %% 4], '{"n": 1}'::jsonb,
                       CASE WHEN i %% 100 < 96 THEN 'completed'
                            WHEN i %% 100 < 99 THEN 'failed' ELSE 'cancelled' END,
                       CASE WHEN i %% 100 BETWEEN 96 AND 98 THEN 'boom' END,
                       t - interval '2 seconds', t - interval '1 second', t - interval '2 seconds',
                       t, 1, 0, 0, t + interval '1 minute'
                   FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i,
                        LATERAL (SELECT now() - interval '5 minutes'
                                 - interval '1 day' * %(days)s * (1 - i::float8 / %(n)s)) AS x(t)""",
                {"names": names, "first": first, "last": last, "n": finished, "days": DAYS},
            )
            say(f"  history {last:,} rows ({time.perf_counter() - started:.0f} s)")
        for first, last in chunks(ready):
            conn.execute(
                """INSERT INTO axa_queue (id, name, args, run_at, created_at, updated_at)
                   SELECT gen_random_uuid(), (%(names)s::text[])[1 + i %% 4], '{"n": 1}'::jsonb,
                       t, t, t
                   FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i,
                        LATERAL (SELECT now() - interval '1 second'
                                 - interval '1 hour' * (1 - i::float8 / %(n)s)) AS x(t)""",
                {"names": names, "first": first, "last": last, "n": ready},
            )
            say(f"  ready {last:,} rows ({time.perf_counter() - started:.0f} s)")
        conn.execute(
            """INSERT INTO axa_queue (id, name, args, status, attempts, started_at, run_at,
                   created_at, updated_at, error)
               SELECT gen_random_uuid(), (%(names)s::text[])[1 + i %% 4], '{}'::jsonb,
                   s, CASE WHEN s = 'queued' THEN 0 ELSE 1 END,
                   CASE WHEN s <> 'queued' THEN now() - interval '10 seconds' END,
                   CASE WHEN s = 'queued' THEN now() + interval '1 hour' ELSE now() - interval '20 seconds' END,
                   now() - interval '20 seconds', now() - interval '10 seconds',
                   CASE WHEN s = 'failed' THEN 'boom' END
               FROM generate_series(1, 2000) AS i,
                    LATERAL (SELECT CASE WHEN i <= 1000 THEN 'queued'      -- delayed
                                         WHEN i <= 1100 THEN 'running'
                                         WHEN i <= 1120 THEN 'needs_review'
                                         WHEN i <= 1980 THEN 'completed'
                                         ELSE 'failed' END) AS y(s)""",
            {"names": names},
        )
        say(f"loaded in {time.perf_counter() - started:.0f} s; vacuuming")
        vacuum(conn)
        say(f"loaded and vacuumed in {time.perf_counter() - started:.0f} s")


def vacuum(conn: psycopg.Connection[Any]) -> None:
    """VACUUM (ANALYZE) each table and each day partition, as autovacuum would (which
    never analyzes a partitioned table itself, only its partitions)."""
    parts = [
        row[0]
        for row in conn.execute(
            "SELECT inhrelid::regclass::text FROM pg_inherits "
            "WHERE inhparent = 'axa_queue_history'::regclass ORDER BY 1"
        )
    ]
    for table in ["axa_queue", *parts]:
        conn.execute(pgsql.SQL("VACUUM (ANALYZE) {}").format(pgsql.Identifier(table)))


# --- Explaining what a read sends -------------------------------------------------------


class Recorder:
    """Keeps every call sent on an async connection while `on` (the queue's reads and
    the dashboard's go through `calls.send_async`)."""

    def __init__(self) -> None:
        self.on = False
        self.sent: list[calls.Call[Any]] = []
        self.original = calls.send_async

        async def send(conn: psycopg.AsyncConnection[Any], call: calls.Call[Any]) -> Any:
            if self.on:
                self.sent.append(call)
            return await self.original(conn, call)

        calls.send_async = send  # type: ignore[assignment]

    def close(self) -> None:
        calls.send_async = self.original  # type: ignore[assignment]


def prepared(query: str, params: Any) -> tuple[str, list[Any]]:
    """`query` with `$n` for psycopg's placeholders, and the values in their order."""
    values: list[Any] = []
    if isinstance(params, dict):
        order: list[str] = []

        def number(found: re.Match[str]) -> str:
            if found.group(1) not in order:
                order.append(found.group(1))
                values.append(params[found.group(1)])
            return f"${order.index(found.group(1)) + 1}"

        text = re.sub(r"%\((\w+)\)s", number, query)
    else:
        values = list(params or ())
        count = iter(range(1, len(values) + 1))
        text = re.sub(r"(?<!%)%s", lambda _m: f"${next(count)}", query)
    return text.replace("%%", "%"), values


def explain(conn: psycopg.Connection[Any], call: calls.Call[Any]) -> tuple[int, float] | None:
    """Shared buffers and execution milliseconds of `call`, prepared and run under
    `EXPLAIN (ANALYZE, BUFFERS)` (an estimate, itself an `EXPLAIN`, touches none)."""
    if call.query.lstrip().upper().startswith("EXPLAIN"):
        return 0, 0.0
    text, values = prepared(call.query, call.params)
    try:
        conn.execute(pgsql.SQL("PREPARE bench_read AS {}").format(pgsql.SQL(text)))  # type: ignore[arg-type]
    except psycopg.Error as error:
        print(f"    (could not prepare {call.query.split()[:4]}: {error})", file=sys.stderr)
        return None
    try:
        args = pgsql.SQL(", ").join(pgsql.Literal(v) for v in values)
        statement = (
            pgsql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE bench_read({})").format(args)
            if values
            else pgsql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE bench_read")
        )
        row = conn.execute(statement).fetchone()
    except psycopg.Error as error:
        print(f"    (could not explain {call.query.split()[:4]}: {error})", file=sys.stderr)
        return None
    finally:
        conn.execute("DEALLOCATE bench_read")
    assert row is not None
    plan = row[0][0]
    top = plan["Plan"]
    return int(top["Shared Hit Blocks"] + top["Shared Read Blocks"]), float(plan["Execution Time"])


# --- The reads ------------------------------------------------------------------------------


def moved_job(dsn: str) -> str:
    """A job of the history's middle day."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT id FROM axa_queue_history WHERE updated_at < now() - interval '5 days' "
            "ORDER BY updated_at DESC LIMIT 1"
        ).fetchone()
    assert row is not None
    return str(row[0])


def measure(dsn: str, runs: int, say: Callable[[str], None]) -> list[Timed]:
    """Time every read (see the module's docstring)."""
    from starlette.testclient import TestClient

    from axa_queue.web import create_app

    recorder = Recorder()
    found: list[Timed] = []
    explainer = psycopg.connect(dsn, autocommit=True, prepare_threshold=None)
    explainer.execute(sql.SESSION_SETTINGS)

    def timed(read: str, once: Callable[[], Any]) -> None:
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            once()
            times.append((time.perf_counter() - started) * 1000)
        recorder.sent.clear()
        recorder.on = True
        try:
            once()
        finally:
            recorder.on = False
        sent = list(recorder.sent)
        explained = [explain(explainer, call) for call in sent]
        buffers = None if None in explained else sum(e[0] for e in explained if e)
        plan_ms = sum(e[1] for e in explained if e)
        one = Timed(read, statistics.median(times), times[0], len(sent), buffers, plan_ms)
        found.append(one)
        say(row_of(one))

    job = moved_job(dsn)
    loop = asyncio.new_event_loop()
    queue = Queue(dsn, QueueOptions(pool_size=2))
    try:
        loop.run_until_complete(queue.open(setup=False))
        timed("counts()", lambda: loop.run_until_complete(queue.counts()))
        timed("counts_by_name()", lambda: loop.run_until_complete(queue.counts_by_name()))
        timed("jobs()", lambda: loop.run_until_complete(queue.jobs()))
        timed("jobs(state=completed)", lambda: loop.run_until_complete(queue.jobs("completed")))
        timed("jobs(state=failed)", lambda: loop.run_until_complete(queue.jobs("failed")))
        timed("jobs(state=queued)", lambda: loop.run_until_complete(queue.jobs("queued")))
        timed("jobs(name=...)", lambda: loop.run_until_complete(queue.jobs(name=NAMES[1])))
        timed("job(moved id)", lambda: loop.run_until_complete(queue.job(job)))
    finally:
        loop.run_until_complete(queue.close())
        loop.close()

    app = create_app(dsn, trust_header="X-User", trusted_proxies=["127.0.0.1"])
    with TestClient(app, client=("127.0.0.1", 5000), headers={"X-User": "bench"}) as web:

        def page(path: str) -> Callable[[], Any]:
            def get() -> None:
                answer = web.get(path)
                assert answer.status_code == 200, (path, answer.status_code)

            return get

        started = time.perf_counter()
        page("/")()  # the first fills the charts' day of history: timed apart
        say(
            f"  (the first overview, filling a day of charts: {(time.perf_counter() - started) * 1000:.0f} ms)"
        )
        for path in (
            "/",
            "/live",
            "/names",
            "/jobs?state=completed",
            "/jobs?state=queued",
            "/failed",
            f"/jobs/{job}",
        ):
            timed(path if not path.startswith("/jobs/") else "/jobs/{moved id}", page(path))
    recorder.close()
    explainer.close()
    return found


def row_of(one: Timed) -> str:
    buffers = "?" if one.buffers is None else f"{one.buffers:,}"
    return (
        f"{one.read:<26} {one.median:>10.1f} {one.first:>10.1f} {one.statements:>5} "
        f"{buffers:>11} {one.plan_ms:>10.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("DATABASE_URL", DEFAULT_DSN))
    parser.add_argument("--history", type=int, default=10_000_000)
    parser.add_argument("--ready", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the database made")
    parser.add_argument("--database", help="time this database, loaded before (no load)")
    parser.add_argument("--setup", action="store_true", help="with --database: migrate it first")
    given = parser.parse_args(argv)

    def say(text: str) -> None:
        print(text, flush=True)

    base = conninfo_to_dict(given.dsn)
    with database(given.dsn, given.database, given.keep) as (dsn, made):
        say(f"database {conninfo_to_dict(dsn)['dbname']} on {base.get('host', 'localhost')}")
        if made:
            load(dsn, given.history, given.ready, say)
        elif given.setup:
            started = time.perf_counter()
            asyncio.run(_setup(dsn))
            say(f"migrated in {time.perf_counter() - started:.0f} s")
        with psycopg.connect(dsn) as conn:
            sizes = conn.execute(
                "SELECT (SELECT count(*) FROM pg_inherits WHERE inhparent = 'axa_queue_history'::regclass),"
                " pg_size_pretty(pg_database_size(current_database()))"
            ).fetchone()
        assert sizes is not None
        say(f"{sizes[0]} day partitions, database {sizes[1]}; {given.runs} runs each")
        say(
            f"{'read':<26} {'median ms':>10} {'first ms':>10} {'stmts':>5} {'buffers':>11} {'exec ms':>10}"
        )
        measure(dsn, given.runs, say)
    return 0


async def _setup(dsn: str) -> None:
    queue = Queue(dsn, QueueOptions(pool_size=1))
    await queue.open()
    await queue.close()


if __name__ == "__main__":
    sys.exit(main())
