"""The dashboard while its database cannot be reached, or lacks the queue's tables:
which errors say so (`unavailable`), the `Outage` the dashboard is in (one log line
when it starts, one when it ends, never one per request). Meanwhile every page answers
503 (`app`'s guard): a plain page that loads itself again every `RETRY_EVERY` seconds,
or, to the overview's live part, a notice in its place, which keeps polling. Nothing
of the error but its class is shown; the pool connects again by itself
(`db.connector.QuickPool`), so the pages come back when the database does."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import psycopg

from ..errors import SchemaError
from ..handlers.retries import first_line, kind

__all__ = ["RETRY_EVERY", "Outage", "unavailable"]

log = logging.getLogger("axa_queue.web")

RETRY_EVERY = 5
"""Seconds after which the outage page loads itself again (and its `Retry-After`)."""

UNREACHABLE_STATES = ("08", "53", "57")
"""The SQLSTATE classes of a database that cannot serve at all: connection exceptions,
insufficient resources (too many clients), operator intervention (shutting down,
starting up)."""


def unavailable(error: BaseException) -> str | None:
    """What `error` says of the database, if it says it cannot serve the dashboard:
    `"unreachable"` (it cannot be reached, no connection came in time, it refuses
    connections or is shutting down) or `"tables"` (the queue's tables are missing or
    out of date); None for any other error, a page's own failure (a statement
    cancelled by `statement_timeout` is one)."""
    if isinstance(
        error, SchemaError | psycopg.errors.UndefinedTable | psycopg.errors.UndefinedColumn
    ):
        return "tables"
    if isinstance(error, psycopg.OperationalError) and not isinstance(
        error, psycopg.errors.QueryCanceled
    ):
        state = error.sqlstate
        if state is None or state[:2] in UNREACHABLE_STATES:
            return "unreachable"
    return None


@dataclass
class Outage:
    """Whether the dashboard's last try found its database unavailable: since when
    (`time.monotonic`), and why (`unavailable`'s word, and the error's class)."""

    since: float | None = None
    why: str = ""
    error_class: str = ""

    @property
    def down(self) -> bool:
        return self.since is not None

    def begins(self, why: str, error: BaseException) -> None:
        """The database found unavailable: logged once, at the outage's first failure."""
        if self.since is not None and self.why == why:
            return
        self.since, self.why, self.error_class = time.monotonic(), why, kind(error)
        log.warning(
            "the dashboard %s (%s); its pages answer 503 and try again until it is back",
            "cannot reach the database"
            if why == "unreachable"
            else "finds the queue's tables missing or out of date",
            self.error_class,
            extra={"error": first_line(error)},
        )

    def ends(self) -> None:
        """The database answered again: logged once, if it had been unavailable."""
        if self.since is None:
            return
        lasted = time.monotonic() - self.since
        self.since = None
        log.info("the dashboard reaches its database again, after %.0f s", lasted)
