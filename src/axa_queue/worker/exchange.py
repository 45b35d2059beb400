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

One statement carries many runs and names, so one bad value must not stop them all.
A statement that fails for a value it carried or read (`decisions.blames_values`) is
sent again in parts, only then (no extra round trip while statements go through):
the endings apart from the claim, then halves of each, down to the run or the name at
fault (`isolate`). A run whose ending cannot be recorded is recorded as failed, its
error saying why; one that cannot even be failed is kept apart, claimed (heartbeats
go on), and tried on its own every `decisions.RETRY_APART`. A name whose claim fails
on its own is left out of the claims for `decisions.SKIP_NAME` (its queued jobs whose
attempts are at the most an `integer` holds, which no claim can take, are failed
first: `sql.FAIL_UNCLAIMABLE`). Each is logged once; the health check says so once it
has lasted `stuck_after` (`trouble`).
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
from ..handlers.registry import Registry
from ..handlers.retries import cut_error, first_line, kind
from ..limits import AttemptLimits
from ..options import QueueOptions, to_seconds
from . import decisions
from .claims import RETRY_DATABASE, Claims
from .connections import Connections
from .run import Run, order_of
from .runs import Runner
from .state import Phase, State

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
        self.attempts = registry.attempt_limits(options.max_attempts)
        """Each claimed run's attempt limit (`limits.AttemptLimits`): the job's own, else
        its handler's, else the queue's."""
        self.timeouts = {
            name: to_seconds(h.policy.timeout, "timeout")
            for name, h in registry.handlers.items()
            if h.policy.timeout is not None
        }
        """The handlers' timeouts in seconds, for jobs stored without one."""
        self.failing: tuple[float, str] | None = None
        """Since when (monotonic) and why exchanges have failed, with none gone through
        since (see `Worker.trouble`)."""
        self.skipped: dict[str, tuple[float, float, str]] = {}
        """Names whose claim failed on its own: since when (monotonic, the first such
        failure), until when they are left out of claims, and why."""
        self.told: set[str] = set()
        """Names skipped whose failure was logged (once, until their claims go through)."""
        self.apart_since: tuple[float, str] | None = None
        """Since when (monotonic) and why endings have been kept apart (`State.apart`)."""
        self.apart_at = 0.0
        """When (monotonic) the endings kept apart are tried again."""

    def statement(self, recording: bool) -> str:
        """`sql.EXCHANGE`, or `sql.EXCHANGE_LIMITED` once this process has a global limit,
        or `sql.EXCHANGE_RATED` once it has a rate limit: a process without either sends
        the plain statement, whose plan is unchanged, or `sql.CLAIM` when it has nothing
        to record (no ending, no start to mark: `recording` false)."""
        if self.registry.limits.rate:
            return sql.EXCHANGE_RATED
        if self.registry.limits.global_:
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
        poll = self.options.poll_interval.total_seconds()
        loop = asyncio.get_running_loop()
        state = self.state
        while True:
            if state.apart and (time.monotonic() >= self.apart_at or state.phase >= Phase.CLOSING):
                await self._retry_apart()
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
            if self.skipped and wanted:
                wanted = self._unskipped(wanted)
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
                    if not decisions.blames_values(error.sqlstate):
                        raise
                    # One run's or one name's value, maybe: send the parts apart. What
                    # they record and claim comes out of `batch` and `starts` as it
                    # goes, so a failure of another kind on the way sends only the rest
                    # again.
                    got = await self.isolate(
                        batch, starts, wanted, free if wanted else 0, idle, error
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
            if claimed is not None:
                got = len(claimed)
                self.runner.take(claimed)
            if self.skipped and wanted:
                self._cleared(wanted)
            asked = min(free, sum(one["cap"] for one in wanted))
            if wanted and got < asked and state.wakes == wakes:
                # Fewer than it could take, and nothing new since it asked: there is
                # no work for us until a notification, a timer, a limited name's place
                # coming free, or the poll interval says otherwise.
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
            cursor = conn.cursor(row_factory=_rows(self.attempts, sent, self.timeouts))
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
        if self.registry.limits.rate:
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
        parts apart: the endings (and start marks) without the claim, halving a part
        that fails down to the run at fault, which is recorded as failed instead
        (`_fail_instead`); then the claim, halving the names down to the name at fault,
        which is skipped for a while (`_claim_alone`). What is recorded is told, and
        what is claimed taken, as each part goes through, and taken out of `batch` and
        `starts`: a failure of another kind raises, and the caller sends the rest
        again. Returns how many runs were claimed."""
        log.debug(
            "a statement failed because of a value it carried or read; sending its parts "
            "apart to find the run or name at fault",
            extra={"error": first_line(error), "endings": len(batch), "names": len(wanted)},
        )
        await self._record_apart(batch, starts)
        got = 0
        parts = [wanted] if wanted else []
        while parts and free > 0:
            part = parts.pop()
            try:
                claimed, _ = await self.send([], free, part, [], idle)
            except psycopg.Error as failure:
                if not decisions.blames_values(failure.sqlstate):
                    raise
                if len(part) > 1:
                    half = len(part) // 2
                    parts += [part[half:], part[:half]]  # the first half next
                    continue
                claimed = await self._claim_alone(part[0], free, idle, failure)
            self.runner.take(claimed)
            got += len(claimed)
            free -= len(claimed)
            idle = max(idle - len(claimed), 0)
        return got

    async def _record_apart(self, batch: list[Run], starts: list[Run]) -> None:
        """Record the endings of `batch`, and the start marks of `starts`, without a
        claim: all at once, else in halves, down to each ending that fails on its own.
        Each part recorded is taken out of `batch` (`starts` is emptied once sent)."""
        if not batch and not starts:
            return
        parts = [list(batch)]
        while parts:
            part = parts.pop()
            marks = list(starts)
            try:
                _, kept = await self.send(part, 0, [], marks)
            except psycopg.Error as error:
                if not decisions.blames_values(error.sqlstate):
                    raise
                if marks:
                    await self._mark_apart(marks)
                    starts.clear()
                if len(part) > 1:
                    half = len(part) // 2
                    parts += [part[half:], part[:half]]  # the first half next
                    continue
                if part:
                    await self._fail_instead(part[0], error)
            else:
                starts.clear()
                self._recorded(part, kept)
            gone = {id(one) for one in part}
            batch[:] = [one for one in batch if id(one) not in gone]

    async def _mark_apart(self, marks: list[Run]) -> None:
        """Mark runs claimed ahead started on their own; marks refused for a value are
        let go (a mark only says the handler started: without it, stale recovery of a
        dead process gives the attempt back, `GIVE_BACK_LIMIT` times at most)."""
        try:
            await self.send([], 0, [], marks)
        except psycopg.Error as error:
            if not decisions.blames_values(error.sqlstate):
                raise
            log.warning(
                "could not mark %d runs claimed ahead as started (%s); left unmarked",
                len(marks),
                kind(error),
                extra={"jobs": len(marks), "error": first_line(error)},
            )

    async def _fail_instead(self, one: Run, error: psycopg.Error) -> None:
        """`one`'s ending fails its statement even alone: record the run as failed, its
        error saying why, fenced as every ending; if even that fails for a value, keep
        it apart (claimed, tried again on its own)."""
        was = one.status
        one.result = None
        one.end(
            "failed",
            cut_error(
                f"the worker could not record how this run ended ({first_line(error)}), so "
                f"it failed the job instead (the run ended as {was})"
            ),
        )
        try:
            _, kept = await self.send([one], 0, [])
        except psycopg.Error as again:
            if not decisions.blames_values(again.sqlstate):
                raise
            log.error(
                "could not record how a run ended, nor fail its job: %s %s (attempt %d): "
                "%s; trying again on its own, while its claim is kept (stale recovery "
                "queues the job again if the worker stops first)",
                *one.named(),
                kind(again),
                extra={**one.fields(), "error": first_line(again), "ended": was},
            )
            self._set_apart(one, again)
            return
        log.error(
            "could not record how a run ended; its job is failed instead: %s %s (attempt %d): %s",
            *one.named(),
            kind(error),
            extra={**one.fields(), "error": first_line(error), "ended": was},
        )
        self._recorded([one], kept)

    def _set_apart(self, one: Run, error: psycopg.Error) -> None:
        state = self.state
        state.apart.append(one)
        now = time.monotonic()
        if self.apart_since is None:
            self.apart_since = (now, first_line(error))
        self.apart_at = now + decisions.RETRY_APART
        asyncio.get_running_loop().call_later(decisions.RETRY_APART, state.nudge.set)

    async def _retry_apart(self) -> None:
        """Try again, each on its own, the endings kept apart; once closing, those that
        still fail are let go (their jobs stay `running`, for stale recovery)."""
        state = self.state
        runs, state.apart = state.apart, []
        for i, one in enumerate(runs):
            try:
                _, kept = await self.send([one], 0, [])
            except psycopg.Error as error:
                if not decisions.blames_values(error.sqlstate):
                    state.apart.extend(runs[i:])
                    break
                state.apart.append(one)
                continue
            self._recorded([one], kept)
        if not state.apart:
            self.apart_since = None
        elif state.phase >= Phase.CLOSING:
            log.warning(
                "stopping: could not record how %d runs ended; stale recovery will "
                "queue their jobs again",
                len(state.apart),
                extra={"endings": len(state.apart)},
            )
            state.apart = []
            self.apart_since = None
        else:
            self.apart_at = time.monotonic() + decisions.RETRY_APART
            asyncio.get_running_loop().call_later(decisions.RETRY_APART, state.nudge.set)

    async def _claim_alone(
        self, one: dict[str, Any], free: int, idle: int, error: psycopg.Error
    ) -> list[Run]:
        """The claim of one name failed on its own: fail its queued jobs no claim can
        take (`sql.FAIL_UNCLAIMABLE`), each logged, and claim it again if there were
        any; else (or if it fails again) skip the name for `SKIP_NAME`."""
        name = str(one["name"])
        try:
            rows = await self.connections.on_side(
                sql.FAIL_UNCLAIMABLE,
                {
                    "name": name,
                    "error": "its attempts are at the most a job can count (2147483647): "
                    "no claim can take it again",
                    "now": self.connections.now(),
                },
            )
        except psycopg.Error:
            rows = []
        for row in rows:
            log.error(
                "job failed: %s %s (attempt %d): its attempts are at the most a job can "
                "count (2147483647), so no claim can take it again",
                name,
                row.id,
                row.attempts,
                extra={"job_id": row.id, "job": name, "attempt": row.attempts},
            )
        if rows:
            try:
                claimed, _ = await self.send([], free, [one], [], idle)
                return claimed
            except psycopg.Error as again:
                if not decisions.blames_values(again.sqlstate):
                    raise
                error = again
        self._skip(name, error)
        return []

    def _skip(self, name: str, error: psycopg.Error) -> None:
        """Leave `name` out of claims for `SKIP_NAME` (logged once, until its claims go
        through again), and look again then."""
        now = time.monotonic()
        since = self.skipped[name][0] if name in self.skipped else now
        self.skipped[name] = (since, now + decisions.SKIP_NAME, first_line(error))
        if name in self.told:
            log.debug("the claim of jobs of %s failed again", name, extra={"job": name})
        else:
            self.told.add(name)
            log.error(
                "could not claim jobs of %s: a value of its limits or of one of its jobs "
                "fails the claim (%s); left out of claims for %g s, the other names are "
                "claimed as usual",
                name,
                kind(error),
                decisions.SKIP_NAME,
                extra={"job": name, "error": first_line(error)},
            )
        self.state.wake_in(decisions.SKIP_NAME)

    def _unskipped(self, wanted: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`wanted` without the names skipped now (those whose time is up are tried)."""
        now = time.monotonic()
        skipped = self.skipped
        return [
            one for one in wanted if one["name"] not in skipped or skipped[one["name"]][1] <= now
        ]

    def _cleared(self, wanted: list[dict[str, Any]]) -> None:
        """The claim of `wanted` went through: its names whose time out was up (tried
        again, and gone through) are no longer skipped."""
        now = time.monotonic()
        for one in wanted:
            name = one["name"]
            if name in self.skipped and self.skipped[name][1] <= now:
                del self.skipped[name]
                if name in self.told:
                    self.told.discard(name)
                    log.info("jobs of %s are claimed again", name, extra={"job": name})

    def failing_since(self) -> list[float]:
        """Since when (monotonic) endings have been kept apart, and each name skipped
        now has failed (a name whose time out is up is not, until tried again). Safe
        from any thread."""
        apart, now = self.apart_since, time.monotonic()
        skipped = [since for since, until, _ in list(self.skipped.values()) if until > now]
        return skipped + ([] if apart is None else [apart[0]])

    def trouble(self, after: float) -> str | None:
        """Why some runs or names have not gone through for `after` seconds or more:
        endings kept apart, or names skipped; else None. Safe from any thread."""
        now = time.monotonic()
        if self.apart_since is not None and now - self.apart_since[0] >= after:
            count = len(self.state.apart)
            return (
                f"the worker has failed to record how {count} run{'' if count == 1 else 's'} "
                f"ended for {now - self.apart_since[0]:.0f} s: {self.apart_since[1]}"
            )
        late = sorted(
            (since, name, why)
            for name, (since, until, why) in dict(self.skipped).items()
            if now - since >= after and until > now
        )
        if late:
            since, _, why = late[0]
            names = ", ".join(repr(name) for _, name, _ in late)
            return (
                f"the worker has failed to claim jobs named {names} for {now - since:.0f} s: {why}"
            )
        return None

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


def _rows(attempts: AttemptLimits, sent: float, timeouts: dict[str, float]) -> Any:
    """A row factory for `sql.EXCHANGE`, made once per statement: each row claimed
    becomes a `Run`, each ending recorded its (id, attempt), and each row of
    `sql.EXCHANGE_RATED` saying when a rate-limited name's next slot frees its seconds
    (a float). It finds every column
    by its name once, then reads each row's values by those places: as cheap as reading
    tuples by index (`namedtuple_row` added about 1 µs per job), and a column added to
    the statement cannot shift the others. A job stored without `max_attempts` or a
    timeout gets its handler's (`attempts.of`, `timeouts`), else the worker's limit and
    none."""

    limit_of = attempts.of

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
                limit_of(job, values[limit]),
                timeouts.get(job) if ms is None else ms / 1000,
                values[args],
                sent,
                order=(-values[priority], values[run_at]),
                ahead=values[ahead],
                trace_context=values[trace],
            )

        return make

    return factory
