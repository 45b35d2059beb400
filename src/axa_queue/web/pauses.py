"""The paused job names: the page listing them (`/paused`), and `pause_act`, the POST
that pauses or resumes a name, recorded with the person's name as `by` and their
reason, like every act (`axa_queue.pause`)."""

from __future__ import annotations

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from ..acts import pause, paused_call, resume
from . import params
from .act import asked
from .board import Dashboard
from .params import BadParameter

__all__ = ["PAUSED_PAGE", "pause_act", "paused"]


PAUSED_PAGE = 500
"""Paused names listed on one page of `/paused` (`?page=N` for the others): 10,000
paused names made one page of 5.9 MB."""


async def paused(board: Dashboard, request: Request) -> Response:
    """The names paused now, `PAUSED_PAGE` to a page in the order of their names, each
    with who paused it, why and since when, and a form to resume it; a form to pause a
    name."""
    found = await board.read(paused_call())
    return board.page(
        request, "paused.html", **params.page_of(request.query_params, found, PAUSED_PAGE)
    )


def _name(form: FormData) -> str:
    """The job name the form gives (`name`)."""
    name = params.name(form, "name")
    if name is None:
        raise BadParameter("name", "a job name")
    return name


async def pause_act(board: Dashboard, request: Request) -> Response:
    """Pauses or resumes the name given, in one transaction with its act, and says what
    it did."""
    change = await asked(
        board,
        request,
        ("pause", "resume"),
        _name,
        {"act": "Choose pause or resume.", "name": "Give the job name to pause or resume."},
    )
    if isinstance(change, Response):
        return change
    chosen, name, reason = change.act, change.what, change.reason
    queue = await board.opened()
    async with queue.connection() as conn:  # one transaction: the change and its act
        do = pause if chosen == "pause" else resume
        result = await do(conn, name, change.person.name, reason)
    if chosen == "pause":
        said = (
            "paused: its jobs stay queued until it is resumed; running ones finish"
            if result
            else "not applied: it was paused already"
        )
    else:
        said = (
            "resumed: workers claim its jobs again" if result else "not applied: it was not paused"
        )
    return board.page(
        request,
        "paused_outcome.html",
        name=name,
        act=chosen,
        said=said,
        reason=reason,
        applied=result.applied,
    )
