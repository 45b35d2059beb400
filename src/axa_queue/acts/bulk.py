"""A person's act on every job a filter matches: `cancel_all`, `retry_all` (failed jobs,
act `retried`) and `release_all` (jobs in review, act `released`).

Each applies to each job exactly what the single act (`cancel`, `retry`) would, and
keeps one act per job changed, in the caller's transaction: one statement per batch
of `BULK_BATCH` jobs, in id order, so a filter matching 100,000 jobs never holds one
statement's worth of locks and memory for all of them, and a rollback undoes every
batch. The result says how many jobs changed and how many the filter matched that the
act did not apply to, by the state each was in (a completed job is not cancelled).
`dry_run=True` counts the same without locking or changing anything.

The filters: `name`, `state`, `ids`, `error_like` (a `LIKE` pattern of the last error),
`finished_after` / `finished_before` (when the job last changed: when it finished, for
a finished job; when it entered review; when it was queued or last ran, for the
others) and `limit` (the most jobs matched, in id order). At least one of the first
six is needed: an act on every job of the table is never what a missing filter means.
`retry_all` also brings back failed jobs moved to the history, as `retry` does.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypedDict, overload
from uuid import UUID

from typing_extensions import Unpack

from .. import sql
from ..db.adapters import AnyConnection, SomeAsyncConnection, SomeSyncConnection, run
from ..db.calls import Call, Row, Steps, ask
from ..errors import OptionsError
from ..jobs.model import JobState, check_name, job_id_of
from .records import CANCELS, check_code

__all__ = [
    "BULK_BATCH",
    "MAX_LIKE_CHARS",
    "BulkResult",
    "JobFilter",
    "cancel_all",
    "release_all",
    "retry_all",
]

BULK_BATCH = 1000
"""Jobs looked at per statement of a bulk act."""

MAX_LIKE_CHARS = 200
"""The longest `error_like` pattern, in characters."""

NIL = "00000000-0000-0000-0000-000000000000"
"""The id before every other: where the first batch starts."""


@dataclass(frozen=True)
class BulkResult:
    """What a bulk act did (or, with `dry_run`, would do): how many jobs it changed, each
    with its act, and how many jobs the filter matched that it left alone, by the
    state each was in."""

    changed: int
    left_alone: dict[str, int] = field(default_factory=dict)
    dry_run: bool = False
    missing: int = 0
    """Of the `ids` given, how many no job has (in `axa_queue` or the history): nothing
    to act on, and not among those matched."""

    @property
    def matched(self) -> int:
        """Every job the filter matched."""
        return self.changed + sum(self.left_alone.values())


@dataclass(frozen=True)
class _Filter:
    """A bulk act's filter, checked, as the statements take it."""

    params: dict[str, Any]
    limit: int | None


def _filter(
    by: str,
    reason: str,
    name: str | None,
    state: JobState | str | None,
    ids: Sequence[UUID | str] | None,
    error_like: str | None,
    finished_after: datetime | None,
    finished_before: datetime | None,
    limit: int | None,
) -> _Filter:
    """Check the filter and the act's `by` and `reason` before anything is sent."""
    if all(v is None for v in (name, state, ids, error_like, finished_after, finished_before)):
        raise OptionsError(
            "a bulk act needs a filter: give name, state, ids, error_like, finished_after "
            "or finished_before (to act on every job, give each state in turn)"
        )
    if state is not None:
        try:
            state = JobState(state)
        except ValueError:
            raise OptionsError(
                "state must be one of: " + ", ".join(s.value for s in JobState)
            ) from None
    if error_like is not None and (
        not isinstance(error_like, str) or not 1 <= len(error_like) <= MAX_LIKE_CHARS
    ):
        raise OptionsError(f"error_like must be a LIKE pattern of 1 to {MAX_LIKE_CHARS} characters")
    for what, moment in (("finished_after", finished_after), ("finished_before", finished_before)):
        if moment is not None and (not isinstance(moment, datetime) or moment.utcoffset() is None):
            raise OptionsError(f"{what} must be a timezone-aware datetime")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise OptionsError("limit must be a whole number of jobs, 1 or more")
    return _Filter(
        {
            "by": check_code(by, "by"),
            "reason": check_code(reason, "reason"),
            "name": None if name is None else check_name(name),
            "state": None if state is None else state.value,
            "ids": None if ids is None else [job_id_of(one) for one in ids],
            "error_like": error_like,
            "changed_after": finished_after,
            "changed_before": finished_before,
            "now": None,
        },
        limit,
    )


def _one(rows: list[Row], _count: int) -> Row:
    return rows[0]


def _batches(statement: str, params: dict[str, Any], limit: int | None) -> Steps[BulkResult]:
    """Send `statement` batch after batch until the table has no more jobs after the
    last one looked at (or `limit` jobs were matched), adding up what each did. A batch
    looks at a bounded scope of ids (`sql.acts.BULK_SCOPE`), so one may match none and
    the next go on."""
    changed, left, after, remaining = 0, Counter[str](), NIL, limit
    while remaining is None or remaining > 0:
        batch = BULK_BATCH if remaining is None else min(BULK_BATCH, remaining)
        row = yield from ask(Call(statement, {**params, "after": after, "batch": batch}, _one))
        changed += int(row.changed)
        left.update(json.loads(row.left_alone))
        if remaining is not None:
            remaining -= int(row.seen)
        if row.next is None:
            break
        after = row.next
    return BulkResult(changed, dict(left))


def _matching(statement: str, params: dict[str, Any], limit: int | None) -> Steps[BulkResult]:
    row = yield from ask(Call(statement, {**params, "limit": limit}, _one))
    return BulkResult(int(row.applies), json.loads(row.left_alone), dry_run=True)


def _both(first: BulkResult, then: BulkResult) -> BulkResult:
    left = Counter(first.left_alone)
    left.update(then.left_alone)
    return BulkResult(first.changed + then.changed, dict(left), first.dry_run)


def _read_missing(rows: list[Row], _count: int) -> int:
    return int(rows[0].missing)


UNFINISHED = frozenset({"queued", "running", "blocked", "needs_review"})
"""The states a job in the history is never in (it holds finished jobs only)."""


def _with_moved(
    given: _Filter, params: dict[str, Any], hot: BulkResult, moved: Steps[BulkResult] | None
) -> Steps[BulkResult]:
    """`hot` (what the act did in `axa_queue`) with the jobs moved to the history the
    filter matches, within what is left of its `limit`: `moved`, the act's own steps
    there (`retry_all` brings back the failed ones), else counted as left alone (they
    are finished: no other act changes one, and each is counted as it was before it
    moved); and, with `ids`, how many of them no job has."""
    result = hot
    rest = None if given.limit is None else given.limit - hot.matched
    # A filter on a state no finished job is in matches none of the history: not read
    # (a bulk act on queued or running jobs, the dashboard's, stays off its millions).
    unfinished = given.params["state"] in UNFINISHED
    if (rest is None or rest > 0) and not unfinished:
        then = yield from (
            moved
            if moved is not None
            else _matching(sql.MATCHING_MOVED, {**params, "applies": []}, rest)
        )
        result = _both(hot, BulkResult(then.changed, then.left_alone))
    ids = given.params["ids"]
    if ids is None:
        return result
    missing = yield from ask(Call(sql.MISSING, {"ids": ids}, _read_missing))
    return dataclasses.replace(result, missing=missing)


def _cancel_steps(given: _Filter, dry_run: bool) -> Steps[BulkResult]:
    params = {**given.params, "applies": [state.value for state in CANCELS]}
    hot = yield from (
        _matching(sql.MATCHING, params, given.limit)
        if dry_run
        else _batches(sql.CANCEL_BATCH, params, given.limit)
    )
    return (yield from _with_moved(given, params, hot, None))


def _retry_steps(given: _Filter, applies: str, dry_run: bool) -> Steps[BulkResult]:
    params = {**given.params, "applies": [applies]}
    hot = yield from (
        _matching(sql.MATCHING, params, given.limit)
        if dry_run
        else _batches(sql.RETRY_BATCH, params, given.limit)
    )
    rest = None if given.limit is None else given.limit - hot.matched
    moved = None
    if applies == "failed":  # a job in review is never moved to the history
        moved = (
            _matching(sql.MATCHING_MOVED, params, rest)
            if dry_run
            else _batches(sql.RETRY_MOVED_BATCH, params, rest)
        )
    return (yield from _with_moved(given, params, hot, moved))


class JobFilter(TypedDict, total=False):
    """The filter of a bulk act, as keyword arguments (see the module's note)."""

    name: str | None
    state: JobState | str | None
    ids: Sequence[UUID | str] | None
    error_like: str | None
    finished_after: datetime | None
    finished_before: datetime | None
    limit: int | None
    dry_run: bool


def _given(by: str, reason: str, filters: JobFilter) -> _Filter:
    unknown = set(filters) - set(JobFilter.__annotations__)
    if unknown:
        raise OptionsError(
            "a bulk act has no filter "
            + ", ".join(sorted(unknown))
            + ": the filters are "
            + ", ".join(f for f in JobFilter.__annotations__ if f != "dry_run")
        )
    return _filter(
        by,
        reason,
        filters.get("name"),
        filters.get("state"),
        filters.get("ids"),
        filters.get("error_like"),
        filters.get("finished_after"),
        filters.get("finished_before"),
        filters.get("limit"),
    )


@overload
def cancel_all(
    conn: SomeAsyncConnection, *, by: str, reason: str, **filters: Unpack[JobFilter]
) -> Awaitable[BulkResult]: ...
@overload
def cancel_all(
    conn: SomeSyncConnection, *, by: str, reason: str, **filters: Unpack[JobFilter]
) -> BulkResult: ...
def cancel_all(
    conn: AnyConnection, *, by: str, reason: str, **filters: Unpack[JobFilter]
) -> BulkResult | Awaitable[BulkResult]:
    """Cancel every queued, running, blocked or in-review job the filter matches, as
    `cancel` cancels one (a running one's process is told at once), each with its act, in the
    caller's transaction; the jobs the filter matches in any other state are left alone
    and counted, those moved to the history too (finished: counted after the others, in
    id order, within `limit`, never changed). Raises
    `OptionsError` (or `NotACodeError`) before anything is sent when the filter, `by`
    or `reason` is not valid."""
    given = _given(by, reason, filters)
    return run(conn, _cancel_steps(given, filters.get("dry_run", False)))


@overload
def retry_all(
    conn: SomeAsyncConnection, *, by: str, reason: str, **filters: Unpack[JobFilter]
) -> Awaitable[BulkResult]: ...
@overload
def retry_all(
    conn: SomeSyncConnection, *, by: str, reason: str, **filters: Unpack[JobFilter]
) -> BulkResult: ...
def retry_all(
    conn: AnyConnection, *, by: str, reason: str, **filters: Unpack[JobFilter]
) -> BulkResult | Awaitable[BulkResult]:
    """Queue again for one more try every failed job the filter matches (act
    `retried`), as `retry` does one, those moved to the history too (they come back),
    each with its act, in the caller's transaction; workers are woken on commit. The
    jobs matched in any other state are left alone and counted (release the jobs in
    review with `release_all`)."""
    given = _given(by, reason, filters)
    return run(conn, _retry_steps(given, "failed", filters.get("dry_run", False)))


@overload
def release_all(
    conn: SomeAsyncConnection, *, by: str, reason: str, **filters: Unpack[JobFilter]
) -> Awaitable[BulkResult]: ...
@overload
def release_all(
    conn: SomeSyncConnection, *, by: str, reason: str, **filters: Unpack[JobFilter]
) -> BulkResult: ...
def release_all(
    conn: AnyConnection, *, by: str, reason: str, **filters: Unpack[JobFilter]
) -> BulkResult | Awaitable[BulkResult]:
    """Release to run again every job in review the filter matches (act `released`), as
    `retry` releases one, each with its act, in the caller's transaction; workers are
    woken on commit. The jobs matched in any other state are left alone and counted."""
    given = _given(by, reason, filters)
    return run(conn, _retry_steps(given, "needs_review", filters.get("dry_run", False)))
