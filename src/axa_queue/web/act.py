"""What the dashboard changes of jobs: `act`, the POST that cancels or retries (which
releases a job in review) the jobs chosen, in one transaction, each recorded with the
person's name as `by` and their reason, and the page that says what each did; and
`act_all`, the same act on every job a list's filter matches, once its count was shown
(`act_all_page`) and confirmed. Every change a form asks for (these, and a pause:
`pauses`) is read and refused alike (`asked`, `refused`, `nothing_done`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar
from uuid import UUID

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from ..acts import ActKind, ActResult, cancel, cancel_all, release_all, retry, retry_all
from ..db.adapters import run
from ..jobs.model import JobState
from . import params
from .access import Person
from .board import Dashboard
from .params import BadParameter
from .reads import clock_call

__all__ = [
    "ALREADY",
    "BULK_ACTS",
    "MAX_SELECTED",
    "REASON_WANTED",
    "Asked",
    "act",
    "act_all",
    "act_all_page",
    "asked",
    "nothing_done",
    "outcome",
    "refused",
]

T = TypeVar("T")

MAX_SELECTED = 500
"""The most jobs one act may be asked for at once."""

ALREADY = {
    JobState.COMPLETED: "the job had already completed",
    JobState.CANCELLED: "the job had already been cancelled",
    JobState.RUNNING: "the job is running",
    JobState.QUEUED: "the job is queued",
    JobState.FAILED: "the job has failed",
    JobState.NEEDS_REVIEW: "the job waits for review",
}
"""Why an act did not apply, by the state the job was found in."""


REASON_WANTED = (
    "Give a reason: a short code such as a ticket id, 1 to 200 visible characters "
    "(no control, zero-width or bidi characters, no space first or last)."
)
"""What a change without a reason (or with one that is not a code) is answered."""


def refused() -> Response:
    """What a read-only dashboard answers every change."""
    return PlainTextResponse("refused: this dashboard is read-only", status_code=403)


def nothing_done(board: Dashboard, request: Request, problem: str) -> Response:
    """The page saying that nothing was done, and the `problem` why."""
    return board.page(request, "message.html", status=400, title="Nothing done", message=problem)


@dataclass(frozen=True)
class Asked(Generic[T]):
    """A change a person asked for by a form: the act chosen, what it is on, and why."""

    person: Person
    act: str
    what: T
    reason: str


async def asked(
    board: Dashboard,
    request: Request,
    acts: tuple[str, ...],
    what: Callable[[FormData], T],
    problems: dict[str, str],
) -> Asked[T] | Response:
    """The change a form asks for: one of `acts` (`act`), what `what` reads from the
    form, and a reason (`reason`, a code), checked in that order; or the answer that
    refuses it: a read-only dashboard's, or the page saying what to give (the
    `problems` by parameter, `REASON_WANTED` for the reason)."""
    if board.read_only:
        return refused()
    person: Person = request.state.person
    form = await request.form()
    try:
        chosen = params.choice(form, "act", acts)
        if chosen is None:
            raise BadParameter("act", " or ".join(acts))
        read = what(form)
        reason = params.code(form, "reason")
        if reason is None:
            raise BadParameter("reason", "a code")
    except BadParameter as bad:
        return nothing_done(board, request, problems.get(bad.parameter, REASON_WANTED))
    return Asked(person, chosen, read, reason)


def outcome(result: ActResult) -> str:
    """What an act did, in words, from its own result."""
    if result.applied:
        if result.kind is ActKind.CANCELLED and result.found is JobState.RUNNING:
            return "cancelled while it ran; its worker was told to stop it"
        return {
            ActKind.CANCELLED: "cancelled",
            ActKind.RETRIED: "queued again for one more try (retried)",
            ActKind.RELEASED: "released from review; queued to run again",
        }[result.kind or ActKind.CANCELLED]
    if result.found is None:
        return "not applied: there is no such job (retention may have deleted it)"
    return f"not applied: {ALREADY[result.found]}"


async def act(board: Dashboard, request: Request) -> Response:
    """Cancels or retries the jobs chosen, every one or none, and says what each did."""
    change = await asked(
        board,
        request,
        ("cancel", "retry"),
        lambda form: params.job_ids(form, "id", MAX_SELECTED),
        {
            "act": "Choose an act: cancel, or retry (which releases a job in review).",
            "id": f"Choose 1 to {MAX_SELECTED} jobs, by their ids.",
        },
    )
    if isinstance(change, Response):
        return change
    do = cancel if change.act == "cancel" else retry
    queue = await board.opened()
    outcomes = []
    found = set()
    async with queue.connection() as conn:  # one transaction: every act or none
        for one in change.what:
            result = await do(conn, UUID(one), change.person.name, change.reason)
            outcomes.append({"id": one, "applied": result.applied, "said": outcome(result)})
            found.add(result.found)
    word = (
        "Cancel"
        if change.act == "cancel"
        else "Release"
        if found == {JobState.NEEDS_REVIEW}  # a retry of a job in review releases it
        else "Retry"
    )
    return board.page(request, "outcome.html", outcomes=outcomes, word=word, reason=change.reason)


BULK_ACTS = {
    JobState.QUEUED: ("cancel", "Cancel", cancel_all),
    JobState.RUNNING: ("cancel", "Cancel", cancel_all),
    JobState.FAILED: ("retry", "Retry", retry_all),
    JobState.NEEDS_REVIEW: ("release", "Release", release_all),
}
"""The bulk act a list of jobs in a state offers: its value, its word, its function."""


def _bulk_filter(given: Any) -> tuple[JobState, str | None, datetime | None, datetime | None]:
    """The list's filter, as the bulk act takes it: the state (one that has a bulk act),
    the name, and the list's time window, which for any state but queued is when the
    job last changed (a queued job's list is by due time, which no bulk act filters)."""
    state = JobState(params.choice(given, "state", [s.value for s in BULK_ACTS]) or "queued")
    name = params.name(given, "name")
    since = params.moment(given, "since")
    until = params.moment(given, "until")
    if state is JobState.QUEUED and (since or until):
        raise BadParameter("since", "no time window for queued jobs (they are listed by due time)")
    return state, name, since, until


async def act_all_page(board: Dashboard, request: Request) -> Response:
    """What acting on every job the list's filter matches would do, counted with nothing
    locked, and the form that confirms it with a reason."""
    if board.read_only:
        return refused()
    state, name, since, until = _bulk_filter(request.query_params)
    value, word, bulk = BULK_ACTS[state]
    queue = await board.opened()
    async with queue.connection() as conn:
        counted_at = await run(conn, clock_call())
        would = await bulk(
            conn,
            by="dashboard",
            reason="counting",
            state=state,
            name=name,
            finished_after=since,
            finished_before=_before(until, counted_at),
            dry_run=True,
        )
    return board.page(
        request,
        "act_all.html",
        would=would,
        state=state.value,
        name=name,
        word=word,
        act=value,
        since=request.query_params.get("since"),
        until=request.query_params.get("until"),
        counted_at=counted_at.isoformat(),
    )


def _before(until: datetime | None, counted_at: datetime | None) -> datetime | None:
    """The end of a bulk act's window: the list's, and no later than when its jobs were
    counted, so the act confirmed takes no job queued or changed since (its count is
    what the person saw)."""
    if counted_at is None:
        return until
    return counted_at if until is None else min(until, counted_at)


async def act_all(board: Dashboard, request: Request) -> Response:
    """Acts on every job the filter matches, in one transaction (a statement per batch),
    each recorded with the person's name as `by`, and says how many it changed."""
    if board.read_only:
        return refused()
    person: Person = request.state.person
    form = await request.form()
    state, name, since, until = _bulk_filter(form)
    counted_at = params.moment(form, "counted_at")
    reason = params.code(form, "reason")
    if reason is None:
        return nothing_done(board, request, REASON_WANTED)
    value, word, bulk = BULK_ACTS[state]
    queue = await board.opened()
    async with queue.connection() as conn:  # one transaction: every job or none
        done = await bulk(
            conn,
            by=person.name,
            reason=reason,
            state=state,
            name=name,
            finished_after=since,
            finished_before=_before(until, counted_at),
        )
    return board.page(
        request,
        "act_all_done.html",
        done=done,
        word=word,
        act=value,
        reason=reason,
        state=state.value,
        name=name,
        since=form.get("since"),
        until=form.get("until"),
    )
