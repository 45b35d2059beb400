"""A job's id as the caller gives it (`job_id_of`), and the id a duplicate returns
(`Duplicate`)."""

from __future__ import annotations

from uuid import UUID

from ..errors import OptionsError

__all__ = ["Duplicate", "job_id_of"]


class Duplicate(UUID):
    """What queuing a job returns when its unique key was taken: the id of the job that
    holds the key (queued, running, in review, or finished within its `unique_for`).
    Nothing was queued.

    It is a `UUID`, equal to the holder's id, so code that only wants an id to wait on
    or show needs no change; `isinstance(job_id, Duplicate)` tells which happened, with
    no second query. A job queued is returned as a plain `UUID`."""

    __slots__ = ()


def job_id_of(value: object) -> UUID:
    """`value` as a job id: a `UUID`, or its text. Anything else raises an `OptionsError`
    naming it, before anything is sent (a malformed id would abort the caller's
    transaction on the server)."""
    if isinstance(value, UUID):
        return value
    if isinstance(value, str):
        try:
            return UUID(value)
        except ValueError:
            pass
    shown = repr(value) if len(repr(value)) <= 60 else f"{repr(value)[:60]}..."
    raise OptionsError(
        f"expected a job id (a UUID, or its text like 0191f3c2-...), got: {shown}; nothing was sent"
    )
