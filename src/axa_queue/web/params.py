"""What a request may ask: every query and form parameter of the dashboard is read and
checked here, by one function per kind (a choice, a job name, a code, a whole number, a
job id, a page cursor, or any text for a token), before any of it reaches a statement.

A parameter that its kind refuses raises `BadParameter`, which the pages answer with
400 and a page saying which parameter and what it should be, never echoing the value.
An empty one is as if it were absent (a form's blank field sends it so); one given more
than once is refused, since which copy counts would be a guess.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, Protocol, TypeVar
from uuid import UUID

from ..acts import check_code
from ..errors import NotACodeError, OptionsError
from ..jobs.model import check_name

__all__ = [
    "MAX_INTEGER",
    "BadParameter",
    "Params",
    "as_job_id",
    "check_cursor",
    "choice",
    "code",
    "cursor",
    "integer",
    "job_id",
    "job_ids",
    "moment",
    "name",
    "page_of",
    "text",
]

T = TypeVar("T")

MAX_INTEGER = 2**63 - 1
"""The largest whole number a parameter may be (a PostgreSQL bigint)."""


class Params(Protocol):
    """A request's query parameters or form fields (Starlette's `QueryParams`, `FormData`)."""

    def getlist(self, key: str) -> Sequence[object]: ...


class BadParameter(Exception):
    """A parameter its kind refuses: `parameter` names it, `expected` says what it
    should be (both are the dashboard's own words, never the value sent)."""

    def __init__(self, parameter: str, expected: str) -> None:
        self.parameter = parameter
        self.expected = expected
        super().__init__(f"the parameter {parameter!r} should be {expected}")


def _one(params: Params, parameter: str) -> str | None:
    """The parameter's one value, or None when absent or empty."""
    values = params.getlist(parameter)
    if len(values) > 1:
        raise BadParameter(parameter, "given once")
    if not values or values[0] == "":
        return None
    value = values[0]
    if not isinstance(value, str):  # a file, in a multipart form
        raise BadParameter(parameter, "text")
    return value


def text(params: Params, parameter: str) -> str | None:
    """Any text, given once (a token or a CSRF token: only ever compared), or None when
    absent."""
    return _one(params, parameter)


def choice(params: Params, parameter: str, values: Sequence[str]) -> str | None:
    """One of `values`, or None when absent."""
    value = _one(params, parameter)
    if value is not None and value not in values:
        raise BadParameter(parameter, "one of " + ", ".join(values))
    return value


def name(params: Params, parameter: str) -> str | None:
    """A job name, or a part of one (`jobs.check_name`: 1 to 200 characters, not blank,
    no NUL or lone surrogate), or None when absent."""
    value = _one(params, parameter)
    if value is None:
        return None
    try:
        return check_name(value)
    except OptionsError:
        raise BadParameter(
            parameter, "a job name: 1 to 200 characters, not blank, no NUL character"
        ) from None


def code(params: Params, parameter: str, *, strip: bool = False) -> str | None:
    """A code such as a `by` (`acts.check_code`: 1 to 200 visible characters, no space
    first or last, or with `strip` none once they are taken off), or None when absent."""
    value = _one(params, parameter)
    if value is not None and strip:
        value = value.strip(" ")
    if value is None:
        return None
    try:
        return check_code(value, parameter)
    except NotACodeError:
        raise BadParameter(
            parameter, "1 to 200 visible characters (no control, zero-width or bidi characters)"
        ) from None


_DIGITS = re.compile(r"[0-9]{1,19}")


def integer(params: Params, parameter: str, least: int = 1, most: int = MAX_INTEGER) -> int | None:
    """A whole number from `least` to `most`, written in ASCII digits, or None when
    absent (`str.isdigit` takes other digits, such as `²`, that `int` refuses)."""
    value = _one(params, parameter)
    if value is None:
        return None
    if _DIGITS.fullmatch(value) is None or not least <= int(value) <= most:
        raise BadParameter(parameter, f"a whole number from {least:,} to {most:,}")
    return int(value)


def as_job_id(value: str) -> str | None:
    """`value` as a job id's text, if it is one (a UUID in any form `uuid.UUID` reads,
    spaces around it aside); else None."""
    try:
        return str(UUID(value.strip()))
    except ValueError:
        return None


def job_id(params: Params, parameter: str) -> str | None:
    """A job id (a UUID, as text in any of the forms `uuid.UUID` reads), or None when
    absent."""
    value = _one(params, parameter)
    if value is None:
        return None
    found = as_job_id(value)
    if found is None:
        raise BadParameter(parameter, "a job id, a UUID like 0191f3c2-7a4e-4b7e-9c1d-2f1e3d4c5b6a")
    return found


def job_ids(params: Params, parameter: str, most: int) -> list[str]:
    """One to `most` job ids (the parameter given once for each), duplicates dropped."""
    values = [one for one in params.getlist(parameter) if one != ""]
    if not values:
        raise BadParameter(parameter, "at least one job")
    if len(values) > most:
        raise BadParameter(parameter, f"at most {most} jobs at once")
    found = [as_job_id(one) if isinstance(one, str) else None for one in values]
    if any(one is None for one in found):
        raise BadParameter(parameter, "job ids, UUIDs like 0191f3c2-7a4e-4b7e-9c1d-2f1e3d4c5b6a")
    return list(dict.fromkeys(one for one in found if one is not None))


_CURSOR = re.compile(
    r"(?P<year>[0-9]{4,6})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})"
    r"T(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})\.[0-9]{6}(?P<bc> BC)?"
)
_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def check_cursor(key: str) -> bool:
    """Whether `key` is a page cursor the job lists make (`sql.WEB_JOBS_NEWEST`'s
    `key`): a time in UTC as `YYYY-MM-DDTHH:MM:SS.ffffff` (a year of 4 to 6 digits, ` BC`
    after it for a year before 1), or `infinity` or `-infinity`, and one PostgreSQL
    holds (4714-11-24 BC to 294276-12-31): a page that ends on a row of any time
    PostgreSQL can hold is followed by the next."""
    if key in ("infinity", "-infinity"):
        return True
    found = _CURSOR.fullmatch(key)
    if found is None:
        return False
    year, month, day = (int(found[part]) for part in ("year", "month", "day"))
    bc = found["bc"] is not None
    if year == 0 or (bc and year > 4714) or (not bc and year > 294276):
        return False
    astronomical = 1 - year if bc else year  # 1 BC is year 0, a leap year
    leap = astronomical % 4 == 0 and (astronomical % 100 != 0 or astronomical % 400 == 0)
    if not 1 <= month <= 12 or not 1 <= day <= _DAYS[month - 1] + (leap and month == 2):
        return False
    if bc and year == 4714 and (month, day) < (11, 24):
        return False
    return int(found["hour"]) < 24 and int(found["minute"]) < 60 and int(found["second"]) < 60


def cursor(params: Params, parameter: str) -> str | None:
    """A job list's page cursor (`check_cursor`), or None when absent (the first page)."""
    value = _one(params, parameter)
    if value is not None and not check_cursor(value):
        raise BadParameter(
            parameter, "a page cursor, as the Next page link gives it: follow the page's links"
        )
    return value


_MOMENT = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]{1,6})?)?)?"
    r"(?:Z|[+-][0-9]{2}:[0-9]{2})?"
)


def moment(params: Params, parameter: str) -> datetime | None:
    """A moment, as a browser's date and time field sends it (`2026-12-06T04:15`, in
    UTC) or in ISO 8601 with its offset (`2026-12-06T05:15:00+01:00`), or a date alone
    (its midnight, UTC); or None when absent."""
    value = _one(params, parameter)
    if value is None:
        return None
    try:
        if _MOMENT.fullmatch(value) is None:
            raise ValueError(value)
        found = datetime.fromisoformat(value)
        # In UTC here: a time at the edge of what a datetime holds whose offset takes it
        # past year 1 or 9999 is refused as such, not found later.
        return (
            found.replace(tzinfo=timezone.utc)
            if found.tzinfo is None
            else found.astimezone(timezone.utc)
        )
    except (ValueError, OverflowError):
        raise BadParameter(
            parameter,
            "a date and time such as 2026-12-06T04:15 (UTC unless it gives its offset), "
            "between years 1 and 9999 in UTC",
        ) from None


def page_of(params: Params, items: Sequence[T], size: int) -> dict[str, Any]:
    """The page of `items` the parameter `page` asks for (the first unless given), `size`
    to a page: the items (`listed`), how many in all (`total`), and what `pager.html`
    reads (`page_number`, `pages`). A page past the last lists nothing."""
    page_number = integer(params, "page", most=10**9) or 1
    start = (page_number - 1) * size
    return {
        "listed": items[start : start + size],
        "total": len(items),
        "page_number": page_number,
        "pages": max(1, -(-len(items) // size)),
    }
