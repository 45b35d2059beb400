"""The dashboard's pages and acts: an ASGI app made by `create_app`.

Every page needs a person signed in (`access`); every POST also a CSRF token and an
origin of this host. Every query and form parameter is read through `params`, so one
that is not what it should be gets a 400 page, never a statement; every answer, an
error's too, carries the security headers (`_Headers`). Pages are drawn by Jinja2 with
autoescaping on, so a job name, error, `by` or reason is always text; charts are SVG
drawn here (`charts`); the only script is htmx, served from the package, which
refreshes the overview's live part.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode
from uuid import UUID

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import readable
from ..acts import MAX_REASON_CHARS, ActKind, ActResult, cancel, retry
from ..db.calls import Call, run_async
from ..errors import NotACodeError
from ..jobs.model import JobState
from ..options import QueueOptions
from ..presence import WorkerInfo, workers_call
from ..queue import Queue
from . import charts, params
from .access import (
    COOKIE,
    SESSION_SECONDS,
    Access,
    Person,
    SignOnRefused,
    same_origin,
    security_headers,
)
from .history import DAY, HOUR, History, Tally
from .params import BadParameter
from .reads import (
    COUNT_CAP,
    acts_log_call,
    estimate_call,
    finished_call,
    jobs_page_call,
    live_counts_call,
)

__all__ = ["MAX_SELECTED", "NAMES_PAGE", "TOP_NAMES", "create_app"]

T = TypeVar("T")

HERE = Path(__file__).parent

MAX_SELECTED = 500
"""The most jobs one act may be asked for at once."""

TOP_NAMES = 50
"""The most names the overview's table shows, those with the most jobs not finished:
so the overview, fetched every two seconds by every open page, stays the same size
however many names there are. The names page (`/names`) lists them all."""

NAMES_PAGE = 100
"""Names on one page of `/names`."""

ORDERS = ("newest", "oldest")
NAME_ORDERS = ("backlog", "name")

STATES = [
    ("queued", "Queued"),
    ("running", "Running"),
    ("needs_review", "Needs review"),
    ("failed", "Failed"),
    ("completed", "Completed"),
    ("cancelled", "Cancelled"),
]

ALREADY = {
    JobState.COMPLETED: "the job had already completed",
    JobState.CANCELLED: "the job had already been cancelled",
    JobState.RUNNING: "the job is running",
    JobState.QUEUED: "the job is queued",
    JobState.FAILED: "the job has failed",
    JobState.NEEDS_REVIEW: "the job waits for review",
}
"""Why an act did not apply, by the state the job was found in."""


def _when(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    if moment.year >= 9999:
        return ">9999-12-31"
    if moment.year <= 1:
        return "<0001-01-01"
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _seconds(length: float | None) -> str:
    """`readable.seconds`, and `∞` for an endless wait (a time of `-infinity`)."""
    if length is not None and not math.isfinite(length):
        return "∞"
    return readable.seconds(length)


def _outcome(result: ActResult) -> str:
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


FAILED_PAGE = (
    '<!doctype html><html lang="en"><head><meta charset="utf-8">'
    "<title>Error · axa-queue</title></head><body><h1>The dashboard could not answer</h1>"
    "<p>Something failed while answering this request; the dashboard's log says what. "
    "Reload the page to try again.</p></body></html>"
)
"""What an answer that failed says: nothing of the failure (the log has it)."""


class _Headers:
    """Adds the security headers (`access.security_headers`) to every answer, and
    answers a request whose handling failed before it answered with a 500 page that
    carries them too. (Starlette's own error handler sits outside every middleware, so
    its 500 would have none.) The failure is raised on, for the server to log."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", []), *security_headers()]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            if not started:
                await HTMLResponse(FAILED_PAGE, status_code=500)(scope, receive, sending)
            raise


@dataclass
class Dashboard:
    """One dashboard: its queue, who may sign in, and what it keeps between requests."""

    queue: Queue
    access: Access
    read_only: bool
    owns_queue: bool
    history: History
    templates: Environment
    opening: asyncio.Lock

    async def opened(self) -> Queue:
        """The queue, opened on first use (checking its tables, never setting them up)."""
        if not self.queue.is_open:
            async with self.opening:
                if not self.queue.is_open:
                    await self.queue.open(setup=False)
        return self.queue

    async def read(self, call: Call[T]) -> T:
        queue = await self.opened()
        async with queue.pool.connection() as conn:
            return await run_async(conn, call)

    def page(self, request: Request, template: str, status: int = 200, **values: Any) -> Response:
        person: Person | None = request.state.person if hasattr(request.state, "person") else None
        html = self.templates.get_template(template).render(
            base=request.scope.get("root_path", "").rstrip("/"),
            person=person,
            csrf=None if person is None else self.access.csrf(person),
            read_only=self.read_only,
            states=STATES,
            max_reason=MAX_REASON_CHARS,
            **values,
        )
        return HTMLResponse(html, status_code=status)


Handler = Callable[[Dashboard, Request], Awaitable[Response]]


def create_app(
    queue: Queue | str,
    *,
    token: str | None = None,
    read_only: bool = False,
    trust_header: str | None = None,
    trusted_proxies: Sequence[str] = (),
    options: QueueOptions | None = None,
) -> Starlette:
    """The dashboard as an ASGI app, to serve (`axa-queue web`) or mount inside your own
    Starlette, FastAPI or other ASGI app (`app.mount("/queue", create_app(...))`).

    `queue` is a `Queue` (yours, opened or not: the dashboard opens it on first use,
    without setting tables up) or a DSN, for which it makes one with `options`.
    People sign in with `token` (at least 16 characters, compared in constant time) and
    a name, which is the `by` of their acts; or, behind a sign-on proxy, by the header
    `trust_header`, honoured only from the addresses in `trusted_proxies` (IPs or
    networks). With `read_only` the dashboard shows everything and refuses every act.

    Raises `OptionsError` when there is no way to sign in, the token is short, or a
    trusted header has no proxy address.
    """
    access = Access(token=token, trust_header=trust_header, trusted_proxies=trusted_proxies)
    owns = isinstance(queue, str)
    if isinstance(queue, str):
        queue = Queue(queue, options or QueueOptions(pool_size=4))
    templates = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    templates.filters["when"] = _when
    templates.filters["seconds"] = _seconds
    templates.filters["n"] = lambda number: f"{number:,}"
    templates.filters["query"] = lambda values: urlencode(
        {k: v for k, v in values.items() if v not in (None, "")}
    )
    board = Dashboard(queue, access, read_only, owns, History(), templates, asyncio.Lock())

    def guarded(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                person = access.person(request)
            except SignOnRefused as refused:
                return PlainTextResponse(f"refused: {refused}", status_code=400)
            if request.method == "POST":
                if person is None:
                    return PlainTextResponse("refused: sign in first", status_code=403)
                if not same_origin(request):
                    return PlainTextResponse(
                        "refused: the request did not come from this dashboard's pages "
                        "(its Origin names another host)",
                        status_code=403,
                    )
                form = await request.form()
                try:
                    given = params.text(form, "csrf")
                except BadParameter:
                    given = None
                if not access.csrf_matches(person, given):
                    return PlainTextResponse(
                        "refused: the form's CSRF token is missing or stale; reload the page "
                        "and try again",
                        status_code=403,
                    )
            elif person is None:
                if request.headers.get("hx-request"):
                    return PlainTextResponse("sign in again", status_code=401)
                base = request.scope.get("root_path", "").rstrip("/")
                return RedirectResponse(f"{base}/signin", status_code=303)
            request.state.person = person
            try:
                return await handler(board, request)
            except BadParameter as bad:
                return board.page(
                    request,
                    "message.html",
                    status=400,
                    title="Not a valid request",
                    message=f"The parameter {bad.parameter!r} should be {bad.expected}.",
                )

        return endpoint

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        if owns and queue.is_open:
            await queue.close()

    routes = [
        Route("/signin", _signin_page, methods=["GET"]),
        Route("/signin", _signin, methods=["POST"]),
        Route("/signout", guarded(_signout), methods=["POST"]),
        Route("/", guarded(_overview)),
        Route("/live", guarded(_live)),
        Route("/names", guarded(_names)),
        Route("/jobs", guarded(_jobs)),
        Route("/jobs/{job_id}", guarded(_job)),
        Route("/review", guarded(_review)),
        Route("/failed", guarded(_failed)),
        Route("/schedules", guarded(_schedules)),
        Route("/workers", guarded(_workers)),
        Route("/acts", guarded(_acts)),
        Route("/act", guarded(_act), methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.dashboard = board
    app.add_middleware(_Headers)
    return app


def _board(request: Request) -> Dashboard:
    board: Dashboard = request.app.state.dashboard
    return board


# --- signing in ----------------------------------------------------------------------------


async def _signin_page(request: Request) -> Response:
    board = _board(request)
    return board.page(request, "signin.html", token=board.access.token is not None, error=None)


async def _signin(request: Request) -> Response:
    board = _board(request)
    if not same_origin(request):
        return PlainTextResponse("refused: the sign-in did not come from this dashboard", 403)
    form = await request.form()
    error = None
    try:
        given = params.text(form, "token")
    except BadParameter:
        given = None
    if given is None or not board.access.token_matches(given):
        error = "That token is not the dashboard's."
    else:
        try:
            name = params.code(form, "name", strip=True)
            if name is None:
                error = "Give your name: it is recorded as the 'by' of your acts."
            else:
                session = board.access.open_session(name)
        except (BadParameter, NotACodeError):
            error = (
                "A name is 1 to 200 visible characters (no control, zero-width or bidi "
                "characters): it is recorded as the 'by' of your acts."
            )
    if error is not None:
        return board.page(request, "signin.html", status=403, token=True, error=error)
    base = request.scope.get("root_path", "").rstrip("/")
    response = RedirectResponse(f"{base}/", status_code=303)
    response.set_cookie(
        COOKIE,
        session,
        max_age=int(SESSION_SECONDS),
        path=f"{base}/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


async def _signout(board: Dashboard, request: Request) -> Response:
    session = request.cookies.get(COOKIE)
    if session is not None:
        board.access.close_session(session)
    base = request.scope.get("root_path", "").rstrip("/")
    response = RedirectResponse(f"{base}/signin", status_code=303)
    response.delete_cookie(COOKIE, path=f"{base}/")
    return response


# --- pages ---------------------------------------------------------------------------------


def _unfinished(row: dict[str, Any]) -> int:
    return int(row["ready"] + row["waiting"] + row["running"] + row["needs_review"])


def _by_backlog(row: dict[str, Any]) -> tuple[int, int, int, str]:
    """The order of names on the overview: the most jobs not finished (ready, delayed,
    running, in review) first, then the most failed and completed in the last hour,
    then by name."""
    return (-_unfinished(row), -row["failed"], -row["completed"], row["name"])


async def _by_name(board: Dashboard) -> dict[str, Any]:
    """Each name's counts (`rows`, in `_by_backlog` order) and their totals, refreshing
    the history (at most once per `history.REFRESH_EVERY`, whoever asks)."""
    live = await board.read(live_counts_call(COUNT_CAP))
    totals: dict[str, Any] = {
        key: sum(getattr(one, key) for one in live)
        for key in ("ready", "waiting", "running", "needs_review")
    }
    # Past the cap, a state's counts are those of the rows read: at least that many.
    capped = {
        "queued": totals["ready"] + totals["waiting"] >= COUNT_CAP,
        "running": totals["running"] >= COUNT_CAP,
        "needs_review": totals["needs_review"] >= COUNT_CAP,
    }
    estimated = capped["queued"]
    if estimated:
        totals["ready"] = await board.read(estimate_call(ready=True))
        totals["waiting"] = await board.read(estimate_call(ready=False))
    history = board.history
    await history.refresh(
        lambda since, until: board.read(finished_call(since, until)), totals["ready"]
    )
    recent = history.recent_by_name()
    by_name = {one.name: one for one in live}
    rows: list[dict[str, Any]] = []
    for name in by_name.keys() | recent.keys():
        counts = by_name.get(name)
        done = recent.get(name, Tally())
        rows.append(
            {
                "name": name,
                "ready": counts.ready if counts else 0,
                "waiting": counts.waiting if counts else 0,
                "running": counts.running if counts else 0,
                "needs_review": counts.needs_review if counts else 0,
                "completed": done.completed,
                "failed": done.failed,
                "cancelled": done.cancelled,
                "oldest": counts.oldest_ready_seconds if counts else 0.0,
            }
        )
    rows.sort(key=_by_backlog)
    for key in Tally._fields:
        totals[key] = sum(getattr(done, key) for done in recent.values())
    totals["oldest"] = max([row["oldest"] for row in rows], default=0.0)
    return {
        "rows": rows,
        "totals": totals,
        "capped": capped,
        "estimated": estimated,
        "cap": COUNT_CAP,
    }


async def _overview_values(board: Dashboard) -> dict[str, Any]:
    """What the overview's live part shows: the totals, the charts, and the `TOP_NAMES`
    names with the most jobs not finished."""
    values = await _by_name(board)
    history = board.history
    charts_drawn = {
        "completed_hour": charts.bars(
            history.series("completed", HOUR, 1), "Completed per minute, last hour", "completed"
        ),
        "failed_hour": charts.bars(
            history.series("failed", HOUR, 1), "Failed per minute, last hour", "failed"
        ),
        "backlog_hour": charts.bars(
            history.series("backlog", HOUR, 1), "Ready backlog, last hour", "backlog"
        ),
        "completed_day": charts.bars(
            history.series("completed", DAY, 15), "Completed per 15 minutes, last day", "completed"
        ),
        "failed_day": charts.bars(
            history.series("failed", DAY, 15), "Failed per 15 minutes, last day", "failed"
        ),
        "backlog_day": charts.bars(
            history.series("backlog", DAY, 15), "Ready backlog, last day", "backlog"
        ),
    }
    return {
        **values,
        "rows": values["rows"][:TOP_NAMES],
        "names_count": len(values["rows"]),
        "charts": charts_drawn,
        "at": time.time(),
    }


async def _overview(board: Dashboard, request: Request) -> Response:
    return board.page(request, "overview.html", **await _overview_values(board))


async def _live(board: Dashboard, request: Request) -> Response:
    return board.page(request, "live.html", **await _overview_values(board))


async def _names(board: Dashboard, request: Request) -> Response:
    """Every name's counts, `NAMES_PAGE` to a page, optionally only the names holding
    `q` (case aside), by backlog (the overview's order) or by name."""
    query = request.query_params
    q = params.name(query, "q")
    order = params.choice(query, "order", NAME_ORDERS) or "backlog"
    number = params.integer(query, "page", most=10**9) or 1
    values = await _by_name(board)
    rows = values["rows"]
    if q is not None:
        wanted = q.casefold()
        rows = [row for row in rows if wanted in row["name"].casefold()]
    if order == "name":
        rows = sorted(rows, key=lambda row: row["name"])
    pages = max(1, -(-len(rows) // NAMES_PAGE))
    start = (number - 1) * NAMES_PAGE
    return board.page(
        request,
        "names.html",
        **{**values, "rows": rows[start : start + NAMES_PAGE]},
        found=len(rows),
        q=q,
        order=order,
        page_number=number,
        pages=pages,
        per_page=NAMES_PAGE,
        top=TOP_NAMES,
    )


async def _list(
    board: Dashboard, request: Request, state: JobState, template: str, **extra: Any
) -> Response:
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


async def _jobs(board: Dashboard, request: Request) -> Response:
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
        base = request.scope.get("root_path", "").rstrip("/")
        return RedirectResponse(f"{base}/jobs/{found}", status_code=303)
    state = params.choice(query, "state", [one.value for one in JobState])
    return await _list(board, request, JobState(state or "queued"), "jobs.html")


async def _review(board: Dashboard, request: Request) -> Response:
    return await _list(board, request, JobState.NEEDS_REVIEW, "jobs.html", work="review")


async def _failed(board: Dashboard, request: Request) -> Response:
    return await _list(board, request, JobState.FAILED, "jobs.html", work="failed")


async def _job(board: Dashboard, request: Request) -> Response:
    job_id = params.as_job_id(request.path_params["job_id"])
    if job_id is None:
        return board.page(
            request, "message.html", status=404, title="No such job", message="Not a job id."
        )
    queue = await board.opened()
    info = await queue.job(UUID(job_id))
    acts = await queue.acts(UUID(job_id))
    if info is None and not acts:
        return board.page(
            request,
            "message.html",
            status=404,
            title="No such job",
            message=f"There is no job {job_id}: it never existed, or retention deleted it.",
        )
    return board.page(request, "job.html", job=info, job_id=job_id, acts=acts)


async def _schedules(board: Dashboard, request: Request) -> Response:
    queue = await board.opened()
    found = await queue.schedules()
    now = datetime.now(timezone.utc)
    # A live process marks its schedules seen at most once a minute (`sql.SCHEDULES_SEEN`).
    within = queue.options.stale_after.total_seconds() + 120
    rows = [
        {
            "info": one,
            "in_code": one.archived_at is None and (now - one.seen_at).total_seconds() < within,
        }
        for one in found
    ]
    return board.page(request, "schedules.html", rows=rows)


async def _workers(board: Dashboard, request: Request) -> Response:
    found: list[WorkerInfo] = await board.read(workers_call())
    stale = board.queue.options.stale_after.total_seconds()
    return board.page(request, "workers.html", workers=found, stale=stale)


async def _acts(board: Dashboard, request: Request) -> Response:
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
        next_before=found[-1].id if len(found) == 50 else None,
    )


async def _act(board: Dashboard, request: Request) -> Response:
    if board.read_only:
        return PlainTextResponse("refused: this dashboard is read-only", status_code=403)
    person: Person = request.state.person
    form = await request.form()
    try:
        act = params.choice(form, "act", ("cancel", "retry"))
        if act is None:
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
    do = cancel if act == "cancel" else retry
    queue = await board.opened()
    outcomes = []
    async with queue.connection() as conn:  # one transaction: every act or none
        for one in ids:
            result = await do(conn, UUID(one), person.name, reason)
            outcomes.append({"id": one, "applied": result.applied, "said": _outcome(result)})
    return board.page(request, "outcome.html", outcomes=outcomes, act=act, reason=reason)
