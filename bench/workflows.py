"""Workflows' cost: a chord of N parents and one callback against N plain jobs, drained
by one process, in interleaved rounds, the order rotated each round (medians).

    python bench/workflows.py --dsn postgresql://root@127.0.0.1:5432/postgres
    python bench/workflows.py --dsn ... --jobs 10000 --rounds 3 --loops 10
    python bench/workflows.py --work   # each job writes its row, as bench/run.py's drain

Both sides queue their jobs untimed (the chord in one statement: `chord(group([...]),
callback)`), ANALYZE, then time a worker draining them with no-op handlers, from the
start of `run` to the last ending observed (the chord's: its callback's). With `--work`,
each handler writes its job's id to a table of the round's schema on the connection its
run is lent (`queue.pool.connection()`), the work of `bench/run.py`'s drain; without
it, handlers do nothing, where the release's cost weighs most. The figure is
jobs a second; the ratio is the chord's over the plain jobs'. Each round works in a
schema of its own, dropped afterwards.

Before each round it vacuums the catalogs its schemas churn (`bench/run.py`'s
`vacuum_catalogs`, as autovacuum would, which this machine's server has off).

On a shared, noisy machine the wall-clock figure moves by tens of percent between runs;
when the server runs on this machine (its `/proc` readable), each round also reports the
CPU seconds its backends spent (utime + stime of every backend serving this process,
found by its client port, read before `run` and at the last ending; a backend opened
by `run` counts from its start),
as microseconds of server CPU a job: the chord's extra per job is the release's cost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

from axa_queue import JobContext, NewJob, Queue, QueueOptions, chord, group

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import run as bench  # noqa: E402  (bench/run.py, beside this file)

JOB = "bench.noop"
BENCH_DONE = "CREATE TABLE {}.bench_done (job_id UUID PRIMARY KEY)"
DONE = "INSERT INTO bench_done (job_id) VALUES (%s)"
"""What a job does with `--work`: its id written once (a second run would fail)."""


def _own_ports() -> set[int]:
    """The local TCP ports of this process's sockets (its connections to the server)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as lines:
                for line in list(lines)[1:]:
                    fields = line.split()
                    if fields[9] in inodes:
                        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        except OSError:
            continue
    return ports


def _backend_cpu(dsn: str) -> dict[int, float] | None:
    """CPU seconds (user + system) spent so far by each backend serving this process, by
    process id, or None when the server's processes cannot be read from here."""
    ports = _own_ports()
    with psycopg.connect(dsn, autocommit=True) as conn:
        pids = [
            row[0]
            for row in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s)", (list(ports),)
            )
        ]
    spent: dict[int, float] = {}
    try:
        for pid in pids:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            spent[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return None
    return spent


async def _drain(
    dsn: str, jobs: int, loops: int, as_chord: bool, work: bool = False
) -> tuple[float, float | None]:
    """Jobs a second, and server CPU microseconds a job (None when unreadable): `jobs`
    jobs (and, as a chord, one callback after them), no-op or, with `work`, each
    writing its id to `bench_done`."""
    schema = f"bench_wf_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE SCHEMA {}").format(pgsql.Identifier(schema)))
        conn.execute(pgsql.SQL(BENCH_DONE).format(pgsql.Identifier(schema)))
    inner = make_conninfo(dsn, options=f"-c search_path={schema}", application_name=schema)
    try:
        queue = Queue(inner, QueueOptions(workers=loops))

        async def noop(args: dict[str, Any]) -> None:
            return None

        async def writes(args: dict[str, Any], job: JobContext) -> None:
            async with queue.pool.connection() as conn:
                await conn.execute(DONE, (job.id,))

        queue.handle(JOB, writes if work else noop)

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
                bench.floor.checkpoint(conn)
            stop = asyncio.Event()
            spent: list[dict[int, float] | None] = []
            ended = 0
            last = 0.0

            def seen(_name: str, outcome: str, _seconds: float) -> None:
                nonlocal ended, last
                ended += 1
                if ended >= total:
                    last = time.monotonic()
                    spent.append(_backend_cpu(dsn))  # before `run` closes its connections
                    stop.set()

            queue.observe(seen)
            cpu0 = _backend_cpu(dsn)
            t0 = time.monotonic()
            await asyncio.wait_for(queue.run(stop), 600)
            cpu1 = spent[0] if spent else None
            # Each backend alive at the end, less what it had spent before the run (a
            # backend closed during the run is not counted: the pool keeps its own).
            cpu = (
                None
                if cpu0 is None or cpu1 is None
                else sum(v - cpu0.get(pid, 0.0) for pid, v in cpu1.items()) / total * 1e6
            )
            return total / (last - t0), cpu
        finally:
            await queue.close()
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                pgsql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pgsql.Identifier(schema))
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/postgres")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loops", type=int, default=10)
    parser.add_argument(
        "--work", action="store_true", help="each job writes its row (bench/run.py's drain)"
    )
    given = parser.parse_args(argv)
    plain: list[float] = []
    chords: list[float] = []
    ratios: list[float] = []
    plain_cpu: list[float] = []
    chord_cpu: list[float] = []
    side = (given.dsn, given.jobs, given.loops)
    for at in range(given.rounds):
        # Each drain makes and drops a schema: with autovacuum off, the catalogs' dead
        # rows would pile up and slow every later round (a run late in a day of
        # benchmarks read 0.79 where the same tree read 0.81 after a VACUUM of them).
        bench.vacuum_catalogs(given.dsn)
        # Rotated: plain first in even rounds, the chord first in odd ones, so neither
        # side always meets the machine's load (or a warm cache) first.
        if at % 2 == 0:
            p_rate, p_cpu = asyncio.run(_drain(*side, False, given.work))
            c_rate, c_cpu = asyncio.run(_drain(*side, True, given.work))
        else:
            c_rate, c_cpu = asyncio.run(_drain(*side, True, given.work))
            p_rate, p_cpu = asyncio.run(_drain(*side, False, given.work))
        plain.append(p_rate)
        chords.append(c_rate)
        ratios.append(c_rate / p_rate)
        if p_cpu is not None and c_cpu is not None:
            plain_cpu.append(p_cpu)
            chord_cpu.append(c_cpu)
    p, c = statistics.median(plain), statistics.median(chords)
    print(f"plain jobs: {p:,.0f} jobs/s  (rounds: {', '.join(f'{x:,.0f}' for x in plain)})")
    print(f"chord:      {c:,.0f} jobs/s  (rounds: {', '.join(f'{x:,.0f}' for x in chords)})")
    print(f"chord / plain: {c / p:.2f}  (per round: {', '.join(f'{x:.2f}' for x in ratios)})")
    if plain_cpu:
        pc, cc = statistics.median(plain_cpu), statistics.median(chord_cpu)
        print(
            f"server CPU a job: plain {pc:.0f} us, chord {cc:.0f} us (plain / chord {pc / cc:.2f})"
        )


if __name__ == "__main__":
    main()
