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
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import psycopg
from psycopg.rows import RowMaker

from .. import sql
from ..options import QueueOptions, to_seconds
from ..registry import Registry
from ..retries import first_line, kind
from . import decisions
from .claims import RETRY_DATABASE, Claims
from .connections import Connections
from .runs import Runner
from .state import Phase, Run, State, order_of

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
        self.flush_at: asyncio.TimerHandle | None = None
        """Sends the endings gathered once the oldest has waited `HOLD_ENDINGS`."""
        self.limits = {
            name: h.policy.max_attempts
            for name, h in registry.handlers.items()
            if h.policy.max_attempts is not None
        }
        """The handlers' `max_attempts`, for jobs stored without one."""
        self.timeouts = {
            name: to_seconds(h.policy.timeout, "timeout")
            for name, h in registry.handlers.items()
            if h.policy.timeout is not None
        }
        """The handlers' timeouts in seconds, for jobs stored without one."""
        self.failing: tuple[float, str] | None = None
        """Since when (monotonic) and why exchanges have failed, with none gone through
        since (see `Worker.trouble`)."""

    def statement(self, recording: bool) -> str:
        """`sql.EXCHANGE`, or `sql.EXCHANGE_LIMITED` once this process has a global limit,
        or `sql.EXCHANGE_RATED` once it has a rate limit: a process without either sends
        the plain statement, whose plan is unchanged, or `sql.CLAIM` when it has nothing
        to record (no ending, no start to mark: `recording` false)."""
        if self.registry.rate_limits:
            return sql.EXCHANGE_RATED
        if self.registry.global_limits:
            return sql.EXCHANGE_LIMITED
        return sql.EXCHANGE if recording else sql.CLAIM

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
        poll = self.options.seconds("poll_interval")
        loop = asyncio.get_running_loop()
        state = self.state
        while True:
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
                    self.registry.global_limits,
                    self.registry.rate_limits,
                    paced=paced,
                    waiting=None if paced is None else state.waiting_by_name(),
                    idle=state.idle(),
                )
                if claim
                else []
            )
            if not wanted and not batch and not starts:
                # No name may take a job now (its limit, or as many of its jobs as
                # its pace allows wait already), and nothing to record: wait for a
                # change (a run ending or starting, a notification, a timer).
                await self._idle(free, poll)
                continue
            wakes = state.wakes
            state.claiming = bool(wanted)
            state.sending = batch
            try:
                claimed, kept = await self.send(
                    batch, free if wanted else 0, wanted, starts, state.idle() if wanted else 0
                )
            except psycopg.Error as error:
                state.sending = []
                state.claiming = False
                since_failing = self.failing[0] if self.failing else time.monotonic()
                self.failing = (since_failing, first_line(error))
                log.error(
                    "could not record finished jobs or claim new ones (%s; endings waiting: %d); "
                    "trying again",
                    kind(error),
                    len(batch),
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
            self.failing = None
            got = len(claimed)
            self.runner.take(claimed)
            asked = min(free, sum(one["cap"] for one in wanted))
            if wanted and got < asked and state.wakes == wakes:
                # Fewer than it could take, and nothing new since it asked: there is
                # no work for us until a notification, a timer, a limited name's place
                # coming free, or the poll interval says otherwise.
                state.look = False
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
        ids: list[str] = []
        attempts: list[str] = []
        others: list[str] = []
        for one in batch:
            if one.status == "completed" and one.result is None:
                ids.append(one.id)
                attempts.append(str(one.attempts))
            elif one.status == "completed":  # its result is JSON text already: put together
                others.append(
                    f'{{"id":"{one.id}","attempts":{one.attempts},"status":"completed",'
                    f'"result":{one.result}}}'
                )
            else:
                ending = {
                    "id": one.id,
                    "attempts": one.attempts,
                    "status": one.status,
                    "error": one.error,
                    "delay": one.delay,
                }
                if one.raises is not None:
                    ending["max_attempts"] = one.raises
                others.append(json.dumps(ending, ensure_ascii=False))
        sent = time.monotonic()
        try:
            cursor = conn.cursor(
                row_factory=_rows(self.options.max_attempts, sent, self.limits, self.timeouts)
            )
            await cursor.execute(
                self.statement(bool(batch or starts)),
                {
                    # Array literals: ids are uuid text and attempts digits, nothing to quote.
                    "completed": "{" + ",".join(ids) + "}",
                    "completed_attempts": "{" + ",".join(attempts) + "}",
                    "endings": "[" + ",".join(others) + "]",
                    "free": free,
                    "wanted": json.dumps(wanted, ensure_ascii=False),
                    "losing": "{" + ",".join(self.state.losing) + "}",
                    "idle": idle,
                    "starts": "{" + ",".join(r.id for r in starts) + "}",
                    "started_attempts": "{" + ",".join(str(r.attempts) for r in starts) + "}",
                    "now": self.connections.now(),
                },
            )
            rows: list[Any] = await cursor.fetchall()
        except psycopg.OperationalError:
            await self.connections.exchange_broke(conn)
            raise
        if self.registry.rate_limits:
            # Rows with a float: seconds until a rate-limited name's next free slot.
            waits = [row for row in rows if type(row) is float]
            if waits:
                self.state.wake_in(max(min(waits), 0.0))
                rows = [row for row in rows if type(row) is not float]
        claimed = [row for row in rows if type(row) is Run]
        if len(claimed) > 1:
            claimed.sort(key=order_of)
        if len(rows) - len(claimed) == len(batch):
            return claimed, None  # every ending recorded (the usual case)
        return claimed, {row for row in rows if type(row) is not Run}

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


COLUMNS = (
    "id",
    "attempts",
    "name",
    "args",
    "max_attempts",
    "timeout_ms",
    "priority",
    "run_at",
    "trace_context",
    "ahead",
)
"""The columns `sql.EXCHANGE` returns, read by name."""


def _rows(
    default_limit: int, sent: float, limits: dict[str, int], timeouts: dict[str, float]
) -> Any:
    """A row factory for `sql.EXCHANGE`, made once per statement: each row claimed
    becomes a `Run`, each ending recorded its (id, attempt), and each row of
    `sql.EXCHANGE_RATED` saying when a rate-limited name's next slot frees its seconds
    (a float). It finds every column
    by its name once, then reads each row's values by those places: as cheap as reading
    tuples by index (`namedtuple_row` added about 1 µs per job), and a column added to
    the statement cannot shift the others. A job stored without `max_attempts` or a
    timeout gets its handler's (`limits`, `timeouts`), else the worker's limit and none."""

    def factory(cursor: Any) -> RowMaker[Any]:
        at = {column.name: i for i, column in enumerate(cursor.description or ())}
        id_, attempts, name, args, limit, timeout, priority, run_at, trace, ahead = (
            at[c] for c in COLUMNS
        )

        def make(values: Any) -> Run | tuple[str, int] | float:
            if values[name] is None:
                return (values[id_], values[attempts])
            if values[id_] is None:  # `sql.EXCHANGE_RATED`: when a name's next slot frees
                return float(values[run_at])
            ms = values[timeout]
            job = values[name]
            return Run(
                values[id_],
                job,
                values[attempts],
                limits.get(job, default_limit) if values[limit] is None else values[limit],
                timeouts.get(job) if ms is None else ms / 1000,
                values[args],
                sent,
                order=(-values[priority], values[run_at]),
                ahead=values[ahead],
                trace_context=values[trace],
            )

        return make

    return factory
