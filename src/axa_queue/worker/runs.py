"""Runs: starting claimed runs on the worker's loops, executing their handlers under
their timeouts, and saying how each ended.

At most `workers` loops run at once; a loop whose run ends goes on to the best run
waiting (claimed ahead, `prefetch`) in the same step, with no new task. Async handlers
are awaited on the event loop; sync ones run in `JobThreads`, with a copy of the run's
context. Each run is the current job (`current_job()`, its log records' job fields) for
its middleware and handler; with no middleware the handler is called directly. Each
loop running async handlers is lent a connection of the queue's pool (`lending`),
taken on first use and given back once no loop has used it for `LEND_IDLE`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any
from uuid import UUID

import psycopg

from .. import logs, sql
from ..context import JobContext, enter, leave
from ..db.lending import LEND_IDLE, Lender, Lending
from ..handlers.handler import JobHandler
from ..handlers.policies import NO_POLICY
from ..handlers.registry import Registry
from ..handlers.retries import describe, first_line, kind
from ..jobs.arguments import result_json
from ..middleware import through
from ..options import QueueOptions
from ..tracing import carrier_of
from . import decisions
from .claims import Claims
from .run import CANCELLED, Run, RunPhase, order_of
from .state import State
from .tasks import cancel_all, uncancel
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
        self.lending = None if pool is None else Lending(pool)
        """The connections of the queue's pool lent to the loops; none for a drain's."""
        self.shelf: list[Lender] = []
        """Lenders no loop uses now, some with a connection still checked out."""
        self.shelf_timer: asyncio.TimerHandle | None = None
        """Gives the connections on the shelf back to the pool (`LEND_IDLE`)."""
        self.giving: set[asyncio.Task[None]] = set()
        """Connections being given back by the timer."""
        self.crashed: tuple[float, str] | None = None
        """When (monotonic) a loop last failed unexpectedly, and why (`_failed`)."""

    def take(self, claimed: list[Run]) -> None:
        """Hold newly claimed runs: start at once those the claim stamped to start (the
        loops idle when it was sent), keep the runs claimed ahead waiting, best first,
        for the next loop to come free (and start them now if loops are free)."""
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
        self._start_waiting()

    def _start_waiting(self) -> None:
        """Start waiting runs on idle loops."""
        state = self.state
        while state.waiting and state.active < state.slots:
            one = state.waiting.pop(0)
            self._begin(one)
            one.task = asyncio.get_running_loop().create_task(self._loop(one))

    async def _loop(self, one: Run) -> None:
        """One loop: run `one`, then each run waiting when it ends, until none waits.
        Going on to the next run in the same step costs no task and no turn of the
        event loop."""
        task = asyncio.current_task()
        state = self.state
        lender = self._lender()
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
                self._shelve(lender)

    def _lender(self) -> Lender | None:
        """A lender for a loop starting: one from the shelf (its connection, if any,
        still checked out), else a new one; none without a pool."""
        if self.shelf:
            return self.shelf.pop()
        return None if self.lending is None else Lender(self.lending)

    def _shelve(self, lender: Lender) -> None:
        """Keep the lender of a loop that ended for the next loop; its connection goes
        back to the pool if no loop takes it within `LEND_IDLE`."""
        lender.run = None
        self.shelf.append(lender)
        if lender.conn is not None and self.shelf_timer is None:
            self.shelf_timer = asyncio.get_running_loop().call_later(LEND_IDLE, self._unshelve)

    def _unshelve(self) -> None:
        """Give back the connections of the lenders on the shelf: no loop took them
        since they were shelved (a loop that did has it, not the shelf)."""
        self.shelf_timer = None
        idle = [one for one in self.shelf if one.conn is not None]
        if not idle:
            return
        self.shelf = [one for one in self.shelf if one.conn is None]
        task = asyncio.get_running_loop().create_task(self._return_connections(idle))
        self.giving.add(task)
        task.add_done_callback(self.giving.discard)

    async def _return_connections(self, lenders: list[Lender]) -> None:
        for lender in lenders:
            try:
                await lender.give_back()
            except Exception as error:  # the pool closed: nothing to give back to
                log.debug(
                    "could not give a lent connection back (%s)",
                    kind(error),
                    extra={"error": describe(error)},
                )

    async def close(self) -> None:
        """Give every lent connection back to the pool (the worker stops; its loops are
        done)."""
        if self.shelf_timer is not None:
            self.shelf_timer.cancel()
            self.shelf_timer = None
        lenders, self.shelf = self.shelf, []
        await self._return_connections(lenders)
        if self.giving:
            await asyncio.wait(list(self.giving))

    def _begin(self, one: Run) -> None:
        self.state.active += 1
        if one.ahead:  # its row says not started: the next exchange says it is
            self.state.started(one)
        if one.timeout is not None:
            one.timer = asyncio.get_running_loop().call_later(
                one.timeout, one.stop, "timeout", f"timed out after {one.timeout:g} s"
            )
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "job started: %s %s (attempt %d)",
                *one.named(),
                extra={**one.fields(), "worker": self.identity},
            )

    def _release(self, one: Run) -> None:
        state = self.state
        if one.timer is not None:
            one.timer.cancel()
        state.active -= 1
        state.runs.pop(one.key, None)
        state.in_use[one.name] -= 1
        if self.registry.limits.holds_places(one.name):
            state.wake()  # a place under its limit came free: its jobs may be waiting

    async def _execute(self, one: Run, lender: Lender | None = None) -> None:
        """Run the handler to its end, its time limit, or the loss of its claim
        (`_invoke`), then take its outcome (`decisions.outcome`): record the ending, or
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
            one.phase = RunPhase.STARTING
            try:
                result = await self._invoke(one, handler, lender)
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
        taken = decisions.outcome(
            stopped=one.stopped,
            error=error,
            raised=raised,
            attempts=one.attempts,
            limit=one.limit,
            policy=NO_POLICY if handler is None else handler.policy,
            backoff=self.backoff,
            backoff_failed=functools.partial(self._backoff_failed, one),
        )
        if taken.taken == "lost":
            try:
                await asyncio.shield(self.claims.lose(one, taken.error or ""))
            finally:
                self._release(one)
            return
        self._release(one)
        if taken.taken == "cancelled":
            self._cancelled(one)
            return
        if taken.status != "completed":
            one.result = None
        self._log_ending(one, taken, raised if self.tracebacks and taken.traceback else None)
        del raised  # its traceback holds the handler's frames
        self.state.end(one.end(taken.status, taken.error, taken.delay, taken.max_attempts))
        if taken.status == "queued":
            self.state.wake_in(taken.delay)

    async def _invoke(self, one: Run, handler: JobHandler[Any], lender: Lender | None) -> Any:
        """Prove `one`'s claim if it may have expired, then call its handler (inside
        its middleware, if any, with its `JobContext` current, and the loop's lent
        connection handed out to an async one); returns what the handler returned, and
        raises what it raised. A claim found gone (`Claims.prove`) leaves the handler
        uncalled: `one` is then over, stopped, and this returns `None`."""
        if self.claims.doubtful(one) and not await self.claims.prove(one):
            return None
        one.phase = RunPhase.RUNNING
        if lender is not None and handler.is_async:
            lender.run = one  # inside this run, the pool hands out the lent connection
        else:
            lender = None
        job = self._job(one, lender)
        token = enter(job)
        try:
            if self.registry.middleware:
                return await through(
                    self.registry.middleware,
                    job,
                    functools.partial(self._call, handler, one.args_text, job),
                )
            if handler.coroutine_function is not None:  # awaited here: a coroutine less
                args = handler.decode(json.loads(one.args_text))
                if handler.takes_job:
                    return await handler.coroutine_function(args, job)  # type: ignore[call-arg]
                return await handler.coroutine_function(args)
            return await self._call(handler, one.args_text, job)
        finally:
            leave(token)
            if lender is not None:
                lender.run = None

    def _cancelled(self, one: Run) -> None:
        """`one`'s job was cancelled by a person under its attempt: the row says so (the
        heartbeat read it), a state no one moves a job out of, so nothing is written."""
        if one.started:
            self.state.stats[CANCELLED] += 1
            self.registry.tell(one.name, CANCELLED, one.seconds, one.fields())
        log.info(
            "job stopped: %s %s (attempt %d) was cancelled by a person while it ran; "
            "nothing of the run is recorded"
            if one.started
            else "job not started: %s %s (attempt %d) was cancelled by a person",
            *one.named(),
            extra=one.fields(),
        )

    def _log_ending(self, one: Run, taken: decisions.Outcome, trace: BaseException | None) -> None:
        """Log how `one` ended (a completion only at debug level), with the traceback of
        what its handler raised if `trace` is given."""
        if taken.taken == "completed":
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "job completed: %s %s (attempt %d) in %g s",
                    *one.named(),
                    round(one.seconds, 6),
                    extra={**one.fields(), "duration": round(one.seconds, 6)},
                )
        elif taken.taken == "snoozed":
            log.info(
                "job snoozed: %s %s (attempt %d) for %g s",
                *one.named(),
                taken.delay,
                extra={**one.fields(), "error": taken.error, "retry_in": taken.delay},
            )
        elif taken.taken == "retried":
            log.warning(
                "job failed, will retry: %s %s (attempt %d): %s; next try in %g s",
                *one.named(),
                taken.cause,
                taken.delay,
                extra={**one.fields(), "error": taken.error, "retry_in": taken.delay},
                exc_info=trace,
            )
        else:
            log.error(
                "job failed: %s %s (attempt %d): %s",
                *one.named(),
                taken.cause,
                extra={**one.fields(), "error": taken.error},
                exc_info=trace,
            )

    def _backoff_failed(self, one: Run, failure: Exception) -> None:
        """The backoff function of `one`'s handler raised: its job waits the queue's
        `retry_backoff` instead (`Policy.wait`), and this says so."""
        log.error(
            "the handler's backoff failed: %s %s (attempt %d): %s; the job waits the "
            "queue's retry_backoff instead",
            *one.named(),
            kind(failure),
            extra={**one.fields(), "error": describe(failure)},
        )

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
        taken = decisions.outcome(
            stopped=None,
            error=f"the worker failed while running it: {why}",
            raised=None,
            attempts=one.attempts,
            limit=one.limit,
            policy=NO_POLICY,
            backoff=self.backoff,
        )
        self.state.end(one.end(taken.status, taken.error, taken.delay))
        if taken.status == "queued":
            self.state.wake_in(taken.delay)

    def _job(self, one: Run, lender: Lender | None = None) -> JobContext:
        """The `JobContext` of `one`, about to run (its deadline from its timer; none
        past what a `datetime` holds, for a time limit stored in years)."""
        deadline = None
        if one.timer is not None:
            left = one.timer.when() - asyncio.get_running_loop().time()
            try:
                deadline = datetime.now(timezone.utc) + timedelta(seconds=left)
            except OverflowError:
                deadline = None
        return JobContext(
            UUID(one.id),
            one.name,
            one.attempts,
            one.limit,
            deadline,
            None if one.trace_context is None else carrier_of(one.trace_context),
            one,
            lender,
        )

    async def _call(self, handler: JobHandler[Any], args_text: str, job: JobContext) -> Any:
        """The innermost step of a run: decode the arguments and call the handler (in a
        thread of this worker if it is sync), inside the middleware when there is any,
        so a middleware sees a decoding failure as the run's failure too."""
        return await handler.call(handler.decode(json.loads(args_text)), job, self.executor)

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
        """Wait for jobs in progress (also those a claim in flight brings), aborting any
        still running at `deadline` (monotonic; the end of `shutdown_grace`)."""
        state = self.state
        told = False
        while state.runs or state.claiming:
            tasks = [r.task for r in state.runs.values() if r.task is not None]
            if not tasks:
                if deadline is not None and time.monotonic() >= deadline:
                    # A claim still in flight: its runs stay `running`, for stale recovery.
                    await self._give_back(self._forget_waiting())
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
                self.aborting = True
                await cancel_all(pending)
                await self._give_back(self._forget_waiting())

    def _forget_waiting(self) -> list[Run]:
        """Let go of runs claimed ahead that never started, and return them."""
        state = self.state
        forgotten, state.waiting = state.waiting, []
        for one in forgotten:
            state.runs.pop(one.key, None)
            state.in_use[one.name] -= 1
        return forgotten

    async def _give_back(self, runs: list[Run]) -> None:
        """Queue again at once, with their attempts given back, the runs claimed ahead
        that a stop let go of before their handler started (`sql.GIVE_BACK`, fenced by
        their attempts); if the database does not answer, stale recovery gives them
        back later (`sql.RECOVER_STALE`)."""
        runs = [one for one in runs if one.ahead]
        if not runs:
            return
        try:
            await self.claims.connections.on_side(
                sql.GIVE_BACK,
                {
                    "ids": "{" + ",".join(one.id for one in runs) + "}",
                    "attempts": "{" + ",".join(str(one.attempts) for one in runs) + "}",
                    "limits": "{" + ",".join(str(one.limit) for one in runs) + "}",
                    "now": self.claims.connections.now(),
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
