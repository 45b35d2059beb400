"""The job queue's schema as ordered migrations, each a list of statements safe to repeat.

The tables are the reference crate's (`axa_queue`, `axa_schedule`, `axa_job_acts`)
with the same columns, types and status strings, so a Rust service using the crate
and a Python service using this package can share one queue. Migration 1 is the
crate's own setup (which also upgrades axa 0.1.0's table in place) and the table that
records which migrations ran (`axa_schema_version`); migration 2 is what this package
adds: indexes, CHECK constraints marked NOT VALID, a column recording each act's role,
table storage settings and a statement-level trigger that sends one notification per
INSERT statement; migration 3 adds trace contexts, results and the worker processes'
table, migration 4 a cron schedule's expression and zone, migration 5 unique keys,
migration 6 the global limits' function, and migration 7 the columns of runs claimed
ahead.

Every migration is additive and idempotent (`IF NOT EXISTS`, `CREATE OR REPLACE`,
guarded `DO` blocks), so it brings any earlier state up to date in place, and the
crate and older workers keep running on the result (docs/schema.md). Each ends by
recording its version, and declares what it makes sure of (`Expectations`), which
setup checks in the catalogs before deciding there is nothing to do.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["MIGRATIONS", "SETUP_STATEMENTS", "VERSION", "Expectations", "Migration"]

# --- Migration 1: the crate's statements, in the crate's order, and the version table ---

SETUP_QUEUE = """CREATE TABLE IF NOT EXISTS axa_queue (
    id UUID PRIMARY KEY,
    name TEXT NOT NULL,
    args JSONB NOT NULL,
    status TEXT NOT NULL DEFAULT 'queued',
    error TEXT,
    run_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
)"""
"""The jobs table as axa 0.1.0 made it; later statements bring it up to date."""

SETUP_ATTEMPTS = (
    "ALTER TABLE axa_queue ADD COLUMN IF NOT EXISTS attempts INTEGER NOT NULL DEFAULT 0"
)
"""Runs so far; each claim adds one, and it fences every later write of that run."""

SETUP_MAX_ATTEMPTS = "ALTER TABLE axa_queue ADD COLUMN IF NOT EXISTS max_attempts INTEGER"
"""A job's own limit on tries, or NULL for the worker's default."""

SETUP_READY_INDEX = (
    "CREATE INDEX IF NOT EXISTS axa_queue_ready ON axa_queue (run_at) WHERE status = 'queued'"
)
"""Queued jobs by due time (axa 0.1.0's claim index)."""

SETUP_PRIORITY = (
    "ALTER TABLE axa_queue ADD COLUMN IF NOT EXISTS priority SMALLINT NOT NULL DEFAULT 0"
)
"""Higher runs first."""

SETUP_TIMEOUT = "ALTER TABLE axa_queue ADD COLUMN IF NOT EXISTS timeout_ms BIGINT"
"""A job's own time limit per run, or NULL for none."""

SETUP_CLAIM_INDEX = """CREATE INDEX IF NOT EXISTS axa_queue_claim
    ON axa_queue (priority DESC, run_at) WHERE status = 'queued'"""
"""Queued jobs in claim order; small, because finished rows are not in it."""

SETUP_SCHEDULE = """CREATE TABLE IF NOT EXISTS axa_schedule (
    name TEXT PRIMARY KEY,
    due_at TIMESTAMPTZ NOT NULL,
    last_job UUID,
    interval_ms BIGINT,
    seen_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    archived_at TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
)"""
"""One row per recurring schedule: when it is next due and the last job it queued."""

SETUP_ACTS = """CREATE TABLE IF NOT EXISTS axa_job_acts (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id UUID NOT NULL,
    job_name TEXT NOT NULL,
    act TEXT NOT NULL CHECK (act IN ('cancelled', 'retried', 'released')),
    attempts INTEGER NOT NULL,
    by TEXT NOT NULL CHECK (length(by) BETWEEN 1 AND 200 AND by !~ '[[:cntrl:]]'),
    reason TEXT NOT NULL CHECK (length(reason) BETWEEN 1 AND 200 AND reason !~ '[[:cntrl:]]'),
    at TIMESTAMPTZ NOT NULL DEFAULT now()
)"""
"""A person's acts on jobs: a record, only ever inserted into, with no foreign key so it
outlives the job's row."""

SETUP_ACTS_INDEX = "CREATE INDEX IF NOT EXISTS axa_job_acts_job ON axa_job_acts (job_id, id)"
"""A job's acts in order."""

SETUP_ACTS_REFUSE = """CREATE OR REPLACE FUNCTION axa_job_acts_refuse() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% on % is refused: acts on jobs are only ever added to',
        TG_OP, TG_TABLE_NAME;
END
$$"""
"""Refuses whatever fired it, whoever sent it."""

SETUP_ACTS_ROWS = """CREATE OR REPLACE TRIGGER axa_job_acts_refuse
    BEFORE UPDATE OR DELETE ON axa_job_acts
    FOR EACH ROW EXECUTE FUNCTION axa_job_acts_refuse()"""
"""No act is ever changed or deleted."""

SETUP_ACTS_TRUNCATE = """CREATE OR REPLACE TRIGGER axa_job_acts_refuse_truncate
    BEFORE TRUNCATE ON axa_job_acts
    FOR EACH STATEMENT EXECUTE FUNCTION axa_job_acts_refuse()"""
"""Nor is the table emptied."""

SETUP_ACTS_ALWAYS = """ALTER TABLE axa_job_acts
    ENABLE ALWAYS TRIGGER axa_job_acts_refuse,
    ENABLE ALWAYS TRIGGER axa_job_acts_refuse_truncate"""
"""The refusals fire even with `session_replication_role = replica`."""

SETUP_VERSION_TABLE = """CREATE TABLE IF NOT EXISTS axa_schema_version (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)"""
"""One row per migration applied, so `check` can tell a database older than the code;
the crate and older workers never read it."""

SETUP_VERSION_READ = "GRANT SELECT ON axa_schema_version TO PUBLIC"
"""Every role may read the versions (no private value in them), so `check` works for a
worker's role with only the grants docs/production.md gives."""

RECORD_1 = """INSERT INTO axa_schema_version (version, name)
    VALUES (1, 'the crate''s tables') ON CONFLICT (version) DO NOTHING"""
"""Migration 1 is applied."""

# --- Migration 2: what this package adds, all additive -----------------------------------

SETUP_RUNNING_INDEX = """CREATE INDEX IF NOT EXISTS axa_queue_running
    ON axa_queue (updated_at) WHERE status = 'running'"""
"""Running jobs by last report, so stale recovery reads only running rows."""

SETUP_FINISHED_INDEX = """CREATE INDEX IF NOT EXISTS axa_queue_finished
    ON axa_queue (updated_at) WHERE status IN ('completed', 'failed', 'cancelled')"""
"""Finished jobs by age, so retention deletes in small batches without a table scan."""

SETUP_PICK_INDEX = """CREATE INDEX IF NOT EXISTS axa_queue_pick
    ON axa_queue (name, priority DESC, run_at) WHERE status = 'queued'"""
"""Queued jobs by name in claim order, so a worker reads only the names it handles, at
exactly the priority level it wants; on a large existing table, create it CONCURRENTLY
first (setup then skips it)."""

SETUP_REVIEW_INDEX = """CREATE INDEX IF NOT EXISTS axa_queue_review
    ON axa_queue (updated_at) WHERE status = 'needs_review'"""
"""Jobs waiting for a person, for review screens."""

SETUP_STATE_CHECK = """DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conname = 'axa_queue_state_valid' AND conrelid = 'axa_queue'::regclass
    ) THEN
        ALTER TABLE axa_queue ADD CONSTRAINT axa_queue_state_valid CHECK (
            status IN ('queued', 'running', 'completed', 'failed', 'cancelled', 'needs_review')
            AND attempts >= 0
            AND (status <> 'running' OR started_at IS NOT NULL)
        ) NOT VALID;
    END IF;
END
$$"""
"""The table refuses unknown states, and a running job without a start; NOT VALID so
rows already there are not rescanned (an old table may hold anything)."""

SETUP_ACTS_ROLE = """DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_attribute
        WHERE attrelid = 'axa_job_acts'::regclass AND attname = 'db_role' AND NOT attisdropped
    ) THEN
        ALTER TABLE axa_job_acts ADD COLUMN IF NOT EXISTS db_role TEXT,
            ALTER COLUMN db_role SET DEFAULT current_user;
    END IF;
END
$$"""
"""Each act keeps the database role that inserted it (`current_user`), whoever's
statement it was, the Rust crate's included. Acts kept before the column was added
have none (NULL), rather than the role that ran setup; added once, so later setups take
no lock."""

SETUP_ACTS_ROLE_FUNCTION = """CREATE OR REPLACE FUNCTION axa_job_acts_role() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.db_role := current_user;
    RETURN NEW;
END
$$"""
"""Sets an act's role to the role inserting it, whatever the INSERT said."""

SETUP_ACTS_ROLE_TRIGGER = """CREATE OR REPLACE TRIGGER axa_job_acts_role
    BEFORE INSERT ON axa_job_acts
    FOR EACH ROW EXECUTE FUNCTION axa_job_acts_role()"""
"""No insert chooses its own `db_role`: a role that may insert acts can write any `by`,
but not another role's name."""

SETUP_ACTS_ROLE_ALWAYS = "ALTER TABLE axa_job_acts ENABLE ALWAYS TRIGGER axa_job_acts_role"
"""It fires even with `session_replication_role = replica`."""

SETUP_ACTS_CODES = r"""DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conname = 'axa_job_acts_codes_visible' AND conrelid = 'axa_job_acts'::regclass
    ) THEN
        ALTER TABLE axa_job_acts ADD CONSTRAINT axa_job_acts_codes_visible CHECK (
            by !~ '^ | $|[\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000e0000-\U000e007f]'
            AND reason !~ '^ | $|[\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000e0000-\U000e007f]'
        ) NOT VALID;
    END IF;
END
$$"""
"""The table refuses a `by` or `reason` with a space first or last (so a blank one) or
with an invisible character PostgreSQL's `[[:cntrl:]]` lets through: zero-width and
bidi controls (U+200B..U+200F, U+202A..U+202E, U+2066..U+2069), line and paragraph
separators, the BOM, soft hyphen and tag characters. `acts.check_code` refuses all this
and more before anything is sent; this keeps acts other clients insert visible too. NOT
VALID, so acts already kept are not rescanned (and they may never be changed)."""

SETUP_STORAGE = """DO $$
BEGIN
    IF NOT coalesce((SELECT reloptions FROM pg_class WHERE oid = 'axa_queue'::regclass)
                    @> ARRAY['fillfactor=80', 'autovacuum_vacuum_scale_factor=0.02',
                             'autovacuum_analyze_scale_factor=0.02'], false) THEN
        ALTER TABLE axa_queue SET (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02,
                                   autovacuum_analyze_scale_factor = 0.02);
    END IF;
END
$$"""
"""Room on each page for a row's new versions (claims, endings, heartbeats) to stay on
its page, and vacuum that keeps up with a hot table; set once, so later setups take no
lock. (Heartbeats are not HOT updates: `updated_at` keys the partial indexes that stale
recovery and retention read.)"""

SETUP_NOTIFY_FUNCTION = """CREATE OR REPLACE FUNCTION axa_queue_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    earliest TIMESTAMPTZ;
BEGIN
    IF current_setting('axa_queue.notify', true) IS DISTINCT FROM 'off' THEN
        SELECT min(run_at) INTO earliest FROM axa_queue_inserted WHERE status = 'queued';
        IF earliest IS NOT NULL THEN
            PERFORM pg_notify('axa_queue', TG_TABLE_SCHEMA || ' '
                || greatest(EXTRACT(EPOCH FROM earliest) - EXTRACT(EPOCH FROM now()),
                            0)::float8::text);
        END IF;
    END IF;
    RETURN NULL;
END
$$"""
"""One notification per INSERT statement, however many rows, saying when the earliest
new job is due; `SET axa_queue.notify = off` silences it for a session. The delay is a
difference of epoch seconds, so a `run_at` of `infinity` (another client's) is no
error before PostgreSQL 17, where timestamps at infinity cannot be subtracted."""

SETUP_NOTIFY_TRIGGER = """CREATE OR REPLACE TRIGGER axa_queue_notify
    AFTER INSERT ON axa_queue REFERENCING NEW TABLE AS axa_queue_inserted
    FOR EACH STATEMENT EXECUTE FUNCTION axa_queue_notify()"""
"""Wakes workers for jobs queued by anyone, the Rust crate included."""

RECORD_2 = """INSERT INTO axa_schema_version (version, name)
    VALUES (2, 'axa-queue''s additions') ON CONFLICT (version) DO NOTHING"""
"""Migration 2 is applied."""

# --- Migration 3: trace context, results, worker processes (all additive) ---------------

SETUP_TRACE_CONTEXT = "ALTER TABLE axa_queue ADD COLUMN IF NOT EXISTS trace_context JSONB"
"""The W3C trace context (`traceparent`, `tracestate`) of the span a job was queued in,
as a JSON object, or NULL (no tracing, or another client's job, the Rust crate's
included). Kept apart from the arguments, which stay the job's own."""

SETUP_RESULT = "ALTER TABLE axa_queue ADD COLUMN IF NOT EXISTS result JSONB"
"""A completed run's return value as JSON, or NULL. Private like the arguments: never
logged or shown; removed with the job by retention."""

SETUP_WORKERS = """CREATE TABLE IF NOT EXISTS axa_workers (
    id UUID PRIMARY KEY,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    names TEXT[] NOT NULL,
    loops INTEGER NOT NULL,
    running INTEGER NOT NULL DEFAULT 0,
    version TEXT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    seen_at TIMESTAMPTZ NOT NULL DEFAULT now()
)"""
"""The worker processes running now: one row each, written when a worker starts,
refreshed with its heartbeat (`seen_at`, `running`: its jobs in progress) and deleted
when it stops; a row not seen for a while is a process that died (readers judge by
`seen_at`). The Rust crate's workers do not write here."""

SETUP_WORKERS_SEEN_INDEX = "CREATE INDEX IF NOT EXISTS axa_workers_seen ON axa_workers (seen_at)"
"""Workers by their last heartbeat, to list live ones and remove long-dead rows."""

RECORD_3 = """INSERT INTO axa_schema_version (version, name)
    VALUES (3, 'trace context, results, workers') ON CONFLICT (version) DO NOTHING"""
"""Migration 3 is applied."""

# --- Migration 4: cron schedules (additive) ---------------------------------------------

SETUP_SCHEDULE_CRON = """ALTER TABLE axa_schedule ADD COLUMN IF NOT EXISTS cron TEXT,
    ADD COLUMN IF NOT EXISTS timezone TEXT"""
"""A cron schedule's expression and the IANA zone it is read in, or NULL for a schedule
by interval (every schedule the crate makes). A cron row's `interval_ms` is NULL, which
the crate reads as no interval; the crate's workers tick only the schedules in their
own code, by name, so they leave a cron row alone (docs/design.md)."""

RECORD_4 = """INSERT INTO axa_schema_version (version, name)
    VALUES (4, 'cron schedules') ON CONFLICT (version) DO NOTHING"""
"""Migration 4 is applied."""

# --- Migration 5: unique jobs (all additive) ---------------------------------------------

SETUP_UNIQUE_KEY = "ALTER TABLE axa_queue ADD COLUMN IF NOT EXISTS unique_key TEXT"
"""A job's unique key (`NewJob.unique_key`), or NULL: at most one job holding a key is
queued, running or in review at a time (`axa_queue_unique`). Not private: shown by
`JobInfo`, the CLI and the dashboard. The Rust crate never sets it."""

SETUP_UNIQUE_FOR = "ALTER TABLE axa_queue ADD COLUMN IF NOT EXISTS unique_for_ms BIGINT"
"""How long, in milliseconds, a finished job keeps holding its key after it finished
(`NewJob.unique_for`, counted from its `updated_at`), or NULL: its key is free once it
finishes."""

SETUP_UNIQUE_INDEX = """CREATE UNIQUE INDEX IF NOT EXISTS axa_queue_unique ON axa_queue (unique_key)
    WHERE unique_key IS NOT NULL
      AND (status IN ('queued', 'running', 'needs_review') OR unique_for_ms IS NOT NULL)"""
"""At most one holder of each key: every job not finished, and every finished one with
a `unique_for`, until an enqueue of its key finds its time passed and clears its key
(`sql.ENQUEUE_UNIQUE`), or retention deletes it. A partial index cannot read the clock,
so a finished job's time is judged by the statement that wants its key. The predicate
is the status alone for jobs without `unique_for`, so a job finished by any client (the
Rust crate's workers included) frees its key in the same write; on a large table,
create it CONCURRENTLY first (setup then skips it)."""

RECORD_5 = """INSERT INTO axa_schema_version (version, name)
    VALUES (5, 'unique jobs') ON CONFLICT (version) DO NOTHING"""
"""Migration 5 is applied."""

# --- Migration 6: global limits (additive) -----------------------------------------------

SETUP_ROOM_FUNCTION = """CREATE OR REPLACE FUNCTION axa_queue_room(jobs regclass, job_name text, most integer)
RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
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
$$"""
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
schema, behind a pooler) by `EXECUTE`, planned at every call. The table is named
quoted, `"axa_queue"`, which the statements' schema rewriting (`sql.in_schema`) leaves
alone, so the function's body is the same in every schema."""

RECORD_6 = """INSERT INTO axa_schema_version (version, name)
    VALUES (6, 'global limits') ON CONFLICT (version) DO NOTHING"""
"""Migration 6 is applied."""

# --- Migration 7: rate limits (additive) ------------------------------------------------

SETUP_RATE_SLOTS = """CREATE TABLE IF NOT EXISTS axa_rate_slots (
    name TEXT NOT NULL,
    slot INTEGER NOT NULL,
    at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (name, slot)
)"""
"""The ring of slots of each rate-limited job name (`Queue.rate_limit`): slot `k` of a
name holds when the claim that last used it was made. A claim may use a slot last used
`per` ago or more (or never: a slot without a row), and stamps it; so with N slots no
more than N claims of the name are made in any window of `per`. Rows are only ever
stamped again (never deleted): a name has at most as many as its largest limit. In the
queue's schema, beside `axa_queue`, so each queue has its own."""

SETUP_RATE_ROOM_FUNCTION = """CREATE OR REPLACE FUNCTION axa_queue_rate_room(jobs regclass, slots regclass, job_name text, most integer, per_ms bigint, claim_at timestamptz, want integer)
RETURNS integer[] LANGUAGE plpgsql VOLATILE AS $$
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
$$"""
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
else by `EXECUTE`), and its body is the same in every schema (`"axa_rate_slots"` is
quoted, which `sql.in_schema` leaves alone)."""

RECORD_7 = """INSERT INTO axa_schema_version (version, name)
    VALUES (7, 'rate limits') ON CONFLICT (version) DO NOTHING"""
"""Migration 7 is applied."""

# --- Migration 8: runs claimed ahead (additive) -----------------------------------------

SETUP_AHEAD = """ALTER TABLE axa_queue ADD COLUMN IF NOT EXISTS ahead INTEGER,
    ADD COLUMN IF NOT EXISTS given_back INTEGER NOT NULL DEFAULT 0"""
"""`ahead`: the attempt claimed ahead of the loops (`QueueOptions.prefetch`) whose
handler has not been marked started, or NULL. Meaningful only while `ahead = attempts
AND status = 'running'`, so a client that never writes it (the Rust crate), claiming
the job again (a higher attempt) or queuing it, never needs to clear it. Stale recovery
gives such an attempt back (`sql.RECOVER_STALE`). `given_back`: how many attempts were
given back so, which bounds it (`sql.GIVE_BACK_LIMIT`)."""

RECORD_8 = """INSERT INTO axa_schema_version (version, name)
    VALUES (8, 'runs claimed ahead') ON CONFLICT (version) DO NOTHING"""
"""Migration 8 is applied."""

# --- Migrations ------------------------------------------------------------------------


@dataclass(frozen=True)
class Expectations:
    """What the tables must have once some migrations ran, declared by each migration
    next to its statements. `SETUP_MISSING` takes them as parameters (`params`) and names
    each thing missing the way `lines` does."""

    tables: tuple[str, ...] = ()
    columns: tuple[tuple[str, str], ...] = ()
    """(table, column)."""
    indexes: tuple[str, ...] = ()
    constraints: tuple[tuple[str, str], ...] = ()
    """(table, constraint)."""
    functions: tuple[tuple[str, str], ...] = ()
    """(name, body) of each function: a bare name takes no argument, else the name is
    given with its argument types (`axa_queue_room(regclass,text,integer)`)."""
    triggers: tuple[tuple[str, str, bool], ...] = ()
    """(table, name, whether it must fire always)."""
    storage: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(table, its `reloptions` that must be set)."""

    def __add__(self, other: Expectations) -> Expectations:
        return Expectations(
            *(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self))
        )

    def lines(self) -> set[str]:
        """Each thing expected, named as `SETUP_MISSING` names it when it is missing."""
        return {
            *(f"table {t}" for t in self.tables),
            *(f"column {t}.{c}" for t, c in self.columns),
            *(f"index {i}" for i in self.indexes),
            *(f"constraint {c}" for _, c in self.constraints),
            *(f"function {f}" if "(" in f else f"function {f}()" for f, _ in self.functions),
            *(f"trigger {g}" for _, g, _ in self.triggers),
            *(f"storage settings of {t}" for t, _ in self.storage),
        }

    def params(self) -> dict[str, Any]:
        """The parameters of `SETUP_MISSING`."""
        return {
            "tables": list(self.tables),
            "column_tables": [t for t, _ in self.columns],
            "columns": [c for _, c in self.columns],
            "indexes": list(self.indexes),
            "constraint_tables": [t for t, _ in self.constraints],
            "constraints": [c for _, c in self.constraints],
            "functions": [f for f, _ in self.functions],
            "bodies": [b for _, b in self.functions],
            "trigger_tables": [t for t, _, _ in self.triggers],
            "triggers": [g for _, g, _ in self.triggers],
            "trigger_always": [a for _, _, a in self.triggers],
            "storage_tables": [t for t, settings in self.storage for _ in settings],
            "storage": [s for _, settings in self.storage for s in settings],
        }


@dataclass(frozen=True)
class Migration:
    """One step of the schema: its statements, each safe to repeat, the statement
    recording it in `axa_schema_version`, and what it makes sure of."""

    version: int
    name: str
    statements: tuple[str, ...]
    record: str
    makes: Expectations

    def all_statements(self) -> tuple[str, ...]:
        """Its statements, then its record: what applying it runs."""
        return (*self.statements, self.record)


def body_of(function: str) -> str:
    """The body of a `CREATE FUNCTION ... AS $$<body>$$` statement, as `pg_proc` keeps it."""
    return function.split("$$")[1]


QUEUE_COLUMNS = (
    "id", "name", "args", "status", "error", "run_at", "started_at", "created_at",
    "updated_at", "attempts", "max_attempts", "priority", "timeout_ms",
)  # fmt: skip
"""The jobs table's columns (`CHECK_QUEUE` selects them)."""

SCHEDULE_COLUMNS = (
    "name", "due_at", "last_job", "interval_ms", "seen_at", "archived_at", "created_at",
    "updated_at",
)  # fmt: skip
"""The schedule table's columns (`CHECK_SCHEDULE` selects them)."""

WORKERS_COLUMNS = (
    "id", "host", "pid", "names", "loops", "running", "version", "started_at", "seen_at",
)  # fmt: skip
"""The worker processes table's columns (migration 3)."""

RATE_SLOTS_COLUMNS = ("name", "slot", "at")
"""The rate limits' slots table's columns (migration 7)."""

ACTS_COLUMNS = ("id", "job_id", "job_name", "act", "attempts", "by", "reason", "at")
"""The acts table's columns as the crate makes it; migration 2 adds `db_role`."""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "the crate's tables",
        (
            SETUP_QUEUE,
            SETUP_ATTEMPTS,
            SETUP_MAX_ATTEMPTS,
            SETUP_READY_INDEX,
            SETUP_PRIORITY,
            SETUP_TIMEOUT,
            SETUP_CLAIM_INDEX,
            SETUP_SCHEDULE,
            SETUP_ACTS,
            SETUP_ACTS_INDEX,
            SETUP_ACTS_REFUSE,
            SETUP_ACTS_ROWS,
            SETUP_ACTS_TRUNCATE,
            SETUP_ACTS_ALWAYS,
            SETUP_VERSION_TABLE,
            SETUP_VERSION_READ,
        ),
        RECORD_1,
        Expectations(
            tables=("axa_queue", "axa_schedule", "axa_job_acts"),
            columns=(
                *(("axa_queue", c) for c in QUEUE_COLUMNS),
                *(("axa_schedule", c) for c in SCHEDULE_COLUMNS),
                *(("axa_job_acts", c) for c in ACTS_COLUMNS),
            ),
            indexes=("axa_queue_ready", "axa_queue_claim", "axa_job_acts_job"),
            constraints=(
                ("axa_queue", "axa_queue_pkey"),
                ("axa_schedule", "axa_schedule_pkey"),
                ("axa_job_acts", "axa_job_acts_pkey"),
                ("axa_job_acts", "axa_job_acts_act_check"),
                ("axa_job_acts", "axa_job_acts_by_check"),
                ("axa_job_acts", "axa_job_acts_reason_check"),
            ),
            functions=(("axa_job_acts_refuse", body_of(SETUP_ACTS_REFUSE)),),
            triggers=(
                ("axa_job_acts", "axa_job_acts_refuse", True),
                ("axa_job_acts", "axa_job_acts_refuse_truncate", True),
            ),
        ),
    ),
    Migration(
        2,
        "axa-queue's additions",
        (
            SETUP_RUNNING_INDEX,
            SETUP_FINISHED_INDEX,
            SETUP_REVIEW_INDEX,
            SETUP_PICK_INDEX,
            SETUP_STATE_CHECK,
            SETUP_ACTS_ROLE,
            SETUP_ACTS_ROLE_FUNCTION,
            SETUP_ACTS_ROLE_TRIGGER,
            SETUP_ACTS_ROLE_ALWAYS,
            SETUP_ACTS_CODES,
            SETUP_STORAGE,
            SETUP_NOTIFY_FUNCTION,
            SETUP_NOTIFY_TRIGGER,
        ),
        RECORD_2,
        Expectations(
            columns=(("axa_job_acts", "db_role"),),
            indexes=(
                "axa_queue_running",
                "axa_queue_finished",
                "axa_queue_review",
                "axa_queue_pick",
            ),
            constraints=(
                ("axa_queue", "axa_queue_state_valid"),
                ("axa_job_acts", "axa_job_acts_codes_visible"),
            ),
            functions=(
                ("axa_job_acts_role", body_of(SETUP_ACTS_ROLE_FUNCTION)),
                ("axa_queue_notify", body_of(SETUP_NOTIFY_FUNCTION)),
            ),
            triggers=(
                ("axa_job_acts", "axa_job_acts_role", True),
                ("axa_queue", "axa_queue_notify", False),
            ),
            storage=(
                (
                    "axa_queue",
                    (
                        "fillfactor=80",
                        "autovacuum_vacuum_scale_factor=0.02",
                        "autovacuum_analyze_scale_factor=0.02",
                    ),
                ),
            ),
        ),
    ),
    Migration(
        3,
        "trace context, results, workers",
        (SETUP_TRACE_CONTEXT, SETUP_RESULT, SETUP_WORKERS, SETUP_WORKERS_SEEN_INDEX),
        RECORD_3,
        Expectations(
            tables=("axa_workers",),
            columns=(
                ("axa_queue", "trace_context"),
                ("axa_queue", "result"),
                *(("axa_workers", c) for c in WORKERS_COLUMNS),
            ),
            indexes=("axa_workers_seen",),
            constraints=(("axa_workers", "axa_workers_pkey"),),
        ),
    ),
    Migration(
        4,
        "cron schedules",
        (SETUP_SCHEDULE_CRON,),
        RECORD_4,
        Expectations(columns=(("axa_schedule", "cron"), ("axa_schedule", "timezone"))),
    ),
    Migration(
        5,
        "unique jobs",
        (SETUP_UNIQUE_KEY, SETUP_UNIQUE_FOR, SETUP_UNIQUE_INDEX),
        RECORD_5,
        Expectations(
            columns=(("axa_queue", "unique_key"), ("axa_queue", "unique_for_ms")),
            indexes=("axa_queue_unique",),
        ),
    ),
    Migration(
        6,
        "global limits",
        (SETUP_ROOM_FUNCTION,),
        RECORD_6,
        Expectations(
            functions=(("axa_queue_room(regclass,text,integer)", body_of(SETUP_ROOM_FUNCTION)),),
        ),
    ),
    Migration(
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
    ),
    Migration(
        8,
        "runs claimed ahead",
        (SETUP_AHEAD,),
        RECORD_8,
        Expectations(columns=(("axa_queue", "ahead"), ("axa_queue", "given_back"))),
    ),
)
"""Every migration, oldest first; a release adds one at the end (docs/schema.md)."""

VERSION = MIGRATIONS[-1].version
"""The schema version this code needs: its newest migration."""

SETUP_STATEMENTS: tuple[str, ...] = tuple(s for m in MIGRATIONS for s in m.all_statements())
"""The ordered statements that make or update the tables: every migration in order, each
followed by the statement recording its version; each safe to repeat, and the first
fourteen are the crate's own. Needs PostgreSQL 14 or later. Run them in one transaction
holding `pg_advisory_xact_lock(SETUP_LOCK)`, as `Queue.setup` does."""
