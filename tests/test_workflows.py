"""Workflows against a real PostgreSQL: jobs that wait for other jobs (`NewJob.after`,
`chain`, `group`, `chord`), released by the statement that ends their parents, each
failure policy, a parent in review holding its dependents, results flowing, bad
dependencies refused, the race of two parents ending at once, and a run fenced out
releasing nothing."""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg import sql as pgsql

from axa_queue import (
    JobState,
    NewJob,
    Queue,
    Workflow,
    cancel,
    cancel_workflow,
    chain,
    chord,
    current_job,
    enqueue_all_on,
    enqueue_on,
    group,
    jobs_on,
    retry,
    sql,
    workflow_on,
)
from axa_queue.context import fresh, running_job
from axa_queue.errors import OptionsError
from axa_queue.jobs.linked import linked_call, workflow_call
from axa_queue.schema.migrations.v22 import NOTE_CHUNK
from axa_queue.schema.migrations.v24 import DEPS_FILLFACTOR
from conftest import eventually, exchange_params, running, set_up
from test_big_reads import nodes
from test_fencing import exchange


@pytest.fixture
def admin(dsn: str) -> Any:
    """A sync autocommit connection to this test's schema, the tables made."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        set_up(conn)
        yield conn


def state(admin: psycopg.Connection[Any], job_id: UUID) -> tuple[str, str | None]:
    row = admin.execute("SELECT status, error FROM axa_queue WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row[0], row[1]


def claim(admin: psycopg.Connection[Any], job_id: UUID) -> None:
    """Claim `job_id` by hand, as a worker's claim leaves it (attempt 1)."""
    admin.execute(
        "UPDATE axa_queue SET status = 'running', attempts = attempts + 1, started_at = now() "
        "WHERE id = %s AND status = 'queued'",
        (job_id,),
    )


# --- shapes ---------------------------------------------------------------------------------


def test_a_chain_queues_its_first_job_and_blocks_the_rest_in_one_statement(admin) -> None:
    flow = enqueue_on(admin, chain(NewJob("A"), NewJob("B"), NewJob("C")))
    assert isinstance(flow, Workflow)
    a, b, c = flow.jobs
    assert [state(admin, j)[0] for j in (a, b, c)] == ["queued", "blocked", "blocked"]
    info = workflow_on(admin, flow.id)
    assert info is not None
    assert [m.parents for m in info.members] == [(), (a,), (b,)]
    assert [m.state for m in info.members] == [JobState.QUEUED, JobState.BLOCKED, JobState.BLOCKED]
    claim(admin, a)
    exchange(admin, completed=[a])
    assert state(admin, b)[0] == "queued" and state(admin, c)[0] == "blocked"


def test_blocked_jobs_are_listed_with_the_others_and_alone(admin) -> None:
    flow = enqueue_on(admin, chain(NewJob("A"), NewJob("B"), NewJob("C")))
    a, b, c = flow.jobs
    listed = jobs_on(admin)
    assert {job.id for job in listed} == {a, b, c}
    blocked = jobs_on(admin, state="blocked")
    assert {job.id for job in blocked} == {b, c}
    assert all(job.state is JobState.BLOCKED for job in blocked)
    assert [job.id for job in jobs_on(admin, state=JobState.BLOCKED, name="B")] == [b]
    assert jobs_on(admin, state="blocked", name="A") == []


def test_a_chord_waits_for_every_member_of_its_group(admin) -> None:
    flow = enqueue_on(admin, chord(group([NewJob("P"), NewJob("P"), NewJob("P")]), NewJob("CB")))
    *parts, callback = flow.jobs
    for one in parts:
        claim(admin, one)
    exchange(admin, completed=parts[:2])
    assert state(admin, callback)[0] == "blocked"
    exchange(admin, completed=parts[2:])
    assert state(admin, callback)[0] == "queued"


def test_nesting_a_group_in_a_chain_makes_the_next_step_wait_for_all_of_it(admin) -> None:
    flow = enqueue_on(
        admin,
        chain(
            NewJob("first"), group([NewJob("x"), chain(NewJob("y1"), NewJob("y2"))]), NewJob("last")
        ),
    )
    first, x, y1, y2, _last = flow.jobs
    info = workflow_on(admin, flow.id)
    assert info is not None
    assert [m.parents for m in info.members] == [(), (first,), (first,), (y1,), (x, y2)]


def test_a_job_after_jobs_already_completed_is_queued_at_once(admin) -> None:
    done = enqueue_on(admin, NewJob("A"))
    claim(admin, done)
    exchange(admin, completed=[done])
    later = enqueue_on(admin, NewJob("B", after=[done]))
    assert state(admin, later)[0] == "queued"
    running_one = enqueue_on(admin, NewJob("C"))
    waiting = enqueue_on(admin, NewJob("D", after=[done, running_one]))
    assert state(admin, waiting)[0] == "blocked"


def test_a_bad_dependency_is_refused_and_nothing_is_written(admin) -> None:
    missing = uuid4()
    with pytest.raises(psycopg.errors.ForeignKeyViolation) as refused:
        enqueue_on(admin, NewJob("B", {"secret": "s3cr3t"}, after=[missing]))
    assert str(missing) in str(refused.value) and "does not exist" in str(refused.value)
    assert "s3cr3t" not in str(refused.value)
    assert admin.execute("SELECT count(*) FROM axa_queue").fetchone() == (0,)
    assert admin.execute("SELECT count(*) FROM axa_queue_deps").fetchone() == (0,)
    failed = enqueue_on(admin, NewJob("A", max_attempts=1))
    admin.execute("UPDATE axa_queue SET status = 'failed' WHERE id = %s", (failed,))
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="which failed"):
        enqueue_on(admin, NewJob("B", after=[failed]))
    assert (
        state(admin, enqueue_on(admin, NewJob("B", after=[failed], on_parent_failure="run")))[0]
        == "queued"
    )


def explained_linked(admin: psycopg.Connection[Any], call: Any, plan: str) -> list[dict[str, Any]]:
    """The nodes of `EXPLAIN (ANALYZE)` of `call` (an `ENQUEUE_LINKED` call), prepared and
    run with a `plan` (custom or generic) plan and little memory for hashing (64 kB, so a
    hash the planner thinks too big is not made: the misestimate shows at small sizes)."""
    order: list[str] = []

    def number(found: re.Match[str]) -> str:
        if found.group(1) not in order:
            order.append(found.group(1))
        return f"${order.index(found.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)s", number, call.query).replace("%%", "%")
    admin.execute("SELECT set_config('plan_cache_mode', %s, false)", (f"force_{plan}_plan",))
    admin.execute("SET work_mem = '64kB'")
    admin.execute("SET hash_mem_multiplier = 1")
    admin.execute(pgsql.SQL("PREPARE linked AS {}").format(pgsql.SQL(text)))  # type: ignore[arg-type]
    args = pgsql.SQL(", ").join(pgsql.Literal(call.params[n]) for n in order)
    row = admin.execute(
        pgsql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE linked({})").format(args)
    ).fetchone()
    admin.execute("DEALLOCATE linked")
    assert row is not None
    return list(nodes(row[0][0]["Plan"]))


@pytest.mark.parametrize("plan", ["custom", "generic"])
def test_a_big_chords_parents_are_found_in_its_call_by_hash_not_by_reading_every_id_for_each(
    admin, plan
) -> None:
    nodes = explained_linked(
        admin, workflow_call(chord(group([NewJob("A") for _ in range(2_000)]), NewJob("B"))), plan
    )
    # Each of the 2,000 dependencies is checked once: no part of the plan runs once per
    # dependency (a look for each parent among the call's 2,001 ids was 4 million
    # comparisons here, 900 million for a chord of 30,000).
    assert [(n["Node Type"], n["Actual Loops"]) for n in nodes if n["Actual Loops"] > 1] == []
    (refused,) = [n for n in nodes if n.get("Subplan Name") == "CTE refused"]
    # And whether a parent was queued by the call is read from the dependency's own row,
    # not looked for in the call's ids (`<> ALL`, a sub-plan).
    assert refused["Rows Removed by Filter"] == 2_000
    assert "ALL" not in refused["Filter"] and "SubPlan" not in refused["Filter"]
    assert admin.execute("SELECT count(*) FROM axa_queue_deps").fetchone() == (2_000,)


@pytest.mark.parametrize("plan", ["custom", "generic"])
def test_jobs_each_after_a_job_of_their_own_are_queued_without_reading_the_dependencies_per_job(
    admin, plan
) -> None:
    parents = enqueue_all_on(admin, [NewJob("A") for _ in range(2_000)])
    nodes = explained_linked(admin, linked_call([NewJob("B", after=[p]) for p in parents]), plan)
    # Whether each job waits is read from a hash of the dependencies not done, made once;
    # the planner's guess of their number (a join with the parents found, many times too
    # big) never makes it read them all again for each job (20,000 such jobs took 74 s).
    assert [(n["Node Type"], n["Actual Loops"]) for n in nodes if n["Actual Loops"] > 1] == []
    assert admin.execute(
        "SELECT status, count(*) FROM axa_queue GROUP BY status ORDER BY status"
    ).fetchall() == [("blocked", 2_000), ("queued", 2_000)]


def test_a_dependency_is_checked_before_anything_is_sent() -> None:
    with pytest.raises(OptionsError, match="list"):
        NewJob("B", after=str(uuid4()))  # type: ignore[arg-type]
    one = uuid4()
    with pytest.raises(OptionsError, match="twice"):
        NewJob("B", after=[one, one])
    with pytest.raises(OptionsError, match="on_parent_failure"):
        NewJob("B", after=[one], on_parent_failure="ignore")
    with pytest.raises(OptionsError, match="unique_key"):
        NewJob("B", after=[one], unique_key="k")
    with pytest.raises(OptionsError):
        group([])


def test_a_batch_mixing_unique_jobs_with_dependent_ones_or_given_a_workflow_is_refused(
    admin, dsn
) -> None:
    parent = enqueue_on(admin, NewJob("A"))
    mixed = [NewJob("A", unique_key="u1"), NewJob("B", after=[parent])]
    with pytest.raises(OptionsError, match="enqueue_all of their own"):
        enqueue_all_on(admin, mixed)
    with pytest.raises(OptionsError, match="with enqueue"):
        enqueue_all_on(admin, [NewJob("A"), chain(NewJob("B"))])  # type: ignore[list-item]
    with Queue(dsn).sync() as queue, pytest.raises(OptionsError, match="place 0 is a workflow"):
        queue.enqueue_all([group([NewJob("B")])])  # type: ignore[list-item]
    assert admin.execute("SELECT count(*) FROM axa_queue").fetchone() == (1,)


def test_the_state_machine_refuses_entering_blocked_or_leaving_it_for_running(admin) -> None:
    job = enqueue_on(admin, NewJob("A"))
    with pytest.raises(psycopg.errors.CheckViolation):
        admin.execute("UPDATE axa_queue SET status = 'blocked' WHERE id = %s", (job,))
    flow = enqueue_on(admin, chain(NewJob("A"), NewJob("B")))
    with pytest.raises(psycopg.errors.CheckViolation):
        admin.execute(
            "UPDATE axa_queue SET status = 'running', started_at = now() WHERE id = %s",
            (flow.jobs[1],),
        )


# --- failure policies -------------------------------------------------------------------


def fail(admin: psycopg.Connection[Any], job_id: UUID) -> None:
    """End `job_id`'s run failed for good, through the exchange."""
    claim(admin, job_id)
    admin.execute(
        sql.EXCHANGE,
        exchange_params(
            endings=f'[{{"id": "{job_id}", "attempts": 1, "status": "failed", "error": "boom"}}]'
        ),
    ).fetchall()


def test_a_parent_that_fails_cancels_its_dependents_transitively_naming_it(admin) -> None:
    flow = enqueue_on(admin, chain(NewJob("A"), NewJob("B"), NewJob("C")))
    a, b, c = flow.jobs
    fail(admin, a)
    assert state(admin, a)[0] == "failed"
    assert state(admin, b) == ("cancelled", f"parent {a} failed")
    assert state(admin, c) == ("cancelled", f"parent {b} was cancelled")


def test_a_dependent_that_says_run_runs_when_its_parent_fails(admin) -> None:
    flow = enqueue_on(admin, chain(NewJob("A"), NewJob("B", on_parent_failure="run"), NewJob("C")))
    a, b, c = flow.jobs
    fail(admin, a)
    assert state(admin, b)[0] == "queued"
    assert state(admin, c)[0] == "blocked"


def test_cancelling_a_parent_cancels_its_dependents_in_the_same_statement(admin) -> None:
    flow = enqueue_on(admin, chain(NewJob("A"), NewJob("B")))
    a, b = flow.jobs
    assert cancel(admin, a, "ops:alice", "not_needed")
    assert state(admin, b) == ("cancelled", f"parent {a} was cancelled")


def test_a_parent_in_review_holds_its_dependents_until_a_person_acts(admin) -> None:
    flow = enqueue_on(admin, chain(NewJob("A"), NewJob("B")))
    a, b = flow.jobs
    claim(admin, a)
    admin.execute("UPDATE axa_queue SET status = 'needs_review' WHERE id = %s", (a,))
    assert state(admin, b)[0] == "blocked"
    assert retry(admin, a, "ops:alice", "checked")  # released: runs again, B still waits
    assert state(admin, b)[0] == "blocked"
    claim(admin, a)
    exchange(admin, completed=[a], attempts=2)
    assert state(admin, b)[0] == "queued"
    other = enqueue_on(admin, chain(NewJob("A"), NewJob("B")))
    claim(admin, other.jobs[0])
    admin.execute("UPDATE axa_queue SET status = 'needs_review' WHERE id = %s", (other.jobs[0],))
    assert cancel(admin, other.jobs[0], "ops:alice", "give_up")
    assert state(admin, other.jobs[1])[0] == "cancelled"


def test_cancel_workflow_cancels_every_unfinished_member_with_one_act_each(admin) -> None:
    flow = enqueue_on(admin, chord(group([NewJob("P"), NewJob("P")]), NewJob("CB")))
    p1, p2, cb = flow.jobs
    claim(admin, p1)
    exchange(admin, completed=[p1])
    assert cancel_workflow(admin, flow.id, "ops:alice", "stop") == 2
    assert [state(admin, j)[0] for j in flow.jobs] == ["completed", "cancelled", "cancelled"]
    acts = admin.execute("SELECT job_id FROM axa_job_acts WHERE act = 'cancelled'").fetchall()
    assert sorted(r[0] for r in acts) == sorted([p2, cb])
    info = workflow_on(admin, flow.id)
    assert info is not None and info.finished


# --- fencing and races ------------------------------------------------------------------


def test_a_run_fenced_out_releases_nothing(admin) -> None:
    flow = enqueue_on(admin, chain(NewJob("A"), NewJob("B")))
    a, b = flow.jobs
    claim(admin, a)
    # Stale recovery queued it again and another worker claimed it: attempt 2 now.
    admin.execute("UPDATE axa_queue SET status = 'queued', started_at = NULL WHERE id = %s", (a,))
    claim(admin, a)
    assert exchange(admin, completed=[a], attempts=1) == []  # the old run, late: refused
    assert state(admin, a)[0] == "running" and state(admin, b)[0] == "blocked"
    exchange(admin, completed=[a], attempts=2)
    assert state(admin, b)[0] == "queued"


def test_two_parents_ending_at_once_in_two_transactions_release_their_child_once(
    admin, dsn
) -> None:
    flow = enqueue_on(admin, chord(group([NewJob("P"), NewJob("P")]), NewJob("CB")))
    p1, p2, cb = flow.jobs
    claim(admin, p1)
    claim(admin, p2)
    first = psycopg.connect(dsn)
    second = psycopg.connect(dsn)
    try:
        exchange(first, completed=[p1])  # not committed: holds p2's dependency share-locked
        done = threading.Event()
        errors: list[BaseException] = []

        def end_second() -> None:
            try:
                exchange(second, completed=[p2])
                second.commit()
            except BaseException as error:
                errors.append(error)
            finally:
                done.set()

        thread = threading.Thread(target=end_second)
        thread.start()

        # The second ending waits for the first to commit (the dependency it must mark).
        async def waits() -> bool:
            row = admin.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE NOT l.granted AND a.pid = %s",
                (second.info.backend_pid,),
            ).fetchone()
            return row is not None and row[0] > 0

        asyncio.run(eventually(waits))
        assert not done.is_set()
        assert state(admin, cb)[0] == "blocked"
        first.commit()
        thread.join(30)
        assert done.is_set() and not errors
        assert state(admin, cb)[0] == "queued"
    finally:
        first.close()
        second.close()


def test_one_statement_ending_every_parent_of_two_children_releases_both(admin) -> None:
    # The first ending's look share-locks the second's dependency (its own transaction's
    # lock), the second marks it and, its look finding none left, releases both children.
    parents = [enqueue_on(admin, NewJob("P")) for _ in range(3)]
    first = enqueue_on(admin, NewJob("C", after=parents))
    second = enqueue_on(admin, NewJob("C", after=list(reversed(parents))))
    for parent in parents:
        claim(admin, parent)
    exchange(admin, completed=parents[:2])
    assert state(admin, first)[0] == "blocked" and state(admin, second)[0] == "blocked"
    exchange(admin, completed=parents[2:])
    assert state(admin, first)[0] == "queued" and state(admin, second)[0] == "queued"
    parents = [enqueue_on(admin, NewJob("P")) for _ in range(3)]
    both = [enqueue_on(admin, NewJob("C", after=parents)) for _ in range(2)]
    for parent in parents:
        claim(admin, parent)
    exchange(admin, completed=parents)
    assert [state(admin, child)[0] for child in both] == ["queued", "queued"]


def test_one_statement_ending_500_parents_releases_each_of_their_500_dependents(admin) -> None:
    parents = enqueue_all_on(admin, [NewJob("P") for _ in range(500)])
    children = enqueue_all_on(admin, [NewJob("C", after=[p]) for p in parents])
    admin.execute(
        "UPDATE axa_queue SET status = 'running', attempts = 1, started_at = now() "
        "WHERE id = ANY(%s)",
        (parents,),
    )
    # One exchange records all 500 endings: their ids are noted in chunks of 64 (each
    # ending copies at most a chunk, never the whole list) and read back whole.
    exchange(admin, completed=parents)
    assert admin.execute(
        "SELECT status, count(*) FROM axa_queue WHERE id = ANY(%s) GROUP BY status",
        (children,),
    ).fetchall() == [("queued", 500)]


def test_the_endings_of_one_statement_are_noted_in_chunks_and_read_back_whole(admin, dsn) -> None:
    with psycopg.connect(dsn) as conn:
        parents = enqueue_all_on(conn, [NewJob("P") for _ in range(200)])
        enqueue_all_on(conn, [NewJob("C", after=[p]) for p in parents])
        # The release left out, to look at what the row trigger noted: 200 endings in a
        # list of at most 64 ids and chunks of 64 set aside (each ending copies at most a
        # chunk; one list of every id was copied whole by each ending).
        conn.execute("ALTER TABLE axa_queue DISABLE TRIGGER axa_queue_release_all")
        conn.execute("UPDATE axa_queue SET status = 'completed' WHERE id = ANY(%s)", (parents,))
        oid = conn.execute("SELECT 'axa_queue'::regclass::oid").fetchone()[0]  # type: ignore[index]
        setting = f"axa_queue.completed_{oid}"
        chunks = int(
            conn.execute("SELECT current_setting(%s)", (setting + "_chunks",)).fetchone()[0]
        )  # type: ignore[index]
        sizes = [
            len(
                conn.execute("SELECT current_setting(%s)", (f"{setting}_{k}",))
                .fetchone()[0]
                .split(",")
            )
            - 1  # type: ignore[index]
            for k in range(1, chunks + 1)
        ]
        assert chunks == 3 and sizes == [NOTE_CHUNK] * 3
        read = conn.execute("SELECT axa_queue_noted(%s)", (setting,)).fetchone()
        assert read is not None and sorted(read[0]) == sorted(parents)
        assert conn.execute("SELECT axa_queue_noted(%s)", (setting,)).fetchone() == ([],)
        conn.rollback()


def test_one_statement_cancelling_300_parents_cancels_each_dependent_naming_its_parent(
    admin,
) -> None:
    parents = enqueue_all_on(admin, [NewJob("P") for _ in range(300)])
    children = enqueue_all_on(admin, [NewJob("C", after=[p]) for p in parents])
    admin.execute("UPDATE axa_queue SET status = 'cancelled' WHERE id = ANY(%s)", (parents,))
    named = dict(
        admin.execute(
            "SELECT id, error FROM axa_queue WHERE id = ANY(%s) AND status = 'cancelled'",
            (children,),
        ).fetchall()
    )
    assert named == {c: f"parent {p} was cancelled" for p, c in zip(parents, children, strict=True)}


def test_cancelling_the_head_of_a_chain_of_2000_cancels_every_step_naming_the_one_before(
    admin,
) -> None:
    flow = enqueue_on(admin, chain(*(NewJob("step") for _ in range(2_000))))
    admin.execute("UPDATE axa_queue SET status = 'cancelled' WHERE id = %s", (flow.jobs[0],))
    # Each level of the recursive cancel looks its dependents up by the primary key (a
    # hash join read every dependency for each of the 2,000 levels: 16 s for 10,000).
    rows = dict(
        admin.execute("SELECT id, error FROM axa_queue WHERE id = ANY(%s)", (list(flow.jobs[1:]),))
    )
    assert rows == {
        b: f"parent {a} was cancelled" for a, b in zip(flow.jobs[:-1], flow.jobs[1:], strict=True)
    }
    assert admin.execute(
        "SELECT count(*) FROM axa_queue WHERE status = 'cancelled'"
    ).fetchone() == (2_000,)


@pytest.mark.parametrize("order", ["given", "reversed"])
def test_a_chords_callback_is_released_once_its_last_parent_ends_in_either_order(
    admin, order: str
) -> None:
    flow = enqueue_on(admin, chord(group([NewJob("P") for _ in range(3_000)]), NewJob("CB")))
    *parents, callback = flow.jobs
    admin.execute(
        "UPDATE axa_queue SET status = 'running', attempts = 1, started_at = now() "
        "WHERE id = ANY(%s)",
        (parents,),
    )
    ending = parents if order == "given" else parents[::-1]
    for start in range(0, len(ending), 100):
        assert state(admin, callback)[0] == "blocked"
        exchange(admin, completed=ending[start : start + 100])
    assert state(admin, callback)[0] == "queued"


def test_the_last_parent_ending_releases_even_when_the_other_committed_meanwhile(
    admin, dsn
) -> None:
    flow = enqueue_on(admin, chord(group([NewJob("P"), NewJob("P")]), NewJob("CB")))
    p1, p2, cb = flow.jobs
    claim(admin, p1)
    claim(admin, p2)
    with psycopg.connect(dsn) as first, psycopg.connect(dsn) as second:
        exchange(first, completed=[p1])
        first.commit()
        exchange(second, completed=[p2])
        assert state(admin, cb)[0] == "blocked"  # not committed yet
        second.commit()
    assert state(admin, cb)[0] == "queued"


def test_two_statements_each_ending_two_parents_of_one_child_never_deadlock(admin, dsn) -> None:
    # Statement `one` ends parents i and j + 65 of a chord's callback, `two` ends j and
    # i + 65 (i < j). Released per row, `one`'s look after i share-locked the dependency
    # of i + 65 (the first undone more than 64 places on), which `two` marks second, and
    # `two`'s after j that of j + 65, which `one` marks second: each waited for the
    # other and PostgreSQL aborted one. A third transaction share-locks both second
    # dependencies, so each statement stops at that marking; then it lets go.
    flow = enqueue_on(admin, chord(group([NewJob("P") for _ in range(100)]), NewJob("CB")))
    parents, cb = list(flow.jobs[:-1]), flow.jobs[-1]
    for parent in parents:
        claim(admin, parent)
    # Each statement's two endings in one order, by id and as sent: i, j + 65 and j, i + 65.
    i, j = next(
        (i, j)
        for i in range(30)
        for j in range(i + 1, 30)
        if parents[i] < parents[j + 65] and parents[j] < parents[i + 65]
    )
    holder = psycopg.connect(dsn)
    statements = {name: psycopg.connect(dsn) for name in ("one", "two")}
    errors: list[BaseException] = []

    def end(name: str, first: UUID, second: UUID) -> None:
        try:
            exchange(statements[name], completed=[first, second])
            statements[name].commit()
        except BaseException as error:
            errors.append(error)

    def waiting(name: str) -> bool:
        row = admin.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid = %s",
            (statements[name].info.backend_pid,),
        ).fetchone()
        return row is not None and row[0] > 0

    try:
        holder.execute(
            "SELECT FROM axa_queue_deps WHERE child = %s AND parent = ANY(%s) FOR SHARE",
            (cb, [parents[i + 65], parents[j + 65]]),
        )
        threads = [
            threading.Thread(target=end, args=("one", parents[i], parents[j + 65])),
            threading.Thread(target=end, args=("two", parents[j], parents[i + 65])),
        ]
        for thread in threads:
            thread.start()
        asyncio.run(eventually(lambda: waiting("one") and waiting("two")))
        holder.commit()
        for thread in threads:
            thread.join(30)
        assert not errors
        assert state(admin, cb)[0] == "blocked"
        exchange(admin, completed=[p for p in parents if state(admin, p)[0] == "running"])
        assert state(admin, cb)[0] == "queued"
    finally:
        holder.close()
        for conn in statements.values():
            conn.close()


def test_an_ending_noted_by_a_statement_that_failed_is_never_released_later(admin, dsn) -> None:
    # The statement ends p1 (noted for the release at its end), then fails before its
    # end; rolled back to a savepoint, the transaction goes on and ends p2. The note
    # went with the failed statement: p2's ending must not take p1 for completed.
    flow = enqueue_on(admin, chord(group([NewJob("P"), NewJob("P")]), NewJob("CB")))
    p1, p2, cb = flow.jobs
    claim(admin, p1)
    claim(admin, p2)
    with psycopg.connect(dsn) as conn:
        conn.execute("SAVEPOINT before")
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute(
                "WITH ended AS (UPDATE axa_queue SET status = 'completed' WHERE id = %s "
                "RETURNING id) SELECT 1 / 0 FROM ended",
                (p1,),
            )
        conn.execute("ROLLBACK TO SAVEPOINT before")
        exchange(conn, completed=[p2])
        conn.commit()
    assert state(admin, p1)[0] == "running"
    assert state(admin, cb)[0] == "blocked"
    exchange(admin, completed=[p1])
    assert state(admin, cb)[0] == "queued"


# --- with a worker ------------------------------------------------------------------------


async def test_a_chord_runs_its_callback_once_with_its_groups_results_in_order(
    make_queue, admin
) -> None:
    queue = await make_queue()
    seen: list[Any] = []

    async def part(args: dict[str, int]) -> int:
        return args["n"] * 10

    async def callback(args: dict[str, Any]) -> int:
        results = await current_job().parent_results()
        seen.append(results)
        return sum(results)

    queue.handle("part", part)
    queue.handle("sum", callback)
    flow = await queue.enqueue(
        chord(group([NewJob("part", {"n": n}) for n in range(5)]), NewJob("sum"))
    )
    async with running(queue):
        await eventually(lambda: state(admin, flow.jobs[-1])[0] == "completed")
    assert seen == [[0, 10, 20, 30, 40]]
    assert await queue.result(flow.jobs[-1]) == 100


async def test_a_chain_runs_in_order_each_step_reading_the_one_before(make_queue, admin) -> None:
    queue = await make_queue()
    order: list[str] = []

    async def step(args: dict[str, str]) -> str:
        before = await current_job().parent_results()
        order.append(args["name"])
        return "".join(before) + args["name"]

    queue.handle("step", step)
    flow = await queue.enqueue(chain(*(NewJob("step", {"name": n}) for n in "abc")))
    async with running(queue):
        await eventually(lambda: state(admin, flow.jobs[-1])[0] == "completed")
    assert order == ["a", "b", "c"]
    assert await queue.result(flow.jobs[-1]) == "abc"


async def test_a_sync_callback_reads_its_parents_results_with_no_connection_of_its_own(
    make_queue, admin
) -> None:
    queue = await make_queue()
    seen: list[Any] = []

    def part(args: dict[str, int]) -> int:
        return args["n"] + 1

    def callback(args: dict[str, Any]) -> None:
        seen.append(current_job().parent_results())

    queue.handle("part", part)
    queue.handle("gather", callback)
    flow = await queue.enqueue(
        chord(group([NewJob("part", {"n": n}) for n in range(3)]), NewJob("gather"))
    )
    async with running(queue):
        await eventually(lambda: state(admin, flow.jobs[-1])[0] == "completed")
    assert seen == [[1, 2, 3]]


async def test_a_drain_gives_a_callback_its_groups_results_and_the_context_never_shows_them(
    make_queue,
) -> None:
    queue = await make_queue()
    seen: list[Any] = []
    shown: list[str] = []

    async def part(args: dict[str, int]) -> str:
        return f"secret-{args['n']}"

    async def callback(args: dict[str, Any]) -> None:
        job = current_job()
        seen.append(await job.parent_results())
        shown.append(repr(job))

    queue.handle("part", part)
    queue.handle("gather", callback)
    await queue.enqueue(
        chord(group([NewJob("part", {"n": n}) for n in range(3)]), NewJob("gather"))
    )
    result = await queue.drain()
    assert result.completed == 4
    assert seen == [["secret-0", "secret-1", "secret-2"]]
    assert "secret" not in shown[0]


async def test_a_job_without_dependencies_and_a_run_without_a_row_read_no_parent_results(
    make_queue,
) -> None:
    queue = await make_queue()
    seen: list[Any] = []

    async def alone(args: dict[str, Any]) -> None:
        seen.append(await current_job().parent_results())

    queue.handle("alone", alone)
    await queue.enqueue(NewJob("alone"))
    await queue.drain()
    assert seen == [[]]
    with running_job(fresh("alone", 1)) as job:
        assert await job.parent_results() == []
    assert await asyncio.to_thread(fresh("alone", 1).parent_results) == []


async def test_a_drain_runs_a_nested_workflow_in_dependency_order_and_assert_enqueued_sees_it_blocked(
    make_queue,
) -> None:
    from axa_queue.testing import assert_enqueued, refute_enqueued

    queue = await make_queue()
    order: list[str] = []

    async def step(args: dict[str, str]) -> str:
        order.append(args["name"])
        return args["name"]

    queue.handle("step", step)
    flow = await queue.enqueue(
        chain(
            NewJob("step", {"name": "first"}),
            chord(
                group([NewJob("step", {"name": f"part{n}"}) for n in range(3)]),
                NewJob("step", {"name": "gather"}),
            ),
            NewJob("step", {"name": "last"}),
        )
    )
    await assert_enqueued(queue, "step", args={"name": "gather"}, state="blocked")
    await assert_enqueued(queue, "step", args={"name": "last"}, state="blocked")
    await refute_enqueued(queue, "step", args={"name": "first"}, state="blocked")
    assert (await queue.drain()).completed == 6
    assert order[0] == "first" and sorted(order[1:4]) == ["part0", "part1", "part2"]
    assert order[4:] == ["gather", "last"]
    await refute_enqueued(queue, "step", state="blocked")
    assert await queue.result(flow.jobs[-1]) == "last"


# --- what a plain job pays, and the other ways in -----------------------------------------


def test_a_chords_dependencies_lie_in_its_order_and_an_exchange_marks_them_in_place(
    admin,
) -> None:
    flow = enqueue_on(admin, chord(group([NewJob("P") for _ in range(400)]), NewJob("CB")))
    *parents, _ = flow.jobs
    # Inserted in the order given (the order the parents are claimed in), not the join's.
    laid = admin.execute("SELECT position FROM axa_queue_deps ORDER BY ctid").fetchall()
    assert [row[0] for row in laid] == list(range(400))
    assert (
        f"fillfactor={DEPS_FILLFACTOR}"
        in admin.execute(
            "SELECT reloptions FROM pg_class WHERE oid = 'axa_queue_deps'::regclass"
        ).fetchone()[0]
    )  # type: ignore[index]
    admin.execute(
        "UPDATE axa_queue SET status = 'running', attempts = 1, started_at = now() "
        "WHERE id = ANY(%s)",
        (parents,),
    )

    def updates() -> tuple[int, int]:
        admin.execute("SELECT pg_stat_force_next_flush()")  # this session's counts, sent
        row = admin.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE relid = 'axa_queue_deps'::regclass"
        ).fetchone()
        assert row is not None
        return row[0], row[1]

    before = updates()
    # One exchange ends 200 parents in their order: their dependencies fill whole pages,
    # and each one's `done` is written beside it (a HOT update: no index entry).
    exchange(admin, completed=parents[:200])
    after = updates()
    assert (after[0] - before[0], after[1] - before[1]) == (200, 200)


def test_a_plain_jobs_ending_never_calls_the_release_trigger(admin) -> None:
    plain = enqueue_on(admin, NewJob("A"))
    flow = enqueue_on(admin, chain(NewJob("A"), NewJob("B")))
    claim(admin, plain)
    claim(admin, flow.jobs[0])

    def triggers(job_id: UUID) -> list[Any]:
        row = admin.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + sql.EXCHANGE,
            exchange_params(completed="{" + str(job_id) + "}", completed_attempts="{1}"),
        ).fetchone()
        assert row is not None
        return [t["Trigger Name"] for t in row[0][0].get("Triggers", [])]

    assert triggers(plain) == []
    assert triggers(flow.jobs[0]) == ["axa_queue_release", "axa_queue_release_all"]
    assert state(admin, flow.jobs[1])[0] == "queued"


def test_jobs_given_after_go_in_one_batch_and_a_sync_queue_takes_a_workflow(dsn, admin) -> None:
    from axa_queue import SyncQueue, enqueue_all_on

    first = enqueue_on(admin, NewJob("A"))
    ids = enqueue_all_on(admin, [NewJob("B", after=[first]), NewJob("C")])
    assert [state(admin, j)[0] for j in ids] == ["blocked", "queued"]
    with SyncQueue(dsn) as queue:
        flow = queue.enqueue(chain(NewJob("A"), NewJob("B")))
    assert [state(admin, j)[0] for j in flow.jobs] == ["queued", "blocked"]


def test_the_crate_never_claims_a_blocked_job_and_its_ending_releases_one(admin) -> None:
    import seed_crate as crate
    from test_compat import crate_claim

    flow = enqueue_on(admin, chain(NewJob("first"), NewJob("second")))
    first, second = flow.jobs
    assert crate_claim(admin, "second") is None  # blocked: the crate claims queued only
    claimed = crate_claim(admin, "first")
    assert claimed is not None and claimed[0] == first
    admin.execute(crate.FINISH, crate.params(first, claimed[3], "completed", None))
    assert state(admin, second)[0] == "queued"
    assert crate_claim(admin, "second") is not None


async def test_dropping_the_historys_days_deletes_their_jobs_dependencies_and_workflow_places(
    make_queue, admin
) -> None:
    from datetime import timedelta

    queue = await make_queue()

    async def step(args: dict[str, Any]) -> None:
        return None

    queue.handle("step", step)
    old = await queue.enqueue(chain(NewJob("step"), NewJob("step")))
    kept = await queue.enqueue(chain(NewJob("step"), NewJob("step")))
    assert (await queue.drain()).completed == 4

    def rows(flow: Workflow) -> tuple[int, int]:
        deps = admin.execute(
            "SELECT count(*) FROM axa_queue_deps WHERE child = ANY(%s)", (list(flow.jobs),)
        ).fetchone()[0]
        places = admin.execute(
            "SELECT count(*) FROM axa_workflows WHERE workflow = %s", (flow.id,)
        ).fetchone()[0]
        return deps, places

    admin.execute(
        "UPDATE axa_queue SET updated_at = now() - interval '3 days' WHERE id = ANY(%s)",
        (list(old.jobs),),
    )
    assert (await queue.move_history(timedelta(0))).moved == 4
    assert rows(old) == (1, 2) and rows(kept) == (1, 2)

    # A drop given up (its lock not had) keeps them with their jobs.
    import contextlib

    with psycopg.connect(admin.info.dsn) as holder, holder.transaction():
        holder.execute("LOCK TABLE axa_queue_history IN ACCESS SHARE MODE")
        with contextlib.suppress(psycopg.errors.LockNotAvailable):
            await queue.purge(older_than=timedelta(days=1))
        assert rows(old) == (1, 2)

    await queue.purge(older_than=timedelta(days=1))
    assert rows(old) == (0, 0)
    assert rows(kept) == (1, 2)  # its day is kept
