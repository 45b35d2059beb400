"""A person's acts: cancel, retry and release, each kept in `axa_job_acts` in the
caller's transaction, as codes, in a table that is only ever added to."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg import sql as pgsql

import seed_crate as crate
from axa_queue import (
    MAX_REASON_CHARS,
    ActKind,
    ActResult,
    JobState,
    NotACodeError,
    acts_on,
    cancel,
    retry,
)
from axa_queue.acts import check_code
from conftest import acting_role, eventually, lock_waits, running, set_up, status_of


def set_state(admin: psycopg.Connection[Any], job_id: UUID, state: str, attempts: int) -> None:
    """Put a job in `state` by hand, as a run would have left it."""
    admin.execute(
        "UPDATE axa_queue SET status = %s, attempts = %s, started_at = "
        "CASE WHEN %s = 'queued' THEN NULL ELSE now() END, "
        "error = CASE WHEN %s IN ('failed', 'needs_review') THEN 'went wrong' END "
        "WHERE id = %s",
        (state, attempts, state, state, job_id),
    )


def act_rows(admin: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return admin.execute(
        "SELECT job_id, job_name, act, attempts, by, reason FROM axa_job_acts ORDER BY id"
    ).fetchall()


def job_row(admin: psycopg.Connection[Any], job_id: UUID) -> tuple[Any, ...] | None:
    return admin.execute("SELECT * FROM axa_queue WHERE id = %s", (job_id,)).fetchone()


# --- cancel ----------------------------------------------------------------------------


async def test_a_cancel_that_waited_for_a_runs_ending_says_how_the_job_ended(
    make_queue, admin, dsn
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Report", {"id": 7})
    set_state(admin, job_id, "running", 1)
    with psycopg.connect(dsn) as ending:  # a run's ending, holding the row until it commits
        ending.execute("UPDATE axa_queue SET status = 'completed' WHERE id = %s", (job_id,))
        async with queue.connection() as conn:
            waiting = asyncio.ensure_future(cancel(conn, job_id, "ops:alice", "INC-3"))
            await eventually(lambda: lock_waits(admin, "WITH target AS") == 1)
            ending.commit()
            result = await waiting
    assert result == ActResult(applied=False, kind=None, found=JobState.COMPLETED)
    assert act_rows(admin) == []


async def test_cancelling_a_queued_job_cancels_it_and_keeps_the_act(make_queue, admin) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Report", {"id": 7})
    async with queue.connection() as conn:
        result = await cancel(conn, job_id, "ops:alice", "customer_asked")
    assert result == ActResult(applied=True, kind=ActKind.CANCELLED, found=JobState.QUEUED)
    assert bool(result) is True
    assert status_of(admin, job_id) == ("cancelled", None, 0)
    [act] = await queue.acts(job_id)
    assert (act.job_id, act.job_name, act.kind, act.attempts, act.by, act.reason) == (
        job_id,
        "Report",
        ActKind.CANCELLED,
        0,
        "ops:alice",
        "customer_asked",
    )
    assert act.at.tzinfo is not None


async def test_a_cancelled_job_never_runs(make_queue, admin) -> None:
    queue = await make_queue()
    ran: list[Any] = []
    queue.handle("Report", ran.append)
    doomed = await queue.enqueue("Report", {"n": 1})
    async with queue.connection() as conn:
        assert await cancel(conn, doomed, "ops:alice", "duplicate")
    sentinel = await queue.enqueue("Report", {"n": 2})
    async with running(queue):
        await eventually(lambda: status_of(admin, sentinel)[0] == "completed")
    assert ran == [{"n": 2}]
    assert status_of(admin, doomed)[0] == "cancelled"


@pytest.mark.parametrize(
    ("state", "attempts"),
    [("completed", 1), ("failed", 1), ("cancelled", 0)],
)
async def test_cancelling_a_finished_job_changes_nothing_and_writes_nothing(
    make_queue, admin, state: str, attempts: int
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Report", {})
    set_state(admin, job_id, state, attempts)
    before = job_row(admin, job_id)
    async with queue.connection() as conn:
        result = await cancel(conn, job_id, "ops:alice", "customer_asked")
    assert bool(result) is False
    assert result == ActResult(applied=False, kind=None, found=JobState(state))
    assert job_row(admin, job_id) == before
    assert act_rows(admin) == []


async def test_an_act_on_a_job_that_does_not_exist_finds_nothing_and_writes_nothing(
    make_queue, admin
) -> None:
    queue = await make_queue()
    async with queue.connection() as conn:
        cancelled = await cancel(conn, uuid4(), "ops:alice", "customer_asked")
        retried = await retry(conn, uuid4(), "ops:alice", "fixed")
    for result in (cancelled, retried):
        assert result == ActResult(applied=False, kind=None, found=None)
        assert not result
    assert act_rows(admin) == []


async def test_a_job_being_cancelled_in_an_open_transaction_is_not_claimed(
    make_queue, admin, dsn
) -> None:
    queue = await make_queue(workers=1)
    ran: list[Any] = []
    queue.handle("Report", ran.append)
    job_id = await queue.enqueue("Report", {"n": 1})
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        assert await cancel(conn, job_id, "ops:alice", "customer_asked")
        # The row is locked until the caller commits: a worker skips it and takes the next.
        sentinel = await queue.enqueue("Report", {"n": 2})
        async with running(queue):
            await eventually(lambda: status_of(admin, sentinel)[0] == "completed")
            assert status_of(admin, job_id)[0] == "queued"
            await conn.commit()
    assert ran == [{"n": 2}]
    assert status_of(admin, job_id)[0] == "cancelled"


# --- retry and release -----------------------------------------------------------------


async def test_retrying_a_failed_job_queues_it_for_one_more_try_and_it_runs(
    make_queue, admin
) -> None:
    queue = await make_queue()
    calls: list[Any] = []
    fail = True

    @queue.handler("Flaky")
    async def flaky(args: Any) -> None:
        calls.append(args)
        if fail:
            raise RuntimeError("upstream down")

    job_id = await queue.enqueue("Flaky", {"id": 3})
    async with running(queue):
        await eventually(lambda: status_of(admin, job_id)[0] == "failed")
        assert status_of(admin, job_id) == ("failed", "RuntimeError: upstream down", 1)
        fail = False
        async with queue.connection() as conn:
            result = await retry(conn, job_id, "ops:bob", "upstream_fixed")
        assert result == ActResult(applied=True, kind=ActKind.RETRIED, found=JobState.FAILED)
        await eventually(lambda: status_of(admin, job_id)[0] == "completed")
    assert calls == [{"id": 3}, {"id": 3}]
    info = await queue.job(job_id)
    assert info is not None
    assert (info.state, info.attempt, info.max_attempts, info.error) == (
        JobState.COMPLETED,
        2,
        2,
        None,
    )
    [act] = await queue.acts(job_id)
    assert (act.kind, act.attempts, act.by, act.reason, act.job_name) == (
        ActKind.RETRIED,
        1,
        "ops:bob",
        "upstream_fixed",
        "Flaky",
    )


async def test_retrying_sets_max_attempts_to_one_more_than_the_runs_so_far(
    make_queue, admin
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Report", {}, max_attempts=5)
    set_state(admin, job_id, "failed", 5)
    async with queue.connection() as conn:
        assert await retry(conn, job_id, "ops:bob", "try_again")
    row = admin.execute(
        "SELECT status, attempts, max_attempts, started_at, error, run_at <= now() "
        "FROM axa_queue WHERE id = %s",
        (job_id,),
    ).fetchone()
    # Its last error stays until it next runs; it is due now.
    assert row == ("queued", 5, 6, None, "went wrong", True)


async def test_releasing_a_job_from_review_queues_it_again_and_it_runs(make_queue, admin) -> None:
    queue = await make_queue()
    ran: list[Any] = []
    queue.handle("Report", ran.append)
    job_id = await queue.enqueue("Report", {"id": 9})
    set_state(admin, job_id, "needs_review", 2)
    async with queue.connection() as conn:
        result = await retry(conn, job_id, "ops:carol", "checked_ledger")
    assert result == ActResult(applied=True, kind=ActKind.RELEASED, found=JobState.NEEDS_REVIEW)
    assert status_of(admin, job_id)[0] == "queued"
    async with running(queue):
        await eventually(lambda: status_of(admin, job_id)[0] == "completed")
    assert ran == [{"id": 9}]
    assert status_of(admin, job_id) == ("completed", None, 3)
    [act] = await queue.acts(job_id)
    assert (act.kind, act.attempts, act.by, act.reason) == (
        ActKind.RELEASED,
        2,
        "ops:carol",
        "checked_ledger",
    )


@pytest.mark.parametrize(
    ("state", "attempts"), [("queued", 0), ("running", 1), ("completed", 1), ("cancelled", 0)]
)
async def test_retrying_a_job_that_neither_failed_nor_waits_for_review_changes_nothing(
    make_queue, admin, state: str, attempts: int
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Report", {})
    set_state(admin, job_id, state, attempts)
    before = job_row(admin, job_id)
    async with queue.connection() as conn:
        result = await retry(conn, job_id, "ops:bob", "try_again")
    assert bool(result) is False
    assert result == ActResult(applied=False, kind=None, found=JobState(state))
    assert job_row(admin, job_id) == before
    assert act_rows(admin) == []


# --- the caller's transaction ----------------------------------------------------------


@pytest.mark.parametrize("act", ["cancel", "retry"])
async def test_an_act_rolled_back_with_the_callers_transaction_leaves_nothing(
    make_queue, admin, act: str
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Report", {})
    if act == "retry":
        set_state(admin, job_id, "failed", 1)
    admin.execute("CREATE TABLE audit (note TEXT NOT NULL)")
    before = job_row(admin, job_id)
    with pytest.raises(RuntimeError, match="changed my mind"):
        async with queue.connection() as conn:
            result = await (cancel if act == "cancel" else retry)(
                conn, job_id, "ops:alice", "customer_asked"
            )
            assert result
            await conn.execute("INSERT INTO audit VALUES ('did it')")
            # Inside the transaction, the change and the act are both there.
            assert await acts_on(conn, job_id) != []
            raise RuntimeError("changed my mind")
    assert job_row(admin, job_id) == before
    assert act_rows(admin) == []
    assert admin.execute("SELECT count(*) FROM audit").fetchone() == (0,)


async def test_an_act_commits_with_the_callers_own_audit_row(make_queue, admin, dsn) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Report", {})
    admin.execute("CREATE TABLE audit (note TEXT NOT NULL)")
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        async with conn.transaction():
            assert await cancel(conn, job_id, "ops:alice", "customer_asked")
            await conn.execute("INSERT INTO audit VALUES ('cancelled a report')")
            # Not visible to anyone else before the commit.
            assert status_of(admin, job_id)[0] == "queued"
            assert act_rows(admin) == []
        assert status_of(admin, job_id)[0] == "cancelled"
        assert len(act_rows(admin)) == 1
        assert admin.execute("SELECT note FROM audit").fetchall() == [("cancelled a report",)]


# --- by and reason are codes -----------------------------------------------------------

BAD_CODES = [
    pytest.param("", id="empty"),
    pytest.param("x" * (MAX_REASON_CHARS + 1), id="201-chars"),
    pytest.param("é" * (MAX_REASON_CHARS + 1), id="201-accented-chars"),
    pytest.param("patient-Smith\nward-4", id="newline"),
    pytest.param("patient-Smith\r", id="carriage-return"),
    pytest.param("patient-Smith\tward-4", id="tab"),
    pytest.param("patient-Smith\x1b[31m", id="escape"),
    pytest.param("   ", id="blanks"),
    pytest.param("\u00a0\u3000", id="unicode-blanks"),
    pytest.param("\u200b", id="zero-width-space-alone"),
    pytest.param("patient\u200bSmith", id="zero-width-space"),
    pytest.param("patient\u2028Smith", id="line-separator"),
    pytest.param("patient\u2029Smith", id="paragraph-separator"),
    pytest.param("ops:\u202eecila", id="right-to-left-override"),
    pytest.param("\u2066patient\u2069", id="bidi-isolates"),
    pytest.param("patient\ufeff", id="byte-order-mark"),
    pytest.param("patient\u00adSmith", id="soft-hyphen"),
    pytest.param("patient\U000e0041", id="tag-character"),
    pytest.param("patient\ud800", id="lone-surrogate"),
    pytest.param("patient\ue000", id="private-use"),
    pytest.param("patient\u00a0Smith", id="no-break-space"),
    pytest.param(" patient-Smith", id="leading-space"),
    pytest.param("patient-Smith ", id="trailing-space"),
    pytest.param("patient\x85Smith", id="c1-control"),
]

GOOD_CODES = [
    "ops:alice",
    "customer asked, twice",
    "INC-1234",
    "José Müller",
    "日本語の理由",
    "🙂",
    "x",
    "é" * MAX_REASON_CHARS,
]


@pytest.mark.parametrize("bad", BAD_CODES)
@pytest.mark.parametrize("field", ["by", "reason"])
@pytest.mark.parametrize("act", ["cancel", "retry"])
async def test_a_by_or_reason_that_is_not_a_code_is_refused_before_anything_is_sent(
    make_queue, admin, dsn, bad: str, field: str, act: str
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Report", {})
    if act == "retry":
        set_state(admin, job_id, "failed", 1)
    before = job_row(admin, job_id)
    args = {"by": "ops:alice", "reason": "customer_asked", field: bad}
    # A closed connection: sending anything at all would raise OperationalError.
    conn = await psycopg.AsyncConnection.connect(dsn)
    await conn.close()
    function = cancel if act == "cancel" else retry
    with pytest.raises(NotACodeError) as caught:
        await function(conn, job_id, args["by"], args["reason"])
    assert caught.value.what == field
    message = str(caught.value)
    assert f"`{field}`" in message and str(MAX_REASON_CHARS) in message
    if bad:
        assert bad not in message
        assert "patient" not in message and "xxxx" not in message and "éé" not in message
    # And on an open connection, nothing is written.
    async with queue.connection() as open_conn:
        with pytest.raises(NotACodeError):
            await function(open_conn, job_id, args["by"], args["reason"])
    assert job_row(admin, job_id) == before
    assert act_rows(admin) == []


@pytest.mark.parametrize("bad", [None, 7, b"ops"], ids=["none", "int", "bytes"])
async def test_a_by_or_reason_that_is_not_text_is_refused(make_queue, bad: Any) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Report", {})
    async with queue.connection() as conn:
        with pytest.raises(NotACodeError):
            await cancel(conn, job_id, bad, "customer_asked")
        with pytest.raises(NotACodeError):
            await cancel(conn, job_id, "ops:alice", bad)


@pytest.mark.parametrize("good", GOOD_CODES)
def test_visible_codes_with_spaces_between_words_are_codes(good: str) -> None:
    assert check_code(good, "by") == good


async def test_a_by_and_reason_of_200_accented_characters_are_kept_whole(make_queue, admin) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Report", {})
    longest = "é" * MAX_REASON_CHARS  # 400 bytes of UTF-8, but 200 characters
    async with queue.connection() as conn:
        assert await cancel(conn, job_id, longest, longest)
    [act] = await queue.acts(job_id)
    assert act.by == longest and act.reason == longest


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("by", ""),
        ("by", "x" * 201),
        ("by", "two\nlines"),
        ("by", "a\ttab"),
        ("reason", ""),
        ("reason", "é" * 201),
        ("reason", "two\r\nlines"),
        ("reason", "a\ttab"),
        ("by", "ops:\u202eecila"),
        ("by", "   "),
        ("by", " ops"),
        ("reason", "why "),
        ("reason", "a\u200bb"),
        ("reason", "a\u2028b"),
        ("reason", "\u2066x\u2069"),
        ("reason", "x\ufeff"),
        ("act", "deleted"),
    ],
)
def test_the_acts_table_itself_refuses_a_row_that_is_not_a_code(
    admin, column: str, value: str
) -> None:
    set_up(admin)  # a sync test: no event loop needed
    row = {
        "job_id": uuid4(),
        "job_name": "Report",
        "act": "cancelled",
        "attempts": 0,
        "by": "ops:alice",
        "reason": "customer_asked",
    }
    row[column] = value
    with pytest.raises(psycopg.errors.CheckViolation):
        admin.execute(
            "INSERT INTO axa_job_acts (job_id, job_name, act, attempts, by, reason) "
            "VALUES (%(job_id)s, %(job_name)s, %(act)s, %(attempts)s, %(by)s, %(reason)s)",
            row,
        )
    row[column] = {"act": "released"}.get(column, "é" * 200)
    admin.execute(
        "INSERT INTO axa_job_acts (job_id, job_name, act, attempts, by, reason) "
        "VALUES (%(job_id)s, %(job_name)s, %(act)s, %(attempts)s, %(by)s, %(reason)s)",
        row,
    )
    assert admin.execute("SELECT count(*) FROM axa_job_acts").fetchone() == (1,)


# --- the acts table is only ever added to ----------------------------------------------


@pytest.mark.parametrize("replica", [False, True], ids=["origin", "replica-role"])
@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE axa_job_acts SET reason = 'rewritten'",
        "UPDATE axa_job_acts SET db_role = 'someone_else'",
        "DELETE FROM axa_job_acts",
        "TRUNCATE axa_job_acts",
        "TRUNCATE axa_job_acts CASCADE",
    ],
)
async def test_the_acts_table_refuses_every_change_even_from_a_superuser(
    make_queue, admin, statement: str, replica: bool
) -> None:
    assert admin.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[
        0
    ], "this test needs a superuser, as the tests' own role is"
    queue = await make_queue()
    job_id = await queue.enqueue("Report", {})
    async with queue.connection() as conn:
        assert await cancel(conn, job_id, "ops:alice", "customer_asked")
    kept = act_rows(admin)
    if replica:
        admin.execute("SET session_replication_role = replica")
    with pytest.raises(psycopg.errors.RaiseException) as caught:
        admin.execute(statement)
    assert "acts on jobs are only ever added to" in str(caught.value)
    admin.execute("SET session_replication_role = DEFAULT")
    assert act_rows(admin) == kept


async def test_acts_outlive_the_jobs_row(make_queue, admin) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Report", {})
    async with queue.connection() as conn:
        assert await cancel(conn, job_id, "ops:alice", "customer_asked")
    admin.execute("DELETE FROM axa_queue WHERE id = %s", (job_id,))
    assert await queue.job(job_id) is None
    [act] = await queue.acts(job_id)
    assert (act.job_id, act.job_name, act.kind) == (job_id, "Report", ActKind.CANCELLED)
    async with queue.connection() as conn:
        assert [a.id for a in await acts_on(conn, job_id)] == [act.id]
        # Acting on the deleted job finds nothing.
        assert (await cancel(conn, job_id, "ops:alice", "again")).found is None


async def test_acts_outlive_retention(make_queue, admin) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Report", {})
    async with queue.connection() as conn:
        assert await cancel(conn, job_id, "ops:alice", "customer_asked")
    admin.execute("UPDATE axa_queue SET updated_at = now() - interval '30 days'")
    assert await queue.purge() == 1
    assert [a.kind for a in await queue.acts(job_id)] == [ActKind.CANCELLED]


async def test_a_jobs_acts_are_listed_in_order_and_only_its_own(make_queue, admin) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Report", {})
    other = await queue.enqueue("Other", {})
    set_state(admin, job_id, "failed", 1)
    async with queue.connection() as conn:
        assert await retry(conn, job_id, "ops:alice", "first_try")
        assert await cancel(conn, other, "ops:zed", "not_this_one")
    set_state(admin, job_id, "needs_review", 2)
    async with queue.connection() as conn:
        assert await retry(conn, job_id, "ops:bob", "second_try")
        assert await cancel(conn, job_id, "ops:carol", "give_up")
    acts = await queue.acts(job_id)
    assert [(a.kind, a.attempts, a.by, a.reason) for a in acts] == [
        (ActKind.RETRIED, 1, "ops:alice", "first_try"),
        (ActKind.RELEASED, 2, "ops:bob", "second_try"),
        (ActKind.CANCELLED, 2, "ops:carol", "give_up"),
    ]
    assert [a.id for a in acts] == sorted(a.id for a in acts)
    assert [a.at for a in acts] == sorted(a.at for a in acts)
    assert {a.job_id for a in acts} == {job_id}
    assert [a.by for a in await queue.acts(other)] == ["ops:zed"]
    assert await queue.acts(uuid4()) == []


# --- the database role of each act ---------------------------------------------------


@pytest.fixture
def worker_role(admin, schema: str, dsn: str):
    """A throwaway role, and a DSN that acts as it (its grants: `grant_worker`)."""
    with acting_role(admin, dsn) as made:
        yield made


def grant_worker(admin, schema: str, role: str) -> None:
    for grant in (
        "GRANT USAGE ON SCHEMA {} TO {}",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON axa_queue TO {1}",
        "GRANT SELECT, INSERT ON axa_job_acts TO {1}",
        "GRANT SELECT, DELETE ON axa_queue_history TO {1}",
        "GRANT SELECT, INSERT, UPDATE ON axa_queue_attempts TO {1}",
    ):
        admin.execute(pgsql.SQL(grant).format(pgsql.Identifier(schema), pgsql.Identifier(role)))


async def test_each_act_records_the_database_role_that_wrote_it_ours_and_the_crates(
    make_queue, admin, schema: str, worker_role
) -> None:
    role, as_worker = worker_role
    queue = await make_queue()
    grant_worker(admin, schema, role)
    ours, crates = await queue.enqueue("Report", {}), await queue.enqueue("Report", {})
    async with await psycopg.AsyncConnection.connect(as_worker) as conn:
        assert await cancel(conn, ours, "ops:alice", "customer_asked")
    with psycopg.connect(as_worker, autocommit=True) as conn:  # the crate's own statement
        kept = conn.execute(crate.CANCEL, crate.params(crates, "ops:bob", "customer_asked"))
        assert kept.rowcount == 1
    owner = admin.execute("SELECT current_user").fetchone()[0]
    set_state(admin, crates, "failed", 1)  # and the crate's retry, as the tables' owner
    admin.execute(crate.RETRY_FAILED, crate.params(crates, "ops:carol", "fixed"))
    [act] = await queue.acts(ours)
    assert (act.by, act.role) == ("ops:alice", role)
    assert [(a.by, a.role) for a in await queue.acts(crates)] == [
        ("ops:bob", role),
        ("ops:carol", owner),
    ]


async def test_an_act_cannot_claim_another_database_role(
    make_queue, admin, schema: str, worker_role
) -> None:
    role, as_worker = worker_role
    queue = await make_queue()
    grant_worker(admin, schema, role)
    job_id = uuid4()
    with psycopg.connect(as_worker, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO axa_job_acts (job_id, job_name, act, attempts, by, reason, db_role) "
            "VALUES (%s, 'Report', 'cancelled', 0, 'ops:alice', 'INC-1', 'postgres')",
            (job_id,),
        )
    [act] = await queue.acts(job_id)
    assert act.by == "ops:alice", "`by` is the application's claim: any role may write any"
    assert act.role == role, "the role is the database's word: no insert may choose it"


async def test_acts_kept_before_the_role_column_existed_have_no_role(make_queue, admin) -> None:
    with admin.transaction():
        for statement in crate.SETUP_STATEMENTS:
            admin.execute(statement)
    job_id = uuid4()
    admin.execute(
        "INSERT INTO axa_job_acts (job_id, job_name, act, attempts, by, reason) "
        "VALUES (%s, 'Report', 'cancelled', 0, 'ops:alice', 'INC-1')",
        (job_id,),
    )
    queue = await make_queue()  # our setup adds the column to the crate's table
    [act] = await queue.acts(job_id)
    assert act.by == "ops:alice" and act.role is None
