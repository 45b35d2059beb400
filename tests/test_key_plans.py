"""The keyed claim's plan on full tables (`sql.EXCHANGE_KEYED`), prepared as the
worker's exchange connection prepares it: it walks a keyed name's keys through
`axa_queue_keyed` (one probe a key) and its levels through `axa_queue_pick` and
`axa_queue_pick_hash`, never
another name's jobs, never a key's backlog beyond what it claims, and touches at most
a bounded number of buffers on a table holding 100,000 jobs of one key, 1,000 other
keys with nothing due, finished, delayed and other names' jobs.
Asserted from `EXPLAIN (ANALYZE, BUFFERS)`, rolled back, never from a time. The
statements of a queue that uses no keys are `tests/test_claim_plans.py`'s, unchanged."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql

from axa_queue import sql as axa_sql
from test_claim_plans import OTHER, A, Plan, _reads, _updated, adversarial, bench, jobs, table

pytestmark = pytest.mark.alone  # tables of some 350,000 rows


def keyed_params(per_key: int | None) -> dict[str, Any]:
    """A claim of ten of `A` by key (under a per-key limit when `per_key`), recording
    nothing, two loops idle."""
    one: dict[str, Any] = {"name": A, "cap": 10, "keyed": True, "per_key": per_key}
    return {
        **bench.claim_params(10, [A], [10]),
        "wanted": json.dumps([one]),
        "idle": 2,
        "losing": "{00000000-0000-0000-0000-000000000001}",
    }


def _walk(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The subplans of the keyed path (`CTE walk`, `CTE keyed`) under `node`."""
    if node.get("Subplan Name") in ("CTE walk", "CTE keyed"):
        yield node
    for child in node.get("Plans", ()):
        yield from _walk(child)


def prepare(conn: psycopg.Connection[Any]) -> None:
    """PREPARE `sql.EXCHANGE_KEYED` as `keyed`, with the worker's session settings."""
    conn.execute(axa_sql.SESSION_SETTINGS)
    conn.execute(axa_sql.CLAIM_SETTINGS)
    conn.execute("DEALLOCATE ALL")
    text = bench.numbered(axa_sql.EXCHANGE_KEYED, bench.CLAIM_PARAMETERS)
    conn.execute(
        pgsql.SQL("PREPARE keyed({}) AS {}").format(pgsql.SQL(bench.CLAIM_TYPES), pgsql.SQL(text))
    )


def explain(conn: psycopg.Connection[Any], per_key: int | None, *, again: bool = True) -> Plan:
    """EXPLAIN (ANALYZE, BUFFERS) of one keyed claim, prepared as the worker prepares
    it (`again`: prepared anew, after a VACUUM; else the plan prepared before), rolled
    back, run twice and the second measured (as `test_claim_plans`)."""
    if again:
        prepare(conn)
        conn.execute("VACUUM axa_queue")
    params = keyed_params(per_key)
    args = pgsql.SQL(", ").join(
        pgsql.SQL("{}::{}").format(pgsql.Literal(params[name]), pgsql.SQL(kind))
        for name, kind in zip(bench.CLAIM_PARAMETERS, bench.CLAIM_TYPES.split(", "), strict=True)
    )
    for _ in range(2):
        with conn.transaction(force_rollback=True):
            found = conn.execute(
                pgsql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE keyed({})").format(args)
            ).fetchone()
    assert found is not None
    top = found[0][0]["Plan"]
    return Plan(
        buffers=int(top["Shared Hit Blocks"] + top["Shared Read Blocks"]),
        claimed=_updated(top),
        indexes=set(_reads(top)),
        levels={way for part in _walk(top) for way in _reads(part)},
        walked=0,
        scans=0,
        cost=float(top["Total Cost"]),
        text=json.dumps(found[0], indent=1),
    )


def keyed_jobs(conn: psycopg.Connection[Any], count: int, key: str, seconds: str) -> None:
    """`count` ready jobs of `A` with the key `key` (an SQL expression of `g`)."""
    conn.execute(
        pgsql.SQL(
            """INSERT INTO axa_queue (id, name, args, status, run_at, priority, attempts, key)
               SELECT gen_random_uuid(), %(name)s, '{{}}', 'queued',
                      now() + make_interval(secs => {seconds}), 0, 0, {key}
               FROM generate_series(1, %(count)s) g"""
        ).format(seconds=pgsql.SQL(seconds), key=pgsql.SQL(key)),
        {"name": A, "count": count},
    )


@pytest.fixture(scope="module")
def few(database_url: str) -> Iterator[dict[int | None, Plan]]:
    """The keyed claim on a table holding only 12 ready keyed jobs of `A` (two keys)."""
    with table(database_url) as conn:
        keyed_jobs(conn, 6, "'tenant-a'", "-60 - g")
        keyed_jobs(conn, 6, "'tenant-b'", "-30 - g")
        conn.execute("ANALYZE axa_queue")
        yield {limit: explain(conn, limit) for limit in (None, 3)}


@pytest.fixture(scope="module")
def crowded(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """Issue 25's adversarial table (finished jobs of `A`, other names' backlogs,
    delayed jobs), and for `A` by key: 100,000 ready jobs of one key, the oldest; 10 of
    another; 1,000 keys of one job each, delayed; analyzed."""
    with table(database_url) as conn:
        adversarial(conn)
        keyed_jobs(conn, 100_000, "'tenant-a'", "-7200 - g / 100.0")
        keyed_jobs(conn, 10, "'tenant-b'", "-60 - g")
        keyed_jobs(conn, 1_000, "'tenant-' || (1000 + g)", "3600 + g")
        conn.execute("ANALYZE axa_queue")
        yield conn


@pytest.mark.parametrize("per_key", [None, 3])
def test_the_keyed_claim_reads_bounded_buffers_on_a_full_table(
    per_key: int | None, crowded: psycopg.Connection[Any], few: dict[int | None, Plan]
) -> None:
    plan = explain(crowded, per_key)
    alone = few[per_key]
    # Both keys at once: five each (three each under a per-key limit of three).
    assert plan.claimed == alone.claimed == (10 if per_key is None else 6), plan.text
    assert plan.levels <= {"axa_queue_keyed", "axa_queue_pick", "axa_queue_pick_hash"}, plan.text
    assert "Seq Scan" not in plan.indexes and "axa_queue_claim" not in plan.indexes, plan.text
    # Bounded, whatever the backlog: at most 2 * 10 + 8 steps of the walk, each one
    # descent and at most `KEY_WALK_WINDOW` entries (a few leaf pages); ten keyed jobs
    # read and claimed. Measured: 278 buffers (105 on the table of 12 jobs; 186 and 70
    # under a per-key limit of 3); the 1,000
    # keys with nothing due are passed a window at a time, the 100,000 jobs of one key
    # are read as far as its share.
    assert plan.buffers <= 400, (plan.buffers, alone.buffers, plan.text)


def test_a_keyed_claim_planned_on_an_empty_table_still_walks_the_keys_when_it_fills(
    database_url: str,
) -> None:
    # A worker that starts on a fresh database plans the claim once, generic.
    with table(database_url) as conn:
        prepare(conn)
        assert explain(conn, 3, again=False).claimed == 0
        keyed_jobs(conn, 100_000, "'tenant-a'", "-7200 - g / 100.0")
        keyed_jobs(conn, 10, "'tenant-b'", "-60 - g")
        jobs(conn, 100_000, name=OTHER, priority="mod(g, 5) - 2", seconds="-86400 + g / 1000.0")
        plan = explain(conn, 3, again=False)
        assert plan.claimed == 6, plan.text
        assert plan.levels <= {"axa_queue_keyed", "axa_queue_pick", "axa_queue_pick_hash"}, (
            plan.text
        )
        assert "Seq Scan" not in plan.indexes and "axa_queue_claim" not in plan.indexes, plan.text
        assert plan.buffers <= 400, plan.text
