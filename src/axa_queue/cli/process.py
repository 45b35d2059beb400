"""One worker process run from the command line (`work`): the jobs of one `Queue`,
until signalled, and what a `supervisor` shares with it (the signals, the metrics
server, the variables it sets in each worker process).

It stops gracefully on the first SIGTERM or SIGINT (no new jobs are taken, jobs in
progress finish) and aborts on the second (jobs in progress are stopped; stale recovery
queues them again). It can serve Prometheus metrics and a health check; under a
supervisor it counts its runs in prometheus-client's multiprocess directory and the
supervisor serves the sums. Started by a supervisor, it stops by itself when its
supervisor is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg

from ..errors import AxaQueueError
from ..queue import Queue
from ..worker import STUCK_AFTER

if TYPE_CHECKING:
    from ..metrics import MetricsServer

__all__ = [
    "COUNTS_EVERY",
    "METRICS_VARIABLE",
    "PROCESS_VARIABLE",
    "SUPERVISOR_VARIABLE",
    "MetricsServerError",
    "Signals",
    "serve_metrics",
    "work",
]

log = logging.getLogger("axa_queue.supervisor")  # the name its log lines always had

SUPERVISOR_VARIABLE = "AXA_QUEUE_SUPERVISOR"
"""Set by `worker --processes` in each child: the supervisor's pid, watched by the child."""

PROCESS_VARIABLE = "AXA_QUEUE_PROCESS"
"""Set by `worker --processes` in each child: its place, 0 to P-1, kept across restarts."""

METRICS_VARIABLE = "AXA_QUEUE_METRICS"
"""Set to 1 by `worker --processes --metrics-port` in each child: count runs for the
supervisor, in prometheus-client's multiprocess directory."""

COUNTS_EVERY = 15.0
"""Seconds between counts of the table for the metrics (one query each)."""


class MetricsServerError(AxaQueueError):
    """The metrics server could not listen on the host and port it was given."""


class Signals:
    """SIGTERM and SIGINT: the first calls `first`, any later one `again`."""

    def __init__(self, first: Callable[[str], None], again: Callable[[str], None]) -> None:
        self.count = 0
        self.first = first
        self.again = again
        self.loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(signum, self._got, signum)

    def _got(self, signum: int) -> None:
        self.count += 1
        name = signal.Signals(signum).name
        (self.first if self.count == 1 else self.again)(name)

    def close(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            self.loop.remove_signal_handler(signum)


async def serve_metrics(
    queue: Queue,
    registry: Any,
    port: int,
    host: str,
    stop: asyncio.Event,
    stuck_after: float,
    processes: bool,
) -> tuple[MetricsServer, asyncio.Task[None]]:
    """Count jobs now and every `COUNTS_EVERY`, and serve `registry` with a health check
    (which, for a supervisor's `processes`, reads their stuck gauge in `registry`).
    Raises `MetricsServerError` when the port cannot be had."""
    from ..metrics import HealthCheck, QueueCollector, serve

    collector = QueueCollector(queue, registry)
    with contextlib.suppress(psycopg.Error):
        await collector.refresh()
    counting = asyncio.ensure_future(collector.refresh_every(COUNTS_EVERY, stop))
    health = HealthCheck(
        queue,
        asyncio.get_running_loop(),
        stuck_after=stuck_after,
        processes=registry if processes else None,
    )
    try:
        server = serve(registry, health, port, host)
    except OSError as error:
        counting.cancel()
        raise MetricsServerError(
            f"cannot serve metrics on {host}:{port}: {error.strerror or error}"
        ) from None
    log.info("serving metrics", extra={"host": host, "port": server.port})
    return server, counting


async def work(
    queue: Queue,
    dsn: str,
    setup: bool,
    metrics_port: int | None,
    metrics_host: str,
    stuck_after: float = STUCK_AFTER,
) -> int:
    """Run `queue` in this process until signalled; 0 after a graceful stop, 1 aborted.
    `stuck_after`: seconds every statement of the worker may fail, the database
    answering, before `/health` says so."""
    await queue.open(dsn, setup=setup)
    stop = asyncio.Event()
    server: MetricsServer | None = None
    counting: asyncio.Task[None] | None = None
    tracking: asyncio.Task[None] | None = None
    watching: asyncio.Task[None] | None = None
    signals: Signals | None = None
    slot = os.environ.get(PROCESS_VARIABLE)
    fields: dict[str, Any] = {} if slot is None else {"slot": int(slot)}
    try:
        supervisor = os.environ.get(SUPERVISOR_VARIABLE)
        if supervisor and os.environ.get(METRICS_VARIABLE) == "1":
            from ..metrics import RunMetrics

            shared = RunMetrics(registry=None).attach(queue)  # summed by the supervisor
            tracking = asyncio.ensure_future(shared.track(queue))
        if metrics_port is not None:
            from prometheus_client import CollectorRegistry

            from ..metrics import RunMetrics

            registry = CollectorRegistry()
            own = RunMetrics(registry).attach(queue)
            tracking = asyncio.ensure_future(own.track(queue))
            server, counting = await serve_metrics(
                queue, registry, metrics_port, metrics_host, stop, stuck_after, processes=False
            )
        running = asyncio.ensure_future(queue.run(stop))

        def first(name: str) -> None:
            log.info(
                "stopping: jobs in progress will finish (signal again to abort them)",
                extra={**fields, "signal": name},
            )
            stop.set()

        def again(name: str) -> None:
            log.warning(
                "aborting: jobs in progress are stopped; stale recovery will queue them again",
                extra={**fields, "signal": name},
            )
            running.cancel()

        signals = Signals(first, again)
        if supervisor:
            watching = asyncio.ensure_future(_watch_supervisor(int(supervisor), stop))
        log.info(
            "worker started",
            extra={
                **fields,
                "schema": queue.schema,
                "workers": queue.options.workers,
                "handlers": len(queue.handlers),
                "schedules": len(queue.schedule_list),
            },
        )
        try:
            await running
        except asyncio.CancelledError:
            if not running.cancelled():
                raise
            return 1
        ran = queue.worker.stats if queue.worker is not None else Counter[str]()
        log.info("worker stopped", extra={**fields, **{k: ran[k] for k in sorted(ran)}})
        return 0
    finally:
        if signals is not None:
            signals.close()
        for task in (watching, counting, tracking):
            if task is not None:
                task.cancel()
        if server is not None:
            server.close()
        await queue.close()


async def _watch_supervisor(pid: int, stop: asyncio.Event) -> None:
    """Stop gracefully if the supervisor that started this process is gone."""
    while not stop.is_set():
        if os.getppid() != pid:
            log.warning("the supervisor is gone: stopping", extra={"supervisor": pid})
            stop.set()
            return
        await asyncio.sleep(1.0)
