"""The claim's plan on full tables, whatever the statistics say: each statement that
claims (`EXCHANGE`, `EXCHANGE_LIMITED`, `EXCHANGE_RATED`, `CLAIM`), prepared as the
worker's exchange connection prepares it (a generic plan, the session settings and
`CLAIM_SETTINGS`), reads a name's jobs only through that name's part of
`axa_queue_pick_hash`, and touches at most twice the buffers on a table full of finished,
delayed and other names' jobs as on one holding only the name's ready jobs; under a
held snapshot, walks dead entries once and touches no more buffers than the
single-index floor (`bench/floor.py`) in the same state. Asserted from `EXPLAIN (ANALYZE, BUFFERS)`, in a transaction
rolled back (EXPLAIN ANALYZE really claims), never from a time."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql

from axa_queue import SETUP_STATEMENTS, QueueOptions
from axa_queue import sql as axa_sql
from axa_queue.db.connector import Connector
from axa_queue.worker.connections import Connections
from conftest import fresh_schema, schema_dsn

BENCH = Path(__file__).resolve().parent.parent / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import floor  # noqa: E402  (bench/floor.py)
import run as bench  # noqa: E402  (bench/run.py)

pytestmark = pytest.mark.alone  # tables of some 250,000 rows

A = "send_report"
"""The name claimed."""

PICK = "axa_queue_pick_hash"
"""The index the claim walks each name's levels in (migration 19)."""

STATEMENTS = ("EXCHANGE", "EXCHANGE_LIMITED", "EXCHANGE_RATED", "CLAIM")


def wanted(statement: str) -> list[dict[str, Any]]:
    """What a worker asks `statement` for: ten of `A`, under a global limit for the
    limited statement, and a rate limit too for the rated one."""
    one: dict[str, Any] = {"name": A, "cap": 10}
    if statement in ("EXCHANGE_LIMITED", "EXCHANGE_RATED"):
        one["global"] = 50
    if statement == "EXCHANGE_RATED":
        one.update(rate=10, per_ms=1000)
    return [one]


def params(statement: str) -> dict[str, Any]:
    """The parameters of a claim of ten that records nothing, two loops idle (the rest
    claimed ahead), one losing run (a job that is not there)."""
    return {
        **bench.claim_params(10, [A], [10]),
        "wanted": json.dumps(wanted(statement)),
        "idle": 2,
        "losing": "{00000000-0000-0000-0000-000000000001}",
    }


@dataclass(frozen=True)
class Plan:
    """One claim's EXPLAIN (ANALYZE, BUFFERS): what it read and how much."""

    buffers: int
    """Shared buffers hit or read by the whole statement."""
    claimed: int
    """Rows the claim updated."""
    indexes: set[str]
    """The indexes of `axa_queue` read anywhere in the plan."""
    levels: set[str]
    """How the claim's own part (`CTE levels`) reads `axa_queue`: index names, or
    "Seq Scan"."""
    walked: int
    """Buffers of the claim's index scans of `axa_queue` (its probes and scans)."""
    scans: int
    """Buffers of the claim's scans of its levels (each from the first entry its probe
    found, under a `LockRows`), apart from the probes."""
    cost: float
    """The planner's estimate for the whole statement (`Total Cost`): the same for the
    same plan, so it tells a plan made again on other statistics apart."""
    text: str
    """The plan, for a failure's message."""


def _reads(node: dict[str, Any]) -> Iterator[str]:
    """How `node` and the nodes under it read `axa_queue`."""
    if node.get("Relation Name") == "axa_queue":
        yield node.get("Index Name") or node["Node Type"]
    for child in node.get("Plans", ()):
        yield from _reads(child)


def _claim_part(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The `CTE levels` subplans under `node`."""
    if node.get("Subplan Name") == "CTE levels":
        yield node
    for child in node.get("Plans", ()):
        yield from _claim_part(child)


def _scans(
    node: dict[str, Any], kinds: tuple[str, ...] = ("Index Scan",), *, locked: bool = False
) -> int:
    """Buffers of the index scans of `axa_queue` under `node` (of the `kinds` given;
    with `locked`, only those under a `LockRows`: the scans, not the probes)."""
    own = 0
    if node["Node Type"] in kinds and node.get("Relation Name") == "axa_queue":
        own = int(node["Shared Hit Blocks"] + node["Shared Read Blocks"])
    under = not locked or node["Node Type"] == "LockRows"
    return (own if under else 0) + sum(
        _scans(child, kinds, locked=locked and not under) for child in node.get("Plans", ())
    )


def _updated(node: dict[str, Any]) -> int:
    """Rows the claim's UPDATE (`claimed`) wrote."""
    if node.get("Subplan Name") == "CTE claimed":
        return int(node["Actual Rows"])
    return sum(_updated(child) for child in node.get("Plans", ()))


class Claims:
    """A connection on a schema with the claim statements PREPAREd as the worker's
    exchange connection prepares them (`SESSION_SETTINGS`: generic plans, no JIT;
    `CLAIM_SETTINGS`: no sort where an index gives the order)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        conn.execute(axa_sql.SESSION_SETTINGS)
        conn.execute(axa_sql.CLAIM_SETTINGS)
        self.prepared: set[str] = set()

    def prepare(self, statement: str) -> None:
        """PREPARE `statement` (a name in `sql`) again, planned with today's statistics."""
        if statement in self.prepared:
            self.conn.execute(pgsql.SQL("DEALLOCATE {}").format(pgsql.Identifier(statement)))
        text = bench.numbered(getattr(axa_sql, statement), bench.CLAIM_PARAMETERS)
        self.conn.execute(
            pgsql.SQL("PREPARE {}({}) AS {}").format(
                pgsql.Identifier(statement), pgsql.SQL(bench.CLAIM_TYPES), pgsql.SQL(text)
            )
        )
        self.prepared.add(statement)

    def explain(self, statement: str, *, vacuum: bool = True) -> Plan:
        """EXPLAIN (ANALYZE, BUFFERS) of one claim by `statement`, rolled back; run
        twice, the second measured (the first sets the hint bits of rows changed since
        they were last read). With `vacuum`, after a VACUUM (which removes what earlier
        claims, rolled back, left, so each measures the same table; it also makes the
        planner plan again)."""
        if statement not in self.prepared:
            self.prepare(statement)
        args = pgsql.SQL(", ").join(
            pgsql.SQL("{}::{}").format(pgsql.Literal(value), pgsql.SQL(kind))
            for value, kind in zip(
                (params(statement)[name] for name in bench.CLAIM_PARAMETERS),
                bench.CLAIM_TYPES.split(", "),
                strict=True,
            )
        )
        explain = pgsql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {}({})").format(
            pgsql.Identifier(statement), args
        )
        if vacuum:
            self.conn.execute("VACUUM axa_queue, axa_rate_slots")
        for _ in range(2):
            with self.conn.transaction(force_rollback=True):
                found = self.conn.execute(explain).fetchone()
        assert found is not None
        top = found[0][0]["Plan"]
        return Plan(
            buffers=int(top["Shared Hit Blocks"] + top["Shared Read Blocks"]),
            claimed=_updated(top),
            indexes=set(_reads(top)),
            levels={way for part in _claim_part(top) for way in _reads(part)},
            walked=sum(
                _scans(part, ("Index Scan", "Index Only Scan")) for part in _claim_part(top)
            ),
            scans=sum(_scans(part, locked=True) for part in _claim_part(top)),
            cost=float(top["Total Cost"]),
            text=json.dumps(found[0], indent=1),
        )

    def floor(self) -> int:
        """Buffers of the single-index floor's claim of ten (`floor.CLAIM_BATCH`), rolled
        back, run twice like `explain`."""
        explain = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + floor.CLAIM_BATCH
        self.conn.execute("VACUUM axa_queue, axa_rate_slots")
        for _ in range(2):
            with self.conn.transaction(force_rollback=True):
                found = self.conn.execute(explain, {"batch": 10}).fetchone()
        assert found is not None
        top = found[0][0]["Plan"]
        return int(top["Shared Hit Blocks"] + top["Shared Read Blocks"])


@contextlib.contextmanager
def table(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection on a fresh schema holding the queue's tables (dropped afterwards),
    which autovacuum leaves alone: each test's statistics are those its fixture took
    (an ANALYZE of autovacuum's own, whenever it comes by, would plan again on others)."""
    with (
        fresh_schema(database_url) as name,
        psycopg.connect(schema_dsn(database_url, name), autocommit=True) as conn,
    ):
        with conn.transaction():
            for statement in SETUP_STATEMENTS:
                conn.execute(statement)
            conn.execute("ALTER TABLE axa_queue SET (autovacuum_enabled = off)")
        conn.execute("SET axa_queue.notify = off")
        yield conn


def jobs(
    conn: psycopg.Connection[Any],
    count: int,
    *,
    name: str = "%s",
    status: str = "queued",
    priority: str = "0",
    seconds: str = "-60 - g / 1000.0",
) -> None:
    """`count` jobs made by one INSERT ... SELECT over `g` in 1..count: `name`,
    `priority` and `seconds` (their `run_at` from now) are SQL expressions of `g`."""
    conn.execute(
        pgsql.SQL(
            """INSERT INTO axa_queue (id, name, args, status, run_at, priority, started_at,
                   attempts)
               SELECT gen_random_uuid(), {name}, '{{}}', %(status)s,
                      now() + make_interval(secs => {seconds}), ({priority})::smallint,
                      CASE WHEN %(status)s = 'queued' THEN NULL ELSE now() END,
                      CASE WHEN %(status)s = 'queued' THEN 0 ELSE 1 END
               FROM generate_series(1, %(count)s) g"""
        ).format(
            name=pgsql.SQL(name) if name != "%s" else pgsql.Literal(A),
            seconds=pgsql.SQL(seconds),
            priority=pgsql.SQL(priority),
        ),
        {"status": status, "count": count},
    )


OTHER = "(ARRAY['resize_image', 'sync_account'])[1 + mod(g, 2)]"
"""The names the claim does not ask for, as an expression of `g`."""


def adversarial(conn: psycopg.Connection[Any]) -> None:
    """The table of issue 25: 50,000 finished jobs of `A`, 100,000 ready jobs of other
    names at every priority (-2..2) and older than any of `A`'s, 100,000 delayed jobs at
    higher priorities (a third of them `A`'s, at 5; the others' at 3..7), and 5 ready
    jobs of `A` (priority 0)."""
    a = pgsql.Literal(A).as_string()
    jobs(conn, 50_000, status="completed", priority="mod(g, 3)", seconds="-3600 - g")
    jobs(conn, 100_000, name=OTHER, priority="mod(g, 5) - 2", seconds="-86400 + g / 1000.0")
    jobs(
        conn,
        100_000,
        name=f"CASE WHEN mod(g, 3) = 0 THEN {a} ELSE {OTHER} END",
        priority="CASE WHEN mod(g, 3) = 0 THEN 5 ELSE 3 + mod(g, 5) END",
        seconds="3600 + g",
    )
    jobs(conn, 5)
    conn.execute("ANALYZE axa_queue")


def adversarial_levels(conn: psycopg.Connection[Any]) -> None:
    """`adversarial`, but the delayed jobs of `A` spread over five priorities (3..7,
    as the others'): five levels above its ready jobs, each probed."""
    a = pgsql.Literal(A).as_string()
    jobs(conn, 50_000, status="completed", priority="mod(g, 3)", seconds="-3600 - g")
    jobs(conn, 100_000, name=OTHER, priority="mod(g, 5) - 2", seconds="-86400 + g / 1000.0")
    jobs(
        conn,
        100_000,
        name=f"CASE WHEN mod(g, 3) = 0 THEN {a} ELSE {OTHER} END",
        priority="3 + mod(g, 5)",
        seconds="3600 + g",
    )
    jobs(conn, 5)
    conn.execute("ANALYZE axa_queue")


@pytest.fixture(scope="module")
def only_ready(database_url: str) -> Iterator[dict[str, Plan]]:
    """Each statement's claim of `A` on a table holding only `A`'s 5 ready jobs."""
    with table(database_url) as conn:
        jobs(conn, 5)
        conn.execute("ANALYZE axa_queue")
        claims = Claims(conn)
        yield {statement: claims.explain(statement) for statement in STATEMENTS}


@pytest.fixture(scope="module")
def full(database_url: str) -> Iterator[Claims]:
    """The adversarial table (`adversarial`), analyzed."""
    with table(database_url) as conn:
        adversarial(conn)
        yield Claims(conn)


@pytest.fixture(scope="module")
def full_levels(database_url: str) -> Iterator[Claims]:
    """The adversarial table with `A`'s delayed jobs at five priorities
    (`adversarial_levels`), analyzed."""
    with table(database_url) as conn:
        adversarial_levels(conn)
        yield Claims(conn)


@pytest.mark.parametrize("levels", ["full", "full_levels"])
@pytest.mark.parametrize("statement", STATEMENTS)
def test_a_claim_reads_only_its_names_part_of_the_pick_index_on_a_full_table(
    statement: str, levels: str, only_ready: dict[str, Plan], request: pytest.FixtureRequest
) -> None:
    plan = request.getfixturevalue(levels).explain(statement)
    alone = only_ready[statement]
    assert plan.claimed == alone.claimed == 5, plan.text
    assert plan.levels == {PICK}, plan.text
    assert "axa_queue_claim" not in plan.indexes and "Seq Scan" not in plan.indexes, plan.text
    assert plan.buffers <= 2 * alone.buffers, plan.text


@pytest.fixture(scope="module")
def planned_empty(database_url: str) -> dict[str, Plan]:
    """Each statement's claim of `A` by the plan made on a fresh table, never analyzed
    or vacuumed, before it held a row (a generic plan: kept until something makes it
    again), run after the table filled up behind it: 100,000 ready jobs of other names,
    older, and 5 of `A`. A plan is made again when the connection's caches are reset (a
    connection busy while the server's other sessions change many catalogs falls
    behind their messages, and a dropped schema resets every plan of its database):
    each plan run is checked to be the one made on the empty table (the same
    estimate), else it is all done again on a new table."""
    for _ in range(5):
        with table(database_url) as conn:
            claims = Claims(conn)
            empty = {statement: claims.explain(statement, vacuum=False) for statement in STATEMENTS}
            assert all(plan.claimed == 0 for plan in empty.values())
            # Filled by another connection: this one, idle meanwhile, reads the server's
            # cache messages as they come, never falling so far behind that its caches
            # (and plans) are reset.
            with psycopg.connect(conn.info.dsn, autocommit=True) as filler:
                jobs(
                    filler,
                    100_000,
                    name=OTHER,
                    priority="mod(g, 5) - 2",
                    seconds="-86400 + g / 1000.0",
                )
                jobs(filler, 5)
            full = {statement: claims.explain(statement, vacuum=False) for statement in STATEMENTS}
            if all(full[statement].cost == empty[statement].cost for statement in STATEMENTS):
                return full
    pytest.fail("the plans made on the empty table were made again five times")


@pytest.mark.parametrize("statement", STATEMENTS)
def test_a_plan_made_on_an_empty_table_still_reads_only_the_names_part_when_it_fills(
    statement: str, planned_empty: dict[str, Plan]
) -> None:
    # A worker that starts on a fresh database plans the claim once. Planned on an
    # empty table (ten pages, for all the planner knows), every row the statement
    # changes was found by a scan of the whole table (1,940 buffers for this claim of
    # 5) until the exchange connection turned sequential scans off (`CLAIM_SETTINGS`):
    # no shape of the statement avoids it.
    plan = planned_empty[statement]
    assert plan.claimed == 5, plan.text
    assert plan.levels == {PICK}, plan.text
    assert "axa_queue_claim" not in plan.indexes and "Seq Scan" not in plan.indexes, plan.text
    assert plan.buffers <= 100, plan.text


@pytest.fixture(scope="module")
def one_name_statistics(database_url: str) -> Iterator[Claims]:
    """Statistics taken while the table held only `A`'s jobs (every row has the name,
    for all the planner knows: 50,000 finished and 5 ready), then other names' backlog
    arrived: 100,000 ready jobs, older. Every row is sampled, so the statistics are the
    same at every run."""
    with table(database_url) as conn:
        conn.execute("SET default_statistics_target = 10000")
        jobs(conn, 50_000, status="completed", priority="mod(g, 3)", seconds="-3600 - g")
        jobs(conn, 5)
        conn.execute("ANALYZE axa_queue")
        jobs(conn, 100_000, name=OTHER, priority="mod(g, 5) - 2", seconds="-86400 + g / 1000.0")
        yield Claims(conn)


@pytest.fixture(scope="module")
def idle_statistics(database_url: str) -> Iterator[Claims]:
    """The common state of a queue: statistics taken while it was idle, finished jobs
    filling the table (50,000), so every partial index of queued jobs looks empty to
    the planner; then 5 jobs of `A` and, newer, 100,000 of other names. Every row is
    sampled."""
    with table(database_url) as conn:
        conn.execute("SET default_statistics_target = 10000")
        jobs(conn, 50_000, status="completed", priority="mod(g, 3)", seconds="-3600 - g")
        conn.execute("ANALYZE axa_queue")
        jobs(conn, 5, seconds="-90000 - g")
        jobs(conn, 100_000, name=OTHER, priority="mod(g, 5) - 2", seconds="-86400 + g / 1000.0")
        yield Claims(conn)


@pytest.mark.parametrize("statistics", ["one_name_statistics", "idle_statistics"])
@pytest.mark.parametrize("statement", STATEMENTS)
def test_misleading_statistics_do_not_make_the_claim_read_other_names(
    statement: str, statistics: str, request: pytest.FixtureRequest
) -> None:
    # Without `CLAIM_SETTINGS`, with the idle statistics the planner read
    # `axa_queue_ready` whole and sorted (4,464 buffers; 24,261 for the claim before
    # it walked each name's own levels): every partial index of queued jobs looked
    # empty, and that one is the shallowest. `A`'s jobs are the oldest there, so a scan
    # of the ready index from them to now() would read every other job.
    plan = request.getfixturevalue(statistics).explain(statement)
    assert plan.claimed == 5, plan.text
    assert plan.levels == {PICK}, plan.text
    assert "axa_queue_claim" not in plan.indexes and "Seq Scan" not in plan.indexes, plan.text
    assert plan.buffers <= 100, plan.text


@pytest.fixture(scope="module")
def held(database_url: str) -> Iterator[Claims]:
    """A table of `A`'s jobs only: 50,000 finished, 20 ready, and in front of them (older,
    same priority) 20,000 finished while another connection held a `REPEATABLE READ`
    snapshot, still held: dead index entries no one can remove yet."""
    with table(database_url) as conn:
        jobs(conn, 50_000, status="completed", priority="mod(g, 3)", seconds="-3600 - g")
        jobs(conn, 20_000, seconds="-600 - g / 100.0")
        jobs(conn, 20)
        conn.execute("ANALYZE axa_queue")
        with psycopg.connect(conn.info.dsn) as holder:
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM axa_queue")
            conn.execute(
                "UPDATE axa_queue SET status = 'completed', started_at = now(), attempts = 1 "
                "WHERE status = 'queued' AND run_at < now() - interval '500 seconds'"
            )
            yield Claims(conn)
            holder.rollback()


@pytest.mark.parametrize("statement", STATEMENTS)
def test_dead_entries_in_front_of_a_level_are_walked_once_as_the_floor_walks_them(
    statement: str, held: Claims, only_ready: dict[str, Plan]
) -> None:
    plan = held.explain(statement)
    floor_buffers = held.floor()
    assert plan.claimed == 10, plan.text
    assert plan.levels == {PICK}, plan.text
    # The scan starts at the first live entry its probe found: it reads the ten jobs
    # it claims, not the 20,000 dead entries again (they take some 500 buffers).
    assert plan.scans <= 20, plan.text
    # The probe walks them once, as the single-index floor does, in an index as narrow
    # as the floor's (24 bytes an entry), and the claimed rows are updated by the
    # `ctid` they were locked at (no primary key lookups): no more buffers in all,
    # whatever the limits read of their own.
    assert plan.buffers <= floor_buffers, plan.text


@pytest.fixture(scope="module")
def filled_above(database_url: str) -> Iterator[Claims]:
    """`A`'s 20 ready jobs at priority 1 and, below them, 5,000 at priority 0 finished
    while a `REPEATABLE READ` snapshot is held (dead entries no one can remove yet) and
    5 ready."""
    with table(database_url) as conn:
        jobs(conn, 20, priority="1")
        jobs(conn, 5_000, seconds="-600 - g / 100.0")
        jobs(conn, 5)
        conn.execute("ANALYZE axa_queue")
        with psycopg.connect(conn.info.dsn) as holder:
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM axa_queue")
            conn.execute(
                "UPDATE axa_queue SET status = 'completed', started_at = now(), attempts = 1 "
                "WHERE priority = 0 AND run_at < now() - interval '500 seconds'"
            )
            yield Claims(conn)
            holder.rollback()


@pytest.mark.parametrize("statement", STATEMENTS)
def test_a_name_whose_cap_is_filled_walks_no_lower_level(
    statement: str, filled_above: Claims
) -> None:
    # Ten of the 20 jobs at priority 1 fill the cap: the level below, 5,000 dead entries
    # in front of its 5 jobs, is never probed.
    plan = filled_above.explain(statement)
    assert plan.claimed == 10, plan.text
    assert plan.levels == {PICK}, plan.text
    assert plan.walked <= 30, plan.text


def test_a_row_changed_after_the_claims_snapshot_stays_queued_for_the_next_claim(
    database_url: str,
) -> None:
    # The claim updates its rows by the `ctid` it locked them at. A row another
    # transaction changed (still queued) after the statement's snapshot was taken is
    # locked at its newer version, which this snapshot does not see there: it is left
    # queued, not claimed, and the next claim takes it. The claim under a global limit
    # waits for the name's lock after its snapshot, which makes the window.
    with table(database_url) as conn:
        jobs(conn, 3)
        first = conn.execute("SELECT id FROM axa_queue ORDER BY run_at LIMIT 1").fetchone()
        assert first is not None
        claims = Claims(conn)
        claims.prepare("EXCHANGE_LIMITED")
        args = pgsql.SQL(", ").join(
            pgsql.SQL("{}::{}").format(pgsql.Literal(value), pgsql.SQL(kind))
            for value, kind in zip(
                (params("EXCHANGE_LIMITED")[name] for name in bench.CLAIM_PARAMETERS),
                bench.CLAIM_TYPES.split(", "),
                strict=True,
            )
        )
        claim = pgsql.SQL("EXECUTE {}({})").format(pgsql.Identifier("EXCHANGE_LIMITED"), args)
        claimed: list[Any] = []
        pid = conn.info.backend_pid
        with (
            psycopg.connect(conn.info.dsn, autocommit=True) as other,
            psycopg.connect(conn.info.dsn, autocommit=True) as watch,
        ):
            with other.transaction():
                other.execute(  # the lock `axa_queue_room` takes for the name
                    "SELECT pg_advisory_xact_lock(hashtextextended("
                    "'axa_queue'::regclass::oid::text || ' ' || %s, 1635213689))",
                    (A,),
                )
                running = threading.Thread(
                    target=lambda: claimed.extend(conn.execute(claim).fetchall())
                )
                running.start()
                waiting = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s"
                while running.is_alive() and watch.execute(waiting, (pid,)).fetchone() != (True,):
                    pass  # until the claim, its snapshot taken, waits for the name's lock
                other.execute("UPDATE axa_queue SET args = '{\"n\": 1}' WHERE id = %s", first)
            running.join()
        rows = {str(row[0]) for row in claimed if row[2] is not None}
        assert len(rows) == 2 and str(first[0]) not in rows
        assert conn.execute(
            "SELECT status, attempts FROM axa_queue WHERE id = %s", first
        ).fetchone() == ("queued", 0)
        again = claims.explain("EXCHANGE_LIMITED")
        assert again.claimed == 1, again.text


async def test_the_exchange_connection_plans_its_claims_without_sorts_or_table_scans(
    dsn: str,
) -> None:
    connections = Connections(Connector(QueueOptions(), dsn), stale=30.0)
    conn = await connections.for_exchange()
    try:
        settings = await (
            await conn.execute(
                "SELECT current_setting('enable_sort'), current_setting('enable_seqscan'), "
                "current_setting('jit')"
            )
        ).fetchone()
        assert settings == ("off", "off", "off")
    finally:
        await conn.close()
