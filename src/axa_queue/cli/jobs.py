"""Queuing and looking: `enqueue`, `jobs`, `show`, `counts`, `schedules` and `workers`."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, NoReturn
from uuid import UUID

import click
from rich.table import Table

from .. import readable
from ..db.calls import run_async
from ..errors import JobNotFoundError
from ..jobs.model import MAX_ARGS_DEPTH, Counts, Duplicate, JobInfo, JobState, NewJob
from ..jobs.reads import EXACT_UP_TO
from ..presence import Unhandled, WorkerInfo, handled_names, unhandled_steps, workers_on
from ..queue import Queue
from ..schedules.schedule import ScheduleInfo
from .conventions import (
    MOMENT,
    BadInput,
    Printed,
    answer,
    dsn_option,
    json_option,
    reported,
    with_queue,
)
from .job_tables import job_json, job_table, runs_table, state_of, steps_table
from .keys import DEFAULT_MOST
from .keys import by_key as show_keys
from .text import print_json, short, shown, tries, when

__all__ = ["counts", "enqueue", "jobs", "schedules", "show", "workers"]


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


@click.command()
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
@click.option(
    "--unique-key",
    metavar="KEY",
    help="Queue nothing while another job with this key is queued, running or in review; "
    "then print that job's id (and say so on stderr).",
)
@click.option(
    "--unique-for",
    type=float,
    metavar="SECONDS",
    help="Keep the key taken this long after the job finished. Needs --unique-key.",
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
    unique_key: str | None,
    unique_for: float | None,
    dsn: str | None,
) -> None:
    """Queue a job named NAME and print its id (with --unique-key, the id of the job
    holding the key when it is taken)."""
    args = _parse_args(args_text)
    with reported(None):
        job = NewJob(
            name,
            args,
            priority=priority,
            run_in=run_in,
            run_at=run_at,
            max_attempts=max_attempts,
            timeout=timeout,
            unique_key=unique_key,
            unique_for=unique_for,
        )

    async def work(queue: Queue) -> UUID:
        return await queue.enqueue(job)

    answer(dsn, work, _queued)


def _queued(job_id: UUID) -> str:
    """The id printed by `enqueue`; a job whose key was taken is said so on stderr."""
    if isinstance(job_id, Duplicate):
        click.echo("the unique key is taken by this job: nothing was queued", err=True)
    return str(job_id)


@click.command()
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

    async def as_dicts(queue: Queue) -> list[dict[str, Any]]:
        return [job_json(info) for info in await work(queue)]

    if as_json:
        answer(dsn, as_dicts, lambda found: "", as_json=True)
    else:
        answer(dsn, work, _jobs_table)


def _jobs_table(found: list[JobInfo]) -> Printed:
    if not found:
        return "no jobs"
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
            state_of(info),
            tries(info),
            str(info.priority),
            when(info.run_at),
            when(info.updated_at),
            short(info.error),
        )
    return table


@click.command()
@click.argument("job_id", metavar="ID", type=click.UUID)
@json_option
@dsn_option
def show(job_id: UUID, as_json: bool, dsn: str | None) -> None:
    """Show everything the queue knows of one job, but its arguments: its row, each of
    its attempts (how it ended, when, how long, which worker, its error), and its
    durable steps (name, attempt, when, how long; never their results)."""

    async def work(queue: Queue) -> JobInfo:
        info = await queue.job(job_id)
        if info is None:
            raise JobNotFoundError(job_id)
        return info

    async def as_dict(queue: Queue) -> dict[str, Any]:
        return job_json(await work(queue))

    if as_json:
        answer(dsn, as_dict, lambda found: "", as_json=True)
    else:
        answer(
            dsn,
            work,
            lambda info: [job_table(info), *runs_table(info.attempts), *steps_table(info.steps)],
        )


@click.command()
@click.option(
    "--by-name", is_flag=True, help="One row per job name, with whether a live worker handles it."
)
@click.option(
    "--by-key",
    metavar="NAME",
    help="The busiest keys of job NAME (NewJob.key): each key's ready, waiting and running jobs.",
)
@click.option(
    "--keys", type=click.IntRange(1, 1000), default=DEFAULT_MOST, show_default=True,
    help="With --by-key, how many keys to show, the busiest first.",
)  # fmt: skip
@json_option
@dsn_option
def counts(by_name: bool, by_key: str | None, keys: int, as_json: bool, dsn: str | None) -> None:
    """Count the jobs in each state (ready: queued and due; waiting: queued for later),
    say which job names are paused, and warn of names whose jobs have waited for longer
    than unhandled_after (10 minutes) with no live worker handling them.

    With --by-name, the HANDLED column says whether a live axa-queue worker process
    handles each name (the Rust crate's workers record themselves nowhere: a name only
    they handle says no); the JSON gives each name's "handled" and "unhandled_jobs" too.
    With --by-key NAME, the name's busiest keys instead (--keys of them).
    """
    if by_key is not None:
        return show_keys(by_key, keys, as_json, dsn)

    async def work(queue: Queue) -> _Looked:
        found = await (queue.counts_by_name() if by_name else queue.counts())
        paused = [one.name for one in await queue.paused()]
        options = queue.options
        async with queue.connection() as conn:
            workers, unhandled = await run_async(
                conn,
                unhandled_steps(
                    options.stale_after.total_seconds(), options.unhandled_after.total_seconds()
                ),
            )
        handled = handled_names(workers, options.stale_after.total_seconds())
        return _Looked(found, paused, handled, unhandled, options.unhandled_after)

    if as_json:
        answer(dsn, lambda queue: _json_of(work, queue), lambda found: "", as_json=True)
    else:
        answer(dsn, work, _counts_table)


NAMES_SAID = 20
"""The most names `counts` writes out in its lines on paused names and on names nobody
handles (those with the most jobs waiting first); the rest are counted in one line
(`axa-queue paused` and `counts --by-name --json` give them all)."""


@dataclasses.dataclass(frozen=True)
class _Looked:
    """What `counts` read: the counts, the paused names, the names live workers
    handle, the names nobody handles with jobs
    waiting past `unhandled_after`."""

    counts: Counts | dict[str, Counts]
    paused: list[str]
    handled: frozenset[str]
    unhandled: list[Unhandled]
    after: timedelta


async def _json_of(work: Callable[[Queue], Awaitable[_Looked]], queue: Queue) -> Any:
    """The counts as `--json` prints them: as before for the totals; by name, each
    name's counts with whether a live worker handles it and its jobs waiting unhandled."""
    found = await work(queue)
    if isinstance(found.counts, Counts):
        return found.counts
    waiting = {one.name: one.jobs for one in found.unhandled}
    return {
        name: {
            **dataclasses.asdict(one),
            "handled": name in found.handled,
            "unhandled_jobs": waiting.get(name, 0),
        }
        for name, one in found.counts.items()
    }


def _counts_table(found: _Looked) -> Printed | list[Printed]:
    states = [
        f.name
        for f in dataclasses.fields(Counts)
        if f.name not in ("oldest_ready_seconds", "estimated")
    ]
    paused = found.paused
    said = (
        [
            f"paused (not claimed until resumed): {', '.join(shown(n) for n in paused[:NAMES_SAID])}"
            + (
                f" and {len(paused) - NAMES_SAID:,} more (axa-queue paused lists them)"
                if len(paused) > NAMES_SAID
                else ""
            )
        ]
        if paused
        else []
    )
    unhandled = sorted(found.unhandled, key=lambda one: (-one.jobs, one.name))
    said += [
        f"warning: {shown(one.name)} has {one.jobs} "
        f"{'job' if one.jobs == 1 else 'jobs'} waiting for more than "
        f"{readable.seconds(found.after)} (the oldest {readable.seconds(one.oldest)}) and no "
        "live worker handles that name: start one with its handler, or cancel them"
        for one in unhandled[:NAMES_SAID]
    ]
    if len(unhandled) > NAMES_SAID:
        rest = unhandled[NAMES_SAID:]
        said.append(
            f"warning: {len(rest):,} more names have jobs waiting for more than "
            f"{readable.seconds(found.after)} and no live worker handles them "
            f"({sum(one.jobs for one in rest):,} jobs; axa-queue counts --by-name --json "
            "gives each name's unhandled_jobs)"
        )
    some = [found.counts] if isinstance(found.counts, Counts) else list(found.counts.values())
    if any(one.estimated for one in some):
        said.append(
            f"~ an estimate, not a count: a state of more than {EXACT_UP_TO:,} jobs is "
            "estimated from the tables' statistics (see docs/performance.md)"
        )

    def number(one: Counts, state: str) -> str:
        value = getattr(one, state)
        return f"~{value}" if state in one.estimated else str(value)

    if isinstance(found.counts, Counts):
        table = Table(box=None, header_style="bold")
        table.add_column("STATE")
        table.add_column("JOBS", justify="right")
        for state in states:
            table.add_row(state, number(found.counts, state))
        return [
            table,
            f"oldest ready job has waited {readable.seconds(found.counts.oldest_ready_seconds)}"
            if found.counts.ready
            else "no job is ready",
            *said,
        ]
    if not found.counts:
        return ["no jobs", *said]
    paused_names = set(paused)  # looked up once per name: 20,000 names paused took 2 s
    table = Table(box=None, header_style="bold")
    table.add_column("NAME")
    for state in states:
        table.add_column(state.upper().replace("_", " "), justify="right")
    table.add_column("OLDEST READY", justify="right")
    table.add_column("HANDLED")
    for name, one in sorted(found.counts.items()):
        table.add_row(
            shown(name) + (" (paused)" if name in paused_names else ""),
            *(number(one, state) for state in states),
            readable.seconds(one.oldest_ready_seconds) if one.ready else "-",
            "yes" if name in found.handled else "no",
        )
    return [table, *said]


@click.command()
@json_option
@dsn_option
def schedules(as_json: bool, dsn: str | None) -> None:
    """List the schedules: interval or cron expression and zone, next due time, last job
    and its state."""

    async def work(queue: Queue) -> list[ScheduleInfo]:
        return await queue.schedules()

    answer(dsn, work, _schedules_table, as_json=as_json)


def _schedules_table(found: list[ScheduleInfo]) -> Printed:
    if not found:
        return "no schedules"
    table = Table(box=None, header_style="bold")
    for column in (
        "NAME", "EVERY", "CRON", "ZONE", "NEXT DUE", "LAST JOB", "LAST STATE", "SEEN", "ARCHIVED",
    ):  # fmt: skip
        table.add_column(column, no_wrap=column != "NAME")
    for one in found:
        table.add_row(
            shown(one.name),
            readable.seconds(one.interval),
            shown(one.expression),
            shown(one.timezone),
            when(one.due_at),
            str(one.last_job) if one.last_job else "-",
            one.last_state.value if one.last_state else "-",
            when(one.seen_at),
            when(one.archived_at),
        )
    return table


@click.command()
@json_option
@dsn_option
def workers(as_json: bool, dsn: str | None) -> None:
    """List the worker processes: host, pid, the job names they handle, their loops,
    jobs in progress, last heartbeat and STATE: live, or gone once silent for 3 of its
    heartbeat intervals (killed, or cut off from the database; a process of an older
    version, which records no interval: for the queue's stale_after).

    Each axa-queue worker process records itself while it runs; the Rust crate's
    workers do not appear.
    """
    stale = {"seconds": 0.0}

    async def work(queue: Queue) -> list[WorkerInfo]:
        stale["seconds"] = queue.options.stale_after.total_seconds()
        async with queue.connection() as conn:
            return await workers_on(conn)

    def table(found: list[WorkerInfo]) -> Printed:
        if not found:
            return "no worker processes"
        table = Table(box=None, header_style="bold")
        for column in ("HOST", "PID", "NAMES", "LOOPS", "RUNNING", "SEEN", "STATE", "VERSION"):
            table.add_column(column, no_wrap=column != "NAMES")
        for one in found:
            table.add_row(
                shown(one.host),
                str(one.pid),
                shown(", ".join(one.names)) or "-",
                str(one.loops),
                str(one.in_progress(stale["seconds"])),
                f"{when(one.seen_at)} ({readable.seconds(one.silent)} ago)",
                one.state(stale["seconds"]),
                shown(one.version),
            )
        return table

    if as_json:  # each with its state, as the table shows it
        found = with_queue(dsn, work, setup=False, options=None)
        print_json(
            [{**dataclasses.asdict(one), "state": one.state(stale["seconds"])} for one in found]
        )
        return
    answer(dsn, work, table)
