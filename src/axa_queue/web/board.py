"""The dashboard as a service the pages share: `Dashboard` (its queue, opened on first
use; who may sign in; the history it keeps between requests; its templates) and what
every page module needs of a request: the dashboard serving it (`board_of`) and the
path it is mounted at (`base_of`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from jinja2 import Environment
from psycopg_pool import PoolTimeout
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from ..acts import MAX_REASON_CHARS, NIL_JOB
from ..db.calls import Call, run_async
from ..queue import Queue
from .access import Access, Person
from .history import History
from .outage import Outage, unavailable

__all__ = ["STATES", "WAIT", "WAIT_DOWN", "Dashboard", "base_of", "board_of"]

T = TypeVar("T")

STATES = [
    ("queued", "Queued"),
    ("running", "Running"),
    ("needs_review", "Needs review"),
    ("failed", "Failed"),
    ("completed", "Completed"),
    ("cancelled", "Cancelled"),
]
"""The states the pages list jobs by, with their titles, in the navigation's order."""


WAIT = 5.0
"""Seconds a page waits for a pooled connection: past it, the database is taken for
unavailable (`outage`), rather than the page hanging for the pool's 30 s."""

WAIT_DOWN = 1.0
"""The same wait during an outage: the outage page answers within about a second."""


def base_of(request: Request) -> str:
    """The path the dashboard is mounted at, without a trailing `/` ("" at the root)."""
    root: str = request.scope.get("root_path", "")
    return root.rstrip("/")


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
    outage: Outage = field(default_factory=Outage)

    async def opened(self) -> Queue:
        """The queue, opened on first use (checking its tables, never setting them up)."""
        if not self.queue.is_open:
            async with self.opening:
                if not self.queue.is_open:
                    await self.queue.open(setup=False)
        return self.queue

    async def read(self, call: Call[T]) -> T:
        """`call` on a pooled connection, waiting for one `WAIT` seconds (`WAIT_DOWN`
        during an outage). A connection an outage broke, which the pool may still
        hand out once the database is back (every idle one, when no page was asked for
        during the outage), fails at once: the pool's idle connections are checked
        (`check`: the broken ones replaced) and the read tried once more (and if no
        connection comes, the first error is raised: it says what happened). The
        outage ends at the first read that succeeds."""
        queue = await self.opened()
        try:
            found = await self._read(queue, call)
        except psycopg.OperationalError as error:
            if isinstance(error, PoolTimeout) or unavailable(error) is None:
                raise
            await queue.pool.check()
            try:
                found = await self._read(queue, call)
            except PoolTimeout:
                raise error from None  # what broke the connection says more than the wait
        self.outage.ends()
        return found

    async def _read(self, queue: Queue, call: Call[T]) -> T:
        wait = WAIT_DOWN if self.outage.down else WAIT
        async with queue.pool.connection(timeout=wait) as conn:
            return await run_async(conn, call)

    def page(self, request: Request, template: str, status: int = 200, **values: Any) -> Response:
        person: Person | None = request.state.person if hasattr(request.state, "person") else None
        html = self.templates.get_template(template).render(
            base=base_of(request),
            person=person,
            csrf=None if person is None else self.access.csrf(person),
            read_only=self.read_only,
            states=STATES,
            max_reason=MAX_REASON_CHARS,
            nil_job=NIL_JOB,
            **values,
        )
        return HTMLResponse(html, status_code=status)


def board_of(request: Request) -> Dashboard:
    """The dashboard the app answering `request` serves (`create_app` keeps it in the
    app's state)."""
    board: Dashboard = request.app.state.dashboard
    return board
