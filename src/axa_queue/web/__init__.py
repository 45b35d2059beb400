"""The dashboard (the `[web]` extra): `create_app(...)` makes an ASGI app that shows the
queue and lets a signed-in person cancel, retry and release jobs, each act recorded
with their name as `by`. `axa-queue web` serves it; docs/dashboard.md tells more.

Its modules: `app` (`create_app`: the routes and the guard every page passes),
`board` (the `Dashboard` the pages share), `signin` (signing in and out), `overview`
(the counts by name: `/`, `/live`, `/names`), `jobs` (the lists of jobs and a job's
page), `system` (schedules, workers, the acts log), `act` (the POST that cancels and
retries), `formats` (the templates and their filters), `headers` (the security headers
on every answer), `access` (signing in, sessions, CSRF, origin, security headers),
`params` (every query and form parameter, checked by its kind), `outage` (the database
unavailable: a 503 page until it is back), `reads` (what it reads:
named statements of `sql`), `history` (the charts' per-minute history, kept in memory)
and `charts` (SVG drawn on the server).
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as missing:  # pragma: no cover - only without the extra
    raise ImportError(
        f"the dashboard needs the web extra ({missing.name} is not installed): "
        "pip install 'axa-queue[web]'"
    ) from None

from .app import create_app

__all__ = ["create_app"]
