"""Workflows' cost: a chord of N parents and one callback against N plain jobs, drained
by one process, in interleaved rounds (medians).

    python bench/workflows.py --dsn postgresql://root@127.0.0.1:5432/postgres
    python bench/workflows.py --dsn ... --jobs 10000 --rounds 3 --loops 10

Both sides queue their jobs untimed (the chord in one statement: `chord(group([...]),
callback)`), ANALYZE, then time a worker draining them with no-op handlers, from the
start of `run` to the last ending observed (the chord's: its callback's). The figure is
jobs a second; the ratio is the chord's over the plain jobs'. Each round works in a
schema of its own, dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

from axa_queue import NewJob, Queue, QueueOptions, chord, group

JOB = "bench.noop"


async def _drain(dsn: str, jobs: int, loops: int, as_chord: bool) -> float:
    """Jobs a second: `jobs` no-op jobs (and, as a chord, one callback after them)."""
    schema = f"bench_wf_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE SCHEMA {}").format(pgsql.Identifier(schema)))
    inner = make_conninfo(dsn, options=f"-c search_path={schema}", application_name=schema)
    try:
        queue = Queue(inner, QueueOptions(workers=loops))

        @queue.handler(JOB)
        async def noop(args: dict[str, Any]) -> None:
            return None

        await queue.open()
        try:
            parts = [NewJob(JOB, {"n": n}) for n in range(jobs)]
            if as_chord:
                await queue.enqueue(chord(group(parts), NewJob(JOB, {"n": -1})))
            else:
                for start in range(0, jobs, 10_000):
                    await queue.enqueue_all(parts[start : start + 10_000])
            total = jobs + (1 if as_chord else 0)
            with psycopg.connect(inner, autocommit=True) as conn:
                conn.execute("ANALYZE axa_queue")
                conn.execute("CHECKPOINT")
            stop = asyncio.Event()
            ended = 0
            last = 0.0

            def seen(_name: str, outcome: str, _seconds: float) -> None:
                nonlocal ended, last
                ended += 1
                if ended >= total:
                    last = time.monotonic()
                    stop.set()

            queue.observe(seen)
            t0 = time.monotonic()
            await asyncio.wait_for(queue.run(stop), 600)
            return total / (last - t0)
        finally:
            await queue.close()
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                pgsql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pgsql.Identifier(schema))
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/postgres")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loops", type=int, default=10)
    given = parser.parse_args()
    plain: list[float] = []
    chords: list[float] = []
    for _ in range(given.rounds):
        plain.append(asyncio.run(_drain(given.dsn, given.jobs, given.loops, False)))
        chords.append(asyncio.run(_drain(given.dsn, given.jobs, given.loops, True)))
    p, c = statistics.median(plain), statistics.median(chords)
    print(f"plain jobs: {p:,.0f} jobs/s  (rounds: {', '.join(f'{x:,.0f}' for x in plain)})")
    print(f"chord:      {c:,.0f} jobs/s  (rounds: {', '.join(f'{x:,.0f}' for x in chords)})")
    print(f"chord / plain: {c / p:.2f}")


if __name__ == "__main__":
    main()
