"""The threads sync handlers run in (`JobThreads`)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from queue import SimpleQueue
from typing import Any

from ..context import JobContext, running_or_none
from ..handlers.registry import ThreadHooks
from ..handlers.retries import describe, kind

__all__ = ["JobThreads"]

log = logging.getLogger("axa_queue.worker")


class JobThreads(Executor):
    """The threads sync handlers run in: like `ThreadPoolExecutor`, but its threads are
    daemons, so a handler still running when the worker stops (a thread cannot be
    stopped; its job is left to stale recovery) does not keep the process alive: the
    standard pool's threads are joined at exit, which made a stop hang until the
    handler returned.

    `hooks` (the registry's) are called in each thread around each run and as the
    thread ends: see `ThreadHooks`.

    Each call submitted is kept with the run it was submitted for (the current job of
    the caller) until it returns, so a stop can wait for the handlers still running in
    their threads after their run was stopped (`wait`) and say which ones (`running`)."""

    def __init__(self, max_workers: int, name: str, hooks: ThreadHooks | None = None) -> None:
        self._max = max_workers
        self._name = name
        self._hooks = hooks if hooks is not None else ThreadHooks()
        self._work: SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None]
        self._work = SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._shut = False
        self._calls: dict[Future[Any], JobContext | None] = {}
        """The calls submitted that have not returned, with the run of each."""
        self._calls_lock = threading.Lock()  # not `_lock`: `shutdown` cancels calls under it

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot run a sync handler: the worker has stopped")
            future: Future[Any] = Future()
            with self._calls_lock:
                self._calls[future] = running_or_none()
            future.add_done_callback(self._returned)
            call = fn if not kwargs else (lambda *a: fn(*a, **kwargs))
            self._work.put((future, call, args))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._max:
                thread = threading.Thread(
                    target=self._serve, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                thread.start()
                self._threads.append(thread)
            return future

    def _returned(self, future: Future[Any]) -> None:
        with self._calls_lock:
            self._calls.pop(future, None)

    def running(self) -> list[JobContext]:
        """The runs whose handler is running in a thread now, oldest first (a call made
        outside a run is waited for by `wait`, but has no run to name)."""
        with self._calls_lock:
            calls = list(self._calls.items())
        return [job for future, job in calls if job is not None and future.running()]

    async def wait(self, deadline: float | None) -> None:
        """Wait until every handler running in a thread now has returned, or until
        `deadline` (monotonic; `None`: for as long as they take). A worker stopping
        calls it once its runs are over: a sync handler whose run was stopped (its job
        cancelled, its timeout, its claim lost) runs on in its thread until it returns,
        and its cleanup would be cut short if the process then exited (the threads are
        daemons). Calls not started yet are not waited for."""
        with self._calls_lock:
            calls = [future for future in self._calls if future.running()]
        if not calls:
            return
        waits = [asyncio.wrap_future(future) for future in calls]
        try:
            timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            await asyncio.wait(waits, timeout=timeout)
        finally:
            for one in waits:
                if not one.done():
                    one.cancel()  # only this wait: a running call cannot be cancelled
                elif not one.cancelled():
                    one.exception()  # retrieved: the run it ended is over

    def _serve(self) -> None:
        try:
            while True:
                item = self._work.get()
                if item is None:
                    self._work.put(None)  # for the next thread
                    return
                future, fn, args = item
                del item
                if future.set_running_or_notify_cancel():
                    try:
                        result = self._run(fn, args)
                    except BaseException as error:
                        future.set_exception(error)
                    else:
                        future.set_result(result)
                    del future, fn, args
                self._idle.release()
        finally:
            self._call(self._hooks.thread_end, "as a job thread ended")

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """`fn(*args)` between the calls `around_run` (a call that raises before it
        fails the run; after it, it is logged)."""
        around = self._hooks.around_run
        for hook in around:
            hook()
        try:
            return fn(*args)
        finally:
            self._call(around, "after a sync run")

    @staticmethod
    def _call(hooks: list[Callable[[], None]], when: str) -> None:
        for hook in hooks:
            try:
                hook()
            except Exception as error:
                log.error(
                    "a thread hook failed %s (%s)",
                    when,
                    kind(error),
                    extra={"error": describe(error)},
                )

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut = True
            if cancel_futures:
                while not self._work.empty():
                    item = self._work.get_nowait()
                    if item is not None:
                        item[0].cancel()
            self._work.put(None)
        if wait:
            for thread in self._threads:
                thread.join()
