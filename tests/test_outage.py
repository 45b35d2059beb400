"""Outages longer than `stale_after`: a server restarted or down while jobs run, on an
embedded server of the test's own (never the shared one). No healthy run goes to
review, no process runs one job twice at once, and every job ends."""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
import pytest

from axa_queue import JobState, NewJob, Queue, QueueOptions, Recovered
from axa_queue.embedded import EmbeddedPostgres, is_available
from conftest import eventually, later, running

pytestmark = pytest.mark.skipif(not is_available(), reason="the embedded server is not installed")

# A heartbeat every 0.1 s, and 2 s of silence before a run is taken for stale: twenty
# heartbeats, so a loaded machine that holds up the event loop now and then never makes
# a healthy run look stale (with 1 s, ten, peers recovered healthy runs, sent to review).
OPTIONS = dict(
    workers=4,
    prefetch=2,
    heartbeat_interval=0.1,
    stale_after=2.0,
    maintenance_interval=0.1,
    poll_interval=0.05,
    retry_backoff=0.05,
    max_attempts=10,
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def server() -> Iterator[EmbeddedPostgres]:
    # A port of its own, kept across restarts (else a port still held by the old
    # server's connections moves it); commits durable at once, so a crash loses none.
    with EmbeddedPostgres(port=free_port(), settings={"synchronous_commit": "on"}) as embedded:
        yield embedded


class Tracker:
    """Handlers of one process that note each run, any two runs of a job at once, and
    each run stopped by its worker (its handler cancelled). A short job sleeps (its
    work); a long one runs until `release` is set, so it runs across the whole outage.
    `changed` (shared by the trackers of a test) is set at every start and end."""

    def __init__(self, release: asyncio.Event, changed: asyncio.Event) -> None:
        self.release = release
        self.changed = changed
        self.running: set[int] = set()
        self.overlaps: list[int] = []
        self.finished: list[int] = []
        self.stopped: set[int] = set()

    async def __call__(self, args: dict[str, Any]) -> None:
        n = args["n"]
        if n in self.running:
            self.overlaps.append(n)
        self.running.add(n)
        self.changed.set()
        try:
            if args["long"]:
                await self.release.wait()
            else:
                await asyncio.sleep(0.2)
        except asyncio.CancelledError:
            self.stopped.add(n)
            raise
        finally:
            self.running.discard(n)
            self.changed.set()
        self.finished.append(n)


async def until(check: Callable[[], bool], changed: asyncio.Event, timeout: float = 30) -> None:
    """Wait until `check()`, looking again each time `changed` is set."""

    async def wait() -> None:
        while not check():
            changed.clear()  # no await between the check and here: no change is missed
            await changed.wait()

    await asyncio.wait_for(wait(), timeout)


class Watch:
    """Reads how many jobs are in each status, on a connection of its own (made again
    when a restart broke it), without holding up the event loop: the workers'
    heartbeats share it."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: psycopg.AsyncConnection[Any] | None = None

    async def statuses(self) -> dict[str, int]:
        try:
            return await self._read()
        except psycopg.OperationalError:  # broken by a restart: once more, connected again
            await self.close()
            return await self._read()

    async def _read(self) -> dict[str, int]:
        if self.conn is None or self.conn.closed:
            self.conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
        cursor = await self.conn.execute("SELECT status, count(*) FROM axa_queue GROUP BY status")
        return {status: count for status, count in await cursor.fetchall()}

    async def counted(self, status: str, count: int) -> bool:
        """Whether `count` jobs are in `status` (to wait for with `eventually`)."""
        return (await self.statuses()).get(status, 0) == count

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()


@pytest.fixture
async def watch(server: EmbeddedPostgres) -> AsyncIterator[Watch]:
    watching = Watch(server.dsn)
    yield watching
    await watching.close()


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_a_server_down_longer_than_stale_after_sends_no_healthy_run_to_review(
    server: EmbeddedPostgres, watch: Watch, mode: str
) -> None:
    release, changed = asyncio.Event(), asyncio.Event()
    queues = [Queue(server.dsn, QueueOptions(**OPTIONS)) for _ in range(2)]
    trackers = [Tracker(release, changed) for _ in queues]
    for queue, tracker in zip(queues, trackers, strict=True):
        queue.handle("Work", tracker)
        await queue.open()
    try:
        # Short jobs, and long ones (claimed first) that run across the whole outage.
        await queues[0].enqueue_all(
            [
                NewJob("Work", {"n": n, "long": n % 10 == 0}, priority=int(n % 10 == 0))
                for n in range(60)
            ]
        )
        async with running(queues[0]), running(queues[1]):
            # The 8 loops run the long jobs (at least 4: one process may claim the 6,
            # 2 of them ahead) and short ones.
            await until(lambda: sum(n % 10 == 0 for t in trackers for n in t.running) >= 4, changed)
            await asyncio.to_thread(server.stop, mode)
            # Down longer than stale_after: every long run that was running is given up
            # by its worker, which happens once it could not report in for that long.
            blocked = [(t, n) for t in trackers for n in t.running if n % 10 == 0]
            await until(lambda: all(n in t.stopped for t, n in blocked), changed)
            release.set()  # from now on, long jobs end at once
            await asyncio.to_thread(server.start)
            await eventually(lambda: watch.counted("completed", 60), timeout=60)
        assert await watch.statuses() == {"completed": 60}
        for tracker in trackers:
            assert tracker.overlaps == [], "one process ran a job twice at once"
    finally:
        for queue in queues:
            await queue.close()


async def test_after_a_restart_no_process_takes_a_job_for_stale_from_the_outage_alone(
    server: EmbeddedPostgres, watch: Watch, caplog: pytest.LogCaptureFixture
) -> None:
    # The owner's job runs on; the server is down for less than stale_after from the
    # owner's view, but its last report is older than that when a peer reconnects.
    # The owner does no housekeeping after its start: only the peer recovers.
    owner = Queue(
        server.dsn,
        QueueOptions(**{**OPTIONS, "stale_after": 3.0, "maintenance_interval": 3600}),
    )
    peer = Queue(server.dsn, QueueOptions(**{**OPTIONS, "stale_after": 3.0}))
    release = asyncio.Event()
    started = asyncio.Event()

    async def long(args: Any) -> None:
        started.set()
        await release.wait()

    owner.handle("Long", long)
    peer.handle("Long", long)
    await owner.open()
    await peer.open()
    try:
        job_id = await owner.enqueue("Long", {})
        async with running(owner):
            await asyncio.wait_for(started.wait(), 15)
            async with running(peer):
                await asyncio.to_thread(server.stop, "immediate")
                # Down until the owner has found it so (the peer runs nothing: only the
                # owner's heartbeats fail).
                await eventually(
                    lambda: any("heartbeat failed" in r.getMessage() for r in caplog.records)
                )
                await asyncio.to_thread(server.start)
                # A run silent since long before the restart: the peer recovers it once
                # it has been back for stale_after, which shows its recovery ran.
                async with await psycopg.AsyncConnection.connect(
                    server.dsn, autocommit=True
                ) as conn:
                    cursor = await conn.execute(
                        "INSERT INTO axa_queue (id, name, args, status, attempts, started_at, "
                        "updated_at) VALUES (gen_random_uuid(), 'Canary', '{}', 'running', 1, "
                        "now() - interval '1 hour', now() - interval '1 hour') RETURNING id"
                    )
                    row = await cursor.fetchone()
                    assert row is not None

                    async def recovered() -> bool:
                        found = await conn.execute(
                            "SELECT status FROM axa_queue WHERE id = %s", (row[0],)
                        )
                        return await found.fetchone() == ("queued",)

                    await eventually(recovered, timeout=30)
                info = await peer.job(job_id)
                assert info is not None and (info.state.value, info.attempt) == ("running", 1)
                release.set()
                await eventually(lambda: watch.counted("completed", 1), timeout=30)
    finally:
        for queue in (owner, peer):
            await queue.close()


async def test_nothing_is_recovered_within_stale_after_of_a_server_start(
    server: EmbeddedPostgres,
) -> None:
    queue = Queue(server.dsn, QueueOptions(**{**OPTIONS, "stale_after": 2.0}))
    await queue.open()
    try:
        job_id = await queue.enqueue("Lost", {}, max_attempts=2)
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            # Claimed by a process last heard of a second before the restart.
            conn.execute(
                "UPDATE axa_queue SET status = 'running', attempts = 1, "
                "started_at = now() - interval '1 s', updated_at = now() - interval '1 s' "
                "WHERE id = %s",
                (job_id,),
            )
        await queue.close()
        await asyncio.to_thread(server.stop, "immediate")
        await asyncio.to_thread(server.start)
        await queue.open()
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            # Silent for more than stale_after, the outage included (the clock moved on
            # by 1.1 s)...
            assert await queue.recover_stale(dry_run=True, now=later(conn, 1.1)) == []
            # ...but every worker was cut off by the restart: the silence since says
            # nothing yet, until stale_after has passed since it (moved on by 2.1 s).
            assert await queue.recover_stale(now=later(conn, 1.1)) == []
            assert await queue.recover_stale(now=later(conn, 2.1)) == [
                Recovered(job_id, "Lost", 1, JobState.QUEUED)
            ]
    finally:
        await queue.close()


async def test_after_a_restart_a_job_claimed_before_it_proves_its_claim_before_it_starts(
    server: EmbeddedPostgres, watch: Watch, monkeypatch
) -> None:
    from axa_queue.worker.claims import Claims

    proved: list[str] = []
    real = Claims.prove
    proving: contextvars.ContextVar[bool] = contextvars.ContextVar("proving", default=False)
    start = asyncio.Event()  # set once the run claimed ahead may start

    async def spy(self: Claims, one: Any) -> bool:
        proved.append(one.name)
        proving.set(True)  # this task's own: its beat is the proof's
        try:
            return await real(self, one)
        finally:
            start.set()

    # A heartbeat after the restart would prove the claim of the run waiting ahead as
    # well (and so the run would need no proof of its own): held, after the break,
    # until that run has been through its start, so its handler meets a claim not heard
    # of since before the restart (a beat held is no failure: nothing gives up).
    real_beat = Claims.beat

    async def beat(self: Claims, runs: Any) -> Any:
        if not proving.get() and self.connections.broken_at > 0:
            await start.wait()
        return await real_beat(self, runs)

    monkeypatch.setattr(Claims, "prove", spy)
    monkeypatch.setattr(Claims, "beat", beat)
    # One loop and a job claimed ahead, waiting for it across the restart; the running
    # one never given up for its silence while the server restarts (seconds, loaded).
    queue = Queue(
        server.dsn,
        QueueOptions(**{**OPTIONS, "workers": 1, "prefetch": 1, "stale_after": 30.0}),
    )
    release = asyncio.Event()
    started: list[str] = []

    async def first(args: Any) -> None:
        started.append("First")
        await release.wait()

    async def second(args: Any) -> None:
        started.append("Second")

    queue.handle("First", first)
    queue.handle("Second", second)
    await queue.open()
    try:
        await queue.enqueue("First", {}, priority=1)
        await queue.enqueue("Second", {})
        async with running(queue):
            await eventually(lambda: watch.counted("running", 2))
            await asyncio.to_thread(server.stop, "fast")
            await asyncio.to_thread(server.start)
            # The heartbeat finds the connection broken, then reconnects.
            await eventually(lambda: queue.worker is not None and queue.worker.broken_at > 0)
            release.set()
            await eventually(lambda: watch.counted("completed", 2), timeout=30)
        assert started == ["First", "Second"]
        assert proved == ["Second"], "a run claimed before the restart started unproved"
    finally:
        start.set()
        await queue.close()


def test_the_pools_reconnect_backoff_waits_at_most_half_a_second() -> None:
    from axa_queue.db.connector import RECONNECT_DELAYS, reconnect_delays

    delays = list(itertools.islice(reconnect_delays(), 12))
    assert delays[0] == RECONNECT_DELAYS[0]
    assert max(delays) == delays[-1] == RECONNECT_DELAYS[1]
    assert delays == sorted(delays)


class FailedTries:
    """Counts the tries to connect that fail (psycopg's own `connect`, which the queue's
    pool's connection class calls for each try)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = psycopg.AsyncConnection.connect.__func__  # type: ignore[attr-defined]

        async def counting(cls: Any, conninfo: str = "", **kwargs: Any) -> Any:
            try:
                return await real(cls, conninfo, **kwargs)
            except psycopg.OperationalError:
                self.count += 1
                raise

        monkeypatch.setattr(psycopg.AsyncConnection, "connect", classmethod(counting))


async def test_the_queues_pool_tries_again_quickly_and_never_waits_out_psycopg_pools_backoff(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = Queue(server.dsn, QueueOptions(**OPTIONS))
    await queue.open()
    try:
        await asyncio.to_thread(server.stop, "fast")
        failed = FailedTries(monkeypatch)
        await queue.pool.check()  # finds its connection broken: makes another, which fails
        await eventually(lambda: failed.count >= 4)
        # psycopg_pool has seen no failure, so it never waited its own backoff (1, 2,
        # 4 s ...): the tries are the connection class's, at `reconnect_delays()`.
        assert queue.pool.get_stats().get("connections_errors", 0) == 0
        await asyncio.to_thread(server.start)
        async with queue.pool.connection() as conn:
            assert await (await conn.execute("SELECT 1")).fetchone() == (1,)
    finally:
        await queue.close()


async def test_closing_the_queues_pool_ends_its_tries_to_connect_at_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from axa_queue.db.connector import Connector

    failed = FailedTries(monkeypatch)
    pool = Connector(QueueOptions(), f"postgresql://root@127.0.0.1:{free_port()}/test").pool()
    await pool.open(wait=False)
    await eventually(lambda: failed.count >= 2)
    with caplog.at_level(logging.WARNING, logger="psycopg.pool"):
        await pool.close()
    assert not [r for r in caplog.records if "couldn't stop" in r.getMessage()]
