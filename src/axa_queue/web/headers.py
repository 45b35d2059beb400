"""The security headers on every answer: `Headers`, the outermost middleware, adds them
(`access.security_headers`) and answers a request whose handling failed before it
answered with a 500 page (`FAILED_PAGE`) that carries them too."""

from __future__ import annotations

from starlette.responses import HTMLResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .access import security_headers

__all__ = ["FAILED_PAGE", "Headers"]

FAILED_PAGE = (
    '<!doctype html><html lang="en"><head><meta charset="utf-8">'
    "<title>Error · axa-queue</title></head><body><h1>The dashboard could not answer</h1>"
    "<p>Something failed while answering this request; the dashboard's log says what. "
    "Reload the page to try again.</p></body></html>"
)
"""What an answer that failed says: nothing of the failure (the log has it)."""


class Headers:
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
