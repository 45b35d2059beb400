"""The dashboard's ASGI app, made by `create_app`: its routes, each page behind the
guard that every one passes (`guarded`), and its lifespan.

Every page needs a person signed in (`access`); every POST also a CSRF token and an
origin of this host. Every query and form parameter is read through `params`, so one
that is not what it should be gets a 400 page, never a statement; every answer, an
error's too, carries the security headers (`headers`); one that finds the database
unavailable gets a 503 status page until it is back (`outage`, `_unavailable`). Pages
are drawn by Jinja2 with autoescaping on (`formats`), so a job name, error, `by` or
reason is always text; charts are SVG drawn on the server (`charts`); the only script
is htmx, served from the package, which refreshes the overview's live part. The pages themselves are in
`signin`, `overview`, `jobs`, `system` and `act`; what they share in `board`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import psycopg
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..errors import SchemaError
from ..options import QueueOptions
from ..queue import Queue
from . import act, jobs, overview, params, pauses, signin, system, workflows
from .access import Access, SignOnRefused, same_origin
from .board import Dashboard, base_of
from .formats import templates
from .headers import Headers
from .history import History
from .outage import RETRY_EVERY, unavailable
from .params import BadParameter

__all__ = ["create_app"]

STATIC = Path(__file__).parent / "static"

Handler = Callable[[Dashboard, Request], Awaitable[Response]]
"""A page: what it answers to a request of a person signed in (and, for a POST, with a
CSRF token and from this host)."""


def _unavailable(board: Dashboard, request: Request, why: str) -> Response:
    """The 503 a page answers while the database is unavailable (`outage`): to the
    overview's live part (an htmx request) a notice in its place, which keeps polling;
    to a page, a page that loads itself again every `RETRY_EVERY` seconds; to an act, a
    page saying it may not have been done. Nothing of the error but its class."""
    response = board.page(
        request,
        "live_down.html" if request.headers.get("hx-request") else "unavailable.html",
        status=503,
        why=why,
        error_class=board.outage.error_class,
        retry=RETRY_EVERY,
        acting=request.method == "POST",
    )
    response.headers["retry-after"] = str(RETRY_EVERY)
    return response


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
    board = Dashboard(queue, access, read_only, owns, History(), templates(), asyncio.Lock())

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
                    # A page's refresh (htmx swaps no 4xx answer): the page goes to the
                    # sign-in instead of showing its last numbers as if they were new.
                    return PlainTextResponse(
                        "sign in again",
                        status_code=401,
                        headers={"HX-Redirect": f"{base_of(request)}/signin"},
                    )
                return RedirectResponse(f"{base_of(request)}/signin", status_code=303)
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
            except (psycopg.Error, SchemaError) as error:
                why = unavailable(error)
                if why is None:
                    raise
                board.outage.begins(why, error)
                return _unavailable(board, request, why)

        return endpoint

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        if owns and queue.is_open:
            await queue.close()

    routes = [
        Route("/signin", signin.signin_page, methods=["GET"]),
        Route("/signin", signin.signin, methods=["POST"]),
        Route("/signout", guarded(signin.signout), methods=["POST"]),
        Route("/", guarded(overview.overview)),
        Route("/live", guarded(overview.live)),
        Route("/names", guarded(overview.names)),
        Route("/jobs", guarded(jobs.jobs)),
        Route("/jobs/{job_id}", guarded(jobs.job)),
        Route("/workflows/{workflow_id}", guarded(workflows.workflow)),
        Route("/review", guarded(jobs.review)),
        Route("/failed", guarded(jobs.failed)),
        Route("/schedules", guarded(system.schedules)),
        Route("/workers", guarded(system.workers)),
        Route("/acts", guarded(system.acts)),
        Route("/act", guarded(act.act), methods=["POST"]),
        Route("/act/all", guarded(act.act_all_page), methods=["GET"]),
        Route("/act/all", guarded(act.act_all), methods=["POST"]),
        Route("/paused", guarded(pauses.paused)),
        Route("/pause", guarded(pauses.pause_act), methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.dashboard = board
    app.add_middleware(Headers)
    return app
