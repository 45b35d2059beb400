"""The worker processes' metric families (the `[metrics]` extra): how many processes
are live and gone, the jobs of names no live process handles, and the running jobs
whose process is gone::

    axa_queue_workers{state="live"} 3
    axa_queue_unhandled_jobs{job="Reprot"} 4
    axa_queue_worker_gone_jobs{job="Report"} 2

Made by `QueueCollector` (`metrics`) from what its refresh read (`presence`)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from ..presence import Unhandled

__all__ = ["WORKER_STATES", "worker_families"]

WORKER_STATES = ("live", "gone")
"""The `state` label of `axa_queue_workers` (`WorkerInfo.state`)."""


def worker_families(
    worker_states: list[str] | None,
    unhandled_names: list[Unhandled],
    gone_jobs: dict[str, int],
) -> Iterator[Metric]:
    """`axa_queue_workers` (empty before the first refresh: `worker_states` None),
    `axa_queue_unhandled_jobs` and `axa_queue_worker_gone_jobs`."""
    workers = GaugeMetricFamily(
        "axa_queue_workers",
        "axa-queue worker processes by state: live, or gone (silent for 3 heartbeat "
        "intervals: killed, or cut off; removed after an hour).",
        labels=["state"],
    )
    unhandled = GaugeMetricFamily(
        "axa_queue_unhandled_jobs",
        "Jobs due for longer than unhandled_after under a job name no live worker "
        "process handles (only names with such jobs).",
        labels=["job"],
    )
    if worker_states is not None:
        for state in WORKER_STATES:
            workers.add_metric([state], float(worker_states.count(state)))
    for one in unhandled_names:
        unhandled.add_metric([one.name], float(one.jobs))
    gone = GaugeMetricFamily(
        "axa_queue_worker_gone_jobs",
        "Running jobs whose worker process is gone (silent for 3 heartbeat intervals), "
        "by job name, until stale recovery decides them (only names with some).",
        labels=["job"],
    )
    for name, count in sorted(gone_jobs.items()):
        gone.add_metric([name], float(count))
    yield workers
    yield unhandled
    yield gone
