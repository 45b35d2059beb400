"""Reads stay bounded on big tables: `jobs` reads a page through the newest-jobs indexes
(migration 12), `counts` and `counts_by_name` read each state at most `cap + 1` rows
deep and estimate past that, saying which numbers are estimates. Plans are checked by
`EXPLAIN (ANALYZE, BUFFERS)` of each statement prepared as the queue's connections
prepare it (generic plans forced), on tables of a few thousand rows: which index, how
many rows and buffers; never a time.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql as pgsql

from axa_queue import SyncQueue, history, sql
from axa_queue.cli import main
from axa_queue.db.calls import run_sync
from axa_queue.jobs.reads import counts_by_name_call, counts_call
from axa_queue.sql.acts import BULK_SCOPE
from conftest import set_up

NAMES = ("alpha", "beta", "gamma")


def setup(admin: psycopg.Connection[Any]) -> None:
    set_up(admin)


def seed(admin: psycopg.Connection[Any], moved: int, ready: int) -> None:
    """`moved` finished jobs in the history over the last three days (9 in 10
    completed), `ready` queued ones, a few running and in review, analyzed."""
    with psycopg.connect(admin.info.dsn, autocommit=True) as conn:
        # The day partitions of the last five days, with the statement `history.make_days`
        # makes them with (it makes them for the finished jobs in `axa_queue`, not these).
        conn.execute(
            sql.HISTORY_DAYS,
            {
                "now": None,
                "first_day": datetime.now(timezone.utc).date() - timedelta(days=5),
                "ahead": history.AHEAD_DAYS,
            },
        )
        conn.execute(
            """INSERT INTO axa_queue_history (id, name, args, status, run_at, created_at,
                   updated_at, attempts, priority, given_back)
               SELECT gen_random_uuid(), (%(names)s::text[])[1 + g %% 3], '{}',
                   CASE WHEN g %% 10 < 9 THEN 'completed' WHEN g %% 20 = 9 THEN 'failed'
                        ELSE 'cancelled' END, t, t, t, 1, 0, 0
               FROM generate_series(1, %(n)s) g,
                    LATERAL (SELECT now() - interval '3 days' * (1 - g::float8 / %(n)s)
                             - interval '1 hour') x(t)""",
            {"n": moved, "names": list(NAMES)},
        )
        conn.execute(
            """INSERT INTO axa_queue (id, name, args, run_at, created_at, updated_at)
               SELECT gen_random_uuid(), (%(names)s::text[])[1 + g %% 3], '{}', t, t, t
               FROM generate_series(1, %(n)s) g,
                    LATERAL (SELECT now() - interval '1 hour' * (1 - g::float8 / %(n)s)
                             - interval '1 second') x(t)""",
            {"n": ready, "names": list(NAMES)},
        )
        conn.execute(
            """INSERT INTO axa_queue (id, name, args, status, attempts, started_at)
               SELECT gen_random_uuid(), 'alpha', '{}',
                   CASE WHEN g <= 5 THEN 'running' ELSE 'needs_review' END, 1, now()
               FROM generate_series(1, 7) g"""
        )
        parts = [
            r[0]
            for r in conn.execute(
                "SELECT inhrelid::regclass::text FROM pg_inherits "
                "WHERE inhparent = 'axa_queue_history'::regclass"
            )
        ]
        for table in ["axa_queue", *parts]:
            conn.execute(pgsql.SQL("VACUUM (ANALYZE) {}").format(pgsql.SQL(table)))


@pytest.fixture
def explained(dsn: str) -> Iterator[Any]:
    """`explained(statement, params)`: the JSON plan of `statement` prepared with
    `params` under the queue's session settings, run by `EXPLAIN (ANALYZE, BUFFERS)`."""
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        conn.execute(sql.SESSION_SETTINGS)

        def explain(statement: str, params: dict[str, Any]) -> dict[str, Any]:
            order: list[str] = []

            def number(found: re.Match[str]) -> str:
                if found.group(1) not in order:
                    order.append(found.group(1))
                return f"${order.index(found.group(1)) + 1}"

            text = re.sub(r"%\((\w+)\)s", number, statement).replace("%%", "%")
            conn.execute(pgsql.SQL("PREPARE probe AS {}").format(pgsql.SQL(text)))  # type: ignore[arg-type]
            try:
                args = pgsql.SQL(", ").join(pgsql.Literal(params[n]) for n in order)
                row = conn.execute(
                    pgsql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE probe({})").format(
                        args
                    )
                ).fetchone()
            finally:
                conn.execute("DEALLOCATE probe")
            assert row is not None
            plan: dict[str, Any] = row[0][0]["Plan"]
            return plan

        yield explain


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def buffers(plan: dict[str, Any]) -> int:
    return int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])


def pages_of(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute(
        "SELECT sum(relpages) FROM pg_class WHERE relname = 'axa_queue' "
        "OR relname LIKE 'axa\\_queue\\_history\\_2%'"
    ).fetchone()
    assert row is not None
    return int(row[0])


ASKED = [
    (state, name)
    for state in (None, "completed", "failed", "cancelled", "queued")
    for name in (None, "alpha", "nobody")
]
"""Every kind of `jobs` call: no filter, a state (common, rare, live), a name (common,
absent), both."""


@pytest.mark.parametrize("state, name", ASKED)
def test_jobs_reads_a_page_through_the_newest_jobs_indexes_never_every_row(
    admin, dsn: str, explained, state: str | None, name: str | None
) -> None:
    setup(admin)
    seed(admin, moved=6000, ready=3000)
    pages = pages_of(admin)
    asked = {"state": state, "name": name, "limit": 50, "now": None, "beat_ms": sql.ABSENT_BEAT_MS}
    plan = explained(sql.JOBS, asked)
    ran = [n for n in nodes(plan) if n.get("Actual Loops", 0) > 0]  # not a branch skipped
    used = {n.get("Index Name") for n in ran}
    scanned = {n.get("Relation Name") for n in ran if n["Node Type"] == "Seq Scan"}
    assert not any(r == "axa_queue" or r.startswith("axa_queue_history") for r in scanned), scanned
    if state in (None, "queued"):
        assert "axa_queue_queued_created" in used, used
    moved = {i for i in used if i and i.startswith("axa_queue_history_2")}
    if state != "queued":
        by_name = {i for i in moved if "_name_status_" in i}
        assert moved and (bool(by_name) if name else not by_name), moved
    else:
        assert not moved, moved
    # A page of 50 and a descent of each day's index (a day's partition it had to look
    # into: how many there are depends on the time of day the test runs at), far from
    # every page.
    days = admin.execute(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'axa_queue_history'::regclass"
    ).fetchone()
    assert days is not None
    assert buffers(plan) < pages / 4 + 3 * days[0], (buffers(plan), pages, days[0])
    assert plan["Actual Rows"] == (0 if name == "nobody" else 50)


def test_blocked_jobs_are_listed_from_a_page_of_their_index_never_a_sort_of_them_all(
    admin, dsn: str, explained
) -> None:
    setup(admin)
    admin.execute(
        """INSERT INTO axa_queue (id, name, args, status, created_at)
           SELECT gen_random_uuid(), 'n' || (g % 20), '{}', 'blocked',
                  now() - g * interval '1 second'
           FROM generate_series(1, 20000) g"""
    )
    admin.execute("VACUUM ANALYZE axa_queue")
    for name in (None, "n7"):
        asked = {"state": "blocked", "name": name, "limit": 50, "now": None}
        plan = explained(sql.JOBS, {**asked, "beat_ms": sql.ABSENT_BEAT_MS})
        read = [n for n in nodes(plan) if n.get("Relation Name") == "axa_queue"]
        assert not [n for n in read if n["Node Type"] == "Seq Scan"], plan
        [blocked] = [n for n in read if n.get("Index Name") == "axa_queue_blocked_created"]
        # The page, and for one name the other names' entries in front of it: a few
        # hundred rows, not 20,000.
        assert blocked["Actual Rows"] + blocked.get("Rows Removed by Filter", 0) <= 1100
        assert plan["Actual Rows"] == 50


def test_jobs_lists_the_same_newest_jobs_as_a_sort_of_both_tables(admin, dsn: str) -> None:
    setup(admin)
    seed(admin, moved=2000, ready=500)
    truth = [
        r[0]
        for r in admin.execute(
            """SELECT id FROM (SELECT id, created_at FROM axa_queue
                               UNION ALL SELECT id, created_at FROM axa_queue_history) j
               ORDER BY created_at DESC, id LIMIT 600"""
        )
    ]
    with SyncQueue(dsn) as queue:
        assert [j.id for j in queue.jobs(limit=600)] == truth
        for state, name in ASKED:
            listed = [j.id for j in queue.jobs(state, name, limit=700)]
            assert listed == [
                r[0]
                for r in admin.execute(
                    """SELECT id FROM (SELECT id, name, status, created_at FROM axa_queue
                           UNION ALL SELECT id, name, status, created_at FROM axa_queue_history) j
                       WHERE (%(state)s::text IS NULL OR status = %(state)s)
                         AND (%(name)s::text IS NULL OR name = %(name)s)
                       ORDER BY created_at DESC, id LIMIT 700""",
                    {"state": state, "name": name},
                )
            ], (state, name)


def test_counts_are_exact_up_to_the_cap_and_say_so(admin, dsn: str) -> None:
    setup(admin)
    seed(admin, moved=900, ready=300)
    with psycopg.connect(dsn, autocommit=True) as conn:
        counts = run_sync(conn, counts_call())
        by_name = run_sync(conn, counts_by_name_call())
    assert (counts.ready, counts.running, counts.needs_review) == (300, 5, 2)
    assert (counts.completed, counts.failed, counts.cancelled) == (810, 45, 45)
    assert counts.estimated == ()
    assert sum(one.completed for one in by_name.values()) == 810
    assert by_name["alpha"].running == 5
    assert all(one.estimated == () for one in by_name.values())


def test_counts_past_the_cap_are_estimates_named_as_such(admin, dsn: str) -> None:
    setup(admin)
    seed(admin, moved=6000, ready=3000)
    with psycopg.connect(dsn, autocommit=True) as conn:
        counts = run_sync(conn, counts_call(cap=1000))
        by_name = run_sync(conn, counts_by_name_call(cap=1000))
    # Each state read to its own cap: 5,400 completed are estimated, the history's 300
    # failed and 300 cancelled are counted.
    assert counts.estimated == ("ready", "completed")
    assert (counts.running, counts.needs_review, counts.waiting) == (5, 2, 0)  # exact
    assert (counts.failed, counts.cancelled) == (300, 300)  # exact
    # The statistics of an analyzed table: close, not exact.
    assert 2700 <= counts.ready <= 3300
    assert 4500 <= counts.completed <= 6300
    assert set(by_name) == set(NAMES)
    assert all(one.estimated == counts.estimated for one in by_name.values())
    assert 4500 <= sum(o.completed for o in by_name.values()) <= 6300
    assert sum(o.failed for o in by_name.values()) == 300
    assert sum(o.cancelled for o in by_name.values()) == 300
    assert by_name["alpha"].running == 5 and by_name["beta"].running == 0


def test_counts_read_each_state_at_most_cap_rows_deep(admin, dsn: str, explained) -> None:
    setup(admin)
    # Enough rows that the descents of each day's index, three states each, are a small part.
    seed(admin, moved=24_000, ready=3000)
    pages = pages_of(admin)
    for statement in (sql.COUNTS, sql.COUNTS_BY_NAME):
        plan = explained(statement, {"now": None, "cap": 100})
        read = [n for n in nodes(plan) if "Relation Name" in n]
        assert read, plan
        for node in read:
            assert node["Actual Rows"] * node.get("Actual Loops", 1) <= 101, node
            if node["Relation Name"] == "axa_queue":
                assert node["Node Type"] != "Seq Scan", node
            else:  # each finished state of the history in its index's order, not a filter
                assert node["Node Type"] in ("Index Scan", "Index Only Scan"), node
                assert "status_created" in node["Index Name"], node
        assert buffers(plan) < pages / 4, (buffers(plan), pages)
    indexes = {n.get("Index Name") for n in nodes(explained(sql.COUNTS, {"now": None, "cap": 100}))}
    assert {"axa_queue_ready", "axa_queue_running", "axa_queue_review"} <= indexes, indexes


def test_the_cli_marks_estimated_counts(admin, dsn: str) -> None:
    setup(admin)
    seed(admin, moved=100, ready=10_050)
    runner = CliRunner(env={"AXA_QUEUE_DSN": dsn, "DATABASE_URL": None})
    shown = runner.invoke(main, ["counts"], prog_name="axa-queue", catch_exceptions=False)
    assert shown.exit_code == 0, shown.output
    ready = next(line for line in shown.output.splitlines() if line.split()[:1] == ["ready"])
    assert ready.split()[1].startswith("~"), ready
    assert "completed" in shown.output and "~ an estimate, not a count" in shown.output
    as_json = runner.invoke(main, ["counts", "--json"], catch_exceptions=False)
    assert json.loads(as_json.output)["estimated"] == ["ready"]


async def test_estimated_counts_read_the_same_on_an_asyncpg_connection(
    admin, dsn: str, schema: str
) -> None:
    import asyncpg

    from axa_queue.db.adapters import run

    setup(admin)
    seed(admin, moved=3000, ready=1500)
    with psycopg.connect(dsn, autocommit=True) as conn:
        expected = run_sync(conn, counts_call(cap=1000))
    parts = psycopg.conninfo.conninfo_to_dict(dsn)
    raw = await asyncpg.connect(
        host=parts.get("host", "127.0.0.1"),
        port=int(parts.get("port", 5432)),
        user=parts.get("user"),
        database=parts.get("dbname"),
        server_settings={"search_path": schema},
    )
    try:
        found = await run(raw, counts_call(cap=1000))
    finally:
        await raw.close()
    assert found.estimated == expected.estimated == ("ready", "completed")
    assert dataclasses.replace(found, oldest_ready_seconds=0) == dataclasses.replace(
        expected, oldest_ready_seconds=0
    )  # the oldest ready job's wait grew meanwhile


@pytest.mark.parametrize("given", ["name", "ids"])
def test_a_bulk_acts_batch_reads_at_most_its_scope_of_the_table_whatever_the_plan(
    admin, explained, given: str
) -> None:
    setup(admin)
    admin.execute(
        """INSERT INTO axa_queue (id, name, args, status, attempts, max_attempts, error)
           SELECT gen_random_uuid(), CASE WHEN g % 2 = 0 THEN 'alpha' ELSE 'beta' END, '{}',
                  'failed', 1, 1, 'ValueError'
           FROM generate_series(1, 40000) g"""
    )
    admin.execute("ANALYZE axa_queue")
    ids = [row[0] for row in admin.execute("SELECT id FROM axa_queue ORDER BY id")]
    filters = {
        "ids": ids[10_000:10_010] if given == "ids" else None,
        "name": "alpha" if given == "name" else None,
        "state": None,
        "error_like": None,
        "changed_after": None,
        "changed_before": None,
    }
    # A batch in the middle of a walk of 40,000 failed jobs, as `retry_all` on the queue's
    # connections sends it (generic plans forced, so the filter's selectivity is unknown).
    plan = explained(
        sql.RETRY_BATCH,
        {
            **filters,
            "after": str(ids[9_999]),
            "batch": 1000,
            "applies": ["failed"],
            "now": None,
            "by": "ops",
            "reason": "incident 42",
        },
    )
    (seen,) = [n for n in nodes(plan) if n.get("Subplan Name") == "CTE seen"]
    read = [
        int(n["Actual Rows"])
        + int(n.get("Rows Removed by Filter", 0))
        + int(n.get("Rows Removed by Index Recheck", 0))
        for n in nodes(seen)
        if n.get("Relation Name") == "axa_queue" and n.get("Actual Loops", 0) > 0
    ]
    # The filter is applied within the scope: the rows between the batch's start and
    # the scope's last id, never the 30,000 after the start (which the plan before read
    # and sorted for every batch: quadratic in the jobs matched). The scope's own walk
    # of the key reads its ids through the primary key on a big table; on one this
    # small, the planner may read the table whole, which costs less.
    assert read and max(read) <= BULK_SCOPE, read
    assert admin.execute("SELECT count(*) FROM axa_queue WHERE status = 'queued'").fetchone() == (
        10 if given == "ids" else 1000,
    )


def test_the_workers_list_reads_the_running_jobs_once_not_once_per_process(
    admin, explained
) -> None:
    setup(admin)
    admin.execute(
        """INSERT INTO axa_workers (id, host, pid, names, loops, running, version, started_at,
               seen_at, beat_ms)
           SELECT gen_random_uuid(), 'host', g, '{a}', 4, 4, 'test', now(), now(), 30000
           FROM generate_series(1, 200) g"""
    )
    admin.execute(
        """INSERT INTO axa_queue (id, name, args, status, attempts, run_attempt, run_worker,
               started_at)
           SELECT gen_random_uuid(), 'a', '{}', 'running', 1, 1, w.id, now()
           FROM axa_workers w, generate_series(1, 5)"""
    )
    admin.execute("ANALYZE axa_queue")
    plan = explained(sql.WORKERS, {"now": None})
    scans = [n for n in nodes(plan) if n.get("Relation Name") == "axa_queue"]
    # 200 processes, 1,000 running jobs: the running jobs are read once and counted by
    # process (a count for each process read them 200 times).
    assert scans and all(n["Actual Loops"] == 1 for n in scans), scans
    assert int(plan["Actual Rows"]) == 200


def test_a_deep_page_of_the_acts_log_starts_at_its_place_in_the_key(admin, explained) -> None:
    setup(admin)
    admin.execute(
        """INSERT INTO axa_job_acts (job_id, job_name, act, attempts, by, reason)
           SELECT gen_random_uuid(), 'a', 'cancelled', 1, 'ops', 'incident'
           FROM generate_series(1, 20000)"""
    )
    admin.execute("ANALYZE axa_job_acts")
    first = admin.execute("SELECT min(id) FROM axa_job_acts").fetchone()
    assert first is not None
    plan = explained(sql.WEB_ACTS, {"by": None, "act": None, "before": first[0] + 100, "limit": 50})
    (scan,) = [n for n in nodes(plan) if n.get("Relation Name") == "axa_job_acts"]
    # The page before the 100th act reads its 50 acts from there, not the 19,900 after it.
    assert int(scan["Actual Rows"]) == 50 and int(scan.get("Rows Removed by Filter", 0)) == 0
    assert "Index Cond" in scan, scan


def test_archiving_schedules_looks_each_up_among_the_names_in_code_once(admin, explained) -> None:
    setup(admin)
    admin.execute(
        """INSERT INTO axa_schedule (name, interval_ms, due_at, seen_at)
           SELECT 'every-' || g, 60000, now(), now() - interval '1 day'
           FROM generate_series(1, 4000) g"""
    )
    admin.execute("ANALYZE axa_schedule")
    in_code = [f"every-{g}" for g in range(1, 4001, 2)]  # half still in code
    plan = explained(sql.SCHEDULE_ARCHIVE, {"now": None, "stale": 3600, "in_code": in_code})
    scans = [n for n in nodes(plan) if n.get("Relation Name") == "axa_schedule"]
    # Each schedule is looked up in a hash of the 2,000 names in code (as `<> ALL`, the
    # generic plan compared each of the 4,000 with every name: 2.4 s for 20,000).
    assert scans and not any("ALL" in n.get("Filter", "") for n in scans), scans
    assert any(n["Node Type"] == "Hash" for n in nodes(plan)), [n["Node Type"] for n in nodes(plan)]
    assert admin.execute(
        "SELECT count(*) FROM axa_schedule WHERE archived_at IS NOT NULL"
    ).fetchone() == (2000,)
