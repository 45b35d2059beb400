"""The one thing the dashboard changes: `act`, the POST that cancels or retries (which
releases a job in review) the jobs chosen, in one transaction, each recorded with the
person's name as `by` and their reason, and the page that says what each did."""

from __future__ import annotations

from uuid import UUID

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from ..acts import ActKind, ActResult, cancel, retry
from ..jobs.model import JobState
from . import params
from .access import Person
from .board import Dashboard
from .params import BadParameter

__all__ = ["ALREADY", "MAX_SELECTED", "act", "outcome"]

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
    if board.read_only:
        return PlainTextResponse("refused: this dashboard is read-only", status_code=403)
    person: Person = request.state.person
    form = await request.form()
    try:
        chosen = params.choice(form, "act", ("cancel", "retry"))
        if chosen is None:
            raise BadParameter("act", "cancel or retry")
        ids = params.job_ids(form, "id", MAX_SELECTED)
        reason = params.code(form, "reason")
        if reason is None:
            raise BadParameter("reason", "a code")
    except BadParameter as bad:
        problem = {
            "act": "Choose an act: cancel, or retry (which releases a job in review).",
            "id": f"Choose 1 to {MAX_SELECTED} jobs, by their ids.",
        }.get(
            bad.parameter,
            "Give a reason: a short code such as a ticket id, 1 to 200 visible characters "
            "(no control, zero-width or bidi characters, no space first or last).",
        )
        return board.page(
            request, "message.html", status=400, title="Nothing done", message=problem
        )
    do = cancel if chosen == "cancel" else retry
    queue = await board.opened()
    outcomes = []
    async with queue.connection() as conn:  # one transaction: every act or none
        for one in ids:
            result = await do(conn, UUID(one), person.name, reason)
            outcomes.append({"id": one, "applied": result.applied, "said": outcome(result)})
    return board.page(request, "outcome.html", outcomes=outcomes, act=chosen, reason=reason)
