"""The pages of jobs: a state's list a page at a time, by name and time (`/jobs`, which
also finds a job by its id), the lists to work through (`/review`, `/failed`) and one job with its acts
(`/jobs/{job_id}`)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any
from uuid import UUID

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ..acts import NIL_JOB, acts_call, paused_call
from ..jobs.attempts import latest
from ..jobs.keys import key_counts_call
from ..jobs.model import JobInfo, JobState
from ..jobs.reads import job_call
from ..workflows.operate import workflow_of_call
from . import params
from .board import Dashboard, base_of
from .params import BadParameter
from .reads import Page, jobs_page_call

__all__ = ["NIL", "cursor_at", "failed", "field", "job", "jobs", "review", "within"]

ORDERS = ("newest", "oldest")


NIL = "00000000-0000-0000-0000-000000000000"
"""The id before every other: a page that starts at a time, with this id, starts with
the first job of that time (newest first: the last job before it)."""


def cursor_at(at: datetime) -> str:
    """`at` as a page cursor's key (`sql.WEB_JOBS_NEWEST`'s: its time in UTC)."""
    utc = at.astimezone(timezone.utc)
    return f"{utc.year:04d}-{utc:%m-%dT%H:%M:%S.%f}"


def field(at: datetime | None) -> str | None:
    """`at` in UTC as a date and time field shows it (`2026-12-06T04:15`), and as the
    page's links send it back."""
    if at is None:
        return None
    utc = at.astimezone(timezone.utc)
    shown = f"{utc.year:04d}-{utc:%m-%dT%H:%M}"
    if utc.second or utc.microsecond:
        shown += f":{utc:%S}" + (f".{utc:%f}" if utc.microsecond else "")
    return shown


def within(page: Page, state: JobState, since: datetime | None, until: datetime | None) -> Page:
    """The jobs of `page` whose time (queued: due; else: last changed, a finished
    job's finish) is from `since` and before `until`. The page read starts at the
    nearer bound, so only its end can pass the farther one: then it is the last."""
    kept = [
        job
        for job in page.jobs
        if (since is None or _time_of(job, state) >= since)
        and (until is None or _time_of(job, state) < until)
    ]
    return page if len(kept) == len(page.jobs) else Page(kept, None, None)


def _time_of(job: JobInfo, state: JobState) -> datetime:
    return job.run_at if state is JobState.QUEUED else job.updated_at


async def _list(
    board: Dashboard, request: Request, state: JobState, template: str, **extra: Any
) -> Response:
    """One page of the jobs of `state`, optionally of one name and from a time (`since`)
    until another (`until`), from the cursor given. The first page of a time window
    starts at its bound (the cursor's), so it is read through the state's index as
    any page is; no statement of its own."""
    query = request.query_params
    name = params.name(query, "name")
    newest = (params.choice(query, "order", ORDERS) or "newest") == "newest"
    since = params.moment(query, "since")
    until = params.moment(query, "until")
    key = params.cursor(query, "key")
    after = params.job_id(query, "after")
    first = key is None
    start = until if newest else since
    if first and start is not None:
        key, after = cursor_at(start), NIL
    page = await board.read(jobs_page_call(state, name, newest=newest, key=key, after=after))
    pauses = [] if name is None else await board.read(paused_call())
    keys = [] if name is None or not first else await board.read(key_counts_call(name))
    return board.page(
        request,
        template,
        state=state.value,
        name=name,
        order="newest" if newest else "oldest",
        since=field(since),
        until=field(until),
        page=within(page, state, since, until),
        first=first,
        pause=next((one for one in pauses if one.name == name), None),
        keys=keys,
        **extra,
    )


async def jobs(board: Dashboard, request: Request) -> Response:
    """The jobs of one state (queued unless asked), or, given an `id`, that job's page."""
    query = request.query_params
    try:
        found = params.job_id(query, "id")
    except BadParameter:
        return board.page(
            request,
            "message.html",
            status=400,
            title="Not a job id",
            message="A job id is a UUID, like 0191f3c2-7a4e-4b7e-9c1d-2f1e3d4c5b6a.",
        )
    if found is not None:
        return RedirectResponse(f"{base_of(request)}/jobs/{found}", status_code=303)
    state = params.choice(query, "state", [one.value for one in JobState])
    return await _list(board, request, JobState(state or "queued"), "jobs.html")


async def review(board: Dashboard, request: Request) -> Response:
    """The jobs waiting for review, to release or cancel."""
    return await _list(board, request, JobState.NEEDS_REVIEW, "jobs.html", work="review")


async def failed(board: Dashboard, request: Request) -> Response:
    """The failed jobs, to retry or cancel."""
    return await _list(board, request, JobState.FAILED, "jobs.html", work="failed")


async def job(board: Dashboard, request: Request) -> Response:
    """One job, its attempts (`JobInfo.attempts`, read with it), its acts and the link to
    its workflow if it belongs to one; a 404 page
    when there is neither job nor act."""
    job_id = params.as_job_id(request.path_params["job_id"])
    if job_id is None or UUID(job_id) == NIL_JOB:  # the nil id: acts on names, not a job's
        return board.page(
            request, "message.html", status=404, title="No such job", message="Not a job id."
        )
    info = await board.read(job_call(UUID(job_id)))
    acts = await board.read(acts_call(UUID(job_id)))
    if info is None and not acts:
        return board.page(
            request,
            "message.html",
            status=404,
            title="No such job",
            message=f"There is no job {job_id}: it never existed, or retention deleted it.",
        )
    flow = await board.read(workflow_of_call(UUID(job_id)))
    left_out, runs = latest(info.attempts) if info is not None else (0, ())
    return board.page(
        request,
        "job.html",
        job=info,
        job_id=job_id,
        acts=acts,
        workflow=flow,
        runs=runs,
        runs_left_out=left_out,
    )
