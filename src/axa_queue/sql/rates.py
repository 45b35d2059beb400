"""The rate limits' part of the exchange: `EXCHANGE_RATED`, `exchange`'s statement with
each wanted name gated by its global and rate limits (`gates`), the slots it claims by
stamped after the claim (`taken`, `stamped`), and a row saying when to look again
(`_RATE_WAITS`); the keyed claim (`keys.EXCHANGE_KEYED`) is made of these pieces too.

`axa-queue sql --statement EXCHANGE_RATED` prints it whole.
"""

from __future__ import annotations

from .attempts import KEPT as _KEPT
from .exchange import (
    _CLAIMED,
    _CLAIMED_ROWS,
    _ENDED_ROWS,
    _ENDINGS,
    _FINISHED,
    _LEVELS,
    _MARKED,
    _MARKED_READ,
    _NOT_ENDING,
    _PICKED,
    _unpaused,
    _with,
)
from .naming import statement

__all__ = ["EXCHANGE_RATED"]

_GATES = _unpaused("""gates AS (
        SELECT w.name, w.rate, w.per_ms,
            CASE WHEN w.global IS NULL THEN least(w.cap, %(free)s)
                ELSE least(w.cap, %(free)s, {axa_queue_room}({'axa_queue'}::regclass, w.name, w.global))
            END AS asked,
            CASE WHEN w.rate IS NULL THEN NULL
                ELSE {axa_queue_rate_slots_free}({'axa_queue'}::regclass, {'axa_rate_slots'}::regclass,
                                         w.name, w.rate, w.per_ms, %(now)s::timestamptz,
                                         least(w.cap, %(free)s))
            END AS slots
        FROM (SELECT r.name, r.cap,
                     CASE WHEN r.global > 2147483647 THEN 2147483647 WHEN r.global < 0 THEN 0
                          ELSE r.global END::int AS global,
                     CASE WHEN r.rate > 100000 THEN 100000 WHEN r.rate < 0 THEN 0
                          ELSE r.rate END::int AS rate,
                     CASE WHEN r.per_ms > 3155760000000 THEN 3155760000000 WHEN r.per_ms < 0 THEN 0
                          ELSE r.per_ms END AS per_ms
              FROM json_to_recordset(%(wanted)s::json)
                  AS r(name text, cap int, global bigint, rate bigint, per_ms bigint)) w
        WHERE %(free)s > 0$unpaused
        OFFSET 0""")
"""Each wanted name's gates, called once per name (`OFFSET 0` keeps the calls from
being copied into `wanted`): the room its global limit leaves (`asked`) and the free
slots of its rate limit (`slots`), the limits clamped where they are read (see
`EXCHANGE_RATED`)."""

_WANTED_RATED = """wanted AS MATERIALIZED (
        SELECT g.name, g.rate, g.per_ms, g.asked, g.slots,
               CASE WHEN g.slots IS NULL THEN g.asked ELSE least(g.asked, cardinality(g.slots)) END AS cap
        FROM gates g"""
"""The names to claim behind `_GATES`: a rate-limited name's cap cut to its free slots;
the rate and slots kept for `_TAKEN`."""

# --- After the claim: the stamps -----------------------------------------------------------

_TAKEN = """taken AS (
        SELECT w.name, w.rate, w.per_ms, w.asked, w.slots,
               (SELECT count(*) FROM claimed c WHERE c.name = w.name)::int AS n
        FROM wanted w WHERE w.slots IS NOT NULL"""
"""For each rate-limited name, how many of its jobs were claimed (`n`)."""

_STAMPED = """stamped AS (
        INSERT INTO {axa_rate_slots} (name, slot, at)
        SELECT t.name, t.slots[i], COALESCE(%(now)s::timestamptz, clock_timestamp())
        FROM taken t CROSS JOIN LATERAL generate_series(1, t.n) AS i
        ON CONFLICT (name, slot) DO UPDATE SET at = EXCLUDED.at"""
"""As many free slots stamped as jobs claimed, by an upsert (see `EXCHANGE_RATED` for
why not an `UPDATE`), with the clock read after the claims."""

_RATE_WAITS = """SELECT NULL, NULL, t.name, NULL, NULL, NULL, NULL,
           extract(epoch FROM least(greatest(COALESCE(
               (SELECT min(s.at) FROM {axa_rate_slots} s
                WHERE s.name = t.name AND s.slot < t.rate AND s.slot <> ALL(t.slots)),
               COALESCE(%(now)s::timestamptz, clock_timestamp())),
               COALESCE(%(now)s::timestamptz, clock_timestamp()) - t.per_ms * interval '1 millisecond'),
               COALESCE(%(now)s::timestamptz, clock_timestamp()))
               + t.per_ms * interval '1 millisecond'
               - COALESCE(%(now)s::timestamptz, clock_timestamp()))::float8,
           NULL, NULL
    FROM taken t WHERE cardinality(t.slots) < t.asked AND t.n = cardinality(t.slots)"""
"""For each rate-limited name that used every free slot and wanted more: a row with no
id, the name, and in `run_at` the seconds until its earliest busy slot frees."""

EXCHANGE_RATED = statement(
    _with(
        [
            _ENDINGS,
            _FINISHED,
            _MARKED,
            _GATES,
            _WANTED_RATED,
            _LEVELS.substitute(fence=_NOT_ENDING),
            _PICKED,
            _CLAIMED,
            *_KEPT,
            _TAKEN,
            _STAMPED,
        ],
        [_ENDED_ROWS, _CLAIMED_ROWS + _MARKED_READ, _RATE_WAITS],
    )
)
"""`EXCHANGE_LIMITED` for a process with rate limits (`Queue.rate_limit`): a wanted
name may also carry its rate limit (`[{"name", "cap", "global", "rate", "per_ms"}]`),
and its cap is then cut to the number of its free slots, which `axa_queue_rate_slots_free`
(migration 7) returns after taking the name's lock (the one global limits take) and
reading `axa_rate_slots` with a snapshot of its own. `gates` calls the functions once
per name (`OFFSET 0` keeps it from being folded into `wanted`, which would copy the
calls). Then, in the same statement, `stamped` stamps as many of those free slots as
jobs of the name were claimed (`taken`, counted over `claimed`), with the clock read
after the claims (so never before a claimed job's `started_at`).

Why this is exact under concurrency: the name's lock is held from the read of the
slots to the commit of the stamps, so statements read and stamp a name's slots one at
a time, each seeing every stamp committed before; a slot is used only when its last
stamp is `per` old or more, read after the lock, and stamped later still; so the
claims that used one slot are `per` apart or more, and any window of `per` holds at
most one per slot: never more than `rate` claims. The stamps are an upsert (`ON
CONFLICT DO UPDATE`), which in READ COMMITTED writes the newest version of a slot's row
even when the statement's own snapshot, taken before it waited for the lock, is older:
an `UPDATE` would miss a slot's row made by another process after that snapshot, and a
claim would go unstamped. A slot without a row is free and the stamp makes it, so
nothing need be made ahead. Retries and jobs queued again are claimed by this
statement like any other job, so each of their runs takes a slot.

The last `UNION ALL` says when to look again: for each rate-limited name whose free
slots were fewer than it asked for and all used, a row with no id, the name, and in
`run_at` the seconds until its earliest busy slot frees (read with the statement's
snapshot, which can only make it sooner: a slot stamped since looks older, and one
looked at early costs an exchange that finds it busy and says when again). A stamp
later than now (only a row written by hand has one, `infinity` say) is taken as now,
so the seconds are at most `per` and the arithmetic cannot leave the range of a
timestamp.

The limits come as `bigint` and are clamped where they are read: a global limit to
0..2147483647 (`limits.MAX_LIMIT`), a rate to 0..`limits.MAX_RATE` (100000), a window to
0..100 years (`limits.MAX_WINDOW`) in
milliseconds; `Queue.limit` and `Queue.rate_limit` refuse more, so only a registry
written to by hand carries it, and it must not fail the claim of every other name. The client
sets a timer for it (`WorkerState.wake_in`), rather than waiting for the poll interval.
A process without rate limits never sends this statement."""
