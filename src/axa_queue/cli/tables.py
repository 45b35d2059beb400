"""The tables: `setup`, `sql` and `check`."""

from __future__ import annotations

import click

from .. import __version__, sql
from ..options import QueueOptions
from ..queue import Queue
from ..schema import VERSION as SCHEMA_VERSION
from ..schema import statements_of
from .conventions import BadInput, answer, dsn_option, reported
from .text import shown

__all__ = ["check", "setup", "sql_command"]


async def _schema(queue: Queue) -> str:
    return queue.schema  # opening it has set the tables up, or checked them


@click.command()
@dsn_option
def setup(dsn: str | None) -> None:
    """Create or update the queue's tables, indexes and triggers.

    Applies the migrations the database lacks, in one transaction under the setup
    lock, so any number of processes may run it at once; with nothing to change it
    changes nothing and takes no lock.
    """
    answer(
        dsn,
        _schema,
        lambda schema: f"the queue's tables are set up in schema {shown(schema)}",
        setup=True,
    )


@click.command("sql")
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
@click.option(
    "--statement",
    "statement",
    metavar="NAME",
    help=(
        "Print instead the statement NAME the queue sends at run time, whole "
        "(EXCHANGE_LIMITED, say); `--statement list` lists the names."
    ),
)
def sql_command(schema: str | None, version: int | None, statement: str | None) -> None:
    """Print the setup statements, for a migration tool, or one run-time statement.

    The setup statements are what `setup` runs: run them in one transaction; each is
    safe to run again. With `--statement` it prints one of the statements the queue
    sends as it works, as sent, to read it or EXPLAIN it.
    """
    if schema is not None:
        with reported(None):
            schema = QueueOptions(schema=schema).schema
    if statement is not None:
        if version is not None:
            raise BadInput("--statement prints one statement, --version a migration's: give one")
        click.echo(_named(statement, schema))
        return
    click.echo(f"-- axa-queue {__version__}: the job queue's tables, indexes and triggers.")
    click.echo("-- Run in one transaction; every statement is safe to run again.\n")
    for each in statements_of(version):
        if schema is not None:
            each = sql.in_schema(each, schema)
        click.echo(f"{each.strip()};\n")


def _named(name: str, schema: str | None) -> str:
    """The statement `name` (in `schema`, if given) as `sql --statement` prints it, or
    the names of all of them for `list`."""
    named = sql.statements()
    if name == "list":
        return "\n".join(named)
    if name not in named:
        raise BadInput(
            f"there is no statement named {name}: `axa-queue sql --statement list` lists them"
        )
    return named[name] if schema is None else sql.in_schema(named[name], schema)


@click.command()
@dsn_option
def check(dsn: str | None) -> None:
    """Say whether the tables are complete and the acts triggers on; change nothing.

    Needs no right to run DDL. Exits 0 when all is in place, 1 when not (with what
    is missing and what to run).
    """
    answer(
        dsn,
        _schema,  # `open(setup=False)` has checked everything
        lambda schema: (
            f"ok: the queue's tables, columns and triggers are in place in schema {shown(schema)}"
        ),
        setup=False,
    )
