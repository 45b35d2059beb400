"""Migration 18, additive: the release of dependents done once per statement. The
trigger `axa_queue_release` (migration 14's name) becomes a `BEFORE` row trigger that
only notes each ending of a job with dependents; a new statement-level trigger,
`axa_queue_release_all`, does the release for every ending the statement noted, at
its end: the dependencies marked `done` by one `UPDATE` for the whole statement, one
look per dependent, the dependents locked in id order. Migration 14's function
`axa_queue_release` stays as it was (nothing calls it)."""

from __future__ import annotations

from ...sql.naming import statement
from .migration import Expectations, Migration, body_of

__all__ = [
    "MIGRATION_18",
    "RECORD_18",
    "SETUP_NOTE_ENDING_FUNCTION",
    "SETUP_NOTE_ENDING_TRIGGER",
    "SETUP_RELEASE_ALL_FUNCTION",
    "SETUP_RELEASE_ALL_PATH",
    "SETUP_RELEASE_ALL_TRIGGER",
]

SETUP_NOTE_ENDING_FUNCTION = statement(
    """CREATE OR REPLACE FUNCTION {axa_queue_note_ending}() RETURNS trigger
LANGUAGE plpgsql AS $${body}$$""",
    body="""
DECLARE
    list text := 'axa_queue.' || NEW.status || '_' || TG_RELID::text;
    noted text := current_setting(list, true);
BEGIN
    IF noted IS NULL OR noted = '' THEN
        noted := set_config('axa_queue.endings', 'on', true);
        noted := '';
    END IF;
    noted := set_config(list, noted || NEW.id::text || ',', true);
    RETURN NEW;
END
""",
)
"""Notes a job with dependents that this statement ends: its id appended to a
transaction-local setting named by its new state and the table
(`axa_queue.completed_<oid>`, `axa_queue.failed_<oid>`, `axa_queue.cancelled_<oid>`),
and `axa_queue.endings` set (assignments, not `PERFORM`: each is evaluated as a
simple expression, without a query of its own), which `axa_queue_release_all` (fired at the statement's
end) reads and empties. A `BEFORE` trigger fires only for a row the statement is
about to write, after its lock and the re-check of its `WHERE` against the row's
newest version: a row the fence refuses is never noted. A setting is rolled back with
the (sub)transaction that set it, so a statement that fails leaves nothing noted."""

SETUP_NOTE_ENDING_TRIGGER = statement("""CREATE OR REPLACE TRIGGER axa_queue_release
    BEFORE UPDATE OF status ON {axa_queue} FOR EACH ROW
    WHEN (NEW.dependents AND OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION {axa_queue_note_ending}()""")
"""Migration 14's trigger, by its name, made the noting one: it fires for a job that
has dependents as it completes, fails for good or is cancelled, whichever statement
writes it (the exchange, stale recovery, an act, the Rust crate's); its `WHEN` is
tested on the row without calling the function, so a job without dependents pays that
test, nothing else. The table already has a `BEFORE UPDATE` row trigger
(`axa_queue_blocked_rule`), so every row an `UPDATE` writes was already locked before
the write: this one adds no lock."""

SETUP_RELEASE_ALL_FUNCTION = statement(
    """CREATE OR REPLACE FUNCTION {axa_queue_release_all}() RETURNS trigger
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $${body}$$""",
    body="""
DECLARE
    completed uuid[] := COALESCE(string_to_array(rtrim(
        current_setting('axa_queue.completed_' || TG_RELID::text, true), ','), ',')::uuid[], '{}');
    failed uuid[] := COALESCE(string_to_array(rtrim(
        current_setting('axa_queue.failed_' || TG_RELID::text, true), ','), ',')::uuid[], '{}');
    cancelled uuid[] := COALESCE(string_to_array(rtrim(
        current_setting('axa_queue.cancelled_' || TG_RELID::text, true), ','), ',')::uuid[], '{}');
    ended uuid[];
    cleared text;
    kid uuid;
    pos integer;
    maybe uuid[] := '{}';
    released boolean := false;
BEGIN
    cleared := set_config('axa_queue.endings', '', true)
               || set_config('axa_queue.completed_' || TG_RELID::text, '', true);
    IF cardinality(failed) + cardinality(cancelled) > 0 THEN
        cleared := set_config('axa_queue.failed_' || TG_RELID::text, '', true)
                   || set_config('axa_queue.cancelled_' || TG_RELID::text, '', true);
    END IF;
    ended := completed || failed || cancelled;
    IF cardinality(ended) = 0 THEN
        RETURN NULL;
    END IF;
    FOR kid, pos IN
        WITH marked AS (
            UPDATE axa_queue_deps SET done = true
            WHERE parent = ANY(ended) AND NOT done
              AND (on_parent_failure = 'run' OR parent = ANY(completed))
            RETURNING child, position
        )
        SELECT child, max(position) FROM marked GROUP BY child ORDER BY child
    LOOP
        PERFORM FROM axa_queue_deps w
        WHERE w.child = kid AND NOT w.done AND w.position > pos + 64
        ORDER BY w.position LIMIT 1 FOR SHARE SKIP LOCKED;
        CONTINUE WHEN FOUND;
        PERFORM FROM axa_queue_deps w
        WHERE w.child = kid AND NOT w.done
        ORDER BY w.position DESC LIMIT 1 FOR SHARE SKIP LOCKED;
        CONTINUE WHEN FOUND;
        maybe := maybe || kid;
    END LOOP;
    IF cardinality(failed) + cardinality(cancelled) > 0 THEN
        WITH RECURSIVE doomed(child, parent) AS (
            SELECT d.child, d.parent FROM axa_queue_deps d
            WHERE d.parent = ANY(failed || cancelled) AND d.on_parent_failure = 'cancel' AND NOT d.done
            UNION
            SELECT d.child, d.parent FROM doomed x
            JOIN axa_queue_deps d ON d.parent = x.child
            WHERE d.on_parent_failure = 'cancel' AND NOT d.done
        )
        UPDATE axa_queue q SET status = 'cancelled', updated_at = now(),
            error = 'parent ' || x.parent::text
                    || CASE WHEN x.parent = ANY(failed) THEN ' failed' ELSE ' was cancelled' END
        FROM (SELECT DISTINCT ON (child) child, parent FROM doomed
              ORDER BY child, parent = ANY(failed || cancelled) DESC, parent) x
        WHERE q.id = x.child AND q.status = 'blocked';
    END IF;
    FOREACH kid IN ARRAY maybe LOOP
        PERFORM FROM axa_queue WHERE id = kid AND status = 'blocked' FOR NO KEY UPDATE;
        CONTINUE WHEN NOT FOUND;
        UPDATE axa_queue SET status = 'queued', updated_at = now()
        WHERE id = kid AND status = 'blocked'
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
"""What the endings a statement noted (`axa_queue_note_ending`) do to their
dependents, at the end of that statement (an `AFTER` statement trigger runs inside
it), once for all of them. See docs/design.md, "Workflows", for why it is correct
under concurrency.

1. The noted lists read and emptied (a statement this function runs notes its own).
2. Every dependency the endings satisfy marked `done`, in one `UPDATE`: those of the
   jobs that completed; of those that failed (no attempts left) or were cancelled,
   the ones that say `run`. It returns each dependent once with the highest place
   among those just marked, in id order.
3. For each such dependent, with a snapshot taken after the marking: a dependency left
   that no transaction is ending now (`FOR SHARE SKIP LOCKED`), the first more than 64
   places after the highest just marked, else the last; found, it stays share-locked
   until this transaction commits (its own ending cannot mark it before, and then
   sees this one's marks), and this statement stops there for that dependent. Not
   found, this may be the last: the dependent is kept for step 5.
4. When jobs failed or were cancelled, the dependents that say `cancel` are
   cancelled, and theirs, transitively (one recursive statement), each with the error
   `parent <id> failed` (or `was cancelled`) naming the job that stopped it.
5. Each kept dependent's row locked, in id order (step 2's), then looked at again
   with a snapshot taken after the lock: queued when no dependency of it is left.
6. One notification (the insert trigger's kind) when it released any.

Every marking of a statement comes before any of its looks, and the dependents are
locked in one order, so two statements ending parents of the same dependents wait for
each other in one direction only: no deadlock (a row trigger, looking after each
ending, could). Its `WHEN` tests the setting: a statement that noted nothing (nearly
every one) never calls it. Static SQL with bare names, planned once per session and
always with its generic plan (`plan_cache_mode`): the endings come as arrays, whose
generic plan is costed above a one-element custom plan, so PostgreSQL would otherwise
plan the marking again at every call (about a third of the function's time at one
ending a statement). Its `search_path` is the queue's schema
(`SETUP_RELEASE_ALL_PATH`)."""

SETUP_RELEASE_ALL_PATH = statement("""DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION %s() SET search_path = %I, pg_temp',
        {'axa_queue_release_all'}::regproc,
        (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.oid = {'axa_queue'}::regclass));
END
$$""")
"""The release function reads its own schema's tables whatever the caller's
`search_path` (a queue given a schema, behind a pooler)."""

SETUP_RELEASE_ALL_TRIGGER = statement("""CREATE OR REPLACE TRIGGER axa_queue_release_all
    AFTER UPDATE OF status ON {axa_queue} FOR EACH STATEMENT
    WHEN (current_setting('axa_queue.endings', true) = 'on')
    EXECUTE FUNCTION {axa_queue_release_all}()""")
"""Fires at the end of a statement that changed `status` and noted an ending (its
`WHEN`, tested when the statement's last row is written, without calling the
function). Every table's notes are in settings named by its oid, so a statement
ending jobs of two queues' tables releases each table's dependents with its own
function."""

RECORD_18 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (18, 'release per statement') ON CONFLICT (version) DO NOTHING""")
"""Migration 18 is applied."""

MIGRATION_18 = Migration(
    18,
    "release per statement",
    (
        SETUP_NOTE_ENDING_FUNCTION,
        SETUP_RELEASE_ALL_FUNCTION,
        SETUP_RELEASE_ALL_PATH,
        SETUP_NOTE_ENDING_TRIGGER,
        SETUP_RELEASE_ALL_TRIGGER,
    ),
    RECORD_18,
    Expectations(
        functions=(
            ("axa_queue_note_ending", body_of(SETUP_NOTE_ENDING_FUNCTION)),
            ("axa_queue_release_all", body_of(SETUP_RELEASE_ALL_FUNCTION)),
        ),
        triggers=(("axa_queue", "axa_queue_release_all", False),),
    ),
)
"""Migration 18 and what it makes sure of."""
