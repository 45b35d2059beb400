"""Metrics and health: run counters fed by `Queue.observe`, counts per name and state,
and the `/metrics` and `/health` endpoints, against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from axa_queue import Queue, sql
from axa_queue.metrics import HealthCheck, QueueCollector, RunMetrics, serve
from conftest import eventually, running, status_of

SECRET = "hunter2-never-a-label"


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=15) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_run_metrics_count_each_run_by_name_and_outcome_with_its_duration() -> None:
    registry = CollectorRegistry()
    metrics = RunMetrics(registry)
    metrics.observe("Report", "completed", 0.2)
    metrics.observe("Report", "completed", 3.0)
    metrics.observe("Report", "retried", 0.01)
    assert value(registry, "axa_queue_runs_total", job="Report", outcome="completed") == 2
    assert value(registry, "axa_queue_runs_total", job="Report", outcome="retried") == 1
    assert value(registry, "axa_queue_run_seconds_count", job="Report") == 3
    assert value(registry, "axa_queue_run_seconds_bucket", job="Report", le="0.25") == 2
    assert value(registry, "axa_queue_run_seconds_sum", job="Report") == pytest.approx(3.21)


async def test_a_running_queue_counts_completed_retried_and_failed_runs(make_queue) -> None:
    queue = await make_queue(max_attempts=2)
    registry = CollectorRegistry()
    RunMetrics(registry).attach(queue)
    queue.handle("Fine", lambda args: None)

    @queue.handler("Broken")
    async def broken(args: Any) -> None:
        raise RuntimeError("no")

    for _ in range(3):
        await queue.enqueue("Fine", {})
    await queue.enqueue("Broken", {"token": SECRET})

    def ended() -> bool:
        return value(registry, "axa_queue_runs_total", job="Broken", outcome="failed") == 1

    async with running(queue):
        await eventually(
            lambda: (
                ended()
                and value(registry, "axa_queue_runs_total", job="Fine", outcome="completed") == 3
            )
        )
    assert value(registry, "axa_queue_runs_total", job="Broken", outcome="retried") == 1
    assert value(registry, "axa_queue_run_seconds_count", job="Fine") == 3
    assert value(registry, "axa_queue_run_seconds_count", job="Broken") == 2
    assert SECRET not in generate_latest(registry).decode()


async def test_a_run_that_finished_after_losing_its_claim_counts_as_lost_only(
    make_queue, admin
) -> None:
    queue = await make_queue(heartbeat_interval=30, stale_after=60)  # no heartbeat sees it
    registry = CollectorRegistry()
    RunMetrics(registry).attach(queue)
    release = asyncio.Event()

    @queue.handler("Held")
    async def held(args: Any) -> None:
        await release.wait()

    job_id = await queue.enqueue("Held", {})
    async with running(queue):
        await eventually(lambda: status_of(admin, job_id)[0] == "running")
        admin.execute("UPDATE axa_queue SET attempts = attempts + 1 WHERE id = %s", (job_id,))
        release.set()
        await eventually(
            lambda: value(registry, "axa_queue_runs_total", job="Held", outcome="lost") == 1
        )
    assert value(registry, "axa_queue_runs_total", job="Held", outcome="completed") == 0
    assert status_of(admin, job_id)[0] == "needs_review"


async def test_an_observer_that_raises_is_logged_and_the_worker_carries_on(
    make_queue, admin, caplog
) -> None:
    queue = await make_queue()
    seen: list[tuple[str, str]] = []

    @queue.observe
    def broken(name: str, outcome: str, seconds: float) -> None:
        raise ValueError("observer bug")

    queue.observe(lambda name, outcome, seconds: seen.append((name, outcome)))
    queue.handle("Fine", lambda args: None)
    ids = [await queue.enqueue("Fine", {}) for _ in range(2)]
    async with running(queue):
        await eventually(lambda: len(seen) == 2)
    assert all(status_of(admin, job_id)[0] == "completed" for job_id in ids)
    assert any(r.getMessage().startswith("a run observer failed") for r in caplog.records)


async def test_the_collector_exports_jobs_per_name_and_state_after_a_refresh(make_queue) -> None:
    queue = await make_queue()
    registry = CollectorRegistry()
    collector = QueueCollector(queue, registry)
    assert value(registry, "axa_queue_database_up") == 0  # not counted yet: no I/O on scrape
    await queue.enqueue("A", {"token": SECRET})
    await queue.enqueue("A", {})
    await queue.enqueue("B", {}, run_in=600)
    await collector.refresh()
    assert value(registry, "axa_queue_jobs", job="A", state="ready") == 2
    assert value(registry, "axa_queue_jobs", job="B", state="waiting") == 1
    assert value(registry, "axa_queue_jobs", job="B", state="needs_review") == 0
    assert value(registry, "axa_queue_oldest_ready_seconds", job="A") >= 0
    assert value(registry, "axa_queue_oldest_ready_seconds", job="B") == 0
    assert value(registry, "axa_queue_database_up") == 1
    assert SECRET not in generate_latest(registry).decode()


async def test_the_collector_exports_each_paused_name_until_it_is_resumed(make_queue) -> None:
    queue = await make_queue()
    registry = CollectorRegistry()
    collector = QueueCollector(queue, registry)
    await queue.pause("A", by="ops:alice", reason="partner_api_down")
    await collector.refresh()
    assert value(registry, "axa_queue_paused", job="A") == 1
    await queue.resume("A", by="ops:alice", reason="partner_back")
    await collector.refresh()
    assert registry.get_sample_value("axa_queue_paused", {"job": "A"}) is None


async def test_refreshing_every_interval_keeps_the_counts_current(make_queue) -> None:
    queue = await make_queue()
    registry = CollectorRegistry()
    collector = QueueCollector(queue, registry)
    stop = asyncio.Event()
    task = asyncio.create_task(collector.refresh_every(0.05, stop))
    await queue.enqueue("A", {})
    await eventually(lambda: value(registry, "axa_queue_jobs", job="A", state="ready") == 1)
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_live_jobs_are_counted_at_every_refresh_and_finished_ones_less_often(
    make_queue, admin
) -> None:
    queue = await make_queue()
    registry = CollectorRegistry()
    collector = QueueCollector(queue, registry)
    job = await queue.enqueue("A", {})
    stop = asyncio.Event()
    task = asyncio.create_task(collector.refresh_every(0.02, stop, finished_every=3600))
    try:
        await eventually(lambda: value(registry, "axa_queue_jobs", job="A", state="ready") == 1)
        admin.execute(
            "UPDATE axa_queue SET status = 'completed', attempts = 1, started_at = now() "
            "WHERE id = %s",
            (job,),
        )
        await eventually(lambda: value(registry, "axa_queue_jobs", job="A", state="ready") == 0)
        counted = collector.refreshed_at
        await eventually(lambda: collector.refreshed_at != counted)  # and again
        assert value(registry, "axa_queue_jobs", job="A", state="completed") == 0
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
    await collector.refresh()  # finished jobs too
    assert value(registry, "axa_queue_jobs", job="A", state="completed") == 1
    assert value(registry, "axa_queue_jobs", job="A", state="ready") == 0


async def test_counting_live_jobs_reads_their_indexes_not_the_finished_rows(
    make_queue, admin
) -> None:
    await make_queue()
    admin.execute(
        "INSERT INTO axa_queue (id, name, args, status, run_at, created_at, updated_at, "
        "started_at, attempts) SELECT gen_random_uuid(), 'Done', '{}', 'completed', now(), "
        "now(), now(), now(), 1 FROM generate_series(1, 20000)"
    )
    admin.execute("ANALYZE axa_queue")
    plan = "\n".join(
        row[0]
        for row in admin.execute("EXPLAIN " + sql.LIVE_COUNTS_BY_NAME, {"now": None}).fetchall()
    )
    assert "Seq Scan" not in plan, plan
    for index in ("axa_queue_running", "axa_queue_review"):
        assert index in plan, plan


async def test_health_is_200_while_the_database_answers_and_503_when_it_cannot() -> None:
    from axa_queue.embedded import EmbeddedPostgres, is_available

    if not is_available():
        pytest.skip("needs a server this test may stop: the [embedded] extra")
    with EmbeddedPostgres() as server:
        queue = Queue(server.dsn)
        await queue.open()
        registry = CollectorRegistry()
        QueueCollector(queue, registry)
        health = HealthCheck(queue, asyncio.get_running_loop(), timeout=3)
        http = serve(registry, health, 0, "127.0.0.1")
        base = f"http://127.0.0.1:{http.port}"
        try:
            assert await asyncio.to_thread(get, f"{base}/health") == (200, "ok\n")
            status, text = await asyncio.to_thread(get, f"{base}/metrics")
            assert status == 200 and "axa_queue_database_up" in text
            assert (await asyncio.to_thread(get, f"{base}/nothing"))[0] == 404
            await asyncio.to_thread(server.stop)
            status, text = await asyncio.to_thread(get, f"{base}/health")
            assert status == 503
            assert "database" in text
        finally:
            http.close()
            await queue.close()


async def test_health_says_a_worker_is_stuck_when_its_statements_fail_while_the_database_answers(
    make_queue, admin
) -> None:
    queue = await make_queue()

    @queue.handler("Any")
    async def any_job(args: object) -> None:
        pass

    health = HealthCheck(queue, asyncio.get_running_loop(), stuck_after=0.3)

    async def says(ok: bool, words: str = "") -> bool:
        answer = await asyncio.to_thread(health)
        return answer[0] is ok and words in answer[1]

    async with running(queue):
        await eventually(lambda: says(True, "ok"))
        # The database still answers `SELECT 1`, but no statement of the worker can run.
        admin.execute("ALTER TABLE axa_queue RENAME TO axa_queue_away")
        try:
            await eventually(lambda: says(False, "failed to claim or record jobs for"))
            _, why = await asyncio.to_thread(health)
            assert 'relation "axa_queue" does not exist' in why, why
        finally:
            admin.execute("ALTER TABLE axa_queue_away RENAME TO axa_queue")
        await eventually(lambda: says(True, "ok"))
        job = await queue.enqueue("Any", {})
        await eventually(lambda: status_of(admin, job)[0] == "completed")


async def test_health_fails_once_the_queue_is_closed(make_queue) -> None:
    queue = await make_queue()
    health = HealthCheck(queue, asyncio.get_running_loop())
    assert await asyncio.to_thread(health) == (True, "ok")
    await queue.close()
    ok, why = await asyncio.to_thread(health)
    assert not ok and "not running" in why


async def test_the_collector_counts_workers_live_and_gone_and_the_jobs_of_names_nobody_handles(
    make_queue, admin
) -> None:
    queue = await make_queue(unhandled_after=60)
    registry = CollectorRegistry()
    collector = QueueCollector(queue, registry)
    for names, ago, beat_ms in ((["Known"], "0 seconds", 60_000), (["Knwon2"], "1 minute", 1000)):
        admin.execute(
            "INSERT INTO axa_workers (id, host, pid, names, loops, version, seen_at, beat_ms) "
            "VALUES (gen_random_uuid(), 'h', 1, %s, 1, 'x', now() - %s::interval, %s)",
            (names, ago, beat_ms),
        )
    for name, ago in (("Known", "5 minutes"), ("Knwon2", "5 minutes"), ("Knwon2", "5 minutes")):
        admin.execute(
            "INSERT INTO axa_queue (id, name, args, run_at) "
            "VALUES (gen_random_uuid(), %s, %s, now() - %s::interval)",
            (name, f'{{"token": "{SECRET}"}}', ago),
        )
    await collector.refresh()
    assert value(registry, "axa_queue_workers", state="live") == 1
    assert value(registry, "axa_queue_workers", state="gone") == 1
    assert value(registry, "axa_queue_unhandled_jobs", job="Knwon2") == 2
    assert registry.get_sample_value("axa_queue_unhandled_jobs", {"job": "Known"}) is None
    admin.execute("DELETE FROM axa_queue WHERE name = 'Knwon2'")
    admin.execute("DELETE FROM axa_workers")
    await collector.refresh()
    assert registry.get_sample_value("axa_queue_unhandled_jobs", {"job": "Knwon2"}) is None
    assert value(registry, "axa_queue_workers", state="live") == 0
    assert value(registry, "axa_queue_unhandled_jobs", job="Known") == 1
    assert SECRET not in generate_latest(registry).decode()
