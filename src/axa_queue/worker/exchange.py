"""The exchange: one statement (`sql.EXCHANGE`) records how finished runs ended, many
rows at once, each fenced by its own attempt, and in the same commit claims as many
ready jobs as there are free places, honouring priority order and per-name limits.

The loop sends the next statement as soon as the last is answered and there is
something to do: endings to record, or free places and a reason to look for work (a
notification, a loop coming free, a retry's backoff ending, or the poll interval).
While one statement is in flight the next batch gathers, so at low load an ending is
written at once and at high load many share a statement (with `prefetch`, while every
loop is busy, endings also wait up to `HOLD_ENDINGS` for others: `decisions.holds`).
An ending is durable once its statement commits: a process killed in between leaves
its job `running`, and stale recovery runs it again.

One statement carries many runs and names, so one bad value must not stop them all:
a statement that fails for a value it carried or read is sent again in parts, down to
the run or the name at fault (`isolation`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from typing import Any

import psycopg

from .. import sql
from ..handlers.registry import Registry
from ..handlers.retries import first_line, kind
from ..options import QueueOptions, to_seconds
from . import decisions
from .claims import RETRY_DATABASE, Claims
from .connections import Connections
from .held import HeldRows
from .isolation import Isolation
from .run import Run, order_of
from .runs import Runner
from .skips import Skips
from .state import Phase, State
from .tasks import Streak
from .wire import endings, exchange_rows, statement_for, waits_and_cursors

__all__ = ["OUTCOMES", "Exchange"]

log = logging.getLogger("axa_queue.worker")


OUTCOMES = {"completed": "completed", "queued": "retried", "failed": "failed"}
"""The outcome an observer is told for each status an ending writes."""


class Exchange:
    """Records endings and claims jobs, one statement at a time."""

    def __init__(
        self,
        state: State,
        connections: Connections,
        runner: Runner,
        claims: Claims,
        registry: Registry,
        options: QueueOptions,
    ) -> None:
        self.state = state
        self.connections = connections
        self.runner = runner
        self.claims = claims
        self.registry = registry
        self.options = options
        self.schema = options.resolved_schema()
        self.flush_at: asyncio.TimerHandle | None = None
        """Sends the endings gathered once the oldest has waited `HOLD_ENDINGS`."""
        self.attempts = registry.attempt_limits(options.max_attempts)
        """Each claimed run's attempt limit (`limits.AttemptLimits`): the job's own, else
        its handler's, else the queue's."""
        self.claim_limits = self.attempts.params()
        """The attempt limits the claim stores on a job claimed without one (`max`,
        `limits`): the same for every statement of this process."""
        self.timeouts = {
            name: to_seconds(h.policy.timeout, "timeout")
            for name, h in registry.handlers.items()
            if h.policy.timeout is not None
        }
        """The handlers' timeouts in seconds, for jobs stored without one."""
        self.said = Streak()
        """The exchanges failing in a row, for the log (`Streak`)."""
        self.failing: tuple[float, str] | None = None
        """Since when (monotonic) and why exchanges have failed, with none gone through
        since (see `Worker.trouble`)."""
        self.skips = Skips(state)
        """The names left out of claims, their claim failing on its own."""
        self.isolation = Isolation(
            state, connections, self, runner.take, self._recorded, self.skips
        )
        """Sends a statement's parts apart when a value fails it; keeps what it found."""
        self.held = HeldRows(state, connections)
        """The endings kept aside while another transaction holds their job's row."""

    def statement(self, recording: bool) -> sql.Numbered:
        """The statement to send now (`wire.statement_for`), in the queue's schema when
        it has one, its parameters numbered once (`sql.numbered`)."""
        text = statement_for(self.registry.limits, recording)
        return sql.numbered(text if self.schema is None else sql.in_schema(text, self.schema))

    async def _idle(self, free: int, poll: float) -> None:
        """Wait for something to do: a nudge, or the poll interval while places are free
        (a timer rather than wait_for: no task per wait on the path of a wake-up)."""
        state = self.state
        timer = None if free <= 0 else asyncio.get_running_loop().call_later(poll, self._poll_due)
        await state.nudge.wait()
        if timer is not None:
            timer.cancel()
        state.nudge.clear()

    def _flush_due(self) -> None:
        """The oldest ending gathered has waited `HOLD_ENDINGS`: send them now."""
        self.flush_at = None
        self.state.nudge.set()

    def _poll_due(self) -> None:
        """The poll interval passed with nothing said: look for work anyway."""
        self.state.look = True
        self.state.nudge.set()

    async def loop(self) -> None:
        poll = self.options.poll_interval.total_seconds()
        loop = asyncio.get_running_loop()
        state = self.state
        while True:
            if self.isolation.apart_due():
                await self.isolation.retry_apart()
            if self.held.due():
                await self.held.release()
            free = state.free()
            claim = free > 0 and state.look
            if not state.endings and not state.starts and not claim:
                if state.phase >= Phase.CLOSING:
                    return
                await self._idle(free, poll)
                continue
            if decisions.holds(
                due=state.due(),
                endings=len(state.endings) + len(state.starts),
                now=loop.time(),
                since=state.endings_since,
            ):
                # Busy loops and jobs waiting for them: let endings gather, so one
                # statement records many and claims many (see `decisions.due`).
                if (state.endings or state.starts) and self.flush_at is None:
                    self.flush_at = loop.call_at(
                        state.endings_since + decisions.HOLD_ENDINGS, self._flush_due
                    )
                await state.nudge.wait()
                state.nudge.clear()
                continue
            if self.flush_at is not None:
                self.flush_at.cancel()
                self.flush_at = None
            paced = state.pace()  # `prefetch="auto"`: how many may wait, in all and by name
            if paced is not None:
                free = state.free()
                claim = free > 0 and state.look
            batch, since, state.endings = state.endings, state.endings_since, []
            # A run that has ended needs no mark: its ending, in this batch (or refused,
            # its claim lost), is what the statement writes of it.
            starts = [one for one in state.starts if not one.done]
            state.starts = []
            wanted = (
                decisions.wanted(
                    self.registry.handlers,
                    self.registry.limits,
                    state.in_use,
                    free,
                    paced=paced,
                    waiting=None if paced is None else state.waiting_by_name(),
                    idle=state.idle(),
                )
                if claim
                else []
            )
            if self.skips.skipped and wanted:
                wanted = self.skips.unskipped(wanted)
            if not wanted and not batch and not starts:
                # No name may take a job now (its limit, or as many of its jobs as
                # its pace allows wait already), and nothing to record: wait for a
                # change (a run ending or starting, a notification, a timer).
                await self._idle(free, poll)
                continue
            wakes = state.wakes
            state.claiming = bool(wanted)
            state.sending = batch
            idle = state.idle() if wanted else 0
            claimed: list[Run] | None = None
            try:
                try:
                    claimed, kept = await self.send(
                        batch, free if wanted else 0, wanted, starts, idle
                    )
                except psycopg.Error as error:
                    if await self.held.put_aside(error, batch, starts):  # the rest, now
                        claimed, kept = await self.send(
                            batch, free if wanted else 0, wanted, starts, idle
                        )
                    elif not decisions.blames_values(error.sqlstate):
                        raise
                    else:
                        # One run's or one name's value, maybe: send the parts apart.
                        # What they record and claim comes out of `batch` and `starts`
                        # as it goes, so a failure of another kind on the way sends only
                        # the rest again.
                        got = await self.isolate(
                            batch, starts, wanted, free if wanted else 0, idle, error
                        )
            except psycopg.Error as error:
                state.sending = []
                state.claiming = False
                began = self.failing[0] if self.failing else time.monotonic()
                self.failing = (began, first_line(error))
                lasted = self.said.failed()
                if lasted is not None:  # at once, then one every `SAID_EVERY`; and its end
                    log.error(
                        "could not record finished jobs or claim new ones (%s; endings waiting: "
                        "%d; failing for %.0f s); trying again every %g s",
                        kind(error),
                        len(batch),
                        lasted,
                        min(RETRY_DATABASE, poll),
                        extra={"error": first_line(error), "endings": len(batch)},
                    )
                state.endings = batch + state.endings
                state.starts = starts + state.starts
                if batch or starts:
                    state.endings_since = since
                await asyncio.sleep(min(RETRY_DATABASE, poll))
                continue
            state.sending = []
            state.claiming = False
            lasted = self.said.ended()
            if lasted is not None:
                log.info("recording and claiming again, after %.1f s of failures", lasted)
                state.database_back()
            self.failing = None
            if claimed is not None:
                got = len(claimed)
                began = self.runner.take(claimed)
                if began and not batch and not state.endings and not state.starts:
                    # A claim alone started runs, and nothing waits to be sent: let each
                    # reach its handler before the bookkeeping below (a turn of the
                    # event loop; a cancel here leaves no ending untold). Else the next
                    # statement goes first, as before.
                    await asyncio.sleep(0)
            if self.skips.skipped and wanted:
                self.skips.cleared(wanted)
            if wanted:
                by_name = None if claimed is None else Counter(one.name for one in claimed)
                state.held_back = decisions.held_back(self.registry.handlers, wanted, by_name)
                if state.wakes == wakes and decisions.nothing_more(wanted, free, got, by_name):
                    # Fewer than it could take, none of a name held to its cap, and
                    # nothing new since it asked: there is no work for us until a
                    # notification, a timer, a place coming free for a name held back
                    # or under a limit, or the poll interval says otherwise.
                    state.look = False
            if claimed is not None:
                self._recorded(batch, kept)

    async def send(
        self,
        batch: list[Run],
        free: int,
        wanted: list[dict[str, Any]],
        starts: list[Run] | None = None,
        idle: int = 0,
    ) -> tuple[list[Run], set[tuple[str, int]] | None]:
        """Record the endings of `batch`, mark the runs of `starts` (claimed ahead)
        started, and claim up to `free` jobs of the `wanted` names, the first `idle` to
        start at once and the others ahead, in one statement; returns the runs claimed,
        best first, and the (id, attempt) of the endings recorded, or `None` when all of
        them were."""
        starts = starts or []
        conn = await self.connections.for_exchange()
        completed, completed_attempts, others = endings(batch)
        sent = self.connections.monotonic()  # when the claims made here last proved theirs
        statement = self.statement(bool(batch or starts))
        values = statement.values(
            {
                "completed": completed,
                "completed_attempts": completed_attempts,
                "endings": others,
                "free": free,
                "wanted": json.dumps(wanted, ensure_ascii=False),
                "losing": self.state.fence(self.claims.stalled),
                "idle": idle,
                "starts": "{" + ",".join(r.id for r in starts) + "}",
                "started_attempts": "{" + ",".join(str(r.attempts) for r in starts) + "}",
                "now": self.connections.now(),
                **self.connections.identity,
                **self.claim_limits,
            }
        )
        made = exchange_rows(self.attempts, sent, self.timeouts, self.options.log_keys)
        try:  # a raw cursor: the statement goes as numbered once, not converted each time
            cursor = psycopg.AsyncRawCursor(conn, row_factory=made)
            await cursor.execute(statement.query, values)
            rows: list[Any] = await cursor.fetchall()
        except psycopg.OperationalError:
            await self.connections.exchange_broke(conn)
            raise
        if self.registry.limits.rate or self.registry.limits.keyed:
            rows, wait = waits_and_cursors(rows, self.registry.limits.after)
            if wait is not None:
                self.state.wake_in(wait)
        claimed = [row for row in rows if type(row) is Run]
        if len(claimed) > 1:
            claimed.sort(key=order_of)
        if len(rows) - len(claimed) == len(batch):
            return claimed, None  # every ending recorded (the usual case)
        return claimed, {row for row in rows if type(row) is not Run}

    async def isolate(
        self,
        batch: list[Run],
        starts: list[Run],
        wanted: list[dict[str, Any]],
        free: int,
        idle: int,
        error: psycopg.Error,
    ) -> int:
        """After `error`, a failure of a value the statement carried or read, send its
        parts apart to find the run or the name at fault (`Isolation.isolate`); returns
        how many runs were claimed."""
        return await self.isolation.isolate(batch, starts, wanted, free, idle, error)

    def _recorded(self, batch: list[Run], kept: set[tuple[str, int]] | None) -> None:
        """Count the endings recorded (all of them when `kept` is None) and tell the
        observers; the others lost their claim: to `Claims.lose`, like every loss."""
        state = self.state
        observers = self.registry.observers
        for one in batch:
            if kept is None or one.key in kept:
                outcome = OUTCOMES[one.status]
                state.stats[outcome] += 1
                if observers:
                    self.registry.tell(one.name, outcome, one.seconds, one.fields())
            else:
                self.claims.lose(
                    one, "stopped: it finished after another worker or recovery took its claim"
                )
