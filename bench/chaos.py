"""Chaos test: real worker processes, killed, cut off and stalled; the database's own
record says whether fencing held.

    python bench/chaos.py --seed 1 --jobs 2000 --duration 60     # about two minutes
    python bench/chaos.py --seed 1 --jobs 300 --duration 15      # the short CI version

It starts a throwaway embedded PostgreSQL server of its own (never the machine's
shared one), with durable commits, and real `axa-queue worker` processes (a small module
of handlers written to a temporary directory; heartbeat 0.5 s, stale after
`--stale` seconds, a schedule ticking every second). While they drain the jobs (some
failing once, some long, priorities and delays) it:

- SIGKILLs a random worker every 1-3 s and starts another in its place;
- restarts PostgreSQL with `-m fast` and with `-m immediate`, and stops it for longer
  than `stale_after` (an outage);
- queues a job whose handler blocks the event loop for longer than `stale_after`;
- holds an application transaction (an `enqueue_on`) open across a worker's start.

Then it checks, from a trigger-kept record of every status change of `axa_queue` (the
statement that made it, its time, the backend) and from the handlers' own record of
each run's start and end (job, attempt, process, times):

- lost: every job ends `completed` (or in review), none stays queued or running;
- completed twice: no job is set `completed` more than once, and the run that
  completed it ran to its end exactly once under its attempt;
- overlap: no two runs of one job at once in one process;
- started late: no handler starts while its row is not `running` under its attempt,
  and no (job, attempt) starts twice; but for one race the design allows: between a
  run's claim and its handler's start, another process's run of the job's earlier
  attempt, found lost as that process wakes from a stall, sends the job to review
  (`MARK_LOST`: a run that started and lost its claim may have done its work, and the
  job is being run again). A fresh claim is not proved before its handler starts (a
  round trip per run), so the handler starts; its ending is refused (fenced), and the
  review is checked under "review" below;
- schedule: each due time of the schedule is moved on (and its job queued) once;
- released early: no dependent of a workflow (chords and chains of `Work` jobs among
  the others) goes from `blocked` to `queued` unless each of its parents was completed
  before or in the same transaction: so never by a run that lost its claim (whose
  ending writes nothing);
- started early: no dependent's handler starts before every parent completed;
- stuck blocked: no job stays `blocked` whose parents all ended;
- wrong results: each dependent's `parent_results()` holds its parents' results, in
  order (a chord's callback: its group's); every callback runs exactly once is "lost"
  and "completed twice" above, which cover the workflows' jobs too (a job held blocked
  by a parent in review is not lost);
- review: a job reaches `needs_review` only after stale recovery took the claim of a
  run of it that had started (a run that really lost its claim);
- step twice: some jobs' handlers take durable steps (`JobContext.step`, whose function
  returns a token of the run that ran it) and some sleep once (`JobContext.sleep`):
  every run of a job is given the same token for a step, the one recorded, so no step
  is recorded twice for one job;
- step after loss: every step recorded was recorded while its job was `running` under
  the recording run's attempt (from the record of changes), so never by a run that had
  lost its claim.

It prints one summary line per check and exits 1 if any fails. The tables it adds
(`chaos_*`, a trigger) are the test's, not the product's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
sys.path.insert(0, str(SRC))

from axa_queue import NewJob, Queue, QueueOptions, chain, chord, enqueue_on, group  # noqa: E402
from axa_queue.embedded import EmbeddedPostgres  # noqa: E402

HANDLERS = '''
"""The chaos test's handlers: each run notes its start and end with the row's state."""
import asyncio
import os
import time
import uuid

import psycopg

from axa_queue import NewJob, Queue, QueueOptions, Schedule, current_job

queue = Queue(
    options=QueueOptions(
        workers=int(os.environ["CHAOS_LOOPS"]),
        prefetch=int(os.environ["CHAOS_PREFETCH"]),
        heartbeat_interval=0.5,
        stale_after=float(os.environ["CHAOS_STALE"]),
        maintenance_interval=0.5,
        poll_interval=0.25,
        retry_backoff=0.1,
        max_attempts=50,
        keep_recent=3600,  # the checks read axa_queue: no job moves to the history meanwhile
    )
)
queue.schedule(Schedule.every("chaos-tick", 1, NewJob("Tick", {})))
RUNNING = set()

NOTE = """INSERT INTO chaos_runs (run, n, pid, phase, at, attempts, detail)
    SELECT %(run)s, %(n)s, %(pid)s, %(phase)s, to_timestamp(%(at)s), q.attempts, %(detail)s
    FROM axa_queue q WHERE q.args->>'n' = %(n)s::text
    RETURNING attempts"""


async def note(run, n, phase, detail=None):
    """Note a run's start or end, at the time it happened (the note itself may be late:
    the event loop may be blocked or the database away); `detail`: what a step returned,
    or what a wrong `parent_results()` was."""
    params = {
        "run": run, "n": n, "pid": os.getpid(), "phase": phase, "at": time.time(),
        "detail": detail,
    }
    while True:  # until the database answers (the worker stops the run if it must)
        try:
            async with queue.pool.connection() as conn:
                cur = await conn.execute(NOTE, params)
                return (await cur.fetchone())[0]
        except psycopg.OperationalError:
            await asyncio.sleep(0.05)


@queue.handler("Work")
async def work(args):
    n = args["n"]
    run = str(uuid.uuid4())
    if n in RUNNING:
        await note(run, n, "overlap")
    RUNNING.add(n)
    try:
        # Shielded: a run stopped while its start note waits for a connection (its claim
        # found lost after a blocked loop) did start, and the checks must see it.
        attempts = await asyncio.shield(asyncio.ensure_future(note(run, n, "start")))
        await asyncio.sleep(args.get("sleep", 0))
        if args.get("block"):
            time.sleep(args["block"])  # blocks the event loop
        job = current_job()
        for i in range(args.get("steps", 0)):
            # Each step's function returns a token of the run that ran it: every later
            # run of the job must be given the same one (`chaos_runs`, phase 'step').
            token = await job.step(f"s{i}", stepped, run, i, args.get("step_sleep", 0))
            await note(run, n, "step", f"s{i}={token}")
        if args.get("nap") and await job.step("nap", lambda: job.attempt) == job.attempt:
            await job.sleep(args["nap"])  # once: the attempt that recorded "nap"
        if args.get("fail") and attempts == 1:
            raise RuntimeError("told to fail once")
        if "expect" in args:
            got = await job.parent_results()
            if got != args["expect"]:
                await note(run, n, "wrong results", f"got {got!r}, expected {args['expect']!r}")
        await note(run, n, "end")
    finally:
        RUNNING.discard(n)
    return n


async def stepped(run, i, pause):
    """A step's function: a token naming the run that ran it."""
    await asyncio.sleep(pause)
    return f"{run}/{i}"


@queue.handler("Tick")
async def tick(args):
    pass
'''

SCHEMA = [
    "CREATE INDEX chaos_n ON axa_queue ((args->>'n'))",
    """CREATE TABLE chaos_changes (
        seq BIGSERIAL PRIMARY KEY, id UUID, name TEXT, old TEXT, new TEXT, attempts INT,
        kind TEXT, at TIMESTAMPTZ DEFAULT clock_timestamp(), pid INT, app TEXT,
        xact BIGINT DEFAULT txid_current())""",
    """CREATE FUNCTION chaos_note() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM NEW.status
           OR OLD.attempts IS DISTINCT FROM NEW.attempts THEN
            INSERT INTO chaos_changes (id, name, old, new, attempts, kind, pid, app)
            VALUES (NEW.id, NEW.name, CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END,
                    NEW.status, NEW.attempts,
                    CASE WHEN current_query() LIKE 'WITH RECURSIVE %%' THEN 'exchange'
                         WHEN current_query() LIKE 'WITH stale AS%%' THEN 'recovery'
                         WHEN current_query() LIKE 'WITH hot AS%%' THEN 'lost'
                         WHEN current_query() LIKE 'WITH back AS%%' THEN 'given back'
                         WHEN current_query() LIKE 'WITH gone AS%%' THEN 'gone'
                         WHEN current_query() LIKE 'WITH due AS%%' THEN 'schedule'
                         ELSE 'other' END,
                    pg_backend_pid(), current_setting('application_name'));
        END IF;
        RETURN NULL;
    END $$""",
    """CREATE TRIGGER chaos_note AFTER INSERT OR UPDATE ON axa_queue
        FOR EACH ROW EXECUTE FUNCTION chaos_note()""",
    """CREATE TABLE chaos_runs (
        seq BIGSERIAL PRIMARY KEY, run UUID, n INT, pid INT, phase TEXT, at TIMESTAMPTZ,
        attempts INT, detail TEXT)""",
    # Each run's start with the row's state then, from the record of changes.
    """CREATE VIEW chaos_starts AS
        SELECT s.run, s.n, s.pid, s.at, c.new AS status, c.attempts, c.old, c.kind
        FROM chaos_runs s JOIN axa_queue q ON q.args->>'n' = s.n::text
        LEFT JOIN LATERAL (
            SELECT new, attempts, old, kind FROM chaos_changes c WHERE c.id = q.id AND c.at <= s.at
            ORDER BY c.at DESC, c.seq DESC LIMIT 1) c ON true
        WHERE s.phase = 'start'""",
    """CREATE TABLE chaos_schedule (
        seq BIGSERIAL PRIMARY KEY, old_due TIMESTAMPTZ, new_due TIMESTAMPTZ, job UUID,
        at TIMESTAMPTZ DEFAULT clock_timestamp())""",
    """CREATE FUNCTION chaos_due() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF OLD.due_at IS DISTINCT FROM NEW.due_at THEN
            INSERT INTO chaos_schedule (old_due, new_due, job)
            VALUES (OLD.due_at, NEW.due_at, NEW.last_job);
        END IF;
        RETURN NULL;
    END $$""",
    """CREATE TRIGGER chaos_due AFTER UPDATE ON axa_schedule
        FOR EACH ROW EXECUTE FUNCTION chaos_due()""",
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Chaos:
    def __init__(self, args: argparse.Namespace, server: EmbeddedPostgres, where: Path) -> None:
        self.args = args
        self.server = server
        self.where = where
        self.rng = random.Random(args.seed)
        self.workers: list[subprocess.Popen[bytes]] = []
        self.counts: dict[str, int] = {"kills": 0, "starts": 0, "restarts": 0, "outages": 0}
        self.log = open(where / "workers.log", "wb")  # noqa: SIM115
        self.next_n = args.jobs + 10
        """The last number given to a workflow's job (past the plain jobs, the blocking
        one and the one held across a start)."""
        self.flows = max(1, args.jobs // 20)
        """Workflows still to queue, among the batches."""

    def start_worker(self) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(self.where), str(SRC)]),
            "AXA_QUEUE_DSN": self.server.dsn,
            "CHAOS_LOOPS": str(self.args.loops),
            "CHAOS_PREFETCH": str(self.rng.choice([0, 0, 4])),
            "CHAOS_STALE": str(self.args.stale),
        }
        process = subprocess.Popen(
            [sys.executable, "-m", "axa_queue.cli", "worker", "chaos_jobs:queue"],
            cwd=self.where,
            env=env,
            stdout=self.log,
            stderr=self.log,
        )
        self.workers.append(process)
        self.counts["starts"] += 1
        return process

    def kill_one(self) -> None:
        alive = [w for w in self.workers if w.poll() is None]
        if len(alive) <= 1:
            return
        victim = self.rng.choice(alive)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        self.counts["kills"] += 1

    async def restart(self, mode: str, down: float = 0.0) -> None:
        await asyncio.to_thread(self.server.stop, mode)
        if down:
            await asyncio.sleep(down)
            self.counts["outages"] += 1
        else:
            self.counts["restarts"] += 1
        await asyncio.to_thread(self.server.start)

    async def enqueue(self, jobs: list[NewJob]) -> None:
        while True:
            try:
                with psycopg.connect(self.server.dsn, autocommit=True) as conn:
                    await asyncio.to_thread(self._insert, conn, jobs)
                return
            except psycopg.OperationalError:
                await asyncio.sleep(0.1)

    @staticmethod
    def _insert(conn: psycopg.Connection[Any], jobs: list[NewJob] | Any) -> None:
        from axa_queue import enqueue_all_on

        if isinstance(jobs, list):
            enqueue_all_on(conn, jobs)
        else:  # a workflow, queued whole
            enqueue_on(conn, jobs)

    def flow(self) -> Any:
        """A chord (3 to 6 parts, then a callback) or a chain of 3, of `Work` jobs
        numbered past the plain ones; each dependent expects its parents' numbers as
        their results, in order."""
        rng = self.rng

        def member(expect: list[int] | None = None) -> NewJob:
            self.next_n += 1
            job = self.job(self.next_n)
            if expect is not None:
                job = NewJob("Work", {**job.args, "expect": expect}, priority=job.priority)
            return job

        if rng.random() < 0.5:
            parts = [member() for _ in range(rng.randint(3, 6))]
            return chord(group(parts), member([p.args["n"] for p in parts]))
        first = member()
        second = member([first.args["n"]])
        return chain(first, second, member([second.args["n"]]))

    def job(self, n: int) -> NewJob:
        rng = self.rng
        args: dict[str, Any] = {"n": n, "sleep": rng.choice([0, 0, 0.01, 0.05, 0.2])}
        if rng.random() < 0.1:
            args["fail"] = True
        if rng.random() < 0.02:
            args["sleep"] = rng.uniform(1, 2 * self.args.stale)  # runs across events
        if rng.random() < 0.3:
            args["steps"] = rng.randint(1, 3)
            args["step_sleep"] = rng.choice([0, 0, 0.02, 0.3])
        if rng.random() < 0.15:
            args["nap"] = rng.choice([0, 0.1, 0.5])
        return NewJob(
            "Work",
            args,
            priority=rng.choice([0, 0, 0, 5]),
            run_in=rng.choice([None, None, None, 0.5, 2]),
        )

    async def hold_across_a_start(self) -> None:
        """An application transaction with an enqueue open while a worker starts."""
        with psycopg.connect(self.server.dsn) as conn:
            enqueue_on(conn, self.job(self.args.jobs + 1))
            self.start_worker()
            await asyncio.sleep(2.0)
            conn.commit()

    async def run(self) -> None:
        args = self.args
        for _ in range(args.workers):
            self.start_worker()
        first = args.jobs // 2
        await self.enqueue([self.job(n) for n in range(first)])
        rest = list(range(first, args.jobs))
        duration = args.duration
        events = sorted(
            [
                (0.20 * duration, "restart-fast"),
                (0.35 * duration, "block"),
                (0.45 * duration, "restart-immediate"),
                (0.55 * duration, "hold"),
                (0.65 * duration, "outage"),
            ]
        )
        began = time.monotonic()
        next_kill = began + self.rng.uniform(1, 3)
        while time.monotonic() - began < duration:
            now = time.monotonic()
            if rest:
                size = self.rng.choice([1, 5, 50])
                batch, rest = rest[:size], rest[size:]
                await self.enqueue([self.job(n) for n in batch])
                if self.flows and self.rng.random() < 0.5:
                    self.flows -= 1
                    await self.enqueue(self.flow())
            if now >= next_kill:
                self.kill_one()
                self.start_worker()
                next_kill = now + self.rng.uniform(1, 3)
            while events and now - began >= events[0][0]:
                _, what = events.pop(0)
                print(f"[{now - began:6.1f}s] {what}", flush=True)
                if what == "restart-fast":
                    await self.restart("fast")
                elif what == "restart-immediate":
                    await self.restart("immediate")
                elif what == "outage":
                    await self.restart("fast", down=args.stale + 2)
                elif what == "block":
                    block = NewJob("Work", {"n": args.jobs, "block": args.stale + 1.5})
                    await self.enqueue([block])
                elif what == "hold":
                    await self.hold_across_a_start()
            await asyncio.sleep(0.1)
        for n in rest:
            await self.enqueue([self.job(n)])
        while self.flows:
            self.flows -= 1
            await self.enqueue(self.flow())
        # Let the workers finish: no kills, no events.
        deadline = time.monotonic() + max(60, 4 * args.stale + 30)
        while time.monotonic() < deadline:
            with psycopg.connect(self.server.dsn) as conn:
                row = conn.execute(WAITING).fetchone()
            if row is not None and row[0] == 0:
                break
            await asyncio.sleep(0.5)
        for worker in self.workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in self.workers:
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()


WAITING = """SELECT count(*) FROM axa_queue q WHERE name = 'Work'
    AND (status IN ('queued', 'running')
         OR status = 'blocked' AND NOT EXISTS (
            SELECT 1 FROM axa_queue_deps d JOIN axa_queue p ON p.id = d.parent
            WHERE d.child = q.id AND p.status IN ('needs_review', 'blocked')))"""
"""The jobs the workers still have to run: queued, running, or blocked on parents that
will end (none of them in review, which holds its dependents, or blocked itself)."""

CHECKS = {
    "lost": """SELECT count(*) FROM axa_queue q
        WHERE name = 'Work' AND status NOT IN ('completed', 'needs_review')
          AND NOT (status = 'blocked' AND EXISTS (
            SELECT 1 FROM axa_queue_deps d JOIN axa_queue p ON p.id = d.parent
            WHERE d.child = q.id AND p.status IN ('needs_review', 'blocked')))""",
    "completed twice": """SELECT count(*) FROM (
            SELECT id FROM chaos_changes WHERE new = 'completed' GROUP BY id HAVING count(*) > 1
            UNION ALL
            SELECT q.id FROM axa_queue q WHERE q.name = 'Work' AND q.status = 'completed'
              AND (SELECT count(*) FROM chaos_runs r JOIN chaos_starts s USING (run)
                   WHERE r.n = (q.args->>'n')::int AND r.phase = 'end'
                     AND s.attempts = q.attempts) <> 1
        ) bad""",
    "overlap": "SELECT count(*) FROM chaos_runs WHERE phase = 'overlap'",
    "started late": """SELECT count(*) FROM (
            SELECT n FROM chaos_starts WHERE status IS DISTINCT FROM 'running'
              AND NOT (status = 'needs_review' AND old = 'running' AND kind = 'lost')
            UNION ALL
            SELECT n FROM chaos_starts GROUP BY n, attempts HAVING count(*) > 1
        ) bad""",
    "schedule": """SELECT count(*) FROM (
            SELECT old_due FROM chaos_schedule GROUP BY old_due HAVING count(*) > 1
            UNION ALL
            SELECT old_due FROM chaos_schedule WHERE new_due <= old_due
        ) bad""",
    "released early": """SELECT count(*) FROM chaos_changes r
        JOIN axa_queue_deps d ON d.child = r.id
        WHERE r.old = 'blocked' AND r.new = 'queued' AND NOT EXISTS (
            SELECT 1 FROM chaos_changes p
            WHERE p.id = d.parent AND p.new = 'completed' AND (p.xact = r.xact OR p.at <= r.at))""",
    "started early": """SELECT count(*) FROM axa_queue_deps d
        JOIN axa_queue c ON c.id = d.child
        JOIN chaos_runs s ON s.n = (c.args->>'n')::int AND s.phase = 'start'
        WHERE s.at < COALESCE((SELECT min(p.at) FROM chaos_changes p
                               WHERE p.id = d.parent AND p.new = 'completed'), 'infinity')""",
    "stuck blocked": """SELECT count(*) FROM axa_queue c
        WHERE c.status = 'blocked' AND NOT EXISTS (
            SELECT 1 FROM axa_queue_deps d JOIN axa_queue p ON p.id = d.parent
            WHERE d.child = c.id AND p.status NOT IN ('completed', 'failed', 'cancelled'))""",
    "wrong results": "SELECT count(*) FROM chaos_runs WHERE phase = 'wrong results'",
    "step twice": """SELECT count(*) FROM (
            SELECT r.n FROM chaos_runs r WHERE r.phase = 'step'
            GROUP BY r.n, split_part(r.detail, '=', 1)
            HAVING count(DISTINCT split_part(r.detail, '=', 2)) > 1
            UNION ALL
            SELECT r.n FROM chaos_runs r
            JOIN axa_queue q ON q.args->>'n' = r.n::text
            JOIN axa_queue_steps s ON s.job_id = q.id AND s.name = split_part(r.detail, '=', 1)
            WHERE r.phase = 'step' AND s.result #>> '{}' <> split_part(r.detail, '=', 2)
        ) bad""",
    "step after loss": """SELECT count(*) FROM axa_queue_steps s
        LEFT JOIN LATERAL (
            SELECT c.new, c.attempts FROM chaos_changes c
            WHERE c.id = s.job_id AND c.at <= s.recorded_at
            ORDER BY c.at DESC, c.seq DESC LIMIT 1) c ON true
        WHERE c.new IS DISTINCT FROM 'running' OR c.attempts IS DISTINCT FROM s.attempt""",
    "review": """SELECT count(*) FROM chaos_changes c
        WHERE c.new = 'needs_review' AND NOT EXISTS (
            SELECT 1 FROM chaos_changes r JOIN axa_queue q ON q.id = r.id
            JOIN chaos_starts s ON s.n = (q.args->>'n')::int AND s.attempts = r.attempts
            WHERE r.id = c.id AND r.kind = 'recovery' AND r.old = 'running'
              AND r.at > s.at AND r.at < c.at)""",
}

FIGURES = {
    "jobs": "SELECT count(*) FROM axa_queue WHERE name = 'Work'",
    "completed": "SELECT count(*) FROM axa_queue WHERE name = 'Work' AND status = 'completed'",
    "needs_review": "SELECT count(*) FROM axa_queue WHERE status = 'needs_review'",
    "runs": "SELECT count(*) FROM chaos_runs WHERE phase = 'start'",
    "rerun after a kill": """SELECT count(*) FROM (SELECT n FROM chaos_runs WHERE phase = 'end'
        GROUP BY n HAVING count(*) > 1) x""",
    "recovered": "SELECT count(*) FROM chaos_changes WHERE kind = 'recovery'",
    "ticks": "SELECT count(*) FROM chaos_schedule",
    "dependents": "SELECT count(DISTINCT child) FROM axa_queue_deps",
    "steps": "SELECT count(*) FROM axa_queue_steps",
    "step_runs": "SELECT count(*) FROM chaos_runs WHERE phase = 'step'",
    "slept": "SELECT count(*) FROM axa_queue_attempts WHERE outcome = 'slept'",
}


def check(dsn: str, seed: int, counts: dict[str, int]) -> bool:
    with psycopg.connect(dsn) as conn:
        figures = {k: conn.execute(q).fetchone()[0] for k, q in FIGURES.items()}  # type: ignore[index]
        results = {k: conn.execute(q).fetchone()[0] for k, q in CHECKS.items()}  # type: ignore[index]
    happened = " ".join(f"{k}={v}" for k, v in counts.items())
    print(
        f"chaos seed={seed}: "
        + " ".join(f"{k.replace(' ', '_')}={v}" for k, v in figures.items())
        + f" | {happened}"
    )
    ok = True
    for name, bad in results.items():
        print(f"chaos seed={seed}: {name:<15} {'ok' if bad == 0 else f'FAILED ({bad})'}")
        ok = ok and bad == 0
    return ok


SUSPECTS = """SELECT n FROM chaos_runs WHERE phase IN ('overlap', 'wrong results')
    UNION SELECT n FROM chaos_starts WHERE status IS DISTINCT FROM 'running'
      AND NOT (status = 'needs_review' AND old = 'running' AND kind = 'lost')
    UNION SELECT n FROM chaos_starts GROUP BY n, attempts HAVING count(*) > 1
    UNION SELECT (q.args->>'n')::int FROM chaos_changes c JOIN axa_queue q ON q.id = c.id
      WHERE c.new = 'needs_review' AND NOT EXISTS (
        SELECT 1 FROM chaos_changes r JOIN chaos_starts s
          ON s.n = (q.args->>'n')::int AND s.attempts = r.attempts
        WHERE r.id = c.id AND r.kind = 'recovery' AND r.old = 'running'
          AND r.at > s.at AND r.at < c.at)
    ORDER BY n LIMIT 5"""
"""Jobs (by `n`) that failed a check of runs: overlap or wrong results, a start not under
the row's own `running` attempt, two starts of one attempt, a review no recovery of a
started run came before."""


def explain(dsn: str) -> None:
    """Print the runs and status changes of a few jobs that failed a check."""
    with psycopg.connect(dsn) as conn:
        for (n,) in conn.execute(SUSPECTS).fetchall():
            print(f"-- job n={n}")
            events = conn.execute(
                """SELECT at, 'run', phase || ' pid=' || pid || coalesce(' ' || detail, ''),
                    run::text, attempts FROM chaos_runs
                    WHERE n = %(n)s
                UNION ALL
                SELECT c.at, 'row', coalesce(c.old, '-') || '->' || c.new || ' by ' || c.kind
                    || ' pid=' || c.pid, c.app, c.attempts
                FROM chaos_changes c JOIN axa_queue q ON q.id = c.id
                WHERE q.args->>'n' = %(n)s::text
                ORDER BY 1""",
                {"n": n},
            ).fetchall()
            for at, kind, what, status, attempts in events:
                print(f"   {at:%H:%M:%S.%f} {kind} {what} {status or ''} attempt={attempts}")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of chaos")
    parser.add_argument("--workers", type=int, default=3, help="worker processes at a time")
    parser.add_argument("--loops", type=int, default=8, help="loops per worker")
    parser.add_argument("--stale", type=float, default=3.0, help="stale_after, seconds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="axa-chaos-") as tmp:
        where = Path(tmp)
        (where / "chaos_jobs.py").write_text(HANDLERS)
        settings = {"synchronous_commit": "on", "max_connections": "300"}
        with EmbeddedPostgres(port=free_port(), settings=settings) as server:
            async with Queue(server.dsn, QueueOptions()):
                pass  # makes the tables
            with psycopg.connect(server.dsn, autocommit=True) as conn:
                for statement in SCHEMA:
                    conn.execute(statement)
            chaos = Chaos(args, server, where)
            try:
                await chaos.run()
            finally:
                for worker in chaos.workers:
                    if worker.poll() is None:
                        worker.kill()
                        worker.wait()
                chaos.log.close()
            ok = check(server.dsn, args.seed, chaos.counts)
            if not ok:
                explain(server.dsn)
                log_copy = Path(tempfile.gettempdir()) / f"axa-chaos-{args.seed}.log"
                log_copy.write_bytes((where / "workers.log").read_bytes())
                print(f"the workers' log: {log_copy}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
