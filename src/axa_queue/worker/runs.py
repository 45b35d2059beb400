"""Runs: starting claimed runs on the worker's loops, executing their handlers under
their timeouts, and taking how each ended.

At most `workers` loops run at once; a loop whose run ends goes on to the best run
waiting (claimed ahead, `prefetch`) in the same step, with no new task. A run's handler
is called by `invoke` (its context, its middleware, its thread or lent connection:
`shelf`); how a run that is over is taken is `decisions.outcome`'s to say, and the
runner does it: an ending to record, a loss for `Claims.lose`, or nothing for a job a
person cancelled. Finishing at a stop is `stopping`'s.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import TYPE_CHECKING, Any

from .. import logs
from ..db.lending import Lender, Lending
from ..handlers.policies import NO_POLICY
from ..handlers.registry import Registry
from ..handlers.retries import describe, kind
from ..jobs.arguments import result_json
from ..options import QueueOptions
from . import decisions, endings
from .claims import Claims
from .decisions import COMPLETED
from .invoke import Invoke
from .run import CANCELLED, STARTING, TIMEOUT, Run, order_of
from .shelf import Shelf
from .state import State
from .stopping import finish_runs
from .tasks import uncancel
from .threads import JobThreads

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

__all__ = ["Runner"]

log = logging.getLogger("axa_queue.worker")


class Runner:
    """Runs the claimed runs of one worker on its loops."""

    def __init__(
        self,
        state: State,
        claims: Claims,
        registry: Registry,
        options: QueueOptions,
        identity: str,
        pool: AsyncConnectionPool[Any] | None = None,
    ) -> None:
        self.state = state
        self.claims = claims
        self.registry = registry
        self.options = options
        self.identity = identity
        self.executor = JobThreads(state.slots, "axa-queue-job", registry.threads)
        self.tracebacks = options.log_tracebacks
        self.backoff = options.retry_backoff
        """The wait after a first failed try, doubling, for handlers without a backoff."""
        logs.add_job_fields()
        self.aborting = False
        """Whether this worker cancelled its runs' loops (an abort, or the grace period
        over): a `CancelledError` in a handler is then ours, not the handler's own."""
        self.shelf = Shelf(None if pool is None else Lending(pool))
        """The connections of the queue's pool lent to the loops; none for a drain's."""
        self.invoke = Invoke(registry, claims, self.executor, pool).call
        """Calls a run's handler (`Invoke.call`)."""
        self.crashed: tuple[float, str] | None = None
        """When (monotonic) a loop last failed unexpectedly, and why (`_failed`)."""

    def take(self, claimed: list[Run]) -> bool:
        """Hold newly claimed runs: start at once those the claim stamped to start (the
        loops idle when it was sent), keep the runs claimed ahead waiting, best first,
        for the next loop to come free (and start them now if loops are free). Returns
        whether it started any."""
        state = self.state
        ahead: list[Run] = []
        loop = asyncio.get_running_loop()
        for one in claimed:
            state.runs[one.key] = one
            state.in_use[one.name] += 1
            if one.ahead:
                ahead.append(one)
            else:  # idle loops when the claim was sent: at least as many now
                self._begin(one)
                one.task = loop.create_task(self._loop(one))
        if not ahead:
            pass
        elif not state.waiting or state.waiting[-1].order <= ahead[0].order:
            state.waiting.extend(ahead)  # the usual case: later claims are no better
        else:
            state.waiting = sorted([*state.waiting, *ahead], key=order_of)
        return self._start_waiting() or len(ahead) < len(claimed)

    def _start_waiting(self) -> bool:
        """Start waiting runs on idle loops; returns whether it started any."""
        state = self.state
        began = False
        while state.waiting and state.active < state.slots:
            one = state.waiting.pop(0)
            self._begin(one)
            one.task = asyncio.get_running_loop().create_task(self._loop(one))
            began = True
        return began

    async def _loop(self, one: Run) -> None:
        """One loop: run `one`, then each run waiting when it ends, until none waits.
        Going on to the next run in the same step costs no task and no turn of the
        event loop."""
        task = asyncio.current_task()
        state = self.state
        lender = self.shelf.take()
        try:
            while True:
                try:
                    await self._execute(one, lender)
                except Exception as failure:  # never the loop's end (see `_failed`)
                    self._failed(one, failure)
                if not state.waiting or state.active >= state.slots:
                    state.poke()
                    return
                one = state.waiting.pop(0)
                self._begin(one)
                one.task = task
                state.poke()
        finally:
            if lender is not None:
                self.shelf.put(lender)

    def _begin(self, one: Run) -> None:
        self.state.active += 1
        if one.ahead:  # its row says not started: the next exchange says it is
            self.state.started(one)
        if one.timeout is not None:
            one.timer = asyncio.get_running_loop().call_later(
                one.timeout, one.stop, TIMEOUT, f"timed out after {one.timeout:g} s"
            )
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "job started: %s %s (attempt %d)",
                *one.named(),
                extra={**one.fields(), "worker": self.identity},
            )

    def _release(self, one: Run, *, ending: bool = False) -> None:
        """Free `one`'s place. With `ending`, the caller adds its ending next
        (`State.end`), which brings an exchange: the look for work it asks for needs
        no wake of the exchange loop (at full speed, a wake for each run that ended only
        had the loop wait again)."""
        state = self.state
        if one.timer is not None:
            one.timer.cancel()
        state.active -= 1
        state.runs.pop(one.key, None)
        state.in_use[one.name] -= 1
        if state.held_back or self.registry.limits.holds_places(one.name):
            # A place under its limit, or a loop a held-back name may now fill, came
            # free: their jobs may be waiting.
            if ending:
                state.look_next()
            else:
                state.wake()

    async def _execute(self, one: Run, lender: Lender | None = None) -> None:
        """Run the handler to its end, its time limit, or the loss of its claim
        (`Invoke`), then take its outcome (`decisions.outcome`): record the ending, or
        the loss, or nothing for a cancelled job. Cancelled from outside (not by
        `Run.stop`), it aborts: the job stays `running` for stale recovery. A
        `CancelledError` the handler raises of its own is a failure of the attempt like
        any other."""
        handler = self.registry.handlers.get(one.name)
        error: str | None = None
        raised: BaseException | None = None
        started = time.monotonic()
        if handler is None:  # only handled names are claimed; kept for safety
            error = f"no handler for job {one.name}"
        elif one.stopped is None:  # else stopped while it waited: its handler never starts
            one.phase = STARTING
            try:
                result = await self.invoke(one, handler, lender)
                if result is not None:
                    one.result, error = result_json(result, one.name)
                del result  # kept, as JSON, in one.result
            except asyncio.CancelledError as failure:
                if one.stopped is None:
                    if self._aborted():
                        one.over()
                        self._release(one)
                        raise
                    # The handler's own CancelledError, not a stop: a failure like any other.
                    error = f"{describe(failure)} raised by the handler"
                    raised = failure
            except BaseException as failure:  # a job's failure, whatever it is
                error = describe(failure)
                raised = failure
            if one.cancelled:  # stopped by us (also when the handler swallowed it): forget it
                uncancel()
        one.over()
        one.seconds = time.monotonic() - started
        if one.started:
            self.state.ran(one.name, one.seconds)
        outcome = (
            COMPLETED  # what `decisions.outcome` says of it, without a call on the path of every run
            if error is None and one.stopped is None
            else decisions.outcome(
                stopped=one.stopped,
                error=error,
                raised=raised,
                attempts=one.attempts,
                limit=one.limit,
                policy=NO_POLICY if handler is None else handler.policy,
                backoff=self.backoff,
                backoff_failed=functools.partial(endings.backoff_failed, one),
            )
        )
        if outcome.kind == "lost":
            try:
                await asyncio.shield(self.claims.lose(one, outcome.error or ""))
            finally:
                self._release(one)
            return
        self._release(one, ending=outcome.kind != "cancelled")
        if outcome.kind == "cancelled":
            # The row says cancelled under this attempt (the heartbeat read it), a state
            # no one moves a job out of: nothing to write.
            if one.started:
                self.state.stats[CANCELLED] += 1
                self.registry.tell(one.name, CANCELLED, one.seconds, one.fields())
            endings.cancelled(one)
            return
        if outcome is not COMPLETED:
            one.result = None
            one.slept = outcome.kind == "slept"
            endings.ended(one, outcome, raised if self.tracebacks and outcome.traceback else None)
        elif log.isEnabledFor(logging.DEBUG):
            endings.ended(one, outcome, None)
        del raised  # its traceback holds the handler's frames
        self.state.end(one.end(outcome.status, outcome.error, outcome.delay, outcome.max_attempts))
        if outcome.status == "queued":
            self.state.wake_in(outcome.delay)

    def _failed(self, one: Run, failure: Exception) -> None:
        """What a loop does when running `one` raised, which nothing on the way of a run
        should (every handler's, middleware's and hook's failure is the run's; a
        backoff's falls back to the queue's): a bug, ours or of code we call. The loop
        goes on to the next run; `one` is let go and, unless its ending or the loss of
        its claim was already on its way, recorded as a failed try (queued again after
        the queue's `retry_backoff` while it has attempts left), so its job is not
        left `running` until stale recovery. Counted (`stats["loop_failures"]`) and
        shown by the health check for `stuck_after` seconds (`crashed`)."""
        state = self.state
        why = describe(failure)
        self.crashed = (time.monotonic(), why)
        state.stats["loop_failures"] += 1
        if one.timer is not None:
            one.timer.cancel()
        if one.key in state.runs:
            one.over()
            self._release(one)
        ended = (
            one.status != "running"
            or one.id in state.losing
            or (one.stopped is not None and one.stopped.kind == CANCELLED)
        )
        log.error(
            "a job loop failed running %s %s (attempt %d): %s; it goes on with the next run%s",
            *one.named(),
            kind(failure),
            "" if ended else ", and the run is recorded as a failed try",
            extra={**one.fields(), "error": why},
        )
        if ended:
            return
        one.over()
        one.result = None
        outcome = decisions.outcome(
            stopped=None,
            error=f"the worker failed while running it: {why}",
            raised=None,
            attempts=one.attempts,
            limit=one.limit,
            policy=NO_POLICY,
            backoff=self.backoff,
        )
        self.state.end(one.end(outcome.status, outcome.error, outcome.delay))
        if outcome.status == "queued":
            self.state.wake_in(outcome.delay)

    def _aborted(self) -> bool:
        """Whether the `CancelledError` a run's handler just ended with is this worker
        being aborted (its loop cancelled: `Queue.run` cancelled, or the grace period
        over), rather than one the handler raised of its own. Python 3.11+ counts the
        cancellations asked of the task; 3.10 relies on the worker's own flag."""
        if self.aborting:
            return True
        task = asyncio.current_task()
        cancelling = getattr(task, "cancelling", None)
        return cancelling is not None and cancelling() > 0

    async def finish(self, deadline: float | None) -> None:
        """Wait for jobs in progress, aborting any still running at `deadline`
        (monotonic; the end of `shutdown_grace`): `stopping.finish_runs`."""
        await finish_runs(self.state, self.claims.connections, deadline, self._abort)

    def _abort(self) -> None:
        """The grace period is over: what is cancelled from here on is ours."""
        self.aborting = True
