"""Middleware: code that wraps every run of this process's worker, around its handler.

`@queue.middleware` registers `async def mw(job: JobContext, call_next)`; `await
call_next()` runs the rest of the chain (the next middleware, and at its end the
handler, on the loop or in its thread) and returns the handler's return value. The
first registered is the outermost. What a middleware raises is the run's outcome,
as if the handler had raised it; a middleware that does not call `call_next` skips
the handler. The run's timeout, fencing and heartbeats stay around the whole chain.

With no middleware registered the worker calls the handler directly: no chain is
built for a run.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .context import JobContext
from .errors import OptionsError

__all__ = ["CallNext", "Middleware", "check", "through"]

CallNext = Callable[[], Awaitable[Any]]
"""What a middleware is given to go on: call it and await it for the handler's value."""

Middleware = Callable[[JobContext, CallNext], Awaitable[Any]]
"""`async def mw(job, call_next)`: wraps each run. What it returns is not used: the
run's value is the handler's, as `call_next()` returned it."""


def check(fn: object) -> None:
    """Refuse what cannot be a middleware, when it is registered, with what to write."""
    inner = fn
    while isinstance(inner, functools.partial):
        inner = inner.func
    if not callable(fn) or not (
        inspect.iscoroutinefunction(inner)
        or inspect.iscoroutinefunction(getattr(inner, "__call__", None))  # noqa: B004
    ):
        raise OptionsError(
            f"expected a middleware to be an async function taking (job, call_next), "
            f"got: {fn!r}; write it as `async def mw(job, call_next): return await call_next()`"
        )


async def through(chain: Sequence[Middleware], job: JobContext, handler: CallNext) -> Any:
    """Run `handler` inside `chain`, the first outermost. Returns the handler's own
    value, whatever the middleware return (`None` if one did not call `call_next`), so
    a middleware that forgets `return` does not lose the job's result."""
    run = _Run(chain, job, handler)
    await run.next()
    return run.value


class _Run:
    """One run's way through the chain: where it is, and the handler's value."""

    __slots__ = ("at", "chain", "handler", "job", "value")

    def __init__(self, chain: Sequence[Middleware], job: JobContext, handler: CallNext) -> None:
        self.chain = chain
        self.job = job
        self.handler = handler
        self.at = 0
        self.value: Any = None

    async def next(self) -> Any:
        at = self.at
        if at == len(self.chain):
            self.at = at + 1  # a second call_next from the innermost middleware: refused below
            self.value = await self.handler()
            return self.value
        if at > len(self.chain):
            raise RuntimeError(
                "call_next() was called twice in one run: a middleware may run the rest "
                "of the chain once; to try again, let the job retry (max_attempts)"
            )
        self.at = at + 1
        return await self.chain[at](self.job, self.next)
