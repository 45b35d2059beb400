"""The worker's decisions, as plain functions: no database, no event loop."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from axa_queue import Discard, Retry, Snooze
from axa_queue.handlers.policies import NO_POLICY, Policy
from axa_queue.handlers.retries import MAX_ERROR_BYTES
from axa_queue.limits import Limits
from axa_queue.worker import decisions
from axa_queue.worker.decisions import HOLD_ENDINGS
from axa_queue.worker.run import CANCELLED, LOST, TIMEOUT, Run, RunPhase, Stop
from axa_queue.worker.state import State

BUSY = {"stopping": False, "active": 4, "slots": 4, "waiting": 10, "low_water": 4, "room": 24}


def test_a_worker_without_prefetch_sends_every_ending_at_once() -> None:
    assert decisions.due(**{**BUSY, "waiting": 0, "room": 4}, endings=1)


def test_endings_gather_while_every_loop_is_busy_and_enough_jobs_wait() -> None:
    assert not decisions.due(**BUSY, endings=1)


def test_a_free_loop_or_few_waiting_jobs_or_a_stop_or_a_full_batch_make_the_exchange_due() -> None:
    assert decisions.due(**{**BUSY, "active": 3}, endings=1)
    assert decisions.due(**{**BUSY, "waiting": 4}, endings=1)
    assert decisions.due(**{**BUSY, "stopping": True}, endings=1)
    assert decisions.due(**BUSY, endings=24)


def test_gathered_endings_wait_at_most_the_hold() -> None:
    assert decisions.holds(due=False, endings=3, now=10.0, since=10.0)
    assert not decisions.holds(due=False, endings=3, now=10.0 + HOLD_ENDINGS, since=10.0)
    assert not decisions.holds(due=True, endings=3, now=10.0, since=10.0)
    assert decisions.holds(due=False, endings=0, now=99.0, since=0.0)


def test_the_low_water_mark_is_the_loops_or_a_quarter_of_prefetch() -> None:
    assert decisions.low_water(4, 0) == 4
    assert decisions.low_water(4, 100) == 25
    assert decisions.room(4, 100) == 104


def test_a_stopping_worker_claims_nothing() -> None:
    assert decisions.free_places(True, 10, 2) == 0
    assert decisions.free_places(False, 10, 2) == 8


def test_a_limited_name_is_wanted_only_up_to_its_free_places() -> None:
    wanted = decisions.wanted(
        ["A", "B", "C"], Limits(process={"B": 2, "C": 1}), {"B": 1, "C": 1}, 5
    )
    assert wanted == [{"name": "A", "cap": 5}, {"name": "B", "cap": 1}]


def test_a_run_proves_its_claim_after_half_of_stale_after_two_beats_or_a_broken_connection() -> (
    None
):
    assert not decisions.needs_proof(now=10.0, last_heard=9.0, stale=4.0, broken_at=-1.0, beat=9)
    assert decisions.needs_proof(now=10.0, last_heard=8.0, stale=4.0, broken_at=-1.0, beat=9)
    assert decisions.needs_proof(now=10.0, last_heard=9.0, stale=4.0, broken_at=9.5, beat=9)
    # Two heartbeat intervals, when shorter than half of stale_after: a process silent for
    # three is gone, and its runs claimed ahead are given back.
    assert not decisions.needs_proof(now=10.0, last_heard=9.0, stale=60.0, broken_at=-1.0, beat=1)
    assert decisions.needs_proof(now=10.0, last_heard=8.0, stale=60.0, broken_at=-1.0, beat=1)


def test_only_a_started_run_gives_up_and_only_after_stale_after_without_contact() -> None:
    assert decisions.gives_up(started=True, now=10.0, last_heard=6.0, stale=4.0)
    assert not decisions.gives_up(started=True, now=10.0, last_heard=6.5, stale=4.0)
    assert not decisions.gives_up(started=False, now=10.0, last_heard=0.0, stale=4.0)


def test_a_failing_service_waits_twice_as_long_each_time_up_to_a_cap() -> None:
    assert decisions.next_retry(0.5) == 1.0
    assert decisions.next_retry(50.0) == decisions.SERVICE_RETRY_MAX


def test_the_fate_of_a_lost_run_says_what_became_of_its_job() -> None:
    base = {"started": True, "attempts": 1, "ending": "completed"}
    level, text = decisions.fate(**base, status="queued", found_attempts=1, became="needs_review")
    assert level == logging.ERROR and "waits for review" in text
    level, text = decisions.fate(**base, status="completed", found_attempts=1, became=None)
    assert level == logging.INFO and "recorded after all" in text
    level, text = decisions.fate(**base, status=None, found_attempts=None, became=None)
    assert "deleted" in text
    level, text = decisions.fate(**base, status="running", found_attempts=2, became=None)
    assert "replaced by attempt 2" in text
    _, text = decisions.fate(
        **{**base, "started": False}, status="running", found_attempts=1, became="queued"
    )
    assert text.startswith("job not started") and "queued again" in text


def test_a_run_that_lost_its_claim_holds_its_place_until_its_fate_is_written() -> None:
    from axa_queue.worker.state import Phase

    state = State(2, 0)
    one = Run("3f2c0f4e-0000-0000-0000-000000000001", "Report", 1, 3, None, "{}", 0.0)
    assert state.free() == 2
    state.losing[one.id] = one  # refused by an exchange: its loop had let it go
    assert state.free() == 1
    state.runs[one.key] = one  # found by a heartbeat: its loop still holds it
    assert state.free() == 1, "counted once"
    assert state.held_literals() == ("{" + one.id + "}", "{1}")
    state.phase = Phase.STOPPING
    assert state.free() == 0


def test_auto_prefetch_claims_nothing_ahead_until_a_run_has_ended() -> None:
    assert decisions.ahead(10, None, 100) == 0


def test_auto_prefetch_claims_ahead_what_the_loops_start_within_its_horizon() -> None:
    # 10 loops, 5 ms a run: 2,000 starts a second, 100 within 50 ms.
    assert decisions.ahead(10, 0.005, 1000) == 100
    assert decisions.ahead(10, 0.001, 100) == 100  # at most `most`
    assert decisions.ahead(10, 0.0, 100) == 100


def test_auto_prefetch_claims_nothing_ahead_for_long_jobs() -> None:
    assert decisions.ahead(10, 1.0, 100) == 0
    assert decisions.ahead(5, 0.1, 100) == 2
    assert decisions.ahead(2, 0.1, 100) == 1
    assert decisions.ahead(2, 0.2, 100) == 0


def test_a_worker_holding_more_than_its_room_claims_nothing() -> None:
    assert decisions.free_places(False, 10, 12) == 0


def test_auto_prefetch_claims_ahead_what_the_loops_not_held_by_long_runs_start_in_time() -> None:
    state = State(10, "auto")
    assert state.pace() == {}
    assert state.free() == 10  # nothing ahead before a run has ended
    runs = [Run(str(n), "Short", 1, 1, None, "{}", 0.0, phase=RunPhase.RUNNING) for n in range(10)]
    state.runs = {one.key: one for one in runs}
    state.ran("Short", 0.001)  # ten loops, a millisecond a run: 500 within 50 ms
    assert state.pace() == {"Short": decisions.AUTO_PREFETCH}
    assert state.free() == 10 + decisions.AUTO_PREFETCH - 10
    for one in runs[:8]:
        one.name = "New"  # eight loops busy with jobs of a name not timed yet
    assert state.pace() == {"Short": 100}, "two loops: 100 within 50 ms"
    assert state.free() == 10 + 100 - 10
    for one in runs[8:]:
        one.name = "New"
    assert state.pace() == {"Short": 0}
    assert state.free() == 0, "nothing ahead while no loop is known to come free soon"
    for _ in range(100):
        state.ran("New", 2.0)  # and the new name is long
    assert state.pace() == {"Short": 0, "New": 0}
    assert state.free() == 0


def test_auto_prefetch_lets_a_name_wait_ahead_at_its_own_pace_and_each_name_one() -> None:
    paced = {"Short": 100, "Long": 0}
    names = ["Short", "Long", "New"]
    # Loops idle: every name may fill them.
    assert decisions.wanted(names, Limits(), {}, 110, paced=paced, waiting={}, idle=10) == [
        {"name": "Short", "cap": 100},
        {"name": "Long", "cap": 10},
        {"name": "New", "cap": 10},
    ]
    # Loops busy, short jobs waiting: each other name may have one waiting, not more.
    waiting = {"Short": 40, "Long": 1}
    assert decisions.wanted(names, Limits(), {}, 60, paced=paced, waiting=waiting, idle=0) == [
        {"name": "Short", "cap": 60},
        {"name": "New", "cap": 1},
    ]
    # Nothing waits and the loops are busy: nothing of a long or new name is claimed.
    assert decisions.wanted(["Long", "New"], Limits(), {}, 5, paced=paced, waiting={}, idle=0) == []


def test_a_fixed_prefetch_claims_that_many_ahead_whatever_runs_take() -> None:
    state = State(10, 20)
    assert state.free() == 30
    state.ran("Slow", 60.0)
    assert state.pace() is None
    assert state.free() == 30


# --- how a run that is over is taken -----------------------------------------------------

TRIES = {"attempts": 1, "limit": 3, "policy": NO_POLICY, "backoff": timedelta(seconds=2)}


def test_a_run_whose_handler_returned_is_recorded_completed() -> None:
    taken = decisions.outcome(stopped=None, error=None, raised=None, **TRIES)
    assert (taken.kind, taken.status, taken.error, taken.delay) == (
        "completed",
        "completed",
        None,
        0.0,
    )


def test_a_failure_with_attempts_left_is_queued_after_the_backoff_and_logged_by_its_class() -> None:
    raised = ValueError("no such customer")
    taken = decisions.outcome(
        stopped=None, error="ValueError: no such customer", raised=raised, **TRIES
    )
    assert (taken.kind, taken.status, taken.delay) == ("retried", "queued", 2.0)
    assert taken.error == "ValueError: no such customer"
    assert taken.cause == "raised ValueError", "the log names the class, not the text"
    assert taken.traceback


def test_a_failure_of_the_last_attempt_fails_the_job() -> None:
    taken = decisions.outcome(
        stopped=None, error="ValueError", raised=ValueError(), **{**TRIES, "attempts": 3}
    )
    assert (taken.kind, taken.status, taken.delay) == ("failed", "failed", 0.0)


def test_a_timeout_is_a_failure_that_raised_nothing_whatever_the_handler_raised() -> None:
    taken = decisions.outcome(
        stopped=Stop(TIMEOUT, "timed out after 5 s"),
        error="CancelledError raised by the handler",
        raised=asyncio.CancelledError(),
        **TRIES,
    )
    assert (taken.kind, taken.error, taken.cause) == (
        "retried",
        "timed out after 5 s",
        "timed out after 5 s",
    )
    assert not taken.traceback


def test_a_run_whose_claim_is_gone_is_lost_and_one_whose_job_was_cancelled_writes_nothing() -> None:
    lost = decisions.outcome(
        stopped=Stop(LOST, "another worker or recovery took its claim"),
        error=None,
        raised=None,
        **TRIES,
    )
    assert (lost.kind, lost.error) == (
        "lost",
        "stopped: another worker or recovery took its claim",
    )
    cancelled = decisions.outcome(
        stopped=Stop(CANCELLED, "cancelled by a person"), error="boom", raised=None, **TRIES
    )
    assert (cancelled.kind, cancelled.status) == ("cancelled", "running")


def test_what_a_handler_asks_for_is_taken_without_a_traceback() -> None:
    snoozed = decisions.outcome(
        stopped=None, error="Snooze", raised=Snooze(timedelta(minutes=1)), **TRIES
    )
    assert (snoozed.kind, snoozed.status, snoozed.delay, snoozed.max_attempts) == (
        "snoozed",
        "queued",
        60.0,
        4,
    )
    retried = decisions.outcome(stopped=None, error="Retry", raised=Retry("later", in_=5), **TRIES)
    assert (retried.kind, retried.delay) == ("retried", 5.0)
    discarded = decisions.outcome(stopped=None, error="Discard", raised=Discard("bad"), **TRIES)
    assert (discarded.kind, discarded.error) == ("failed", "discarded: bad")
    assert not (snoozed.traceback or retried.traceback or discarded.traceback)


def test_a_backoff_that_raises_is_told_and_the_queues_backoff_is_used() -> None:
    told: list[Exception] = []

    def broken(attempt: int) -> timedelta:
        raise ZeroDivisionError

    taken = decisions.outcome(
        stopped=None,
        error="ValueError",
        raised=ValueError(),
        **{**TRIES, "policy": Policy(backoff=broken)},
        backoff_failed=told.append,
    )
    assert (taken.kind, taken.delay) == ("retried", 2.0)
    assert [type(one) for one in told] == [ZeroDivisionError]


def test_an_error_too_long_for_a_row_is_cut() -> None:
    taken = decisions.outcome(stopped=None, error="x" * 5000, raised=None, **TRIES)
    assert taken.error is not None and len(taken.error.encode()) <= MAX_ERROR_BYTES
    assert taken.cause == "x" * 5000, "the log line's cause is the error as it was"


# --- a run's phases ----------------------------------------------------------------------


class Task:
    """Stands for a loop's task: records its cancellations."""

    def __init__(self) -> None:
        self.cancels = 0

    def cancel(self) -> None:
        self.cancels += 1


def a_run() -> Run:
    return Run("3f2c0f4e-0000-0000-0000-000000000001", "Report", 1, 3, None, "{}", 0.0)


def test_a_run_is_started_once_its_handler_is_called_and_done_once_over() -> None:
    one = a_run()
    assert (one.phase, one.started, one.done) == (RunPhase.WAITING, False, False)
    one.phase = RunPhase.STARTING
    assert (one.started, one.done) == (False, False)
    one.phase = RunPhase.RUNNING
    assert (one.started, one.done) == (True, False)
    one.over()
    assert (one.phase, one.started, one.done) == (RunPhase.ENDED, True, True)
    skipped = a_run()
    skipped.phase = RunPhase.STARTING
    skipped.over()
    assert (skipped.phase, skipped.started, skipped.done) == (RunPhase.SKIPPED, False, True)


def test_a_stop_cancels_the_loop_only_while_the_loop_has_the_run() -> None:
    waiting, task = a_run(), Task()
    waiting.task = task  # type: ignore[assignment]
    waiting.stop(TIMEOUT, "timed out after 1 s")
    assert task.cancels == 0 and not waiting.cancelled, "its loop will skip it"
    assert waiting.stopped == Stop(TIMEOUT, "timed out after 1 s")
    running_one, task = a_run(), Task()
    running_one.task = task  # type: ignore[assignment]
    running_one.phase = RunPhase.RUNNING
    running_one.lose("another worker or recovery took its claim")
    running_one.stop(CANCELLED, "cancelled by a person")  # the first stop stays
    assert task.cancels == 1 and running_one.cancelled
    assert running_one.stopped is not None and running_one.stopped.kind == LOST
    running_one.over()
    assert not running_one.cancelled


def test_a_run_that_is_over_cannot_be_stopped_and_one_found_gone_by_its_loop_is_skipped() -> None:
    over, task = a_run(), Task()
    over.task = task  # type: ignore[assignment]
    over.phase = RunPhase.RUNNING
    over.over()
    over.stop(TIMEOUT, "timed out after 1 s")
    assert over.stopped is None and task.cancels == 0
    proved = a_run()
    proved.phase = RunPhase.STARTING
    proved.skip(LOST, "its claim was gone before its handler started")
    assert (proved.phase, proved.started, proved.cancelled) == (RunPhase.SKIPPED, False, False)


def test_a_claim_that_gave_a_name_its_whole_cap_does_not_say_there_is_no_more_work() -> None:
    wanted = [{"name": "Report", "cap": 4}, {"name": "Free", "cap": 31}]
    assert not decisions.nothing_more(wanted, 35, 4, {"Report": 4})
    assert decisions.nothing_more(wanted, 35, 3, {"Report": 3})
    assert not decisions.nothing_more(wanted, 4, 4, {"Free": 4})  # took all it could
    assert decisions.nothing_more(wanted, 35, 3, None)  # in parts: fewer than asked
    assert decisions.held_back(["Report", "Free", "Long"], wanted, {"Report": 4}) == {
        "Report",  # as many as its cap: more may be ready
        "Long",  # left out by its pace or limit
    }


def test_a_process_that_may_have_stalled_claims_none_of_the_jobs_it_still_runs() -> None:
    from axa_queue.worker.state import State

    state = State(2, 0)
    held = Run("3f2c0f4e-0000-0000-0000-000000000001", "Report", 1, 3, None, "{}", 0.0)
    lost = Run("3f2c0f4e-0000-0000-0000-000000000002", "Report", 1, 3, None, "{}", 0.0)
    state.losing[lost.id] = lost
    asked: list[bool] = []

    def stalled() -> bool:
        asked.append(True)
        return True

    assert state.fence(stalled) == "{" + lost.id + "}", "nothing held: not even asked"
    assert asked == []
    state.runs[held.key] = held
    assert state.fence(lambda: False) == "{" + lost.id + "}"
    fenced = state.fence(stalled)
    assert sorted(fenced.strip("{}").split(",")) == [held.id, lost.id]
