"""Counting jobs in each state, moved or not, for `counts`, `counts_by_name`, the
metrics and the dashboard: every group read at most `cap + 1` rows deep, the planner's
estimate past it (`COUNT_ESTIMATES`)."""

from __future__ import annotations

from .naming import statement
from .web import LIVE_COUNT_COLUMNS, WEB_ESTIMATE_READY, WEB_ESTIMATE_WAITING

__all__ = [
    "COUNTS",
    "COUNTS_BY_NAME",
    "COUNTS_SAMPLE_MOVED",
    "COUNT_ESTIMATES",
    "FINISHED_COUNTS_BY_NAME",
    "LIVE_COUNTS_BY_NAME",
]

_NOW = "COALESCE(%(now)s::timestamptz, now())"

_BOUNDED = (
    ("ready", f"FROM {{axa_queue}} WHERE status = 'queued' AND run_at <= {_NOW}"),
    ("waiting", f"FROM {{axa_queue}} WHERE status = 'queued' AND run_at > {_NOW}"),
    ("running", "FROM {axa_queue} WHERE status = 'running'"),
    ("needs_review", "FROM {axa_queue} WHERE status = 'needs_review'"),
    ("blocked", "FROM {axa_queue} WHERE status = 'blocked'"),
)
"""The live states' rows, each state's `FROM` and `WHERE` (read through its partial
index, at most `cap + 1` rows); each count names the columns it reads."""

_MOVED = tuple(
    (state, f"FROM {{axa_queue_history}} WHERE status = '{state}' ORDER BY created_at DESC")
    for state in ("completed", "failed", "cancelled")
)
"""Each finished state's rows in the history, read through `axa_queue_history_status_created`
(each day's, merged), at most `cap + 1` a state, as `_BOUNDED`'s live states are. In that
index's order, so the plan is its ordered scan whatever the statistics say of the
state: a scan of the days' rows filtering them (what the planner takes for a state it
believes common) would read every row of a rare one."""

_FINISHED = """count(*) FILTER (WHERE status = 'completed') AS {prefix}completed,
        count(*) FILTER (WHERE status = 'failed') AS {prefix}failed,
        count(*) FILTER (WHERE status = 'cancelled') AS {prefix}cancelled"""


def _bounded_counts(by_name: bool) -> str:
    """`COUNTS` (`by_name` false) or `COUNTS_BY_NAME`: every group read at most
    `cap + 1` rows deep, one statement."""
    finished = _FINISHED.format(prefix="")
    moved = ",\n        ".join(
        f"(SELECT count(*) FROM (SELECT 1 {rows} LIMIT %(cap)s + 1) m) AS moved_{state}"  # noqa: S608
        for state, rows in _MOVED
    )
    moved_by_name = "\n        UNION ALL\n        ".join(
        f"""(SELECT name, 'moved_{state}', count(*), NULL::float8 FROM (SELECT name {rows} LIMIT %(cap)s + 1) m GROUP BY name)"""  # noqa: S608
        for state, rows in _MOVED
    )
    if not by_name:
        each = "".join(
            f"\n    (SELECT count(*) FROM (SELECT name {rows} LIMIT %(cap)s + 1) x) AS {state},"  # noqa: S608
            for state, rows in _BOUNDED
        )
        return f"""SELECT{each}
    hot.*, moved.*,
    (EXTRACT(EPOCH FROM {_NOW}) - EXTRACT(EPOCH FROM (SELECT min(run_at) FROM {{axa_queue}}
        WHERE status = 'queued' AND run_at <= {_NOW})))::float8 AS oldest
    FROM (SELECT {finished} FROM (SELECT status FROM {{axa_queue}}
              WHERE status IN ('completed', 'failed', 'cancelled') LIMIT %(cap)s + 1) f) hot,
         (SELECT {moved}) moved"""  # noqa: S608
    live = "\n        UNION ALL\n        ".join(
        f"""(SELECT name, '{state}' AS state, count(*) AS n, NULL::float8 AS oldest FROM (SELECT name {rows} LIMIT %(cap)s + 1) x GROUP BY name)"""  # noqa: S608
        for state, rows in _BOUNDED[1:]
    )
    return f"""SELECT name,
    COALESCE(sum(n) FILTER (WHERE state = 'ready'), 0)::bigint AS ready,
    COALESCE(sum(n) FILTER (WHERE state = 'waiting'), 0)::bigint AS waiting,
    COALESCE(sum(n) FILTER (WHERE state = 'running'), 0)::bigint AS running,
    COALESCE(sum(n) FILTER (WHERE state = 'needs_review'), 0)::bigint AS needs_review,
    COALESCE(sum(n) FILTER (WHERE state = 'blocked'), 0)::bigint AS blocked,
    COALESCE(sum(n) FILTER (WHERE state = 'completed'), 0)::bigint AS completed,
    COALESCE(sum(n) FILTER (WHERE state = 'failed'), 0)::bigint AS failed,
    COALESCE(sum(n) FILTER (WHERE state = 'cancelled'), 0)::bigint AS cancelled,
    COALESCE(sum(n) FILTER (WHERE state = 'moved_completed'), 0)::bigint AS moved_completed,
    COALESCE(sum(n) FILTER (WHERE state = 'moved_failed'), 0)::bigint AS moved_failed,
    COALESCE(sum(n) FILTER (WHERE state = 'moved_cancelled'), 0)::bigint AS moved_cancelled,
    max(oldest) AS oldest
    FROM (
        (SELECT name, 'ready' AS state, count(*) AS n,
                (EXTRACT(EPOCH FROM {_NOW}) - EXTRACT(EPOCH FROM min(run_at)))::float8 AS oldest
         FROM (SELECT name, run_at {_BOUNDED[0][1]}
               ORDER BY axa_queue.run_at LIMIT %(cap)s + 1) x GROUP BY name)
        UNION ALL
        {live}
        UNION ALL
        (SELECT name, status, count(*), NULL::float8 FROM (SELECT name, status FROM {{axa_queue}}
              WHERE status IN ('completed', 'failed', 'cancelled') LIMIT %(cap)s + 1) f GROUP BY name, status)
        UNION ALL
        {moved_by_name}
    ) counted GROUP BY name ORDER BY name"""  # noqa: S608


COUNTS = statement(_bounded_counts(by_name=False))
"""How many jobs are in each state, moved ones included, each read at most `cap + 1`
rows deep (so it costs the same on 10 million rows as on 10,000): each live state
(ready, waiting, running, in review, blocked) through its partial index, the finished jobs still
in `axa_queue` through `axa_queue_finished`, and the history's each finished state to its own
`cap + 1` rows (`_MOVED`). A count of `cap` or less is exact; past it, `jobs.reads` takes the
planner's estimate instead (`COUNT_ESTIMATES`) and says so (`Counts.estimated`); the
finished jobs still in `axa_queue` (few: they move after `keep_recent`), past `cap` in
all, make their three states estimates. And how long the
oldest ready job has waited: the first entry of `axa_queue_ready` (the difference of
epoch seconds, which `-infinity`, written by another client, cannot fail before
PostgreSQL 17; it reads as infinity)."""

COUNTS_BY_NAME = statement(_bounded_counts(by_name=True))
"""The same bounded reads for each job name (`moved_*`: in the history): a state read
to its cap is estimated by `jobs.reads`, the counts read scaled to the state's estimate
(the history's from `COUNTS_SAMPLE_MOVED`). The oldest ready job of a name is among the
first `cap + 1` ready ones by due time, or not counted."""

COUNT_ESTIMATES = {
    "ready": WEB_ESTIMATE_READY,
    "waiting": WEB_ESTIMATE_WAITING,
    "running": statement(
        "EXPLAIN (FORMAT JSON) SELECT 1 FROM {axa_queue} WHERE status = 'running'"
    ),
    "needs_review": statement(
        "EXPLAIN (FORMAT JSON) SELECT 1 FROM {axa_queue} WHERE status = 'needs_review'"
    ),
    "blocked": statement(
        "EXPLAIN (FORMAT JSON) SELECT 1 FROM {axa_queue} WHERE status = 'blocked'"
    ),
    "completed": statement(
        "EXPLAIN (FORMAT JSON) SELECT 1 FROM {axa_queue} WHERE status = 'completed'"
    ),
    "failed": statement("EXPLAIN (FORMAT JSON) SELECT 1 FROM {axa_queue} WHERE status = 'failed'"),
    "cancelled": statement(
        "EXPLAIN (FORMAT JSON) SELECT 1 FROM {axa_queue} WHERE status = 'cancelled'"
    ),
    "moved_completed": statement(
        "EXPLAIN (FORMAT JSON) SELECT 1 FROM {axa_queue_history} WHERE status = 'completed'"
    ),
    "moved_failed": statement(
        "EXPLAIN (FORMAT JSON) SELECT 1 FROM {axa_queue_history} WHERE status = 'failed'"
    ),
    "moved_cancelled": statement(
        "EXPLAIN (FORMAT JSON) SELECT 1 FROM {axa_queue_history} WHERE status = 'cancelled'"
    ),
    "moved": statement("EXPLAIN (FORMAT JSON) SELECT 1 FROM {axa_queue_history}"),
}
"""The planner's estimate of each count `COUNTS` reads to its cap (and of the history's
rows, `moved`), from the tables' statistics as autovacuum's `ANALYZE` keeps them and
each table's size now (as Oban counts big tables): a plan, never a scan. The history's
sum its day partitions' estimates."""

COUNTS_SAMPLE_MOVED = statement("""SELECT name, status, count(*) AS n
    FROM {axa_queue_history} TABLESAMPLE SYSTEM (%(percent)s) GROUP BY name, status""")
"""A sample of the history's pages (`percent` of each day's, about `2 * cap` rows), for
`counts_by_name` past the cap: each name's share of a state, scaled to the state's
estimate. A name seen in none of the pages sampled is not listed."""

LIVE_COUNTS_BY_NAME = statement(
    """SELECT name,
    {columns}
    FROM (
        SELECT name, status, run_at FROM {axa_queue} WHERE status = 'queued'
        UNION ALL
        SELECT name, status, run_at FROM {axa_queue} WHERE status = 'running'
        UNION ALL
        SELECT name, status, run_at FROM {axa_queue} WHERE status = 'needs_review'
        UNION ALL
        SELECT name, status, run_at FROM {axa_queue} WHERE status = 'blocked'
    ) live GROUP BY name ORDER BY name""",
    columns=LIVE_COUNT_COLUMNS,
)
"""The counts of jobs not finished, for each job name: each branch reads one partial
index (queued, running, in review, blocked), never the finished rows, so it costs the same on a
table holding millions of them (what metrics count every few seconds). Jobs not
finished are never moved: the history is not read."""

FINISHED_COUNTS_BY_NAME = statement("""SELECT name,
    count(*) FILTER (WHERE status = 'completed') AS completed,
    count(*) FILTER (WHERE status = 'failed') AS failed,
    count(*) FILTER (WHERE status = 'cancelled') AS cancelled
    FROM (
        SELECT name, status FROM {axa_queue} WHERE status IN ('completed', 'failed', 'cancelled')
        UNION ALL
        SELECT name, status FROM {axa_queue_history}
    ) finished GROUP BY name ORDER BY name""")
"""The counts of finished jobs, moved or not, for each job name: a scan of every
finished row kept by retention (metrics count them far less often than the live ones)."""
