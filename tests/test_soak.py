"""The soak benchmark's code works: the tiniest soak of `bench/soak.py` on both sides,
checking the report's shape and that every job ran exactly once; and its emulated
autovacuum decides as autovacuum's thresholds say. No timing is asserted."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

BENCH = Path(__file__).resolve().parent.parent / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import autovacuum  # noqa: E402  (bench/autovacuum.py)
import run as bench  # noqa: E402  (bench/run.py)
import soak  # noqa: E402  (bench/soak.py)

TINY = soak.Config(
    rate=10.0,
    seconds=5.0,
    workers=1,
    loops=2,
    hold=(2.0, 4.0),
    sample_every=1.0,
    naptime=1.0,
    window=2.0,
    claim_samples=1,
)


@pytest.mark.timeout(240)  # a guard against a hang, not a measure
def test_a_tiny_soak_runs_every_job_exactly_once_on_both_sides(database_url: str) -> None:
    report = soak.run_soak(dataclasses.replace(TINY, dsn=database_url))

    assert [run.side for run in report.runs] == ["axa", "floor"]
    for run in report.runs:
        assert run.exactly_once is None, run.exactly_once
        assert run.problems == []
        assert run.enqueued == 50
        assert run.worker_exits == [0]
        assert [s.at for s in run.samples] == [1.0, 2.0, 3.0, 4.0, 5.0]
        assert [s.held for s in run.samples] == [False, False, True, True, False]
        assert run.held is not None
        assert 0 < sum(s.jobs for s in run.samples) <= 50
        for sample in run.samples:
            assert sample.claim_buffers > 0
            assert sample.table_bytes > 0
            assert sample.index_bytes == sum(sample.indexes.values()) > 0
        assert set(run.windows) == {"first", "last", "before hold", "end of hold"}
        assert run.windows["first"].end == 1.25  # a quarter of the run, under `window`
        assert set(run.sizes) == {"before hold", "end of hold", "end"}
        assert run.vacuum
    assert "axa_queue_pick" in report.runs[0].samples[0].indexes  # axa-queue's own table
    table = soak.format_report(report)
    assert "summary" in table and "exactly once" in table
    assert "[yes] axa-queue: every job exactly once" in table
    assert "[yes] floor: every job exactly once" in table
    with psycopg.connect(database_url, autocommit=True) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname LIKE %s",
            (f"bench_soak_%\\_{os.getpid()}\\_%",),
        ).fetchone()
    assert left == (0,)  # each side's database is dropped


def test_the_hold_is_read_in_minutes_or_seconds() -> None:
    assert soak.hold_of("12.5:17.5") == (750.0, 1050.0)
    assert soak.hold_of("40s:80s") == (40.0, 80.0)
    assert soak.hold_of("1m:90s") == (60.0, 90.0)
    for wrong in ("40", "80s:40s", "-1:2"):
        with pytest.raises(ValueError):
            soak.hold_of(wrong)


def _table(dead: int, changed: int = 0, inserted: int = 0, reltuples: float = 1000.0,
           reloptions: list[str] | None = None) -> dict[str, object]:  # fmt: skip
    return {"name": "t", "reltuples": reltuples, "reloptions": reloptions, "dead": dead,
            "inserted": inserted, "changed": changed}  # fmt: skip


def test_autovacuum_thresholds_take_the_tables_own_settings_over_the_servers() -> None:
    server = autovacuum.Settings()  # PostgreSQL's defaults
    assert not autovacuum.needs(_table(dead=250), server).vacuum  # 50 + 0.2 * 1000
    assert autovacuum.needs(_table(dead=251), server).vacuum
    own = ["fillfactor=80", "autovacuum_vacuum_scale_factor=0.02"]
    assert autovacuum.needs(_table(dead=71, reloptions=own), server).vacuum  # 50 + 20
    assert not autovacuum.needs(_table(dead=70, reloptions=own), server).vacuum
    assert autovacuum.needs(_table(dead=0, inserted=1201), server).vacuum  # 1000 + 200
    no_inserts = dataclasses.replace(server, insert_threshold=-1)
    assert not autovacuum.needs(_table(dead=0, inserted=10**9), no_inserts).vacuum
    assert autovacuum.needs(_table(dead=0, changed=151), server).analyze  # 50 + 0.1 * 1000
    assert not autovacuum.needs(_table(dead=0, changed=150), server).analyze
    never = _table(dead=51, changed=51, reltuples=-1)  # never vacuumed: counted as 0 rows
    assert autovacuum.needs(never, server) == autovacuum.Decision(
        True, True, 51, 50.0, 0, 1000.0, 51, 50.0
    )
    off = _table(dead=10**6, changed=10**6, reloptions=["autovacuum_enabled=false"])
    assert not autovacuum.needs(off, server).vacuum and not autovacuum.needs(off, server).analyze
    costly = server.for_table(["autovacuum_vacuum_cost_limit=500"])
    assert (costly.cost_limit, costly.cost_delay_ms, costly.own_cost) == (500, 2.0, True)
    assert not server.for_table(None).own_cost


def test_a_pass_of_the_emulated_autovacuum_runs_what_the_thresholds_say(
    database_url: str,
) -> None:
    with bench.scratch_schema(database_url, "bench_soak_av") as dsn:
        schema = str(psycopg.conninfo.conninfo_to_dict(dsn)["application_name"])
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE own (n int) WITH (autovacuum_vacuum_threshold = 10, "
                "autovacuum_vacuum_scale_factor = 0)"
            )
            conn.execute("CREATE TABLE off (n int) WITH (autovacuum_enabled = false)")
            conn.execute("CREATE TABLE plain (n int)")
            for name in ("own", "off", "plain"):
                table = sql.Identifier(name)
                conn.execute(sql.SQL("INSERT INTO {} SELECT generate_series(1, 100)").format(table))
                conn.execute(sql.SQL("DELETE FROM {} WHERE n <= 50").format(table))
            conn.execute("SELECT pg_stat_force_next_flush()")  # its counts, before it answers
        emulated = autovacuum.Autovacuum(dsn, schema, naptime=3600.0)
        emulated.work()
    ran = [(one.table, one.vacuum, one.analyze) for one in emulated.runs]
    # own: 50 dead > 10 + 0 x rows; plain: 50 dead is not > 50, but 150 changes > 50
    assert ran == [("own", True, True), ("plain", False, True)]
    assert emulated.errors == []
