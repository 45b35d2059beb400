"""Readable numbers: how the command line and the demo write lengths of time and counts
of things for people.

Shared by the commands (`cli`) and the demo (`demo`), which print them in tables and
summaries.
"""

from __future__ import annotations

from datetime import timedelta

__all__ = ["plural", "seconds", "size"]


def seconds(length: timedelta | float | None) -> str:
    """A length of time in seconds, in the unit that reads best: `120 ms`, `4.2 s`,
    `3.5 min`, `2.0 h`; `-` for none."""
    if length is None:
        return "-"
    value = length.total_seconds() if isinstance(length, timedelta) else length
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def plural(n: int, one: str, many: str | None = None) -> str:
    """`n` and the word for that many: `1 job`, `3 jobs` (or `many` when not just `one`+s)."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


def size(length: int | None) -> str:
    """A size in bytes, in the unit that reads best: `512 B`, `8 kB`, `12.5 MB`,
    `1.2 GB` (PostgreSQL's units, of 1024); `-` for none."""
    if length is None:
        return "-"
    if length < 1024:
        return f"{length} B"
    if length < 1024**2:
        return f"{length / 1024:.0f} kB"
    if length < 1024**3:
        return f"{length / 1024**2:.1f} MB"
    return f"{length / 1024**3:.1f} GB"
