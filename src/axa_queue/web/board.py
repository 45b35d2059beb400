"""The dashboard as a service the pages share: `Dashboard` (its queue, opened on first
use; who may sign in; the history it keeps between requests; its templates) and what
every page module needs of a request: the dashboard serving it (`board_of`) and the
path it is mounted at (`base_of`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, TypeVar

from jinja2 import Environment
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from ..acts import MAX_REASON_CHARS
from ..db.calls import Call, run_async
from ..queue import Queue
from .access import Access, Person
from .history import History

__all__ = ["STATES", "Dashboard", "base_of", "board_of"]

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
            base=base_of(request),
            person=person,
            csrf=None if person is None else self.access.csrf(person),
            read_only=self.read_only,
            states=STATES,
            max_reason=MAX_REASON_CHARS,
            **values,
        )
        return HTMLResponse(html, status_code=status)


def board_of(request: Request) -> Dashboard:
    """The dashboard the app answering `request` serves (`create_app` keeps it in the
    app's state)."""
    board: Dashboard = request.app.state.dashboard
    return board
