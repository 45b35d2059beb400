"""Migration 22, additive: the release of dependents stays linear in the endings of a
statement, whatever their number and order. Three functions replace migration 20's in
its two triggers (which keep their names): `axa_queue_note_batched`, which notes the
endings in chunks, `axa_queue_noted`, which reads a kind of ending's chunks back, and
`axa_queue_release_batched`; migration 20's stay as they were (nothing calls them).

What each change removes, measured on migration 20 (docs/performance.md, "Workflows at
scale"):

- the note: each ending appended its id to one transaction-local setting, copying
  the whole list so far, so a statement ending 30,000 flagged jobs (a workflow
  cancelled, a chord's parents ended together) copied 17 GB: 8.5 s in the row trigger.
  The list is now kept in chunks of `NOTE_CHUNK` ids, each copied at most that often;
- the marking: one `UPDATE` of the dependencies of every ended parent filtered each
  row with `parent = ANY(completed)`, which the generic plan checks against the whole
  array, row by row (3.3 s for 30,000). The completed parents' dependencies and the
  failed or cancelled ones' (`run` only) are now two `UPDATE`s, each finding its rows
  by the primary key alone;
- the cancelled dependents: the recursive step joined the dependencies by hash, a scan
  of the whole table for each level (a chain of 10,000 cancelled at its head: 16 s);
  each level now looks its parents' dependents up by the primary key (`LATERAL`);
- the looks for a dependency left: after the dependencies above the highest marked
  (more than 64 places up) and then from the last one down, both walking every done
  dependency on their way when parents end in the reverse of their order. A look now
  goes at most `LOOK_SPAN` places above the highest marked, then as far below the
  lowest, before the walk from the top: a chord's parents ended in any order find a
  dependency left within a bounded stretch of the index.

The locking is migration 18's (docs/design.md, "Workflows"): any dependency found
undone and not locked keeps the child for a later ending, whatever its place, so the
looks' order changes nothing of the argument."""

from __future__ import annotations

from ...sql.naming import statement
from .migration import Expectations, Migration, body_of

__all__ = [
    "CHUNK_CHARS",
    "LOOK_SPAN",
    "MIGRATION_22",
    "NOTE_CHUNK",
    "RECORD_22",
    "SETUP_NOTED_FUNCTION",
    "SETUP_NOTE_BATCHED_FUNCTION",
    "SETUP_NOTE_BATCHED_TRIGGER",
    "SETUP_RELEASE_BATCHED_FUNCTION",
    "SETUP_RELEASE_BATCHED_PATH",
    "SETUP_RELEASE_BATCHED_TRIGGER",
]

NOTE_CHUNK = 64
"""Ids noted in one chunk of a transaction-local setting before a new chunk starts: each
ending copies at most this many ids (an exchange of 140 endings copies about what it did
with one list)."""

LOOK_SPAN = 1024
"""Places of a child's dependencies each bounded look reads, above the highest place a
statement marked and below the lowest (written as a number in the release's body)."""

CHUNK_CHARS = NOTE_CHUNK * 37
"""A chunk's length in characters (an id and its comma are 37), written as a number in
`axa_queue_note_batched`'s body."""

SETUP_NOTED_FUNCTION = statement(
    """CREATE OR REPLACE FUNCTION {axa_queue_noted}(list text) RETURNS uuid[]
LANGUAGE plpgsql AS $${body}$$""",
    body="""
DECLARE
    chunks integer := COALESCE(NULLIF(current_setting(list || '_chunks', true), ''), '0')::integer;
    gathered text := current_setting(list, true);
    cleared text;
BEGIN
    IF chunks > 0 THEN
        SELECT string_agg(current_setting(list || '_' || k, true), '' ORDER BY k) || gathered
        INTO gathered FROM generate_series(1, chunks) k;
        PERFORM set_config(list || '_' || k, '', true) FROM generate_series(1, chunks) k;
        cleared := set_config(list || '_chunks', '', true);
    END IF;
    IF gathered IS NULL OR gathered = '' THEN
        RETURN '{}';
    END IF;
    cleared := set_config(list, '', true);
    RETURN string_to_array(rtrim(gathered, ','), ',')::uuid[];
END
""",
)
"""The ids noted under the setting `list` (`axa_queue.<state>_<table's oid>`), its full
chunks (`<list>_1` .. `<list>_<n>`, `n` in `<list>_chunks`) first, in the order noted;
the settings cleared. Each chunk is read once and the ids joined once: linear in their
number."""

SETUP_NOTE_BATCHED_FUNCTION = statement(
    """CREATE OR REPLACE FUNCTION {axa_queue_note_batched}() RETURNS trigger
LANGUAGE plpgsql AS $${body}$$""",
    body="""
DECLARE
    list text := 'axa_queue.' || NEW.status || '_' || TG_RELID::text;
    noted text := current_setting(list, true);
    chunks integer;
BEGIN
    IF noted IS NULL OR noted = '' THEN
        noted := set_config('axa_queue.endings', 'on', true);
        noted := '';
    ELSIF length(noted) >= 2368 THEN
        chunks := COALESCE(NULLIF(current_setting(list || '_chunks', true), ''), '0')::integer + 1;
        noted := set_config(list || '_' || chunks, noted, true);
        noted := set_config(list || '_chunks', chunks::text, true);
        noted := '';
    END IF;
    noted := set_config(list, noted || NEW.id::text || ',', true);
    IF NEW.run_trace IS NOT NULL THEN
        noted := set_config('axa_queue.traced_' || TG_RELID::text, 'on', true);
    END IF;
    RETURN NEW;
END
""",
)
"""Migration 20's `axa_queue_note_traced`, the list kept in chunks: when the current
chunk holds `NOTE_CHUNK` ids it is set aside under the next number and a new one
starts, so an ending copies at most a chunk, never the whole list."""

SETUP_NOTE_BATCHED_TRIGGER = statement("""CREATE OR REPLACE TRIGGER axa_queue_release
    BEFORE UPDATE OF status ON {axa_queue} FOR EACH ROW
    WHEN (NEW.dependents AND OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION {axa_queue_note_batched}()""")
"""Migration 18's noting trigger, by its name and with its `WHEN`, calling
`axa_queue_note_batched`."""

SETUP_RELEASE_BATCHED_FUNCTION = statement(
    """CREATE OR REPLACE FUNCTION {axa_queue_release_batched}() RETURNS trigger
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
AS $${body}$$""",
    body="""
DECLARE
    completed uuid[] := axa_queue_noted('axa_queue.completed_' || TG_RELID::text);
    failed uuid[] := axa_queue_noted('axa_queue.failed_' || TG_RELID::text);
    cancelled uuid[] := axa_queue_noted('axa_queue.cancelled_' || TG_RELID::text);
    traced boolean := current_setting('axa_queue.traced_' || TG_RELID::text, true) = 'on';
    ran uuid[] := '{}';
    cleared text;
    kids uuid[];
    highs integer[];
    lows integer[];
    kid uuid;
    hi integer;
    lo integer;
    maybe uuid[] := '{}';
    released boolean := false;
BEGIN
    cleared := set_config('axa_queue.endings', '', true);
    IF traced THEN
        cleared := set_config('axa_queue.traced_' || TG_RELID::text, '', true);
    END IF;
    ran := failed || cancelled;
    IF cardinality(completed) + cardinality(ran) = 0 THEN
        RETURN NULL;
    END IF;
    IF traced THEN
        WITH marked AS (
            UPDATE axa_queue_deps d SET done = true, parent_trace = p.run_trace
            FROM axa_queue p
            WHERE d.parent = ANY(completed) AND NOT d.done AND p.id = d.parent
            RETURNING d.child, d.position
        ), marked_run AS (
            UPDATE axa_queue_deps d SET done = true, parent_trace = p.run_trace
            FROM axa_queue p
            WHERE d.parent = ANY(ran) AND NOT d.done AND d.on_parent_failure = 'run'
              AND p.id = d.parent
            RETURNING d.child, d.position
        ), reach AS (
            SELECT child, max(position) AS highest, min(position) AS lowest
            FROM (SELECT * FROM marked UNION ALL SELECT * FROM marked_run) m GROUP BY child
        )
        SELECT array_agg(child ORDER BY child), array_agg(highest ORDER BY child),
               array_agg(lowest ORDER BY child)
        INTO kids, highs, lows FROM reach;
    ELSE
        WITH marked AS (
            UPDATE axa_queue_deps SET done = true
            WHERE parent = ANY(completed) AND NOT done
            RETURNING child, position
        ), marked_run AS (
            UPDATE axa_queue_deps SET done = true
            WHERE parent = ANY(ran) AND NOT done AND on_parent_failure = 'run'
            RETURNING child, position
        ), reach AS (
            SELECT child, max(position) AS highest, min(position) AS lowest
            FROM (SELECT * FROM marked UNION ALL SELECT * FROM marked_run) m GROUP BY child
        )
        SELECT array_agg(child ORDER BY child), array_agg(highest ORDER BY child),
               array_agg(lowest ORDER BY child)
        INTO kids, highs, lows FROM reach;
    END IF;
    FOR i IN 1 .. COALESCE(cardinality(kids), 0) LOOP
        kid := kids[i];
        hi := highs[i];
        lo := lows[i];
        PERFORM FROM axa_queue_deps w
        WHERE w.child = kid AND NOT w.done
          AND w.position > hi + 64 AND w.position <= hi + 64 + 1024
        ORDER BY w.position LIMIT 1 FOR SHARE SKIP LOCKED;
        CONTINUE WHEN FOUND;
        PERFORM FROM axa_queue_deps w
        WHERE w.child = kid AND NOT w.done
          AND w.position < lo - 64 AND w.position >= lo - 64 - 1024
        ORDER BY w.position DESC LIMIT 1 FOR SHARE SKIP LOCKED;
        CONTINUE WHEN FOUND;
        PERFORM FROM axa_queue_deps w
        WHERE w.child = kid AND NOT w.done
        ORDER BY w.position DESC LIMIT 1 FOR SHARE SKIP LOCKED;
        CONTINUE WHEN FOUND;
        maybe := maybe || kid;
    END LOOP;
    IF cardinality(ran) > 0 THEN
        WITH RECURSIVE doomed(child, parent) AS (
            SELECT d.child, d.parent FROM axa_queue_deps d
            WHERE d.parent = ANY(ran) AND d.on_parent_failure = 'cancel' AND NOT d.done
            UNION
            SELECT d.child, d.parent FROM doomed x
            CROSS JOIN LATERAL (
                SELECT n.child, n.parent FROM axa_queue_deps n
                WHERE n.parent = x.child AND n.on_parent_failure = 'cancel' AND NOT n.done
            ) d
        )
        UPDATE axa_queue q SET status = 'cancelled', updated_at = now(),
            error = 'parent ' || x.parent::text
                    || CASE WHEN x.parent = ANY(failed) THEN ' failed' ELSE ' was cancelled' END
        FROM (SELECT DISTINCT ON (child) child, parent FROM doomed
              ORDER BY child, parent = ANY(ran) DESC, parent) x
        WHERE q.id = x.child AND q.status = 'blocked';
    END IF;
    FOREACH kid IN ARRAY maybe LOOP
        PERFORM FROM axa_queue WHERE id = kid AND status = 'blocked' FOR NO KEY UPDATE;
        CONTINUE WHEN NOT FOUND;
        UPDATE axa_queue q SET status = 'queued', updated_at = now(),
            trace_context = CASE
                WHEN l.links IS NULL THEN q.trace_context
                WHEN jsonb_typeof(q.trace_context) = 'object'
                    THEN q.trace_context || jsonb_build_object('links', l.links)
                ELSE jsonb_build_object('links', l.links) END
        FROM (SELECT jsonb_agg(t.parent_trace ORDER BY t.position) AS links
              FROM (SELECT w.parent_trace, w.position FROM axa_queue_deps w
                    WHERE w.child = kid AND w.parent_trace IS NOT NULL
                    ORDER BY w.position LIMIT 128) t) l
        WHERE q.id = kid AND q.status = 'blocked'
          AND NOT EXISTS (SELECT FROM axa_queue_deps WHERE child = kid AND NOT done);
        released := released OR FOUND;
    END LOOP;
    IF released AND current_setting('axa_queue.notify', true) IS DISTINCT FROM 'off' THEN
        PERFORM pg_notify('axa_queue', TG_TABLE_SCHEMA || ' 0');
    END IF;
    RETURN NULL;
END
""",
)
"""Migration 20's `axa_queue_release_traced`, its steps and locking unchanged, with:

- the noted endings read by `axa_queue_noted` (each kind's chunks, then cleared);
- the marking as two `UPDATE`s, one for the completed parents' dependencies and one
  for the failed or cancelled ones' that say `run`, each found by the primary key
  alone (no row checked against the array of completed parents);
- the looks for a dependency left bounded to `LOOK_SPAN` places above the highest
  place marked, then below the lowest, before the walk from the last place down;
- the recursive cancel's step a `LATERAL` look-up of each level's dependents by the
  primary key;
- `enable_seqscan` off for its statements: each reads a few rows by a key, and a
  generic plan made while the dependencies' table looked small (its statistics from
  before a big workflow was queued) read the whole table for each level of a chain
  (10,000 steps cancelled at the head: 9 s with the `LATERAL` step alone)."""

SETUP_RELEASE_BATCHED_PATH = statement("""DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION %s() SET search_path = %I, pg_temp',
        {'axa_queue_release_batched'}::regproc,
        (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.oid = {'axa_queue'}::regclass));
END
$$""")
"""The release function reads its own schema's tables (and `axa_queue_noted`) whatever
the caller's `search_path` (a queue given a schema, behind a pooler)."""

SETUP_RELEASE_BATCHED_TRIGGER = statement("""CREATE OR REPLACE TRIGGER axa_queue_release_all
    AFTER UPDATE OF status ON {axa_queue} FOR EACH STATEMENT
    WHEN (current_setting('axa_queue.endings', true) = 'on')
    EXECUTE FUNCTION {axa_queue_release_batched}()""")
"""Migration 18's statement trigger, by its name and with its `WHEN`, calling
`axa_queue_release_batched`."""

RECORD_22 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (22, 'releases at scale') ON CONFLICT (version) DO NOTHING""")
"""Migration 22 is applied."""

MIGRATION_22 = Migration(
    22,
    "releases at scale",
    (
        SETUP_NOTED_FUNCTION,
        SETUP_NOTE_BATCHED_FUNCTION,
        SETUP_RELEASE_BATCHED_FUNCTION,
        SETUP_RELEASE_BATCHED_PATH,
        SETUP_NOTE_BATCHED_TRIGGER,
        SETUP_RELEASE_BATCHED_TRIGGER,
    ),
    RECORD_22,
    Expectations(
        functions=(
            ("axa_queue_noted(text)", body_of(SETUP_NOTED_FUNCTION)),
            ("axa_queue_note_batched", body_of(SETUP_NOTE_BATCHED_FUNCTION)),
            ("axa_queue_release_batched", body_of(SETUP_RELEASE_BATCHED_FUNCTION)),
        ),
    ),
)
"""Migration 22 and what it makes sure of."""
