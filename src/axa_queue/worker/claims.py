"""Claims: heartbeats, proofs before a run starts, and lost claims.

The heartbeat reports in for every run of this process in one statement per interval,
on the side connection; a run whose attempt no longer matches lost its claim, so its
handler is stopped. A run whose row another statement holds at that moment is busy:
neither stamped nor lost, looked at again by the next heartbeat (the heartbeat never
waits for a row lock, so it never deadlocks with the exchange). A run whose claim may have expired proves it with a heartbeat
before its handler starts.

However a claim is found lost (by a heartbeat, a proof, a run giving up for want of
contact, or an exchange refusing its ending), it takes one path, `Claims.lose`: the run
keeps its place (and its job is never claimed here again) until `sql.MARK_LOST` has
written its job's fate; only then is it counted and told to observers as `lost`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import psycopg

from .. import sql
from ..handlers.registry import Registry
from ..handlers.retries import cut_error, first_line, kind
from ..options import QueueOptions
from . import decisions
from .connections import Connections
from .run import CANCELLED, LOST, Run
from .state import State
from .tasks import Streak, beat_retry, lasting

__all__ = ["GAVE_UP", "MIN_HEARTBEAT", "RETRY_DATABASE", "Claims", "heartbeat_every"]

log = logging.getLogger("axa_queue.worker")

MIN_HEARTBEAT = 0.02
"""The shortest gap between heartbeats, in seconds, so a tiny setting cannot spin."""

RETRY_DATABASE = 0.5
"""Seconds between tries when the database does not answer a write that must land."""


def heartbeat_every(options: QueueOptions) -> float:
    """Seconds between a process's heartbeats: `heartbeat_interval`, at least
    `MIN_HEARTBEAT`."""
    return max(options.heartbeat_interval.total_seconds(), MIN_HEARTBEAT)


GAVE_UP = "it could not report in"
"""How the reason of a run stopped by its own worker for want of contact begins."""


@dataclass(frozen=True)
class Beat:
    """What a heartbeat found of the runs it reported for, each as (id, attempt)."""

    alive: set[tuple[str, int]]
    """Still claimed, and stamped."""
    cancelled: set[tuple[str, int]]
    """Cancelled by a person under the run's attempt."""
    busy: set[tuple[str, int]]
    """Held by another statement: still claimed as far as the heartbeat could see, not
    stamped this time."""


Spawn = Callable[[Coroutine[Any, Any, Any], str], "asyncio.Task[Any]"]


class Claims:
    """Keeps this process's claims proved, and writes the fate of those it lost."""

    def __init__(
        self,
        state: State,
        connections: Connections,
        registry: Registry,
        options: QueueOptions,
        spawn: Spawn,
    ) -> None:
        self.state = state
        self.connections = connections
        self.registry = registry
        self.options = options
        self.stale = options.stale_after.total_seconds()
        self.every = heartbeat_every(options)
        """Seconds between heartbeats (`heartbeat_every`), read once: a run's start asks
        whether its claim is doubtful (`doubtful`)."""
        self.beats_failing = Streak()
        """Heartbeats failing in a row, for the log (`Streak`)."""
        self.spawn = spawn
        self.tasks: set[asyncio.Task[Any]] = set()
        """The fates of lost runs being written."""

    # --- proofs and heartbeats -------------------------------------------------------

    async def beat(self, runs: list[Run]) -> Beat:
        """Report in for `runs` (`sql.HEARTBEAT`): the (id, attempt) of those still
        claimed and stamped, of those whose job a person cancelled under that attempt,
        and of those busy (their row held by another statement: neither stamped nor
        lost, looked at again next time). Any other run lost its claim."""
        rows = await self.connections.on_side(
            sql.HEARTBEAT,
            {
                "ids": "{" + ",".join(r.id for r in runs) + "}",
                "attempts": "{" + ",".join(str(r.attempts) for r in runs) + "}",
                "now": self.connections.now(),
            },
        )
        found = Beat(set(), set(), set())
        for row in rows:
            (found.busy if row.busy else found.cancelled if row.cancelled else found.alive).add(
                (row.id, row.attempts)
            )
        return found

    def doubtful(self, one: Run) -> bool:
        """Whether `one`'s claim may have expired (see `decisions.needs_proof`)."""
        return self._unproved(one.last_heard)

    def stalled(self) -> bool:
        """Whether the claims this process holds may have expired unknown to it: no
        heartbeat answered for as long as makes one run's claim doubtful (`State.fence`)."""
        return self._unproved(self.state.heard)

    def _unproved(self, last_heard: float) -> bool:
        return decisions.needs_proof(
            now=self.connections.monotonic(),
            last_heard=last_heard,
            stale=self.stale,
            broken_at=self.connections.broken_at,
            beat=self.every,
        )

    async def prove(self, one: Run) -> bool:
        """Whether `one`'s handler may start, once a heartbeat for it proves its claim
        (tried until the database answers, and while its row is busy: held a moment by
        another statement). A claim found gone stops the run (`one.stopped`; it is over,
        skipped) and this returns False: its handler never starts."""
        pause = MIN_HEARTBEAT
        while True:
            sent = self.connections.monotonic()
            try:
                found = await self.beat([one])
            except psycopg.Error as error:
                log.warning(
                    "could not check the claim of job %s %s (attempt %d) before starting "
                    "its run (%s); trying again",
                    *one.named(),
                    kind(error),
                    extra={**one.fields(), "error": first_line(error)},
                )
                await asyncio.sleep(RETRY_DATABASE)
                continue
            if one.key in found.busy:  # its holder is done in a moment: ask again
                await asyncio.sleep(pause)
                pause = min(pause * 2, RETRY_DATABASE)
                continue
            if one.key in found.alive:
                one.last_heard = sent
                return True
            if one.key in found.cancelled:
                one.skip(CANCELLED, "cancelled by a person before its handler started")
            else:
                one.skip(LOST, "its claim was gone before its handler started")
            return False

    async def heartbeat_loop(self) -> None:
        """Report in every `heartbeat_interval`, and at once when a notification says a
        job this process runs was cancelled (`State.check_soon`)."""
        every = self.every
        state = self.state
        retry: float | None = None  # after a failed beat, the wait before the next
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(state.check.wait(), every if retry is None else retry)
            state.check.clear()
            runs = [r for r in state.runs.values() if not r.done]
            # Endings not yet written keep their claims too: the run is still this
            # process's until its ending lands.
            ended = [*state.sending, *state.endings, *state.apart, *state.row_held]
            if not runs and not ended:
                state.heard = self.connections.monotonic()  # nothing held: nothing to prove
                retry = None
                continue
            sent = self.connections.monotonic()
            try:
                found = await self.beat(runs + ended)
            except psycopg.Error as error:
                retry = beat_retry(retry, every)
                lasted = self.beats_failing.failed()
                if lasted is not None:  # the first, then one every `SAID_EVERY`
                    log.warning(
                        "heartbeat failed (%s%s); jobs held: %d (running: %d)",
                        kind(error),
                        lasting(lasted),
                        len(runs) + len(ended),
                        len(runs),
                        extra={"error": first_line(error), "jobs": len(runs) + len(ended)},
                    )
                now = self.connections.monotonic()
                for one in runs:
                    if decisions.gives_up(
                        started=one.started, now=now, last_heard=one.last_heard, stale=self.stale
                    ):
                        one.lose(f"{GAVE_UP} for {self.stale:g} s")
                continue
            retry = None
            lasted = self.beats_failing.ended()
            if lasted is not None:
                log.info("heartbeats go through again, after %.1f s", lasted)
            state.heard = sent
            now = self.connections.monotonic()
            for one in runs:
                if one.key in found.alive:
                    one.last_heard = max(one.last_heard, sent)
                elif one.done:
                    pass
                elif one.key in found.busy:
                    # Its row held by another statement: looked at next time, unless it
                    # has not been stamped for `stale_after`. Then stale recovery may
                    # take it the moment the row is let go, so it gives its claim up,
                    # as a run that cannot reach the database does.
                    if decisions.gives_up(
                        started=one.started, now=now, last_heard=one.last_heard, stale=self.stale
                    ):
                        one.lose(f"{GAVE_UP} for {self.stale:g} s (its row was held)")
                elif one.key in found.cancelled:
                    one.stop(CANCELLED, "cancelled by a person")
                else:
                    one.lose("another worker or recovery took its claim")

    # --- lost claims -----------------------------------------------------------------

    def lose(self, one: Run, text: str) -> asyncio.Task[Any]:
        """The one path of a run that lost its claim (or gave it up): it keeps its place
        and its job is never claimed here again until `sql.MARK_LOST` has written the
        job's fate; then it is counted and told as `lost` (if its handler started), and
        what really became of its job is logged."""
        state = self.state
        state.losing[one.id] = one
        if one.key not in state.runs:  # its loop let it go (an ending refused): hold again
            state.in_use[one.name] += 1
        task = self.spawn(self._write_fate(one, text), "lost")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _write_fate(self, one: Run, text: str) -> None:
        """Decide the job's fate with `sql.MARK_LOST` (review, back to the queue, or left
        as another run left it), trying until the database answers, as the run must
        not be taken for a crash and retried; then count it and log what happened."""
        params = {
            "id": one.id,
            "attempts": one.attempts,
            "started": one.started,
            "gave_up": one.stopped is not None and one.stopped.reason.startswith(GAVE_UP),
            "ending": None if one.status == "running" else one.status,
            "ending_error": one.error,
            "error": cut_error(text),
            "max": one.limit,  # the run's attempt limit, as its claim resolved it
            "now": self.connections.now(),
            **self.connections.identity,
        }
        rows: list[Any] = []
        state = self.state
        try:
            while True:
                try:
                    rows = await self.connections.on_side(sql.MARK_LOST, params)
                    break
                except psycopg.Error as error:
                    log.error(
                        "could not write what became of job %s %s (attempt %d), whose run "
                        "lost its claim (%s); trying again",
                        *one.named(),
                        kind(error),
                        extra={**one.fields(), "error": first_line(error)},
                    )
                    await asyncio.sleep(RETRY_DATABASE)
        finally:
            if state.losing.get(one.id) is one:
                del state.losing[one.id]
            if one.key not in state.runs:  # the place it held comes free
                state.in_use[one.name] -= 1
                if self.registry.limits.holds_places(one.name):
                    state.wake()
                else:
                    state.poke()
        found = rows[0] if rows else None
        if one.started:
            # A person cancelled the job under this run's attempt (its ending refused, or
            # a cancel the heartbeat's snapshot missed): cancelled, not lost.
            outcome = (
                CANCELLED
                if found is not None
                and found.status == CANCELLED
                and found.attempts == one.attempts
                else "lost"
            )
            state.stats[outcome] += 1
            self.registry.tell(one.name, outcome, one.seconds, one.fields())
        level, message = decisions.fate(
            started=one.started,
            attempts=one.attempts,
            ending=one.status,
            status=None if found is None else found.status,
            found_attempts=None if found is None else found.attempts,
            became=None if found is None else found.became,
        )
        head, _, what = message.partition(": ")  # "job stopped: what became of it"
        log.log(
            level,
            "%s: %s %s (attempt %d): %s",
            head,
            *one.named(),
            what,
            extra={**one.fields(), "reason": text},
        )
