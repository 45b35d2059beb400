"""The exchange and the loops: endings gathered while loops are busy, found by primary
key and written exactly as the handler's failure said; a loop going on from run to run."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from psycopg import sql as pgsql

from axa_queue import NewJob, sql
from axa_queue.worker.exchange import Exchange
from conftest import eventually, running, status_of


async def test_an_ending_is_written_while_every_loop_stays_busy_with_jobs_claimed_ahead(
    make_queue, admin
) -> None:
    # One loop and four jobs claimed ahead: once the first ends, the loop is busy and
    # three jobs wait, so the exchange lets endings gather, for a few milliseconds only.
    queue = await make_queue(workers=1, prefetch=4)
    gate = asyncio.Event()

    @queue.handler("Held")
    async def held(args: dict[str, int]) -> None:
        if args["n"] > 0:
            await gate.wait()

    first = await queue.enqueue("Held", {"n": 0}, priority=1)
    await queue.enqueue_all(NewJob("Held", {"n": n}) for n in range(1, 5))
    async with running(queue):
        await eventually(lambda: status_of(admin, first)[0] == "completed")
        assert admin.execute(
            "SELECT count(*) FROM axa_queue WHERE status = 'running'"
        ).fetchone() == (4,), "the other jobs are still claimed and waiting"
        gate.set()
        await eventually(
            lambda: (
                admin.execute(
                    "SELECT count(*) FROM axa_queue WHERE status = 'completed'"
                ).fetchone()
                == (5,)
            )
        )


async def test_many_endings_share_one_statement_when_jobs_are_claimed_ahead(
    make_queue, admin, monkeypatch
) -> None:
    batches: list[int] = []
    exchange = Exchange.send

    async def counted(self: Exchange, batch: list[Any], free: int, *rest: Any) -> Any:
        batches.append(len(batch))
        return await exchange(self, batch, free, *rest)

    monkeypatch.setattr(Exchange, "send", counted)
    queue = await make_queue(workers=2, prefetch=20)
    done: list[int] = []

    @queue.handler("Quick")
    async def quick(args: dict[str, int]) -> None:
        done.append(args["n"])

    await queue.enqueue_all(NewJob("Quick", {"n": n}) for n in range(200))
    async with running(queue):
        await eventually(
            lambda: (
                admin.execute(
                    "SELECT count(*) FROM axa_queue WHERE status = 'completed'"
                ).fetchone()
                == (200,)
            )
        )
    assert sorted(done) == list(range(200))
    assert sum(batches) == 200
    assert max(batches) > 2, "endings gathered while the loops were busy"


def _generic_plan(admin: Any, statement: str, types: str, args: pgsql.Composable) -> str:
    """EXPLAIN of `statement`'s generic plan (as the library runs it; `$n` placeholders
    of `types`) for `args`."""
    admin.execute("SET plan_cache_mode = force_generic_plan")
    admin.execute(
        pgsql.SQL("PREPARE plan_under_test({}) AS {}").format(
            pgsql.SQL(types),
            pgsql.SQL(statement),  # type: ignore[arg-type]
        )
    )
    try:
        explain = pgsql.SQL("EXPLAIN EXECUTE plan_under_test({})").format(args)
        return "\n".join(row[0] for row in admin.execute(explain).fetchall())
    finally:
        admin.execute("DEALLOCATE plan_under_test")
        admin.execute("RESET plan_cache_mode")


_PARAMS = [
    "completed", "completed_attempts", "endings", "free", "wanted", "losing", "now", "idle",
    "starts", "started_attempts", "worker", "host", "pid", "limits", "max",
]  # fmt: skip
"""The exchange's parameters in the order `_numbered` places them."""

_TYPES = (
    "uuid[], int[], json, int, json, uuid[], timestamptz, int, uuid[], int[], uuid, text, int, "
    "jsonb, int"
)
"""Their types, for `PREPARE`."""


def _numbered(statement: str) -> str:
    """`statement` with its named parameters as `$n` (`_PARAMS`' places), to PREPARE."""
    return re.sub(r"%\((\w+)\)s", lambda m: f"${_PARAMS.index(m.group(1)) + 1}", statement)


async def _many_running(make_queue: Any, admin: Any) -> Any:
    """3,000 running jobs, analyzed while they were queued (so the partial index of
    running jobs looks tiny to the planner); returns one of their ids."""
    queue = await make_queue()
    await queue.enqueue_all(NewJob("Many", {"n": n}) for n in range(3000))
    admin.execute("ANALYZE axa_queue")
    admin.execute(
        "UPDATE axa_queue SET status = 'running', attempts = 1, started_at = now() "
        "WHERE name = 'Many'"
    )
    return admin.execute("SELECT id FROM axa_queue LIMIT 1").fetchone()[0]


async def test_completions_retries_and_failures_sharing_one_statement_are_each_written_as_they_ended(
    make_queue, admin, monkeypatch
) -> None:
    # Completed runs travel as arrays, the others as JSON with their error and delay:
    # one statement carrying both kinds must write each row as its run ended.
    kinds: list[set[str]] = []
    exchange = Exchange.send

    async def seen(self: Exchange, batch: list[Any], free: int, *rest: Any) -> Any:
        kinds.append({one.status for one in batch})
        return await exchange(self, batch, free, *rest)

    monkeypatch.setattr(Exchange, "send", seen)
    queue = await make_queue(workers=2, prefetch=30, retry_backoff=3600)

    @queue.handler("Mixed")
    async def mixed(args: dict[str, int]) -> None:
        await asyncio.sleep(0.001)
        if args["n"] % 3 == 1:
            raise ValueError(f"odd one {args['n']}")

    await queue.enqueue_all(
        NewJob("Mixed", {"n": n}, max_attempts=1 if n % 2 else 2) for n in range(60)
    )
    async with running(queue):
        await eventually(
            lambda: (
                admin.execute(
                    "SELECT count(*) FROM axa_queue WHERE status = 'running' OR attempts = 0"
                ).fetchone()
                == (0,)
            )
        )
    rows = admin.execute(
        "SELECT (args->>'n')::int, status, error, attempts, "
        "run_at > now() + interval '50 minutes' FROM axa_queue ORDER BY 1"
    ).fetchall()
    assert len(rows) == 60
    for n, status, error, attempts, later in rows:
        assert attempts == 1, (n, status)
        if n % 3 != 1:
            assert (status, error, later) == ("completed", None, False), n
        elif n % 2:
            assert (status, error, later) == ("failed", f"ValueError: odd one {n}", False), n
        else:  # an attempt left: queued again after the backoff (an hour here)
            assert (status, error, later) == ("queued", f"ValueError: odd one {n}", True), n
    assert any({"completed", "failed"} <= k or {"completed", "queued"} <= k for k in kinds), (
        "completions and other endings shared a statement"
    )


async def test_endings_find_their_rows_by_primary_key_however_many_jobs_run(
    make_queue, admin
) -> None:
    # Statistics taken while few jobs run make the partial index of running jobs look
    # tiny; the endings must still go by primary key, not scan every running job.
    one = await _many_running(make_queue, admin)
    failed = json.dumps(
        [{"id": str(one), "attempts": 1, "status": "failed", "error": "boom", "delay": 0}]
    )
    numbered = _numbered(sql.EXCHANGE)
    as_completed = pgsql.SQL(
        "{}, '{{1}}', '[]', 0, '[]', '{{}}', NULL, 0, '{{}}', '{{}}', NULL, NULL, NULL, '{{}}', 1"
    ).format(pgsql.Literal(f"{{{one}}}"))
    as_failed = pgsql.SQL(
        "'{{}}', '{{}}', {}, 0, '[]', '{{}}', NULL, 0, '{{}}', '{{}}', NULL, NULL, NULL, '{{}}', 1"
    ).format(pgsql.Literal(failed))
    for values in (as_completed, as_failed):
        plan = _generic_plan(admin, numbered, _TYPES, values)
        finished = plan.split("CTE levels")[0]
        assert "axa_queue_pkey" in finished, plan
        assert "axa_queue_running" not in finished, plan


async def test_an_exchange_looks_up_its_endings_starts_and_claims_ahead_in_hashes(
    make_queue, admin
) -> None:
    # 200 endings and 200 start marks in one statement, as a fast drain sends them: each
    # row is looked up in a hash of the others made once, never compared with each of
    # them (a loop over the 200 starts for each of 200 rows was 40,000 comparisons).
    queue = await make_queue()
    ids = await queue.enqueue_all(NewJob("Busy", {"n": n}) for n in range(600))
    admin.execute(
        "UPDATE axa_queue SET status = 'running', attempts = 1, started_at = now(), ahead = 1 "
        "WHERE id = ANY(%s)",
        (ids[:400],),
    )
    admin.execute("ANALYZE axa_queue")
    numbered = _numbered(sql.EXCHANGE)
    ones = "{" + ",".join("1" for _ in range(200)) + "}"
    values = pgsql.SQL(", ").join(
        pgsql.Literal(value)
        for value in (
            "{" + ",".join(map(str, ids[:200])) + "}", ones, "[]", 200,
            json.dumps([{"name": "Busy", "cap": 200}]), "{}", None, 10,
            "{" + ",".join(map(str, ids[200:400])) + "}", ones, None, "test", 1, "{}", 3,
        )
    )  # fmt: skip
    admin.execute(sql.CLAIM_SETTINGS)  # as the exchange's connection plans it
    plan = _generic_plan(admin, numbered, _TYPES, values)
    admin.execute("RESET enable_sort; RESET enable_seqscan")
    marked = plan.split("CTE marked")[1].split("CTE levels")[0]
    levels = plan.split("CTE levels")[1].split("CTE picked")[0]
    claimed = plan.split("CTE claimed")[1]
    assert "Nested Loop" not in marked and "Join Filter" not in marked, plan
    assert marked.count("hashed SubPlan") == 2 and "axa_queue_pkey" in marked, plan
    # (The one `<> ALL` left is `losing`, the process's own lost runs: none, or a few.)
    assert "NOT (hashed SubPlan" in levels and levels.count("<> ALL") == 1, plan
    # Claimed ahead: each row compared with the ids within `idle` (an array made once),
    # never a sub-plan run again for each row.
    assert "SubPlan" not in claimed.split("CTE ended")[0], plan


async def test_a_claim_behind_a_backlog_of_ready_jobs_walks_the_pick_index_in_order(
    make_queue, admin
) -> None:
    # With a backlog of due jobs at a few priorities, the generic plan must read the
    # name's jobs in order from axa_queue_pick_hash and stop at the cap, never filter the
    # backlog through the run_at index (it did when the due check took a parameter).
    queue = await make_queue()
    await queue.enqueue_all(NewJob("Backlog", {"n": n}, priority=n % 3) for n in range(30_000))
    admin.execute("ANALYZE axa_queue")
    numbered = _numbered(sql.EXCHANGE)
    # The same with a global limit on the name (`EXCHANGE_LIMITED`: a gate in `wanted`).
    limited = _numbered(sql.EXCHANGE_LIMITED)
    # And with a rate limit on it (`EXCHANGE_RATED`: a gate, and the slots stamped).
    rated = _numbered(sql.EXCHANGE_RATED)
    # And the claim alone (`CLAIM`: nothing to record), which parameters it does not name
    # keep their places and types.
    alone = _numbered(sql.CLAIM)
    for statement, wanted in (
        (numbered, {"name": "Backlog", "cap": 10}),
        (alone, {"name": "Backlog", "cap": 10}),
        (limited, {"name": "Backlog", "cap": 10, "global": 5}),
        (rated, {"name": "Backlog", "cap": 10, "global": 5, "rate": 3, "per_ms": 1000}),
    ):
        claim = pgsql.SQL(
            "'{{}}', '{{}}', '[]', 10, {}, '{{}}', NULL, 10, '{{}}', '{{}}', NULL, NULL, NULL, '{{}}', 1"
        ).format(pgsql.Literal(json.dumps([wanted])))
        plan = _generic_plan(admin, statement, _TYPES, claim)
        levels = plan.split("CTE levels")[1].split("CTE picked")[0]
        assert "axa_queue_pick_hash" in levels, plan
        assert "axa_queue_ready" not in levels and "axa_queue_claim" not in levels, plan
    # Which jobs are due is judged by now() itself, never a parameter (see EXCHANGE).
    for statement in (sql.EXCHANGE, sql.EXCHANGE_LIMITED, sql.EXCHANGE_RATED):
        assert "AND run_at <= now() AND f.run_at <= now() AND id NOT IN" in statement


async def test_error_texts_with_quotes_newlines_and_any_script_are_kept_exactly(
    make_queue, admin
) -> None:
    queue = await make_queue(max_attempts=1)
    text = 'he said "no" \\ back\nslash\ttab \x07 bell ünïcödé 漢字 😀 }]'

    @queue.handler("Odd")
    async def odd(args: Any) -> None:
        raise ValueError(text)

    job = await queue.enqueue("Odd", {})
    async with running(queue):
        await eventually(lambda: status_of(admin, job)[0] == "failed")
    assert status_of(admin, job) == ("failed", f"ValueError: {text}", 1)


async def test_a_cancellation_meant_for_one_run_never_reaches_the_next_run_on_its_loop(
    make_queue, admin
) -> None:
    # One loop goes on from run to run in one task: a handler that swallows the
    # cancellation of its timeout must not leave it for the next job on that loop.
    queue = await make_queue(workers=1, prefetch=2)
    seen: list[str] = []

    @queue.handler("Stubborn")
    async def stubborn(args: Any) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("swallowed")

    @queue.handler("Next")
    async def next_one(args: Any) -> None:
        task = asyncio.current_task()
        assert task is not None
        if hasattr(task, "cancelling"):
            assert task.cancelling() == 0, "no cancellation left over"
        await asyncio.sleep(0.05)
        seen.append("next")

    first = await queue.enqueue("Stubborn", {}, priority=1, timeout=0.1, max_attempts=1)
    second = await queue.enqueue("Next", {})
    async with running(queue):
        await eventually(lambda: status_of(admin, second)[0] == "completed")
    assert seen == ["swallowed", "next"]
    assert status_of(admin, first) == ("failed", "timed out after 0.1 s", 1)


async def test_a_stop_past_its_grace_gives_back_the_jobs_claimed_ahead_and_leaves_the_aborted_one_to_stale_recovery(
    make_queue, admin
) -> None:
    queue = await make_queue(workers=1, prefetch=3, shutdown_grace=0.2)
    started = asyncio.Event()

    @queue.handler("Forever")
    async def forever(args: Any) -> None:
        started.set()
        await asyncio.sleep(3600)

    await queue.enqueue_all(NewJob("Forever", {}) for _ in range(4))
    stop = asyncio.Event()
    task = asyncio.create_task(queue.run(stop))
    await eventually(
        lambda: (
            admin.execute("SELECT count(*) FROM axa_queue WHERE status = 'running'").fetchone()
            == (4,)
        )
    )
    await asyncio.wait_for(started.wait(), 15)
    stop.set()
    await asyncio.wait_for(task, 15)
    # The one whose handler ran stays `running`, for stale recovery; the three that
    # never started are queued again at once, each with its attempt given back.
    assert admin.execute(
        "SELECT status, count(*), max(attempts), max(max_attempts), max(given_back) "
        "FROM axa_queue GROUP BY status ORDER BY status"
    ).fetchall() == [("queued", 3, 1, 2, 1), ("running", 1, 1, 1, 0)]  # its limit stored


async def test_a_worker_whose_connections_drop_mid_run_reconnects_and_finishes_every_job(
    make_queue, admin
) -> None:
    admin.execute("CREATE TABLE ran (n INTEGER PRIMARY KEY)")
    queue = await make_queue(workers=3, prefetch=6, max_attempts=3)

    @queue.handler("Work")
    async def work(args: dict[str, int]) -> None:
        await asyncio.sleep(0.003)
        async with queue.pool.connection() as conn:
            await conn.execute("INSERT INTO ran VALUES (%s) ON CONFLICT DO NOTHING", (args["n"],))

    await queue.enqueue_all(NewJob("Work", {"n": n}) for n in range(300))

    def finished() -> int:
        row = admin.execute(
            "SELECT count(*) FROM axa_queue WHERE status IN ('completed', 'needs_review')"
        ).fetchone()
        return 0 if row is None else int(row[0])

    async with running(queue):
        await eventually(lambda: finished() >= 60)
        # Every connection of the queue's process goes: the exchange loop's, the
        # listener's and the pool's, in the middle of claims and endings.
        dropped = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = current_setting('application_name') "
            "AND pid <> pg_backend_pid()"
        ).fetchone()
        assert dropped is not None and dropped[0] >= 2
        await eventually(lambda: finished() == 300, timeout=60)
    rows = admin.execute("SELECT status, count(*) FROM axa_queue GROUP BY status").fetchall()
    assert set(dict(rows)) <= {"completed", "needs_review"}, rows
    missing = admin.execute(
        "SELECT count(*) FROM axa_queue q WHERE q.status = 'completed' "
        "AND NOT EXISTS (SELECT 1 FROM ran WHERE ran.n = (q.args->>'n')::int)"
    ).fetchone()
    assert missing == (0,), "every completed job did its work"


async def test_heartbeats_find_their_rows_by_primary_key_however_many_jobs_run(
    make_queue, admin
) -> None:
    one = await _many_running(make_queue, admin)
    names = ["ids", "attempts", "now"]
    numbered = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", sql.HEARTBEAT)
    plan = _generic_plan(
        admin,
        numbered,
        "uuid[], int[], timestamptz",
        pgsql.SQL("{}::uuid[], '{{1}}', NULL").format(pgsql.Literal([one])),
    )
    assert "axa_queue_pkey" in plan, plan
    assert "axa_queue_running" not in plan, plan
    assert "Seq Scan on axa_queue" not in plan, plan


async def test_a_clock_set_on_the_connector_stamps_the_claim_and_the_ending(
    make_queue, admin
) -> None:
    from datetime import datetime, timezone

    queue = await make_queue(heartbeat_interval=0.05)
    clock = datetime(2031, 5, 1, 9, 0, tzinfo=timezone.utc)
    queue.connector.clock = clock
    beaten = asyncio.Event()

    @queue.handler("Stamped")
    async def stamped(args: Any) -> None:
        await beaten.wait()

    job = await queue.enqueue("Stamped", {})
    async with running(queue):
        # The claim stamps `started_at` and `updated_at` with the clock (heartbeats,
        # every 50 ms meanwhile, write the same clock again).
        await eventually(lambda: status_of(admin, job)[0] == "running")
        row = admin.execute(
            "SELECT started_at, updated_at FROM axa_queue WHERE id = %s", (job,)
        ).fetchone()
        assert row == (clock, clock)
        beaten.set()
        await eventually(lambda: status_of(admin, job)[0] == "completed")
    row = admin.execute("SELECT updated_at FROM axa_queue WHERE id = %s", (job,)).fetchone()
    assert row == (clock,)


def ctes(statement: str) -> dict[str, str]:
    """The CTEs of a `WITH RECURSIVE` statement, by name and in order, each as written."""
    assert statement.startswith("WITH RECURSIVE "), statement[:40]
    head = statement.removeprefix("WITH RECURSIVE ").split("\n    )\n    ", 1)[0]
    return {re.split(r"[ (]", cte, maxsplit=1)[0]: cte for cte in head.split("\n    ), ")}


def rows(statement: str) -> str:
    """What a `WITH` statement returns: the SELECTs after its CTEs."""
    return statement.split("\n    )\n    ", 1)[1]


def test_each_exchange_variant_is_made_of_the_same_named_pieces() -> None:
    claim = ["wanted", "levels", "picked", "claimed"]
    shapes = {
        "EXCHANGE": ["endings", "finished", "marked", *claim, "ended"],
        "EXCHANGE_LIMITED": ["endings", "finished", "marked", *claim, "ended"],
        "EXCHANGE_RATED": [
            "endings", "finished", "marked", "gates", *claim, "ended",
            "taken", "stamped",
        ],
        "CLAIM": claim,
    }  # fmt: skip
    parts = {name: ctes(getattr(sql, name)) for name in shapes}
    assert {name: list(found) for name, found in parts.items()} == shapes
    # Every piece is written once: the same text in each variant that has it, but for
    # `wanted` (plain, gated by global limits, behind the rate gates) and the claim's
    # fence against the statement's own endings, which `CLAIM` has none of.
    for piece in ("endings", "finished", "marked", "picked", "claimed", "ended"):
        assert len({found[piece] for found in parts.values() if piece in found}) == 1, piece
    wanted = {name: found["wanted"] for name, found in parts.items()}
    assert wanted["EXCHANGE"] == wanted["CLAIM"] and len(set(wanted.values())) == 3
    assert "axa_queue_room" in wanted["EXCHANGE_LIMITED"]
    assert "axa_queue_rate_slots_free" in parts["EXCHANGE_RATED"]["gates"]
    fenced = {found["levels"] for name, found in parts.items() if name != "CLAIM"}
    assert len(fenced) == 1
    assert parts["CLAIM"]["levels"] == fenced.pop().replace(
        " AND id NOT IN (SELECT id FROM endings)", ""
    )
    assert rows(sql.EXCHANGE) == rows(sql.EXCHANGE_LIMITED)
    assert rows(sql.EXCHANGE_RATED).startswith(rows(sql.EXCHANGE) + "\n    UNION ALL\n    ")
    marks_read = "\n    WHERE (SELECT count(*) FROM marked) >= 0"
    assert rows(sql.EXCHANGE).removesuffix(marks_read).endswith(rows(sql.CLAIM))


def test_the_claim_alone_is_the_exchange_without_its_endings_and_marks() -> None:
    # An idle worker (nothing to record) sends `CLAIM`: the same claim, the same rows,
    # nothing of the endings or the start marks for PostgreSQL to set up.
    for part in ("endings", "finished", "marked", "axa_queue_done"):
        assert part not in sql.CLAIM
    from axa_queue.sql.attempts import ENDED

    ended = "\n    ), " + ENDED.replace("{axa_queue_attempts}", "axa_queue_attempts").replace(
        "{axa_queue}", "axa_queue"
    )
    assert ended in sql.EXCHANGE
    assert sql.CLAIM.split("WITH RECURSIVE wanted AS (")[1] in sql.EXCHANGE.replace(
        ended, ""
    ).replace(" AND id NOT IN (SELECT id FROM endings)", "").replace(
        "\n    WHERE (SELECT count(*) FROM marked) >= 0", ""
    ).replace(
        """    SELECT id, attempts, NULL AS name, NULL AS args, NULL AS max_attempts, NULL AS timeout_ms,
           NULL AS priority, NULL AS run_at, NULL AS trace_context, NULL AS ahead FROM finished
    UNION ALL
""",
        "",
    )


def test_each_exchange_variant_numbered_once_is_the_text_psycopg_would_send_for_it() -> None:
    # The worker sends the exchange through a raw cursor, its parameters numbered once
    # (`sql.numbered`), where psycopg would convert a text this long on every execution:
    # the same `$n` text psycopg makes, each name numbered where it first appears.
    from psycopg._queries import PostgresQuery  # psycopg's own conversion, to compare
    from psycopg.adapt import Transformer

    for name in ("EXCHANGE", "EXCHANGE_LIMITED", "EXCHANGE_RATED", "EXCHANGE_KEYED", "CLAIM"):
        text = getattr(sql, name)
        made = sql.numbered(text)
        first_seen = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", text)))
        assert list(made.names) == first_seen, name
        theirs = PostgresQuery(Transformer())
        theirs.convert(text, dict.fromkeys(made.names))
        assert made.query == theirs.query, name
        assert sql.numbered(text) is made, "numbered once, then taken from the cache"
        schema = sql.in_schema(text, "jobs")
        assert sql.numbered(schema).names == made.names and b'"jobs".axa_queue' in (
            sql.numbered(schema).query
        )
    assert sql.numbered("SELECT '100%%', %(a)s, %(b)s, %(a)s").query == b"SELECT '100%', $1, $2, $1"
    assert sql.numbered("SELECT %(a)s").values({"a": 1, "unused": 2}) == [1]
    for refused in ("SELECT %s", "SELECT %(a)b", "SELECT %(a)t"):
        with pytest.raises(ValueError, match=r"only %\(name\)s placeholders"):
            sql.numbered(refused)
