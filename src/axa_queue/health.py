"""Health: whether a queue can do its work, as one answer for a health check.

`Queue.health()` answers it, on the queue's own event loop: the database must answer
the queue's pool within `HEALTH_TIMEOUT`, the worker the queue runs in a task of an
application (`Queue.running()`, `Queue.lifespan`) must not have crashed, and its
statements must not all have failed for `stuck_after` seconds (see
`Worker.trouble`). `/health` of `axa-queue worker --metrics-port` serves the same
answer (`metrics.HealthCheck`); an ASGI app serves it from a route of its own.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["HEALTH_TIMEOUT", "Health"]

HEALTH_TIMEOUT = 5.0
"""Seconds the health check waits for the database before saying it is unreachable."""


class Health(NamedTuple):
    """A health check's answer: `ok`, and `reason`, `"ok"` or a line saying what is
    wrong (never a job's arguments or result). Unpacks as `ok, reason = ...`."""

    ok: bool
    reason: str
