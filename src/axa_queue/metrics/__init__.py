"""Prometheus metrics and a health check for a queue and its workers (the `[metrics]` extra).

Two kinds of numbers:

- what the table holds, for every job name: jobs in each state and how long the oldest
  ready job has waited. `QueueCollector` reads them in the background
  (`refresh_every`), never on a scrape, so scraping is free: the jobs not finished
  every `every` seconds from their partial indexes, the finished ones (a scan of
  every row retention keeps) every `FINISHED_EVERY` seconds;
- what this process did: runs ended by job name and outcome, and how long they ran;
  and how long every statement of its worker has failed, if it has (0 while they go
  through). `RunMetrics` counts runs through `Queue.observe` and keeps the gauge
  current with `track`.

::

    axa_queue_jobs{job="Report",state="ready"} 12
    axa_queue_oldest_ready_seconds{job="Report"} 3.2
    axa_queue_unhandled_jobs{job="Reprot"} 4
    axa_queue_workers{state="live"} 3
    axa_queue_worker_gone_jobs{job="Report"} 2
    axa_queue_database_up 1
    axa_queue_runs_total{job="Report",outcome="completed"} 5120
    axa_queue_run_seconds_bucket{job="Report",le="0.5"} 4990
    axa_queue_worker_stuck_seconds 0
    axa_queue_key_jobs{job="Report",key="tenant-42",state="ready"} 12

`serve` answers `/metrics` and `/health` (200 when the database answers the queue's
pool within a few seconds, 503 with the reason when it does not, or when the queue's
worker has failed every statement for `STUCK_AFTER` seconds though the database
answers). A job's arguments never appear in a metric or a label.

`axa-queue worker --metrics-port PORT` wires all of this up; with `--processes` the
workers' counters are summed across processes (prometheus-client's multiprocess mode)
and served by the supervisor.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import psycopg
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from ..acts import paused_call
from ..db.calls import run_async
from ..errors import AxaQueueError
from ..handlers.retries import first_line, kind
from ..health import HEALTH_TIMEOUT
from ..jobs.keys import KeyCounts
from ..jobs.model import Counts
from ..jobs.reads import (
    FinishedCounts,
    LiveCounts,
    finished_counts_by_name_call,
    live_counts_by_name_call,
)
from ..presence import Unhandled, WorkerInfo, gone_jobs_call, unhandled_steps
from ..worker import STUCK_AFTER
from .keys import key_family, read_keys
from .workers import worker_families

if TYPE_CHECKING:
    from ..queue import Queue

__all__ = [
    "DURATION_BUCKETS",
    "OUTCOMES",
    "STATES",
    "HealthCheck",
    "MetricsServer",
    "QueueCollector",
    "RunMetrics",
    "forget_process",
    "multiprocess_registry",
    "serve",
]

log = logging.getLogger("axa_queue.metrics")

STATES = (
    "ready", "waiting", "running", "completed", "failed", "cancelled", "needs_review", "blocked",
)  # fmt: skip
"""The `state` label of `axa_queue_jobs`: the fields of `Counts`."""

OUTCOMES = ("completed", "retried", "failed", "lost", "cancelled")
"""The `outcome` label of `axa_queue_runs_total`."""

DURATION_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)
"""Upper bounds, in seconds, of the run-duration histogram: 5 ms to an hour."""

FINISHED_EVERY = 300.0
"""Seconds between counts of finished jobs in `QueueCollector.refresh_every`: they take
a scan of every finished row retention keeps, where the live counts read small indexes."""

STUCK_GAUGE = "axa_queue_worker_stuck_seconds"
"""The gauge of how long a worker's statements have all failed (see `RunMetrics`)."""

TRACK_EVERY = 1.0
"""Seconds between updates of the stuck gauge."""

Health = Callable[[], "tuple[bool, str]"]
"""Answers whether all is well, and a line saying why not."""


class RunMetrics:
    """Counters of the runs this process ended, by job name and outcome, and a histogram
    of how long they ran. Feed it with `attach(queue)` (which uses `Queue.observe`)."""

    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        self.runs = Counter(
            "axa_queue_runs",
            "Runs this process ended, by job name and outcome "
            "(completed, retried, failed, lost); jobs run is their sum.",
            ["job", "outcome"],
            registry=registry,
        )
        self.seconds = Histogram(
            "axa_queue_run_seconds",
            "How long handlers ran, by job name, whatever the outcome.",
            ["job"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.stuck = Gauge(
            STUCK_GAUGE,
            "Seconds the worker has been failing: its statements that claim or record "
            "jobs, or its schedules, housekeeping or listener; 0 while all go through. "
            "The most of any live process.",
            registry=registry,
            multiprocess_mode="livemax",
        )

    def attach(self, queue: Queue) -> RunMetrics:
        """Count every run `queue` ends in this process."""
        queue.observe(self.observe)
        return self

    def observe(self, name: str, outcome: str, seconds: float) -> None:
        """Count one run of job `name` that ended with `outcome` after `seconds`."""
        self.runs.labels(job=name, outcome=outcome).inc()
        self.seconds.labels(job=name).observe(seconds)

    async def track(self, queue: Queue, every: float = TRACK_EVERY) -> None:
        """Keep the stuck gauge current with `queue`'s worker, every `every` seconds,
        until cancelled (a gauge, not a collector, so a supervisor can read it from the
        processes' shared directory)."""
        while True:
            worker = queue.worker
            self.stuck.set(0.0 if worker is None else worker.stuck_for())
            await asyncio.sleep(every)


class QueueCollector(Collector):
    """Jobs in each state and the oldest ready job's age, for every job name, as of the
    last `refresh()`, the worker processes live and gone, the jobs of names no live
    process handles (only names with such jobs), plus `axa_queue_database_up` (whether
    that refresh worked).

    Jobs not finished (ready, waiting, running, in review) are counted at every refresh
    from their partial indexes, cheap however many finished rows the table keeps; the
    finished ones (completed, failed, cancelled) take a scan of those rows, so
    `refresh_every` counts them only every `finished_every` seconds.

    Registered on `registry` when one is given.
    """

    def __init__(self, queue: Queue, registry: CollectorRegistry | None = REGISTRY) -> None:
        self.queue = queue
        self.counts: dict[str, Counts] = {}
        self.live: dict[str, LiveCounts] = {}
        self.finished: dict[str, FinishedCounts] = {}
        self.paused: list[str] = []
        """The job names paused at the last refresh."""
        self.workers: list[WorkerInfo] = []
        """The worker processes' rows at the last refresh."""
        self.unhandled: list[Unhandled] = []
        """The names no live process handles whose jobs waited past `unhandled_after`."""
        self.gone_jobs: dict[str, int] = {}
        """The running jobs whose worker process is gone, by name (only names with some)."""
        self.keys: dict[str, list[KeyCounts]] = {}
        """The busiest keys of each name this process claims by key (`metrics.keys`)."""
        self.up = False
        self.refreshed_at: float | None = None
        """When the last refresh worked (`time.time()`)."""
        self.finished_at: float | None = None
        """When the finished jobs were last counted (`time.monotonic()`)."""
        if registry is not None:
            registry.register(self)

    async def refresh(self, finished: bool = True) -> None:
        """Count the jobs not finished now, and the finished ones too when `finished`
        (a query each). Raises what the database raises."""
        try:
            async with self.queue.pool.connection() as conn:
                live = await run_async(conn, live_counts_by_name_call())
                paused = [one.name for one in await run_async(conn, paused_call())]
                options = self.queue.options
                workers, unhandled = await run_async(
                    conn,
                    unhandled_steps(
                        options.stale_after.total_seconds(),
                        options.unhandled_after.total_seconds(),
                    ),
                )
                gone_jobs = await run_async(conn, gone_jobs_call())
                self.keys = await read_keys(conn, sorted(self.queue.registry.limits.keyed))
                if finished:
                    self.finished = await run_async(conn, finished_counts_by_name_call())
                    self.finished_at = time.monotonic()
        except (psycopg.Error, AxaQueueError):
            self.up = False
            raise
        self.live, self.paused, self.up, self.refreshed_at = live, paused, True, time.time()
        self.workers, self.unhandled, self.gone_jobs = workers, unhandled, gone_jobs
        self.counts = {name: self._merged(name) for name in sorted({*live, *self.finished})}

    def _merged(self, name: str) -> Counts:
        ready, waiting, running, review, oldest, blocked = self.live.get(name, (0, 0, 0, 0, 0.0, 0))
        completed, failed, cancelled = self.finished.get(name, (0, 0, 0))
        return Counts(
            ready=ready,
            waiting=waiting,
            running=running,
            completed=completed,
            failed=failed,
            cancelled=cancelled,
            needs_review=review,
            blocked=blocked,
            oldest_ready_seconds=oldest,
        )

    async def refresh_every(
        self,
        every: float,
        stop: asyncio.Event | None = None,
        finished_every: float = FINISHED_EVERY,
    ) -> None:
        """Refresh now and then every `every` seconds until `stop` is set (or the task is
        cancelled), counting finished jobs too at first and then every `finished_every`
        seconds; a failed refresh is logged and tried again next time."""
        stop = stop if stop is not None else asyncio.Event()
        while not stop.is_set():
            due = self.finished_at is None or time.monotonic() - self.finished_at >= finished_every
            try:
                await self.refresh(finished=due)
            except (psycopg.Error, AxaQueueError) as error:
                log.warning(
                    "could not count jobs for metrics (%s)",
                    kind(error),
                    extra={"error": first_line(error)},
                )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), every)

    def describe(self) -> list[Metric]:
        """The metric families, without values (so registering does no I/O)."""
        return list(self._families({}, [], None, [], {}))

    def collect(self) -> Iterator[Metric]:
        """The metric families with the last counts."""
        stale = self.queue.options.stale_after.total_seconds()
        states = None if self.refreshed_at is None else [one.state(stale) for one in self.workers]
        yield from self._families(self.counts, self.paused, states, self.unhandled, self.gone_jobs)

    def _families(
        self,
        snapshot: dict[str, Counts],
        paused_names: list[str],
        worker_states: list[str] | None,
        unhandled_names: list[Unhandled],
        gone_jobs: dict[str, int],
    ) -> Iterator[Metric]:
        jobs = GaugeMetricFamily(
            "axa_queue_jobs",
            "Jobs in the table by job name and state (ready: queued and due; waiting: "
            "queued for later), as of the last count (finished states: counted less often).",
            labels=["job", "state"],
        )
        oldest = GaugeMetricFamily(
            "axa_queue_oldest_ready_seconds",
            "Seconds the oldest ready job of each name has waited; rising means nothing runs them.",
            labels=["job"],
        )
        for name, counts in sorted(snapshot.items()):
            for state in STATES:
                jobs.add_metric([name, state], getattr(counts, state))
            oldest.add_metric([name], counts.oldest_ready_seconds)
        yield jobs
        yield oldest
        paused = GaugeMetricFamily(
            "axa_queue_paused",
            "1 for each job name a person paused (axa-queue pause): its jobs are not claimed.",
            labels=["job"],
        )
        for name in paused_names:
            paused.add_metric([name], 1.0)
        yield paused
        yield from worker_families(worker_states, unhandled_names, gone_jobs)
        yield key_family(self.keys if worker_states is not None else {})
        yield GaugeMetricFamily(
            "axa_queue_database_up",
            "1 when the last count of jobs reached the database, else 0.",
            value=1.0 if self.up else 0.0,
        )


class HealthCheck:
    """Asks, from any thread, `queue.health()` on the queue's event loop `loop`: whether
    its pool reaches the database within `timeout` seconds, and, while the queue runs a
    worker, whether that worker crashed or its statements have all failed for
    `stuck_after` seconds (the database answers, but the worker cannot claim or record
    jobs); for a supervisor, also its worker processes' stuck gauge."""

    def __init__(
        self,
        queue: Queue,
        loop: asyncio.AbstractEventLoop,
        timeout: float = HEALTH_TIMEOUT,
        stuck_after: float = STUCK_AFTER,
        processes: CollectorRegistry | None = None,
    ) -> None:
        self.queue = queue
        self.loop = loop
        self.timeout = timeout
        self.stuck_after = stuck_after
        self.processes = processes
        """A supervisor's registry of its worker processes' metrics, whose stuck gauge
        the check reads too (the supervisor's own queue runs no worker)."""

    def __call__(self) -> tuple[bool, str]:
        """`(True, "ok")`, or `(False, why)`."""
        if self.loop.is_closed() or not self.queue.is_open:
            return False, "the worker is not running"
        future = asyncio.run_coroutine_threadsafe(
            self.queue.health(stuck_after=self.stuck_after, timeout=self.timeout), self.loop
        )
        try:
            ok, why = future.result(self.timeout + 1.0)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return False, f"the event loop did not answer within {self.timeout + 1.0:g} s"
        if not ok:
            return False, why
        if self.processes is not None:
            stuck = self.processes.get_sample_value(STUCK_GAUGE) or 0.0
            if stuck >= self.stuck_after:
                return False, (
                    f"a worker process has been failing for {stuck:.0f} s: claiming or "
                    "recording jobs, or its schedules, housekeeping or listener (its log "
                    "says why)"
                )
        return True, "ok"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    registry: CollectorRegistry
    health: Health


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/metrics":
            self._answer(200, CONTENT_TYPE_LATEST, generate_latest(self.server.registry))
        elif path in ("/health", "/healthz"):
            try:
                ok, why = self.server.health()
            except Exception as error:  # a broken check is an unhealthy worker
                ok, why = False, f"the health check failed: {first_line(error)}"
            self._answer(200 if ok else 503, "text/plain; charset=utf-8", f"{why}\n".encode())
        else:
            self._answer(404, "text/plain; charset=utf-8", b"try /metrics or /health\n")

    def _answer(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not worth a log line each."""


class MetricsServer:
    """An HTTP server in a thread of its own: `/metrics` and `/health`."""

    def __init__(
        self, registry: CollectorRegistry, health: Health, port: int, host: str = "0.0.0.0"
    ) -> None:
        self._server = _Server((host, port), _Handler)
        self._server.registry = registry
        self._server.health = health
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="axa-queue-metrics", daemon=True
        )

    @property
    def port(self) -> int:
        """The port it listens on (the one picked, when asked for port 0)."""
        return int(self._server.server_address[1])

    def start(self) -> MetricsServer:
        """Start answering."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop answering and free the port."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()


def serve(
    registry: CollectorRegistry, health: Health, port: int, host: str = "0.0.0.0"
) -> MetricsServer:
    """Serve `registry` on `/metrics` and `health` on `/health` at `host:port` (port 0
    picks a free one) from a daemon thread; `close()` it when done. Raises `OSError`
    when the port cannot be had."""
    return MetricsServer(registry, health, port, host).start()


def multiprocess_registry(path: str) -> CollectorRegistry:
    """A registry that sums the run metrics written to `path` by worker processes started
    with `PROMETHEUS_MULTIPROC_DIR=path`."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
    return registry


def forget_process(pid: int, path: str) -> None:
    """Tidy up after worker process `pid` ended (its counts stay in the sums)."""
    mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
