"""What the commands print for people: names and errors made safe for a terminal,
times, tables, and JSON for scripts."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import sys
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import click
from rich.console import Console

from ..jobs.model import EARLIEST, LATEST, JobInfo

__all__ = [
    "console",
    "lines",
    "one_line",
    "print_json",
    "short",
    "shown",
    "tries",
    "when",
]


def one_line(text: str) -> str:
    """`text` with every run of whitespace, line breaks included, as one space."""
    return " ".join(text.split())


def shown(text: str | None) -> str:
    """`text` as the CLI prints it to a terminal: every character that is not printable
    (control characters such as ESC, format characters such as the bidi overrides
    U+202E and U+2066 and the zero-width U+200B, line and paragraph separators, lone
    surrogates) written as a Python escape, `\\t`, `\\x1b`, `\\u202e`, `\\U000e0041`, so a name,
    an error, a `by` or a `reason` written by anyone can never move the cursor, recolour
    or reorder what an operator reads. The ASCII space and every visible character are
    kept as they are; `None` is shown as `-`. JSON output needs none of this."""
    if text is None:
        return "-"
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


_SHORT_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(ch: str) -> str:
    if ch in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[ch]
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def console() -> Console:
    """A console on the current stdout; markup off, so names and errors print as they are."""
    return Console(
        markup=False,
        highlight=False,
        emoji=False,
        width=None if sys.stdout.isatty() else 160,
    )


def _json_default(value: object) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    raise TypeError(f"cannot show a {type(value).__name__} as JSON")


def _fields(value: Any) -> Any:
    """Dataclasses (and lists and dicts of them) as plain dicts, for JSON."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _fields(dataclasses.asdict(value))
    if isinstance(value, list):
        return [_fields(v) for v in value]
    if isinstance(value, dict):
        return {k: _fields(v) for k, v in value.items()}
    if isinstance(value, timedelta):  # one at infinity (a row at `-infinity`) is no number
        value = value.total_seconds()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no infinity: `null`, as for a time Python cannot hold
    return value


def print_json(value: Any) -> None:
    """Print `value` (dataclasses, lists and dicts of them) as indented, standard JSON
    (an infinite number, which JSON cannot hold, as `null`)."""
    click.echo(
        json.dumps(
            _fields(value), default=_json_default, indent=2, ensure_ascii=False, allow_nan=False
        )
    )


def when(moment: datetime | None) -> str:
    """A time in UTC, to the second; `-` for none."""
    if moment is None:
        return "-"
    if moment == LATEST:  # past what Python holds (year 9999, `infinity`): see JobInfo
        return ">9999-12-31"
    if moment == EARLIEST:
        return "<0001-01-01"
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def short(text: str | None, limit: int = 60) -> str:
    """`text` on one line, cut to `limit` characters, `shown`."""
    if not text:
        return "-"
    flat = one_line(text)
    return shown(flat if len(flat) <= limit else flat[: limit - 1] + "…")


def lines(text: str | None) -> str:
    """`text` kept on its lines, each `shown`."""
    if not text:
        return "-"
    return "\n".join(shown(line) for line in text.splitlines())


def tries(info: JobInfo) -> str:
    """Attempts so far out of the most it gets: `2 of 5` (stored on the job when it was
    queued with one, or when it was first claimed: the limit that applies), or `0 of -`
    for a job queued without one and not claimed yet by a worker of this package."""
    return f"{info.attempt} of {info.max_attempts if info.max_attempts is not None else '-'}"
