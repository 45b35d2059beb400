"""Running workers from the command line: the jobs of one `Queue` in this process
(`work`), or in several worker processes under a supervisor that restarts any that
dies (`supervise`).

Both stop gracefully on the first SIGTERM or SIGINT (no new jobs are taken, jobs in
progress finish) and abort on the second (jobs in progress are stopped; stale recovery
queues them again). Either can serve Prometheus metrics and a health check; under a
supervisor the children count their runs in prometheus-client's multiprocess directory
and the supervisor serves the sums. A child started by a supervisor stops by itself when
its supervisor is gone.

`axa-queue worker` (in `cli`) parses the options and calls `work`, or `supervise` with
the `Settings` it was given, from which `child_command` builds each worker process's own
`axa-queue worker` command line; what goes wrong here is raised as an `AxaQueueError` or
a psycopg error, for it to report.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from ..errors import AxaQueueError
from ..logs import LogFormat
from ..options import Pooler, QueueOptions
from ..queue import DSN_VARIABLES, Queue
from ..worker import STUCK_AFTER

if TYPE_CHECKING:
    from ..metrics import MetricsServer

__all__ = [
    "MetricsServerError",
    "Settings",
    "child_command",
    "restart_delay",
    "supervise",
    "work",
]

log = logging.getLogger("axa_queue.supervisor")

SUPERVISOR_VARIABLE = "AXA_QUEUE_SUPERVISOR"
"""Set by `worker --processes` in each child: the supervisor's pid, watched by the child."""

PROCESS_VARIABLE = "AXA_QUEUE_PROCESS"
"""Set by `worker --processes` in each child: its place, 0 to P-1, kept across restarts."""

METRICS_VARIABLE = "AXA_QUEUE_METRICS"
"""Set to 1 by `worker --processes --metrics-port` in each child: count runs for the
supervisor, in prometheus-client's multiprocess directory."""

RESTART_FIRST = 0.5
"""Seconds before restarting a worker process that died; doubles on each death."""

RESTART_MAX = 30.0
"""The longest wait before restarting a worker process."""

RESTART_HEALTHY = 10.0
"""Seconds a worker process must run before its death counts as a new trouble rather
than the same one again: it is then restarted after `RESTART_FIRST` (see
`restart_delay`)."""

ABORT_KILL_AFTER = 10.0
"""Seconds after the second signal before worker processes still running get SIGKILL."""

COUNTS_EVERY = 15.0
"""Seconds between counts of the table for the metrics (one query each)."""


@dataclass(frozen=True)
class Settings:
    """What each worker process of `axa-queue worker --processes` runs: the queue, its
    loops, its connection options as the supervisor resolved them (from the command
    line, the queue's own options and the environment) and its logs. `child_command`
    makes its command line of them."""

    target: str
    """The queue, as `MODULE:ATTR`."""
    workers: int
    """Job loops per process."""
    wait_for_database: float
    """Seconds to keep trying while the database cannot be reached at start."""
    pooler: Pooler = "direct"
    """What is between the workers and PostgreSQL."""
    schema: str | None = None
    """The schema of the queue's tables; None: the connection's search_path."""
    log_format: LogFormat = "text"
    """`json` or `text` (`logs.configure`)."""
    log_level: str = "info"
    """The least important events logged: `debug`, `info`, `warning` or `error`."""
    log_tracebacks: bool = False
    """Whether a failed run's log line carries its traceback."""
    program: tuple[str, ...] = ()
    """The command line that runs the `axa-queue` commands, up to the command's name;
    empty for this Python's `-m axa_queue.cli`. A program that must prepare the process
    before the queue's module is imported gives its own: `manage.py axa_queue` starts
    its children through `manage.py`, so each sets Django up."""


def child_command(settings: Settings) -> list[str]:
    """The command line of a worker process run by a supervisor: `axa-queue worker` on
    `settings` (through `settings.program`, else in this Python), without setup (the
    supervisor has done it, once)."""
    command = [
        *(settings.program or (sys.executable, "-m", "axa_queue.cli")),
        "worker",
        settings.target,
        "--no-setup",
        "--wait-for-database",
        str(settings.wait_for_database),
        "--log-format",
        settings.log_format,
        "--log-level",
        settings.log_level,
        "--workers",
        str(settings.workers),
        "--pooler",
        settings.pooler,
    ]
    if settings.schema is not None:
        command += ["--schema", settings.schema]
    if settings.log_tracebacks:
        command.append("--log-tracebacks")
    return command


def restart_delay(previous: float | None, ran_for: float) -> float:
    """Seconds to wait before restarting a worker process that died after running
    `ran_for` seconds, the wait before its last start having been `previous` (None for
    its first death).

    A process that ran at least `RESTART_HEALTHY` had come up well: whatever killed it
    (an operator, the OOM killer, a lost host) is not a crash loop, so it comes back
    after `RESTART_FIRST`. One that died sooner waits twice as long as last time, up to
    `RESTART_MAX`, so a process that cannot start (a bad deploy, a broken module)
    does not spin."""
    if previous is None or ran_for >= RESTART_HEALTHY:
        return RESTART_FIRST
    return min(previous * 2, RESTART_MAX)


class MetricsServerError(AxaQueueError):
    """The metrics server could not listen on the host and port it was given."""


class _Signals:
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


async def _serve_metrics(
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
    signals: _Signals | None = None
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
            server, counting = await _serve_metrics(
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

        signals = _Signals(first, again)
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


async def supervise(
    settings: Settings,
    processes: int,
    dsn: str,
    setup: bool,
    metrics_port: int | None,
    metrics_host: str,
    stuck_after: float = STUCK_AFTER,
    options: QueueOptions | None = None,
    on_wait: Callable[[psycopg.OperationalError], None] | None = None,
) -> int:
    """Keep `processes` worker processes running `settings` (`child_command`, run with
    the supervisor's environment) until signalled; 0 when all stopped gracefully.
    `stuck_after`: as for `work`, of any of the processes. `on_wait`: called at the
    first failed try to reach the database that is tried again (`Connector.on_wait`).
    `options`: the queue's own,
    which the supervisor's setup (or check) and counts honour (its lock timeout, its
    prepared statements...) on a pool of its own size."""
    command = child_command(settings)
    control = Queue(
        dsn,
        dataclasses.replace(
            options if options is not None else QueueOptions(),
            pool_size=2,
            wait_for_database=settings.wait_for_database,
            pooler=settings.pooler,
            schema=settings.schema,
        ),
    )
    control.connector.on_wait = on_wait
    await control.open(setup=setup)  # set up (or check) once, before any child starts
    env = {**os.environ, DSN_VARIABLES[0]: dsn, SUPERVISOR_VARIABLE: str(os.getpid())}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.pop(METRICS_VARIABLE, None)
    stopping = asyncio.Event()
    children: dict[int, asyncio.subprocess.Process] = {}
    server: MetricsServer | None = None
    counting: asyncio.Task[None] | None = None
    metrics_dir: str | None = None
    signals: _Signals | None = None
    aborted = False
    try:
        if metrics_port is not None:
            from ..metrics import multiprocess_registry

            metrics_dir = tempfile.mkdtemp(prefix="axa-queue-metrics-")
            env["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
            env[METRICS_VARIABLE] = "1"
            server, counting = await _serve_metrics(
                control,
                multiprocess_registry(metrics_dir),
                metrics_port,
                metrics_host,
                stopping,
                stuck_after,
                processes=True,
            )
        else:
            await control.close()

        def tell(signum: int) -> None:
            for child in children.values():
                if child.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        child.send_signal(signum)

        def first(name: str) -> None:
            log.info(
                "stopping: worker processes finish their jobs (signal again to abort them)",
                extra={"signal": name},
            )
            stopping.set()
            tell(signal.SIGTERM)

        def again(name: str) -> None:
            nonlocal aborted
            aborted = True
            log.warning(
                "aborting: worker processes stop their jobs; stale recovery will queue them again",
                extra={"signal": name},
            )
            tell(signal.SIGTERM)
            asyncio.get_running_loop().call_later(ABORT_KILL_AFTER, tell, signal.SIGKILL)

        signals = _Signals(first, again)

        async def keep(slot: int) -> int:
            delay: float | None = None
            code = 0
            while not stopping.is_set():
                started = time.monotonic()
                child = await asyncio.create_subprocess_exec(
                    *command,
                    env={**env, PROCESS_VARIABLE: str(slot)},
                    stdin=asyncio.subprocess.DEVNULL,
                    start_new_session=True,  # a terminal's Ctrl-C reaches only the supervisor
                )
                children[slot] = child
                if stopping.is_set():
                    child.send_signal(signal.SIGTERM)
                log.info("started a worker process", extra={"slot": slot, "child_pid": child.pid})
                code = await child.wait()
                if metrics_dir is not None:
                    from ..metrics import forget_process

                    forget_process(child.pid, metrics_dir)
                if stopping.is_set():
                    log.info(
                        "a worker process stopped",
                        extra={"slot": slot, "child_pid": child.pid, "exit_code": code},
                    )
                    return code
                delay = restart_delay(delay, time.monotonic() - started)
                log.error(
                    "a worker process died; starting another",
                    extra={
                        "slot": slot,
                        "child_pid": child.pid,
                        "exit_code": code,
                        "restart_in": delay,
                    },
                )
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stopping.wait(), delay)
            return code

        log.info(
            "supervisor started",
            extra={"processes": processes, "workers": settings.workers, "schema": control.schema},
        )
        codes = await asyncio.gather(*(keep(slot) for slot in range(processes)))
        if aborted:
            return 1
        return 0 if all(code == 0 for code in codes) else 1
    finally:
        if signals is not None:
            signals.close()
        for child in children.values():
            if child.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.kill()
                await child.wait()
        if counting is not None:
            counting.cancel()
        if server is not None:
            server.close()
        await control.close()
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
