"""The overview's history: jobs finished per minute (completed, failed, cancelled, per
name) over the last day, and the ready backlog, kept in the app's memory.

Finished jobs are read by whole-minute windows (`sql.WEB_FINISHED_PER_MINUTE`): at each
refresh every minute since the last refresh's (the one then current, which rows
committed later may still have joined; two minutes when pages keep it refreshed), the
whole last hour once a minute (`REREAD_HOUR_EVERY`: a job that failed again since is
counted in its new minute only), and one more `BACKFILL` minutes further back, until
the day is there (the day's chart fills in a few minutes). A refresh after a pause (no page
open for a while, or the database out of reach) reads every minute it missed, up to a
day, once. So a refresh of a dashboard in use reads at most a dozen minutes of
finished rows, and once a minute an hour's, however many millions retention keeps: at
60,000 jobs an hour, about 10 ms (five times as many rows for the hour). The marks of what was read move only once the reads succeeded: a refresh that
failed is read again whole by the next.

The ready backlog has no history in the database (a queued job's row says nothing of
how many were queued with it), so it is sampled at each refresh: its chart starts when
the dashboard did. A job retried after it failed leaves its minute's count as read.

A finished row whose time is not a minute of the day shown (`infinity`, `-infinity`, or
any time later than this minute, which another client may write) counts nowhere: the
statement leaves the infinite ones out, and a refresh drops the later ones, so none
stays in memory or counts as "in the last hour" for ever.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from .reads import Finished

__all__ = ["BACKFILL", "DAY", "HOUR", "History", "Series", "Tally"]

MINUTE = 60
HOUR = 60
"""Minutes in the hour chart."""
DAY = 24 * 60
"""Minutes in the day chart."""

BACKFILL = 10
"""Minutes of the past read at each refresh, until the day is there."""

REFRESH_EVERY = 2.0
"""Seconds between refreshes, whoever asks (several open pages share one)."""

REREAD_HOUR_EVERY = 60.0
"""Seconds between two reads of the whole last hour: a job counted in the minute it
failed, then retried and failed again, moves to its new minute (its row's time does),
and the hour read again counts it once."""


class Tally(NamedTuple):
    """Jobs finished, by how they ended."""

    completed: int = 0
    failed: int = 0
    cancelled: int = 0


@dataclass(frozen=True)
class Series:
    """One chart's values, oldest first, one per bucket, and each bucket's start."""

    starts: list[int]
    """Epoch seconds."""
    values: list[int]


@dataclass
class History:
    """What the overview's charts show; refreshed by `refresh`, shared by every page."""

    finished: dict[int, dict[str, Tally]] = field(default_factory=dict)
    """Minute start (epoch s) -> name -> what finished in that minute."""
    backlog: dict[int, int] = field(default_factory=dict)
    """Minute start -> ready jobs at the last sample in that minute."""
    back_to: int | None = None
    """The earliest minute read so far (None: nothing read yet)."""
    read_from: int | None = None
    """The first minute the last refresh read to the end (None: nothing read yet): the
    next refresh reads from there, so no minute between two refreshes is missed."""
    hour_read: float = float("-inf")
    """When (monotonic) the whole last hour was last read (`REREAD_HOUR_EVERY`)."""
    refreshed: float = float("-inf")
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def refresh(
        self,
        read: Callable[[int, int | None], Awaitable[list[Finished]]],
        ready: int,
        now: float | None = None,
    ) -> None:
        """Read what finished since the last refresh (and `BACKFILL` more minutes of the
        past, until the day is there) with `read(since, until)`, and sample the
        backlog `ready`."""
        async with self.lock:
            clock = time.monotonic()
            if clock - self.refreshed < REFRESH_EVERY:
                return
            self.refreshed = clock
            wall = time.time() if now is None else now
            current = int(wall // MINUTE * MINUTE)
            self.backlog[current] = ready
            recent = current - MINUTE
            oldest = current - DAY * MINUTE
            start = recent if self.read_from is None else max(min(self.read_from, recent), oldest)
            whole_hour = clock - self.hour_read >= REREAD_HOUR_EVERY
            if whole_hour:
                start = min(start, current - HOUR * MINUTE)
            windows: list[tuple[int, int | None]] = [(start, None)]
            back_to = start if self.back_to is None else min(self.back_to, start)
            if back_to > oldest:
                windows.append((back_to - BACKFILL * MINUTE, back_to))
                back_to -= BACKFILL * MINUTE
            for since, until in windows:
                rows = await read(since, until)
                end = current + MINUTE if until is None else until
                for minute in range(since, end, MINUTE):
                    self.finished.pop(minute, None)
                for row in rows:
                    if row.minute > current:
                        continue  # finished in the future: a time another client wrote
                    self.finished.setdefault(row.minute, {})[row.name] = Tally(
                        row.completed, row.failed, row.cancelled
                    )
            self.read_from, self.back_to = current, back_to
            if whole_hour:
                self.hour_read = clock
            for kept in (self.finished, self.backlog):
                for minute in [m for m in kept if m < oldest]:
                    del kept[minute]

    def recent_by_name(self, minutes: int = HOUR, now: float | None = None) -> dict[str, Tally]:
        """Jobs finished in the last `minutes` minutes, per name."""
        wall = time.time() if now is None else now
        since = int(wall // MINUTE * MINUTE) - (minutes - 1) * MINUTE
        found: dict[str, Tally] = {}
        for minute, names in self.finished.items():
            if minute >= since:
                for name, counts in names.items():
                    total = found.get(name, Tally())
                    found[name] = Tally(
                        total.completed + counts.completed,
                        total.failed + counts.failed,
                        total.cancelled + counts.cancelled,
                    )
        return found

    def series(self, what: str, minutes: int, per: int, now: float | None = None) -> Series:
        """The last `minutes` minutes of `what` (`completed`, `failed`, or `backlog`: the
        last sample of each bucket), in buckets of `per` minutes."""
        wall = time.time() if now is None else now
        current = int(wall // MINUTE * MINUTE)
        first = current - (minutes - per) * MINUTE
        first -= first % (per * MINUTE)
        starts = list(range(first, current + 1, per * MINUTE))
        values = []
        for start in starts:
            bucket = range(start, start + per * MINUTE, MINUTE)
            if what == "backlog":
                samples = [self.backlog[m] for m in bucket if m in self.backlog]
                values.append(samples[-1] if samples else 0)
            else:
                values.append(
                    sum(
                        c.completed if what == "completed" else c.failed
                        for m in bucket
                        for c in self.finished.get(m, {}).values()
                    )
                )
        return Series(starts, values)
