"""What is shown of keys (`NewJob.key`): `axa-queue counts --by-key NAME`, the busiest
keys on a name's jobs page, the bounded `axa_queue_key_jobs` metric, and logs that carry
a key only with `QueueOptions(log_keys=True)`."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from axa_queue import NewJob
from conftest import eventually, running
from test_cli import cli
from test_web import board, signed_in, tables  # noqa: F401  (fixtures)

prometheus_client = pytest.importorskip("prometheus_client")

from axa_queue.metrics import QueueCollector  # noqa: E402
from axa_queue.metrics.keys import TOP_KEYS  # noqa: E402


async def test_key_counts_give_the_busiest_keys_of_a_name_first(make_queue) -> None:
    queue = await make_queue()
    await queue.enqueue_all([NewJob("Report", key="tenant-a") for _ in range(5)])
    await queue.enqueue_all([NewJob("Report", key="tenant-b") for _ in range(2)])
    await queue.enqueue("Report", key="tenant-b", run_in=600)
    await queue.enqueue("Other", key="tenant-z")
    found = await queue.key_counts("Report")
    assert [(k.key, k.ready, k.waiting, k.running) for k in found] == [
        ("tenant-a", 5, 0, 0),
        ("tenant-b", 2, 1, 0),
    ]
    assert found[0].of_all == (7, 1, 0) and not found[0].capped


def test_counts_by_key_prints_the_busiest_keys_of_a_name(tables: str, admin) -> None:  # noqa: F811
    dsn = tables
    admin.execute(
        "INSERT INTO axa_queue (id, name, args, key) SELECT gen_random_uuid(), 'Report', '{}', "
        "CASE WHEN g <= 5 THEN 'tenant-a' ELSE 'tenant-b' END FROM generate_series(1, 7) g"
    )
    admin.execute(
        "INSERT INTO axa_queue (id, name, args, key) VALUES (gen_random_uuid(), 'Other', '{}', 'tenant-z')"
    )
    printed = cli("counts", "--by-key", "Report", dsn=dsn)
    assert printed.exit_code == 0 and "tenant-a" in printed.output
    assert "tenant-z" not in printed.output
    as_json = json.loads(
        cli("counts", "--by-key", "Report", "--keys", "1", "--json", dsn=dsn).output
    )
    assert [one["key"] for one in as_json] == ["tenant-a"]


def test_a_names_jobs_page_shows_its_busiest_keys(board, admin) -> None:  # noqa: F811
    admin.execute(
        "INSERT INTO axa_queue (id, name, args, key) "
        "SELECT gen_random_uuid(), 'Mail', '{}', 'tenant-' || (g % 3) FROM generate_series(1, 9) g"
    )
    page = board.get("/jobs?state=queued&name=Mail")
    assert page.status_code == 200 and 'id="keys"' in page.text and "tenant-2" in page.text
    assert 'id="keys"' not in board.get("/jobs?state=queued&name=Nobody").text


async def test_the_key_metric_names_the_busiest_keys_and_sums_the_others(make_queue) -> None:
    queue = await make_queue()
    queue.fair_by_key("Report")
    registry = prometheus_client.CollectorRegistry()
    collector = QueueCollector(queue, registry)
    jobs = [NewJob("Report", key=f"tenant-{n:02d}") for n in range(TOP_KEYS + 5) for _ in range(2)]
    await queue.enqueue_all([*jobs, NewJob("Report", key="tenant-00")])
    await collector.refresh()
    samples = [s for m in registry.collect() if m.name == "axa_queue_key_jobs" for s in m.samples]
    keys = {s.labels["key"] for s in samples}
    assert len(keys) == TOP_KEYS + 1 and "other" in keys and "tenant-00" in keys
    ready = {s.labels["key"]: s.value for s in samples if s.labels["state"] == "ready"}
    assert ready["tenant-00"] == 3 and sum(ready.values()) == 2 * (TOP_KEYS + 5) + 1


@pytest.mark.parametrize("log_keys", [False, True])
async def test_logs_carry_a_key_only_when_the_queue_logs_keys(
    make_queue, caplog, log_keys: bool
) -> None:
    queue = await make_queue(log_keys=log_keys)
    queue.fair_by_key("Report")
    caplog.set_level(logging.DEBUG, logger="axa_queue")
    done: list[Any] = []

    @queue.handler("Report")
    async def report(args: Any) -> None:
        done.append(args)

    await queue.enqueue("Report", {}, key="tenant-secret-7")
    async with running(queue):
        await eventually(lambda: len(done) == 1)
        await eventually(lambda: any("completed" in r.getMessage() for r in caplog.records))
    text = " ".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert ("tenant-secret-7" in text) is log_keys
