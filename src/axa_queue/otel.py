"""OpenTelemetry tracing: a trace that follows a job from where it was queued to its run.

    pip install 'axa-queue[otel]'      # opentelemetry-api; the SDK and exporter are yours

    from axa_queue import otel
    otel.instrument(queue)

Two halves, following the OpenTelemetry messaging semantic conventions:

- **Queuing** (process-wide, through the core's `tracing` hook): every enqueue made
  inside an active span (`Queue.enqueue`, `enqueue_all`, `SyncQueue`, `perform_later`,
  and `enqueue_on` / `enqueue_all_on` on the caller's own connection) gets a PRODUCER
  span `send <job name>`, a child of the active span, and that span's W3C trace
  context (`traceparent`, `tracestate`) is stored with the job in the
  `trace_context` column, never in its arguments. Outside any span nothing is made
  and the column stays NULL, as it does for jobs of schedules and of the Rust crate.
- **Running** (per queue, a middleware, outermost): each run is a CONSUMER span
  `process <job name>`, a child of the stored context (so the request that queued
  the job and every run of it are one trace) with a link to it, as the conventions
  ask of a process span; `instrument(queue, new_trace=True)` starts a new trace for
  each run, linked only. A job with no stored context runs as a root span.
- **Workflows**: a run's span context is written with its ending; a job that depended
  on it (`after=`, a chain's next step, a chord's callback) gets it at its release,
  and its process span links to each parent's run (`messaging.axa_queue.parent`).

This is the only module that imports `opentelemetry`.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from . import __version__, tracing
from .context import JobContext, trace_run
from .errors import OptionsError
from .middleware import CallNext, Middleware
from .queue import Queue

__all__ = ["SYSTEM", "instrument", "uninstrument"]


SYSTEM = "axa_queue"
"""The value of `messaging.system` on every span (a system of our own, as the
conventions allow), and the prefix of the attributes that are ours."""

ATTEMPT = f"messaging.{SYSTEM}.attempt"
"""Which run of the job a process span is: 1 for the first."""
MAX_ATTEMPTS = f"messaging.{SYSTEM}.max_attempts"
"""The limit of runs that applies to the job."""
OUTCOME = f"messaging.{SYSTEM}.outcome"
"""How the handler ended: `completed`, `retried` (it failed; another attempt
follows), `failed` (it failed on its last attempt) or `stopped` (its timeout, a lost
claim or a shutdown cancelled it)."""

PARENT = f"messaging.{SYSTEM}.parent"
"""Set (`true`) on a process span's link to the run of a job it depends on: a chain's
previous step, a chord callback's group members (the first 128), whichever completed
(or, for a dependency that says `run`, ended) in a traced run."""

_instrumented: weakref.WeakKeyDictionary[Queue, Middleware] = weakref.WeakKeyDictionary()
"""The middleware `instrument` registered on each queue."""


def instrument(
    queue: Queue | None = None,
    *,
    tracer_provider: trace.TracerProvider | None = None,
    propagator: TextMapPropagator | None = None,
    new_trace: bool = False,
) -> None:
    """Trace jobs: store the trace context of every enqueue in this process made inside
    a span, and, given a `queue`, make each of its runs a consumer span.

    `tracer_provider` defaults to the global one (the SDK's, once set up);
    `propagator` to W3C Trace Context only (`traceparent`, `tracestate`: never baggage,
    which may hold what the application would not store in a table). `new_trace=True`
    starts each run in a trace of its own, linked to the one that queued it, for jobs
    that run long after the request that queued them. Calling it again replaces the
    earlier settings; the queue's span is its outermost middleware, around any
    registered before.
    """
    if queue is not None and not isinstance(queue, Queue):
        raise OptionsError(
            f"expected instrument() to be given a Queue (whose runs it traces) or nothing, "
            f"got: {type(queue).__name__}; enqueues of every kind (SyncQueue and "
            "enqueue_on too) are traced by instrument() alone"
        )
    tracer = trace.get_tracer("axa_queue", __version__, tracer_provider)
    carriers = propagator if propagator is not None else TraceContextTextMapPropagator()
    tracing.install(_Sender(tracer, carriers))
    if queue is None:
        return
    _remove(queue)
    middleware = _Middleware(tracer, carriers, new_trace)
    queue.registry.middleware.insert(0, middleware)
    _instrumented[queue] = middleware


def uninstrument(queue: Queue | None = None) -> None:
    """Undo `instrument`: given a queue, stop tracing its runs; else stop storing trace
    context on enqueue and stop tracing the runs of every queue instrumented."""
    if queue is not None:
        _remove(queue)
        return
    tracing.install(None)
    for one in list(_instrumented):
        _remove(one)


def _remove(queue: Queue) -> None:
    middleware = _instrumented.pop(queue, None)
    if middleware is not None and middleware in queue.registry.middleware:
        queue.registry.middleware.remove(middleware)


def _error_type(error: BaseException) -> str:
    """`error.type` as the conventions ask: the exception's class, fully named (builtins
    by their plain name)."""
    kind = type(error)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


class _Sending:
    """A producer span around one enqueue statement (`tracing.Sending`)."""

    __slots__ = ("carrier", "span")

    def __init__(self, span: trace.Span, carrier: str) -> None:
        self.span = span
        self.carrier = carrier

    def end(self, error: BaseException | None) -> None:
        if error is not None:
            # A database error's text can quote the row's data: only its class is kept.
            self.span.set_attribute("error.type", _error_type(error))
            self.span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        self.span.end()


class _Sender:
    """The queuing half (`tracing.Sender`): a producer span and its stored context for
    each enqueue made inside a span; nothing outside one."""

    __slots__ = ("propagator", "tracer")

    def __init__(self, tracer: trace.Tracer, propagator: TextMapPropagator) -> None:
        self.tracer = tracer
        self.propagator = propagator

    def __call__(self, names: Sequence[str], ids: Sequence[UUID]) -> _Sending | None:
        if not trace.get_current_span().get_span_context().is_valid:
            return None  # no trace to follow: the job stores none
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
        }
        destination = names[0] if all(name == names[0] for name in names) else None
        if destination is not None:
            attributes["messaging.destination.name"] = destination
        if len(ids) == 1:
            attributes["messaging.message.id"] = str(ids[0])
        else:
            attributes["messaging.batch.message_count"] = len(ids)
        span = self.tracer.start_span(
            "send" if destination is None else f"send {destination}",
            kind=SpanKind.PRODUCER,
            attributes=attributes,
        )
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, context=trace.set_span_in_context(span))
        return _Sending(span, json.dumps(carrier, separators=(",", ":")))


class _Middleware:
    """The running half: each run a consumer span, around the rest of the chain."""

    __slots__ = ("new_trace", "propagator", "tracer")

    def __init__(
        self, tracer: trace.Tracer, propagator: TextMapPropagator, new_trace: bool
    ) -> None:
        self.tracer = tracer
        self.propagator = propagator
        self.new_trace = new_trace

    def __repr__(self) -> str:
        return f"<axa_queue.otel middleware new_trace={self.new_trace}>"

    async def __call__(self, job: JobContext, call_next: CallNext) -> Any:
        parent = Context()  # a root span unless the job stored a context to follow
        links: list[Link] = []
        if job.trace_context is not None:
            stored = self.propagator.extract(job.trace_context)
            queued = trace.get_current_span(stored).get_span_context()
            if queued.is_valid:
                links.append(Link(queued))
                if not self.new_trace:
                    parent = stored
        for parent_run in job.parent_traces:
            ran = trace.get_current_span(self.propagator.extract(parent_run)).get_span_context()
            if ran.is_valid:
                links.append(Link(ran, {PARENT: True}))
        span = self.tracer.start_span(
            f"process {job.name}",
            context=parent,
            kind=SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": job.name,
                "messaging.message.id": str(job.id),
                ATTEMPT: job.attempt,
                MAX_ATTEMPTS: job.max_attempts,
            },
        )
        this_run: dict[str, str] = {}
        self.propagator.inject(this_run, context=trace.set_span_in_context(span))
        if this_run:  # the dependents' spans link to this one (`JobContext.parent_traces`)
            trace_run(job, json.dumps(this_run, separators=(",", ":")))
        with trace.use_span(
            span, end_on_exit=True, record_exception=False, set_status_on_exception=False
        ):
            try:
                value = await call_next()
            except BaseException as error:
                if isinstance(error, Exception):
                    outcome = "failed" if job.is_last_attempt else "retried"
                else:  # CancelledError: its timeout, a lost claim, or a shutdown
                    outcome = "stopped"
                span.set_attribute(OUTCOME, outcome)
                span.set_attribute("error.type", _error_type(error))
                span.record_exception(error, escaped=True)
                text = str(error)
                kind = type(error).__name__
                span.set_status(Status(StatusCode.ERROR, f"{kind}: {text}" if text else kind))
                raise
            span.set_attribute(OUTCOME, "completed")
            return value
