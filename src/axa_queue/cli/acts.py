"""A person's acts: `cancel` and `retry`, and `acts`, the list of them on a job."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import click
import psycopg
from rich.table import Table

from ..acts import Act, ActKind, ActResult, cancel, retry
from ..errors import JobNotFoundError
from ..jobs.model import JobState
from ..queue import Queue
from .conventions import Failed, Printed, answer, dsn_option, json_option
from .text import shown, when

__all__ = ["acts", "cancel_command", "retry_command"]

BY_HELP = (
    "Who is acting: a short code such as a user name (1 to 200 visible characters; "
    "no control, zero-width or bidi characters, no space first or last)."
)
REASON_HELP = "Why: a short code such as a ticket id (the same rule as --by)."


@click.command()
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

    def table(found: list[Act]) -> Printed:
        if not found:
            return f"no acts on job {job_id}"
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


@click.command("cancel")
@click.argument("job_id", metavar="ID", type=click.UUID)
@click.option("--by", required=True, metavar="WHO", help=BY_HELP)
@click.option("--reason", required=True, metavar="WHY", help=REASON_HELP)
@dsn_option
def cancel_command(job_id: UUID, by: str, reason: str, dsn: str | None) -> None:
    """Cancel a queued or running job, recording who and why, in one transaction.

    A running job's process is told at once and stops its handler; whatever the run
    does afterwards is not recorded.
    """

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
@click.argument("job_id", metavar="ID", type=click.UUID)
@click.option("--by", required=True, metavar="WHO", help=BY_HELP)
@click.option("--reason", required=True, metavar="WHY", help=REASON_HELP)
@dsn_option
def retry_command(job_id: UUID, by: str, reason: str, dsn: str | None) -> None:
    """Queue a failed job again for one more try, or release one waiting for review,
    recording who and why, in one transaction."""

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
