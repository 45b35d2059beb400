"""Several worker processes under a supervisor (`axa-queue worker --processes`): a
`Supervisor` keeps each running and starts another when one dies (`restart_delay`).

It stops gracefully on the first SIGTERM or SIGINT, passed on to the worker processes
(no new jobs are taken, jobs in progress finish), and aborts on the second (jobs in
progress are stopped; stale recovery queues them again; past `ABORT_KILL_AFTER` the
processes still running are killed). It can serve Prometheus metrics and a health
check: its worker processes count their runs in prometheus-client's multiprocess
directory and the supervisor serves the sums. Each worker process (`process.work`)
stops by itself when its supervisor is gone.

`axa-queue worker` (in `cli`) parses the options and calls `process.work`, or
`supervise` with the `Settings` it was given, from which `child_command` builds each
worker process's own `axa-queue worker` command line; what goes wrong here is raised as
an `AxaQueueError` or a psycopg error, for it to report.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg

from ..logs import LogFormat
from ..options import Pooler, QueueOptions
from ..queue import DSN_VARIABLES, Queue
from ..worker import STUCK_AFTER
from .process import (
    METRICS_VARIABLE,
    PROCESS_VARIABLE,
    SUPERVISOR_VARIABLE,
    Signals,
    serve_metrics,
)

if TYPE_CHECKING:
    from ..metrics import MetricsServer

__all__ = [
    "ABORT_KILL_AFTER",
    "RESTART_FIRST",
    "RESTART_HEALTHY",
    "RESTART_MAX",
    "Settings",
    "Supervisor",
    "SupervisorState",
    "child_command",
    "restart_delay",
    "supervise",
]

log = logging.getLogger("axa_queue.supervisor")

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


class SupervisorState(enum.Enum):
    """Where a `Supervisor` is; it only ever moves forward (a second signal skips
    nothing: `STOPPING` then `ABORTING`)."""

    STARTING = "starting"
    """Setting the tables up (or checking them) and the metrics server; no worker
    process started yet."""
    RUNNING = "running"
    """Keeping `processes` worker processes running: one that dies is started again
    after `restart_delay`."""
    STOPPING = "stopping"
    """The first signal: every worker process was sent SIGTERM and finishes its jobs;
    none is started again."""
    ABORTING = "aborting"
    """A second signal: every worker process was sent SIGTERM again (they stop their
    jobs) and gets SIGKILL after `ABORT_KILL_AFTER`; the supervisor exits 1."""
    STOPPED = "stopped"
    """Every worker process has ended, and the supervisor's own connections and
    metrics server are closed."""


class Supervisor:
    """Keeps worker processes running `settings` (`child_command`, run with the
    supervisor's environment), one per slot, until signalled: `run` returns 0 when all
    stopped gracefully. The states it goes through are `SupervisorState`'s.

    `stuck_after`: as for `work`, of any of the processes. `on_wait`: called at the
    first failed try to reach the database that is tried again (`Connector.on_wait`).
    `options`: the queue's own, which the supervisor's setup (or check) and counts
    honour (its lock timeout, its prepared statements...) on a pool of its own size."""

    def __init__(
        self,
        settings: Settings,
        processes: int,
        dsn: str,
        setup: bool,
        metrics_port: int | None,
        metrics_host: str,
        stuck_after: float = STUCK_AFTER,
        options: QueueOptions | None = None,
        on_wait: Callable[[psycopg.OperationalError], None] | None = None,
    ) -> None:
        self.settings = settings
        self.processes = processes
        self.dsn = dsn
        self.setup = setup
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.stuck_after = stuck_after
        self.options = options if options is not None else QueueOptions()
        self.on_wait = on_wait
        self.state = SupervisorState.STARTING
        self.stopping = asyncio.Event()
        """Set once stopping (or aborting): no worker process is started again."""
        self.children: dict[int, asyncio.subprocess.Process] = {}
        """The last worker process started in each slot."""
        self.command: list[str] = []
        """Each worker process's command line (`child_command`)."""
        self.env: dict[str, str] = {}
        """Each worker process's environment, but for its slot (`PROCESS_VARIABLE`)."""
        self.control: Queue | None = None
        """The supervisor's own queue: setup (or check), and counts for the metrics."""
        self.server: MetricsServer | None = None
        self.counting: asyncio.Task[None] | None = None
        self.metrics_dir: str | None = None
        """prometheus-client's multiprocess directory, with `--metrics-port`."""
        self.signals: Signals | None = None

    async def run(self) -> int:
        """Set up once, then keep the worker processes running until signalled; 0 when
        all stopped gracefully, 1 when aborted or when a process's last exit was not 0.
        Whatever happens, every worker process has ended when it returns."""
        self.command = child_command(self.settings)
        self.control = Queue(
            self.dsn,
            dataclasses.replace(
                self.options,
                pool_size=2,
                wait_for_database=self.settings.wait_for_database,
                pooler=self.settings.pooler,
                schema=self.settings.schema,
            ),
        )
        self.control.connector.on_wait = self.on_wait
        await self.control.open(setup=self.setup)  # set up (or check) once, before any child
        try:
            await self._start()
            log.info(
                "supervisor started",
                extra={
                    "processes": self.processes,
                    "workers": self.settings.workers,
                    "schema": self.control.schema,
                },
            )
            codes = await asyncio.gather(*(self._keep(slot) for slot in range(self.processes)))
            if self.state is SupervisorState.ABORTING:
                return 1
            return 0 if all(code == 0 for code in codes) else 1
        finally:
            await self._close()

    async def _start(self) -> None:
        """The worker processes' environment, the metrics server (with `--metrics-port`;
        else the control queue is closed: nothing more to ask the database), and the
        signal handlers; then `RUNNING`."""
        assert self.control is not None
        env = {
            **os.environ,
            DSN_VARIABLES[0]: self.dsn,
            SUPERVISOR_VARIABLE: str(os.getpid()),
        }
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        env.pop(METRICS_VARIABLE, None)
        self.env = env
        if self.metrics_port is not None:
            from ..metrics import multiprocess_registry

            self.metrics_dir = tempfile.mkdtemp(prefix="axa-queue-metrics-")
            env["PROMETHEUS_MULTIPROC_DIR"] = self.metrics_dir
            env[METRICS_VARIABLE] = "1"
            self.server, self.counting = await serve_metrics(
                self.control,
                multiprocess_registry(self.metrics_dir),
                self.metrics_port,
                self.metrics_host,
                self.stopping,
                self.stuck_after,
                processes=True,
            )
        else:
            await self.control.close()
        self.signals = Signals(self._stop, self._abort)
        self.state = SupervisorState.RUNNING

    def _stop(self, name: str) -> None:
        """The first signal: `STOPPING`."""
        log.info(
            "stopping: worker processes finish their jobs (signal again to abort them)",
            extra={"signal": name},
        )
        self.state = SupervisorState.STOPPING
        self.stopping.set()
        self._tell(signal.SIGTERM)

    def _abort(self, name: str) -> None:
        """A later signal: `ABORTING`."""
        log.warning(
            "aborting: worker processes stop their jobs; stale recovery will queue them again",
            extra={"signal": name},
        )
        self.state = SupervisorState.ABORTING
        self.stopping.set()
        self._tell(signal.SIGTERM)
        asyncio.get_running_loop().call_later(ABORT_KILL_AFTER, self._tell, signal.SIGKILL)

    def _tell(self, signum: int) -> None:
        """Send `signum` to every worker process still running."""
        for child in self.children.values():
            if child.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(signum)

    async def _keep(self, slot: int) -> int:
        """Keep a worker process running in `slot` until stopping; its last exit code."""
        delay: float | None = None
        code = 0
        while not self.stopping.is_set():
            started = time.monotonic()
            child = await self._spawn(slot)
            code = await child.wait()
            if self.metrics_dir is not None:
                from ..metrics import forget_process

                forget_process(child.pid, self.metrics_dir)
            if self.stopping.is_set():
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
                await asyncio.wait_for(self.stopping.wait(), delay)
        return code

    async def _spawn(self, slot: int) -> asyncio.subprocess.Process:
        """Start the worker process of `slot` (told to stop at once if a signal came
        while it was being started)."""
        child = await asyncio.create_subprocess_exec(
            *self.command,
            env={**self.env, PROCESS_VARIABLE: str(slot)},
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,  # a terminal's Ctrl-C reaches only the supervisor
        )
        self.children[slot] = child
        if self.stopping.is_set():
            child.send_signal(signal.SIGTERM)
        log.info("started a worker process", extra={"slot": slot, "child_pid": child.pid})
        return child

    async def _close(self) -> None:
        """`STOPPED`: kill any worker process still running (the supervisor itself is
        failing or cancelled), then close the metrics server, the control queue and the
        metrics directory."""
        if self.signals is not None:
            self.signals.close()
        for child in self.children.values():
            if child.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.kill()
                await child.wait()
        if self.counting is not None:
            self.counting.cancel()
        if self.server is not None:
            self.server.close()
        if self.control is not None:
            await self.control.close()
        if self.metrics_dir is not None:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)
        self.state = SupervisorState.STOPPED


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
    """Run a `Supervisor` of `processes` worker processes running `settings` until
    signalled; 0 when all stopped gracefully (see `Supervisor` for the rest)."""
    return await Supervisor(
        settings,
        processes,
        dsn,
        setup,
        metrics_port,
        metrics_host,
        stuck_after,
        options,
        on_wait,
    ).run()
