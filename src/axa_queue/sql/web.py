"""The dashboard's statements: counts that stay cheap on a backlog, the planner's
estimates, pages of jobs by keyset, the finished jobs per minute, and the acts log.

`WEB_JOBS_NEWEST` and `WEB_JOBS_OLDEST` are one branch per state, each made from the
one named piece `_PAGE_BRANCH`.
"""

from __future__ import annotations

from string import Template

from .naming import statement
from .workers import worker_gone

__all__ = [
    "LIVE_COUNT_COLUMNS",
    "WEB_ACTS",
    "WEB_ESTIMATE_READY",
    "WEB_ESTIMATE_WAITING",
    "WEB_FINISHED_PER_MINUTE",
    "WEB_JOBS_NEWEST",
    "WEB_JOBS_OLDEST",
    "WEB_LIVE_COUNTS",
]

LIVE_COUNT_COLUMNS = """count(*) FILTER (WHERE status = 'queued' AND run_at <= COALESCE(%(now)s::timestamptz, now())) AS ready,
    count(*) FILTER (WHERE status = 'queued' AND run_at > COALESCE(%(now)s::timestamptz, now())) AS waiting,
    count(*) FILTER (WHERE status = 'running') AS running,
    count(*) FILTER (WHERE status = 'needs_review') AS needs_review,
    count(*) FILTER (WHERE status = 'blocked') AS blocked,
    (EXTRACT(EPOCH FROM COALESCE(%(now)s::timestamptz, now())) - EXTRACT(EPOCH FROM min(run_at)
        FILTER (WHERE status = 'queued' AND run_at <= COALESCE(%(now)s::timestamptz, now()))))::float8 AS oldest"""
"""What is counted of the jobs not finished, per name (`WEB_LIVE_COUNTS`,
`counts.LIVE_COUNTS_BY_NAME`): ready and delayed, running, in review and blocked, and the
oldest ready job's wait in seconds (a difference of epoch seconds), over `live`."""

WEB_LIVE_COUNTS = statement(
    """SELECT name,
    {columns}
    FROM (
        (SELECT name, status, run_at FROM {axa_queue} WHERE status = 'queued'
         ORDER BY axa_queue.run_at LIMIT %(cap)s)
        UNION ALL
        (SELECT name, status, run_at FROM {axa_queue} WHERE status = 'running' LIMIT %(cap)s)
        UNION ALL
        (SELECT name, status, run_at FROM {axa_queue} WHERE status = 'needs_review' LIMIT %(cap)s)
        UNION ALL
        (SELECT name, status, run_at FROM {axa_queue} WHERE status = 'blocked' LIMIT %(cap)s)
    ) live GROUP BY name ORDER BY name""",
    columns=LIVE_COUNT_COLUMNS,
)
"""The dashboard's counts of jobs not finished, per name, reading at most `cap` rows of
each state: queued ones in due order through `axa_queue_ready` (so the ready ones come
first, and each name's oldest ready job is among them), running ones, those in
review and those blocked (waiting for the jobs they depend on: `axa_queue_blocked`)
through their partial indexes. Exact while a state holds fewer than `cap` jobs;
past that the dashboard shows the counts read as "at least" and the totals from
`WEB_ESTIMATE_READY` and `WEB_ESTIMATE_WAITING`. Counting a backlog of 100,000 jobs
exactly at every refresh would cost more than the 50 ms a page may take."""

WEB_ESTIMATE_READY = statement("""EXPLAIN (FORMAT JSON)
    SELECT 1 FROM {axa_queue} WHERE status = 'queued' AND run_at <= now()""")
"""The planner's estimate of the ready jobs, from the table's statistics (as Oban counts
big tables): a plan, never a scan, for a backlog too big to count at each refresh."""

WEB_ESTIMATE_WAITING = statement("""EXPLAIN (FORMAT JSON)
    SELECT 1 FROM {axa_queue} WHERE status = 'queued' AND run_at > now()""")
"""The planner's estimate of the jobs queued for later (see `WEB_ESTIMATE_READY`)."""

# --- Pages of jobs ---------------------------------------------------------------------------

_PAGE_BRANCH = Template("""(SELECT id, name, status, attempts, max_attempts, priority, error,
            timeout_ms, unique_key, unique_for_ms, given_back, run_worker, run_attempt,
            EXTRACT(EPOCH FROM run_at) AS run_at, EXTRACT(EPOCH FROM started_at) AS started_at,
            EXTRACT(EPOCH FROM created_at) AS created_at,
            EXTRACT(EPOCH FROM updated_at) AS updated_at,
            CASE WHEN isfinite($at) THEN to_char($at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
                || CASE WHEN $at < TIMESTAMPTZ '0001-01-01 00:00:00+00' THEN ' BC' ELSE '' END
                ELSE $at::text END AS key, $table.$at AS sort_at
        FROM {$table}
        WHERE $state
          AND (%(name)s::text IS NULL OR name = %(name)s)
          AND $at $reached COALESCE(%(key)s::timestamp AT TIME ZONE 'UTC', '$edge'::timestamptz)
          AND ($at, id) $past (COALESCE(%(key)s::timestamp AT TIME ZONE 'UTC', '$edge'::timestamptz), COALESCE(%(after)s::uuid, '$last'))
        ORDER BY $table.$at $order, id $order LIMIT %(limit)s)""")
"""One state's branch of a page: the jobs of the state (`$state`, its test) in table
`$table` in the order of its time (`$at`, the column of the state's partial index),
after the cursor; `$order`
is `DESC` (newest first) or `ASC`, with the cursor's bounds that go with it (`_WAYS`). A
`string.Template`, filled with this module's own constants only: `$` names its slots, so
the statement's other marks (`{axa_queue}`, `%(key)s`) pass through as they are."""

_STATES = (
    ("%(state)s::text = 'queued' AND status = 'queued'", "run_at", "axa_queue"),
    ("%(state)s::text = 'running' AND status = 'running'", "updated_at", "axa_queue"),
    ("%(state)s::text = 'needs_review' AND status = 'needs_review'", "updated_at", "axa_queue"),
    ("%(state)s::text = 'blocked' AND status = 'blocked'", "updated_at", "axa_queue"),
    (
        "%(state)s::text = ANY('{{completed,failed,cancelled}}'::text[]) AND status IN "
        "('completed', 'failed', 'cancelled') AND status = %(state)s::text",
        "updated_at",
        "axa_queue",
    ),
    (
        "%(state)s::text = ANY('{{completed,failed,cancelled}}'::text[]) "
        "AND status = %(state)s::text",
        "updated_at",
        "axa_queue_history",
    ),
)
"""Each state's test, time and table: queued jobs by due time (`axa_queue_ready`),
running ones and those in review by their last change (`axa_queue_running`,
`axa_queue_review`), blocked ones by their last change too (found through
`axa_queue_blocked`, then sorted: they are a workflow's, not a backlog), finished ones by when they finished, those not moved yet
(`axa_queue_finished`) and those moved (`axa_queue_history_finished`, the partitions
walked in order). Each test names its status as a literal, so even a generic plan can
use the partial index; the `%(state)s` test is a one-time filter that skips the other
branches unread."""

_WAYS = {
    "DESC": {
        "reached": "<=",
        "past": "<",
        "edge": "infinity",
        "last": "ffffffff-ffff-ffff-ffff-ffffffffffff",
    },
    "ASC": {
        "reached": ">=",
        "past": ">",
        "edge": "-infinity",
        "last": "00000000-0000-0000-0000-000000000000",
    },
}
"""The cursor's bounds for each order: the key reached and the (key, id) passed, and for
the first page (no cursor) the edge of time and the id beyond every other, never an `OR`
that would keep the bound out of the index scan."""


_PAGE = Template("""SELECT id, name, status, attempts, max_attempts, priority, error, timeout_ms, unique_key,
    unique_for_ms, given_back, run_at, started_at, created_at, updated_at, key,
    $gone AS worker_gone
    FROM (
        $branches
    ) page ORDER BY sort_at $order, id $order LIMIT %(limit)s""")
"""A page: every state's branch (`_PAGE_BRANCH`), then the rows in the order of the time
itself (`sort_at`, never read by Python), not of its text, the first `limit` of them (a
finished state has two branches, one per table); a running job says whether its process
is gone (`worker_gone`: `%(now)s`, `%(beat_ms)s`)."""


def _page(order: str) -> str:
    """A page of jobs in `order` (`DESC` or `ASC`), one branch per state."""
    branches = [
        _PAGE_BRANCH.substitute(state=state, at=at, table=table, order=order, **_WAYS[order])
        for state, at, table in _STATES
    ]
    return _PAGE.substitute(
        branches="\n        UNION ALL\n        ".join(branches),
        order=order,
        gone=worker_gone("page", "page.updated_at"),
    )


WEB_JOBS_NEWEST = statement(_page("DESC"))
"""One page of the dashboard's job list: jobs of one state (and optionally one name),
newest first, after the keyset cursor (`key`, `after`: the last row's key and id; NULL
for the first page); without arguments, with a text `key` (its order key in UTC) to ask
for the next page by. The key is any time PostgreSQL holds, written so that it reads
back as the same time: `YYYY-MM-DDTHH:MM:SS.ffffff` (` BC` after a year before 1), or
`infinity` or `-infinity`, which another client may have written (`web.params` checks a
cursor sent back against that form). The page is ordered by the time itself
(`sort_at`, never read by Python, which cannot hold `infinity`), not by its text.

A state is ordered by the partial index that holds it: queued jobs by due time
(`axa_queue_ready`), running ones and those in review by their last change
(`axa_queue_running`, `axa_queue_review`), finished ones by when they finished
(`axa_queue_finished`, and `axa_queue_history_finished` for those moved: a finished
state has a branch per table, merged by the page's order and limit). Each state is a branch naming its status as a literal, so even
a generic plan (the queue's connections force them) can use its partial index; the
`%(state)s` test of the other branches is a one-time filter that skips them unread.
The cursor condition starts the index scan at the key, so a page deep into millions of
finished rows costs what the first one does; with no cursor it is `infinity` and the
largest id, never an `OR` that would keep the bound out of the index scan. Each branch
orders by the qualified column (`axa_queue.updated_at`): the bare name would be the
output column of that name, its epoch seconds, which no index holds."""

WEB_JOBS_OLDEST = statement(_page("ASC"))
"""The same page, oldest first (`WEB_JOBS_NEWEST` explains its shape): the cursor
bounds are the other way, and a missing cursor is `-infinity` and the smallest id."""

WEB_FINISHED_PER_MINUTE = statement("""SELECT
    EXTRACT(EPOCH FROM date_bin('1 minute', updated_at, TIMESTAMPTZ '2000-01-01 00:00:00+00'))::bigint
        AS minute,
    name,
    count(*) FILTER (WHERE status = 'completed') AS completed,
    count(*) FILTER (WHERE status = 'failed') AS failed,
    count(*) FILTER (WHERE status = 'cancelled') AS cancelled
    FROM (
        SELECT updated_at, name, status FROM {axa_queue}
        WHERE status IN ('completed', 'failed', 'cancelled')
          AND updated_at >= to_timestamp(%(since)s::float8)
          AND updated_at < COALESCE(to_timestamp(%(until)s::float8), 'infinity'::timestamptz)
        UNION ALL
        SELECT updated_at, name, status FROM {axa_queue_history}
        WHERE updated_at >= to_timestamp(%(since)s::float8)
          AND updated_at < COALESCE(to_timestamp(%(until)s::float8), 'infinity'::timestamptz)
    ) finished
    GROUP BY 1, 2""")
"""Jobs that finished in a window of whole minutes (`since`, `until`: epoch seconds;
`until` NULL: from `since` on, short of `infinity`, a time another client may have
written and which has no minute), per minute and name: what the dashboard's charts and its
"finished in the last hour" counts are made from. It reads only the window, moved jobs
included, through `axa_queue_finished` and the history's day partitions of the window: the dashboard asks for each past hour once and then only for the
last two minutes at each refresh, keeping what it read (`web.history`), so a refresh
never reads the finished rows of the day again."""

WEB_ACTS = statement("""SELECT id, job_id, job_name, act, attempts, by, reason, EXTRACT(EPOCH FROM at) AS at,
    db_role FROM {axa_job_acts}
    WHERE (%(by)s::text IS NULL OR by = %(by)s)
      AND (%(act)s::text IS NULL OR act = %(act)s)
      AND id < COALESCE(%(before)s::bigint, 9223372036854775807)
    ORDER BY id DESC LIMIT %(limit)s""")
"""The acts log: every act, newest first, optionally by one person or of one kind, one
page before the act `before` (the last one shown); walks the primary key backwards from
`before`, which is the scan's start whatever the plan (as `id < $1 OR $1 IS NULL` it was
a filter of a walk from the newest act: a deep page read every act after it)."""
