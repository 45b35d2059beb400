"""Sustained load: axa-queue's real workers, then the raw-SQL floor's, at one fixed rate.

    python bench/soak.py --dsn postgresql://root@127.0.0.1:5432/test --quick   # ~5 minutes
    python bench/soak.py --dsn postgresql://root@127.0.0.1:5432/test \\
        --rate 1000 --minutes 30 --hold 12.5:17.5 --json soak.json          # ~65 minutes

Each side runs in a database of its own, made and dropped by the run (`--no-database`:
a schema of `--dsn`'s database; but another session's snapshot in a shared database
holds back vacuum too), for the same time at the same rate, with the same hold:

- **a producer**, a process of its own, queues jobs at `--rate` jobs/s for the run's
  length (`enqueue_all_on` on one connection for axa-queue; the floor's INSERT of
  arrays and a NOTIFY in one transaction), each batch holding the jobs due by then,
  each job carrying the time it was sent;
- **the workers**, `--workers` processes of `--loops` each: for axa-queue the command
  line, `python -m axa_queue.cli worker soak_worker:queue --workers LOOPS --no-setup`
  (`axa-queue worker`, the library's default options); for the floor, processes of
  connections claiming with `bench/floor.py`'s batch claim (`bench/soak_worker.py`);
- **a held snapshot** (`--hold FROM:TO`): at FROM a connection opens a REPEATABLE READ
  transaction, runs a report query (`SELECT count(*) FROM axa_queue`), then sits idle
  until TO, holding back what vacuum may remove, as a long report would;
- **autovacuum** as the server would run it when the server's is off
  (`bench/autovacuum.py`: its naptime, thresholds, the tables' own settings, its cost
  limits), for the schema's tables only; a server whose autovacuum is on does its own;
- **a sample** every `--sample-every` seconds, half a second after its window ends
  (so the runs of its window have committed): jobs/s and enqueue-to-start p50/p99 of
  the runs that started in it; the claim's database time and buffers (hit + read) from
  `EXPLAIN (ANALYZE, BUFFERS, TIMING OFF)` of the statement as the workers send it --
  axa-queue's `sql.CLAIM` PREPAREd with the library's session settings (generic plan),
  the floor's batch claim PREPAREd as psycopg prepares it -- in a transaction rolled
  back (the median of `--claim-samples`; a job it took and gave back is announced
  again, so the workers do not wait for their poll); the sizes of `axa_queue` and of
  its indexes; its dead rows and vacuums and analyzes so far; whether the snapshot was
  held; the CPU share others used, and sessions of others busy on the server.
- At the end, once every job has run: the workers stop (SIGTERM, as an operator stops
  them) and every job is checked to have run exactly once (`bench_done` has a primary
  key; its count must be the jobs queued, each completed on its first attempt).

Enqueue to start: the producer notes `time.monotonic()` just before it sends a batch,
into each job's arguments; the handler notes it again as its run starts and writes
the difference. Both are CLOCK_MONOTONIC, one clock for every process of one machine
(not per process) that is never stepped, so the difference is sound across processes;
the producer, the workers and this process are all started here, on one machine. (The
database's `clock_timestamp()` would also be one clock, but the handler could only
read it a round trip after its start.)

The summary compares the last `--window` seconds (5 minutes; a quarter of a shorter
run) with the first, the end of the hold with the time before it (the minute before
each, or half the hold if shorter), and the hot table's size at the end of the run
with its size before the hold. Other work on the machine spoils the figures: a run
whose samples saw it is marked BUSY (the rule of `bench/run.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from axa_queue import SETUP_STATEMENTS, NewJob, enqueue_all_on
from axa_queue import sql as axa_sql

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import autovacuum  # noqa: E402  (bench/autovacuum.py, beside this file)
import floor  # noqa: E402  (bench/floor.py)
import run as bench  # noqa: E402  (bench/run.py)
import soak_worker  # noqa: E402  (bench/soak_worker.py)

SIDES = {"axa": "axa-queue", "floor": "floor"}
SETTLE = 0.5
"""Seconds a sample waits after its window, for the runs started in it to commit."""
NEAR = 60.0
"""Seconds before the hold, and at its end, that the hold's figures are taken over."""
HOLD_QUERY = "SELECT count(*) AS jobs FROM axa_queue"
EXPLAIN = "EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) "
WAKE = "SELECT pg_notify(%s, %s)"

WINDOW = """SELECT count(*) AS jobs,
       percentile_disc(0.5) WITHIN GROUP (ORDER BY waited_ms) AS p50,
       percentile_disc(0.99) WITHIN GROUP (ORDER BY waited_ms) AS p99
    FROM bench_done WHERE started >= %s AND started < %s"""
"""The runs that started in a window of `time.monotonic()`, and their waits."""
TABLE = """SELECT pg_relation_size(s.relid) AS bytes, s.n_dead_tup AS dead,
       s.vacuum_count + s.autovacuum_count AS vacuums,
       s.analyze_count + s.autoanalyze_count AS analyzes
    FROM pg_stat_user_tables s WHERE s.relid = 'axa_queue'::regclass"""
INDEXES = """SELECT c.relname AS name, pg_relation_size(c.oid) AS bytes
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    WHERE i.indrelid = 'axa_queue'::regclass ORDER BY c.relname"""
OURS = """SELECT pid FROM pg_stat_activity
    WHERE application_name = %s OR backend_type <> 'client backend'"""
"""Server processes working for this run: its sessions, and the server's own (WAL
writer, checkpointer...), which mostly write what it makes."""
DONE_COUNT = "SELECT count(*) AS jobs FROM bench_done"
SNAPSHOTS = """SELECT COALESCE(max(EXTRACT(EPOCH FROM now() - xact_start)), 0)::float8 AS seconds
    FROM pg_stat_activity
    WHERE datname = current_database() AND backend_xmin IS NOT NULL
      AND application_name IS DISTINCT FROM %s AND pid <> pg_backend_pid()"""
"""How long the oldest transaction of another session holding a snapshot in this
database has been open: vacuum removes no row that it may still see, in any schema."""


# --- what one run does -----------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    dsn: str = bench.DEFAULT_DSN
    rate: float = 500.0
    """Jobs queued a second."""
    seconds: float = 1800.0
    workers: int = 2
    """Worker processes."""
    loops: int = 10
    """Loops (axa-queue) or connections (floor) of each worker process."""
    hold: tuple[float, float] | None = None
    """Seconds into the run when the snapshot is taken and let go."""
    floor: bool = True
    sample_every: float = 5.0
    window: float = 300.0
    """Seconds of the first and last windows compared (a quarter of a shorter run)."""
    naptime: float | None = None
    """The emulated autovacuum's naptime; None: the server's."""
    floor_batch: int = 10
    """Jobs the floor claims at most per statement."""
    claim_samples: int = 3
    database: bool = True
    """Each side in a database of its own (made and dropped by the run), so no other
    session's snapshot holds back its vacuum; else in a schema of `dsn`'s database."""


QUICK: dict[str, Any] = {"rate": 200.0, "seconds": 120.0, "hold": (40.0, 80.0), "naptime": 15.0}
"""What `--quick` changes: two minutes a side, the snapshot held in the middle third,
and autovacuum's naptime 15 s (so it runs in so short a run)."""


def moment(text: str) -> float:
    """Seconds of `12.5` or `12.5m` (minutes) or `750s`."""
    text = text.strip().lower()
    if text.endswith("s"):
        return float(text[:-1])
    return float(text.removesuffix("m")) * 60


def hold_of(text: str) -> tuple[float, float]:
    """`FROM:TO` (minutes, or with `s` seconds) as seconds into the run."""
    start, colon, end = text.partition(":")
    if not colon:
        raise ValueError(f"expected FROM:TO like 12.5:17.5 or 40s:80s, got {text!r}")
    began, ended = moment(start), moment(end)
    if not 0 <= began < ended:
        raise ValueError(f"the hold must start before it ends, at 0 or later: {text!r}")
    return began, ended


# --- the producer ----------------------------------------------------------------------------


def _produce(dsn: str, side: str, channel: str, rate: float, seconds: float, pipe: Pipe) -> None:
    """Queue `rate` x `seconds` jobs from the time the parent sends, each batch the jobs
    due by then; send back how many, and how late the latest was sent (s)."""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            cur = conn.cursor()
            notify = pgsql.SQL("NOTIFY {}").format(pgsql.Identifier(channel))
            pipe.send("ready")
            start = float(pipe.recv())
            total = int(rate * seconds)
            sent = 0
            late = 0.0
            while sent < total:
                now = time.monotonic()
                due_at = start + sent / rate
                if now < due_at:
                    time.sleep(due_at - now)
                    continue
                late = max(late, now - due_at)
                keys = [
                    uuid.uuid4() for _ in range(min(total, int((now - start) * rate) + 1) - sent)
                ]
                t = time.monotonic()
                if side == "axa":
                    jobs = [NewJob(soak_worker.JOB, {"k": str(key), "t": t}) for key in keys]
                    enqueue_all_on(conn, jobs)
                else:
                    with conn.transaction():
                        cur.execute(
                            floor.INSERT_UNNEST,
                            (keys, [soak_worker.JOB] * len(keys), [Jsonb({"t": t})] * len(keys)),
                        )
                        cur.execute(notify)
                sent += len(keys)
        pipe.send((sent, late))
    except BaseException as error:  # reported to the parent, which raises
        pipe.send(f"{type(error).__name__}: {error}")
    finally:
        pipe.close()


class Producer:
    """The producer process, started early (spawning is slow) and released by `go`."""

    def __init__(self, dsn: str, side: str, channel: str, rate: float, seconds: float) -> None:
        self.pipe, theirs = bench.SPAWN.Pipe()
        self.process = bench.SPAWN.Process(
            target=_produce, args=(dsn, side, channel, rate, seconds, theirs), daemon=True
        )
        self.process.start()
        theirs.close()
        if not self.pipe.poll(60):
            raise RuntimeError("the producer did not start")
        got = self.pipe.recv()
        if got != "ready":
            raise RuntimeError(f"the producer failed: {got}")

    def go(self, start: float) -> None:
        self.pipe.send(start)

    def result(self, timeout: float) -> tuple[int, float]:
        if not self.pipe.poll(timeout):
            raise TimeoutError("the producer did not finish")
        got = self.pipe.recv()
        if isinstance(got, str):
            raise RuntimeError(f"the producer failed: {got}")
        return int(got[0]), float(got[1])

    def close(self) -> None:
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


# --- the workers -----------------------------------------------------------------------------


class Workers:
    """The side's worker processes: `axa-queue worker` commands, or the floor's."""

    def __init__(self, side: str, dsn: str, schema: str, config: Config) -> None:
        self.side = side
        self.dsn = dsn
        self.count = config.workers
        self.logs: list[Any] = []
        self.commands: list[subprocess.Popen[bytes]] = []
        self.floors: list[Any] = []
        self.ready = bench.SPAWN.Semaphore(0)
        self.stopping = bench.SPAWN.Event()
        if side == "axa":
            # The worker's own settings only: none of the caller's AXA_QUEUE_* variables.
            env = {k: v for k, v in os.environ.items() if not k.startswith("AXA_QUEUE_")}
            command = [
                sys.executable, "-m", "axa_queue.cli", "worker", "soak_worker:queue",
                "--workers", str(config.loops), "--no-setup", "--log-level", "warning",
                "--dsn", dsn,
            ]  # fmt: skip
            for _ in range(config.workers):
                log = tempfile.TemporaryFile()  # noqa: SIM115  (closed by stop)
                self.logs.append(log)
                self.commands.append(
                    subprocess.Popen(command, cwd=HERE, env=env, stdout=log, stderr=log)
                )
        else:
            for _ in range(config.workers):
                process = bench.SPAWN.Process(
                    target=soak_worker.floor_process,
                    args=(
                        dsn,
                        floor.channel(schema),
                        config.loops,
                        config.floor_batch,
                        self.ready,
                        self.stopping,
                    ),
                    daemon=True,
                )
                process.start()
                self.floors.append(process)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.commands] + [p.pid for p in self.floors if p.pid]

    def wait_ready(self, timeout: float = 60.0) -> None:
        if self.side == "axa":
            try:
                asyncio.run(bench.listening(self.dsn, axa_sql.LISTEN, timeout, self.count))
            except TimeoutError:
                self.check()
                raise
        else:
            deadline = time.monotonic() + timeout
            for _ in range(self.count):
                while not self.ready.acquire(timeout=0.2):
                    self.check()
                    if time.monotonic() > deadline:
                        raise TimeoutError("the floor's workers did not start")

    def check(self) -> None:
        """Raise if a worker process has ended (with what it wrote, for axa-queue)."""
        for command, log in zip(self.commands, self.logs, strict=True):
            if command.poll() is not None:
                log.seek(0)
                tail = log.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"a worker exited with {command.returncode}:\n{tail}")
        for process in self.floors:
            if process.exitcode is not None:
                raise RuntimeError(f"a floor worker exited with {process.exitcode}")

    def stop(self) -> list[int]:
        """Stop every worker as an operator would (SIGTERM); their exit statuses."""
        self.stopping.set()
        for command in self.commands:
            if command.poll() is None:
                command.terminate()
        codes = []
        for command in self.commands:
            try:
                codes.append(command.wait(30))
            except subprocess.TimeoutExpired:
                command.kill()
                codes.append(command.wait())
        for process in self.floors:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join()
            codes.append(process.exitcode or 0)
        for log in self.logs:
            log.close()
        self.logs = []
        self.commands = []
        self.floors = []
        return codes


# --- the held snapshot -----------------------------------------------------------------------


class Hold:
    """A REPEATABLE READ transaction that ran a query at `start` and sits idle until
    `end` (monotonic times), in a thread."""

    def __init__(self, dsn: str, start: float, end: float) -> None:
        self.dsn = dsn
        self.start = start
        self.end = end
        self.held: tuple[float, float] | None = None
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._hold, name="hold", daemon=True)
        self._thread.start()

    def _hold(self) -> None:
        try:
            if self._stop.wait(max(self.start - time.monotonic(), 0)):
                return
            with psycopg.connect(self.dsn) as conn:
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                conn.execute(HOLD_QUERY).fetchone()
                began = time.monotonic()
                self._stop.wait(max(self.end - time.monotonic(), 0))
                conn.rollback()
                self.held = (began, time.monotonic())
        except psycopg.Error as error:
            self.error = f"{type(error).__name__}: {error}"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# --- the claim, as the workers send it -------------------------------------------------------


class ClaimProbe:
    """The side's claim, PREPAREd on a connection of its own, EXPLAINed on demand."""

    def __init__(self, side: str, dsn: str, schema: str, config: Config) -> None:
        self.samples = config.claim_samples
        self.conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=None)
        if side == "axa":
            self.conn.execute(axa_sql.SESSION_SETTINGS)
            self.conn.execute(axa_sql.CLAIM_SETTINGS)  # as the exchange connection plans
            bench.prepare_claim(self.conn, axa_sql.CLAIM)
            free = config.loops
            params = bench.claim_params(free, [soak_worker.JOB], [free])
            self.explain = pgsql.SQL(EXPLAIN) + bench.claim_execute(params)
            self.wake = ("axa_queue", f"{schema} 0")  # the trigger's channel and payload
        else:
            self.conn.execute("SET jit = off")
            self.conn.execute(
                pgsql.SQL("PREPARE bench_claim(int) AS {}").format(
                    pgsql.SQL(bench.numbered(floor.CLAIM_BATCH_ARGS, ["batch"]))
                )
            )
            self.explain = pgsql.SQL(EXPLAIN + "EXECUTE bench_claim({})").format(
                pgsql.Literal(config.floor_batch)
            )
            self.wake = (floor.channel(schema), "")

    def measure(self) -> tuple[float, int]:
        """The claim's execution time (ms) and buffers (shared hit + read), medians."""
        times: list[float] = []
        buffers: list[int] = []
        for _ in range(self.samples):
            with self.conn.transaction(force_rollback=True):
                row = self.conn.execute(self.explain).fetchone()
            assert row is not None
            plan = row[0][0]
            top = plan["Plan"]
            times.append(float(plan["Execution Time"]))
            buffers.append(int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"]))
            if top["Actual Rows"]:
                self.conn.execute(WAKE, self.wake)
        return statistics.median(times), int(statistics.median(buffers))

    def close(self) -> None:
        self.conn.close()


# --- others' CPU use -------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` so far (/proc), None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Others:
    """The share of the machine's CPUs used by others between two calls: all busy
    time (/proc/stat) but this run's processes' and the server processes' working for
    it (their /proc/<pid>/stat)."""

    def __init__(self) -> None:
        self.machine = floor.machine_busy_seconds()
        self.ours: dict[int, float] = {}
        self.at = time.monotonic()

    def share(self, pids: Sequence[int]) -> float | None:
        machine = floor.machine_busy_seconds()
        now = time.monotonic()
        ours = 0.0
        seen: dict[int, float] = {}
        for pid in set(pids):
            spent = _cpu_seconds(pid)
            if spent is not None:
                seen[pid] = spent
                ours += spent - self.ours.get(pid, 0.0 if self.ours else spent)
        share = None
        if machine is not None and self.machine is not None and now > self.at:
            others = (machine - self.machine) - ours
            share = max(others, 0.0) / (now - self.at) / (os.cpu_count() or 1)
        self.machine, self.ours, self.at = machine, seen, now
        return share


# --- samples and windows ---------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One window of a run, `at` seconds into it (its end)."""

    at: float
    jobs: int
    """Runs that started in the window."""
    per_s: float
    p50_ms: float | None
    p99_ms: float | None
    claim_ms: float
    claim_buffers: int
    table_bytes: int
    index_bytes: int
    dead: int
    vacuums: int
    """Vacuums of `axa_queue` so far (by anyone: the emulation, or the server's)."""
    analyzes: int
    held: bool
    """Whether the snapshot was held during any of the window."""
    others: float | None
    foreign: int
    """Sessions of others busy on the server."""
    snapshot_s: float
    """Seconds the oldest snapshot of another session in this database had been held."""
    indexes: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Window:
    """The runs that started between `start` and `end` seconds into the run, and the
    claim samples taken in it (medians)."""

    start: float
    end: float
    jobs: int
    p50_ms: float | None
    p99_ms: float | None
    claim_ms: float | None
    claim_buffers: float | None


@dataclass
class SideRun:
    """Everything one side's run saw."""

    side: str
    seconds: float
    samples: list[Sample] = field(default_factory=list)
    windows: dict[str, Window] = field(default_factory=dict)
    sizes: dict[str, int | None] = field(default_factory=dict)
    """`axa_queue` and its indexes (bytes): before the hold, at its end, at the run's end."""
    enqueued: int = 0
    late_s: float = 0.0
    """The latest a job was sent after it was due (s): the producer kept the rate if small."""
    drained_s: float = 0.0
    """Seconds from the end of the load until every job had run."""
    exactly_once: str | None = None
    """None when every job ran exactly once, else what was wrong."""
    worker_exits: list[int] = field(default_factory=list)
    vacuum: str = ""
    """Who vacuumed: the emulation (and with which naptime) or the server."""
    vacuum_runs: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    held: tuple[float, float] | None = None
    """When the snapshot was really held (s into the run)."""


class Sampler:
    """Takes the samples of one side's run, on a connection of its own."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        probe: ClaimProbe,
        config: Config,
        pids: Callable[[], list[int]],
    ) -> None:
        self.dsn = dsn
        self.schema = schema
        self.probe = probe
        self.config = config
        self.pids = pids
        self.conn: psycopg.Connection[dict[str, Any]] = psycopg.connect(
            dsn, autocommit=True, row_factory=dict_row
        )
        self.others = Others()
        self.t0 = 0.0

    def take(self, start: float, end: float) -> Sample:
        """The sample of the window from `start` to `end` (monotonic times)."""
        window = self.conn.execute(WINDOW, (start, end)).fetchone()
        assert window is not None
        claim_ms, claim_buffers = self.probe.measure()
        table = self.conn.execute(TABLE).fetchone()
        assert table is not None
        indexes = {row["name"]: int(row["bytes"]) for row in self.conn.execute(INDEXES)}
        ours = [row["pid"] for row in self.conn.execute(OURS, (self.schema,))]
        snapshot = self.conn.execute(SNAPSHOTS, (self.schema,)).fetchone()
        assert snapshot is not None
        hold = self.config.hold
        t0 = self.t0
        return Sample(
            at=round(end - t0, 3),
            jobs=int(window["jobs"]),
            per_s=int(window["jobs"]) / (end - start),
            p50_ms=window["p50"],
            p99_ms=window["p99"],
            claim_ms=claim_ms,
            claim_buffers=claim_buffers,
            table_bytes=int(table["bytes"]),
            index_bytes=sum(indexes.values()),
            dead=int(table["dead"]),
            vacuums=int(table["vacuums"]),
            analyzes=int(table["analyzes"]),
            held=hold is not None and t0 + hold[0] < end and t0 + hold[1] > start,
            others=self.others.share([os.getpid(), *self.pids(), *ours]),
            foreign=bench.foreign_activity(self.dsn, ours=self.schema),
            snapshot_s=float(snapshot["seconds"]),
            indexes=indexes,
        )

    def done(self) -> int:
        row = self.conn.execute(DONE_COUNT).fetchone()
        return int(row["jobs"]) if row else 0

    def window(self, start: float, end: float, samples: list[Sample]) -> Window:
        """The runs that started from `start` to `end` s into the run, and the claim
        samples in it."""
        row = self.conn.execute(WINDOW, (self.t0 + start, self.t0 + end)).fetchone()
        assert row is not None
        inside = [s for s in samples if start < s.at <= end + 1e-6]
        return Window(
            start,
            end,
            int(row["jobs"]),
            row["p50"],
            row["p99"],
            statistics.median(s.claim_ms for s in inside) if inside else None,
            statistics.median(s.claim_buffers for s in inside) if inside else None,
        )

    def summarize(self, result: SideRun) -> None:
        """The windows and sizes the summary compares."""
        config = self.config
        length = config.seconds
        width = min(config.window, length / 4)
        samples = result.samples
        result.windows["first"] = self.window(0.0, width, samples)
        result.windows["last"] = self.window(length - width, length, samples)
        if config.hold is not None:
            began, ended = config.hold
            near = min(NEAR, (ended - began) / 2)
            result.windows["before hold"] = self.window(max(began - near, 0.0), began, samples)
            result.windows["end of hold"] = self.window(ended - near, ended, samples)
            result.sizes["before hold"] = _size_at(samples, began)
            result.sizes["end of hold"] = _size_at(samples, ended)
        result.sizes["end"] = _size_at(samples, length)

    def close(self) -> None:
        self.conn.close()


def _size_at(samples: list[Sample], at: float) -> int | None:
    """The table and its indexes at the last sample at or before `at` s."""
    before = [s for s in samples if s.at <= at + 1e-6]
    return before[-1].table_bytes + before[-1].index_bytes if before else None


def make_tables(dsn: str, side: str) -> None:
    """`bench_done` with the start times, then the side's tables: axa-queue's (its setup
    statements) or the floor's reference design (whose own `bench_done` is then there)."""
    tables = SETUP_STATEMENTS if side == "axa" else [floor.TABLE_DDL]
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        for statement in [*soak_worker.DONE_TABLE, *tables]:
            conn.execute(statement)


@contextlib.contextmanager
def own_database(dsn: str, prefix: str) -> Iterator[str]:
    """Make a fresh database on `dsn`'s server; yield a DSN to it; drop it afterwards
    (its sessions ended)."""
    name = floor.fresh_schema(prefix)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    try:
        yield make_conninfo(dsn, dbname=name)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name))
            )


@contextlib.contextmanager
def side_schema(config: Config, side: str) -> Iterator[str]:
    """A DSN whose tables are in a fresh schema (of a fresh database with
    `config.database`), named after it; dropped afterwards."""
    prefix = f"bench_soak_{side}"
    with contextlib.ExitStack() as stack:
        dsn = (
            stack.enter_context(own_database(config.dsn, prefix)) if config.database else config.dsn
        )
        yield stack.enter_context(bench.scratch_schema(dsn, prefix))


def server_autovacuum(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('autovacuum') = 'on'").fetchone()
    return bool(row and row[0])


def run_side(config: Config, side: str, say: Callable[[str], None]) -> SideRun:
    """One side's soak, in a database (or schema) of its own, dropped afterwards."""
    result = SideRun(side, config.seconds)
    with side_schema(config, side) as dsn:
        schema = str(conninfo_to_dict(dsn)["application_name"])
        make_tables(dsn, side)
        with psycopg.connect(dsn, autocommit=True) as conn:
            floor.checkpoint(conn)
        workers = Workers(side, dsn, schema, config)
        producer: Producer | None = None
        vacuum: autovacuum.Autovacuum | None = None
        hold: Hold | None = None
        probe: ClaimProbe | None = None
        sampler: Sampler | None = None
        try:
            workers.wait_ready()
            producer = Producer(dsn, side, floor.channel(schema), config.rate, config.seconds)
            probe = ClaimProbe(side, dsn, schema, config)
            if server_autovacuum(dsn):
                result.vacuum = "the server's autovacuum"
            else:
                vacuum = autovacuum.Autovacuum(dsn, schema, config.naptime, application_name=schema)
                result.vacuum = (
                    f"emulated (the server's is off): naptime {vacuum.settings.naptime:g} s, "
                    f"cost delay {vacuum.settings.cost_delay_ms:g} ms, "
                    f"cost limit {vacuum.settings.cost_limit}"
                )
            say(f"{SIDES[side]}: {config.workers} x {config.loops} workers ready; {result.vacuum}")
            running = producer
            sampler = Sampler(
                dsn, schema, probe, config, lambda: [*workers.pids, running.process.pid or 0]
            )
            t0 = sampler.t0 = time.monotonic() + 1.0
            producer.go(t0)
            if vacuum is not None:
                vacuum.start()
            if config.hold is not None:
                hold = Hold(dsn, t0 + config.hold[0], t0 + config.hold[1])
            step = config.sample_every
            k = 1
            while k * step <= config.seconds + 1e-6:
                end = t0 + k * step
                time.sleep(max(end + SETTLE - time.monotonic(), 0))
                workers.check()
                result.samples.append(sampler.take(end - step, end))
                say(f"{SIDES[side]:>9} {_row(result.samples[-1])}")
                k += 1
            result.enqueued, result.late_s = producer.result(timeout=60 + config.seconds)
            ended = time.monotonic()
            deadline = ended + max(120.0, config.seconds / 2)
            while (done := sampler.done()) < result.enqueued:
                workers.check()
                if time.monotonic() > deadline:
                    result.problems.append(
                        f"{result.enqueued - done} jobs had not run "
                        f"{deadline - ended:.0f} s after the load ended"
                    )
                    break
                time.sleep(0.5)
            result.drained_s = time.monotonic() - ended
            held_back = max((one.snapshot_s for one in result.samples), default=0.0)
            if held_back > config.sample_every:
                result.problems.append(
                    f"another session held a snapshot in this database for {held_back:.0f} s: "
                    "vacuum could not remove what it may see (run in a database of its own)"
                )
            if hold is not None:
                hold.stop()
                if hold.error:
                    result.problems.append(f"the hold failed: {hold.error}")
                if hold.held:
                    result.held = (hold.held[0] - t0, hold.held[1] - t0)
            if vacuum is not None:
                vacuum.stop()
                result.vacuum_runs = [
                    dataclasses.asdict(one) | {"at": round(one.at - t0, 3)} for one in vacuum.runs
                ]
                result.problems += vacuum.errors
            result.worker_exits = workers.stop()
            if any(result.worker_exits):
                result.problems.append(f"worker exit statuses: {result.worker_exits}")
            sampler.summarize(result)
            try:
                if side == "axa":
                    bench.verify_axa(dsn, result.enqueued)
                else:
                    with psycopg.connect(dsn, autocommit=True) as conn:
                        floor.verify_exactly_once(conn, result.enqueued)
            except floor.ExactlyOnceError as error:
                result.exactly_once = str(error)
        finally:
            for thing in (hold, vacuum):
                if thing is not None:
                    thing.stop()
            for closing in (sampler, probe):
                if closing is not None:
                    closing.close()
            workers.stop()
            if producer is not None:
                producer.close()
    return result


# --- the whole run ---------------------------------------------------------------------------


@dataclass
class Report:
    config: Config
    runs: list[SideRun] = field(default_factory=list)
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    seconds: float = 0.0

    @property
    def busy(self) -> bool:
        samples = [s for run in self.runs for s in run.samples]
        return bench.was_busy(
            [s.others for s in samples if s.others is not None], [s.foreign for s in samples]
        )

    def side(self, side: str) -> SideRun | None:
        return next((run for run in self.runs if run.side == side), None)


def run_soak(config: Config, say: Callable[[str], None] = lambda _: None) -> Report:
    """axa-queue's soak, then the floor's (unless `config.floor` is off)."""
    if config.hold is not None and config.hold[1] > config.seconds:
        raise ValueError("the hold must end before the run does")
    report = Report(config, load_before=os.getloadavg())
    started = time.monotonic()
    for side in ("axa", "floor") if config.floor else ("axa",):
        report.runs.append(run_side(config, side, say))
    report.load_after = os.getloadavg()
    report.seconds = time.monotonic() - started
    return report


# --- the table -------------------------------------------------------------------------------

HEADER = (
    f"{'s':>7} {'jobs/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'claim ms':>8} {'buffers':>7} "
    f"{'table MB':>8} {'index MB':>8} {'dead':>8} {'vac/an':>7} {'others':>6}"
)


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:,.2f}"


def _row(s: Sample) -> str:
    others = "-" if s.others is None else f"{s.others:.0%}"
    return (
        f"{s.at:7.1f} {s.per_s:8.1f} {_num(s.p50_ms):>7} {_num(s.p99_ms):>7} "
        f"{s.claim_ms:8.3f} {s.claim_buffers:7d} {_mb(s.table_bytes):>8} {_mb(s.index_bytes):>8} "
        f"{s.dead:8d} {f'{s.vacuums}/{s.analyzes}':>7} {others:>6}"
        + (" held" if s.held else "")
        + (f" +{s.foreign} sessions" if s.foreign else "")
        + (f" another's snapshot {s.snapshot_s:.0f} s" if s.snapshot_s >= 1 else "")
    )


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or a == 0 else b / a


def _change(a: float | None, b: float | None, digits: int = 2) -> str:
    ratio = _ratio(a, b)
    return f"{_num(a, digits)} -> {_num(b, digits)}" + ("" if ratio is None else f" ({ratio:.2f}x)")


def goals(report: Report) -> list[tuple[str, bool | None]]:
    """The issue's acceptance, as read from this run (None: not measured)."""
    axa, low = report.side("axa"), report.side("floor")
    if axa is None:
        return []
    first, last = axa.windows["first"], axa.windows["last"]
    out: list[tuple[str, bool | None]] = []

    def within(a: float | None, b: float | None, most: float) -> bool | None:
        ratio = _ratio(a, b)
        return None if ratio is None else ratio <= most

    out.append(("claim time, last window within 1.5x of the first",
                within(first.claim_ms, last.claim_ms, 1.5)))  # fmt: skip
    out.append(("enqueue-to-start p99, last window within 1.5x of the first",
                within(first.p99_ms, last.p99_ms, 1.5)))  # fmt: skip
    if report.config.hold is not None:
        for what, key in (("time", "claim_ms"), ("buffers", "claim_buffers")):

            def growth(run: SideRun | None, key: str = key) -> float | None:
                if run is None:
                    return None
                before, end = run.windows["before hold"], run.windows["end of hold"]
                return _ratio(getattr(before, key), getattr(end, key))

            ours, theirs = growth(axa), growth(low)
            out.append((f"during the hold, the claim's {what} grows no faster than the floor's",
                        None if ours is None or theirs is None else ours <= theirs))  # fmt: skip
        out.append(("the table and its indexes at the end within 2x of before the hold",
                    within(axa.sizes.get("before hold"), axa.sizes.get("end"), 2.0)))  # fmt: skip
    for run in report.runs:
        out.append((f"{SIDES[run.side]}: every job exactly once", run.exactly_once is None))
    return out


def format_report(report: Report) -> str:
    config = report.config
    hold = (
        "no snapshot held"
        if config.hold is None
        else f"a snapshot held from {config.hold[0]:g} s to {config.hold[1]:g} s"
    )
    lines = [
        f"soak: {config.rate:g} jobs/s for {config.seconds:g} s a side, {config.workers} worker "
        f"processes x {config.loops} loops, {hold}; a sample every {config.sample_every:g} s",
        "",
    ]
    for run in report.runs:
        name = SIDES[run.side]
        kind = (
            "`axa-queue worker` processes"
            if run.side == "axa"
            else f"floor processes, claims of {config.floor_batch}"
        )
        lines += [f"{name} ({kind}); vacuum: {run.vacuum}", HEADER]
        lines += [_row(s) for s in run.samples]
        ran = [r for r in run.vacuum_runs if r["table"] == "axa_queue"]
        if ran:
            lines.append(
                f"  the emulated autovacuum on axa_queue: {len(ran)} runs, at "
                + ", ".join(
                    f"{r['at']:.0f} s ({'vacuum' if r['vacuum'] else ''}"
                    f"{'+' if r['vacuum'] and r['analyze'] else ''}"
                    f"{'analyze' if r['analyze'] else ''}, {r['seconds']:.2f} s)"
                    for r in ran
                )
            )
        lines.append("")
    axa, low = report.side("axa"), report.side("floor")
    sides = [run for run in (axa, low) if run is not None]
    width = min(config.window, config.seconds / 4)
    labels = [f"{SIDES[run.side]:>32}" for run in sides]
    lines.append(f"{'summary':<58}" + "".join(labels))

    def line(label: str, cell: Callable[[SideRun], str]) -> None:
        lines.append(f"{label:<58}" + "".join(f"{cell(run):>32}" for run in sides))

    line(f"claim ms, first {width:g} s -> last {width:g} s",
         lambda r: _change(r.windows["first"].claim_ms, r.windows["last"].claim_ms, 3))  # fmt: skip
    line("claim buffers, first -> last",
         lambda r: _change(r.windows["first"].claim_buffers, r.windows["last"].claim_buffers, 0))  # fmt: skip
    line("enqueue-to-start p99 ms, first -> last",
         lambda r: _change(r.windows["first"].p99_ms, r.windows["last"].p99_ms))  # fmt: skip
    line("enqueue-to-start p50 ms, first -> last",
         lambda r: _change(r.windows["first"].p50_ms, r.windows["last"].p50_ms))  # fmt: skip
    if config.hold is not None:
        near = report.runs[0].windows["before hold"]
        span = near.end - near.start
        line(f"claim ms, {span:g} s before the hold -> its last {span:g} s",
             lambda r: _change(r.windows["before hold"].claim_ms, r.windows["end of hold"].claim_ms, 3))  # fmt: skip
        line("claim buffers, before the hold -> its end",
             lambda r: _change(r.windows["before hold"].claim_buffers, r.windows["end of hold"].claim_buffers, 0))  # fmt: skip
        line("enqueue-to-start p99 ms, before the hold -> its end",
             lambda r: _change(r.windows["before hold"].p99_ms, r.windows["end of hold"].p99_ms))  # fmt: skip
        line("table+indexes MB, before the hold -> its end",
             lambda r: _change(_mega(r.sizes.get("before hold")), _mega(r.sizes.get("end of hold"))))  # fmt: skip
        line("table+indexes MB, before the hold -> end of run",
             lambda r: _change(_mega(r.sizes.get("before hold")), _mega(r.sizes.get("end"))))  # fmt: skip
    else:
        line("table+indexes MB at the end", lambda r: _mb(r.sizes.get("end")))
    line("vacuums / analyzes of axa_queue",
         lambda r: f"{r.samples[-1].vacuums} / {r.samples[-1].analyzes}" if r.samples else "-")  # fmt: skip
    line("jobs queued; producer late at most (s)", lambda r: f"{r.enqueued:,}; {r.late_s:.3f}")
    line("every job ran after the load ended within (s)", lambda r: f"{r.drained_s:.1f}")
    line("exactly once", lambda r: "yes" if r.exactly_once is None else "NO")
    lines.append("")
    for label, met in goals(report):
        mark = "-" if met is None else ("yes" if met else "NO")
        lines.append(f"  [{mark:>3}] {label}")
    for run in report.runs:
        if run.exactly_once is not None:
            lines.append(f"{SIDES[run.side]}: {run.exactly_once}")
        for problem in run.problems:
            lines.append(f"{SIDES[run.side]}: {problem}")
        if run.late_s > 1.0:
            lines.append(
                f"{SIDES[run.side]}: the producer fell {run.late_s:.1f} s behind its rate: "
                "the machine could not queue that fast"
            )
    lines.append(
        f"load average {' '.join(f'{x:.2f}' for x in report.load_before)} before, "
        f"{' '.join(f'{x:.2f}' for x in report.load_after)} after; {report.seconds:.0f} s in all"
    )
    if report.busy:
        lines.append(
            "BUSY: something else was working (other sessions on the server, or the machine "
            f"over {bench.BUSY_LIMIT:.0%} busy with others' work, at some samples; column "
            "'others'): the figures may be spoiled; run again on an idle machine"
        )
    return "\n".join(lines)


def _mega(value: int | None) -> float | None:
    return None if value is None else value / 1e6


# --- the command line ------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the soak, print the table; 1 if a job did not run exactly once."""
    parser = argparse.ArgumentParser(
        description="Sustained load: axa-queue's workers, then the raw-SQL floor's."
    )
    d = Config()
    parser.add_argument("--dsn", default=d.dsn)
    parser.add_argument("--quick", action="store_true", help="2 minutes a side, held in the middle")
    parser.add_argument("--rate", type=float, help=f"jobs queued a second (default {d.rate:g})")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, help=f"a side's run (default {d.seconds / 60:g})")
    length.add_argument("--seconds", type=float, help="a side's run, in seconds")
    parser.add_argument(
        "--workers", "--processes", dest="workers", type=int,
        help=f"worker processes (default {d.workers})",
    )  # fmt: skip
    parser.add_argument(
        "--loops", type=int,
        help=f"loops of each axa-queue worker (its --workers), connections of each floor "
        f"worker (default {d.loops})",
    )  # fmt: skip
    parser.add_argument(
        "--hold", metavar="FROM:TO",
        help="hold a snapshot from FROM to TO into the run: minutes (12.5:17.5) or seconds "
        "(40s:80s)",
    )  # fmt: skip
    parser.add_argument("--floor", action=argparse.BooleanOptionalAction, default=True,
                        help="run the floor's side too (default: yes)")  # fmt: skip
    parser.add_argument("--sample-every", type=float, help=f"seconds (default {d.sample_every:g})")
    parser.add_argument(
        "--window", type=float,
        help=f"seconds of the first and last windows compared (default {d.window:g})",
    )  # fmt: skip
    parser.add_argument("--naptime", type=float,
                        help="the emulated autovacuum's naptime (default: the server's)")  # fmt: skip
    parser.add_argument("--floor-batch", type=int, help=f"default {d.floor_batch}")
    parser.add_argument("--claim-samples", type=int, help=f"default {d.claim_samples}")
    parser.add_argument(
        "--database", action=argparse.BooleanOptionalAction, default=True,
        help="each side in a database of its own, made and dropped by the run, so no other "
        "session's snapshot holds back its vacuum (default: yes); --no-database: a schema "
        "in the --dsn's database",
    )  # fmt: skip
    parser.add_argument(
        "--wait-idle", action="store_true",
        help="first wait (up to 10 minutes) until the machine is idle",
    )  # fmt: skip
    parser.add_argument("--json", metavar="PATH", help="write every sample as JSON")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)

    changes: dict[str, Any] = dict(QUICK) if args.quick else {}
    for name in ("rate", "workers", "loops", "sample_every", "window", "naptime",
                 "floor_batch", "claim_samples", "seconds"):  # fmt: skip
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    if args.minutes is not None:
        changes["seconds"] = args.minutes * 60
    if args.hold:
        try:
            changes["hold"] = hold_of(args.hold)
        except ValueError as error:
            parser.error(str(error))
    config = dataclasses.replace(
        d, dsn=args.dsn, floor=args.floor, database=args.database, **changes
    )
    if config.hold is not None and config.hold[1] > config.seconds:
        parser.error("the hold must end before the run does (--hold, --minutes)")
    started = time.monotonic()

    def say(message: str) -> None:
        if not args.quiet:
            print(f"[{time.monotonic() - started:7.1f}s] {message}", file=sys.stderr, flush=True)

    if args.wait_idle and not bench.wait_until_idle(say=say):
        say("the machine did not become idle; running anyway")
    report = run_soak(config, say)
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "config": dataclasses.asdict(config) | {"dsn": "(not written)"},
                    "runs": [dataclasses.asdict(run) for run in report.runs],
                    "goals": goals(report),
                    "busy": report.busy,
                    "load_before": report.load_before,
                    "load_after": report.load_after,
                    "seconds": report.seconds,
                },
                indent=2,
            )
        )
    return 0 if all(run.exactly_once is None for run in report.runs) else 1


if __name__ == "__main__":
    sys.exit(main())
