"""Fairness by key: a job's key (`NewJob.key`), names claimed from their keys in turn
(`Queue.fair_by_key`), at most N running per key across every process
(`Queue.limit_per_key`), checked by the claim statement (`sql.EXCHANGE_KEYED`)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from axa_queue import NewJob, OptionsError, Queue, chain, sql
from conftest import eventually, running


def test_a_key_is_a_visible_code_and_is_never_echoed() -> None:
    assert NewJob("Report", key="tenant-42").key == "tenant-42"
    assert "tenant-42" not in repr(NewJob("Report", key="tenant-42"))
    for bad in ("", " tenant-1", "tenant-2 ", "ten\nant-3", "t" * 201, "ten\u200bant", 42):
        with pytest.raises(OptionsError, match="the key of job 'Report' cannot be used") as err:
            NewJob("Report", key=bad)  # type: ignore[arg-type]
        assert "tenant" not in str(err.value) and "ant-" not in str(err.value)


def test_a_per_key_limit_refuses_what_is_not_a_positive_integer() -> None:
    queue = Queue("postgresql://unused")
    for bad in (0, -1, True, 2.5):
        with pytest.raises(OptionsError, match="per-key limit of job 'Report'"):
            queue.limit_per_key("Report", bad)  # type: ignore[arg-type]


def test_a_queue_that_claims_no_name_by_key_sends_the_statements_it_sent_before() -> None:
    for name in ("EXCHANGE", "EXCHANGE_LIMITED", "EXCHANGE_RATED", "CLAIM"):
        text = getattr(sql, name)
        assert "axa_queue_keyed" not in text and "key_room" not in text and "walk" not in text
    for name in ("ENQUEUE", "ENQUEUE_MANY", "ENQUEUE_COPY"):
        assert "key)" not in getattr(sql, name)


async def test_keyed_jobs_are_stored_with_their_key_one_many_and_by_copy(make_queue, admin) -> None:
    queue = await make_queue()
    one = await queue.enqueue("Report", {"n": 0}, key="a")
    many = await queue.enqueue_all([NewJob("Report", key="b"), NewJob("Report")])
    copied = await queue.enqueue_all([NewJob("Report", key=f"c{n % 2}") for n in range(20)])
    unique = await queue.enqueue("Report", unique_key="u", key="d")
    keys = dict(admin.execute("SELECT id, key FROM axa_queue").fetchall())
    assert keys[one] == "a" and keys[many[0]] == "b" and keys[many[1]] is None
    assert sorted({keys[i] for i in copied}) == ["c0", "c1"] and keys[unique] == "d"


async def test_jobs_with_dependencies_and_workflow_members_keep_their_key(
    make_queue, admin
) -> None:
    queue = await make_queue()
    parent = await queue.enqueue("Report", {}, key="t1")
    after = await queue.enqueue(NewJob("Report", key="t2", after=[parent]))
    flow = await queue.enqueue(chain(NewJob("Report", key="t3"), NewJob("Report")))
    keys = dict(admin.execute("SELECT id, key FROM axa_queue").fetchall())
    assert keys[after] == "t2"
    assert [keys[i] for i in flow.jobs] == ["t3", None]


async def test_a_keyed_name_runs_its_keys_jobs_in_turn(make_queue, admin) -> None:
    queue = await make_queue(workers=2, prefetch=0)
    queue.fair_by_key("Report")
    order: list[str] = []

    @queue.handler("Report")
    async def report(args: Any) -> None:
        order.append(args["k"])

    await queue.enqueue_all([NewJob("Report", {"k": "A"}, key="A") for _ in range(50)])
    await queue.enqueue_all([NewJob("Report", {"k": "B"}, key="B") for _ in range(5)])
    async with running(queue):
        await eventually(lambda: len(order) == 55, timeout=30)
    assert order[:20].count("B") == 5, order[:20]


async def test_a_job_without_a_key_of_a_keyed_name_is_claimed_in_its_place(make_queue) -> None:
    queue = await make_queue(workers=2, prefetch=0)
    queue.limit_per_key("Report", 1)
    order: list[str] = []

    @queue.handler("Report")
    async def report(args: Any) -> None:
        order.append(args["k"])

    await queue.enqueue("Report", {"k": "none-1"})
    await queue.enqueue_all([NewJob("Report", {"k": "A"}, key="A") for _ in range(10)])
    await queue.enqueue("Report", {"k": "none-2"})
    async with running(queue):
        await eventually(lambda: len(order) == 12, timeout=30)
    assert "none-1" in order[:2] and order.count("none-2") == 1


async def test_a_process_with_a_keyed_name_claims_its_other_names_oldest_first_as_before(
    make_queue,
) -> None:
    queue = await make_queue(workers=4)
    queue.limit_per_key("Report", 1)
    queue.limit("Report", 1, scope="global")  # both apply, under one lock
    ran: list[str] = []

    @queue.handler("Report")
    async def report(args: Any) -> None:
        ran.append(f"Report {args['n']}")

    @queue.handler("Mail")
    async def mail(args: Any) -> None:
        ran.append(f"Mail {args['n']}")

    await queue.enqueue_all([NewJob("Mail", {"n": n}) for n in range(20)])
    await queue.enqueue_all([NewJob("Report", {"n": n}, key=f"k{n % 3}") for n in range(6)])
    async with running(queue):
        await eventually(lambda: len(ran) == 26, timeout=30)
    mails = [one for one in ran if one.startswith("Mail")]
    assert len(mails) == 20 and len(ran) == 26


def ctes(statement: str) -> list[str]:
    """The names of a claim statement's CTEs, in order (`sql.exchange._with`'s shape)."""
    return re.findall(r"(?:WITH RECURSIVE |\n    \), )(\w+)", statement)


def test_the_keyed_claim_has_every_piece_of_the_rated_one_in_the_same_order() -> None:
    # EXCHANGE_KEYED is composed of sql.exchange's pieces: one added there (a new
    # ending's CTE, say) must be added to it too.
    keyed, rated = ctes(sql.EXCHANGE_KEYED), ctes(sql.EXCHANGE_RATED)
    assert [name for name in keyed if name in rated] == rated
    assert [name for name in keyed if name not in rated] == ["walk", "stops", "keyed"]
