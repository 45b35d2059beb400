"""Rate limits: at most N claims of a name in any window of `per`, across every process,
checked and stamped by the claim statement; proved from the database's own record of
every start (a test trigger), with several worker processes claiming one name at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from axa_queue import NewJob, OptionsError, Queue, QueueOptions, sql
from axa_queue.limits import Limits
from axa_queue.worker import decisions
from axa_queue.worker.exchange import Exchange
from conftest import eventually, running, set_up, status_of
from processes import worker_script

STARTS = """
CREATE TABLE start_log (name TEXT NOT NULL, at TIMESTAMPTZ NOT NULL);
CREATE FUNCTION start_note() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO start_log VALUES (NEW.name, NEW.started_at);
    RETURN NULL;
END
$$;
CREATE TRIGGER start_note AFTER UPDATE OF status ON axa_queue
    FOR EACH ROW WHEN (NEW.status = 'running' AND OLD.status <> 'running')
    EXECUTE FUNCTION start_note();
"""
"""The test's own record of every start (every claim, retries too) with the time the
claim stamped on the job (`started_at`, the database's clock)."""


def busiest_window(admin: psycopg.Connection[Any], name: str, per: timedelta) -> int:
    """The most starts of `name` in any window of `per` (each window starting at a
    start: the busiest always does), from the database's timestamps."""
    row = admin.execute(
        """SELECT max((SELECT count(*) FROM start_log b
                       WHERE b.name = a.name AND b.at >= a.at AND b.at < a.at + %s))
           FROM start_log a WHERE a.name = %s""",
        (per, name),
    ).fetchone()
    assert row is not None and row[0] is not None, f"no start of {name}"
    return int(row[0])


def starts(admin: psycopg.Connection[Any], name: str) -> int:
    row = admin.execute("SELECT count(*) FROM start_log WHERE name = %s", (name,)).fetchone()
    assert row is not None
    return int(row[0])


def drained(admin: psycopg.Connection[Any]) -> Callable[[], bool]:
    def check() -> bool:
        row = admin.execute("SELECT count(*) FROM axa_queue WHERE status <> 'completed'").fetchone()
        return row is not None and row[0] == 0

    return check


# --- validation --------------------------------------------------------------------------


def test_a_rate_limit_refuses_a_count_that_is_not_a_positive_integer() -> None:
    queue = Queue("postgresql://unused")
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(OptionsError, match="rate limit of job 'Call' to be a positive integer"):
            queue.rate_limit("Call", bad, per=timedelta(seconds=1))  # type: ignore[arg-type]


def test_a_rate_limit_refuses_a_window_that_is_not_a_positive_timedelta() -> None:
    queue = Queue("postgresql://unused")
    for bad in (timedelta(0), timedelta(seconds=-1), 1, None):
        with pytest.raises(OptionsError, match=r"such as timedelta\(seconds=1\)"):
            queue.rate_limit("Call", 3, per=bad)  # type: ignore[arg-type]


def test_a_rate_limit_refuses_a_name_no_job_can_have() -> None:
    queue = Queue("postgresql://unused")
    with pytest.raises(OptionsError):
        queue.rate_limit("", 3, per=timedelta(seconds=1))


def test_a_rate_limit_keeps_its_window_in_whole_milliseconds_rounded_up() -> None:
    queue = Queue("postgresql://unused")
    queue.rate_limit("Call", 10, per=timedelta(seconds=1))
    queue.rate_limit("Tiny", 1, per=timedelta(microseconds=1))
    assert queue.registry.limits.rate == {"Call": (10, 1000), "Tiny": (1, 1)}


def test_only_a_process_with_a_rate_limit_claims_through_the_rate_gate() -> None:
    for statement in (sql.EXCHANGE, sql.EXCHANGE_LIMITED):
        assert "axa_rate_slots" not in statement and "axa_queue_rate_slots_free" not in statement
    assert "axa_queue_rate_slots_free" in sql.EXCHANGE_RATED
    wanted = decisions.wanted(["B", "A"], Limits(global_={"B": 2}, rate={"A": (10, 1000)}), {}, 4)
    assert wanted == [
        {"name": "A", "cap": 4, "rate": 10, "per_ms": 1000},
        {"name": "B", "cap": 4, "global": 2},
    ]
    plain = Queue("postgresql://unused")
    rated = Queue("postgresql://unused")
    rated.rate_limit("A", 1, per=timedelta(seconds=1))
    for queue, recording, statement in (
        (plain, True, sql.EXCHANGE),
        (plain, False, sql.CLAIM),
        (rated, True, sql.EXCHANGE_RATED),
        (rated, False, sql.EXCHANGE_RATED),
    ):
        exchange = Exchange.__new__(Exchange)
        exchange.registry = queue.registry
        exchange.schema = None
        assert exchange.statement(recording) is sql.numbered(statement)


# --- one process -------------------------------------------------------------------------


async def test_one_process_never_starts_more_than_the_rate_in_any_window(make_queue, admin) -> None:
    queue = await make_queue(workers=4, prefetch=4)
    admin.execute(STARTS)
    per = timedelta(milliseconds=300)
    queue.rate_limit("Call", 3, per=per)
    queue.handle("Call", lambda args: None)
    queue.handle("Free", lambda args: None)
    await queue.enqueue_all([NewJob("Call", {"n": n}) for n in range(12)])
    await queue.enqueue_all([NewJob("Free", {"n": n}) for n in range(12)])
    async with running(queue):
        await eventually(drained(admin), timeout=60)
    assert starts(admin, "Call") == 12
    assert busiest_window(admin, "Call", per) == 3  # reached, never passed
    assert busiest_window(admin, "Free", per) > 3  # other names are not held back
    # One slot per claim allowed in a window, never more rows than the rate.
    slots = admin.execute("SELECT name, slot FROM axa_rate_slots ORDER BY slot").fetchall()
    assert slots == [("Call", 0), ("Call", 1), ("Call", 2)]


async def test_a_retried_job_counts_again_at_each_start(make_queue, admin) -> None:
    queue = await make_queue(workers=4, retry_backoff=0)
    admin.execute(STARTS)
    per = timedelta(milliseconds=300)
    queue.rate_limit("Flaky", 2, per=per)

    @queue.handler("Flaky", max_attempts=3)
    async def flaky(args: Any) -> None:
        from axa_queue import current_job

        if current_job().attempt < 3:
            raise RuntimeError("not yet")

    await queue.enqueue_all([NewJob("Flaky", {"n": n}) for n in range(3)])
    async with running(queue):
        await eventually(drained(admin), timeout=60)
    assert starts(admin, "Flaky") == 9  # three attempts of each job
    assert busiest_window(admin, "Flaky", per) == 2


async def test_a_worker_looks_again_when_the_window_frees_not_at_the_poll_interval(
    make_queue, admin
) -> None:
    # A poll interval of an hour: only the statement saying when the next slot frees
    # can start the second job while the test waits.
    queue = await make_queue(workers=2, poll_interval=3600)
    queue.rate_limit("Call", 1, per=timedelta(milliseconds=200))
    second = asyncio.Event()
    seen: list[int] = []

    @queue.handler("Call")
    async def call(args: Any) -> None:
        seen.append(args["n"])
        if len(seen) == 2:
            second.set()

    await queue.enqueue_all([NewJob("Call", {"n": n}) for n in range(2)])
    async with running(queue):
        await asyncio.wait_for(second.wait(), 60)  # far less than the poll interval
    assert sorted(seen) == [0, 1]


async def test_a_rate_limit_and_a_global_limit_on_one_name_both_apply(make_queue, admin) -> None:
    queue = await make_queue(workers=4)
    queue.limit("Report", 1, scope="global")
    queue.rate_limit("Report", 2, per=timedelta(hours=1))
    running_now: list[int] = []
    started, release = asyncio.Event(), asyncio.Event()
    other = asyncio.Event()

    @queue.handler("Report")
    async def report(args: Any) -> None:
        running_now.append(args["n"])
        started.set()
        await release.wait()

    queue.handle("Other", lambda args: other.set())
    ids = [await queue.enqueue("Report", {"n": n}) for n in range(3)]
    async with running(queue):
        await asyncio.wait_for(started.wait(), 15)
        # The global limit: one at a time, though loops are free and slots too.
        assert sorted(status_of(admin, one)[0] for one in ids) == ["queued", "queued", "running"]
        release.set()
        await eventually(
            lambda: (
                sorted(status_of(admin, one)[0] for one in ids)
                == ["completed", "completed", "queued"]
            )
        )
        # The rate: two starts an hour. A later claim (for another job) passes it by.
        await queue.enqueue("Other", {})
        await asyncio.wait_for(other.wait(), 15)
        await eventually(
            lambda: (
                admin.execute(
                    "SELECT count(*) FROM axa_queue WHERE name = 'Other' AND status = 'completed'"
                ).fetchone()
                == (1,)
            )
        )
    assert sorted(status_of(admin, one)[0] for one in ids) == ["completed", "completed", "queued"]
    assert len(running_now) == 2


async def test_a_worker_without_rate_limits_claims_freely_and_never_touches_the_slots(
    make_queue, admin
) -> None:
    limited = await make_queue(workers=2)
    admin.execute(STARTS)
    limited.rate_limit("Call", 1, per=timedelta(hours=1))
    limited.handle("Call", lambda args: None)
    await limited.enqueue("Call", {"n": 0})
    async with running(limited):
        await eventually(drained(admin))
    # Another process, without the limit, runs the name as it likes.
    free = await make_queue(workers=4)
    free.handle("Call", lambda args: None)
    await free.enqueue_all([NewJob("Call", {"n": n}) for n in range(1, 9)])
    async with running(free):
        await eventually(drained(admin))
    assert starts(admin, "Call") == 9
    assert admin.execute("SELECT count(*) FROM axa_rate_slots").fetchone() == (1,)


async def test_a_rate_limit_holds_for_a_queue_given_its_schema_with_no_search_path(
    database_url: str, schema: str, admin
) -> None:
    # The slots are then read through the table named by the claim (`EXECUTE`).
    dsn = psycopg.conninfo.make_conninfo(
        database_url, options="-c search_path=", application_name=schema
    )
    queue = Queue(dsn, QueueOptions(schema=schema, poll_interval=0.05, workers=4))
    queue.rate_limit("Call", 1, per=timedelta(hours=1))
    ran: list[int] = []
    first = asyncio.Event()

    @queue.handler("Call")
    async def call(args: Any) -> None:
        ran.append(args["n"])
        first.set()

    async with queue:
        ids = [await queue.enqueue("Call", {"n": n}) for n in range(3)]
        async with running(queue):
            await asyncio.wait_for(first.wait(), 15)
            await eventually(
                lambda: (
                    sorted(status_of(admin, one)[0] for one in ids)
                    == ["completed", "queued", "queued"]
                )
            )
    assert len(ran) == 1
    assert admin.execute("SELECT name, slot FROM axa_rate_slots").fetchall() == [("Call", 0)]


# --- several processes -------------------------------------------------------------------

WORKER_SCRIPT = worker_script(
    """
    rate, per_ms = int(sys.argv[3]), int(sys.argv[4])
    queue = Queue(dsn, racing(int(sys.argv[2])))
    queue.rate_limit("Call", rate, per=timedelta(milliseconds=per_ms))

    @queue.handler("Call")
    async def call(args):
        await asyncio.sleep(0.005)
"""
)


async def test_several_processes_claiming_one_name_never_exceed_the_rate_in_any_window(
    worker_processes, make_queue, admin
) -> None:
    queue = await make_queue()
    admin.execute(STARTS)
    per = timedelta(milliseconds=150)
    # Four processes of four loops each, with and without jobs claimed ahead; the
    # first one's slots are made by its first claim, the others' race for them.
    await worker_processes.start_all(
        WORKER_SCRIPT, [(prefetch, 3, 150) for prefetch in (0, 0, 4, 16)]
    )
    # Each burst wakes every idle process at once (one notification): all of them
    # claim the same name in the same moment, the race a rate limit must win.
    for _burst in range(4):
        await queue.enqueue_all([NewJob("Call", {"n": n}) for n in range(12)])
        await eventually(drained(admin), timeout=60)
    assert starts(admin, "Call") == 48
    assert busiest_window(admin, "Call", per) == 3  # reached, never passed


def free_slots(admin: psycopg.Connection[Any], name: str, most: int, want: int) -> list[int]:
    """The free slots the claim's rate gate finds for `name` (a limit of `most` a second)."""
    row = admin.execute(
        "SELECT axa_queue_rate_slots_free('axa_queue'::regclass, 'axa_rate_slots'::regclass, "
        "%s, %s, 1000, NULL, %s)",
        (name, most, want),
    ).fetchone()
    assert row is not None
    return list(row[0])


def test_the_rate_gate_finds_a_new_rings_first_slots_without_numbering_the_whole_ring(
    admin,
) -> None:
    set_up(admin)
    # A ring of 100,000 (the most a statement asks for) with nothing stamped: the first
    # ten numbers, found by walking up from the count of rows (0), ten looks; migration
    # 7's function numbered and sorted all 100,000 for each name at every claim.
    assert free_slots(admin, "Report", 100_000, 10) == list(range(10))
    # Slots 0 to 5 used just now: the next free numbers are those after them.
    admin.execute(
        "INSERT INTO axa_rate_slots (name, slot, at) SELECT 'Report', g, now() "
        "FROM generate_series(0, 5) g"
    )
    assert free_slots(admin, "Report", 100_000, 3) == [6, 7, 8]
    # Used long enough ago, they are free again, lowest first, before any new number.
    admin.execute("UPDATE axa_rate_slots SET at = now() - interval '2 s' WHERE slot < 2")
    assert free_slots(admin, "Report", 100_000, 4) == [0, 1, 6, 7]
    # A ring that is whole gives only the slots free again.
    assert free_slots(admin, "Report", 6, 4) == [0, 1]
    # A hole below the count (rows written by hand) stays unused: fewer claims, never more.
    admin.execute(
        "INSERT INTO axa_rate_slots (name, slot, at) VALUES ('Other', 0, now()), ('Other', 2, now())"
    )
    assert free_slots(admin, "Other", 10, 2) == [3, 4]
