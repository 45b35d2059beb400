"""Cron expressions: checking one, and its next time in a zone.

The parsing and the calendar arithmetic are `cronsim`'s (`pip install 'axa-queue[cron]'`),
and zones are the standard library's `zoneinfo` (IANA names); this is the only module
that imports `cronsim`, and `schedules` imports this one only when a cron schedule is
made or ticked.

Daylight saving, as cronsim does it (the way Debian's cron does): an expression with
a fixed minute and hour (`30 2 * * *`) follows the wall clock, once a day. On the
night the clocks go forward, a time in the skipped hour runs at the first minute after
the gap (02:30 runs at 03:00); on the night they go back, a time in the repeated hour
runs once, the first time the clock shows it. An expression with `*` (or a step such
as `*/15`) in the minute or hour field follows real time: an hourly job runs every
hour, twice in the repeated hour and never in the skipped one.
"""

from __future__ import annotations

import re
import zoneinfo
from datetime import datetime, timezone

from cronsim import CronSim, CronSimError

from ..errors import ScheduleError

__all__ = ["FIELDS", "check", "next_after", "zone_of"]

FIELDS = ("minute", "hour", "day of month", "month", "day of week")
"""The five fields of an expression, in order."""

_CRONSIM_FIELDS = {
    "minute": 0,
    "hour": 1,
    "day-of-month": 2,
    "month": 3,
    "day-of-week": 4,
}
"""cronsim's names for the fields ("Bad day-of-month"), by our index."""

_BAD_FIELD = re.compile(r"Bad ([a-z-]+)")


def zone_of(name: str, tz: object) -> zoneinfo.ZoneInfo:
    """The zone `tz` names (an IANA name such as "Europe/Paris", or a `ZoneInfo`), for
    the schedule `name`; `ScheduleError` naming it when there is no such zone."""
    if isinstance(tz, zoneinfo.ZoneInfo) and tz.key is not None:
        return tz
    if not isinstance(tz, str):
        raise ScheduleError(
            f"expected tz of schedule {name!r} to be an IANA time zone name such as "
            f"'Europe/Paris' (or a ZoneInfo made from one), got: {type(tz).__name__}"
        )
    try:
        return zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"the schedule {name!r} names an unknown time zone {tz!r}: give an IANA name "
            "such as 'Europe/Paris' or 'UTC' (on a system without a time zone database, "
            "pip install tzdata)"
        ) from None


def check(name: str, expression: object, zone: zoneinfo.ZoneInfo) -> str:
    """`expression` with single spaces, once cronsim parsed it and found a time it is
    due; `ScheduleError` naming the bad field otherwise. Five fields only: minute,
    hour, day of month, month, day of week (cronsim's six-field form, with seconds
    first, is refused: a schedule is ticked once per poll, not each second)."""
    if not isinstance(expression, str):
        raise ScheduleError(
            f"expected the cron expression of schedule {name!r} to be a string such as "
            f"'0 3 * * *', got: {type(expression).__name__}"
        )
    parts = expression.split()
    if len(parts) != len(FIELDS):
        raise ScheduleError(
            f"the cron expression {expression!r} of schedule {name!r} has {len(parts)} "
            f"field{'' if len(parts) == 1 else 's'}; give five: {', '.join(FIELDS)} (such as '0 3 * * *')"
        )
    text = " ".join(parts)
    try:
        CronSim(text, datetime.now(zone))
    except CronSimError as error:
        found = _BAD_FIELD.fullmatch(str(error))
        index = _CRONSIM_FIELDS.get(found[1]) if found else None
        if index is None:
            raise ScheduleError(
                f"the cron expression {text!r} of schedule {name!r} is not valid ({error})"
            ) from None
        raise ScheduleError(
            f"the cron expression {text!r} of schedule {name!r} has a bad {FIELDS[index]} "
            f"field: {parts[index]!r}"
        ) from None
    if next_after(text, zone, datetime.now(timezone.utc)) is None:
        raise ScheduleError(
            f"the cron expression {text!r} of schedule {name!r} is never due "
            "(no matching day in the next fifty years)"
        )
    return text


def next_after(expression: str, zone: zoneinfo.ZoneInfo, after: datetime) -> datetime | None:
    """The first time `expression` is due in `zone` strictly after `after` (aware), in
    UTC; `None` if none within fifty years.

    cronsim counts a wall-clock expression on naive local times, so from inside a
    repeated hour it can answer a time already past (02:30 at its first showing, asked
    from 02:10 at the second); such times are passed over, so the answer is always
    later than `after` and each time is given once."""
    times = CronSim(expression, after.astimezone(zone))
    for found in times:
        moment = found.astimezone(timezone.utc)
        if moment > after:
            return moment
    return None
