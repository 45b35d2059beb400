"""The exchange: the one statement that records how runs ended and claims new ones,
and its variants, each composed from the named CTEs below (one place per piece, with
why it is there), never by editing another statement's text:

- `EXCHANGE`: endings, start marks and the claim;
- `EXCHANGE_LIMITED`: the same, the wanted names gated by their global limits;
- `EXCHANGE_RATED` (in `rates`, with the rate limits' pieces): the same, gated by
  global and rate limits, the slots it claims by stamped, and a row saying when to
  look again;
- `CLAIM`: the claim alone, nothing to record.

Each keeps the attempts too (`sql.attempts`): a claim stamps the run's process on its
job's row, and `ended` writes a row for every ending but a completion.

`axa-queue sql --statement EXCHANGE_LIMITED` prints any of them whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from string import Template

from .attempts import KEPT as _KEPT
from .naming import statement

__all__ = ["CLAIM", "EXCHANGE", "EXCHANGE_LIMITED"]


def _with(ctes: Sequence[str], rows: Sequence[str]) -> str:
    """The statement `WITH RECURSIVE` the named CTEs (`name AS (body`, each closed
    here), in order, returning the `rows` SELECTs, joined by `UNION ALL`. RECURSIVE
    is for `levels`, and allows every other CTE as it is."""
    return (
        "WITH RECURSIVE "
        + "\n    ), ".join(ctes)
        + "\n    )\n    "
        + "\n    UNION ALL\n    ".join(rows)
    )


# --- The endings and the start marks ----------------------------------------------------

_ENDINGS = """endings AS (
        SELECT d.id, d.attempts, 'completed' AS status, NULL::text AS error, 0::float8 AS delay,
               NULL::jsonb AS result, NULL::bigint AS max_attempts, NULL::boolean AS slept,
               NULL::jsonb AS trace
        FROM unnest(%(completed)s::uuid[], %(completed_attempts)s::int[]) AS d(id, attempts)
        UNION ALL
        SELECT * FROM json_to_recordset(%(endings)s::json)
            AS r(id uuid, attempts int, status text, error text, delay float8, result jsonb,
                 max_attempts bigint, slept boolean, trace jsonb)"""
"""The endings sent, one row each: completed runs as two array literals (the cheapest
parameters to build), every other ending as JSON (see `EXCHANGE`; `slept`: `ENDED`;
`trace`: the trace context of the run's span, when the worker traces runs, which a run
with dependents hands to them: migration 20)."""

_FINISHED = """finished AS (
        UPDATE {axa_queue} q
        SET status = r.status, error = r.error, result = r.result, run_trace = r.trace,
            max_attempts = CASE WHEN r.max_attempts IS NULL THEN q.max_attempts
                                ELSE LEAST(r.max_attempts, 2147483647)::int END,
            updated_at = COALESCE(%(now)s::timestamptz, now()),
            started_at = CASE WHEN r.status = 'queued' THEN NULL ELSE q.started_at END,
            run_at = CASE WHEN r.status = 'queued'
                          THEN COALESCE(%(now)s::timestamptz, now())
                               + make_interval(secs => CASE WHEN r.delay > 3155760000 THEN 3155760000
                                                            ELSE r.delay END)
                          ELSE q.run_at END
        FROM endings r
        WHERE q.id = ANY(ARRAY(SELECT id FROM endings)) AND q.id = r.id
          AND q.attempts = r.attempts AND q.status = (SELECT 'running')
        RETURNING q.id::text AS id, q.attempts,
            CASE WHEN q.status = 'queued' THEN false
                 WHEN NOT pg_try_advisory_xact_lock_shared(1635213687, {'axa_queue'}::regclass::oid::int4)
                      THEN pg_notify('axa_queue_done', {'axa_queue'}::regclass::oid::text || ' ' || q.id::text)
                           ::text IS NOT NULL
                 WHEN pg_try_advisory_lock(1635213688, {'axa_queue'}::regclass::oid::int4)
                      THEN NOT pg_advisory_unlock(1635213688, {'axa_queue'}::regclass::oid::int4)
                 ELSE pg_notify('axa_queue_done', {'axa_queue'}::regclass::oid::text || ' ' || q.id::text)
                      ::text IS NOT NULL
            END AS told"""
"""The endings written, each fenced by its attempt and `running` (found by primary key,
the status compared through `(SELECT 'running')`), each finished job told to waiters
when anyone waits (`told`, the two advisory locks of `EXCHANGE`'s last part)."""

_MARKED = """marked AS (
        UPDATE {axa_queue} q SET ahead = NULL
        WHERE q.id = ANY(%(starts)s::uuid[])
          AND ((q.id, q.attempts) IN (SELECT m.id, m.attempts
                FROM unnest(%(starts)s::uuid[], %(started_attempts)s::int[]) AS m(id, attempts))) IS TRUE
          AND q.ahead = q.attempts AND q.status = (SELECT 'running')
          AND q.id NOT IN (SELECT id FROM endings)
        RETURNING q.id"""
"""The runs claimed ahead that a loop has started since: `ahead` cleared, fenced like an
ending (the row's attempt is the start's, and still the one claimed ahead), never a row
this statement also ends (a row changes once per statement). The rows are found by the
primary key (`= ANY`), whatever the statistics; each one's attempt is then looked up in
a hash of the starts made once (a hashed sub-plan: `IS TRUE` keeps the `IN` from being
made a join, which the planner ran as a loop reading every start for each row: 40,000
comparisons for 200 starts), as the `NOT IN`s of this statement look up its endings."""

# --- The claim ---------------------------------------------------------------------------

_UNPAUSED = """
          AND NOT EXISTS (SELECT FROM {axa_paused} p WHERE p.name = w.name)"""
"""A wanted name is claimed only while no person paused it (`axa_paused`, migration 9):
one probe of that table's primary key per name per statement, so a pause needs no
other round trip, and reaches every process at its next claim. It is a filter of
`wanted`, before any limit's function is called for the name."""


def _unpaused(piece: str) -> str:
    """`piece` with its `$unpaused` slot filled by `_UNPAUSED`."""
    return Template(piece).substitute(unpaused=_UNPAUSED)


_WANTED = _unpaused("""wanted AS (
        SELECT w.name, least(w.cap, %(free)s) AS cap
        FROM json_to_recordset(%(wanted)s::json) AS w(name text, cap int)
        WHERE %(free)s > 0$unpaused""")
"""The names to claim and at most how many of each (`[{"name", "cap"}]`), none when no
loop is free. Nothing volatile in it, so the planner folds it into the claim: the plan
of a process without limits."""

_WANTED_GLOBAL = _unpaused("""wanted AS (
        SELECT w.name, CASE WHEN w.global IS NULL THEN least(w.cap, %(free)s)
            ELSE least(w.cap, %(free)s, {axa_queue_room}({'axa_queue'}::regclass, w.name,
                                                       greatest(least(w.global, 2147483647), 0)::int))
            END AS cap
        FROM json_to_recordset(%(wanted)s::json) AS w(name text, cap int, global bigint)
        WHERE %(free)s > 0$unpaused""")
"""`_WANTED` with a name's global limit (`global`, clamped to an `integer`): its cap cut
to the room `axa_queue_room` finds under the name's lock (see `EXCHANGE_LIMITED`);
names without one never call it."""

_NOT_ENDING = " AND id NOT IN (SELECT id FROM endings)"
"""The claim's fence against this statement's own endings: a job whose ending was
refused (recovery queued it again) is never claimed by the statement that carried its
ending. `CLAIM`, with no endings, has no such fence. A `NOT IN` of a sub-select is a
hashed sub-plan (the endings hashed once, each row looked up); `<> ALL(ARRAY(...))`
compared each row read with every ending (200 endings and 200 rows claimed: 40,000
comparisons a statement)."""

_LEVELS = Template("""levels(name, cap, priority, got, ids, runs, tids) AS (
        SELECT w.name, w.cap, 32768, 0, NULL::uuid[], NULL::timestamptz[], NULL::tid[]
        FROM wanted w WHERE w.cap > 0
        UNION ALL
        SELECT l.name, l.cap, f.priority::int, l.got + j.n::int, j.ids, j.runs, j.tids
        FROM levels l
        CROSS JOIN LATERAL (
            SELECT priority, run_at FROM {axa_queue}
            WHERE status = 'queued' AND hashtext(name) = ANY(ARRAY[hashtext(l.name)])
              AND priority < l.priority
            ORDER BY hashtext(name), priority DESC, run_at LIMIT 1
        ) f
        CROSS JOIN LATERAL (
            SELECT count(*) AS n, array_agg(id) AS ids, array_agg(run_at) AS runs,
                   array_agg(ctid) AS tids FROM (
                SELECT id, run_at, ctid FROM {axa_queue}
                WHERE status = 'queued' AND hashtext(name) = ANY(ARRAY[hashtext(l.name)])
                  AND name = l.name AND priority = f.priority
                  AND run_at >= f.run_at AND run_at <= now() AND f.run_at <= now()$fence
                  AND id <> ALL(%(losing)s::uuid[])
                ORDER BY hashtext(name), priority DESC, run_at LIMIT l.cap - l.got FOR UPDATE SKIP LOCKED
            ) t
        ) j
        WHERE l.got < l.cap""")
"""Each wanted name's levels, highest first, walked down in its own part of
`axa_queue_pick_hash` (migration 19: the name's 32-bit hash, priority, due time; 24
bytes an entry, as narrow as `axa_queue_claim`, so a walk over dead entries reads no
more index pages than the single-index claim) until it has its `cap` of jobs (then no
further: no more rows locked than it may claim) or no level is left. The anchor is a
level above every priority (`smallint` stops at 32767). A probe, `f`, finds the next
level's first queued entry; the level's oldest due jobs it still needs are read from
that entry on (one snapshot: no queued row of the level sorts before it) up to
`now()`, locked, skipping rows others hold (`ids`, `runs`, and `tids`, the `ctid`
each was locked at, which `claimed` updates by); `got` counts them. So dead entries in
front of a level (jobs finished while vacuum was held back) are walked once, and
delayed jobs never (a level whose first entry is not due is not scanned: `f.run_at <=
now()` is a one-time test). Never a job in `losing` (a run of this process that lost
its claim, until its job's fate is written), nor one the `$fence` excludes. The scan
compares the name itself (the row's); the probe, reading the index alone, cannot: a
name whose hash another shares may be probed a level of the other's (whose first
entry is then no later than its own, and due when its own is), which only costs a
scan that finds nothing. Both ask for the index's own order, the hash compared by `=
ANY(ARRAY[...])`, which the planner keeps in the order (an `=` it would fold away): no
other index gives it without a sort, and the exchange connection plans without sorts
where an index gives the order (`session.CLAIM_SETTINGS`), so no statistics send it
through another index. A `string.Template`, filled with `fence=` (`$` marks its slot,
other marks pass through)."""


_PICKED = """picked AS MATERIALIZED (
        SELECT id, tid, row_number() OVER (ORDER BY priority DESC, run_at) AS rank FROM (
            SELECT j.id, j.tid, l.priority, j.run_at
            FROM levels l CROSS JOIN LATERAL unnest(l.ids, l.runs, l.tids) AS j(id, run_at, tid)
        ) c ORDER BY priority DESC, run_at LIMIT %(free)s"""
"""The jobs claimed, at most `free` (at most `cap` of each name: `levels` took no
more), highest priority then oldest first, ranked in that order (the ranks past `idle`
are claimed ahead), each with the `ctid` it was locked at; MATERIALIZED, so no more
rows change than it picks."""

_CLAIMED = """claimed AS (
        UPDATE {axa_queue} q
        SET status = 'running', started_at = COALESCE(%(now)s::timestamptz, clock_timestamp()), updated_at = COALESCE(%(now)s::timestamptz, clock_timestamp()),
            attempts = q.attempts + 1,
            max_attempts = COALESCE(q.max_attempts, (%(limits)s::jsonb ->> q.name)::int, %(max)s::int),
            run_worker = %(worker)s::uuid, run_attempt = q.attempts + 1, run_host = %(host)s::text,
            run_pid = %(pid)s::int,
            ahead = CASE WHEN q.id = ANY(ARRAY(SELECT id FROM picked WHERE rank <= %(idle)s))
                         THEN NULL ELSE q.attempts + 1 END
        WHERE q.ctid = ANY(ARRAY(SELECT tid FROM picked))
        RETURNING q.id::text AS id, q.attempts, q.name, q.args::text AS args, q.max_attempts,
                  q.timeout_ms, q.priority, extract(epoch FROM q.run_at)::float8 AS run_at,
                  q.trace_context::text AS trace_context, q.ahead IS NOT NULL AS ahead"""
"""The picked jobs claimed by the `ctid` each was locked at (a TID scan: the rows
`levels` read, no index again; a row locked cannot move or be removed before the
commit). A row changed by another transaction after this statement's snapshot, whose
lock followed it to its newer version, is not visible at that `ctid` to this snapshot:
it stays queued, for the next claim, never claimed twice. Each is stamped with
`clock_timestamp()` when its row is written, its attempt counted, its attempt limit stored when it had none (the
one that applies: its handler's, else the queue's, `limits.AttemptLimits.params`, so
every reader shows `2 of 3`), stamped with the claiming process (`run_worker`, its id
in `axa_workers`, `run_host`, `run_pid`, and the attempt they belong to,
`run_attempt`: migration 16), and `ahead` set past the `idle` loops: each row is
compared with the ids ranked within `idle` (an array made once, no longer than the
loops that were idle), not with those ranked past it (a fast drain claims about 200
ahead a statement: 40,000 comparisons). The stamp is the
run's start as the attempts read it back (`attempts.RUNS`): no other row is written per
claim."""

# --- The rows returned ---------------------------------------------------------------------

_ENDED_ROWS = """SELECT id, attempts, NULL AS name, NULL AS args, NULL AS max_attempts, NULL AS timeout_ms,
           NULL AS priority, NULL AS run_at, NULL AS trace_context, NULL AS ahead FROM finished"""
"""The endings recorded: rows without a name."""

_CLAIMED_ROWS = """SELECT id, attempts, name, args, max_attempts, timeout_ms, priority, run_at, trace_context,
           ahead
    FROM claimed"""
"""The jobs claimed: rows with a name."""

_MARKED_READ = "\n    WHERE (SELECT count(*) FROM marked) >= 0"
"""Reads `marked`, only to say it is read: PostgreSQL runs a data-modifying CTE whether
read or not."""

# --- The statements ------------------------------------------------------------------------

EXCHANGE = statement(
    _with(
        [
            _ENDINGS,
            _FINISHED,
            _MARKED,
            _WANTED,
            _LEVELS.substitute(fence=_NOT_ENDING),
            _PICKED,
            _CLAIMED,
            *_KEPT,
        ],
        [_ENDED_ROWS, _CLAIMED_ROWS + _MARKED_READ],
    )
)
"""In one statement and one commit: record how runs ended (completed, failed, or queued
again after a backoff), each row fenced by its own attempt, and claim up to `free` ready
jobs of the wanted names, highest priority then oldest first, at most `cap` of each.

Rows with a name are the jobs claimed, with the trace context stored when each was
queued (NULL for most: see `tracing`); rows without are the endings recorded (an ending
not returned had lost its claim). The claim walks each wanted name's priority levels
in its own part of `axa_queue_pick_hash` (`levels`), so finished and delayed jobs and
other names' jobs are never read (but a name of the same hash's), whatever the
statistics say, and dead entries are walked once; it picks in a MATERIALIZED CTE, so
no more than `free` rows change, and updates them by the `ctid` it locked them at (a
TID scan: no index is read again), which the exchange connection never plans as a scan
of the whole table (`session.CLAIM_SETTINGS`). Writing endings and claiming together halves the
statements per job: the loop that frees a place writes its ending and fills the place.

Completed runs, nearly every ending, arrive as two array literals (`completed`: ids,
`completed_attempts`: their attempts, in the same order); the other endings, completed
runs whose handler returned a value (not `None`) among them, and the wanted names as
JSON arrays (`[{"id", "attempts", "status", "error", "delay", "result",
"max_attempts"}]`, a missing key read as NULL, the result already JSON so the client
only puts text together; and `[{"name", "cap"}]`). `max_attempts` is there only for a
run its handler snoozed (`policies.Snooze`): the job's new limit, one more than the
run's, written with the ending, so a snooze costs no attempt of the job's. Every ending writes its `result`: NULL but for a completed run
that returned a value. Each is one text parameter: far cheaper for the client to build
than a list per column (psycopg's list dumpers are pure Python) or JSON per ending. Ids
come back as text and `run_at` as epoch seconds, which the client reads and sorts by
more cheaply than `uuid` and `timestamptz`. Endings find their rows by primary key
(`id = ANY(ARRAY(...))` again), and the fence compares the status with
`(SELECT 'running')`, a value the planner cannot match to the partial index of running
jobs: else, whenever its statistics say few jobs run, it scans that index whole (every
running job of every worker, and the dead entries vacuum has not cleared yet), or on a
table of some thousand rows the table.

One statement carries many runs' endings and every name's claim, so no one job's
values may fail it: a new limit past the most an `integer` holds (a snooze of a job at
`max_attempts` 2147483647) is read as a `bigint` and stops at 2147483647 (a `CASE`:
`LEAST` would make a missing one 2147483647, as it ignores NULLs), and a delay stops
at 100 years (`options.MAX_DURATION`, which no delay the worker makes passes).
What fails it even so (a data error: SQLSTATE class 22, 23 or 54), `Exchange` sends
again in parts to find the run or name at fault (see `Exchange.isolate`).

Fencing: the claim never takes a job whose ending is in this statement, nor one in
`losing` (jobs of this process whose run lost its claim, until its job's fate is
written): an ending refused because recovery queued the job again is never followed
by a new run of it here. The endings are written first (they may wait for a row lock)
and the claims after, stamped with `clock_timestamp()`: a claim is stamped when its
row is written, never with a time from before a wait, so it cannot land stale. `now`
(NULL but in tests) stands for both clocks in what is written. Which jobs are due is
always judged by `now()` itself: the planner evaluates it when it estimates a generic
plan, so it knows every queued job of a backlog is due and walks `axa_queue_pick` in
order; compared with a parameter it cannot estimate, it took the `run_at` index and
filtered a 100,000-job backlog (40 ms a claim instead of 0.3 ms).

Runs claimed ahead (`QueueOptions.prefetch`): the claimed rows ranked within `idle`
(the loops idle as the statement is sent), in the claim's own order, start at once and
are stamped `ahead` NULL; the others wait in the process for a loop and are stamped
`ahead` = their attempt, returned as `ahead` true: their handler has not started, so
if the process dies stale recovery gives the attempt back (`RECOVER_STALE`). When a
loop starts a waiting run, its (id, attempt) travels in the next statement (`starts`,
`started_attempts`, array literals) and `marked` clears `ahead`, fenced like an ending
by the attempt and `running` (a run given back, or claimed again by anyone, is not
touched); a run whose ending is in the same statement needs no mark (and a row must
not be changed twice by one statement). The loop never waits for the mark: a run
started less than one exchange before its process died may be taken as not started,
which `GIVE_BACK_LIMIT` bounds. `marked` is a data-modifying CTE, which PostgreSQL
runs whether read or not; the final `WHERE` reads it only to say so.

Row locks, and why no cycle of waits can form through this statement: it may wait for
a row lock in `finished` (the ended runs' rows) and then in `marked` (the started
runs' rows), two passes, each in its own order; its variants may then wait for names'
locks; the claim never waits (`SKIP LOCKED`), and `claimed` writes rows it locked
itself. An `UPDATE` waits only for a row its snapshot shows `running` under the
attempt it sends, a run of this process. Every other statement that can hold such a
row waits for no lock while it holds it: `HEARTBEAT` and `RECOVER_STALE` skip the rows
others hold (`SKIP LOCKED`), `MARK_LOST` and `CANCEL` lock one row and nothing else,
`GIVE_BACK` takes only runs that never started (no ending, no mark: never this
statement's rows), and another process's claim locks a row (recovered and claimed
again since this snapshot) after its own waits are over. So the order in which it
takes its rows does not matter: a heartbeat that waited for its rows, in the order of
its own plan, closed a cycle with it at speed (3 to 8 deadlocks in 30 s with 16 loops and a 50 ms
heartbeat, `bench/deadlocks.py`), which is why it no longer waits. The one cycle left
is a caller's: a transaction that cancels several running jobs of one process holds
each row until it commits, and can meet this statement in two orders; PostgreSQL
aborts one of them after `deadlock_timeout`, and the worker sends its statement again.

Global limits are claimed by `EXCHANGE_LIMITED`, and rate limits by `EXCHANGE_RATED`,
this statement with a gate in `wanted`; a process without any sends this one,
unchanged.

Waiters (`Queue.wait`): for each job it finishes (completed or failed, not queued
again), while someone waits for jobs of this table, it notifies `DONE_CHANNEL` with the
table's oid and the job's id, in `finished`'s RETURNING (`told`, which no one reads: a
data-modifying CTE's RETURNING is computed for every row; a CASE tries its conditions
in order, so the waiting lock, once taken, is always let go). Two advisory locks, keyed
by the table's oid, say when (`WAITING` is the other side):

- the waiting lock (1635213688): every waiting connection holds it shared for as long
  as it waits. The statement tries it exclusively and, when it gets it, lets it go at
  once (in the same expression: nothing can fail in between): nobody waits, so no
  NOTIFY, whose commit lock serialises every notifying transaction. Refused, it
  notifies. Two exchanges at once almost never meet on it (it is held for a moment),
  and if they do, one notifies for no one: wasted, never lost.
- the ending lock (1635213687): the statement holds it shared from before it asks
  whether anyone waits until it commits (exchanges never conflict on it). A new
  waiting connection, once it holds the waiting lock, takes the ending lock
  exclusively and lets it go: that waits for every statement that may have asked
  before it came to commit, and only then does it read the rows it waits for. So an
  ending is either committed before a waiter reads, or notified. The statement only
  tries the ending lock: refused (a waiting connection is taking it), it notifies
  without asking, and never waits behind a waiter, which may itself wait behind an
  exchange held up by a row lock.

One lock taken, and one taken and let go, per ending: under a microsecond each (a
`told` CTE over `finished` run by an InitPlan cost 10% more server CPU per statement at
one ending a statement; this costs nothing measurable)."""

EXCHANGE_LIMITED = statement(
    _with(
        [
            _ENDINGS,
            _FINISHED,
            _MARKED,
            _WANTED_GLOBAL,
            _LEVELS.substitute(fence=_NOT_ENDING),
            _PICKED,
            _CLAIMED,
            *_KEPT,
        ],
        [_ENDED_ROWS, _CLAIMED_ROWS + _MARKED_READ],
    )
)
"""`EXCHANGE` for a process with global limits (`Queue.limit(..., scope="global")`): the
same statement, but a wanted name may carry its `global` limit (`[{"name", "cap",
"global"}]`), and its cap is then cut to `axa_queue_room` (migration 6), which locks
the name for the rest of the transaction and counts its running jobs, every process's,
with a snapshot of its own, so two processes never both see the same free places.
Other names never call it (a `CASE`). The call makes `wanted` a materialized CTE (a
volatile function keeps it from being folded in), which is why a process without
global limits sends `EXCHANGE` itself, whose plan stays as it was.

The client sorts the wanted names, so statements take the names' locks in one order
and never deadlock on them; the endings are written before any is taken, and the
claim never waits for a row lock (`SKIP LOCKED`), so a statement holding a name's lock
waits for nothing else. `SKIP LOCKED` picks as always: a row claimed by a statement
that committed while this one waited for the lock is found `running` when locked, and
skipped. A process with rate limits sends `EXCHANGE_RATED` instead."""

CLAIM = statement(
    _with(
        [_WANTED, _LEVELS.substitute(fence=""), _PICKED, _CLAIMED],
        [_CLAIMED_ROWS],
    )
)
"""`EXCHANGE` with nothing to record: the claim alone, for a process without global or
rate limits that has no ending to write and no start to mark (a worker woken while
idle, or looking for work with loops free and nothing finished). It is the same claim,
the same parameters (those it does not name are ignored), the same rows; only the
endings' and the marks' CTEs are gone, which PostgreSQL would set up and run empty
(about 0.3 ms of a round trip of 0.9 ms on the benchmark machine, loaded): on the path
of enqueue-to-start latency, which it shortens by that much."""
