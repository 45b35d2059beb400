"""Tracing: the hook an instrumentation (`axa_queue.otel`) plugs into to see jobs being
queued, without the core importing any tracing library.

Queuing has no queue object when it happens on a caller's connection (`enqueue_on`),
so the hook is process-wide: `install(sender)` sets it. While it is set, every call
that queues jobs asks it first; it answers `None` (nothing to record: no active trace)
or a `Sending`: the trace context to store with the jobs (`Sending.carrier`, JSON text
for the `trace_context` column), and `Sending.end`, told how the statement ended. With
no sender installed (the default), queuing costs one global lookup more and stores
NULL, as jobs of the Rust crate and of schedules have.

`carrier_of` reads a stored context back, whoever wrote it, for `JobContext.trace_context`;
`links_of` reads the contexts of the parents' runs that a dependent's release wrote
beside it (its `links`, migration 20), for `JobContext.parent_traces`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol
from uuid import UUID

__all__ = ["Sender", "Sending", "carrier_of", "install", "links_of", "sender"]


class Sending(Protocol):
    """Jobs being queued inside a trace: what to store with them, and how it ended."""

    @property
    def carrier(self) -> str:
        """The trace context to store in the jobs' `trace_context` column, as JSON text
        of a W3C carrier (`{"traceparent": ..., "tracestate": ...}`)."""
        ...

    def end(self, error: BaseException | None) -> None:
        """Told once the statement ended: `None` when it ran, else what it raised."""
        ...


Sender = Callable[[Sequence[str], Sequence[UUID]], "Sending | None"]
"""Asked with the names and ids of the jobs about to be queued (one statement); returns
a `Sending`, or `None` to store no context."""

sender: Sender | None = None
"""The installed hook, or `None` (queuing stores no trace context)."""


def install(hook: Sender | None) -> None:
    """Set the process-wide hook (`None` removes it)."""
    global sender
    sender = hook


def carrier_of(text: str | None) -> Mapping[str, str] | None:
    """A stored trace context (the `trace_context` column as JSON text) as a carrier of
    strings, or `None` when there is none or it is not a JSON object (another client may
    have written anything there); entries that are not strings are left out."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return _strings(value)


def _strings(value: object) -> Mapping[str, str] | None:
    """A JSON object's string entries, or `None` when it is not one or has none."""
    if not isinstance(value, dict):
        return None
    found = {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}
    return found or None


def links_of(text: str | None) -> tuple[Mapping[str, str], ...]:
    """The trace contexts of the parents' runs in a stored trace context (its `links`:
    a JSON array of carriers, which the release of a dependent writes), each read as
    `carrier_of` reads one (what is not a carrier is left out); empty when there are
    none. A text without the word is not decoded at all."""
    if text is None or '"links"' not in text:
        return ()
    try:
        value = json.loads(text)
    except ValueError:
        return ()
    links = value.get("links") if isinstance(value, dict) else None
    if not isinstance(links, list):
        return ()
    return tuple(found for found in map(_strings, links) if found is not None)
