"""The pages of what runs the jobs and what was done to them: the schedules (and whether
code still declares each), the workers (and which are stale) and the acts log, a page
at a time, by person and kind of act."""

from __future__ import annotations

from datetime import datetime, timezone

from starlette.requests import Request
from starlette.responses import Response

from ..acts import ActKind
from ..presence import GONE_AFTER_BEATS, WorkerInfo, workers_call
from ..schedules.schedule import schedules_call
from . import params
from .board import Dashboard
from .reads import PAGE_SIZE, acts_log_call

__all__ = ["WORKERS_PAGE", "acts", "schedules", "workers"]


async def schedules(board: Dashboard, request: Request) -> Response:
    """Every schedule, each marked whether a live process declared it lately."""
    found = await board.read(schedules_call())
    now = datetime.now(timezone.utc)
    # A live process marks its schedules seen at most once a minute (`sql.SCHEDULES_SEEN`).
    within = board.queue.options.stale_after.total_seconds() + 120
    rows = [
        {
            "info": one,
            "in_code": one.archived_at is None and (now - one.seen_at).total_seconds() < within,
        }
        for one in found
    ]
    return board.page(request, "schedules.html", rows=rows)


WORKERS_PAGE = 500
"""Worker processes listed on one page of `/workers` (`?page=N` for the others): 2,000
processes made one page of 529 KB."""


async def workers(board: Dashboard, request: Request) -> Response:
    """The workers that said they are present, each live or gone, `WORKERS_PAGE` to a
    page."""
    found: list[WorkerInfo] = await board.read(workers_call())
    stale = board.queue.options.stale_after.total_seconds()
    return board.page(
        request,
        "workers.html",
        **params.page_of(request.query_params, found, WORKERS_PAGE),
        stale=stale,
        beats=GONE_AFTER_BEATS,
    )


async def acts(board: Dashboard, request: Request) -> Response:
    """One page of the acts log, newest first, optionally of one `by` and one kind."""
    query = request.query_params
    by = params.code(query, "by")
    act = params.choice(query, "act", [one.value for one in ActKind])
    kind = None if act is None else ActKind(act)
    before = params.integer(query, "before")
    found = await board.read(acts_log_call(by, kind, before))
    return board.page(
        request,
        "acts.html",
        acts=found,
        by=by,
        act=None if kind is None else kind.value,
        kinds=[k.value for k in ActKind],
        next_before=found[-1].id if len(found) == PAGE_SIZE else None,
    )
