"""`cancel --all` and `retry --all`: a person's act on every job a filter matches
(`axa_queue.cancel_all`, `retry_all`, `release_all`). The count comes first, from a dry
run; the act is done once the person confirms it (or says `--yes`), in one
transaction, and says what it did."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

import click

from ..acts import BulkResult, JobFilter, cancel_all, release_all, retry_all
from ..acts.records import CANCELS, RETRIES
from ..queue import Queue
from .conventions import MOMENT, with_queue

__all__ = ["Filters", "bulk_act", "filter_options"]

Filters = dict[str, Any]
"""The filter options given, by the name the bulk acts take them."""


def filter_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--all` and the options that choose the jobs, with `--yes` and `--dry-run`."""
    for option in reversed(
        (
            click.option(
                "--all",
                "every",
                is_flag=True,
                help="Act on every job the filters match, not one ID.",
            ),
            click.option("--name", metavar="NAME", help="With --all: jobs of this name."),
            click.option("--state", metavar="STATE", help="With --all: jobs in this state."),
            click.option(
                "--error-like",
                metavar="PATTERN",
                help="With --all: jobs whose last error matches this SQL LIKE pattern (% and _).",
            ),
            click.option(
                "--finished-after",
                type=MOMENT,
                help="With --all: jobs that last changed (finished, entered review) at or after this time.",
            ),
            click.option(
                "--finished-before",
                type=MOMENT,
                help="With --all: jobs that last changed before this time.",
            ),
            click.option(
                "--limit", type=click.IntRange(min=1), help="With --all: at most this many jobs."
            ),
            click.option("--yes", is_flag=True, help="With --all: act without asking first."),
            click.option(
                "--dry-run",
                is_flag=True,
                help="With --all: only say how many jobs it would act on.",
            ),
        )
    ):
        fn = option(fn)
    return fn


def _said(result: BulkResult, done: str) -> str:
    left = ", ".join(f"{n} {state}" for state, n in sorted(result.left_alone.items()))
    return (
        f"{done} {result.changed} job(s)"
        + (f"; left alone: {left}" if left else "")
        + (f"; not found: {result.missing} id(s)" if result.missing else "")
    )


ACTS_ON = {
    "cancel": tuple(state.value for state in CANCELS),
    "retry": tuple(state.value for state in RETRIES),
}
"""The states each verb acts on, as the acts say (`retry` releases the jobs in review)."""


def bulk_act(
    verb: str,
    dsn: str | None,
    by: str,
    reason: str,
    filters: Filters,
    yes: bool,
    dry_run: bool,
) -> None:
    """Count what the act would do, ask, then do it in one transaction (`verb`: cancel or
    retry; retry releases the jobs in review too unless `--state` chooses)."""
    chosen = cast(JobFilter, {key: value for key, value in filters.items() if value is not None})
    if not chosen:
        raise click.UsageError(
            "--all needs a filter: --name, --state, --error-like, --finished-after or "
            "--finished-before"
        )
    state = chosen.get("state")
    if state is not None and state not in ACTS_ON[verb]:
        raise click.UsageError(
            f"{verb} --all acts on {', '.join(ACTS_ON[verb])} jobs: --state {state} matches "
            f"none it would {verb}; choose one of those states, or leave --state out"
        )
    if verb == "cancel":
        acts = [cancel_all]
    elif state == "failed":
        acts = [retry_all]
    elif state == "needs_review":
        acts = [release_all]
    else:
        acts = [retry_all, release_all]

    def run(dry: bool) -> Callable[[Queue], Awaitable[BulkResult]]:
        async def work(queue: Queue) -> BulkResult:
            options = cast(JobFilter, {**chosen, "dry_run": dry})
            async with queue.connection() as conn:  # one transaction: every act or none
                first = await acts[0](conn, by=by, reason=reason, **options)
                if len(acts) == 1:
                    return first
                # retry, then release, with the same filter: the jobs in review the
                # first left alone are the second's; what the second left alone is
                # what the first left alone (or queued again itself).
                then = await acts[1](conn, by=by, reason=reason, **options)
                left = {s: n for s, n in first.left_alone.items() if s != "needs_review"}
                return BulkResult(first.changed + then.changed, left, dry, first.missing)

        return work

    would = with_queue(dsn, run(True), setup=False, options=None)
    click.echo(_said(would, f"would {verb}"))
    if dry_run or not would.changed:
        return
    if not yes:
        try:
            confirmed = click.confirm(f"{verb.capitalize()} these {would.changed} job(s)?")
        except click.Abort:  # no answer: standard input closed, or no terminal
            raise click.UsageError(
                f"{verb} --all asks before it acts, and no answer came: nothing done; "
                "give --yes to act without asking"
            ) from None
        if not confirmed:
            click.echo("nothing done (answer y to act, or give --yes)", err=True)
            raise SystemExit(1)
    done = with_queue(dsn, run(False), setup=False, options=None)
    click.echo(_said(done, "cancelled" if verb == "cancel" else "queued again"))
