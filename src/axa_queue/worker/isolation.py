"""Isolation: one bad value holds up one job, or one name, never the exchange.

One statement carries many runs and names, so one bad value must not stop them all.
A statement that fails for a value it carried or read (`decisions.blames_values`) is
sent again in parts, only then (no extra round trip while statements go through):
the endings apart from the claim, then halves of each, down to the run or the name at
fault (`Isolation.isolate`). A run whose ending cannot be recorded is recorded as
failed, its error saying why; one that cannot even be failed is kept apart, claimed
(heartbeats go on), and tried on its own every `decisions.RETRY_APART`. A name whose
claim fails on its own is left out of the claims for `decisions.SKIP_NAME` (its queued
jobs whose attempts are at the most an `integer` holds, which no claim can take, are
failed first: `sql.FAIL_UNCLAIMABLE`). Each is logged once; the health check says so
once it has lasted `stuck_after` (`trouble`).

Every part goes through the exchange's own `send` (`Sender`): the same statement, the
same fencing by attempt.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import psycopg

from .. import sql
from ..handlers.retries import cut_error, first_line, kind
from . import decisions
from .connections import Connections
from .run import Run
from .skips import Skips
from .state import Phase, State

__all__ = ["Isolation", "Sender"]

log = logging.getLogger("axa_queue.worker")

Kept = set[tuple[str, int]] | None
"""The (id, attempt) of the endings a statement recorded, or `None` when all were."""


class Sender(Protocol):
    """What sends the exchange's statement (`Exchange.send`)."""

    async def send(
        self,
        batch: list[Run],
        free: int,
        wanted: list[dict[str, Any]],
        starts: list[Run] | None = None,
        idle: int = 0,
    ) -> tuple[list[Run], Kept]: ...


class Isolation:
    """Sends a failed statement's parts apart, and keeps what it found at fault: the
    endings kept apart (`State.apart`) and the names skipped (`Skips`)."""

    def __init__(
        self,
        state: State,
        connections: Connections,
        sender: Sender,
        take: Callable[[list[Run]], object],
        recorded: Callable[[list[Run], Kept], None],
        skips: Skips,
    ) -> None:
        self.state = state
        self.connections = connections
        self.sender = sender
        self.take = take
        """Holds the runs a part claimed (`Runner.take`)."""
        self.recorded = recorded
        """Counts and tells the endings a part recorded (`Exchange._recorded`)."""
        self.skips = skips
        """The names left out of claims, their claim failing on its own."""
        self.apart_since: tuple[float, str] | None = None
        """Since when (monotonic) and why endings have been kept apart (`State.apart`)."""
        self.apart_at = 0.0
        """When (monotonic) the endings kept apart are tried again."""

    def apart_due(self) -> bool:
        """Whether the endings kept apart are to be tried again now (their time has
        come, or the worker is closing)."""
        state = self.state
        return bool(state.apart) and (
            time.monotonic() >= self.apart_at or state.phase >= Phase.CLOSING
        )

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
                claimed, _ = await self.sender.send([], free, part, [], idle)
            except psycopg.Error as failure:
                if not decisions.blames_values(failure.sqlstate):
                    raise
                if len(part) > 1:
                    half = len(part) // 2
                    parts += [part[half:], part[:half]]  # the first half next
                    continue
                claimed = await self._claim_alone(part[0], free, idle, failure)
            self.take(claimed)
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
                _, kept = await self.sender.send(part, 0, [], marks)
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
                self.recorded(part, kept)
            gone = {id(one) for one in part}
            batch[:] = [one for one in batch if id(one) not in gone]

    async def _mark_apart(self, marks: list[Run]) -> None:
        """Mark runs claimed ahead started on their own; marks refused for a value are
        let go (a mark only says the handler started: without it, stale recovery of a
        dead process gives the attempt back, `GIVE_BACK_LIMIT` times at most)."""
        try:
            await self.sender.send([], 0, [], marks)
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
            _, kept = await self.sender.send([one], 0, [])
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
        self.recorded([one], kept)

    def _set_apart(self, one: Run, error: psycopg.Error) -> None:
        state = self.state
        state.apart.append(one)
        now = time.monotonic()
        if self.apart_since is None:
            self.apart_since = (now, first_line(error))
        self.apart_at = now + decisions.RETRY_APART
        asyncio.get_running_loop().call_later(decisions.RETRY_APART, state.nudge.set)

    async def retry_apart(self) -> None:
        """Try again, each on its own, the endings kept apart; once closing, those that
        still fail are let go (their jobs stay `running`, for stale recovery)."""
        state = self.state
        # Each stays in `state.apart` until recorded: while a try is on its way, the
        # heartbeat still keeps its claim and the health check still counts it.
        for one in list(state.apart):
            try:
                _, kept = await self.sender.send([one], 0, [])
            except psycopg.Error as error:
                if not decisions.blames_values(error.sqlstate):
                    break
                continue
            state.apart.remove(one)
            self.recorded([one], kept)
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
                claimed, _ = await self.sender.send([], free, [one], [], idle)
                return claimed
            except psycopg.Error as again:
                if not decisions.blames_values(again.sqlstate):
                    raise
                error = again
        self.skips.skip(name, error)
        return []

    def failing_since(self) -> list[float]:
        """Since when (monotonic) endings have been kept apart, and each name skipped
        now has failed (`Skips.failing_since`). Safe from any thread."""
        apart = self.apart_since
        return self.skips.failing_since() + ([] if apart is None else [apart[0]])

    def trouble(self, after: float) -> str | None:
        """Why some runs or names have not gone through for `after` seconds or more:
        endings kept apart, or names skipped (`Skips.trouble`); else None. Safe from
        any thread."""
        now = time.monotonic()
        if self.apart_since is not None and now - self.apart_since[0] >= after:
            count = len(self.state.apart)
            return (
                f"the worker has failed to record how {count} run{'' if count == 1 else 's'} "
                f"ended for {now - self.apart_since[0]:.0f} s: {self.apart_since[1]}"
            )
        return self.skips.trouble(after)
