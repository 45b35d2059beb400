"""The exchange statement's own time: one `sql.EXCHANGE` that records the completions of
the jobs the last one claimed and claims `--claim` more, sent again and again (prepared,
with the workers' session settings) on a table of `--jobs` queued jobs, the median of
its round trips. With `--without`, the same statement alternates between two such
tables, the second without the named triggers (and indexes: `ix:NAME`), so their cost
per statement is read in one run:

    python bench/exchange.py --dsn postgresql://root@127.0.0.1:5432/test
    python bench/exchange.py --without axa_queue_release,axa_queue_blocked_rule
    python bench/exchange.py --without ix:axa_queue_pick_hash --rounds 100

`--without ''` alternates two identical tables: the null control, which says how far
the two sides differ by chance. docs/performance.md has the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from contextlib import ExitStack
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import dict_row

import run
from axa_queue import sql as axa_sql

JOB = "noop"
PER_ROUND = 5
"""Statements per side in each round; the sides alternate round by round."""


def _fill(dsn: str, jobs: int) -> None:
    async def fill() -> None:
        queue = run.bench_queue(dsn, 10)
        async with queue:
            await run.queue_jobs(queue, jobs)

    asyncio.run(fill())


def _strip(conn: psycopg.Connection[Any], names: list[str]) -> None:
    """Drop the triggers (and `ix:` indexes) `names` of this schema's `axa_queue`."""
    for name in names:
        if name.startswith("ix:"):
            conn.execute(pgsql.SQL("DROP INDEX {}").format(pgsql.Identifier(name[3:])))
        else:
            conn.execute(pgsql.SQL("DROP TRIGGER {} ON axa_queue").format(pgsql.Identifier(name)))


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/postgres")
    parser.add_argument("--jobs", type=int, default=40_000, help="queued jobs in each table")
    parser.add_argument("--claim", type=int, default=50, help="jobs each statement claims")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument(
        "--without", help="triggers (and ix:indexes) the second table has not, comma-separated"
    )
    given = parser.parse_args(argv)
    sides = ["as made"] if given.without is None else ["as made", "without"]
    stripped = [one for one in (given.without or "").split(",") if one]
    params = run.claim_params(given.claim, [JOB], [given.claim])
    times: dict[str, list[float]] = {side: [] for side in sides}
    with ExitStack() as stack:
        conns: dict[str, psycopg.Connection[Any]] = {}
        claimed: dict[str, list[tuple[str, int]]] = {}
        for side in sides:
            dsn = stack.enter_context(run.scratch_schema(given.dsn))
            run.setup_tables(dsn)
            _fill(dsn, given.jobs)
            conn = stack.enter_context(psycopg.connect(dsn, autocommit=True))
            if side == "without":
                _strip(conn, stripped)
            conn.execute("ANALYZE axa_queue")
            conn.execute(axa_sql.SESSION_SETTINGS)
            conns[side], claimed[side] = conn, []
        for at in range(given.rounds):
            for side in sides if at % 2 == 0 else list(reversed(sides)):
                cursor = conns[side].cursor(row_factory=dict_row)
                for _ in range(PER_ROUND):
                    sent = dict(params)
                    done = claimed[side]
                    if done:
                        sent["completed"] = "{" + ",".join(i for i, _ in done) + "}"
                        sent["completed_attempts"] = "{" + ",".join(str(a) for _, a in done) + "}"
                    start = time.perf_counter()
                    rows = cursor.execute(axa_sql.EXCHANGE, sent, prepare=True).fetchall()
                    took = time.perf_counter() - start
                    if at >= 2:  # the first rounds plan and warm the caches
                        times[side].append(took)
                    claimed[side] = [
                        (str(row["id"]), int(row["attempts"])) for row in rows if row["name"]
                    ]
    medians = {side: statistics.median(values) * 1000 for side, values in times.items()}
    for side, median in medians.items():
        print(f"{side:<8} {median:.3f} ms a statement ({len(times[side])} statements)")
    if len(medians) == 2:
        print(f"difference {medians['as made'] - medians['without']:+.3f} ms")
    return medians


if __name__ == "__main__":
    main()
