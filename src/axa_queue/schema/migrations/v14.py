"""Migration 14, additive: dependencies between jobs (workflows). A new state, `blocked`
(a job waiting for the jobs it depends on), the table of dependencies
(`axa_queue_deps`), the table of each workflow's members (`axa_workflows`), a flag on
each job that has dependents (`axa_queue.dependents`), and the two triggers that keep
them: one refuses any change into or out of `blocked` but the two allowed, the other
releases (or cancels) a job's dependents in the statement that ends it."""

from __future__ import annotations

from ...sql.naming import statement
from .migration import Expectations, Migration, body_of

__all__ = [
    "DEPS_COLUMNS",
    "MIGRATION_14",
    "RECORD_14",
    "SETUP_BLOCKED_FUNCTION",
    "SETUP_BLOCKED_INDEX",
    "SETUP_BLOCKED_STATE",
    "SETUP_BLOCKED_TRIGGER",
    "SETUP_DEPENDENTS_COLUMN",
    "SETUP_DEPS_CHILD_INDEX",
    "SETUP_DEPS_TABLE",
    "SETUP_NO_PARENT_FUNCTION",
    "SETUP_RELEASE_FUNCTION",
    "SETUP_RELEASE_PATH",
    "SETUP_RELEASE_TRIGGER",
    "SETUP_WORKFLOWS_JOB_INDEX",
    "SETUP_WORKFLOWS_TABLE",
    "WORKFLOWS_COLUMNS",
]

SETUP_BLOCKED_STATE = statement("""DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conname = 'axa_queue_state_valid' AND conrelid = {'axa_queue'}::regclass
          AND pg_get_constraintdef(oid) LIKE '%blocked%'
    ) THEN
        ALTER TABLE {axa_queue} DROP CONSTRAINT IF EXISTS axa_queue_state_valid,
            ADD CONSTRAINT axa_queue_state_valid CHECK (
                status IN ('queued', 'running', 'completed', 'failed', 'cancelled', 'needs_review',
                           'blocked')
                AND attempts >= 0
                AND (status <> 'running' OR started_at IS NOT NULL)
            ) NOT VALID;
    END IF;
END
$$""")
"""The table's check of states (migration 2's) made again with `blocked`, once (a check
cannot be changed in place: dropped and added, `NOT VALID` as before, in one `ALTER`)."""

SETUP_DEPENDENTS_COLUMN = statement("""DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_attribute
        WHERE attrelid = {'axa_queue'}::regclass AND attname = 'dependents' AND NOT attisdropped
    ) THEN
        ALTER TABLE {axa_queue} ADD COLUMN IF NOT EXISTS dependents BOOLEAN NOT NULL DEFAULT false;
    END IF;
END
$$""")
"""Whether some job depends on this one: set by the enqueue that names it as a
dependency, never cleared. The release trigger fires only for a job that has it, so a
job without dependents (nearly every one) costs its ending one test of a column of its
own row. A constant default: added without rewriting the table, and added once, so
later setups take no lock. The crate never writes it (its inserts take the default)."""

SETUP_DEPS_TABLE = statement("""CREATE TABLE IF NOT EXISTS {axa_queue_deps} (
    child UUID NOT NULL,
    parent UUID NOT NULL,
    position INTEGER NOT NULL,
    on_parent_failure TEXT NOT NULL DEFAULT 'cancel'
        CONSTRAINT axa_queue_deps_policy CHECK (on_parent_failure IN ('cancel', 'run')),
    done BOOLEAN NOT NULL DEFAULT false,
    PRIMARY KEY (parent, child)
) WITH (fillfactor = 70)""")
"""Each dependency of a job (`child`) on another (`parent`): its place among the
child's dependencies (`position`, the order `parent_results` reads them in), what a
parent that fails or is cancelled does to the child (`cancel` it, or `run` it as if the
parent had completed), and whether the parent's ending has satisfied it (`done`). The
rows stay (results are read through them) and leave with the child (`PURGE`). The
primary key finds a parent's dependents when it ends; no foreign keys: a job moves to
the history and back. `fillfactor` 70 leaves room on each page for a dependency's
`done` to be written beside it (a HOT update: no index touched)."""

SETUP_DEPS_CHILD_INDEX = statement("""CREATE INDEX IF NOT EXISTS axa_queue_deps_child
    ON {axa_queue_deps} (child, position)""")
"""A job's dependencies in order: what the release reads of a child, and what
`parent_results` reads."""

SETUP_WORKFLOWS_TABLE = statement("""CREATE TABLE IF NOT EXISTS {axa_workflows} (
    workflow UUID NOT NULL,
    job UUID NOT NULL,
    position INTEGER NOT NULL,
    PRIMARY KEY (workflow, position)
)""")
"""The members of each workflow queued by `chain`, `group` or `chord`, in the order
they were given."""

SETUP_WORKFLOWS_JOB_INDEX = statement("""CREATE UNIQUE INDEX IF NOT EXISTS axa_workflows_job
    ON {axa_workflows} (job)""")
"""A job's workflow (at most one)."""

SETUP_BLOCKED_INDEX = statement("""CREATE INDEX IF NOT EXISTS axa_queue_blocked
    ON {axa_queue} (name) WHERE status = 'blocked'""")
"""Blocked jobs by name, for the counts: partial, so only a blocked job has an entry."""

SETUP_BLOCKED_FUNCTION = statement(
    """CREATE OR REPLACE FUNCTION {axa_queue_blocked_rule}() RETURNS trigger
LANGUAGE plpgsql AS $${body}$$""",
    body="""
BEGIN
    IF NEW.status = 'blocked' THEN
        RAISE EXCEPTION 'job % cannot become blocked: only a job queued with dependencies starts blocked', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.status NOT IN ('queued', 'cancelled') THEN
        RAISE EXCEPTION 'job % is blocked: it can only be queued (its dependencies done) or cancelled', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
""",
)
"""The state machine's rule for `blocked`: nothing enters it but an insert, and it is
left only for `queued` (by the release) or `cancelled` (a person, or a dependency's
failure); a claim never sees it (the crate's claims `queued` only)."""

SETUP_BLOCKED_TRIGGER = statement("""CREATE OR REPLACE TRIGGER axa_queue_blocked_rule
    BEFORE UPDATE OF status ON {axa_queue} FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status AND (OLD.status = 'blocked' OR NEW.status = 'blocked'))
    EXECUTE FUNCTION {axa_queue_blocked_rule}()""")
"""Checks only a change into or out of `blocked` (its `WHEN`, tested without calling
the function), so other changes pay one comparison."""

SETUP_NO_PARENT_FUNCTION = statement(
    """CREATE OR REPLACE FUNCTION {axa_queue_no_parent}(child uuid, parent uuid, why text)
RETURNS boolean LANGUAGE plpgsql AS $${body}$$""",
    body="""
BEGIN
    RAISE EXCEPTION 'cannot queue job %: it depends on job %, %', child, parent, why
        USING ERRCODE = 'foreign_key_violation',
              HINT = 'name a job that exists, or one given earlier in the same call';
END
""",
)
"""Refuses an enqueue whose dependency cannot be: the statement calls it for such a
dependency, so the whole statement (every job of it) is refused. Ids only, never
arguments."""

SETUP_RELEASE_FUNCTION = statement(
    """CREATE OR REPLACE FUNCTION {axa_queue_release}() RETURNS trigger
LANGUAGE plpgsql AS $${body}$$""",
    body="""
DECLARE
    kid uuid;
    pos integer;
    maybe uuid[] := '{}';
    released boolean := false;
BEGIN
    FOR kid, pos IN
        UPDATE axa_queue_deps SET done = true
        WHERE parent = NEW.id AND NOT done
          AND (NEW.status = 'completed' OR on_parent_failure = 'run')
        RETURNING child, position
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
    IF NEW.status <> 'completed' THEN
        WITH RECURSIVE doomed(child, parent) AS (
            SELECT d.child, d.parent FROM axa_queue_deps d
            WHERE d.parent = NEW.id AND d.on_parent_failure = 'cancel' AND NOT d.done
            UNION
            SELECT d.child, d.parent FROM doomed x
            JOIN axa_queue_deps d ON d.parent = x.child
            WHERE d.on_parent_failure = 'cancel' AND NOT d.done
        )
        UPDATE axa_queue q SET status = 'cancelled', updated_at = now(),
            error = 'parent ' || x.parent::text
                    || CASE WHEN x.parent = NEW.id AND NEW.status = 'failed' THEN ' failed'
                            ELSE ' was cancelled' END
        FROM (SELECT DISTINCT ON (child) child, parent FROM doomed
              ORDER BY child, parent = NEW.id DESC, parent) x
        WHERE q.id = x.child AND q.status = 'blocked';
    END IF;
    IF cardinality(maybe) > 1 THEN
        maybe := ARRAY(SELECT DISTINCT unnest(maybe) ORDER BY 1);
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
"""What a job's ending does to its dependents, in the statement that writes the ending
(an `AFTER` row trigger runs inside its statement), and only for a row that statement
changed: an ending refused by the fence changes no row, so it releases nothing. See
docs/design.md, "Workflows", for why it is correct under concurrency.

1. The dependencies it satisfies are marked `done`: all of them when the job
   completed; when it failed (no attempts left) or was cancelled, those that say
   `run`.
2. When it failed or was cancelled, the dependents that say `cancel` are cancelled,
   and theirs, transitively (one recursive statement), each with the error `parent
   <id> failed` (or `was cancelled`) naming the job that stopped it.
3. Each dependent with a dependency just done is released (`queued`) when no
   dependency of it is left. Under READ COMMITTED two parents ending at once, in two
   transactions, may each see the other's dependency as not done: so an ending,
   dependent by dependent as its marking returns them (a `FOR` loop over the
   `UPDATE ... RETURNING`), looks for a dependency left that no transaction is ending
   now (`FOR SHARE SKIP LOCKED`: a dependency being marked `done` is locked by its
   ending), with a snapshot taken after its own marking. If it finds one, it keeps it
   share-locked until it commits: that dependency's own ending cannot mark it until
   then, so it will see this one done; this ending stops there for that dependent. If
   it finds none, it may be the last: after the cancelling, it locks the dependent's row
   (dependents in id order) and looks again with a snapshot taken after the lock; two
   such endings take the lock one after the other, and the second sees the first's.
   So no dependent is released before every dependency is done, and none stays
   blocked once they all are, and an ending locks the dependent only when it may be
   the last: a chord's callback is not a row every parent's ending waits for. The
   dependency left that it share-locks is the first one more than 64 places after its
   own (else the last): parents end roughly in their order (a group is claimed in the
   order it was given), so that one is not ending now and is far enough ahead that
   this ending has committed before it ends, and each ending of a chord's group
   share-locks a row of its own (one row locked by every ending would write its lock
   to one page at every ending). Two plain statements per ending (the marking, one
   look) rather than one statement gathering every dependent into an array: about a
   sixth less server time per ending (docs/performance.md).
4. One notification (the insert trigger's kind) when it released any, so a worker
   waiting wakes.

Static SQL with bare names, planned once per session: the function's `search_path` is
set to the queue's schema (`SETUP_RELEASE_PATH`), which keeps the body the same in
every schema."""

SETUP_RELEASE_PATH = statement("""DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION %s() SET search_path = %I, pg_temp',
        {'axa_queue_release'}::regproc,
        (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.oid = {'axa_queue'}::regclass));
END
$$""")
"""The release function reads its own schema's tables whatever the caller's
`search_path` (a queue given a schema, behind a pooler)."""

SETUP_RELEASE_TRIGGER = statement("""CREATE OR REPLACE TRIGGER axa_queue_release
    AFTER UPDATE OF status ON {axa_queue} FOR EACH ROW
    WHEN (NEW.dependents AND OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION {axa_queue_release}()""")
"""Fires for a job that has dependents as it completes, fails for good or is
cancelled, whichever statement writes it (the exchange, stale recovery, an act, the
Rust crate's). Its `WHEN` is tested on the row without calling the function: a job
without dependents pays that test, nothing else. `needs_review` holds the dependents
(a person's release queues the job again; their cancel fires it)."""

DEPS_COLUMNS = ("child", "parent", "position", "on_parent_failure", "done")
"""The dependencies table's columns."""

WORKFLOWS_COLUMNS = ("workflow", "job", "position")
"""The workflows table's columns."""

RECORD_14 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (14, 'workflows') ON CONFLICT (version) DO NOTHING""")
"""Migration 14 is applied."""

MIGRATION_14 = Migration(
    14,
    "workflows",
    (
        SETUP_BLOCKED_STATE,
        SETUP_DEPENDENTS_COLUMN,
        SETUP_DEPS_TABLE,
        SETUP_DEPS_CHILD_INDEX,
        SETUP_WORKFLOWS_TABLE,
        SETUP_WORKFLOWS_JOB_INDEX,
        SETUP_BLOCKED_INDEX,
        SETUP_BLOCKED_FUNCTION,
        SETUP_BLOCKED_TRIGGER,
        SETUP_NO_PARENT_FUNCTION,
        SETUP_RELEASE_FUNCTION,
        SETUP_RELEASE_PATH,
        SETUP_RELEASE_TRIGGER,
    ),
    RECORD_14,
    Expectations(
        tables=("axa_queue_deps", "axa_workflows"),
        columns=(
            ("axa_queue", "dependents"),
            *(("axa_queue_deps", c) for c in DEPS_COLUMNS),
            *(("axa_workflows", c) for c in WORKFLOWS_COLUMNS),
        ),
        indexes=("axa_queue_deps_child", "axa_workflows_job", "axa_queue_blocked"),
        storage=(("axa_queue_deps", ("fillfactor=70",)),),
        constraints=(
            ("axa_queue_deps", "axa_queue_deps_pkey"),
            ("axa_queue_deps", "axa_queue_deps_policy"),
            ("axa_workflows", "axa_workflows_pkey"),
        ),
        functions=(
            ("axa_queue_blocked_rule", body_of(SETUP_BLOCKED_FUNCTION)),
            ("axa_queue_release", body_of(SETUP_RELEASE_FUNCTION)),
            ("axa_queue_no_parent(uuid,uuid,text)", body_of(SETUP_NO_PARENT_FUNCTION)),
        ),
        triggers=(
            ("axa_queue", "axa_queue_blocked_rule", False),
            ("axa_queue", "axa_queue_release", False),
        ),
    ),
)
"""Migration 14 and what it makes sure of."""
