"""Results: what a handler returns is stored with its job by the statement that records
the ending, read with `result()`, private like the arguments, and deleted with the job."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from datetime import date
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from click.testing import CliRunner

from axa_queue import JobNotFoundError, JobState, NewJob, NoResultError, SyncQueue
from axa_queue.cli import main
from axa_queue.jobs.arguments import result_json
from conftest import eventually, later, running, status_of

SECRET = "the-result-secret-4711"
"""What must never leave the `result` column."""


def stored(admin: psycopg.Connection[Any], job_id: UUID) -> Any:
    """The `result` column as the table holds it (`None` for NULL)."""
    row = admin.execute("SELECT result FROM axa_queue WHERE id = %s", (job_id,)).fetchone()
    assert row is not None, f"no job {job_id}"
    return row[0]


async def test_what_an_async_handler_returns_is_stored_with_its_job_and_read_back(
    make_queue, admin
) -> None:
    queue = await make_queue()

    @queue.handler("Add")
    async def add(args: dict[str, int]) -> dict[str, Any]:
        return {
            "sum": args["x"] + args["y"],
            "text": 'quote " back \\ ünï 漢字 😀',
            "n": [1.5, None],
        }

    job_id = await queue.enqueue("Add", {"x": 2, "y": 3})
    async with running(queue):
        info = await queue.wait(job_id, timeout=15)
    assert info.state is JobState.COMPLETED
    expected = {"sum": 5, "text": 'quote " back \\ ünï 漢字 😀', "n": [1.5, None]}
    assert await queue.result(job_id) == expected
    assert stored(admin, job_id) == expected
    with SyncQueue(queue.dsn) as jobs:
        assert jobs.result(job_id) == expected
        assert jobs.result(str(job_id)) == expected


async def test_what_a_sync_handler_returns_is_stored_too(make_queue) -> None:
    queue = await make_queue()

    @dataclasses.dataclass
    class Report:
        day: date
        rows: int

    @queue.handler("Plain")
    def plain(args: Any) -> list[Any]:
        return ["done", 3, True]

    @queue.handler("Typed")
    def typed(args: Any) -> Report:
        return Report(date(2026, 12, 1), 7)

    plain_id = await queue.enqueue("Plain", {})
    typed_id = await queue.enqueue("Typed", {})
    async with running(queue):
        await queue.wait(plain_id, timeout=15)
        await queue.wait(typed_id, timeout=15)
    assert await queue.result(plain_id) == ["done", 3, True]
    assert await queue.result(typed_id) == {"day": "2026-12-01", "rows": 7}


async def test_a_handler_returning_none_leaves_the_result_null_and_reads_as_none(
    make_queue, admin
) -> None:
    queue = await make_queue()
    queue.handle("Nothing", lambda args: None)
    job_id = await queue.enqueue("Nothing", {})
    async with running(queue):
        await queue.wait(job_id, timeout=15)
    row = admin.execute(
        "SELECT status, result IS NULL AS empty FROM axa_queue WHERE id = %s", (job_id,)
    ).fetchone()
    assert row == ("completed", True)
    assert await queue.result(job_id) is None


async def test_results_none_and_failures_sharing_one_statement_each_land_on_their_own_job(
    make_queue,
) -> None:
    queue = await make_queue(workers=8, prefetch=40)

    @queue.handler("Mixed")
    async def mixed(args: dict[str, int]) -> Any:
        n = args["n"]
        if n % 3 == 0:
            return None
        if n % 3 == 1:
            return {"n": n, "twice": n * 2}
        raise ValueError(f"number {n} fails")

    ids = await queue.enqueue_all(NewJob("Mixed", {"n": n}) for n in range(90))
    async with running(queue):
        infos = await asyncio.gather(*(queue.wait(one, timeout=30) for one in ids))
    for n, (job_id, info) in enumerate(zip(ids, infos, strict=True)):
        if n % 3 == 2:
            assert info.state is JobState.FAILED and info.error == f"ValueError: number {n} fails"
            with pytest.raises(NoResultError, match="it failed"):
                await queue.result(job_id)
        else:
            assert info.state is JobState.COMPLETED
            assert await queue.result(job_id) == (None if n % 3 == 0 else {"n": n, "twice": n * 2})


@pytest.mark.parametrize(
    ("returned", "named"),
    [
        ({1, 2, SECRET}, "returned a set that cannot be stored as its result: JSON cannot hold a set"),
        ({"key": SECRET + "\x00"}, "returned a dict that cannot be stored as its result: a string holds a NUL"),
        ({"when": date(2026, 1, 1), "why": SECRET}, "returned a dict that cannot be stored as its result: it holds a date"),
        ([float("nan"), SECRET], "returned a list that cannot be stored as its result: it holds a number JSON cannot hold"),
        (SECRET + "\udc80", "returned a str that cannot be stored as its result: a string holds a lone surrogate"),
    ],
)  # fmt: skip
async def test_a_return_value_that_cannot_be_stored_fails_the_attempt_naming_the_job_and_type(
    make_queue, admin, caplog, returned: Any, named: str
) -> None:
    caplog.set_level(logging.DEBUG)
    queue = await make_queue(max_attempts=2, retry_backoff=0)
    runs: list[int] = []

    @queue.handler("Odd")
    async def odd(args: Any) -> Any:
        runs.append(1)
        return returned

    other = await queue.enqueue("Odd", {})
    queue.handle("Fine", lambda args: {"fine": True})
    fine = await queue.enqueue("Fine", {})
    async with running(queue):
        info = await queue.wait(other, timeout=15)
        await queue.wait(fine, timeout=15)
    assert info.state is JobState.FAILED and len(runs) == 2  # a failure like any other
    assert info.error is not None and info.error.startswith(f"job 'Odd' {named}"), info.error
    assert SECRET not in info.error
    assert stored(admin, other) is None
    assert await queue.result(fine) == {"fine": True}  # the statement it shared went through
    logged = " ".join(str(record.__dict__) for record in caplog.records)
    assert "job 'Odd' returned a" in logged
    assert SECRET not in caplog.text and SECRET not in logged


def test_a_return_value_is_encoded_compactly_or_refused_by_its_type() -> None:
    assert result_json({"a": [1, "b"]}, "Job") == ('{"a":[1,"b"]}', None)
    assert result_json(None, "Job") == ("null", None)  # the worker stores no text for None
    text, problem = result_json(object(), "Job")
    assert text is None and problem is not None
    assert problem.startswith("job 'Job' returned an object that cannot be stored as its result")
    assert "JSON cannot hold an object" in problem


async def test_the_result_of_a_job_not_completed_says_its_state_and_an_unknown_one_is_not_found(
    make_queue, admin
) -> None:
    queue = await make_queue()
    queued = await queue.enqueue("Later", {}, run_in=3600)
    with pytest.raises(NoResultError, match=f"job {queued} has no result: it is queued") as raised:
        await queue.result(queued)
    assert raised.value.state == "queued" and isinstance(raised.value, LookupError)
    admin.execute("UPDATE axa_queue SET status = 'cancelled' WHERE id = %s", (queued,))
    with pytest.raises(NoResultError, match="it was cancelled"):
        await queue.result(queued)
    missing = uuid4()
    with pytest.raises(JobNotFoundError, match=f"no job {missing}"):
        await queue.result(missing)
    with SyncQueue(queue.dsn) as jobs, pytest.raises(JobNotFoundError):
        jobs.result(missing)


async def test_a_result_is_never_logged_nor_shown_by_job_info_or_the_command_line(
    make_queue, dsn, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    queue = await make_queue()
    queue.handle("Secret", lambda args: {"token": SECRET})
    job_id = await queue.enqueue("Secret", {})
    async with running(queue):
        info = await queue.wait(job_id, timeout=15)
    assert await queue.result(job_id) == {"token": SECRET}
    assert SECRET not in repr(info) and SECRET not in str(await queue.jobs())
    runner = CliRunner(env={"AXA_QUEUE_DSN": dsn, "DATABASE_URL": None})
    for args in (
        ["show", str(job_id)],
        ["show", str(job_id), "--json"],
        ["jobs"],
        ["jobs", "--json"],
        ["jobs", "--state", "completed"],
    ):
        shown = await asyncio.to_thread(
            runner.invoke, main, args, prog_name="axa-queue", catch_exceptions=False
        )
        assert shown.exit_code == 0, shown.output
        assert str(job_id)[:8] in shown.output
        assert SECRET not in shown.output, args
    assert SECRET not in caplog.text
    assert SECRET not in " ".join(str(record.__dict__) for record in caplog.records)


async def test_retention_deletes_a_result_with_its_job(make_queue, admin) -> None:
    queue = await make_queue()
    queue.handle("Kept", lambda args: {"token": SECRET})
    job_id = await queue.enqueue("Kept", {})
    async with running(queue):
        await queue.wait(job_id, timeout=15)
    assert await queue.result(job_id) == {"token": SECRET}
    assert await queue.purge(older_than=60, now=later(admin, 3600)) == 1
    with pytest.raises(JobNotFoundError, match="retention deleted it"):
        await queue.result(job_id)
    row = admin.execute(
        "SELECT count(*) FROM axa_queue WHERE result::text LIKE %s", (f"%{SECRET}%",)
    )
    assert row.fetchone() == (0,)


async def test_a_retried_attempt_that_completes_stores_its_result(make_queue, admin) -> None:
    queue = await make_queue(max_attempts=3, retry_backoff=0)
    attempts: list[int] = []

    @queue.handler("Flaky")
    async def flaky(args: Any) -> dict[str, int]:
        attempts.append(1)
        if len(attempts) < 2:
            raise RuntimeError("not yet")
        return {"attempt": len(attempts)}

    job_id = await queue.enqueue("Flaky", {})
    async with running(queue):
        await eventually(lambda: status_of(admin, job_id)[0] == "completed")
    assert await queue.result(job_id) == {"attempt": 2}


async def test_a_result_too_long_to_send_fails_its_attempt_and_holds_up_no_other_run(
    make_queue, admin, monkeypatch: pytest.MonkeyPatch
) -> None:
    from axa_queue.jobs import arguments

    monkeypatch.setattr(arguments, "MAX_RESULT_CHARS", 1000)  # 16 Mi, as a test's size
    text, why = result_json({"x": "y" * 2000}, "Big")
    assert text is None and why is not None
    assert why.startswith("job 'Big' returned a result of") and "yyy" not in why
    assert "store big outputs elsewhere" in why
    queue = await make_queue()

    @queue.handler("Big")
    async def big(args: dict[str, Any]) -> dict[str, str]:
        return {"x": "y" * 2000}

    @queue.handler("Small")
    async def small(args: dict[str, Any]) -> str:
        return "ok"

    big_id = await queue.enqueue(NewJob("Big", max_attempts=1))
    small_id = await queue.enqueue("Small")
    async with running(queue):
        await eventually(lambda: status_of(admin, big_id)[0] == "failed")
        await eventually(lambda: status_of(admin, small_id)[0] == "completed")
    assert "returned a result of" in (status_of(admin, big_id)[1] or "")
    assert await queue.result(small_id) == "ok"
