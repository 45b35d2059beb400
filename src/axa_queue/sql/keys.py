"""Fairness by key: queuing jobs that carry a key (`NewJob.key`), the claim that takes a
keyed name's jobs from its keys in turn under a per-key limit (`EXCHANGE_KEYED`), and
the counts by key (`KEY_COUNTS`).

Kept apart from the statements every queue sends: a job without a key is queued by
`ENQUEUE`, `ENQUEUE_MANY` and `ENQUEUE_COPY` as before, and a process that claims no
name by key sends `EXCHANGE` (or its variants) as before, with the same plan. Only a
process that declared a name keyed (`Queue.limit_per_key`, `QueueOptions.keyed`) sends
`EXCHANGE_KEYED`, which is `EXCHANGE_RATED`'s pieces (`sql.exchange`, `sql.rates`) with a keyed
gate in `wanted` and a second pick path beside `levels`.
"""

from __future__ import annotations

from string import Template

from .attempts import KEPT as _KEPT
from .exchange import (
    _CLAIMED,
    _CLAIMED_ROWS,
    _ENDINGS,
    _FINISHED,
    _LEVELS,
    _MARKED,
    _MARKED_READ,
    _NOT_ENDING,
    _unpaused,
    _with,
)
from .naming import statement
from .rates import _RATE_WAITS, _STAMPED, _TAKEN

__all__ = [
    "ENQUEUE_COPY_KEYED",
    "ENQUEUE_KEYED",
    "ENQUEUE_MANY_KEYED",
    "EXCHANGE_KEYED",
    "KEY_COUNTS",
    "KEY_WALK_SPARE",
    "KEY_WALK_WINDOW",
]

# --- Queuing jobs with a key ---------------------------------------------------------------

ENQUEUE_KEYED = statement("""INSERT INTO {axa_queue} (id, name, args, max_attempts, priority, run_at, timeout_ms,
                           trace_context, key)
    VALUES (%(id)s, %(name)s, %(args)s::text::jsonb, %(max_attempts)s, %(priority)s,
            COALESCE(%(at)s, COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => %(delay)s)),
            %(timeout_ms)s, %(trace_context)s::text::jsonb, %(key)s)""")
"""`ENQUEUE` for one job with a key (`NewJob.key`): the same row, and its key."""

ENQUEUE_MANY_KEYED = statement("""INSERT INTO {axa_queue} (id, name, args, max_attempts, priority, run_at, timeout_ms,
                           trace_context, key)
    SELECT j.id, j.name, j.args::jsonb, j.max_attempts, j.priority,
           COALESCE(j.at, COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => j.delay)),
           j.timeout_ms, %(trace_context)s::jsonb, j.key
    FROM unnest(%(id)s::uuid[], %(name)s::text[], %(args)s::text[], %(max_attempts)s::int[],
                %(priority)s::smallint[], %(at)s::timestamptz[], %(delay)s::float8[],
                %(timeout_ms)s::bigint[], %(key)s::text[])
         AS j(id, name, args, max_attempts, priority, at, delay, timeout_ms, key)""")
"""`ENQUEUE_MANY` for a batch in which some job has a key (the others' NULL)."""

ENQUEUE_COPY_KEYED = statement("""COPY {axa_queue} (id, name, args, max_attempts, priority, timeout_ms, trace_context, key)
    FROM STDIN (FORMAT BINARY)""")
"""`ENQUEUE_COPY` for a batch due now in which some job has a key: the same COPY, the
key as its last column."""

# --- The keyed claim -------------------------------------------------------------------------

_KEY_GATES = _unpaused("""gates AS (
        SELECT w.name, w.rate, w.per_ms, w.keyed, w.per_key, w.after,
            CASE WHEN w.global IS NULL THEN least(w.cap, %(free)s)
                ELSE least(w.cap, %(free)s, {axa_queue_room}({'axa_queue'}::regclass, w.name, w.global))
            END AS asked,
            CASE WHEN w.rate IS NULL THEN NULL
                ELSE {axa_queue_rate_slots_free}({'axa_queue'}::regclass, {'axa_rate_slots'}::regclass,
                                         w.name, w.rate, w.per_ms, %(now)s::timestamptz,
                                         least(w.cap, %(free)s))
            END AS slots,
            CASE WHEN w.per_key IS NULL THEN NULL
                ELSE {axa_queue_key_room}({'axa_queue'}::regclass, w.name)
            END AS busy
        FROM (SELECT r.name, r.cap, COALESCE(r.keyed, false) OR r.per_key IS NOT NULL AS keyed,
                     CASE WHEN r.global > 2147483647 THEN 2147483647 WHEN r.global < 0 THEN 0
                          ELSE r.global END::int AS global,
                     CASE WHEN r.rate > 100000 THEN 100000 WHEN r.rate < 0 THEN 0
                          ELSE r.rate END::int AS rate,
                     CASE WHEN r.per_ms > 3155760000000 THEN 3155760000000 WHEN r.per_ms < 0 THEN 0
                          ELSE r.per_ms END AS per_ms,
                     CASE WHEN r.per_key > 2147483647 THEN 2147483647 WHEN r.per_key < 0 THEN 0
                          ELSE r.per_key END::int AS per_key,
                     r.after
              FROM json_to_recordset(%(wanted)s::json)
                  AS r(name text, cap int, global bigint, rate bigint, per_ms bigint, keyed boolean,
                       per_key bigint, after text)) w
        WHERE %(free)s > 0$unpaused
        OFFSET 0""")
"""`rates._GATES` with a name's keys: whether it is claimed by key (`keyed`, also
true for a name with a per-key limit), its per-key limit (`per_key`, clamped to an
`integer`), where its last claim's walk stopped (`after`, a key), and under a per-key
limit its running jobs by key (`busy`), which `axa_queue_key_room` (migration 15)
counts after taking the name's lock, the lock of the global and rate limits."""

_KEY_WANTED = """wanted AS MATERIALIZED (
        SELECT g.name, g.rate, g.per_ms, g.asked, g.slots, g.per_key, g.after, g.busy,
               CASE WHEN g.keyed THEN 0
                    WHEN g.slots IS NULL THEN g.asked ELSE least(g.asked, cardinality(g.slots)) END AS cap,
               CASE WHEN NOT g.keyed THEN 0
                    WHEN g.slots IS NULL THEN g.asked ELSE least(g.asked, cardinality(g.slots)) END AS kcap
        FROM gates g"""
"""The names to claim behind `_KEY_GATES`, as `rates._WANTED_RATED` makes them, each
cap given to one path: `cap` to `levels` (a name not claimed by key), `kcap` to `walk`
(a keyed name; `levels` leaves a name of cap 0 alone)."""

KEY_WALK_SPARE = 8
"""How many probes a keyed name's walk may spend beyond twice its cap (on keys with
nothing due, keys at their limit, and the steps between levels and around the ring)."""

KEY_WALK_WINDOW = 256
"""How many entries of `axa_queue_keyed` one step of a keyed name's walk reads at most
looking for the next key with a job due: keys whose jobs are all delayed (retries in
their backoff, say) are passed many to a step, and a key with a long delayed backlog
costs a step per this many of its entries."""

_WALK = Template("""walk(name, kcap, priority, due, key, wrapped, probes, stops, useful, room) AS (
        SELECT w.name, w.kcap, 32768, false, NULL::text, false, 0, 0, false, 0
        FROM wanted w WHERE w.kcap > 0
        UNION ALL
        SELECT s.name, s.kcap, n.level, n.due, n.at_key, n.wrapped, s.probes + 1,
               s.stops + (n.useful)::int, n.useful, n.room
        FROM walk s
        CROSS JOIN LATERAL (
            SELECT x.level, x.due, x.at_key, x.wrapped, x.o,
                   x.bare OR (x.at_key IS NOT NULL AND x.run_at <= now() AND x.room > 0) AS useful,
                   x.room
            FROM (
                SELECT v.*, CASE WHEN v.bare THEN w.kcap
                                 WHEN v.at_key IS NULL THEN 0
                                 WHEN w.per_key IS NULL THEN w.kcap
                                 ELSE w.per_key - COALESCE((w.busy ->> v.at_key)::int, 0) END AS room
                FROM wanted w, LATERAL (
                    (SELECT e.level, s.due, e.at_key, s.wrapped, e.run_at, 1 AS o, false AS bare FROM (
                        SELECT priority::int AS level, key AS at_key, run_at FROM {axa_queue}
                        WHERE status = 'queued' AND key IS NOT NULL AND name = ANY(ARRAY[s.name])
                          AND priority = s.priority AND key > COALESCE(s.key, w.after, '')
                          AND s.due AND NOT s.wrapped
                        ORDER BY name, priority DESC, key, run_at LIMIT $window) e
                     WHERE e.run_at <= now() LIMIT 1)
                    UNION ALL
                    (SELECT priority::int AS level, s.due, key AS at_key, s.wrapped, run_at, 2, false
                     FROM {axa_queue}
                     WHERE status = 'queued' AND key IS NOT NULL AND name = ANY(ARRAY[s.name])
                       AND priority = s.priority AND key > COALESCE(s.key, w.after, '')
                       AND s.due AND NOT s.wrapped
                     ORDER BY name, priority DESC, key, run_at OFFSET $window - 1 LIMIT 1)
                    UNION ALL
                    (SELECT e.level, s.due, e.at_key, true, e.run_at, 3, false FROM (
                        SELECT priority::int AS level, key AS at_key, run_at FROM {axa_queue}
                        WHERE status = 'queued' AND key IS NOT NULL AND name = ANY(ARRAY[s.name])
                          AND priority = s.priority
                          AND key > CASE WHEN s.wrapped THEN s.key ELSE '' END AND key <= w.after
                          AND s.due
                        ORDER BY name, priority DESC, key, run_at LIMIT $window) e
                     WHERE e.run_at <= now() LIMIT 1)
                    UNION ALL
                    (SELECT priority::int AS level, s.due, key AS at_key, true, run_at, 4, false
                     FROM {axa_queue}
                     WHERE status = 'queued' AND key IS NOT NULL AND name = ANY(ARRAY[s.name])
                       AND priority = s.priority
                       AND key > CASE WHEN s.wrapped THEN s.key ELSE '' END AND key <= w.after
                       AND s.due
                     ORDER BY name, priority DESC, key, run_at OFFSET $window - 1 LIMIT 1)
                    UNION ALL
                    (SELECT priority::int AS level, run_at <= now(), NULL::text, false, run_at, 5,
                            run_at <= now() AND key IS NULL
                     FROM {axa_queue}
                     WHERE status = 'queued' AND name = ANY(ARRAY[s.name]) AND priority < s.priority
                     ORDER BY name, priority DESC, run_at LIMIT 1)
                    LIMIT 1
                ) v
                WHERE w.name = s.name
            ) x
        ) n
        WHERE s.stops < s.kcap AND s.probes < 2 * s.kcap + $spare AND NOT (n.o = 5 AND s.stops > 0)""")
"""Each keyed name's walk over its keys, at most `2 * kcap + KEY_WALK_SPARE` steps. From a
level (the anchor is one above every priority) a step goes to the next key of the level
in `axa_queue_keyed` that has a job due (key order, starting after the key where the
process's last walk of the name stopped, `after`: branch 1, which reads at most
`KEY_WALK_WINDOW` entries; none due among them, branch 2 steps to the last entry read,
a key with nothing due); then around to the level's first keys, up to `after`
(branches 3 and 4, likewise); the level's keys all seen, down to the next level in
`axa_queue_pick` (branch 5: its first entry says whether anything of the level is due;
a level with nothing due is passed in that one step). A key's entries are in due-time
order, so the first due entry found after a key is the first entry of its own key.
A level entered whose oldest due job (in `axa_queue_pick`'s order) has no key is a useful
stop of its own (`bare`): jobs without a key are claimed in their place in the name's
order, never left behind. A key is useful when its job is due and it has room: its per-key limit less its running
jobs (`busy`), else the name's cap. The walk stops at `kcap` useful keys, and never goes
down a level once it found one: priority comes first within a name, keys take turns
within a level. Each branch asks for an index's own order (the level as `level`, never
a cast named `priority` that ORDER BY would take for the column), the name compared by
`= ANY(ARRAY[...])` as `levels` does, so no other index serves it (the exchange
connection plans without sorts); a branch is read only when those before it found
nothing (an `Append` under `LIMIT 1`). A `string.Template` (`spare=`, `window=`)."""

_STOPS = """stops AS MATERIALIZED (
        SELECT s.name, s.priority, s.key, s.room, count(*) OVER (PARTITION BY s.name) AS m
        FROM walk s WHERE s.useful"""
"""The useful keys each walk found, and how many (`m`)."""

_KEYED = Template("""keyed AS (
        SELECT s.name, s.priority, t.id, t.tid, t.run_at, t.turn
        FROM stops s JOIN wanted w ON w.name = s.name
        CROSS JOIN LATERAL (
            SELECT array_agg(id) AS ids, array_agg(run_at) AS runs, array_agg(tid) AS tids FROM (
                SELECT k.id, k.run_at, k.tid FROM (
                    SELECT id, run_at, ctid AS tid FROM {axa_queue}
                    WHERE status = 'queued' AND key IS NOT NULL AND name = ANY(ARRAY[s.name])
                      AND priority = s.priority AND key >= s.key AND key <= s.key
                      AND run_at <= now()$fence
                      AND id <> ALL(%(losing)s::uuid[]) AND s.key IS NOT NULL
                    ORDER BY name, priority DESC, key, run_at
                    LIMIT least(s.room, (w.kcap + s.m - 1) / s.m) FOR UPDATE SKIP LOCKED
                ) k
                UNION ALL
                SELECT b.id, b.run_at, b.tid FROM (
                    SELECT id, run_at, ctid AS tid, key FROM {axa_queue}
                    WHERE status = 'queued' AND name = ANY(ARRAY[s.name])
                      AND priority = s.priority AND run_at <= now()$fence
                      AND id <> ALL(%(losing)s::uuid[]) AND s.key IS NULL
                    ORDER BY name, priority DESC, run_at
                    LIMIT (w.kcap + s.m - 1) / s.m FOR UPDATE SKIP LOCKED
                ) b WHERE b.key IS NULL
            ) x
        ) a
        CROSS JOIN LATERAL unnest(a.ids, a.runs, a.tids) WITH ORDINALITY AS t(id, run_at, tid, turn)""")
"""From each useful key, its oldest due jobs, locked, skipping rows others hold: its
share of the name's cap (`kcap` over the `m` keys, rounded up) within its room. From a
level whose oldest due job has no key (`walk`'s `bare` stop), the level's oldest due
jobs in `axa_queue_pick`'s order, as many as a share, keeping those without a key (the
others, locked for the statement, are claimed by their key's turn or let go at the
commit): jobs without a key take their place in the name's order, first come first
served, as the name's jobs do when it is not claimed by key. `turn`
numbers a key's jobs, 1 for its first: the claim takes every key's first job before
any key's second. The key is bounded from both sides (`key >= s.key AND key <= s.key`),
not compared with `=`: with an `=` the planner takes the key out of the order asked
for, and `axa_queue_pick` gives the rest of it, so a plan made while the table was
empty read one key's jobs by filtering the whole level (50,000 entries of another key
in a test); `= ANY(ARRAY[...])`, the name's way, is no index condition on a third
column of an ordered scan. A range keeps the key in the order, which only
`axa_queue_keyed` gives, and is an index condition of it. A `string.Template` (`fence=`), as `exchange._LEVELS`."""

_KEY_PICKED = """picked AS MATERIALIZED (
        SELECT id, tid, row_number() OVER (ORDER BY priority DESC, turn, run_at) AS rank FROM (
            SELECT j.id, j.tid, l.priority, 1::bigint AS turn, j.run_at
            FROM levels l CROSS JOIN LATERAL unnest(l.ids, l.runs, l.tids) AS j(id, run_at, tid)
            UNION ALL
            SELECT k.id, k.tid, k.priority, k.turn, k.run_at FROM keyed k
        ) c ORDER BY priority DESC, turn, run_at LIMIT %(free)s"""
"""`exchange._PICKED` over both paths: highest priority first, then by turn (a keyed
job's place among its key's, 1 for every job of `levels`), then oldest."""

_KEY_ENDED_ROWS = """SELECT id, attempts, NULL AS name, NULL AS args, NULL AS max_attempts, NULL AS timeout_ms,
           NULL AS priority, NULL AS run_at, NULL AS trace_context, NULL AS ahead, NULL AS key
    FROM finished"""
"""`exchange._ENDED_ROWS`, with no key: the endings recorded."""

_KEY_CLAIMED_ROWS = Template(
    "SELECT c.*, (SELECT q.key FROM {axa_queue} q WHERE q.id = c.id::uuid) AS key\n"
    "    FROM ($rows) c"
).substitute(rows=_CLAIMED_ROWS + _MARKED_READ)
"""`exchange._CLAIMED_ROWS` with each job's key, read by primary key (the row as the
statement's snapshot has it: its key is the one claimed), so `exchange._CLAIMED`, shared
by every claim, is unchanged."""

_KEY_RATE_WAITS = Template(
    "SELECT NULL, NULL, r.name, NULL, NULL, NULL, NULL, r.wait, NULL, NULL, NULL\n"
    "    FROM ($waits) AS r(id, attempts, name, args, max_attempts, timeout_ms, priority, wait,\n"
    "                       trace, ahead)"
).substitute(waits=_RATE_WAITS)
"""`rates._RATE_WAITS`, with no key."""

_KEY_CURSORS = """SELECT NULL, NULL, w.name, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
           (SELECT s.key FROM walk s WHERE s.name = w.name AND s.key IS NOT NULL
            ORDER BY s.probes DESC LIMIT 1)
    FROM wanted w WHERE w.kcap > 0"""
"""For each keyed name walked, a row with no id and no `run_at`: the name, and the last
key its walk visited, where its next walk starts (the client sends it back as
`after`). So keys take turns across claims, and a walk that spent its probes on keys
at their limit goes on from there next time."""

EXCHANGE_KEYED = statement(
    _with(
        [
            _ENDINGS,
            _FINISHED,
            _MARKED,
            _KEY_GATES,
            _KEY_WANTED,
            _LEVELS.substitute(fence=_NOT_ENDING),
            _WALK.substitute(spare=KEY_WALK_SPARE, window=KEY_WALK_WINDOW),
            _STOPS,
            _KEYED.substitute(fence=_NOT_ENDING),
            _KEY_PICKED,
            _CLAIMED,
            *_KEPT,
            _TAKEN,
            _STAMPED,
        ],
        [_KEY_ENDED_ROWS, _KEY_CLAIMED_ROWS, _KEY_RATE_WAITS, _KEY_CURSORS],
    )
)
"""`EXCHANGE_RATED` for a process that claims some names by key (`Queue.limit_per_key`,
`QueueOptions.keyed`): a wanted name may carry `keyed`, `per_key` and `after`
(`[{"name", "cap", "global", "rate", "per_ms", "keyed", "per_key", "after"}]`), and is
then claimed by `walk`, `stops` and `keyed` instead of `levels`: its keys with due work
take turns, one probe of `axa_queue_keyed` per key, so a key with 100,000 waiting jobs
and a key with 10 both get jobs from the first claim, highest priority still first.

A per-key limit is exact across processes as a global limit is: `axa_queue_key_room`
takes the name's lock (held to the commit) and counts the name's running jobs by key
with a snapshot of its own, taken after the lock, so it sees every claim committed
before; a key's share is cut to its limit less that count. Jobs claimed ahead are
`running`, so they count. Rows returned carry the job's key (`key`, NULL for the
endings); one more row per keyed name (no id, no `run_at`) says where its walk
stopped. Names not claimed by key go through `levels` as in `EXCHANGE`. A process with
no keyed name never sends this statement."""

# --- Counts by key ---------------------------------------------------------------------------

KEY_COUNTS = statement("""SELECT key,
        count(*) FILTER (WHERE status = 'queued' AND run_at <= COALESCE(%(now)s::timestamptz, now())) AS ready,
        count(*) FILTER (WHERE status = 'queued' AND run_at > COALESCE(%(now)s::timestamptz, now())) AS waiting,
        count(*) FILTER (WHERE status = 'running') AS running,
        sum(count(*)) OVER () >= %(cap)s AS capped,
        sum(count(*) FILTER (WHERE status = 'queued' AND run_at <= COALESCE(%(now)s::timestamptz, now()))) OVER () AS all_ready,
        sum(count(*) FILTER (WHERE status = 'queued' AND run_at > COALESCE(%(now)s::timestamptz, now()))) OVER () AS all_waiting,
        sum(count(*) FILTER (WHERE status = 'running')) OVER () AS all_running
    FROM (SELECT key, status, run_at FROM {axa_queue}
          WHERE name = %(name)s AND key IS NOT NULL AND status IN ('queued', 'running')
          LIMIT %(cap)s) j
    GROUP BY key
    ORDER BY count(*) DESC, key
    LIMIT %(most)s""")
"""The busiest keys of one job name: each key's ready, waiting (queued for later) and
running jobs, the most live jobs first, at most `most` keys, each row with the totals
of every key read (`all_ready`, `all_waiting`, `all_running`: window sums, taken before
the `LIMIT`). Reads at most `cap` of the
name's live keyed jobs (through `axa_queue_keyed` and `axa_queue_running_keys`): past
that, the counts are those of the jobs read (`capped`), lower bounds."""
