"""The `axa-queue` command: a thin shell over the public API (the `[cli]` extra).

::

    axa-queue setup | sql | check                  the tables
    axa-queue worker myapp.jobs:queue               run the jobs
    axa-queue enqueue NAME --args JSON              queue one
    axa-queue jobs | show ID | counts | schedules | acts ID      look
    axa-queue cancel ID --by B --reason R | retry ID ...        a person's acts
    axa-queue recover | purge                       housekeeping, now
    axa-queue demo                                  see it work, on an embedded server

The database comes from `--dsn`, else `AXA_QUEUE_DSN`, else `DATABASE_URL`. Tables are
for people, `--json` is for scripts, and no command ever prints a job's arguments. Bad
input ends in a one-line `Error: ...` and a non-zero status, never a traceback: 2 for
a mistake in the command line, 1 for anything else (an unknown job, an act that does
not apply, an unreachable database, a schema that is not set up).

Every command and option is described in `docs/cli.md`; a test keeps the two in step.

This module parses the command line and reports errors; what `worker` runs is in
`supervisor` (one process, or several under a supervisor) and what `demo` runs is in
`demo`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import importlib
import json
import os
import sys
import typing
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar
from uuid import UUID

try:
    import click
    from rich.console import Console
    from rich.table import Table
except ImportError as missing:  # pragma: no cover - only without the extra
    raise SystemExit(
        f"the axa-queue command needs the cli extra ({missing.name} is not installed): "
        "pip install 'axa-queue[cli]'"
    ) from None

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from . import __version__, demo, logs, sql, supervisor, wording
from .acts import Act, ActKind, ActResult, cancel, retry
from .errors import AxaQueueError, JobNotFoundError, OptionsError, SchemaError
from .jobs import EARLIEST, LATEST, MAX_ARGS_DEPTH, Counts, JobInfo, JobState, NewJob
from .maintenance import Recovered
from .options import POOLER_VARIABLE, SCHEMA_VARIABLE, Pooler, QueueOptions
from .queue import DSN_VARIABLES, Queue
from .schedules import ScheduleInfo
from .schema import VERSION as SCHEMA_VERSION
from .schema import statements_of
from .worker import STUCK_AFTER

__all__ = ["load_queue", "main"]

T = TypeVar("T")

CONNECT_TIMEOUT = 10
"""Seconds to wait for the database to answer a connection, unless the DSN says."""

WAIT_FOR_DATABASE = 60.0
"""Seconds `worker` keeps trying to reach the database at start (`--wait-for-database`)."""

DSN_HELP = (
    "The database: a libpq connection string or postgresql:// URL. "
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


class _Main(click.Group):
    """The top command; it prints every error as one line."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            result = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as error:
            if type(error).__name__ == "NoArgsIsHelpError" and error.ctx is not None:
                click.echo(error.ctx.get_help())  # bare `axa-queue`: show what there is
                sys.exit(0)
            hint = f" (see '{error.ctx.command_path} --help')" if error.ctx is not None else ""
            click.echo(f"Error: {shown(_one_line(error.format_message()))}{hint}", err=True)
            sys.exit(error.exit_code)
        except click.ClickException as error:
            click.echo(f"Error: {shown(_one_line(error.format_message()))}", err=True)
            sys.exit(error.exit_code)
        except click.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(1)
        sys.exit(result if isinstance(result, int) else 0)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def shown(text: str | None) -> str:
    """`text` as the CLI prints it to a terminal: every character that is not printable
    (control characters such as ESC, format characters such as the bidi overrides
    U+202E and U+2066 and the zero-width U+200B, line and paragraph separators, lone
    surrogates) written as a Python escape, `\\t`, `\\x1b`, `\\u202e`, `\\U000e0041`, so a name,
    an error, a `by` or a `reason` written by anyone can never move the cursor, recolour
    or reorder what an operator reads. The ASCII space and every visible character are
    kept as they are; `None` is shown as `-`. JSON output needs none of this."""
    if text is None:
        return "-"
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


_SHORT_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(ch: str) -> str:
    if ch in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[ch]
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _dsn(given: str | None) -> str:
    """The DSN to use, checked, with a connection timeout unless it sets one."""
    if not given:
        raise BadInput("no database given: pass --dsn, or set AXA_QUEUE_DSN (or DATABASE_URL)")
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


def _where(dsn: str) -> str:
    """Where `dsn` points, without user or password: `host:port/dbname`."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "the given address"
    host = str(params.get("host") or params.get("hostaddr") or "the local socket")
    port = params.get("port")
    dbname = params.get("dbname")
    return f"{host}{f':{port}' if port else ''}{f'/{dbname}' if dbname else ''}"


def _reason(error: BaseException) -> str:
    """The useful part of a psycopg error: its first line, after libpq's preamble."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    first = lines[0] if lines else type(error).__name__
    if " failed: " in first:
        first = first.rsplit(" failed: ", 1)[1]
    for prefix in ("FATAL:", "ERROR:"):
        if first.startswith(prefix):
            first = first[len(prefix) :].strip()
    return first


@contextlib.contextmanager
def _errors(dsn: str | None) -> Iterator[None]:
    """Turn what the library raises into a one-line error."""
    try:
        yield
    except psycopg.errors.QueryCanceled as error:  # an OperationalError, but it answered
        raise Failed(f"the database at {_where(dsn or '')} cancelled: {_reason(error)}") from None
    except psycopg.OperationalError as error:
        raise Failed(
            f"cannot reach the database at {_where(dsn or '')}: {_reason(error)}"
        ) from None
    except psycopg.Error as error:
        raise Failed(f"the database at {_where(dsn or '')} refused: {_reason(error)}") from None
    except OptionsError as error:  # a value from the command line, refused by the library
        raise BadInput(str(error)) from None
    except SchemaError as error:
        if isinstance(error.__cause__, psycopg.errors.InsufficientPrivilege):
            raise BadInput(str(error)) from None  # setup by a role that may not: --no-setup
        raise Failed(str(error)) from None
    except AxaQueueError as error:  # SchemaError, JobNotFoundError, DemoError, ...
        raise Failed(str(error)) from None


def _with_queue(
    dsn: str | None,
    work: Callable[[Queue], Awaitable[T]],
    *,
    setup: bool = False,
    options: QueueOptions | None = None,
) -> T:
    """Open a queue on `dsn` (checking the tables, or setting them up), do `work`, close."""
    target = _dsn(dsn)
    queue = Queue(
        target,
        _connection_options(options if options is not None else QueueOptions(pool_size=2)),
    )

    async def go() -> T:
        try:
            await queue.open(setup=setup)
            return await work(queue)
        finally:
            await queue.close()

    with _errors(target):
        return asyncio.run(go())


# --- output ------------------------------------------------------------------------------


def _console() -> Console:
    """A console on the current stdout; markup off, so names and errors print as they are."""
    return Console(
        markup=False,
        highlight=False,
        emoji=False,
        width=None if sys.stdout.isatty() else 160,
    )


def _json_default(value: object) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    raise TypeError(f"cannot show a {type(value).__name__} as JSON")


def _fields(value: Any) -> Any:
    """Dataclasses (and lists and dicts of them) as plain dicts, for JSON."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, list):
        return [_fields(v) for v in value]
    if isinstance(value, dict):
        return {k: _fields(v) for k, v in value.items()}
    return value


def _print_json(value: Any) -> None:
    click.echo(json.dumps(_fields(value), default=_json_default, indent=2, ensure_ascii=False))


def _when(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    if moment == LATEST:  # past what Python holds (year 9999, `infinity`): see JobInfo
        return ">9999-12-31"
    if moment == EARLIEST:
        return "<0001-01-01"
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _short(text: str | None, limit: int = 60) -> str:
    if not text:
        return "-"
    flat = _one_line(text)
    return shown(flat if len(flat) <= limit else flat[: limit - 1] + "…")


def _lines(text: str | None) -> str:
    """`text` kept on its lines, each `shown`."""
    if not text:
        return "-"
    return "\n".join(shown(line) for line in text.splitlines())


def _tries(info: JobInfo) -> str:
    return f"{info.attempts}/{info.max_attempts if info.max_attempts is not None else '-'}"


# --- click parameter types -----------------------------------------------------------------


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


def dsn_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The `--dsn` option, read from the environment when not given, with `--pooler` and
    `--schema` (kept in the context for `_connection_options`, not passed to `fn`)."""
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


def _connection_options(options: QueueOptions) -> QueueOptions:
    """`options` with the `--pooler` and `--schema` given on the command line."""
    given = _given_connection_options()
    if not given:
        return options
    with _errors(None):
        return dataclasses.replace(options, **given)  # type: ignore[arg-type]


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The `--json` flag."""
    return click.option("--json", "as_json", is_flag=True, help=JSON_HELP)(fn)


# --- the commands ----------------------------------------------------------------------------


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    __version__,
    "--version",
    prog_name="axa-queue",
    message="%(prog)s %(version)s",
    help="Print the version and exit.",
)
def main() -> None:
    """axa-queue: a job queue that lives entirely in PostgreSQL.

    New here? Run `axa-queue demo`. The database comes from --dsn, else $AXA_QUEUE_DSN,
    else $DATABASE_URL. Job arguments are never printed.
    """


@main.command()
@dsn_option
def setup(dsn: str | None) -> None:
    """Create or update the queue's tables, indexes and triggers.

    Runs the setup statements in one transaction under the setup lock, so any number
    of processes may run it at once; running it again changes nothing.
    """

    async def work(queue: Queue) -> str:
        return queue.schema

    schema = _with_queue(dsn, work, setup=True)
    click.echo(f"the queue's tables are set up in schema {shown(schema)}")


@main.command("sql")
@click.option(
    "--schema",
    metavar="NAME",
    help="Name this schema in every statement. Default: none, so the search_path decides.",
)
@click.option(
    "--version",
    "version",
    type=click.IntRange(1, SCHEMA_VERSION),
    metavar="N",
    help="Print only migration N's statements (for a new migration). Default: all of them.",
)
def sql_command(schema: str | None, version: int | None) -> None:
    """Print the setup statements, for a migration tool.

    They are what `setup` runs: run them in one transaction; each is safe to run again.
    """
    if schema is not None:
        with _errors(None):
            schema = QueueOptions(schema=schema).schema
    click.echo(f"-- axa-queue {__version__}: the job queue's tables, indexes and triggers.")
    click.echo("-- Run in one transaction; every statement is safe to run again.\n")
    for statement in statements_of(version):
        if schema is not None:
            statement = sql.in_schema(statement, schema)
        click.echo(f"{statement.strip()};\n")


@main.command()
@dsn_option
def check(dsn: str | None) -> None:
    """Say whether the tables are complete and the acts triggers on; change nothing.

    Needs no right to run DDL. Exits 0 when all is in place, 1 when not (with what
    is missing and what to run).
    """

    async def work(queue: Queue) -> str:
        return queue.schema  # `open(setup=False)` has checked everything

    schema = _with_queue(dsn, work, setup=False)
    click.echo(
        f"ok: the queue's tables, columns and triggers are in place in schema {shown(schema)}"
    )


# --- worker ------------------------------------------------------------------------------------


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
    message = _one_line(str(error))
    return f"{type(error).__name__}{f': {message}' if message else ''}{where}"


def _need_metrics() -> None:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise BadInput(
            "--metrics-port needs prometheus-client: pip install 'axa-queue[metrics]'"
        ) from None


@main.command()
@click.argument("target", metavar="MODULE:ATTR")
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
@click.option(
    "--log-format",
    type=click.Choice(logs.FORMATS),
    default="text",
    show_default=True,
    help="One line per event: key=value text for people, or JSON for a log pipeline.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    help="The least important events to log.",
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
    "exiting 1. 0 fails at once.",
)
@dsn_option
def worker(
    target: str,
    workers: int | None,
    processes: int | None,
    setup: bool,
    log_format: logs.LogFormat,
    log_level: str,
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
    logs.configure(log_format, log_level.upper())
    queue = load_queue(target)
    with _errors(None):
        if workers is not None:
            queue.options = dataclasses.replace(queue.options, workers=workers)
        queue.options = dataclasses.replace(queue.options, wait_for_database=wait_for_database)
    queue.options = _connection_options(queue.options)
    if metrics_port is not None:
        _need_metrics()
    target_dsn = _dsn(dsn or queue.dsn)
    with _errors(target_dsn):
        if processes is None:
            code = asyncio.run(
                supervisor.work(queue, target_dsn, setup, metrics_port, metrics_host, stuck_after)
            )
        else:
            command = [
                sys.executable,
                "-m",
                "axa_queue.cli",
                "worker",
                target,
                "--no-setup",
                "--wait-for-database",
                str(wait_for_database),
                "--log-format",
                log_format,
                "--log-level",
                log_level,
            ]
            if workers is not None:
                command += ["--workers", str(workers)]
            for name, value in _given_connection_options().items():
                command += [f"--{name}", value]
            # The supervisor's own queue (setup, metrics) reads them from the environment.
            with _errors(None):
                os.environ[POOLER_VARIABLE] = queue.options.resolved_pooler()
                schema = queue.options.resolved_schema()
            if schema is not None:
                os.environ[SCHEMA_VARIABLE] = schema
            code = asyncio.run(
                supervisor.supervise(
                    command,
                    processes,
                    queue.options.workers,
                    target_dsn,
                    setup,
                    metrics_port,
                    metrics_host,
                    stuck_after,
                    wait_for_database=wait_for_database,
                )
            )
    if code:
        sys.exit(code)


# --- queuing and looking -------------------------------------------------------------------------


def _parse_args(text: str) -> Any:
    def refuse(constant: str) -> NoReturn:
        raise ValueError(f"{constant} is not JSON")

    try:
        return json.loads(text, parse_constant=refuse)
    except json.JSONDecodeError as error:
        # The message says where, never what: arguments may hold secrets.
        raise BadInput(
            f"--args is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}"
        ) from None
    except ValueError as error:
        raise BadInput(f"--args is not valid JSON: {error}") from None
    except RecursionError:
        raise BadInput(
            f"--args nests too deep to read (a job's arguments nest at most {MAX_ARGS_DEPTH} deep)"
        ) from None


@main.command()
@click.argument("name")
@click.option(
    "--args",
    "args_text",
    default="{}",
    metavar="JSON",
    help="The job's arguments, a JSON value (default: {}). Never printed.",
)
@click.option(
    "--priority",
    type=int,
    metavar="N",
    default=0,
    show_default=True,
    help="Higher runs first; -32768 to 32767.",
)
@click.option(
    "--run-in",
    type=float,
    metavar="SECONDS",
    help="Run no sooner than this many seconds from now (on the database's clock).",
)
@click.option(
    "--run-at",
    type=MOMENT,
    metavar="TIME",
    help="Run no sooner than this time: ISO 8601 with a UTC offset, "
    "like 2026-05-01T09:00:00+02:00 or 2026-05-01T07:00:00Z.",
)
@click.option(
    "--max-attempts",
    type=int,
    metavar="N",
    help="Tries the job gets, the first included. Default: the worker's max_attempts.",
)
@click.option(
    "--timeout",
    type=float,
    metavar="SECONDS",
    help="Stop a run after this many seconds and count it as failed. Default: no limit.",
)
@dsn_option
def enqueue(
    name: str,
    args_text: str,
    priority: int,
    run_in: float | None,
    run_at: datetime | None,
    max_attempts: int | None,
    timeout: float | None,
    dsn: str | None,
) -> None:
    """Queue a job named NAME and print its id."""
    args = _parse_args(args_text)
    with _errors(None):
        job = NewJob(
            name,
            args,
            priority=priority,
            run_in=run_in,
            run_at=run_at,
            max_attempts=max_attempts,
            timeout=timeout,
        )

    async def work(queue: Queue) -> UUID:
        return await queue.enqueue(job)

    click.echo(str(_with_queue(dsn, work)))


@main.command()
@click.option(
    "--state",
    type=click.Choice([state.value for state in JobState]),
    help="Only jobs in this state.",
)
@click.option("--name", metavar="NAME", help="Only jobs of this name.")
@click.option(
    "--limit",
    type=int,
    default=50,
    show_default=True,
    metavar="K",
    help="At most this many jobs, newest first.",
)
@json_option
@dsn_option
def jobs(state: str | None, name: str | None, limit: int, as_json: bool, dsn: str | None) -> None:
    """List the newest jobs: id, name, state, tries, priority, times and last error."""
    if limit < 1:
        raise BadInput(f"expected --limit to be a positive integer, got: {limit}")

    async def work(queue: Queue) -> list[JobInfo]:
        return await queue.jobs(state, name, limit)

    found = _with_queue(dsn, work)
    if as_json:
        _print_json(found)
        return
    if not found:
        click.echo("no jobs")
        return
    table = Table(box=None, header_style="bold")
    table.add_column("ID", no_wrap=True, min_width=36)
    table.add_column("NAME")
    table.add_column("STATE", no_wrap=True)
    table.add_column("TRIES", justify="right", no_wrap=True)
    table.add_column("PRIORITY", justify="right")
    table.add_column("RUN AT", no_wrap=True)
    table.add_column("UPDATED", no_wrap=True)
    table.add_column("ERROR")
    for info in found:
        table.add_row(
            str(info.id),
            shown(info.name),
            info.state.value,
            _tries(info),
            str(info.priority),
            _when(info.run_at),
            _when(info.updated_at),
            _short(info.error),
        )
    _console().print(table)


@main.command()
@click.argument("job_id", metavar="ID", type=click.UUID)
@json_option
@dsn_option
def show(job_id: UUID, as_json: bool, dsn: str | None) -> None:
    """Show everything the queue knows of one job, but its arguments."""

    async def work(queue: Queue) -> JobInfo:
        info = await queue.job(job_id)
        if info is None:
            raise JobNotFoundError(job_id)
        return info

    info = _with_queue(dsn, work)
    if as_json:
        _print_json(info)
        return
    table = Table(box=None, show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for label, value in (
        ("id", str(info.id)),
        ("name", shown(info.name)),
        ("state", info.state.value),
        ("tries", _tries(info)),
        ("priority", str(info.priority)),
        ("timeout", wording.seconds(info.timeout)),
        ("run at", _when(info.run_at)),
        ("started at", _when(info.started_at)),
        ("created at", _when(info.created_at)),
        ("updated at", _when(info.updated_at)),
        ("error", _lines(info.error)),
    ):
        table.add_row(label, value)
    _console().print(table)


@main.command()
@click.option("--by-name", is_flag=True, help="One row per job name.")
@json_option
@dsn_option
def counts(by_name: bool, as_json: bool, dsn: str | None) -> None:
    """Count the jobs in each state (ready: queued and due; waiting: queued for later)."""

    async def work(queue: Queue) -> Counts | dict[str, Counts]:
        return await (queue.counts_by_name() if by_name else queue.counts())

    found = _with_queue(dsn, work)
    states = [f.name for f in dataclasses.fields(Counts) if f.name != "oldest_ready_seconds"]
    if as_json:
        _print_json(found)
        return
    if isinstance(found, Counts):
        table = Table(box=None, header_style="bold")
        table.add_column("STATE")
        table.add_column("JOBS", justify="right")
        for state in states:
            table.add_row(state, str(getattr(found, state)))
        _console().print(table)
        click.echo(f"oldest ready job has waited {wording.seconds(found.oldest_ready_seconds)}")
        return
    if not found:
        click.echo("no jobs")
        return
    table = Table(box=None, header_style="bold")
    table.add_column("NAME")
    for state in states:
        table.add_column(state.upper().replace("_", " "), justify="right")
    table.add_column("OLDEST READY", justify="right")
    for name, one in sorted(found.items()):
        table.add_row(
            shown(name),
            *(str(getattr(one, state)) for state in states),
            wording.seconds(one.oldest_ready_seconds),
        )
    _console().print(table)


@main.command()
@json_option
@dsn_option
def schedules(as_json: bool, dsn: str | None) -> None:
    """List the schedules: interval, next due time, last job and its state."""

    async def work(queue: Queue) -> list[ScheduleInfo]:
        return await queue.schedules()

    found = _with_queue(dsn, work)
    if as_json:
        _print_json(found)
        return
    if not found:
        click.echo("no schedules")
        return
    table = Table(box=None, header_style="bold")
    for column in ("NAME", "EVERY", "NEXT DUE", "LAST JOB", "LAST STATE", "SEEN", "ARCHIVED"):
        table.add_column(column, no_wrap=column != "NAME")
    for one in found:
        table.add_row(
            shown(one.name),
            wording.seconds(one.interval),
            _when(one.due_at),
            str(one.last_job) if one.last_job else "-",
            one.last_state.value if one.last_state else "-",
            _when(one.seen_at),
            _when(one.archived_at),
        )
    _console().print(table)


@main.command()
@click.argument("job_id", metavar="ID", type=click.UUID)
@json_option
@dsn_option
def acts(job_id: UUID, as_json: bool, dsn: str | None) -> None:
    """List what people did to a job (cancelled, retried, released), oldest first:
    who by the application's word (BY) and which database role wrote it (ROLE).

    Acts are kept after the job's row is purged.
    """

    async def work(queue: Queue) -> list[Act]:
        found = await queue.acts(job_id)
        if not found and await queue.job(job_id) is None:
            raise JobNotFoundError(job_id)
        return found

    found = _with_queue(dsn, work)
    if as_json:
        _print_json(found)
        return
    if not found:
        click.echo(f"no acts on job {job_id}")
        return
    table = Table(box=None, header_style="bold")
    for column in ("AT", "ACT", "BY", "ROLE", "REASON", "AFTER TRIES"):
        table.add_column(column, no_wrap=column in ("AT", "ACT"))
    for act in found:
        table.add_row(
            _when(act.at),
            act.kind.value,
            shown(act.by),
            shown(act.role),
            shown(act.reason),
            str(act.attempts),
        )
    _console().print(table)


# --- a person's acts ----------------------------------------------------------------------------


def _act(
    dsn: str | None,
    job_id: UUID,
    by: str,
    reason: str,
    do: Callable[[psycopg.AsyncConnection[Any], UUID, str, str], Awaitable[ActResult]],
) -> ActResult:
    async def work(queue: Queue) -> ActResult:
        async with queue.connection() as conn:  # one transaction: the change and its act
            return await do(conn, job_id, by, reason)

    result = _with_queue(dsn, work)
    if result.found is None:
        raise Failed(str(JobNotFoundError(job_id)))
    return result


BY_HELP = (
    "Who is acting: a short code such as a user name (1 to 200 visible characters; "
    "no control, zero-width or bidi characters, no space first or last)."
)
REASON_HELP = "Why: a short code such as a ticket id (the same rule as --by)."


@main.command("cancel")
@click.argument("job_id", metavar="ID", type=click.UUID)
@click.option("--by", required=True, metavar="WHO", help=BY_HELP)
@click.option("--reason", required=True, metavar="WHY", help=REASON_HELP)
@dsn_option
def cancel_command(job_id: UUID, by: str, reason: str, dsn: str | None) -> None:
    """Cancel a queued job, recording who and why, in one transaction.

    Only a queued job can be cancelled: a running one runs on.
    """
    result = _act(dsn, job_id, by, reason, cancel)
    if not result:
        raise Failed(
            f"cannot cancel job {job_id}: it is {result.found}; only a queued job can be cancelled"
        )
    click.echo(f"cancelled job {job_id}")


@main.command("retry")
@click.argument("job_id", metavar="ID", type=click.UUID)
@click.option("--by", required=True, metavar="WHO", help=BY_HELP)
@click.option("--reason", required=True, metavar="WHY", help=REASON_HELP)
@dsn_option
def retry_command(job_id: UUID, by: str, reason: str, dsn: str | None) -> None:
    """Queue a failed job again for one more try, or release one waiting for review,
    recording who and why, in one transaction."""
    result = _act(dsn, job_id, by, reason, retry)
    if not result:
        raise Failed(
            f"cannot retry job {job_id}: it is {result.found}; only a failed job or one "
            "waiting for review can be retried"
        )
    if result.kind is ActKind.RELEASED:
        click.echo(f"released job {job_id} from review; it is queued to run again")
    else:
        click.echo(f"queued job {job_id} again for one more try")


# --- housekeeping -------------------------------------------------------------------------------

DRY_RUN_HELP = "Only say what would be done; change nothing."


@main.command()
@click.option(
    "--stale-after",
    type=float,
    default=QueueOptions().seconds("stale_after"),
    show_default=True,
    metavar="SECONDS",
    help="A running job not heard from for this long is taken for lost with its worker; "
    "give the workers' own stale_after.",
)
@click.option(
    "--max-attempts",
    type=int,
    default=None,
    metavar="N",
    help="Tries a job queued without its own max_attempts gets, the first included, as "
    "the workers' QueueOptions.max_attempts gives it; give the workers' own. "
    f"Default: {QueueOptions().max_attempts}, QueueOptions' default.",
)
@click.option("--dry-run", is_flag=True, help=DRY_RUN_HELP)
@json_option
@dsn_option
def recover(
    stale_after: float, max_attempts: int | None, dry_run: bool, as_json: bool, dsn: str | None
) -> None:
    """Recover stale jobs now: queue again (or fail, when out of tries) jobs whose
    worker has not been heard from. Workers also do this every few minutes."""
    if not stale_after > 0:
        raise BadInput(f"expected --stale-after to be more than zero seconds, got: {stale_after:g}")
    if max_attempts is not None and max_attempts < 1:
        raise BadInput(f"expected --max-attempts to be a positive integer, got: {max_attempts}")
    with _errors(None):
        options = QueueOptions(
            pool_size=2,
            stale_after=stale_after,
            heartbeat_interval=min(60.0, stale_after / 2),
        )
        if max_attempts is not None:
            options = dataclasses.replace(options, max_attempts=max_attempts)

    async def work(queue: Queue) -> list[Recovered]:
        return await queue.recover_stale(dry_run=dry_run)

    found = _with_queue(dsn, work, options=options)
    if as_json:
        _print_json(found)
        return
    if found:
        table = Table(box=None, header_style="bold")
        for column in ("ID", "NAME", "TRIES", "NOW" if not dry_run else "WOULD BE"):
            table.add_column(column, no_wrap=column != "NAME")
        for one in found:
            table.add_row(str(one.id), shown(one.name), str(one.attempts), one.state.value)
        _console().print(table)
    jobs_text = wording.plural(len(found), "stale job")
    given = (
        f"{options.max_attempts} (--max-attempts)"
        if max_attempts is not None
        else f"{options.max_attempts} (the default of --max-attempts and of "
        "QueueOptions.max_attempts)"
    )
    click.echo(
        f"{jobs_text} would be recovered (dry run: nothing changed)"
        if dry_run
        else f"recovered {jobs_text}"
    )
    click.echo(f"jobs queued without their own max_attempts were given {given}")


@main.command()
@click.option(
    "--older-than",
    type=float,
    metavar="DAYS",
    help="Delete finished jobs last changed more than this many days ago. "
    "Default: the retention period (7 days).",
)
@click.option("--dry-run", is_flag=True, help=DRY_RUN_HELP)
@dsn_option
def purge(older_than: float | None, dry_run: bool, dsn: str | None) -> None:
    """Delete completed, failed and cancelled jobs past retention now, in bounded batches.

    Jobs waiting for review are never purged, and acts are kept. Workers also do this
    every few minutes.
    """
    with _errors(None):
        seconds = None if older_than is None else older_than * 86400
        if seconds is not None and seconds < 0:
            raise OptionsError(f"expected --older-than to be zero or more days, got: {older_than}")

    async def work(queue: Queue) -> int:
        return await queue.purge(seconds, dry_run=dry_run)

    gone = _with_queue(dsn, work)
    age = f"{older_than:g} days" if older_than is not None else "the retention period (7 days)"
    jobs_text = wording.plural(gone, "finished job")
    click.echo(
        f"{jobs_text} older than {age} would be purged (dry run: nothing changed)"
        if dry_run
        else f"purged {jobs_text} older than {age}"
    )


# --- demo ---------------------------------------------------------------------------------------


@main.command("demo")
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
def demo_command(dsn: str | None, total: int) -> None:
    """See axa-queue work, with nothing to set up.

    Starts an embedded PostgreSQL (or uses --dsn), sets the queue up, queues a few
    hundred sample jobs (some fail and are retried, some wait, one runs on a
    schedule), works them with a progress bar, prints what happened, and cleans up.
    """
    if dsn is not None:
        given = _dsn(dsn)
        with _errors(given), demo.sandbox(given) as (sandboxed, schema):
            demo.run(sandboxed, total, f"{_where(given)} (schema {schema})", _console())
        return
    from .embedded import EmbeddedPostgresError

    try:
        with demo.embedded_server(click.echo) as server_dsn, _errors(server_dsn):
            demo.run(server_dsn, total, "an embedded PostgreSQL", _console())
    except demo.DemoError as error:  # no server: the [embedded] extra is not installed
        raise Failed(str(error)) from None
    except EmbeddedPostgresError as error:  # its message ends with the server's log
        raise Failed(str(error).splitlines()[0]) from None


if __name__ == "__main__":
    main(prog_name="axa-queue")
