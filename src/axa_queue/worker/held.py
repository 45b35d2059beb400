"""Rows held by another transaction: one run's ending waits, not every loop's.

The exchange records every loop's endings and claims in one statement, and an ending
waits for its job's row, which another transaction may hold for as long as it stays
open: a person's act not yet committed, a dependent queued in a request's transaction
(`NewJob.after` flags its parent), a `SELECT ... FOR UPDATE` by hand. The exchange's
connection waits at most `sql.EXCHANGE_ROW_WAIT` for a lock; past it the statement
fails (`lock_not_available`), and `HeldRows.put_aside` finds the rows held now
(`sql.ROWS_FREE`, which never waits), keeps those endings and start marks aside
(`State.row_held`: their claims kept by the heartbeat, their places held), and the
exchange sends the rest at once. Every `PROBE_EVERY` the rows aside are looked at
again (`release`, never waiting): those free go back to the next statement, where the
fence decides them as any other (a job cancelled meanwhile refuses its ending).

Each run aside is logged once, by its job's id, name and attempt, never its arguments.
A worker that stops while a row is still held lets that ending go: its job stays
`running` for stale recovery, as any ending not written.
"""

from __future__ import annotations

import asyncio
import logging
import time

import psycopg

from .. import sql
from ..db.calls import by_name
from .connections import Connections
from .run import Run
from .state import Phase, State

__all__ = ["LOCK_NOT_AVAILABLE", "PROBE_EVERY", "HeldRows"]

log = logging.getLogger("axa_queue.worker")

LOCK_NOT_AVAILABLE = "55P03"
"""The SQLSTATE of a statement that waited `lock_timeout` for a lock."""

PROBE_EVERY = 0.5
"""Seconds between two looks at the rows held (`HeldRows.release`)."""


class HeldRows:
    """The endings and start marks kept aside while their job's row is held."""

    def __init__(self, state: State, connections: Connections) -> None:
        self.state = state
        self.connections = connections
        self.starts: list[Run] = []
        """Start marks kept aside (their runs go on, in `State.runs`)."""
        self.probe_at = 0.0

    def due(self) -> bool:
        """Whether the rows aside are to be looked at again now (their time has come, or
        the worker is closing)."""
        return bool(self.state.row_held or self.starts) and (
            time.monotonic() >= self.probe_at or self.state.phase >= Phase.CLOSING
        )

    async def put_aside(self, error: psycopg.Error, batch: list[Run], starts: list[Run]) -> bool:
        """After `error`, if it is a lock waited for too long: take out of `batch` and
        `starts` (in place) the runs whose row another transaction holds, and keep them
        aside. Whether any was: if none, the lock was another (a table's, an advisory
        one), and the statement is everyone's to send again."""
        if error.sqlstate != LOCK_NOT_AVAILABLE or not (batch or starts):
            return False
        free = await self._free([*batch, *starts])
        held = [one for one in batch if one.id not in free]
        held_starts = [one for one in starts if one.id not in free]
        if not held and not held_starts:
            return False
        for one in (*held, *held_starts):
            log.warning(
                "the row of job %s %s (attempt %d) is held by another transaction (an "
                "open transaction locked it): what this run did waits until it is free; "
                "the other runs go on",
                *one.named(),
                extra=one.fields(),
            )
        batch[:] = [one for one in batch if one.id in free]
        starts[:] = [one for one in starts if one.id in free]
        self.state.row_held.extend(held)
        self.starts.extend(held_starts)
        self.probe_at = time.monotonic() + PROBE_EVERY
        return True

    async def release(self) -> None:
        """Look at the rows aside again: the endings and start marks of those free go
        back to the next statement. Once closing, those still held are let go."""
        state = self.state
        try:
            free = await self._free([*state.row_held, *self.starts])
        except psycopg.Error:
            free = set()  # the exchange's own failure says why, if it lasts
        back = [one for one in state.row_held if one.id in free]
        back_starts = [one for one in self.starts if one.id in free and not one.done]
        state.row_held = [one for one in state.row_held if one.id not in free]
        self.starts = [one for one in self.starts if one.id not in free]
        for one in (*back, *back_starts):
            log.info(
                "the row of job %s %s (attempt %d) is free again: what this run did is sent",
                *one.named(),
                extra=one.fields(),
            )
        if back:
            if not state.endings:
                state.endings_since = asyncio.get_running_loop().time()
            state.endings.extend(back)
        state.starts.extend(back_starts)
        if (state.row_held or self.starts) and state.phase >= Phase.CLOSING:
            log.warning(
                "stopping: %d runs' job rows are still held by another transaction; stale "
                "recovery will decide their jobs",
                len(state.row_held) + len(self.starts),
                extra={"endings": len(state.row_held)},
            )
            state.row_held = []
            self.starts = []
        self.probe_at = time.monotonic() + PROBE_EVERY

    async def _free(self, runs: list[Run]) -> set[str]:
        """The ids of `runs` whose row no other transaction holds now (`sql.ROWS_FREE`)."""
        conn = await self.connections.for_exchange()
        try:
            cursor = conn.cursor(row_factory=by_name)
            await cursor.execute(sql.ROWS_FREE, {"ids": [one.id for one in runs]})
            return {row.id for row in await cursor.fetchall()}
        except psycopg.OperationalError:
            await self.connections.exchange_broke(conn)
            raise
