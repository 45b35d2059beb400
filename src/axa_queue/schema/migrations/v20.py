"""Migration 20, additive: the spans of a dependent link to its parents' runs. A job's
row keeps the trace context of its last run's span (`run_trace`), written by the
statement that records the run's ending when the worker traces its runs
(`axa_queue.otel`); the dependencies keep their parent's (`parent_trace`), copied as the
parent's ending satisfies them; and the release writes them into the dependent's
`trace_context` as `links` (the first 128 in dependency order), which its run's span
links to. Two functions replace migration 18's in its two triggers (which keep their
names): `axa_queue_note_traced` and `axa_queue_release_traced`; migration 18's stay as
they were (nothing calls them)."""

from __future__ import annotations

from ...sql.naming import statement
from .migration import Expectations, Migration, body_of

__all__ = [
    "LINKS_KEPT",
    "MIGRATION_20",
    "RECORD_20",
    "SETUP_NOTE_TRACED_FUNCTION",
    "SETUP_NOTE_TRACED_TRIGGER",
    "SETUP_PARENT_TRACE_COLUMN",
    "SETUP_RELEASE_TRACED_FUNCTION",
    "SETUP_RELEASE_TRACED_PATH",
    "SETUP_RELEASE_TRACED_TRIGGER",
    "SETUP_RUN_TRACE_COLUMN",
]

LINKS_KEPT = 128
"""At most this many parents' run contexts are written into a dependent's
`trace_context` (in dependency order): the OpenTelemetry SDK's default limit of links
on a span, so a chord's callback of 10,000 parents stores 128, not 10,000."""

SETUP_RUN_TRACE_COLUMN = statement("""ALTER TABLE {axa_queue}
    ADD COLUMN IF NOT EXISTS run_trace JSONB""")
"""The W3C trace context (a carrier: `traceparent`, `tracestate`) of the span of the job's
last run that ended, written by the exchange with the run's ending when the worker
traces runs; NULL otherwise (and for the Rust crate's runs). Only the release reads it,
in the statement that writes it, so it stays in the hot table (a move to the history
leaves it). No default and no index: adding it rewrites nothing."""

SETUP_PARENT_TRACE_COLUMN = statement("""ALTER TABLE {axa_queue_deps}
    ADD COLUMN IF NOT EXISTS parent_trace JSONB""")
"""The parent's `run_trace` as its ending satisfied this dependency: kept on the
dependency, so the release of a dependent whose parents ended over hours (and moved to
the history since) reads them from the dependent's own rows."""

SETUP_NOTE_TRACED_FUNCTION = statement(
    """CREATE OR REPLACE FUNCTION {axa_queue_note_traced}() RETURNS trigger
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
    IF NEW.run_trace IS NOT NULL THEN
        noted := set_config('axa_queue.traced_' || TG_RELID::text, 'on', true);
    END IF;
    RETURN NEW;
END
""",
)
"""Migration 18's `axa_queue_note_ending`, and one thing more: an ending whose run was
traced (`run_trace` written) also sets `axa_queue.traced_<oid>`, so the release copies
the parents' contexts only in a statement that wrote one."""

SETUP_NOTE_TRACED_TRIGGER = statement("""CREATE OR REPLACE TRIGGER axa_queue_release
    BEFORE UPDATE OF status ON {axa_queue} FOR EACH ROW
    WHEN (NEW.dependents AND OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION {axa_queue_note_traced}()""")
"""Migration 18's noting trigger, by its name, calling `axa_queue_note_traced`."""

SETUP_RELEASE_TRACED_FUNCTION = statement(
    """CREATE OR REPLACE FUNCTION {axa_queue_release_traced}() RETURNS trigger
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $${body}$$""",
    body="""
DECLARE
    completed uuid[] := COALESCE(string_to_array(rtrim(
        current_setting('axa_queue.completed_' || TG_RELID::text, true), ','), ',')::uuid[], '{}');
    failed uuid[] := COALESCE(string_to_array(rtrim(
        current_setting('axa_queue.failed_' || TG_RELID::text, true), ','), ',')::uuid[], '{}');
    cancelled uuid[] := COALESCE(string_to_array(rtrim(
        current_setting('axa_queue.cancelled_' || TG_RELID::text, true), ','), ',')::uuid[], '{}');
    traced boolean := current_setting('axa_queue.traced_' || TG_RELID::text, true) = 'on';
    ended uuid[];
    cleared text;
    kids uuid[];
    places integer[];
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
    IF traced THEN
        cleared := set_config('axa_queue.traced_' || TG_RELID::text, '', true);
    END IF;
    ended := completed || failed || cancelled;
    IF cardinality(ended) = 0 THEN
        RETURN NULL;
    END IF;
    IF traced THEN
        WITH marked AS (
            UPDATE axa_queue_deps d SET done = true, parent_trace = p.run_trace
            FROM axa_queue p
            WHERE d.parent = ANY(ended) AND NOT d.done
              AND (d.on_parent_failure = 'run' OR d.parent = ANY(completed))
              AND p.id = d.parent
            RETURNING d.child, d.position
        ), highest AS (
            SELECT child, max(position) AS position FROM marked GROUP BY child
        )
        SELECT array_agg(child ORDER BY child), array_agg(position ORDER BY child)
        INTO kids, places FROM highest;
    ELSE
        WITH marked AS (
            UPDATE axa_queue_deps SET done = true
            WHERE parent = ANY(ended) AND NOT done
              AND (on_parent_failure = 'run' OR parent = ANY(completed))
            RETURNING child, position
        ), highest AS (
            SELECT child, max(position) AS position FROM marked GROUP BY child
        )
        SELECT array_agg(child ORDER BY child), array_agg(position ORDER BY child)
        INTO kids, places FROM highest;
    END IF;
    FOR i IN 1 .. COALESCE(cardinality(kids), 0) LOOP
        kid := kids[i];
        pos := places[i];
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
"""Migration 18's `axa_queue_release_all` (its steps, its locking order and why it is
correct: docs/design.md, "Workflows"), and two things more:

- in a statement that ended a traced run (`axa_queue.traced_<oid>`), the marking also
  copies each parent's `run_trace` into the dependency it satisfies (`parent_trace`),
  from the parent's row this statement just wrote (found by its primary key); a
  statement without one runs migration 18's marking as it was;
- the release of a dependent writes the `parent_trace` of its first `LINKS_KEPT`
  dependencies that have one (in dependency order) into its `trace_context`, as
  `links`, beside the `traceparent` of its enqueue (a `trace_context` that is not a
  JSON object is replaced): the run's span links to each (`axa_queue.otel`). One more
  read of the dependent's own dependencies (its index), in the release only."""

SETUP_RELEASE_TRACED_PATH = statement("""DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION %s() SET search_path = %I, pg_temp',
        {'axa_queue_release_traced'}::regproc,
        (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.oid = {'axa_queue'}::regclass));
END
$$""")
"""The release function reads its own schema's tables whatever the caller's
`search_path` (a queue given a schema, behind a pooler)."""

SETUP_RELEASE_TRACED_TRIGGER = statement("""CREATE OR REPLACE TRIGGER axa_queue_release_all
    AFTER UPDATE OF status ON {axa_queue} FOR EACH STATEMENT
    WHEN (current_setting('axa_queue.endings', true) = 'on')
    EXECUTE FUNCTION {axa_queue_release_traced}()""")
"""Migration 18's statement trigger, by its name, calling `axa_queue_release_traced`."""

RECORD_20 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (20, 'parents linked') ON CONFLICT (version) DO NOTHING""")
"""Migration 20 is applied."""

MIGRATION_20 = Migration(
    20,
    "parents linked",
    (
        SETUP_RUN_TRACE_COLUMN,
        SETUP_PARENT_TRACE_COLUMN,
        SETUP_NOTE_TRACED_FUNCTION,
        SETUP_RELEASE_TRACED_FUNCTION,
        SETUP_RELEASE_TRACED_PATH,
        SETUP_NOTE_TRACED_TRIGGER,
        SETUP_RELEASE_TRACED_TRIGGER,
    ),
    RECORD_20,
    Expectations(
        columns=(("axa_queue", "run_trace"), ("axa_queue_deps", "parent_trace")),
        functions=(
            ("axa_queue_note_traced", body_of(SETUP_NOTE_TRACED_FUNCTION)),
            ("axa_queue_release_traced", body_of(SETUP_RELEASE_TRACED_FUNCTION)),
        ),
    ),
)
"""Migration 20 and what it makes sure of."""
