"""The threads sync handlers run in (`JobThreads`) call the registry's thread hooks:
around each run, in the run's thread, and as each thread ends."""

from __future__ import annotations

import threading

import pytest

from axa_queue.registry import ThreadHooks
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
