"""What every command shares: the `--dsn`, `--pooler`, `--schema` and `--json` options,
errors as one line, and `answer`, the one way a command opens a queue, asks it
something and prints what it found, as JSON for scripts or as tables and text for
people."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import typing
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from rich.table import Table

from .. import logs
from ..db import dsns
from ..errors import AxaQueueError, OptionsError, SchemaError
from ..handlers.retries import first_line
from ..options import Pooler, QueueOptions
from ..queue import DSN_VARIABLES, Queue
from .text import console, print_json

__all__ = [
    "MOMENT",
    "BadInput",
    "Failed",
    "Invocation",
    "Printed",
    "answer",
    "checked_dsn",
    "connection_options",
    "dsn_option",
    "invocation",
    "json_option",
    "reported",
    "said",
    "where",
    "with_queue",
]

T = TypeVar("T")

Printed = str | Table
"""What a command prints for people: a line of text, or a table."""

CONNECT_TIMEOUT = 10
"""Seconds to wait for the database to answer a connection, unless the DSN says."""

DSN_HELP = (
    "The database: a libpq connection string or postgresql:// URL (a SQLAlchemy "
    "postgresql+asyncpg:// or +psycopg:// URL is read as postgresql://). "
    "Default: $AXA_QUEUE_DSN, then $DATABASE_URL."
)
JSON_HELP = "Print JSON, for scripts, instead of a table."
POOLER_HELP = (
    "What is between this and PostgreSQL: direct, or a pooler (PgBouncer) in session or "
    "transaction mode; transaction turns off prepared statements, LISTEN and session "
    "settings. Default: the queue's own option, else $AXA_QUEUE_POOLER, else direct."
)
SCHEMA_HELP = (
    "The schema of the queue's tables, named in every statement (works behind a pooler, "
    "which refuses options=-c search_path). Default: the queue's own option, else "
    "$AXA_QUEUE_SCHEMA, else the connection's search_path."
)


# --- errors ------------------------------------------------------------------------------


class BadInput(click.UsageError):
    """A mistake in the command line that is only found out late; exit status 2."""


class Failed(click.ClickException):
    """The command could not do what it was asked; exit status 1."""


def checked_dsn(given: str | None) -> str:
    """The DSN to use, checked (`dsns.normalized`: a SQLAlchemy URL's `+driver` is
    dropped), with a connection timeout unless it sets one."""
    if not given:
        raise BadInput("no database given: pass --dsn, or set AXA_QUEUE_DSN (or DATABASE_URL)")
    try:
        given = dsns.normalized(given, "the database given (--dsn, AXA_QUEUE_DSN or DATABASE_URL)")
    except OptionsError as error:
        raise BadInput(str(error)) from None
    try:
        params = conninfo_to_dict(given)
    except psycopg.ProgrammingError:
        # libpq's message may quote the password: say what is wrong without it.
        raise BadInput(
            "the database given (--dsn, AXA_QUEUE_DSN or DATABASE_URL) is not a valid "
            "libpq connection string (key=value ...) or postgresql:// URL"
        ) from None
    if "connect_timeout" in params:
        return given
    return make_conninfo(given, connect_timeout=CONNECT_TIMEOUT)


def where(dsn: str) -> str:
    """Where `dsn` points, without user or password: `host:port/dbname` (the port libpq
    takes when the DSN gives none: `PGPORT`, else 5432)."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "the given address"
    host = str(params.get("host") or params.get("hostaddr") or "the local socket")
    port = params.get("port") or os.environ.get("PGPORT") or "5432"
    dbname = params.get("dbname")
    return f"{host}{f':{port}' if port else ''}{f'/{dbname}' if dbname else ''}"


def said(error: psycopg.Error) -> str:
    """What the database said (`retries.first_line`), without libpq's `connection to
    server at ... failed: FATAL:` preamble: the error line names the place itself."""
    line = first_line(error)
    if " failed: " in line:
        line = line.rsplit(" failed: ", 1)[1]
    for prefix in ("FATAL:", "ERROR:"):
        if line.startswith(prefix):
            line = line[len(prefix) :].strip()
    return line


@contextlib.contextmanager
def reported(dsn: str | None) -> Iterator[None]:
    """Turn what the library raises into a one-line error."""
    try:
        yield
    except psycopg.errors.QueryCanceled as error:  # an OperationalError, but it answered
        raise Failed(f"the database at {where(dsn or '')} cancelled: {said(error)}") from None
    except psycopg.OperationalError as error:
        raise Failed(f"cannot reach the database at {where(dsn or '')}: {said(error)}") from None
    except psycopg.Error as error:
        raise Failed(f"the database at {where(dsn or '')} refused: {said(error)}") from None
    except OptionsError as error:  # a value from the command line, refused by the library
        raise BadInput(str(error)) from None
    except SchemaError as error:
        if isinstance(error.__cause__, psycopg.errors.InsufficientPrivilege):
            raise BadInput(str(error)) from None  # setup by a role that may not: --no-setup
        raise Failed(str(error)) from None
    except AxaQueueError as error:  # SchemaError, JobNotFoundError, DemoError, ...
        raise Failed(str(error)) from None


# --- who runs the commands -----------------------------------------------------------------


@dataclass(frozen=True)
class Invocation:
    """How the commands were run, when not as `axa-queue` itself: a program that runs
    them (`manage.py axa_queue`, in `axa_queue.contrib.django`) gives one as click's
    `obj`."""

    program: tuple[str, ...] = ()
    """The command line that runs these commands again, up to the command's name, for
    the worker processes of `worker --processes` (see `supervisor.Settings.program`);
    empty: this Python's `-m axa_queue.cli`."""
    default_target: str | None = None
    """The queue `worker` runs when it is given no MODULE:ATTR."""


def invocation() -> Invocation:
    """The `Invocation` the commands were run with, or the plain one."""
    ctx = click.get_current_context(silent=True)
    found = ctx.find_object(Invocation) if ctx is not None else None
    return found if found is not None else Invocation()


# --- the one way to ask a queue --------------------------------------------------------------


def answer(
    dsn: str | None,
    work: Callable[[Queue], Awaitable[T]],
    show: Callable[[T], Printed | Sequence[Printed]],
    *,
    as_json: bool = False,
    setup: bool = False,
    options: QueueOptions | None = None,
) -> None:
    """Open a queue on `dsn` with the `--pooler` and `--schema` given (checking the
    tables, or setting them up), do `work`, close; then print what it returned, as JSON
    with `as_json`, else the lines and tables `show` makes of it, in order. `show` may
    raise `Failed` to end the command with an error instead."""
    found = with_queue(dsn, work, setup=setup, options=options)
    if as_json:
        print_json(found)
        return
    printed = show(found)
    for one in [printed] if isinstance(printed, (str, Table)) else printed:
        if isinstance(one, Table):
            console().print(one)
        else:
            click.echo(one)


def with_queue(
    dsn: str | None,
    work: Callable[[Queue], Awaitable[T]],
    *,
    setup: bool,
    options: QueueOptions | None,
) -> T:
    """Open a queue on `dsn` (checking the tables, or setting them up), do `work`, close."""
    given = checked_dsn(dsn)
    queue = Queue(
        given,
        connection_options(options if options is not None else QueueOptions(pool_size=2)),
    )

    async def go() -> T:
        try:
            await queue.open(setup=setup)
            return await work(queue)
        finally:
            await queue.close()

    with reported(given):
        return asyncio.run(go())


# --- options -----------------------------------------------------------------------------


def dsn_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The `--dsn` option, read from the environment when not given, with `--pooler` and
    `--schema` (kept in the context for `connection_options`, not passed to `fn`)."""
    fn = click.option(
        "--schema",
        metavar="NAME",
        expose_value=False,
        callback=_remember,
        help=SCHEMA_HELP,
    )(fn)
    fn = click.option(
        "--pooler",
        type=click.Choice(typing.get_args(Pooler)),
        expose_value=False,
        callback=_remember,
        help=POOLER_HELP,
    )(fn)
    return click.option("--dsn", envvar=list(DSN_VARIABLES), metavar="DSN", help=DSN_HELP)(fn)


def _remember(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and param.name is not None:
        ctx.meta[f"axa_queue.{param.name}"] = value
    return value


def _given_connection_options() -> dict[str, str]:
    """The `--pooler` and `--schema` given on the command line."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return {}
    return {
        name: ctx.meta[f"axa_queue.{name}"]
        for name in ("pooler", "schema")
        if f"axa_queue.{name}" in ctx.meta
    }


def connection_options(options: QueueOptions) -> QueueOptions:
    """`options` with the `--pooler` and `--schema` given on the command line."""
    given = _given_connection_options()
    if not given:
        return options
    with reported(None):
        return dataclasses.replace(options, **given)  # type: ignore[arg-type]


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The `--json` flag."""
    return click.option("--json", "as_json", is_flag=True, help=JSON_HELP)(fn)


def log_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--log-format` and `--log-level`, for the commands that run until stopped and log
    as they go (`worker`, `web`): `logs.configure` takes them."""
    fn = click.option(
        "--log-level",
        type=click.Choice(["debug", "info", "warning", "error"]),
        default="info",
        show_default=True,
        help="The least important events to log.",
    )(fn)
    return click.option(
        "--log-format",
        type=click.Choice(logs.FORMATS),
        default="text",
        show_default=True,
        help="One line per event: key=value text for people, or JSON for a log pipeline.",
    )(fn)


if TYPE_CHECKING:
    _TimeType = click.ParamType[datetime]
else:  # click before 8.2 has no type parameter
    _TimeType = click.ParamType


class _Moment(_TimeType):
    """An ISO 8601 time with a UTC offset."""

    name = "TIME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, datetime):
            return value
        text = str(value).strip()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            self.fail(
                f"{value!r} is not an ISO 8601 time; give one like 2026-05-01T09:00:00+02:00",
                param,
                ctx,
            )
        if moment.utcoffset() is None:
            self.fail(
                f"{value!r} has no UTC offset; add one, like 2026-05-01T09:00:00+02:00 or ...Z",
                param,
                ctx,
            )
        return moment


MOMENT = _Moment()
"""The type of a `--run-at`-like option."""
