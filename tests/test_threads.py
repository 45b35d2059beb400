"""The threads sync handlers run in (`JobThreads`) call the registry's thread hooks:
around each run, in the run's thread, and as each thread ends; a stop can wait for
the calls still running and name the run of each."""

from __future__ import annotations

import asyncio
import threading
import time
from uuid import uuid4

import pytest

from axa_queue.context import JobContext, enter, leave
from axa_queue.handlers.registry import ThreadHooks
from axa_queue.worker.threads import JobThreads


def test_hooks_run_in_the_runs_thread_around_each_run_and_as_the_thread_ends() -> None:
    calls: list[tuple[str, int]] = []
    hooks = ThreadHooks(
        around_run=[lambda: calls.append(("around", threading.get_ident()))],
        thread_end=[lambda: calls.append(("end", threading.get_ident()))],
    )
    threads = JobThreads(1, "test-job", hooks)
    ran = threads.submit(lambda: threading.get_ident()).result(timeout=10)
    assert calls == [("around", ran), ("around", ran)]
    threads.shutdown(wait=True)
    assert calls[-1] == ("end", ran)


def test_a_hook_that_raises_before_a_run_fails_it_and_one_after_is_only_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = {"calls": 0}

    def flaky() -> None:
        state["calls"] += 1
        if state["calls"] in (1, 3):  # before the first run, and after the second
            raise RuntimeError("hook broke")

    threads = JobThreads(1, "test-job", ThreadHooks(around_run=[flaky]))
    with pytest.raises(RuntimeError, match="hook broke"):
        threads.submit(lambda: "not run").result(timeout=10)
    assert threads.submit(lambda: "ran").result(timeout=10) == "ran"
    threads.shutdown(wait=True)
    assert "a thread hook failed after a sync run" in caplog.text


async def test_a_stop_can_wait_for_the_calls_still_running_and_name_the_run_of_each() -> None:
    job = JobContext(uuid4(), "Export", 1, 3)
    threads = JobThreads(2, "test-job")
    started, release = threading.Event(), threading.Event()

    def export() -> str:
        started.set()
        release.wait(30)
        return "partial"

    token = enter(job)
    try:
        running = threads.submit(export)  # as `run_in_executor` does, in the run's context
    finally:
        leave(token)
    assert threads.submit(lambda: "quick").result(timeout=10) == "quick"  # outside a run
    assert await asyncio.to_thread(started.wait, 10)
    assert threads.running() == [job]
    await threads.wait(time.monotonic())  # the grace is over: it returns at once
    assert threads.running() == [job] and not running.done()
    release.set()
    await threads.wait(None)
    assert running.result(timeout=0) == "partial" and threads.running() == []
    threads.shutdown(wait=True)
