"""Workflows: jobs queued with the dependencies among them (`ENQUEUE_LINKED`), a
workflow's members read back (`WORKFLOW`), a dependent's parents' results
(`PARENT_RESULTS`), and a workflow cancelled (`CANCEL_WORKFLOW`).

What a job's ending does to its dependents is not here: the release triggers
(`axa_queue_release` notes each ending, `axa_queue_release_all` releases once per
statement) do it inside whichever statement writes the ending (see
`schema.migrations.v17`)."""

from __future__ import annotations

from .acts import _CANCELLED
from .naming import statement

__all__ = [
    "CANCEL_WORKFLOW",
    "ENQUEUE_LINKED",
    "PARENT_RESULTS",
    "WORKFLOW",
    "WORKFLOWS_DROP",
    "WORKFLOW_OF",
]

ENQUEUE_LINKED = statement("""WITH named AS (
        UPDATE {axa_queue} SET dependents = true
        WHERE id = ANY(%(outside)s::uuid[])
        RETURNING id, status
    ), kept AS (
        SELECT id, status FROM {axa_queue_history}
        WHERE id = ANY(%(outside)s::uuid[]) AND id <> ALL(ARRAY(SELECT id FROM named))
    ), edges AS (
        SELECT e.n, e.child, e.parent, e.position, e.policy, e.inside, p.status AS parent_status,
               COALESCE(p.status = 'completed'
                        OR (p.status IN ('failed', 'cancelled') AND e.policy = 'run'), false) AS done
        FROM unnest(%(child)s::uuid[], %(parent)s::uuid[], %(position)s::int[], %(policy)s::text[],
                    %(inside)s::bool[]) WITH ORDINALITY
            AS e(child, parent, position, policy, inside, n)
        LEFT JOIN (SELECT id, status FROM named UNION ALL SELECT id, status FROM kept) p
            ON p.id = e.parent
    ), refused AS (
        SELECT {axa_queue_no_parent}(e.child, e.parent,
            CASE WHEN e.parent_status IS NULL THEN 'which does not exist'
                 WHEN e.parent_status = 'failed' THEN 'which failed (a dependent that says on_parent_failure="cancel" could never run)'
                 ELSE 'which was cancelled (a dependent that says on_parent_failure="cancel" could never run)'
            END) AS refused
        FROM edges e
        WHERE (e.parent_status IS NULL AND NOT e.inside)
           OR (e.parent_status IN ('failed', 'cancelled') AND e.policy = 'cancel')
    ), linked AS (
        INSERT INTO {axa_queue_deps} (child, parent, position, on_parent_failure, done)
        SELECT child, parent, position, policy, done FROM edges
        WHERE (SELECT count(*) FROM refused) = 0 ORDER BY n
    ), members AS (
        INSERT INTO {axa_workflows} (workflow, job, position)
        SELECT %(workflow)s::uuid, m.id, m.n - 1
        FROM unnest(%(id)s::uuid[]) WITH ORDINALITY AS m(id, n)
        WHERE %(workflow)s::uuid IS NOT NULL AND (SELECT count(*) FROM refused) = 0
    )
    INSERT INTO {axa_queue} (id, name, args, max_attempts, priority, run_at, timeout_ms,
                           trace_context, status, dependents, key)
    SELECT j.id, j.name, j.args::jsonb, j.max_attempts, j.priority,
           COALESCE(j.at, COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => j.delay)),
           j.timeout_ms, %(trace_context)s::jsonb,
           CASE WHEN j.id IN (SELECT DISTINCT child FROM edges WHERE NOT done) THEN 'blocked' ELSE 'queued' END,
           j.dependents, j.key
    FROM unnest(%(id)s::uuid[], %(name)s::text[], %(args)s::text[], %(max_attempts)s::int[],
                %(priority)s::smallint[], %(at)s::timestamptz[], %(delay)s::float8[],
                %(timeout_ms)s::bigint[], %(dependents)s::bool[], %(key)s::text[])
         AS j(id, name, args, max_attempts, priority, at, delay, timeout_ms, dependents, key)
    WHERE (SELECT count(*) FROM refused) = 0""")
"""Queue jobs with their dependencies in one statement, whatever their number (a
workflow of `chain`, `group` and `chord`, or jobs given `after`): the jobs as
`ENQUEUE_MANY_KEYED` puts them (with their `key`), each `blocked` while a dependency of it is not done, else
`queued`; their dependencies (`edges`: child, parent, position, policy, and `inside`,
whether the parent is a job of this call, one array each); their places in the
workflow, if any (`workflow`). Each dependency is read once, by its own row: `inside`
comes from the client (which made the call's ids), so no dependency is looked for among
the call's ids (a look that is quadratic in a chord's size). Whether a job waits is
read from a hash of the children of dependencies not done, made once: `DISTINCT` keeps
the planner's guess of its size small (the join with the parents found is guessed many
times too big, and a hash thought too big for `work_mem` would be replaced by a read of
every dependency for each job: 74 s for 20,000 jobs each after a job of its own).
The dependencies are inserted in the order given (`n`): the order their parents are
inserted and so claimed in, so the endings of one exchange mark rows that sit together
on a few pages (the join would leave them in its hash's order, one page each).

A parent outside the call (`outside`: the distinct parents not queued by it) is found
and flagged in `axa_queue` (`named`: `dependents` set, which the release trigger fires
on), or in the history (`kept`, finished: never flagged). Flagging it locks its row
until the caller commits, so its ending and this enqueue are one after the other: an
ending that committed first is read here (the `UPDATE` reads the row's newest version),
and an ending that waits for this one runs its trigger with a snapshot taken after the
wait, which sees these dependencies. So no dependency is missed by its parent's
ending. A dependency on a job already completed is done at once (and on one that
failed or was cancelled, when it says `run`); a job whose dependencies are all done is
queued at once.

Refused, the whole statement (`refused` calls `axa_queue_no_parent`, which raises,
naming the two ids): a parent that is neither in the call nor in either table, and one
that already failed or was cancelled when the dependency says `cancel` (it could never
run). A parent in the call is given before its child (the client checks it), so no
cycle can be made. Each data-modifying CTE waits for `refused` to be counted, so
nothing is written before the refusal."""

WORKFLOW = statement("""SELECT m.position, m.job::text AS id, COALESCE(q.name, h.name) AS name,
        COALESCE(q.status, h.status) AS status,
        ARRAY(SELECT d.parent::text FROM {axa_queue_deps} d
              WHERE d.child = m.job ORDER BY d.position) AS parents
    FROM {axa_workflows} m
    LEFT JOIN {axa_queue} q ON q.id = m.job
    LEFT JOIN LATERAL (SELECT name, status FROM {axa_queue_history} h
                       WHERE h.id = m.job AND q.id IS NULL LIMIT 1) h ON true
    WHERE m.workflow = %(workflow)s
    ORDER BY m.position""")
"""A workflow's members in the order they were given: each job's id, name, state (in
`axa_queue` or the history; NULL once purged) and the ids it depends on, in order.
Never arguments or results."""

WORKFLOW_OF = statement("""SELECT COALESCE(
        (SELECT workflow::text FROM {axa_workflows} WHERE job = %(id)s),
        (SELECT workflow::text FROM {axa_workflows} WHERE workflow = %(id)s LIMIT 1)
    ) AS workflow""")
"""The workflow `id` names: the one the job `id` is a member of (`axa_workflows_job`),
else the workflow whose own id it is; NULL when neither (the CLI and the dashboard take
either id)."""

PARENT_RESULTS = statement("""SELECT d.parent::text AS id, COALESCE(q.status, h.status) AS status,
        COALESCE(q.result, h.result)::text AS result
    FROM {axa_queue_deps} d
    LEFT JOIN {axa_queue} q ON q.id = d.parent
    LEFT JOIN LATERAL (SELECT status, result FROM {axa_queue_history} h
                       WHERE h.id = d.parent AND q.id IS NULL LIMIT 1) h ON true
    WHERE d.child = %(id)s
    ORDER BY d.position""")
"""What each job `id` depends on returned, in the dependencies' order (a chord's
callback: its group's order), as JSON text (NULL: it returned nothing, or did not
complete and the dependency said `run`), with the parent's state."""

CANCEL_WORKFLOW = statement(
    "".join(
        (
            """WITH target AS (
        SELECT id, status FROM {axa_queue}
        WHERE id = ANY(ARRAY(SELECT job FROM {axa_workflows} WHERE workflow = %(workflow)s))
          AND status IN ('queued', 'running', 'blocked', 'needs_review')
        ORDER BY id
        FOR UPDATE
""",
            _CANCELLED,
            """    ), told AS (
        SELECT pg_notify('axa_queue_done', {'axa_queue'}::regclass::oid::text || ' *')
        WHERE EXISTS (SELECT FROM changed)
        UNION ALL
        SELECT pg_notify('axa_queue_cancel', id::text) FROM changed WHERE was = 'running'
    )
    SELECT (SELECT count(*) FROM kept) AS cancelled, (SELECT count(*) FROM told) AS told""",
        )
    )
)
"""Cancel every member of a workflow not finished yet (queued, running, blocked, in
review), each exactly as `CANCEL` cancels one (its act kept, a running one's attempt
ended and its process told), in one statement, the rows locked in id order. The
release (`axa_queue_release_all`) runs once, for every member with dependents, after
the statement's own changes, so it finds its dependents in the workflow cancelled already (and releases a
dependent outside the workflow that says `run`). Returns how many it cancelled."""

WORKFLOWS_DROP = statement("""WITH doomed AS (
        SELECT id FROM {axa_queue_history}
        WHERE updated_at < ((COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s))
                            AT TIME ZONE 'UTC')::date::timestamp AT TIME ZONE 'UTC'
    ), deps_gone AS (
        DELETE FROM {axa_queue_deps} WHERE child IN (SELECT id FROM doomed)
    )
    DELETE FROM {axa_workflows} WHERE job IN (SELECT id FROM doomed)""")
"""Delete the dependencies (as the child) and workflow places of the jobs in the
history's days `HISTORY_DROP` is about to drop (the days before the one `older_than`
before `now`: `ATTEMPTS_DROP`'s bound), in its transaction, so a drop given up keeps
them; as `PURGE` does for the rows it deletes. Reads those days' partitions only
(pruning), the dependencies by `axa_queue_deps_child` and the places by
`axa_workflows_job`."""
