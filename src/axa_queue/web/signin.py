"""Signing in and out: the sign-in page, the sign-in form (a token and a name, which
becomes the `by` of the person's acts; it sets the session cookie) and signing out
(which closes the session and deletes the cookie)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from ..errors import NotACodeError
from . import params
from .access import COOKIE, SESSION_SECONDS, same_origin
from .board import Dashboard, base_of, board_of
from .params import BadParameter

__all__ = ["signin", "signin_page", "signout"]


async def signin_page(request: Request) -> Response:
    """The sign-in form (with a token field when the dashboard has a token)."""
    board = board_of(request)
    return board.page(request, "signin.html", token=board.access.token is not None, error=None)


async def signin(request: Request) -> Response:
    """Opens a session for the name given with the dashboard's token, or says again
    what the form needs."""
    board = board_of(request)
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
    base = base_of(request)
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


async def signout(board: Dashboard, request: Request) -> Response:
    """Closes the person's session and sends them to the sign-in page."""
    session = request.cookies.get(COOKIE)
    if session is not None:
        board.access.close_session(session)
    base = base_of(request)
    response = RedirectResponse(f"{base}/signin", status_code=303)
    response.delete_cookie(COOKIE, path=f"{base}/")
    return response
