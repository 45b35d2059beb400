"""The pages of counts by name: the overview (`/`), its live part that htmx fetches
again every two seconds (`/live`), and every name's counts a page at a time (`/names`).
Each refreshes the charts' history (`history`) as it reads the counts, and says which
names a live worker process handles, warning of those whose jobs have waited for
longer than `unhandled_after` with none to handle them (`presence`)."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..acts import paused_call
from ..presence import handled_names, unhandled_call, workers_call
from . import charts, params
from .board import Dashboard
from .history import DAY, HOUR, Tally
from .reads import COUNT_CAP, estimate_call, finished_call, live_counts_call

__all__ = ["LIVE_EVERY", "NAMES_PAGE", "TOP_NAMES", "live", "names", "overview"]

TOP_NAMES = 50
"""The most names the overview's table shows, those with the most jobs not finished:
so the overview, fetched every two seconds by every open page, stays the same size
however many names there are. The names page (`/names`) lists them all."""

LIVE_EVERY = 2
"""Seconds between two fetches of the overview's live part by an open page (htmx's
`every`)."""

NAMES_PAGE = 100
"""Names on one page of `/names`."""

NAME_ORDERS = ("backlog", "name")


def _unfinished(row: dict[str, Any]) -> int:
    return int(
        row["ready"] + row["waiting"] + row["running"] + row["needs_review"] + row["blocked"]
    )


def _by_backlog(row: dict[str, Any]) -> tuple[int, int, int, str]:
    """The order of names on the overview: the most jobs not finished (ready, delayed,
    running, in review, blocked) first, then the most failed and completed in the last hour,
    then by name."""
    return (-_unfinished(row), -row["failed"], -row["completed"], row["name"])


UNHANDLED_SHOWN = 20
"""The most names nobody handles the overview lists (the oldest first as read); the
others are counted, so the page refreshed every 2 s stays small whatever their number."""


async def _by_name(board: Dashboard) -> dict[str, Any]:
    """Each name's counts (`rows`, in `_by_backlog` order) and their totals, refreshing
    the history (at most once per `history.REFRESH_EVERY`, whoever asks)."""
    live = await board.read(live_counts_call(COUNT_CAP))
    totals: dict[str, Any] = {
        key: sum(getattr(one, key) for one in live)
        for key in ("ready", "waiting", "running", "needs_review", "blocked")
    }
    # Past the cap, a state's counts are those of the rows read: at least that many.
    capped = {
        "queued": totals["ready"] + totals["waiting"] >= COUNT_CAP,
        "running": totals["running"] >= COUNT_CAP,
        "needs_review": totals["needs_review"] >= COUNT_CAP,
        "blocked": totals["blocked"] >= COUNT_CAP,
    }
    estimated = capped["queued"]
    if estimated:  # never less than the rows just read (statistics may be stale)
        totals["ready"] = max(totals["ready"], await board.read(estimate_call(ready=True)))
        totals["waiting"] = max(totals["waiting"], await board.read(estimate_call(ready=False)))
    history = board.history
    await history.refresh(
        lambda since, until: board.read(finished_call(since, until)), totals["ready"]
    )
    recent = history.recent_by_name()
    options = board.queue.options
    workers = await board.read(workers_call())
    handled = handled_names(workers, options.stale_after.total_seconds())
    unhandled = await board.read(unhandled_call(handled, options.unhandled_after.total_seconds()))
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
                "blocked": counts.blocked if counts else 0,
                "completed": done.completed,
                "failed": done.failed,
                "cancelled": done.cancelled,
                "oldest": counts.oldest_ready_seconds if counts else 0.0,
                "handled": name in handled,
            }
        )
    rows.sort(key=_by_backlog)
    for key in Tally._fields:
        totals[key] = sum(getattr(done, key) for done in recent.values())
    totals["oldest"] = max([row["oldest"] for row in rows], default=0.0)
    paused = {one.name for one in await board.read(paused_call())}
    return {
        "rows": rows,
        "paused": paused,
        "totals": totals,
        "capped": capped,
        "estimated": estimated,
        "cap": COUNT_CAP,
        "unhandled": unhandled,
        "unhandled_shown": UNHANDLED_SHOWN,
        "unhandled_after": options.unhandled_after.total_seconds(),
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


async def overview(board: Dashboard, request: Request) -> Response:
    """The overview: the totals, the charts and the names with the most jobs not finished."""
    values = await _overview_values(board)
    return board.page(request, "overview.html", live_every=LIVE_EVERY, **values)


async def live(board: Dashboard, request: Request) -> Response:
    """The overview's live part alone, for htmx to put in place."""
    return board.page(request, "live.html", **await _overview_values(board))


async def names(board: Dashboard, request: Request) -> Response:
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
