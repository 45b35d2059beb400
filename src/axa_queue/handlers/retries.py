"""Retry arithmetic and failure text: pure functions, no I/O.

Each retry waits twice as long as the last, starting from `retry_backoff`, capped
at an hour. The error text kept on a row is cut to 1024 bytes on a character
boundary, so a huge exception message cannot bloat the table.
"""

from __future__ import annotations

from datetime import timedelta

import psycopg

__all__ = [
    "MAX_BACKOFF",
    "MAX_ERROR_BYTES",
    "backoff",
    "cut_error",
    "describe",
    "first_line",
    "kind",
    "summary",
]

MAX_BACKOFF = timedelta(hours=1)
"""The longest wait between attempts."""

MAX_ERROR_BYTES = 1024
"""The longest error text kept on a row, in UTF-8 bytes."""


def backoff(base: timedelta, attempts: int) -> timedelta:
    """How long to wait before the attempt after `attempts` (1 for the first run),
    doubling each time from `base`, and never more than `MAX_BACKOFF`."""
    doublings = min(max(attempts - 1, 0), 16)
    return min(base * (1 << doublings), MAX_BACKOFF)


def cut_error(text: str) -> str:
    """`text` cut to at most `MAX_ERROR_BYTES` bytes of UTF-8, on a character boundary.

    A lone surrogate (from a surrogate-escaped file name, say) or a NUL character becomes
    `?`: the database cannot store either, and the statement that failed would take other
    jobs' results with it.
    """
    data = text.replace("\x00", "?").encode("utf-8", errors="replace")
    if len(data) <= MAX_ERROR_BYTES:
        return data.decode("utf-8")
    return data[:MAX_ERROR_BYTES].decode("utf-8", errors="ignore")


def _text(error: BaseException) -> str:
    """An error's message; for a database error, only PostgreSQL's primary message.

    Its DETAIL and CONTEXT (and the statement's parameters psycopg adds) may quote the
    data of the row or statement, `JSON data, line 1: {"token": ...` for one, and what
    is kept or logged must never hold a job's arguments.
    """
    if isinstance(error, psycopg.Error):
        primary = error.diag.message_primary
        if primary:
            return str(primary)
        lines = str(error).strip().splitlines()
        return lines[0] if lines else ""
    try:
        return str(error)
    except Exception:  # an exception whose message cannot be made (its __str__ raised)
        return "(its message could not be read)"


def describe(error: BaseException) -> str:
    """The text kept for a failed run: the exception's type and message (a database
    error's primary message only, without the DETAIL and CONTEXT that may quote data)."""
    message = _text(error)
    kind = type(error).__qualname__
    return f"{kind}: {message}" if message else kind


def kind(error: BaseException) -> str:
    """What a log message says of an error: its class's name, which is code. Its text
    (which a handler may have filled with anything, and a database error with a value)
    goes in the record's `error` field only, where the formatters print it."""
    return type(error).__qualname__


def first_line(error: BaseException) -> str:
    """The first line of an error's text; of a database error, its primary message
    (its DETAIL, CONTEXT and HINT, which may quote data, are left out)."""
    lines = _text(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def summary(error: BaseException, limit: int = 500) -> str:
    """What a log line says of a failure: the error's type and the first line of its
    message (of a database error, its primary message), at most `limit` characters."""
    lines = _text(error).strip().splitlines()
    kind = type(error).__qualname__
    return cut_error(f"{kind}: {lines[0]}" if lines else kind)[:limit]
