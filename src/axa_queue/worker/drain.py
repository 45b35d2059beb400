"""Draining: run, in this process, the ready jobs a queue handles until none is ready.

For tests (`Queue.drain`, `Queue.drain_sync`, `SyncQueue.drain`). A drain is a real
`Worker` on the queue's registry, narrowed to the names drained: the same claims,
fencing, timeouts, retries, observers and handler calls as production, with no
housekeeping, no schedule ticks and no LISTEN. It stops once its worker holds nothing
(every run ended, every ending written) and the database has no ready job of those
names: a job queued by a job is run too, in the same drain. A job whose retry waits
for its backoff, or queued for later, is left (`include_delayed=True` makes every such
job due at once, again after each round, until none waits).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .. import sql
from ..db.connector import Connector
from ..errors import DrainError, OptionsError
from ..handlers.handler import JobHandler
from ..handlers.registry import Registry
from ..options import Duration, to_seconds
from . import Phase, Worker

__all__ = ["IDLE_CHECK", "DrainResult", "drain", "drain_blocking", "drain_names"]

IDLE_CHECK = 0.005
"""Seconds between looks at whether the drain's worker has gone idle."""


@dataclass(frozen=True)
class DrainResult:
    """How the runs of one drain ended, each counted once its ending was recorded."""

    completed: int = 0
    """Runs whose handler returned."""
    retried: int = 0
    """Runs that failed with attempts left: their jobs are queued again after a backoff
    (and were run again in the same drain only with `include_delayed=True`)."""
    failed: int = 0
    """Runs that failed with no attempts left (or timed out on their last)."""
    needs_review: int = 0
    """Runs that lost their claim while their handler ran, whose jobs now wait for a
    person (`needs_review`)."""

    @property
    def total(self) -> int:
        """Every run counted above."""
        return self.completed + self.retried + self.failed + self.needs_review


class _Drained(Registry):
    """The queue's registry as its drain sees it: the same limits, observers and
    whatever else it holds, but only the handlers drained; and the ids of runs that
    lost their claim, noted as the worker tells its observers."""

    def __init__(self, registry: Registry, handlers: dict[str, JobHandler[Any]]) -> None:
        vars(self).update(vars(registry))
        self.handlers = handlers
        self.lost: list[str] = []

    def tell(self, name: str, outcome: str, seconds: float, fields: dict[str, Any]) -> None:
        if outcome == "lost":
            self.lost.append(str(fields["job_id"]))
        super().tell(name, outcome, seconds, fields)


def drain_names(
    registry: Registry, names: Iterable[str] | str | None
) -> dict[str, JobHandler[Any]]:
    """The handlers a drain runs: all of the registry's, or those of `names`, each of
    which must have one (an `OptionsError` names those that do not)."""
    if not registry.handlers:
        raise OptionsError(
            "drain() found no handlers to run: register them on the queue first; a "
            "SyncQueue drains the handlers of the Queue it was made from (queue.sync())"
        )
    if names is None:
        return dict(registry.handlers)
    wanted = [names] if isinstance(names, str) else list(names)
    missing = [name for name in wanted if name not in registry.handlers]
    if missing:
        raise OptionsError(
            f"drain() was given job names this queue has no handler for: {missing!r}; "
            f"it handles {sorted(registry.handlers)!r}"
        )
    return {name: registry.handlers[name] for name in wanted}


def _idle(worker: Worker) -> bool:
    """Whether the worker holds nothing and looks for nothing: every run it claimed has
    ended and been written, no fate of a lost run is being written, and its last claim
    came back short with nothing said since."""
    state = worker.state
    return (
        state.phase == Phase.WORKING
        and not state.look
        and not state.claiming
        and not state.runs
        and not state.endings
        and not state.sending
        and not state.apart
        and not state.losing
        and not worker.claims.tasks
    )


async def _settled(worker: Worker, running: asyncio.Task[None]) -> None:
    """Wait until the worker is idle; raise what its run raised, if it ended."""
    while not _idle(worker):
        if running.done():
            running.result()
            raise DrainError("the drain's worker stopped before its jobs were drained")
        await asyncio.sleep(IDLE_CHECK)


async def _until_drained(
    worker: Worker, names: list[str], include_delayed: bool, running: asyncio.Task[None]
) -> None:
    """Work until, the worker idle, no job of `names` is ready (and, with
    `include_delayed`, none waits either)."""
    connections = worker.connections
    while True:
        await _settled(worker, running)
        rows = await connections.on_side(sql.DRAIN_READY, {"names": names})
        if rows[0].ready:
            worker.state.wake()
            continue
        if include_delayed:
            moved = await connections.on_side(
                sql.DRAIN_DUE_NOW, {"names": names, "now": connections.now()}
            )
            if moved:
                worker.state.wake()
                continue
        if _idle(worker):  # nothing was claimed while the database was asked
            return


async def drain(
    registry: Registry,
    connector: Connector,
    names: Iterable[str] | str | None = None,
    *,
    timeout: Duration = 30,
    include_delayed: bool = False,
) -> DrainResult:
    """Run the ready jobs of `names` (default: every name `registry` handles) in this
    process until none is ready; see the module's docstring. Raises `DrainError` when
    jobs are still ready or running after `timeout` seconds: runs in progress are then
    aborted and left `running`, as a cancelled worker leaves them."""
    seconds = to_seconds(timeout, "timeout")
    handlers = drain_names(registry, names)
    connector.resolve()
    drained = _Drained(registry, handlers)
    worker = Worker(drained, connector, None, identity="drain")
    stop = asyncio.Event()
    running = asyncio.get_running_loop().create_task(worker.run(stop), name="axa-queue-drain")
    try:
        await asyncio.wait_for(
            _until_drained(worker, sorted(handlers), include_delayed, running), seconds
        )
        rows = await worker.connections.on_side(sql.DRAIN_REVIEW, {"ids": drained.lost})
    except asyncio.TimeoutError:
        stats = worker.stats
        running.cancel()
        with contextlib.suppress(BaseException):
            await running
        raise DrainError(
            f"drain() gave up after {seconds:g} s with jobs still ready or running "
            f"({stats['completed']} completed, {stats['retried']} retried, "
            f"{stats['failed']} failed so far): a handler may be stuck, or jobs keep "
            "queuing jobs; pass a longer timeout= if they need more time"
        ) from None
    except BaseException:
        running.cancel()
        with contextlib.suppress(BaseException):
            await running
        raise
    stop.set()
    await running
    stats = worker.stats
    return DrainResult(
        completed=stats["completed"],
        retried=stats["retried"],
        failed=stats["failed"],
        needs_review=int(rows[0].needs_review),
    )


def drain_blocking(
    registry: Registry,
    connector: Connector,
    names: Iterable[str] | str | None = None,
    *,
    timeout: Duration = 30,
    include_delayed: bool = False,
) -> DrainResult:
    """`drain` from synchronous code, on an event loop of its own in this thread (sync
    handlers still run in threads of their own, as a worker runs them). Refused on a
    thread whose event loop is running: there, `await queue.drain()`."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise DrainError(
            "a synchronous drain was called on a running event loop, which it would "
            "block: use `await queue.drain()` there"
        )
    return asyncio.run(
        drain(registry, connector, names, timeout=timeout, include_delayed=include_delayed)
    )
