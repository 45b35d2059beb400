"""A person's acts: `cancel` and `retry` of a job, `pause` and `resume` of a job name, and
the lists: `acts` (on a job or a name) and `paused`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import click
import psycopg
from rich.table import Table

from ..acts import Act, ActKind, ActResult, Pause, cancel, pause, resume, retry
from ..errors import JobNotFoundError
from ..jobs.model import JobState
from ..queue import Queue
from .bulk import bulk_act, filter_options
from .conventions import Failed, Printed, answer, dsn_option, json_option
from .text import shown, when

__all__ = [
    "acts",
    "cancel_command",
    "pause_command",
    "paused",
    "resume_command",
    "retry_command",
]

BY_HELP = (
    "Who is acting: a short code such as a user name (1 to 200 visible characters; "
    "no control, zero-width or bidi characters, no space first or last)."
)
REASON_HELP = "Why: a short code such as a ticket id (the same rule as --by)."


@click.command()
@click.argument("job_id", metavar="ID", type=click.UUID, required=False)
@click.option("--name", metavar="NAME", help="The acts on a job name (paused, resumed) instead.")
@json_option
@dsn_option
def acts(job_id: UUID | None, name: str | None, as_json: bool, dsn: str | None) -> None:
    """List what people did to a job (cancelled, retried, released), or with --name to
    a job name (paused, resumed), oldest first: who by the application's word (BY) and
    which database role wrote it (ROLE).

    Acts are kept after the job's row is purged.
    """
    if (job_id is None) == (name is None):
        raise click.UsageError("give a job's ID or --name NAME, one of them")

    async def work(queue: Queue) -> list[Act]:
        if name is not None:
            return await queue.name_acts(name)
        assert job_id is not None
        found = await queue.acts(job_id)
        if not found and await queue.job(job_id) is None:
            raise JobNotFoundError(job_id)
        return found

    def table(found: list[Act]) -> Printed:
        if not found:
            return f"no acts on job {job_id}" if name is None else f"no acts on {shown(name)}"
        table = Table(box=None, header_style="bold")
        for column in ("AT", "ACT", "BY", "ROLE", "REASON", "AFTER TRIES"):
            table.add_column(column, no_wrap=column in ("AT", "ACT"))
        for act in found:
            table.add_row(
                when(act.at),
                act.kind.value,
                shown(act.by),
                shown(act.role),
                shown(act.reason),
                str(act.attempts),
            )
        return table

    answer(dsn, work, table, as_json=as_json)


def _act(
    dsn: str | None,
    job_id: UUID,
    by: str,
    reason: str,
    do: Callable[[psycopg.AsyncConnection[Any], UUID, str, str], Awaitable[ActResult]],
    said: Callable[[ActResult], str],
) -> None:
    """Do the act `do` on the job, then print what `said` makes of its result."""

    async def work(queue: Queue) -> ActResult:
        async with queue.connection() as conn:  # one transaction: the change and its act
            return await do(conn, job_id, by, reason)

    def show(result: ActResult) -> str:
        if result.found is None:
            raise Failed(str(JobNotFoundError(job_id)))
        return said(result)

    answer(dsn, work, show)


def _bulk(
    verb: str, job_id: UUID | None, dsn: str | None, by: str, reason: str, chosen: dict[str, Any]
) -> bool:
    """With `--all`, do the bulk act (and say it was done); without, check an ID was
    given and no filter, which only `--all` takes."""
    every, yes, dry_run = chosen.pop("every"), chosen.pop("yes"), chosen.pop("dry_run")
    if every:
        if job_id is not None:
            raise click.UsageError("give a job's ID or --all with filters, not both")
        bulk_act(verb, dsn, by, reason, chosen, yes, dry_run)
        return True
    if job_id is None:
        raise click.UsageError("give a job's ID, or --all with filters")
    if yes or dry_run or any(value is not None for value in chosen.values()):
        raise click.UsageError("the filters, --yes and --dry-run go with --all")
    return False


@click.command("cancel")
@click.argument("job_id", metavar="ID", type=click.UUID, required=False)
@click.option("--by", required=True, metavar="WHO", help=BY_HELP)
@click.option("--reason", required=True, metavar="WHY", help=REASON_HELP)
@filter_options
@dsn_option
def cancel_command(
    job_id: UUID | None, by: str, reason: str, dsn: str | None, **chosen: Any
) -> None:
    """Cancel a queued or running job, recording who and why, in one transaction; with
    --all, every queued or running job the filters match, after saying how many and
    asking (unless --yes).

    A running job's process is told at once and stops its handler; whatever the run
    does afterwards is not recorded.
    """
    if _bulk("cancel", job_id, dsn, by, reason, chosen):
        return
    assert job_id is not None

    def said(result: ActResult) -> str:
        if not result:
            raise Failed(
                f"cannot cancel job {job_id}: it is {result.found}; "
                "only a queued or running job can be cancelled"
            )
        if result.found is JobState.RUNNING:
            return f"cancelled job {job_id}; the process running it was told to stop it"
        return f"cancelled job {job_id}"

    _act(dsn, job_id, by, reason, cancel, said)


@click.command("retry")
@click.argument("job_id", metavar="ID", type=click.UUID, required=False)
@click.option("--by", required=True, metavar="WHO", help=BY_HELP)
@click.option("--reason", required=True, metavar="WHY", help=REASON_HELP)
@filter_options
@dsn_option
def retry_command(
    job_id: UUID | None, by: str, reason: str, dsn: str | None, **chosen: Any
) -> None:
    """Queue a failed job again for one more try, or release one waiting for review,
    recording who and why, in one transaction; with --all, every failed job (and job in
    review) the filters match, after saying how many and asking (unless --yes)."""
    if _bulk("retry", job_id, dsn, by, reason, chosen):
        return
    assert job_id is not None

    def said(result: ActResult) -> str:
        if not result:
            raise Failed(
                f"cannot retry job {job_id}: it is {result.found}; only a failed job or one "
                "waiting for review can be retried"
            )
        if result.kind is ActKind.RELEASED:
            return f"released job {job_id} from review; it is queued to run again"
        return f"queued job {job_id} again for one more try"

    _act(dsn, job_id, by, reason, retry, said)


def _name_act(
    dsn: str | None,
    name: str,
    by: str,
    reason: str,
    do: Callable[[psycopg.AsyncConnection[Any], str, str, str], Awaitable[ActResult]],
    said: Callable[[ActResult], str],
) -> None:
    """Do the act `do` on job name `name`, then print what `said` makes of its result."""

    async def work(queue: Queue) -> ActResult:
        async with queue.connection() as conn:  # one transaction: the change and its act
            return await do(conn, name, by, reason)

    answer(dsn, work, said)


@click.command("pause")
@click.argument("name", metavar="NAME")
@click.option("--by", required=True, metavar="WHO", help=BY_HELP)
@click.option("--reason", required=True, metavar="WHY", help=REASON_HELP)
@dsn_option
def pause_command(name: str, by: str, reason: str, dsn: str | None) -> None:
    """Pause a job name, recording who and why: no worker claims its jobs until
    `resume` (they stay queued; running ones finish). Rust crate workers do not read
    pauses."""

    def said(result: ActResult) -> str:
        if not result:
            return f"{shown(name)} was paused already; nothing changed"
        return f"paused {shown(name)}: its jobs stay queued until it is resumed"

    _name_act(dsn, name, by, reason, pause, said)


@click.command("resume")
@click.argument("name", metavar="NAME")
@click.option("--by", required=True, metavar="WHO", help=BY_HELP)
@click.option("--reason", required=True, metavar="WHY", help=REASON_HELP)
@dsn_option
def resume_command(name: str, by: str, reason: str, dsn: str | None) -> None:
    """Resume a paused job name, recording who and why; workers claim its jobs at once."""

    def said(result: ActResult) -> str:
        if not result:
            raise Failed(f"cannot resume {shown(name)}: it is not paused (see `axa-queue paused`)")
        return f"resumed {shown(name)}; workers were told"

    _name_act(dsn, name, by, reason, resume, said)


@click.command()
@json_option
@dsn_option
def paused(as_json: bool, dsn: str | None) -> None:
    """List the paused job names: who paused each (BY), why and since when."""

    async def work(queue: Queue) -> list[Pause]:
        return await queue.paused()

    def table(found: list[Pause]) -> Printed:
        if not found:
            return "no job name is paused"
        table = Table(box=None, header_style="bold")
        for column in ("NAME", "SINCE", "BY", "REASON"):
            table.add_column(column, no_wrap=column in ("NAME", "SINCE"))
        for one in found:
            table.add_row(shown(one.name), when(one.at), shown(one.by), shown(one.reason))
        return table

    answer(dsn, work, table, as_json=as_json)
