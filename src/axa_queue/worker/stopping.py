"""Finishing at a stop: the runs in progress end (and those a claim in flight
brings), up to the end of `shutdown_grace`; past it their loops are cancelled (their
jobs stay `running`, for stale recovery), and the runs claimed ahead that never
started are queued again at once, their attempts given back (`sql.GIVE_BACK`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import psycopg

from .. import sql
from ..handlers.retries import first_line, kind
from .connections import Connections
from .run import Run
from .state import State
from .tasks import cancel_all

__all__ = ["finish_runs", "forget_waiting", "give_back"]

log = logging.getLogger("axa_queue.worker")


async def finish_runs(
    state: State, connections: Connections, deadline: float | None, abort: Callable[[], None]
) -> None:
    """Wait for jobs in progress (also those a claim in flight brings), aborting any
    still running at `deadline` (monotonic; the end of `shutdown_grace`): `abort` is
    told first (what is cancelled from then on is the worker's), then their loops are
    cancelled, and the runs claimed ahead that never started are given back."""
    told = False
    while state.runs or state.claiming:
        tasks = [r.task for r in state.runs.values() if r.task is not None]
        if not tasks:
            if deadline is not None and time.monotonic() >= deadline:
                # A claim still in flight: its runs stay `running`, for stale recovery.
                await give_back(connections, forget_waiting(state))
                return
            await asyncio.sleep(0.001)  # a claim in flight: its runs start when answered
            continue
        if not told:
            log.info(
                "stopping: waiting for jobs in progress (%d running)",
                len(tasks),
                extra={"running": len(tasks)},
            )
            told = True
        timeout = None if deadline is None else max(deadline - time.monotonic(), 0)
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        if pending and deadline is not None and time.monotonic() >= deadline:
            log.warning(
                "stopping: aborting jobs still running after the grace period (%d); "
                "stale recovery will queue them again",
                len(pending),
                extra={"aborted": len(pending)},
            )
            abort()
            await cancel_all(pending)
            await give_back(connections, forget_waiting(state))


def forget_waiting(state: State) -> list[Run]:
    """Let go of runs claimed ahead that never started, and return them."""
    forgotten, state.waiting = state.waiting, []
    for one in forgotten:
        state.runs.pop(one.key, None)
        state.in_use[one.name] -= 1
    return forgotten


async def give_back(connections: Connections, runs: list[Run]) -> None:
    """Queue again at once, with their attempts given back, the runs claimed ahead
    that a stop let go of before their handler started (`sql.GIVE_BACK`, fenced by
    their attempts); if the database does not answer, stale recovery gives them
    back later (`sql.RECOVER_STALE`)."""
    runs = [one for one in runs if one.ahead]
    if not runs:
        return
    try:
        await connections.on_side(
            sql.GIVE_BACK,
            {
                "ids": "{" + ",".join(one.id for one in runs) + "}",
                "attempts": "{" + ",".join(str(one.attempts) for one in runs) + "}",
                "limits": "{" + ",".join(str(one.limit) for one in runs) + "}",
                "now": connections.now(),
                **connections.identity,
            },
        )
    except psycopg.Error as error:
        log.warning(
            "stopping: could not queue again the jobs claimed ahead that never started "
            "(%d; %s); stale recovery will",
            len(runs),
            kind(error),
            extra={"jobs": len(runs), "error": first_line(error)},
        )
        return
    log.info(
        "stopping: queued again the jobs claimed ahead that never started (%d)",
        len(runs),
        extra={"jobs": len(runs)},
    )
