"""The newsletter's queue and its handler: what `axa-queue worker newsletter.jobs:queue`
runs, in a process of its own.

The handler is a plain `def`: the worker runs it in a thread, with a connection of its
own to the app's database.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg

from axa_queue import Queue

queue = Queue()  # the DSN from AXA_QUEUE_DSN, else DATABASE_URL


@queue.handler("SendWelcome")
def send_welcome(args: dict[str, Any]) -> dict[str, str]:
    """Send a subscriber's welcome email (here: mark it sent) and say to whom."""
    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:  # commits at the block's end
        row = conn.execute(
            "UPDATE subscribers SET welcomed = true WHERE id = %s RETURNING email",
            (args["subscriber_id"],),
        ).fetchone()
    if row is None:
        raise LookupError(f"no subscriber {args['subscriber_id']}")
    return {"sent_to": row[0]}
