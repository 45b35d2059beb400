"""Charts drawn on the server as SVG: bars over time, with no script and no library.
The text in them is numbers and times, escaped all the same (`markupsafe`). Times are
in UTC with their date ("Dec 6 04:15"), so a day's chart says which day each end is."""

from __future__ import annotations

from datetime import datetime, timezone

from markupsafe import Markup, escape

from .history import Series

__all__ = ["bars", "stamp"]

WIDTH = 600
HEIGHT = 120
TOP = 14
"""Room for the largest value's label."""
BOTTOM = 16
"""Room for the time labels."""


MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
"""Month names, whatever the process's locale."""


def stamp(epoch: int) -> str:
    """A moment (epoch seconds) as its date and time in UTC: `Dec 6 04:15`."""
    at = datetime.fromtimestamp(epoch, timezone.utc)
    return f"{MONTHS[at.month - 1]} {at.day} {at:%H:%M}"


def bars(series: Series, title: str, kind: str) -> Markup:
    """`series` as a bar chart titled `title`; `kind` names its CSS class (colour)."""
    count = max(1, len(series.values))
    peak = max([*series.values, 1])
    step = WIDTH / count
    plot = HEIGHT - TOP - BOTTOM
    parts = [
        f'<svg class="chart chart-{escape(kind)}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>',
        f'<line class="axis" x1="0" y1="{HEIGHT - BOTTOM}" x2="{WIDTH}" y2="{HEIGHT - BOTTOM}"/>',
    ]
    for i, (start, value) in enumerate(zip(series.starts, series.values, strict=True)):
        if value <= 0:
            continue
        h = max(1.0, plot * value / peak)
        parts.append(
            f'<rect class="bar" x="{i * step:.1f}" y="{HEIGHT - BOTTOM - h:.1f}" '
            f'width="{max(step - 1, 0.5):.1f}" height="{h:.1f}">'
            f"<title>{escape(stamp(start))} UTC: {value}</title></rect>"
        )
    parts.append(f'<text class="peak" x="2" y="10">max {peak if any(series.values) else 0}</text>')
    if series.starts:
        parts.append(
            f'<text class="time" x="2" y="{HEIGHT - 3}">{escape(stamp(series.starts[0]))}</text>'
        )
        parts.append(
            f'<text class="time end" x="{WIDTH - 2}" y="{HEIGHT - 3}">'
            f"{escape(stamp(series.starts[-1]))} UTC</text>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))
