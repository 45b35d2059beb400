"""Tracing with OpenTelemetry: the trace context an enqueue stores, and the span of a run,
checked with the SDK's in-memory exporter, within a process and across processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, Tracer
from psycopg.types.json import Jsonb

import seed_crate as crate
from axa_queue import (
    JobContext,
    NewJob,
    OptionsError,
    Queue,
    Schedule,
    SyncQueue,
    chain,
    chord,
    current_job,
    enqueue_all_on,
    enqueue_on,
    group,
    otel,
    tracing,
)
from axa_queue.jobs.enqueue import COPY_FROM
from conftest import eventually, running, status_of


class Traced:
    """An SDK of the test's own (never the global one), its in-memory exporter, and a
    tracer for the application's own spans."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer: Tracer = self.provider.get_tracer("the-app")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        found = list(self.exporter.get_finished_spans())
        return found if name is None else [s for s in found if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.spans(name)
        assert len(found) == 1, [s.name for s in self.spans()]
        return found[0]


@pytest.fixture
def traced() -> Iterator[Traced]:
    """The SDK set up, the enqueue hook installed; every hook removed afterwards."""
    found = Traced()
    otel.instrument(tracer_provider=found.provider)
    yield found
    otel.uninstrument()
    found.provider.shutdown()


def stored(admin: psycopg.Connection[Any], job_id: UUID) -> Any:
    row = admin.execute("SELECT trace_context, args FROM axa_queue WHERE id = %s", (job_id,))
    found = row.fetchone()
    assert found is not None
    return found


def traceparent(span: ReadableSpan) -> str:
    """The W3C `traceparent` of `span`."""
    assert span.context is not None
    found = span.context
    return f"00-{found.trace_id:032x}-{found.span_id:016x}-{int(found.trace_flags):02x}"


# --- queuing -------------------------------------------------------------------------


async def test_an_enqueue_inside_a_span_stores_the_context_of_its_send_span_and_not_in_the_args(
    make_queue: Callable[..., Awaitable[Queue]], admin: psycopg.Connection[Any], traced: Traced
) -> None:
    queue = await make_queue()
    with traced.tracer.start_as_current_span("POST /orders", kind=SpanKind.SERVER) as request:
        job_id = await queue.enqueue("Receipt", {"order": 7})
    context, args = stored(admin, job_id)
    assert args == {"order": 7}
    send = traced.one("send Receipt")
    assert send.kind is SpanKind.PRODUCER
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id
    assert context == {"traceparent": traceparent(send)}
    assert dict(send.attributes or {}) == {
        "messaging.system": "axa_queue",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "Receipt",
        "messaging.message.id": str(job_id),
    }


async def test_every_way_of_queuing_inside_a_span_stores_the_trace_context(
    make_queue: Callable[..., Awaitable[Queue]],
    admin: psycopg.Connection[Any],
    dsn: str,
    traced: Traced,
) -> None:
    queue = await make_queue()

    @queue.handler("Later")
    async def later(args: dict[str, int]) -> None:
        pass

    sync = queue.sync()
    ids: list[UUID] = []
    with traced.tracer.start_as_current_span("request") as request:
        ids.append(await queue.enqueue("One"))
        ids.extend(await queue.enqueue_all([NewJob("Many"), NewJob("Many")]))
        ids.extend(await queue.enqueue_all([NewJob("Copied")] * COPY_FROM))  # by COPY
        performed = await later.perform_later({"n": 1})
        assert performed is not None
        ids.append(performed)
        ids.append(await asyncio.to_thread(sync.enqueue, "Sync"))
        ids.extend(await asyncio.to_thread(sync.enqueue_all, [NewJob("SyncMany")]))
        async with await psycopg.AsyncConnection.connect(dsn) as aconn, aconn.transaction():
            ids.append(await enqueue_on(aconn, NewJob("OnAsync")))
        with psycopg.connect(dsn) as conn, conn.transaction():
            ids.append(enqueue_on(conn, NewJob("OnSync")))
            ids.extend(enqueue_all_on(conn, [NewJob("OnMany"), NewJob("OnManyToo")]))
            ids.extend(enqueue_all_on(conn, [NewJob("OnCopied")] * COPY_FROM))
    sync.close()
    trace_id = f"{request.get_span_context().trace_id:032x}"
    for job_id in ids:
        context, _ = stored(admin, job_id)
        assert context["traceparent"].split("-")[1] == trace_id, job_id
    names = sorted(s.name for s in traced.spans() if s.kind is SpanKind.PRODUCER)
    assert names == [
        "send",  # two names in one statement: no single destination
        "send Copied",
        "send Later",
        "send Many",
        "send OnAsync",
        "send OnCopied",
        "send OnSync",
        "send One",
        "send Sync",
        "send SyncMany",
    ]
    batch = traced.one("send Many")
    assert (batch.attributes or {})["messaging.batch.message_count"] == 2
    assert "messaging.message.id" not in (batch.attributes or {})


async def test_an_enqueue_outside_any_span_stores_no_context_and_makes_no_span(
    make_queue: Callable[..., Awaitable[Queue]], admin: psycopg.Connection[Any], traced: Traced
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Receipt")
    assert stored(admin, job_id)[0] is None
    assert traced.spans() == []


async def test_without_instrumentation_an_enqueue_in_a_span_stores_no_context(
    make_queue: Callable[..., Awaitable[Queue]], admin: psycopg.Connection[Any]
) -> None:
    app = Traced()
    queue = await make_queue()
    with app.tracer.start_as_current_span("request"):
        job_id = await queue.enqueue("Receipt")
    assert tracing.sender is None
    assert stored(admin, job_id)[0] is None


async def test_a_failed_enqueue_ends_its_send_span_with_an_error_naming_no_value(
    dsn: str, make_queue: Callable[..., Awaitable[Queue]], traced: Traced
) -> None:
    await make_queue()  # the tables
    with psycopg.connect(dsn) as conn, traced.tracer.start_as_current_span("request"):
        with contextlib.suppress(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")  # the caller's transaction is aborted
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            enqueue_on(conn, NewJob("Receipt", {"card": "4111 1111 1111 1111"}))
    send = traced.one("send Receipt")
    assert send.status.status_code is StatusCode.ERROR
    assert (send.attributes or {})["error.type"] == "psycopg.errors.InFailedSqlTransaction"
    assert "4111" not in json.dumps(send.to_json())


def test_an_enqueue_on_something_not_a_connection_ends_its_send_span(traced: Traced) -> None:
    with traced.tracer.start_as_current_span("request"), pytest.raises(TypeError):
        enqueue_on(object(), NewJob("Receipt"))  # type: ignore[call-overload]
    assert traced.one("send Receipt").status.status_code is StatusCode.ERROR


def test_a_keyed_enqueue_on_something_not_a_connection_ends_its_send_span(
    traced: Traced,
) -> None:
    with traced.tracer.start_as_current_span("request"), pytest.raises(TypeError):
        enqueue_on(object(), NewJob("Receipt", unique_key="receipt:1"))  # type: ignore[call-overload]
    assert traced.one("send Receipt").status.status_code is StatusCode.ERROR


async def test_a_schedules_job_stores_no_trace_context(
    make_queue: Callable[..., Awaitable[Queue]], admin: psycopg.Connection[Any], traced: Traced
) -> None:
    queue = await make_queue()
    queue.schedule(Schedule("nightly", timedelta(minutes=1), NewJob("Report")))
    with traced.tracer.start_as_current_span("tick"):
        assert await queue.tick_schedules() == 1
    row = admin.execute("SELECT trace_context FROM axa_queue WHERE name = 'Report'").fetchone()
    assert row == (None,)


def test_a_stored_context_is_read_back_only_as_a_carrier_of_strings() -> None:
    assert tracing.carrier_of(None) is None
    assert tracing.carrier_of("not json") is None
    assert tracing.carrier_of("[1, 2]") is None
    assert tracing.carrier_of("{}") is None
    assert tracing.carrier_of('{"traceparent": "00-a-b-01", "n": 1}') == {
        "traceparent": "00-a-b-01"
    }


# --- running -------------------------------------------------------------------------


@pytest.fixture
async def instrumented(
    make_queue: Callable[..., Awaitable[Queue]], traced: Traced
) -> tuple[Queue, Traced]:
    """A queue whose runs are traced (and enqueues, through `traced`)."""
    queue = await make_queue()
    otel.instrument(queue, tracer_provider=traced.provider)
    return queue, traced


async def run_until(
    queue: Queue, admin: psycopg.Connection[Any], job_id: UUID, status: str
) -> None:
    async with running(queue):
        await eventually(lambda: status_of(admin, job_id)[0] == status)


async def test_a_run_is_a_consumer_span_in_the_trace_that_queued_it_linked_to_its_send_span(
    instrumented: tuple[Queue, Traced], admin: psycopg.Connection[Any]
) -> None:
    queue, traced = instrumented
    seen: list[JobContext] = []

    @queue.handler("Receipt")
    async def receipt(args: dict[str, int]) -> None:
        seen.append(current_job())
        with traced.tracer.start_as_current_span("render"):
            pass

    with traced.tracer.start_as_current_span("POST /orders", kind=SpanKind.SERVER) as request:
        job_id = await queue.enqueue("Receipt", {"order": 7})
    await run_until(queue, admin, job_id, "completed")

    send, run, render = (
        traced.one("send Receipt"),
        traced.one("process Receipt"),
        traced.one("render"),
    )
    assert run.kind is SpanKind.CONSUMER
    assert run.context is not None and send.context is not None and render.context is not None
    assert run.context.trace_id == request.get_span_context().trace_id
    assert run.parent is not None and run.parent.span_id == send.context.span_id
    assert [link.context.span_id for link in run.links] == [send.context.span_id]
    assert render.parent is not None and render.parent.span_id == run.context.span_id
    assert run.status.status_code is StatusCode.UNSET
    assert dict(run.attributes or {}) == {
        "messaging.system": "axa_queue",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "Receipt",
        "messaging.message.id": str(job_id),
        "messaging.axa_queue.attempt": 1,
        "messaging.axa_queue.max_attempts": queue.options.max_attempts,
        "messaging.axa_queue.outcome": "completed",
    }
    assert seen[0].trace_context == {"traceparent": traceparent(send)}
    assert "order" not in json.dumps(run.to_json())


async def test_a_sync_handlers_own_spans_in_its_thread_are_children_of_the_run(
    instrumented: tuple[Queue, Traced], admin: psycopg.Connection[Any]
) -> None:
    queue, traced = instrumented

    @queue.handler("Resize")
    def resize(args: dict[str, int]) -> None:
        with traced.tracer.start_as_current_span("pillow"):
            pass

    with traced.tracer.start_as_current_span("upload"):
        job_id = await queue.enqueue("Resize", {})
    await run_until(queue, admin, job_id, "completed")
    run, pillow = traced.one("process Resize"), traced.one("pillow")
    assert run.context is not None
    assert pillow.parent is not None and pillow.parent.span_id == run.context.span_id


async def test_a_failing_run_records_its_exception_and_every_attempt_joins_the_trace(
    instrumented: tuple[Queue, Traced], admin: psycopg.Connection[Any]
) -> None:
    queue, traced = instrumented

    @queue.handler("Charge")
    async def charge(args: dict[str, int]) -> None:
        raise ValueError("card declined")

    with traced.tracer.start_as_current_span("checkout"):
        job_id = await queue.enqueue("Charge", {}, max_attempts=2)
    await run_until(queue, admin, job_id, "failed")
    send = traced.one("send Charge")
    runs = sorted(traced.spans("process Charge"), key=lambda s: s.start_time or 0)
    assert [(s.attributes or {})["messaging.axa_queue.outcome"] for s in runs] == [
        "retried",
        "failed",
    ]
    assert send.context is not None
    for attempt, run in enumerate(runs, start=1):
        assert (run.attributes or {})["messaging.axa_queue.attempt"] == attempt
        assert run.parent is not None and run.parent.span_id == send.context.span_id
        assert run.status.status_code is StatusCode.ERROR
        assert run.status.description == "ValueError: card declined"
        assert (run.attributes or {})["error.type"] == "ValueError"
        [event] = run.events
        assert event.name == "exception"
        assert (event.attributes or {})["exception.type"] == "ValueError"
        assert (event.attributes or {})["exception.message"] == "card declined"


async def test_a_run_its_timeout_stops_ends_its_span_as_stopped(
    instrumented: tuple[Queue, Traced], admin: psycopg.Connection[Any]
) -> None:
    queue, traced = instrumented
    started = asyncio.Event()

    @queue.handler("Slow")
    async def slow(args: dict[str, int]) -> None:
        started.set()
        await asyncio.Event().wait()  # until its timeout cancels it

    job_id = await queue.enqueue("Slow", {}, timeout=0.2, max_attempts=1)
    await run_until(queue, admin, job_id, "failed")
    run = traced.one("process Slow")
    assert started.is_set()
    assert (run.attributes or {})["messaging.axa_queue.outcome"] == "stopped"
    assert (run.attributes or {})["error.type"] == "asyncio.exceptions.CancelledError"
    assert run.status.status_code is StatusCode.ERROR


async def test_a_job_the_crate_queued_runs_as_a_root_consumer_span_without_error(
    instrumented: tuple[Queue, Traced], admin: psycopg.Connection[Any]
) -> None:
    queue, traced = instrumented
    seen: list[JobContext] = []

    @queue.handler("FromRust")
    async def from_rust(args: dict[str, int]) -> None:
        seen.append(current_job())

    job_id = uuid4()
    admin.execute(
        crate.ENQUEUE, crate.params(job_id, "FromRust", Jsonb({}), None, 0, None, 0.0, None)
    )
    await run_until(queue, admin, job_id, "completed")
    run = traced.one("process FromRust")
    assert run.parent is None and list(run.links) == []
    assert run.status.status_code is StatusCode.UNSET
    assert (run.attributes or {})["messaging.axa_queue.outcome"] == "completed"
    assert seen[0].trace_context is None


@pytest.mark.parametrize("written", ['{"traceparent": "00-junk-01"}', "[1, 2]", '"text"'])
async def test_a_trace_context_written_by_hand_that_is_not_one_starts_a_root_span(
    instrumented: tuple[Queue, Traced], admin: psycopg.Connection[Any], written: str
) -> None:
    queue, traced = instrumented

    @queue.handler("Odd")
    async def odd(args: dict[str, int]) -> None:
        pass

    job_id = await queue.enqueue("Odd")
    admin.execute("UPDATE axa_queue SET trace_context = %s::jsonb WHERE id = %s", (written, job_id))
    await run_until(queue, admin, job_id, "completed")
    run = traced.one("process Odd")
    assert run.parent is None and list(run.links) == []


async def test_with_new_trace_a_run_starts_a_trace_of_its_own_linked_to_its_send_span(
    make_queue: Callable[..., Awaitable[Queue]], admin: psycopg.Connection[Any], traced: Traced
) -> None:
    queue = await make_queue()
    otel.instrument(queue, tracer_provider=traced.provider, new_trace=True)

    @queue.handler("Digest")
    async def digest(args: dict[str, int]) -> None:
        pass

    with traced.tracer.start_as_current_span("subscribe"):
        job_id = await queue.enqueue("Digest")
    await run_until(queue, admin, job_id, "completed")
    send, run = traced.one("send Digest"), traced.one("process Digest")
    assert run.context is not None and send.context is not None
    assert run.parent is None
    assert run.context.trace_id != send.context.trace_id
    assert [link.context.span_id for link in run.links] == [send.context.span_id]


# --- workflows: a dependent's span links to its parents' runs -------------------------


def parent_links(span: ReadableSpan) -> list[int]:
    """The span ids `span` links to as its parents' runs, in order."""
    return [
        link.context.span_id
        for link in span.links
        if (link.attributes or {}).get(otel.PARENT) is True
    ]


async def test_a_chains_next_step_links_to_the_run_of_the_step_before_it(
    instrumented: tuple[Queue, Traced], admin: psycopg.Connection[Any]
) -> None:
    queue, traced = instrumented
    seen: dict[str, JobContext] = {}

    @queue.handler("Fetch")
    async def fetch(args: dict[str, Any]) -> int:
        seen["Fetch"] = current_job()
        return 1

    @queue.handler("Store")
    def store(args: dict[str, Any]) -> None:  # sync: the links are made around its thread
        seen["Store"] = current_job()

    with traced.tracer.start_as_current_span("import"):
        flow = await queue.enqueue(chain(NewJob("Fetch", {"secret": "s"}), NewJob("Store")))
    await run_until(queue, admin, flow.jobs[1], "completed")

    fetched, stored_run = traced.one("process Fetch"), traced.one("process Store")
    send = traced.one("send")
    assert fetched.context is not None and stored_run.context is not None
    assert send.context is not None
    assert parent_links(fetched) == []
    assert parent_links(stored_run) == [fetched.context.span_id]
    assert stored_run.parent is not None and stored_run.parent.span_id == send.context.span_id
    assert seen["Store"].parent_traces == ({"traceparent": traceparent(fetched)},)
    row = admin.execute(
        "SELECT trace_context, run_trace FROM axa_queue WHERE id = %s", (flow.jobs[1],)
    ).fetchone()
    assert row is not None
    assert row[0] == {
        "traceparent": traceparent(send),
        "links": [{"traceparent": traceparent(fetched)}],
    }
    assert row[1] == {"traceparent": traceparent(stored_run)}
    assert "secret" not in json.dumps([span.to_json() for span in traced.spans()])


async def test_a_chords_callback_links_to_every_member_of_its_group_in_group_order(
    instrumented: tuple[Queue, Traced], admin: psycopg.Connection[Any]
) -> None:
    queue, traced = instrumented

    @queue.handler("Part")
    async def part(args: dict[str, int]) -> int:
        return args["n"]

    @queue.handler("Sum")
    async def total(args: dict[str, Any]) -> None:
        pass

    flow = await queue.enqueue(
        chord(group([NewJob("Part", {"n": n}) for n in range(5)]), NewJob("Sum"))
    )  # outside any span: the callback's context holds the links alone
    await run_until(queue, admin, flow.jobs[-1], "completed")

    parts = {
        span.attributes["messaging.message.id"]: span  # type: ignore[index]
        for span in traced.spans("process Part")
    }
    callback = traced.one("process Sum")
    expected = [parts[str(job_id)].context.span_id for job_id in flow.jobs[:-1]]  # type: ignore[union-attr]
    assert parent_links(callback) == expected
    assert callback.parent is None  # no trace queued it: a root span, linked


async def test_the_links_a_release_writes_are_the_first_128_parents_in_dependency_order(
    make_queue: Callable[..., Awaitable[Queue]], admin: psycopg.Connection[Any]
) -> None:
    queue = await make_queue()
    flow = await queue.enqueue(
        chord(group([NewJob("Part", {"n": n}) for n in range(130)]), NewJob("Sum"))
    )
    parents = flow.jobs[:-1]
    carriers = [{"traceparent": f"00-{n + 1:032x}-{n + 1:016x}-01"} for n in range(len(parents))]
    admin.execute(
        "UPDATE axa_queue SET status = 'running', attempts = 1, started_at = now() "
        "WHERE id = ANY(%s)",
        (list(parents),),
    )
    # The parents end in reverse order, in two statements, as any worker's ending would.
    for batch in (parents[:64], parents[64:]):
        admin.execute(
            "UPDATE axa_queue q SET status = 'completed', run_trace = t.trace "
            "FROM unnest(%s::uuid[], %s::jsonb[]) AS t(id, trace) WHERE q.id = t.id",
            (list(batch), [Jsonb(carriers[parents.index(i)]) for i in batch]),
        )
    state, context = admin.execute(
        "SELECT status, trace_context FROM axa_queue WHERE id = %s", (flow.jobs[-1],)
    ).fetchone() or (None, None)
    assert state == "queued"
    assert context == {"links": carriers[:128]}


async def test_parents_run_without_tracing_leave_their_dependent_without_links(
    make_queue: Callable[..., Awaitable[Queue]], admin: psycopg.Connection[Any]
) -> None:
    queue = await make_queue()
    seen: list[JobContext] = []

    @queue.handler("Fetch")
    async def fetch(args: dict[str, Any]) -> None:
        pass

    @queue.handler("Store")
    async def store(args: dict[str, Any]) -> None:
        seen.append(current_job())

    flow = await queue.enqueue(chain(NewJob("Fetch"), NewJob("Store")))
    await run_until(queue, admin, flow.jobs[1], "completed")
    assert seen[0].parent_traces == ()
    assert stored(admin, flow.jobs[1])[0] is None
    row = admin.execute(
        "SELECT count(*) FILTER (WHERE run_trace IS NOT NULL) FROM axa_queue"
    ).fetchone()
    assert row == (0,)


def test_a_stored_contexts_links_are_read_back_only_as_carriers_of_strings() -> None:
    assert tracing.links_of(None) == ()
    assert tracing.links_of('{"traceparent": "x"}') == ()
    assert tracing.links_of('{"links": "no"}') == ()
    assert tracing.links_of('["links"]') == ()
    assert tracing.links_of('{"links": [1, {"traceparent": "a", "n": 2}, {}, {"b": "c"}]}') == (
        {"traceparent": "a"},
        {"b": "c"},
    )
    assert tracing.links_of('{"links": [') == ()


async def test_instrument_twice_keeps_one_span_outermost_and_uninstrument_removes_it(
    instrumented: tuple[Queue, Traced], admin: psycopg.Connection[Any]
) -> None:
    queue, traced = instrumented
    order: list[str] = []

    @queue.middleware
    async def inner(job: JobContext, call_next: Any) -> Any:
        order.append("inner")
        return await call_next()

    otel.instrument(queue, tracer_provider=traced.provider)
    assert len(queue.registry.middleware) == 2
    assert queue.registry.middleware[1] is inner

    @queue.handler("Ping")
    async def ping(args: dict[str, int]) -> None:
        pass

    otel.uninstrument(queue)
    assert queue.registry.middleware == [inner]
    assert tracing.sender is not None  # the enqueue hook stays until uninstrument()
    job_id = await queue.enqueue("Ping")
    await run_until(queue, admin, job_id, "completed")
    assert traced.spans("process Ping") == [] and order == ["inner"]
    otel.uninstrument()
    assert tracing.sender is None


# --- across processes ----------------------------------------------------------------

WORKER = '''
"""A worker process with an SDK of its own: runs one job, then prints its spans as JSON."""
import asyncio
import json
import sys

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from axa_queue import Queue, QueueOptions, otel

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))


async def main() -> None:
    queue = Queue(sys.argv[1], QueueOptions(poll_interval=0.05))
    otel.instrument(queue, tracer_provider=provider)
    stop = asyncio.Event()

    @queue.handler("SendReceipt")
    async def send_receipt(args):
        with provider.get_tracer("mailer").start_as_current_span("smtp"):
            pass
        stop.set()

    async with queue:
        await queue.run(stop)


asyncio.run(main())
print(json.dumps([
    {
        "name": s.name,
        "kind": s.kind.name,
        "trace_id": s.context.trace_id,
        "span_id": s.context.span_id,
        "parent": s.parent.span_id if s.parent else None,
        "links": [link.context.span_id for link in s.links],
    }
    for s in exporter.get_finished_spans()
]))
'''


async def test_one_trace_runs_from_an_http_request_through_enqueue_on_to_a_run_in_another_process(
    make_queue: Callable[..., Awaitable[Queue]],
    admin: psycopg.Connection[Any],
    dsn: str,
    traced: Traced,
    tmp_path: Path,
) -> None:
    await make_queue()  # the tables
    admin.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    with traced.tracer.start_as_current_span("POST /orders", kind=SpanKind.SERVER) as request:
        # The view's own write and its job commit together, on its own connection.
        async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
            await conn.execute("INSERT INTO orders (id) VALUES (7)")
            job_id = await enqueue_on(conn, NewJob("SendReceipt", {"order": 7}))
    send = traced.one("send SendReceipt")
    assert send.context is not None

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        dsn,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode(errors="replace")
    spans = {span["name"]: span for span in json.loads(out)}
    run, smtp = spans["process SendReceipt"], spans["smtp"]
    assert status_of(admin, job_id)[0] == "completed"
    assert run["kind"] == "CONSUMER"
    assert run["trace_id"] == request.get_span_context().trace_id == smtp["trace_id"]
    assert run["parent"] == send.context.span_id
    assert run["links"] == [send.context.span_id]
    assert smtp["parent"] == run["span_id"]


# --- the optional dependency ----------------------------------------------------------


def test_only_the_otel_module_imports_opentelemetry_and_the_package_works_without_it() -> None:
    source = Path(otel.__file__).parent
    importing = sorted(
        str(path.relative_to(source))
        for path in source.rglob("*.py")
        if re.search(r"^\s*(import|from) opentelemetry", path.read_text("utf-8"), re.MULTILINE)
    )
    assert importing == ["otel.py"]
    probe = (
        "import sys, axa_queue, axa_queue.cli; "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_instrument_given_something_not_a_queue_says_what_it_takes(dsn: str) -> None:
    with pytest.raises(
        OptionsError, match=r"given a Queue .* got: SyncQueue; .*instrument\(\) alone"
    ):
        otel.instrument(SyncQueue(dsn))  # type: ignore[arg-type]
    assert tracing.sender is None
