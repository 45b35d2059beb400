"""`worker`: run the jobs of a queue, in this process or in several under a supervisor
(`process` and `supervisor` run them; this parses the command line and reports errors)."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

import click
import psycopg

from .. import logs
from ..queue import Queue
from ..worker import STUCK_AFTER
from . import process, supervisor
from .conventions import (
    BadInput,
    Failed,
    checked_dsn,
    connection_options,
    dsn_option,
    invocation,
    log_options,
    reported,
    said,
    where,
)
from .text import one_line

__all__ = ["WAIT_FOR_DATABASE", "load_queue", "waiting_line", "waiting_notice", "worker"]

WAIT_FOR_DATABASE = 60.0
"""Seconds `worker` keeps trying to reach the database at start (`--wait-for-database`)."""


def load_queue(target: str) -> Queue:
    """The `Queue` named by `MODULE:ATTR` (an attribute path after the colon), imported
    with the current directory on `sys.path`, as `python -m` would have it. Raises a
    click error saying what is wrong."""
    module_name, colon, attribute = target.partition(":")
    if not colon or not module_name.strip() or not attribute.strip():
        raise click.BadParameter(
            f"expected MODULE:ATTR, like myapp.jobs:queue, got: {target!r}",
            param_hint="'MODULE:ATTR'",
        )
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and (
            module_name == error.name or module_name.startswith(error.name + ".")
        ):
            raise BadInput(
                f"no module named {module_name!r}: is it installed, on PYTHONPATH, "
                "or under the current directory?"
            ) from None
        raise Failed(f"importing {module_name!r} failed: {_describe(error)}") from None
    except Exception as error:
        raise Failed(f"importing {module_name!r} failed: {_describe(error)}") from None
    found: Any = module
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise BadInput(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(found, Queue):
        raise BadInput(f"{target} is a {type(found).__name__}, not an axa_queue.Queue")
    return found


def _describe(error: BaseException) -> str:
    """`Type: message (file:line)` of where `error` was raised, on one line."""
    where = ""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None:
        where = f" ({tb.tb_frame.f_code.co_filename}:{tb.tb_lineno})"
    message = one_line(str(error))
    return f"{type(error).__name__}{f': {message}' if message else ''}{where}"


def waiting_line(dsn: str, seconds: float, error: psycopg.OperationalError) -> str:
    """What `worker` says when it starts waiting for the database: for how long, where
    (no user or password), why, and how to stop waiting."""
    reason = said(error)
    return (
        f"waiting up to {seconds:g} s for the database at {where(dsn)} "
        f"({reason[:1].lower()}{reason[1:]}); Ctrl-C to stop, --wait-for-database 0 to "
        "fail at once"
    )


def waiting_notice(
    dsn: str, seconds: float, interactive: bool | None = None
) -> Callable[[psycopg.OperationalError], None] | None:
    """On a terminal (`interactive`; default: whether stderr is one), what prints the
    `waiting_line` to stderr at the first failed try to reach the database (see
    `Connector.on_wait`), so a wrong port is not a silent minute. `None` when not
    interactive, where the log line of each try says it, or when not waiting at all."""
    if seconds <= 0 or not (sys.stderr.isatty() if interactive is None else interactive):
        return None

    def say(error: psycopg.OperationalError) -> None:
        click.echo(waiting_line(dsn, seconds, error), err=True)

    return say


def _need_metrics() -> None:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise BadInput(
            "--metrics-port needs prometheus-client: pip install 'axa-queue[metrics]'"
        ) from None


@click.command()
@click.argument("target", metavar="MODULE:ATTR", required=False)
@click.option(
    "--workers",
    type=int,
    metavar="N",
    help="Job loops per process: the most jobs each process runs at once. "
    "Default: the queue's own `workers` option.",
)
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    metavar="P",
    help="Start P worker processes, each with N loops, under this one as supervisor; "
    "it restarts any that dies. Default: work in this process.",
)
@click.option(
    "--setup/--no-setup",
    default=True,
    show_default=True,
    help="Run the setup statements at start, or only check the tables "
    "(--no-setup, for a role that may not run DDL).",
)
@log_options
@click.option(
    "--log-tracebacks",
    is_flag=True,
    help="Add the traceback to the log line of a job run that raised. It shows source "
    "lines and exception messages in full (whatever a handler put in them). Default: "
    "the queue's own `log_tracebacks` option (off).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    metavar="PORT",
    help="Serve Prometheus metrics on /metrics and a health check on /health at this "
    "port (0 picks a free one, logged). Needs the [metrics] extra.",
)
@click.option(
    "--metrics-host",
    default="0.0.0.0",
    metavar="HOST",
    show_default=True,
    help="The address the metrics server listens on.",
)
@click.option(
    "--stuck-after",
    type=click.FloatRange(min=0, min_open=True),
    default=STUCK_AFTER,
    metavar="SECONDS",
    show_default=True,
    help="/health answers 503 once every statement that claims or records jobs has "
    "failed this long while the database answers (with --processes: in any process).",
)
@click.option(
    "--wait-for-database",
    type=click.FloatRange(min=0),
    default=WAIT_FOR_DATABASE,
    metavar="SECONDS",
    show_default=True,
    help="While the database cannot be reached at start (an outage, a restart during a "
    "deploy), keep trying, with backoff and a log line each time, for this long before "
    "exiting 1; on a terminal, the first failed try also says where it waits and how to "
    "stop. 0 fails at once.",
)
@dsn_option
def worker(
    target: str | None,
    workers: int | None,
    processes: int | None,
    setup: bool,
    log_format: logs.LogFormat,
    log_level: str,
    log_tracebacks: bool,
    metrics_port: int | None,
    metrics_host: str,
    stuck_after: float,
    wait_for_database: float,
    dsn: str | None,
) -> None:
    """Run the jobs of the Queue at MODULE:ATTR (its handlers, limits and schedules).

    SIGTERM or Ctrl-C stops it gracefully: no new jobs are taken and jobs in progress
    finish. A second signal aborts them; stale recovery queues them again later.
    """
    given = invocation()
    target = target or given.default_target
    if target is None:
        raise BadInput("Missing argument 'MODULE:ATTR'.")
    logs.configure(log_format, log_level.upper())
    queue = load_queue(target)
    with reported(None):
        if workers is not None:
            queue.options = dataclasses.replace(queue.options, workers=workers)
        queue.options = dataclasses.replace(queue.options, wait_for_database=wait_for_database)
        if log_tracebacks:
            queue.options = dataclasses.replace(queue.options, log_tracebacks=True)
    queue.options = connection_options(queue.options)
    if metrics_port is not None:
        _need_metrics()
    target_dsn = checked_dsn(dsn or queue.dsn)
    on_wait = waiting_notice(target_dsn, wait_for_database)
    with reported(target_dsn):
        if processes is None:
            queue.connector.on_wait = on_wait
            code = asyncio.run(
                process.work(queue, target_dsn, setup, metrics_port, metrics_host, stuck_after)
            )
        else:
            settings = supervisor.Settings(
                target=target,
                workers=queue.options.workers,
                wait_for_database=wait_for_database,
                pooler=queue.options.resolved_pooler(),
                schema=queue.options.resolved_schema(),
                log_format=log_format,
                log_level=log_level,
                log_tracebacks=queue.options.log_tracebacks,
                program=given.program,
            )
            code = asyncio.run(
                supervisor.supervise(
                    settings,
                    processes,
                    target_dsn,
                    setup,
                    metrics_port,
                    metrics_host,
                    stuck_after,
                    options=queue.options,
                    on_wait=on_wait,
                )
            )
    if code:
        sys.exit(code)
