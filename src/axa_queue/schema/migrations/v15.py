"""Migration 15, additive: fairness by key. A job's `key` (a tenant, a customer: who
the job is for), in `axa_queue` and `axa_queue_history`; the index the claim walks a
keyed name's keys in, round-robin; the index that counts a name's running jobs by key;
and `axa_queue_key_room`, the function a per-key limit is checked by."""

from __future__ import annotations

from ...sql.naming import statement
from .migration import Expectations, Migration, body_of

__all__ = [
    "MIGRATION_15",
    "RECORD_15",
    "SETUP_HISTORY_KEY",
    "SETUP_KEY",
    "SETUP_KEYED_INDEX",
    "SETUP_KEY_ROOM_FUNCTION",
    "SETUP_RUNNING_KEYS_INDEX",
]

SETUP_KEY = statement("ALTER TABLE {axa_queue} ADD COLUMN IF NOT EXISTS key TEXT")
"""The job's key (`NewJob.key`): NULL for a job queued without one (every job the Rust
crate queues). No default, so adding it rewrites nothing."""

SETUP_HISTORY_KEY = statement("ALTER TABLE {axa_queue_history} ADD COLUMN IF NOT EXISTS key TEXT")
"""The key of a moved job (`sql.HISTORY_COLUMNS_MOVED` carries it)."""

SETUP_KEYED_INDEX = statement("""CREATE INDEX IF NOT EXISTS axa_queue_keyed
    ON {axa_queue} (name, priority DESC, key, run_at) WHERE status = 'queued' AND key IS NOT NULL""")
"""Queued jobs that have a key, by name, priority level, key and due time: the claim of a
keyed name (`sql.EXCHANGE_KEYED`) steps from one key of a level to the next (one probe
each) and reads a key's oldest due jobs in order. Jobs without a key are not in it, so
a queue that uses no keys keeps it empty and pays nothing for it."""

SETUP_RUNNING_KEYS_INDEX = statement("""CREATE INDEX IF NOT EXISTS axa_queue_running_keys
    ON {axa_queue} (name, key) WHERE status = 'running' AND key IS NOT NULL""")
"""Running jobs that have a key, by name and key: what `axa_queue_key_room` counts.
Empty while no job has a key."""

SETUP_KEY_ROOM_FUNCTION = statement(
    """CREATE OR REPLACE FUNCTION {axa_queue_key_room}(jobs regclass, job_name text)
RETURNS jsonb LANGUAGE plpgsql VOLATILE AS $${body}$$""",
    body="""
DECLARE
    running jsonb;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(jobs::oid::text || ' ' || job_name, 1635213689));
    IF jobs = to_regclass('"axa_queue"') THEN
        SELECT jsonb_object_agg(k.key, k.n) INTO running FROM (
            SELECT key, count(*) AS n FROM "axa_queue"
            WHERE status = 'running' AND key IS NOT NULL AND name = job_name GROUP BY key) k;
    ELSE
        EXECUTE format('SELECT jsonb_object_agg(k.key, k.n) FROM (SELECT key, count(*) AS n FROM %s '
                       'WHERE status = ''running'' AND key IS NOT NULL AND name = $1 GROUP BY key) k', jobs)
            INTO running USING job_name;
    END IF;
    RETURN COALESCE(running, '{}'::jsonb);
END
""",
)
"""The running jobs of `job_name` in table `jobs`, every process's, counted by key (a
JSON object, key to count; keys with none running are absent): what a per-key limit
(`Queue.limit_per_key`) leaves of each key is the limit less its count. It first takes
the name's transaction-level advisory lock, the one `axa_queue_room` and
`axa_queue_rate_room` take (so a name with a global, rate and per-key limit is claimed
under one lock), and, being `VOLATILE` with its query run after the lock, counts with a
snapshot that sees every claim committed before it: the reasons are
`axa_queue_room`'s, and so is the way it reads the caller's table (a static query when
the search path finds it, else `EXECUTE`)."""

RECORD_15 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (15, 'fairness by key') ON CONFLICT (version) DO NOTHING""")
"""Migration 15 is applied."""

MIGRATION_15 = Migration(
    15,
    "fairness by key",
    (
        SETUP_KEY,
        SETUP_HISTORY_KEY,
        SETUP_KEYED_INDEX,
        SETUP_RUNNING_KEYS_INDEX,
        SETUP_KEY_ROOM_FUNCTION,
    ),
    RECORD_15,
    Expectations(
        columns=(("axa_queue", "key"), ("axa_queue_history", "key")),
        indexes=("axa_queue_keyed", "axa_queue_running_keys"),
        functions=(("axa_queue_key_room(regclass,text)", body_of(SETUP_KEY_ROOM_FUNCTION)),),
    ),
)
"""Migration 15 and what it makes sure of."""
