"""Tracing with OpenTelemetry: the trace context an enqueue stores, and the span of a run,
checked with the SDK's in-memory exporter, within a process and across processes."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, Tracer
from psycopg.types.json import Jsonb

import seed_crate as crate
from axa_queue import JobContext, NewJob, Queue, Schedule, current_job, enqueue_all_on, enqueue_on
from axa_queue import otel, tracing
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
        performed = await later.perform_later({"n": 1})
        assert performed is not None
        ids.append(performed)
        ids.append(await asyncio.to_thread(sync.enqueue, "Sync"))
        ids.extend(await asyncio.to_thread(sync.enqueue_all, [NewJob("SyncMany")]))
        async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
            ids.append(await enqueue_on(conn, NewJob("OnAsync")))
        with psycopg.connect(dsn) as conn, conn.transaction():
            ids.append(enqueue_on(conn, NewJob("OnSync")))
            ids.extend(enqueue_all_on(conn, [NewJob("OnMany"), NewJob("OnManyToo")]))
    sync.close()
    trace_id = f"{request.get_span_context().trace_id:032x}"
    for job_id in ids:
        context, _ = stored(admin, job_id)
        assert context["traceparent"].split("-")[1] == trace_id, job_id
    names = sorted(s.name for s in traced.spans() if s.kind is SpanKind.PRODUCER)
    assert names == [
        "send",  # two names in one statement: no single destination
        "send Later",
        "send Many",
        "send OnAsync",
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
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            try:
                conn.execute("SELECT 1/0")
            except psycopg.errors.DivisionByZero:
                pass
            enqueue_on(conn, NewJob("Receipt", {"card": "4111 1111 1111 1111"}))
    send = traced.one("send Receipt")
    assert send.status.status_code is StatusCode.ERROR
    assert (send.attributes or {})["error.type"] == "psycopg.errors.InFailedSqlTransaction"
    assert "4111" not in json.dumps(send.to_json())


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
