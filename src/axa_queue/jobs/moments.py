"""Times read from the database as epoch seconds, made Python `datetime`s: PostgreSQL
holds times Python cannot (past year 9999, before year 1, `infinity`), read as the ends
of Python's range instead (`jobs.model` re-exports these names)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import Decimal

__all__ = ["EARLIEST", "LATEST", "moment", "optional_moment"]

LATEST = datetime.max.replace(tzinfo=timezone.utc)
"""How a time after what Python's `datetime` holds (past year 9999, or `infinity`) is read."""
EARLIEST = datetime.min.replace(tzinfo=timezone.utc)
"""How a time before what Python's `datetime` holds (before year 1, or `-infinity`) is read."""

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_LATEST_MICROS = (LATEST - _EPOCH) // timedelta(microseconds=1)
_EARLIEST_MICROS = (EARLIEST - _EPOCH) // timedelta(microseconds=1)


def optional_moment(epoch: Decimal | float | None) -> datetime | None:
    """A time read as epoch seconds (how every read statement selects a `timestamptz`),
    as a UTC datetime; `None` stays `None`.

    PostgreSQL holds times Python's `datetime` cannot (past year 9999, before year 1,
    `infinity`), which rows written by the Rust crate or by hand may have; reading one
    directly would fail the whole statement, for every row it returns. Such a time is
    read as `LATEST` or `EARLIEST` (`datetime.max` or `datetime.min`, in UTC) instead.
    """
    if epoch is None:
        return None
    if isinstance(epoch, float):
        epoch = Decimal(repr(epoch)) if epoch == epoch else Decimal("NaN")
    if epoch.is_nan():
        return None
    if epoch.is_infinite():
        return LATEST if epoch > 0 else EARLIEST
    micros = int((epoch * 1_000_000).to_integral_value())
    if micros >= _LATEST_MICROS:
        return LATEST
    if micros <= _EARLIEST_MICROS:
        return EARLIEST
    return _EPOCH + timedelta(microseconds=micros)


def moment(epoch: Decimal | float | None) -> datetime:
    """`optional_moment` of a NOT NULL column."""
    found = optional_moment(epoch)
    return LATEST if found is None else found
