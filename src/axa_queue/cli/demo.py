"""`demo`: see the queue work, on an embedded PostgreSQL (what it runs is in
`axa_queue.demo`)."""

from __future__ import annotations

import click

from .. import demo
from .conventions import Failed, checked_dsn, reported, where
from .text import console
from .web import serve_demo

__all__ = ["demo_command"]


@click.command("demo")
@click.option(
    "--dsn",
    metavar="DSN",
    help="Run on this database instead, in a schema of its own that is dropped "
    "afterwards. Default: start an embedded PostgreSQL (the [embedded] extra). "
    "The environment is not read: a demo never lands in your queue by accident.",
)
@click.option(
    "--jobs",
    "total",
    type=click.IntRange(20, 20_000),
    metavar="N",
    default=300,
    show_default=True,
    help="About how many sample jobs to queue.",
)
@click.option(
    "--web",
    "with_web",
    is_flag=True,
    help="Keep the sample queue working, with a trickle of new jobs, and serve the "
    "dashboard on it (the [web] extra) until Ctrl-C; a sign-in token is printed.",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=8080,
    show_default=True,
    help="With --web: the dashboard's port, on 127.0.0.1.",
)
def demo_command(dsn: str | None, total: int, with_web: bool, port: int) -> None:
    """See axa-queue work, with nothing to set up.

    Starts an embedded PostgreSQL (or uses --dsn), sets the queue up, queues a few
    hundred sample jobs (some fail and are retried, some wait, one runs on a
    schedule), works them with a progress bar, prints what happened, and cleans up.
    With --web, serves the dashboard on the working queue instead.
    """

    def show(on: str, where_text: str) -> None:
        if with_web:
            serve_demo(on, "127.0.0.1", port)
        else:
            demo.run(on, total, where_text, console())

    if dsn is not None:
        given = checked_dsn(dsn)
        with reported(given), demo.sandbox(given) as (sandboxed, schema):
            show(sandboxed, f"{where(given)} (schema {schema})")
        return
    from ..embedded import EmbeddedPostgresError

    try:
        with demo.embedded_server(click.echo) as server_dsn, reported(server_dsn):
            show(server_dsn, "an embedded PostgreSQL")
    except demo.DemoError as error:  # no server: the [embedded] extra is not installed
        raise Failed(str(error)) from None
    except EmbeddedPostgresError as error:  # its message ends with the server's log
        raise Failed(str(error).splitlines()[0]) from None
