"""Migrations 6 to 8, all additive: the global limits' function (6), the rate limits'
slots and function (7), the columns of runs claimed ahead (8)."""

from __future__ import annotations

from ...sql.naming import statement
from .migration import Expectations, Migration, body_of

__all__ = [
    "MIGRATION_6",
    "MIGRATION_7",
    "MIGRATION_8",
    "RATE_SLOTS_COLUMNS",
    "RECORD_6",
    "RECORD_7",
    "RECORD_8",
    "SETUP_AHEAD",
    "SETUP_RATE_ROOM_FUNCTION",
    "SETUP_RATE_SLOTS",
    "SETUP_ROOM_FUNCTION",
]

# --- Migration 6: global limits (additive) -----------------------------------------------

SETUP_ROOM_FUNCTION = statement(
    """CREATE OR REPLACE FUNCTION {axa_queue_room}(jobs regclass, job_name text, most integer)
RETURNS integer LANGUAGE plpgsql VOLATILE AS $${body}$$""",
    body="""
DECLARE
    running integer;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(jobs::oid::text || ' ' || job_name, 1635213689));
    IF jobs = to_regclass('"axa_queue"') THEN
        SELECT count(*) INTO running FROM "axa_queue" WHERE status = 'running' AND name = job_name;
    ELSE
        EXECUTE format('SELECT count(*) FROM %s WHERE status = ''running'' AND name = $1', jobs)
            INTO running USING job_name;
    END IF;
    RETURN greatest(most - running, 0);
END
""",
)
"""How many more jobs named `job_name` may start now under a global limit of `most`:
`most` less the jobs of that name running in table `jobs`, every process's (a crashed
one's too, until stale recovery frees them). Called by `EXCHANGE`'s claim for each
name with a global limit. It first takes a transaction-level advisory lock for the
name (held until the claim commits), so claims of a limited name are taken one
statement at a time across every process; and, being `VOLATILE` (its query run by
`EXECUTE`), it counts with a snapshot taken after the lock, which sees every claim
committed before: a query of the calling statement itself would see the statement's
snapshot, taken before it waited, and miss the claims of the statement it waited for.
The table comes as a `regclass`, so the count reads the caller's table whatever the
search path: when the search path finds that table, by a static query, whose plan
PL/pgSQL keeps (and makes again if the search path changes); else (a queue given its
schema, behind a pooler) by `EXECUTE`, planned at every call. The body is placed as
it is in every schema (`body`, never a template), so setup finds the same body in every
schema; it names the table quoted, `"axa_queue"`, as it always has (`pg_proc` keeps the
body's text, which setup compares)."""

RECORD_6 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (6, 'global limits') ON CONFLICT (version) DO NOTHING""")
"""Migration 6 is applied."""

MIGRATION_6 = Migration(
    6,
    "global limits",
    (SETUP_ROOM_FUNCTION,),
    RECORD_6,
    Expectations(
        functions=(("axa_queue_room(regclass,text,integer)", body_of(SETUP_ROOM_FUNCTION)),),
    ),
)
"""Migration 6 and what it makes sure of."""

# --- Migration 7: rate limits (additive) ------------------------------------------------

SETUP_RATE_SLOTS = statement("""CREATE TABLE IF NOT EXISTS {axa_rate_slots} (
    name TEXT NOT NULL,
    slot INTEGER NOT NULL,
    at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (name, slot)
)""")
"""The ring of slots of each rate-limited job name (`Queue.rate_limit`): slot `k` of a
name holds when the claim that last used it was made. A claim may use a slot last used
`per` ago or more (or never: a slot without a row), and stamps it; so with N slots no
more than N claims of the name are made in any window of `per`. Rows are only ever
stamped again (never deleted): a name has at most as many as its largest limit. In the
queue's schema, beside `axa_queue`, so each queue has its own."""

SETUP_RATE_ROOM_FUNCTION = statement(
    """CREATE OR REPLACE FUNCTION {axa_queue_rate_room}(jobs regclass, slots regclass, job_name text, most integer, per_ms bigint, claim_at timestamptz, want integer)
RETURNS integer[] LANGUAGE plpgsql VOLATILE AS $${body}$$""",
    body="""
DECLARE
    cutoff timestamptz;
    made integer;
    free integer[];
    more integer[];
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(jobs::oid::text || ' ' || job_name, 1635213689));
    cutoff := COALESCE(claim_at, clock_timestamp()) - per_ms * interval '1 millisecond';
    IF slots = to_regclass('"axa_rate_slots"') THEN
        SELECT count(*), (array_agg(s.slot ORDER BY s.slot) FILTER (WHERE s.at <= cutoff))[1:want]
            INTO made, free FROM "axa_rate_slots" s WHERE s.name = job_name AND s.slot < most;
    ELSE
        EXECUTE format('SELECT count(*), (array_agg(s.slot ORDER BY s.slot) FILTER (WHERE s.at <= $3))[1:$4] '
                       'FROM %s s WHERE s.name = $1 AND s.slot < $2', slots)
            INTO made, free USING job_name, most, cutoff, want;
    END IF;
    free := COALESCE(free, '{}');
    IF made < most AND cardinality(free) < want THEN
        IF slots = to_regclass('"axa_rate_slots"') THEN
            free := free || ARRAY(SELECT n FROM generate_series(0, most - 1) AS n
                WHERE NOT EXISTS (SELECT FROM "axa_rate_slots" s WHERE s.name = job_name AND s.slot = n)
                ORDER BY n LIMIT want - cardinality(free));
        ELSE
            EXECUTE format('SELECT ARRAY(SELECT n FROM generate_series(0, $2 - 1) AS n '
                           'WHERE NOT EXISTS (SELECT FROM %s s WHERE s.name = $1 AND s.slot = n) '
                           'ORDER BY n LIMIT $3)', slots)
                INTO more USING job_name, most, want - cardinality(free);
            free := free || more;
        END IF;
    END IF;
    RETURN free;
END
""",
)
"""Up to `want` free slots, lowest number first, of `job_name` under a rate limit of
`most` claims per `per_ms` milliseconds: of the slots `0` to `most - 1`, those not used
since `per_ms` before `claim_at` (NULL: the database's clock, read after the lock), a
slot without a row being free. Called by `EXCHANGE_RATED`'s claim for each name with a
rate limit, which then stamps as many of them as it claimed jobs of the name. Like
`axa_queue_room`, it first takes the name's transaction-level advisory lock (the very
same lock: a name with both limits is claimed under one), held until the claim
commits, so the slots of a name are read and stamped by one statement at a time across
every process; and, being `VOLATILE`, it reads them with a snapshot taken after the
lock, which sees every stamp committed before. It reads the name's rows once (one
index range); numbers without a row are looked for only while the ring is not yet
whole. Slots numbered `most` or more are ignored: two processes configured with
different limits each honour their own. `jobs` (the queue's table, for the lock's
key) and `slots` come as `regclass`es, so the function reads the caller's tables
whatever the search path (by static queries when the search path finds that table,
else by `EXECUTE`), and its body is the same in every schema (placed as it is, as
`axa_queue_room`'s)."""

RECORD_7 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (7, 'rate limits') ON CONFLICT (version) DO NOTHING""")
"""Migration 7 is applied."""

RATE_SLOTS_COLUMNS = ("name", "slot", "at")
"""The rate limits' slots table's columns (migration 7)."""

MIGRATION_7 = Migration(
    7,
    "rate limits",
    (SETUP_RATE_SLOTS, SETUP_RATE_ROOM_FUNCTION),
    RECORD_7,
    Expectations(
        tables=("axa_rate_slots",),
        columns=tuple(("axa_rate_slots", c) for c in RATE_SLOTS_COLUMNS),
        constraints=(("axa_rate_slots", "axa_rate_slots_pkey"),),
        functions=(
            (
                "axa_queue_rate_room(regclass,regclass,text,integer,bigint,timestamptz,integer)",
                body_of(SETUP_RATE_ROOM_FUNCTION),
            ),
        ),
    ),
)
"""Migration 7 and what it makes sure of."""

# --- Migration 8: runs claimed ahead (additive) -----------------------------------------

SETUP_AHEAD = statement("""ALTER TABLE {axa_queue} ADD COLUMN IF NOT EXISTS ahead INTEGER,
    ADD COLUMN IF NOT EXISTS given_back INTEGER NOT NULL DEFAULT 0""")
"""`ahead`: the attempt claimed ahead of the loops (`QueueOptions.prefetch`) whose
handler has not been marked started, or NULL. Meaningful only while `ahead = attempts
AND status = 'running'`, so a client that never writes it (the Rust crate), claiming
the job again (a higher attempt) or queuing it, never needs to clear it. Stale recovery
gives such an attempt back (`sql.RECOVER_STALE`). `given_back`: how many attempts were
given back so, which bounds it (`sql.GIVE_BACK_LIMIT`)."""

RECORD_8 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (8, 'runs claimed ahead') ON CONFLICT (version) DO NOTHING""")
"""Migration 8 is applied."""

MIGRATION_8 = Migration(
    8,
    "runs claimed ahead",
    (SETUP_AHEAD,),
    RECORD_8,
    Expectations(columns=(("axa_queue", "ahead"), ("axa_queue", "given_back"))),
)
"""Migration 8 and what it makes sure of."""
