"""What `manage.py axa_queue worker` runs: a queue with Django's connection handling
(`use_django`) and a handler for each task of the tasks backend (`tasks_queue`).

`axa_queue.contrib.django.worker:queue` is that queue, made on first access: the
application's own (`AXA_QUEUE["QUEUE"]`) or a new one on the settings' database and
options, with every task found in the installed apps' `tasks` modules (see
`AXA_QUEUE["TASK_MODULES"]`) registered under its module path.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections
from django.utils.module_loading import autodiscover_modules

from ... import JobContext, Queue
from ...handlers.handler import JobHandler
from ...handlers.retries import describe
from ...middleware import CallNext
from . import conf
from .backend import known_tasks, runner

__all__ = ["TARGET", "tasks_queue", "use_django"]

log = logging.getLogger("axa_queue.worker")

TARGET = "axa_queue.contrib.django.worker:queue"
"""The queue `manage.py axa_queue worker` runs when given no MODULE:ATTR."""


def _close_all() -> None:
    connections.close_all()  # this thread's connections: Django keeps them per thread


class _AsyncRuns:
    """The middleware of `use_django`: around each run of an async handler,
    `close_old_connections()` in the thread Django's ORM calls of async code run in
    (`sync_to_async`'s, which the ORM's `a...` methods use too), as Django's own async
    request handling does. Runs of sync handlers pass through: their thread's hooks do
    it there."""

    def __init__(self, handlers: dict[str, JobHandler[Any]]) -> None:
        self.handlers = handlers  # the queue's, as it is when each run starts

    async def __call__(self, job: JobContext, call_next: CallNext) -> Any:
        handler = self.handlers.get(job.name)
        if handler is None or not handler.is_async:
            return await call_next()
        await _close_old_async()  # what it raises fails the run, as a thread hook's does
        try:
            return await call_next()
        finally:
            try:
                await _close_old_async()
            except Exception as error:
                log.error(
                    "closing Django's old connections failed after an async run",
                    extra={"error": describe(error)},
                )


_close_old_async = sync_to_async(close_old_connections)


def use_django(queue: Queue) -> Queue:
    """Run `queue`'s handlers as Django runs a request: `close_old_connections()` before
    and after each run, in the thread that ran it (so a connection past `CONN_MAX_AGE`,
    or broken, is not reused, and with the default of 0 none is kept), and every
    connection of a job thread closed when it ends. A sync handler runs in a job
    thread; an async one on the event loop, where Django's ORM is called through its
    `a...` methods or `sync_to_async`, whose thread is the one closed around its runs.
    Returns `queue`; calling it again changes nothing."""
    hooks = queue.registry.threads
    if close_old_connections not in hooks.around_run:
        hooks.around_run.append(close_old_connections)
    if _close_all not in hooks.thread_end:
        hooks.thread_end.append(_close_all)
    if not any(isinstance(one, _AsyncRuns) for one in queue.registry.middleware):
        queue.middleware(_AsyncRuns(queue.handlers))
    return queue


def tasks_queue() -> Queue:
    """The queue a worker runs for the tasks backend: `AXA_QUEUE["QUEUE"]`, else one
    made of the settings, with `use_django`, and a handler for every task found."""
    target = conf.queue_target()
    if target is not None:
        from ...cli.run import load_queue

        queue = load_queue(target)
    else:
        queue = Queue(conf.dsn(), conf.queue_options())
    for module in conf.task_modules():
        autodiscover_modules(module)
    for path, task in sorted(known_tasks.items()):
        if path not in queue.handlers:
            queue.handle(path, runner(task))
    return use_django(queue)


_made: dict[str, Queue] = {}
_lock = threading.Lock()


def __getattr__(name: str) -> Any:
    if name == "queue":
        with _lock:
            if "queue" not in _made:
                _made["queue"] = tasks_queue()
            return _made["queue"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
