"""How the pages are drawn: the Jinja2 environment of the templates beside this module,
autoescaping on (so a job name, error, `by` or reason is always text), and its filters,
which write moments, lengths of time, counts and query strings."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape

from .. import readable

__all__ = ["ERROR_SHOWN", "count", "error_text", "length", "moment", "query", "templates"]

TEMPLATES = Path(__file__).parent / "templates"


def moment(at: datetime | None) -> str:
    """A moment in UTC to the second; `-` for none, and the ends of time as bounds."""
    if at is None:
        return "-"
    if at.year >= 9999:
        return ">9999-12-31"
    if at.year <= 1:
        return "<0001-01-01"
    return at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def length(seconds: float | None) -> str:
    """`readable.seconds`, and `∞` for an endless wait (a time of `-infinity`)."""
    if seconds is not None and not math.isfinite(seconds):
        return "∞"
    return readable.seconds(seconds)


def count(number: int) -> str:
    """A count with its thousands apart: `12,345`."""
    return f"{number:,}"


def query(values: dict[str, Any]) -> str:
    """A query string of the values given, leaving out those unset or empty."""
    return urlencode({k: v for k, v in values.items() if v not in (None, "")})


ERROR_SHOWN = 4096
"""The most characters of an error a page shows: the worker keeps 1,024 bytes of one,
but another client may write any length (a page of megabytes is no page)."""


def error_text(text: str) -> str:
    """An error as a page shows it: whole, or its first `ERROR_SHOWN` characters and how
    many more there are."""
    if len(text) <= ERROR_SHOWN:
        return text
    return f"{text[:ERROR_SHOWN]}… ({len(text) - ERROR_SHOWN:,} more characters)"


def templates() -> Environment:
    """The templates, with the filters `when`, `seconds`, `n`, `query` and `error`."""
    environment = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    environment.filters["when"] = moment
    environment.filters["seconds"] = length
    environment.filters["n"] = count
    environment.filters["query"] = query
    environment.filters["error"] = error_text
    return environment
