"""Housekeeping, now: `recover`, `purge`, `move-history` and `reindex` (workers also
do them every few minutes, and move finished jobs every `keep_recent / 2`)."""

from __future__ import annotations

import dataclasses

import click
from rich.table import Table

from .. import readable
from ..errors import OptionsError
from ..history import Moved
from ..maintenance import Recovered
from ..options import QueueOptions
from ..queue import Queue
from ..schema.indexes import Rebuilt
from .conventions import BadInput, Printed, answer, dsn_option, json_option, reported
from .text import shown

__all__ = ["move_history", "purge", "recover", "reindex"]

DRY_RUN_HELP = "Only say what would be done; change nothing."


@click.command()
@click.option(
    "--stale-after",
    type=float,
    default=QueueOptions().stale_after.total_seconds(),
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
    with reported(None):
        options = QueueOptions(
            pool_size=2,
            stale_after=stale_after,
            heartbeat_interval=min(60.0, stale_after / 2),
        )
        if max_attempts is not None:
            options = dataclasses.replace(options, max_attempts=max_attempts)

    async def work(queue: Queue) -> list[Recovered]:
        return await queue.recover_stale(dry_run=dry_run)

    def show(found: list[Recovered]) -> list[Printed]:
        printed: list[Printed] = []
        if found:
            table = Table(box=None, header_style="bold")
            for column in ("ID", "NAME", "TRIES", "NOW" if not dry_run else "WOULD BE"):
                table.add_column(column, no_wrap=column != "NAME")
            for one in found:
                table.add_row(str(one.id), shown(one.name), str(one.attempts), one.state.value)
            printed.append(table)
        jobs_text = readable.plural(len(found), "stale job")
        given = (
            f"{options.max_attempts} (--max-attempts)"
            if max_attempts is not None
            else f"{options.max_attempts} (the default of --max-attempts and of "
            "QueueOptions.max_attempts)"
        )
        printed.append(
            f"{jobs_text} would be recovered (dry run: nothing changed)"
            if dry_run
            else f"recovered {jobs_text}"
        )
        printed.append(
            f"jobs queued without their own max_attempts {'would be' if dry_run else 'were'} "
            f"given {given}"
        )
        return printed

    answer(dsn, work, show, as_json=as_json, options=options)


@click.command()
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
    """Delete completed, failed and cancelled jobs past retention now: whole days of the
    history dropped, and finished rows not moved yet deleted in bounded batches.

    Jobs waiting for review are never purged, and acts are kept. Workers also do this
    every few minutes.
    """
    with reported(None):
        seconds = None if older_than is None else older_than * 86400
        if seconds is not None and seconds < 0:
            raise OptionsError(f"expected --older-than to be zero or more days, got: {older_than}")

    async def work(queue: Queue) -> int:
        return await queue.purge(seconds, dry_run=dry_run)

    def show(gone: int) -> str:
        age = f"{older_than:g} days" if older_than is not None else "the retention period (7 days)"
        jobs_text = readable.plural(gone, "finished job")
        return (
            f"{jobs_text} older than {age} would be purged (dry run: nothing changed)"
            if dry_run
            else f"purged {jobs_text} older than {age}"
        )

    answer(dsn, work, show)


@click.command(name="move-history")
@click.option(
    "--keep-recent",
    type=float,
    default=QueueOptions().keep_recent.total_seconds(),
    show_default=True,
    metavar="SECONDS",
    help="Move jobs finished more than this long ago; give the workers' own keep_recent.",
)
@click.option(
    "--most",
    type=int,
    default=None,
    metavar="N",
    help="Move at most this many jobs, then stop (run it again to go on). Default: all.",
)
@click.option(
    "--retention",
    type=float,
    default=QueueOptions().retention.total_seconds() / 86400,
    show_default=True,
    metavar="DAYS",
    help="The workers' retention: jobs finished before its first day are left to purge.",
)
@click.option("--dry-run", is_flag=True, help=DRY_RUN_HELP)
@json_option
@dsn_option
def move_history(
    keep_recent: float,
    most: int | None,
    retention: float,
    dry_run: bool,
    as_json: bool,
    dsn: str | None,
) -> None:
    """Move finished jobs to the history table now, in bounded batches.

    Each batch is its own short transaction: stopped, it takes up where it was when run
    again. Every read finds a moved job as before. Workers also do this every
    keep_recent / 2; after an upgrade, this moves the finished jobs already there.
    """
    if not keep_recent >= 0:
        raise BadInput(f"expected --keep-recent to be zero or more seconds, got: {keep_recent:g}")
    if most is not None and most < 1:
        raise BadInput(f"expected --most to be a positive integer, got: {most}")
    if not retention > 0:
        raise BadInput(f"expected --retention to be more than zero days, got: {retention:g}")
    with reported(None):
        options = QueueOptions(pool_size=2, keep_recent=keep_recent, retention=retention * 86400)

    async def work(queue: Queue) -> Moved:
        return await queue.move_history(most=most, dry_run=dry_run)

    def show(done: Moved) -> str:
        jobs_text = readable.plural(done.moved, "finished job")
        return (
            f"{jobs_text} would be moved to the history (dry run: nothing moved)"
            if dry_run
            else f"moved {jobs_text} to the history"
        )

    answer(dsn, work, show, as_json=as_json, options=options)


@click.command()
@click.option("--dry-run", is_flag=True, help=DRY_RUN_HELP)
@json_option
@dsn_option
def reindex(dry_run: bool, as_json: bool, dsn: str | None) -> None:
    """Rebuild the indexes of axa_queue grown past twice what a fresh build would take,
    now (REINDEX INDEX CONCURRENTLY: jobs run as usual meanwhile).

    After a long transaction held vacuum back, the hot table's indexes keep the pages
    they grew to. Workers also do this every few minutes, unless
    QueueOptions.rebuild_indexes is off. Only the table's owner may.
    """
    with reported(None):
        options = QueueOptions(pool_size=2)

    async def work(queue: Queue) -> list[Rebuilt]:
        return await queue.rebuild_indexes(dry_run=dry_run)

    def show(found: list[Rebuilt]) -> list[Printed]:
        printed: list[Printed] = []
        if found:
            table = Table(box=None, header_style="bold")
            for column in ("INDEX", "SIZE", "FRESH", "AFTER" if not dry_run else "WOULD BE"):
                table.add_column(column, no_wrap=True)
            for one in found:
                after = (
                    "rebuilt"
                    if dry_run
                    else readable.size(one.after)
                    if one.after is not None
                    else f"left: {one.skipped}"
                )
                table.add_row(
                    one.index, readable.size(one.bytes), readable.size(one.fresh_bytes), after
                )
            printed.append(table)
        indexes = readable.plural(len(found), "bloated index", "bloated indexes")
        printed.append(
            f"{indexes} would be rebuilt (dry run: nothing changed)"
            if dry_run
            else f"{indexes} of axa_queue found"
        )
        return printed

    answer(dsn, work, show, as_json=as_json, options=options)
