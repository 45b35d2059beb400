"""The listener: wakes the exchange loop on LISTEN/NOTIFY, reconnecting when it drops.

A notification carries the schema of the job's table and, for a delayed job, the
seconds until it is due; the exchange looks for work then (woken at once, it runs
before the listener waits for the next notification: that wait is off the path from
a notification to a claim). One on `CANCEL_CHANNEL`
names a running job a person cancelled: the heartbeat checks it at once.
"""

from __future__ import annotations

import asyncio
import logging

import psycopg

from .. import sql
from ..db.connector import Connector
from ..handlers.retries import kind
from ..options import QueueOptions
from . import decisions
from .state import State
from .tasks import Troubles, lasting, summary

__all__ = ["listen"]

log = logging.getLogger("axa_queue.worker")


async def listen(
    connector: Connector, schema: str, state: State, troubles: Troubles, options: QueueOptions
) -> None:
    """Listen until cancelled; failures are reported (`Troubles`: the health check) and
    logged (the first at once, then one every `SAID_EVERY`, and its end), and it tries
    again."""
    pause = 0.1
    while True:
        try:
            conn = await connector.connect(session=False)
            async with conn:
                # The cancels first: the session's last statement, which others can
                # read in pg_stat_activity, says the wake-ups are heard.
                await conn.execute(sql.LISTEN_CANCEL)
                await conn.execute(sql.LISTEN)
                pause = 0.1
                lasted = troubles.cleared("listener")
                if lasted is not None:
                    log.info("listening for notifications again, after %.1f s", lasted)
                    state.database_back()
                state.wake()  # anything queued while we were not listening
                async for note in conn.notifies():
                    if note.channel == sql.CANCEL_CHANNEL:
                        state.check_soon(note.payload)
                        continue
                    there, _, delay = note.payload.rpartition(" ")
                    if there != schema:
                        continue
                    try:
                        state.wake_in(float(delay or 0))
                    except ValueError:
                        state.wake()
                    if state.nudge.is_set():
                        # Let the exchange loop send its claim first: waiting for the
                        # next notification (psycopg's reader, timer and future) is
                        # then done while the claim is on its way, not before it.
                        await asyncio.sleep(0)
        except psycopg.Error as error:
            lasted = troubles.failed("listener", error)
            if lasted is not None:  # the first, then one every `SAID_EVERY`
                log.warning(
                    "lost the notification connection to the database (%s%s); polling until it is back",
                    kind(error),
                    lasting(lasted),
                    extra={"error": summary(error)},
                )
        except Exception as error:
            lasted = troubles.failed("listener", error)
            if lasted is not None:
                log.error(
                    "the listener failed (%s%s); polling until it is back",
                    kind(error),
                    lasting(lasted),
                    extra={"error": summary(error), "retry_in": pause},
                )
        await asyncio.sleep(pause)
        pause = decisions.next_retry(pause, min(options.poll_interval.total_seconds(), 5.0))
