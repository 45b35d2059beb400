"""Invoking a run's handler: its claim proved first if it may have expired, its
`JobContext` current (`current_job()`, its log records' job fields) for its middleware
and handler, the loop's lent connection handed out inside an async one (`shelf`).

Async handlers are awaited on the event loop; sync ones run in `JobThreads`, with a copy
of the run's context. With no middleware the handler is called directly (an async one
awaited here: a coroutine less per run). What the handler returns is returned, what it
raises raised: how the run is taken is `decisions.outcome`'s to say.
"""

from __future__ import annotations

import asyncio
import functools
import json
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

from ..context import JobContext, enter, leave
from ..db.calls import Call, send_async
from ..db.lending import Lender
from ..handlers.handler import JobHandler
from ..handlers.registry import Registry
from ..jobs.steps import RunLink
from ..middleware import through
from ..tracing import carrier_of, links_of
from .claims import Claims
from .run import RUNNING, Run
from .threads import JobThreads

__all__ = ["Invoke"]


class Invoke:
    """Calls the handlers of one worker's runs (`call`)."""

    def __init__(
        self, registry: Registry, claims: Claims, executor: JobThreads, pool: Any = None
    ) -> None:
        self.registry = registry
        self.claims = claims
        self.executor = executor
        """The threads of sync handlers."""
        self.pool = pool
        """The queue's pool, where a handler's `parent_results()` reads and its steps
        are read and recorded (inside an async run, the connection lent to it); `None`
        for a drain's worker, which sends them on its side connection."""

    async def send(self, call: Call[Any]) -> Any:
        """Send a run's `call` (its parents' results, its steps: `RunLink.send`) and
        return what it read."""
        if self.pool is None:
            rows = await self.claims.connections.on_side(call.query, call.params)
            return call.read(rows, len(rows))
        async with self.pool.connection() as conn:
            return await send_async(conn, call)

    async def call(self, one: Run, handler: JobHandler[Any], lender: Lender | None) -> Any:
        """Prove `one`'s claim if it may have expired, then call its handler (inside
        its middleware, if any, with its `JobContext` current, and the loop's lent
        connection handed out to an async one); returns what the handler returned, and
        raises what it raised. A claim found gone (`Claims.prove`) leaves the handler
        uncalled: `one` is then over, stopped, and this returns `None`."""
        if self.claims.doubtful(one) and not await self.claims.prove(one):
            return None
        one.phase = RUNNING
        if lender is not None and handler.is_async:
            lender.run = one  # inside this run, the pool hands out the lent connection
        else:
            lender = None
        job = self.job(one, lender)
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

    def job(self, one: Run, lender: Lender | None = None) -> JobContext:
        """The `JobContext` of `one`, about to run (its deadline from its timer; none
        past what a `datetime` holds, for a time limit stored in years)."""
        deadline = None
        if one.timer is not None:
            left = one.timer.when() - asyncio.get_running_loop().time()
            try:
                deadline = datetime.now(timezone.utc) + timedelta(seconds=left)
            except OverflowError:
                deadline = None
        job_id = UUID(one.id)
        traced = one.trace_context
        return JobContext(
            job_id,
            one.name,
            one.attempts,
            one.limit,
            deadline,
            None if traced is None else carrier_of(traced),
            () if traced is None else links_of(traced),
            one,
            lender,
            RunLink(self.send, asyncio.get_running_loop(), job_id, one.attempts),
        )

    async def _call(self, handler: JobHandler[Any], args_text: str, job: JobContext) -> Any:
        """The innermost step of a run: decode the arguments and call the handler (in a
        thread of this worker if it is sync), inside the middleware when there is any,
        so a middleware sees a decoding failure as the run's failure too."""
        return await handler.call(handler.decode(json.loads(args_text)), job, self.executor)
