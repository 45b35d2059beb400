"""What the exchange's statement (`sql.EXCHANGE` and its variants) carries and returns:
the endings as its text parameters (`endings`), and its rows read by name
(`exchange_rows`): each job claimed becomes a `Run`, each ending recorded its (id,
attempt), and each row saying when a rate-limited name's next slot frees its seconds.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from psycopg.rows import RowMaker

from .. import sql
from ..limits import AttemptLimits, Limits
from .run import Run

__all__ = ["COLUMNS", "KeyCursor", "endings", "exchange_rows", "statement_for", "waits_and_cursors"]


class KeyCursor(NamedTuple):
    """A row of `sql.EXCHANGE_KEYED` saying where a keyed name's walk stopped: the next
    claim of the name starts after `key` (`limits.Limits.after`)."""

    name: str
    key: str | None


def endings(batch: list[Run]) -> tuple[str, str, str]:
    """The endings of `batch` as the statement's parameters `completed`,
    `completed_attempts` and `endings`: completed runs without a result or a traced span
    (nearly every ending) as two array literals, ids and attempts (uuid text and digits:
    nothing to quote); the others, with their error, backoff, result or their span's
    trace context (`Run.run_trace`), as one JSON array. Far
    cheaper to build than a list per column or JSON per ending."""
    ids: list[str] = []
    attempts: list[str] = []
    others: list[str] = []
    for one in batch:
        if one.status == "completed" and one.result is None and one.run_trace is None:
            ids.append(one.id)
            attempts.append(str(one.attempts))
        elif one.status == "completed":  # its result and trace are JSON text already
            others.append(
                f'{{"id":"{one.id}","attempts":{one.attempts},"status":"completed",'
                f'"result":{one.result or "null"},"trace":{one.run_trace or "null"}}}'
            )
        else:
            ending = {
                "id": one.id,
                "attempts": one.attempts,
                "status": one.status,
                "error": one.error,
                "delay": one.delay,
            }
            if one.raises is not None:
                ending["max_attempts"] = one.raises
            if one.slept:
                ending["slept"] = True
            if one.run_trace is not None:
                ending["trace"] = json.loads(one.run_trace)
            others.append(json.dumps(ending, ensure_ascii=False))
    return (
        "{" + ",".join(ids) + "}",
        "{" + ",".join(attempts) + "}",
        "[" + ",".join(others) + "]",
    )


COLUMNS = (
    "id",
    "attempts",
    "name",
    "args",
    "max_attempts",
    "timeout_ms",
    "priority",
    "run_at",
    "trace_context",
    "ahead",
)
"""The columns `sql.EXCHANGE` returns, read by name."""


def exchange_rows(
    attempts: AttemptLimits, sent: float, timeouts: dict[str, float], log_keys: bool = False
) -> Any:
    """A row factory for `sql.EXCHANGE`, made once per statement: each row claimed
    becomes a `Run`, each ending recorded its (id, attempt), and each row of
    `sql.EXCHANGE_RATED` saying when a rate-limited name's next slot frees its seconds
    (a float), each row of `sql.EXCHANGE_KEYED` saying where a keyed name's walk
    stopped a `KeyCursor`; a run's key is kept only with `log_keys`. It finds every column
    by its name once, then reads each row's values by those places: as cheap as reading
    tuples by index (`namedtuple_row` added about 1 µs per job), and a column added to
    the statement cannot shift the others. A job stored without `max_attempts` or a
    timeout (or with a timeout of zero or less, which only another client writes) gets
    its handler's (`attempts.of`, `timeouts`), else the worker's limit and none."""

    limit_of = attempts.of

    def factory(cursor: Any) -> RowMaker[Any]:
        # The result's own names (`fname`): `cursor.description` makes an object per
        # column (15 µs a statement, against 2), on the way to every claimed run's start.
        result = cursor.pgresult
        at = (
            {result.fname(i).decode(): i for i in range(result.nfields)}
            if result is not None
            else {}
        )
        id_, attempts, name, args, limit, timeout, priority, run_at, trace, ahead = (
            at[c] for c in COLUMNS
        )
        key = at.get("key")  # `sql.EXCHANGE_KEYED` only
        keys = log_keys and key is not None

        def make(values: Any) -> Run | tuple[str, int] | float | KeyCursor:
            if values[name] is None:
                return (values[id_], values[attempts])
            if values[id_] is None:  # `sql.EXCHANGE_RATED`: when a name's next slot frees
                if values[run_at] is None and key is not None:  # where a walk stopped
                    return KeyCursor(values[name], values[key])
                return float(values[run_at])
            ms = values[timeout]
            job = values[name]
            return Run(
                values[id_],
                job,
                values[attempts],
                limit_of(job, values[limit]),
                timeouts.get(job) if ms is None or ms <= 0 else ms / 1000,
                values[args],
                sent,
                order=(-values[priority], values[run_at]),
                ahead=values[ahead],
                trace_context=values[trace],
                job_key=values[key] if keys else None,
            )

        return make

    return factory


def waits_and_cursors(rows: list[Any], after: dict[str, str]) -> tuple[list[Any], float | None]:
    """Take out of `rows` those of `sql.EXCHANGE_RATED` (a float: seconds until a
    rate-limited name's next free slot) and of `sql.EXCHANGE_KEYED` (a `KeyCursor`:
    where a keyed name's walk stopped, kept in `after` for its next claim); returns the
    rest (runs and endings) and when to look again (the soonest slot), if any."""
    waits = [row for row in rows if type(row) is float]
    for row in rows:
        if type(row) is KeyCursor and row.key is not None:
            after[row.name] = row.key
    rest = [row for row in rows if type(row) is not float and type(row) is not KeyCursor]
    return rest, (max(min(waits), 0.0) if waits else None)


def statement_for(limits: Limits, recording: bool) -> str:
    """`sql.EXCHANGE`, or `sql.EXCHANGE_LIMITED` once this process has a global limit,
    or `sql.EXCHANGE_RATED` once it has a rate limit, or `sql.EXCHANGE_KEYED` once it
    claims a name by key: a process without any sends the plain statement, whose
    plan is unchanged, or `sql.CLAIM` when it has nothing to record (no ending, no
    start to mark: `recording` false)."""
    if limits.keyed:
        return sql.EXCHANGE_KEYED
    if limits.rate:
        return sql.EXCHANGE_RATED
    if limits.global_:
        return sql.EXCHANGE_LIMITED
    return sql.EXCHANGE if recording else sql.CLAIM
