"""Modes: what queuing a job does, for tests and scripts (`QueueOptions.mode`, else the
`AXA_QUEUE_MODE` variable, else `queue`).

The mode applies, the same way, to every way a `Queue`, a `SyncQueue` or a handler
queues a job on the queue's own connection: `enqueue`, `enqueue_all` and
`perform_later`. `enqueue_on` and `enqueue_all_on` always store their jobs: those
commit (or roll back) with the caller's own work, so a test sees them through
`queue.drain()` and `axa_queue.testing.enqueued`.

- `queue` (the default): store the job; its id is returned.
- `inline`: run the job's registered handler now, in the caller, and raise what it
  raises. Nothing is stored, nothing is retried, and its timeout is not enforced.
- `background`: run it in this process, as a task of the event loop (`Queue`) or in a
  thread (`SyncQueue`); `close()` waits for them. A failure is logged, not raised and
  not retried. Nothing is stored.

An inline or background run gets a `JobContext` (`current_job()`, or the handler's
second parameter) like a worker's run: a fresh id, attempt 1 of the job's
`max_attempts` (else the queue's), and a deadline when the job has a timeout. That id
is what `enqueue` and `perform_later` return: no row has it. The arguments go through
JSON first, as a stored job's would, so a test in inline mode catches arguments that
could not be queued.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import logging
import threading
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID, uuid4

from ..context import JobContext, running_job
from ..errors import OptionsError
from ..handlers.handler import JobHandler
from ..handlers.retries import describe, kind
from ..options import Mode, QueueOptions
from .model import NewJob

__all__ = [
    "InContext",
    "context_of",
    "handler_for",
    "run_blocking",
    "run_here",
    "start_task",
    "start_thread",
]

log = logging.getLogger("axa_queue")


def context_of(job: NewJob, options: QueueOptions) -> JobContext:
    """The context of an inline or background run of `job`: a fresh id, attempt 1 of
    the job's limit (else the queue's), and a deadline when the job has a timeout."""
    timeout = job.timeout_ms()
    return JobContext(
        id=uuid4(),
        name=job.name,
        attempt=1,
        max_attempts=job.max_attempts if job.max_attempts is not None else options.max_attempts,
        deadline=(
            None
            if timeout is None
            else datetime.now(timezone.utc) + timedelta(milliseconds=timeout)
        ),
    )


def handler_for(
    handlers: Mapping[str, JobHandler[Any]], job: NewJob, mode: Mode
) -> JobHandler[Any]:
    """The handler that runs `job` in this process; an `OptionsError` saying what to do
    when there is none."""
    handler = handlers.get(job.name)
    if handler is None:
        raise OptionsError(
            f"the {mode} mode runs a job's handler in this process, and this queue has no "
            f"handler for job {job.name!r}: register one (@queue.handler({job.name!r})), "
            "use the queue the handlers are registered on (a SyncQueue from queue.sync()), "
            "or set mode='queue' to store the job"
        )
    return handler


def _arguments(handler: JobHandler[Any], job: NewJob) -> Any:
    """The handler's argument, round-tripped through JSON as a stored job's would be."""
    return handler.decode(json.loads(job.encoded_args()))


class InContext(Executor):
    """Runs sync handlers in threads of its own, each call in a copy of the caller's
    context, so `current_job()` works in the thread as in a worker's run."""

    def __init__(self) -> None:
        self._threads: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(thread_name_prefix="axa-queue-inline")
            threads = self._threads
        return threads.submit(contextvars.copy_context().run, fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            threads, self._threads = self._threads, None
        if threads is not None:
            threads.shutdown(wait=wait, cancel_futures=cancel_futures)


_IN_CONTEXT = InContext()


async def run_here(handler: JobHandler[Any], job: NewJob, context: JobContext) -> None:
    """Run `job`'s handler once on this event loop (a sync one in a thread, with the
    context), as `context`; raises what it raises."""
    await handler.invoke(_arguments(handler, job), _IN_CONTEXT, context)


def run_blocking(handler: JobHandler[Any], job: NewJob, context: JobContext) -> None:
    """Run `job`'s handler once from synchronous code, as `context`: a sync handler in
    this very thread (so it sees what the caller's thread sees), an async one on an
    event loop of its own; raises what it raises."""
    value = _arguments(handler, job)
    with running_job(context):
        if handler.is_async:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                asyncio.run(handler.invoke(value, job=context))
                return
            raise OptionsError(
                f"job {job.name!r} has an async handler, which synchronous code cannot run "
                "on a thread whose event loop is running: use the async Queue there"
            )
        result = handler(value, context)
        if inspect.isawaitable(result):
            asyncio.run(_awaited(result))


async def _awaited(result: Any) -> None:
    await result


def start_thread(
    handler: JobHandler[Any],
    job: NewJob,
    context: JobContext,
    threads: set[threading.Thread],
) -> None:
    """Run `job`'s handler in a thread of its own (`SyncQueue`'s background mode); a
    failure is logged with the run's id, never its arguments. The thread is in
    `threads` until it ends."""

    def work() -> None:
        try:
            run_blocking(handler, job, context)
        except Exception as error:
            log.error(
                "background job failed: %s %s (%s)",
                job.name,
                context.id,
                kind(error),
                extra={"job": job.name, "job_id": str(context.id), "error": describe(error)},
            )
        finally:
            threads.discard(threading.current_thread())

    thread = threading.Thread(target=work, name=f"axa-queue-bg-{job.name}")
    threads.add(thread)
    thread.start()


def start_task(
    name: str,
    work: Coroutine[Any, Any, Any],
    job_id: UUID | None,
    tasks: set[asyncio.Task[Any]],
) -> None:
    """Run `work`, the run of job `name`, as a task of this event loop (`Queue`'s
    background mode); a failure is logged with the job's id when given, never its
    arguments. The task is in `tasks` until it ends."""

    async def guarded() -> None:
        try:
            await work
        except Exception as error:
            log.error(
                "background job failed: %s (%s)",
                name if job_id is None else f"{name} {job_id}",
                kind(error),
                extra={
                    "job": name,
                    **({} if job_id is None else {"job_id": str(job_id)}),
                    "error": describe(error),
                },
            )

    task = asyncio.get_running_loop().create_task(guarded(), name=f"axa-queue-bg-{name}")
    tasks.add(task)
    task.add_done_callback(tasks.discard)
