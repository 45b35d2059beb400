"""The shelf of lent connections: each loop running async handlers is lent a
connection of the queue's pool (`db.lending`), taken on its first use; a loop that ends
leaves its lender here for the next loop to start, and the connection goes back to the
pool once no loop has taken it for `LEND_IDLE`.
"""

from __future__ import annotations

import asyncio
import logging

from ..db.lending import LEND_IDLE, Lender, Lending
from ..handlers.retries import describe, kind

__all__ = ["Shelf"]

log = logging.getLogger("axa_queue.worker")


class Shelf:
    """The lenders no loop uses now, some with a connection still checked out."""

    def __init__(self, lending: Lending | None) -> None:
        self.lending = lending
        """The connections of the queue's pool lent to the loops; none for a drain's."""
        self.lenders: list[Lender] = []
        """Lenders no loop uses now, some with a connection still checked out."""
        self.timer: asyncio.TimerHandle | None = None
        """Gives the connections on the shelf back to the pool (`LEND_IDLE`)."""
        self.giving: set[asyncio.Task[None]] = set()
        """Connections being given back by the timer."""

    def take(self) -> Lender | None:
        """A lender for a loop starting: one from the shelf (its connection, if any,
        still checked out), else a new one; none without a pool."""
        if self.lenders:
            return self.lenders.pop()
        return None if self.lending is None else Lender(self.lending)

    def put(self, lender: Lender) -> None:
        """Keep the lender of a loop that ended for the next loop; its connection goes
        back to the pool if no loop takes it within `LEND_IDLE`."""
        lender.run = None
        self.lenders.append(lender)
        if lender.conn is not None and self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(LEND_IDLE, self._unshelve)

    def _unshelve(self) -> None:
        """Give back the connections of the lenders on the shelf: no loop took them
        since they were shelved (a loop that did has it, not the shelf)."""
        self.timer = None
        idle = [one for one in self.lenders if one.conn is not None]
        if not idle:
            return
        self.lenders = [one for one in self.lenders if one.conn is None]
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
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        lenders, self.lenders = self.lenders, []
        await self._return_connections(lenders)
        if self.giving:
            await asyncio.wait(list(self.giving))
