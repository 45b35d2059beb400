"""Names left out of the claims: a name whose claim fails even on its own (a value of
its limits, or of one of its jobs, found by `Isolation`) is skipped for
`decisions.SKIP_NAME`, the other names claimed as usual; then it is tried again.
Logged once, until its claims go through again; the health check says so once it has
lasted `stuck_after`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg

from ..handlers.retries import first_line, kind
from . import decisions
from .state import State

__all__ = ["Skips"]

log = logging.getLogger("axa_queue.worker")


class Skips:
    """The names skipped now, since when and why; event loop only, but for the reads
    of `failing_since` and `trouble`."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.skipped: dict[str, tuple[float, float, str]] = {}
        """Names whose claim failed on its own: since when (monotonic, the first such
        failure), until when they are left out of claims, and why."""
        self.told: set[str] = set()
        """Names skipped whose failure was logged (once, until their claims go through)."""

    def skip(self, name: str, error: psycopg.Error) -> None:
        """Leave `name` out of claims for `SKIP_NAME` (logged once, until its claims go
        through again), and look again then."""
        now = time.monotonic()
        since = self.skipped[name][0] if name in self.skipped else now
        self.skipped[name] = (since, now + decisions.SKIP_NAME, first_line(error))
        if name in self.told:
            log.debug("the claim of jobs of %s failed again", name, extra={"job": name})
        else:
            self.told.add(name)
            log.error(
                "could not claim jobs of %s: a value of its limits or of one of its jobs "
                "fails the claim (%s); left out of claims for %g s, the other names are "
                "claimed as usual",
                name,
                kind(error),
                decisions.SKIP_NAME,
                extra={"job": name, "error": first_line(error)},
            )
        self.state.wake_in(decisions.SKIP_NAME)

    def unskipped(self, wanted: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`wanted` without the names skipped now (those whose time is up are tried)."""
        now = time.monotonic()
        skipped = self.skipped
        return [
            one for one in wanted if one["name"] not in skipped or skipped[one["name"]][1] <= now
        ]

    def cleared(self, wanted: list[dict[str, Any]]) -> None:
        """The claim of `wanted` went through: its names whose time out was up (tried
        again, and gone through) are no longer skipped."""
        now = time.monotonic()
        for one in wanted:
            name = one["name"]
            if name in self.skipped and self.skipped[name][1] <= now:
                del self.skipped[name]
                if name in self.told:
                    self.told.discard(name)
                    log.info("jobs of %s are claimed again", name, extra={"job": name})

    def failing_since(self) -> list[float]:
        """Since when (monotonic) each name skipped now has failed (a name whose time
        out is up is not, until tried again). Safe from any thread."""
        now = time.monotonic()
        return [since for since, until, _ in list(self.skipped.values()) if until > now]

    def trouble(self, after: float) -> str | None:
        """Which names have been skipped for `after` seconds or more, and why; else
        None. Safe from any thread."""
        now = time.monotonic()
        late = sorted(
            (since, name, why)
            for name, (since, until, why) in dict(self.skipped).items()
            if now - since >= after and until > now
        )
        if not late:
            return None
        since, _, why = late[0]
        names = ", ".join(repr(name) for _, name, _ in late)
        return f"the worker has failed to claim jobs named {names} for {now - since:.0f} s: {why}"
