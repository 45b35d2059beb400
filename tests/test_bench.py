"""The benchmark's code works: the tiniest run of every workload of `bench/run.py`,
each checking that every job ran exactly once. No timing is asserted."""

from __future__ import annotations

import dataclasses
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from axa_queue import sql as axa_sql

BENCH = Path(__file__).resolve().parent.parent / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import run as bench  # noqa: E402  (bench/run.py)

TINY = bench.Config(
    repeats=1,
    single_jobs=50,
    bulk_jobs=200,
    trace_jobs=20,
    drain_jobs=200,
    drain_jobs_one_loop=50,
    loops=(1, 10),
    processes=2,
    process_loops=10,
    latency_samples=20,
    latency_warmup=2,
    spacing_ms=2.0,
    big_finished=2_000,
    big_delayed=200,
    big_ready=50,
    big_backlog=500,
    big_samples=3,
    integration_jobs=20,
    integration_batch=5,
    checkpoints=False,  # what they keep out of a measurement, and this run measures nothing
    idle_sample=0.0,
)


@pytest.fixture(autouse=True)
def _no_checkpoints(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No CHECKPOINT in these runs, here or in the processes they start: they measure
    nothing, and each would flush the whole server while the other tests run."""
    monkeypatch.setenv("AXA_BENCH_CHECKPOINTS", "0")
    token = bench.floor.CHECKPOINTS.set(False)
    try:
        yield
    finally:
        bench.floor.CHECKPOINTS.reset(token)


@pytest.mark.timeout(300)  # a guard against a hang, not a measure: every workload runs
def test_every_workload_runs_once(database_url: str) -> None:
    report = bench.run_benchmark(dataclasses.replace(TINY, dsn=database_url))

    for key in (
        "enqueue.single.axa",
        "enqueue.single.raw",
        "enqueue.single.unique",
        "enqueue.bulk.axa",
        "enqueue.bulk.unique",
        "enqueue.bulk.values",
        "enqueue.bulk.copy",
        "enqueue.bulk.unnest",
        "drain.axa.1x1",
        "drain.axa.1x10",
        "drain.axa.1x10p",
        "drain.axa.1x10ph",
        "drain.axa.1x10g",
        "drain.axa.1x10gh",
        "drain.axa.1x10r",
        "drain.axa.2x10",
        "drain.floor.one",
        "drain.floor.batch",
        "drain.floor.fused",
        "drain.floor.batch_axa_table",
        "latency.axa.p50",
        "latency.axa.p99",
        "latency.floor.p50",
        "latency.floor.p99",
    ):
        assert len(report.samples[key]) == 1, key
        assert report.samples[key][0] > 0, key
    for kind in bench.integrations.KINDS:
        for mode in ("single", "batch"):
            assert len(report.samples[f"integrations.{kind}.{mode}"]) == 1, (kind, mode)
    found = bench.peers.available()  # the `[bench]` extra; rows left out without it
    for peer in found:
        assert len(report.samples[f"enqueue.bulk.{peer}"]) == 1, peer
        assert len(report.samples[f"drain.{peer}"]) == 1, peer
    assert report.trace == bench.Trace(20, 20, 20)  # one statement, one round trip each
    assert report.claim is not None
    labels = [case.label for case in report.claim.cases]
    assert labels == [
        bench.BIG_IDLE,
        bench.BIG_READY,
        bench.BIG_FOREIGN,
        bench.BIG_LIMITED,
        bench.BIG_BACKLOG,
    ]
    assert report.claim.cases[0].claimed == 0
    assert report.claim.cases[1].claimed == 10
    table = bench.format_report(report)
    assert "goals" in table
    assert "drain" in table and "latency" in table and "claim on a big table" in table
    assert "  sqlalchemy asyncpg, enqueue_all_on 5 (200)" in table
    if found:
        assert "peers, same jobs, same run" in table
    # two per integration kind, one per peer found, two of keys
    assert len(bench.goals(report)) == 15 + 2 * 6 + len(found) + 2


def _ran(conn: psycopg.Connection[Any], key: uuid.UUID, attempts: int = 1) -> None:
    conn.execute(
        "INSERT INTO axa_queue (id, name, args, status, started_at, attempts) "
        "VALUES (%s, 'noop', %s, 'completed', now(), %s)",
        (uuid.uuid4(), f'{{"k": "{key}"}}', attempts),
    )


def test_the_exactly_once_check_catches_a_job_not_run_or_run_twice(database_url: str) -> None:
    with bench.scratch_schema(database_url) as dsn:
        bench.setup_tables(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            keys = [uuid.uuid4() for _ in range(3)]
            for key in keys:
                _ran(conn, key)
            conn.execute("INSERT INTO bench_done SELECT unnest(%s::uuid[])", (keys,))
            bench.verify_axa(dsn, 3)

            _ran(conn, uuid.uuid4())  # completed, but its job never wrote its row
            with pytest.raises(bench.ExactlyOnceError):
                bench.verify_axa(dsn, 4)

            conn.execute("DELETE FROM axa_queue")
            conn.execute("DELETE FROM bench_done")
            _ran(conn, keys[0], attempts=2)  # ran a second time
            conn.execute("INSERT INTO bench_done VALUES (%s)", (keys[0],))
            with pytest.raises(bench.ExactlyOnceError):
                bench.verify_axa(dsn, 1)


def test_placeholders_become_numbered() -> None:
    assert bench.numbered("a %(x)s b %(y)s c %(x)s", ["x", "y"]) == "a $1 b $2 c $1"
    claim = bench.numbered(axa_sql.EXCHANGE, bench.CLAIM_PARAMETERS)
    assert "%(" not in claim and "$15" in claim and "$16" not in claim


def test_the_dashboard_benchmark_runs_on_a_small_table(database_url: str, capsys) -> None:
    import web as web_bench  # bench/web.py

    assert (
        web_bench.main(
            ["--dsn", database_url, "--finished", "2000", "--queued", "200", "--samples", "1"]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "overview (every refresh)" in printed and "jobs (the slowest of its pages)" in printed


def test_the_big_reads_benchmark_runs_on_small_tables(database_url: str, capsys) -> None:
    import bigreads  # bench/bigreads.py

    assert (
        bigreads.main(["--dsn", database_url, "--history", "3000", "--ready", "300", "--runs", "1"])
        == 0
    )
    printed = capsys.readouterr()
    for read in ("counts()", "counts_by_name()", "jobs(state=queued)", "/live", "/failed"):
        assert read in printed.out
    assert "could not" not in printed.err  # every statement explained


@pytest.mark.parametrize("work", [[], ["--work"]], ids=["no-op", "work"])
def test_the_workflows_benchmark_drains_a_chord_and_plain_jobs(
    database_url: str, capsys, work: list[str]
) -> None:
    import workflows  # bench/workflows.py

    workflows.main(["--dsn", database_url, "--jobs", "200", "--rounds", "1", *work])
    printed = capsys.readouterr().out
    assert "plain jobs:" in printed and "chord / plain:" in printed


NEEDS_CHECKOUT = pytest.mark.skipif(
    not (BENCH.parent / ".git").exists(), reason="compares with a commit: needs a git checkout"
)
"""`bench/against.py` checks a commit out of this repository (`git worktree`)."""

COMPARED = {
    "drain 1 x 10 jobs/s",
    "latency p50 ms",
    "latency p99 ms",
    "enqueue single/s",
    "enqueue bulk/s",
}
"""What `bench/against.py` reports of a drain of 10 loops, the latency and the enqueue."""


@NEEDS_CHECKOUT
def test_the_comparison_with_another_commit_runs_each_case_in_both_trees(
    database_url: str, capsys
) -> None:
    import against  # bench/against.py

    tiny = ["--pairs", "1", "--jobs", "100", "--processes", "1", "--latency-samples", "5"]
    summary = against.main(["--dsn", database_url, "--ref", "HEAD", *tiny, "--enqueue-jobs", "30"])
    assert set(summary) == COMPARED
    assert all(len(sides["ref"]) == len(sides["this"]) == 1 for sides in summary.values())
    assert "drain 1 x 10" in capsys.readouterr().out


@NEEDS_CHECKOUT
def test_the_comparison_of_the_integrations_reads_the_clients_cpu_per_job_of_each_kind(
    database_url: str, capsys
) -> None:
    import against  # bench/against.py
    import integrations  # bench/integrations.py

    tiny = ["--pairs", "1", "--processes", "", "--latency-samples", "0"]
    summary = against.main(
        ["--dsn", database_url, "--ref", "HEAD", *tiny, "--integration-jobs", "5"]
    )
    assert set(summary) == {
        f"integrations {kind} x{batch} cpu us" for kind in integrations.KINDS for batch in (1, 100)
    }
    assert all(sides["ref"][0] > 0 and sides["this"][0] > 0 for sides in summary.values())
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:  # one tree after the other only
        against.main(["--ref", "HEAD", "--together", "--integration-jobs", "5"])
    assert refused.value.code == 2
    assert "not with --together" in capsys.readouterr().err


@NEEDS_CHECKOUT
def test_the_comparison_run_together_releases_both_trees_at_once_and_reads_a_window(
    database_url: str, capsys
) -> None:
    import against  # bench/against.py

    tiny = ["--pairs", "1", "--jobs", "3000", "--settle", "0.3", "--window", "0.2"]
    small = ["--latency-samples", "5", "--enqueue-jobs", "30", "--loops", "2,10"]
    summary = against.main(["--dsn", database_url, "--ref", "HEAD", "--together", *tiny, *small])
    assert set(summary) == COMPARED | {"drain 1 x 2 jobs/s"}
    assert all(len(sides["ref"]) == len(sides["this"]) == 1 for sides in summary.values())
    assert all(sides["ref"][0] > 0 and sides["this"][0] > 0 for sides in summary.values())
    assert "drain 1 x 10" in capsys.readouterr().out


def test_the_exchange_benchmark_alternates_a_table_without_the_named_trigger(
    database_url: str, capsys
) -> None:
    import exchange  # bench/exchange.py

    tiny = ["--jobs", "300", "--claim", "10", "--rounds", "4"]
    medians = exchange.main(
        ["--dsn", database_url, *tiny, "--without", "axa_queue_blocked_rule,ix:axa_queue_blocked"]
    )
    assert set(medians) == {"as made", "without"}
    assert "difference" in capsys.readouterr().out


def test_the_comparisons_interval_holds_the_pairs_median_and_needs_five_pairs() -> None:
    import against  # bench/against.py

    assert against.interval([1.0, 0.9, 1.1, 1.0]) is None
    assert against.interval([1.0] * 8) == (1.0, 1.0)
    spread = [0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2]
    low, high = against.interval(spread) or (0.0, 0.0)
    assert 0.8 <= low < 1.0 < high <= 1.2
    assert against.interval(spread) == (low, high)  # the same pairs, the same interval
    assert against.interval([float("nan"), 1.0, 1.0, 1.0, 1.0]) is None
