"""The pages of jobs: a state's list a page at a time (`/jobs`, which also finds a job
by its id), the lists to work through (`/review`, `/failed`) and one job with its acts
(`/jobs/{job_id}`)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ..acts import acts_call
from ..jobs.model import JobState
from ..jobs.reads import job_call
from . import params
from .board import Dashboard, base_of
from .params import BadParameter
from .reads import jobs_page_call

__all__ = ["failed", "job", "jobs", "review"]

ORDERS = ("newest", "oldest")


async def _list(
    board: Dashboard, request: Request, state: JobState, template: str, **extra: Any
) -> Response:
    """One page of the jobs of `state`, optionally of one name, from the cursor given."""
    query = request.query_params
    name = params.name(query, "name")
    newest = (params.choice(query, "order", ORDERS) or "newest") == "newest"
    key = params.cursor(query, "key")
    page = await board.read(
        jobs_page_call(state, name, newest=newest, key=key, after=params.job_id(query, "after"))
    )
    return board.page(
        request,
        template,
        state=state.value,
        name=name,
        order="newest" if newest else "oldest",
        page=page,
        first=key is None,
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
    """One job and its acts; a 404 page when there is neither."""
    job_id = params.as_job_id(request.path_params["job_id"])
    if job_id is None:
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
    return board.page(request, "job.html", job=info, job_id=job_id, acts=acts)
