"""The worker's decisions, as plain functions: no database, no event loop."""

from __future__ import annotations

import logging

from axa_queue.limits import Limits
from axa_queue.worker import decisions
from axa_queue.worker.decisions import HOLD_ENDINGS
from axa_queue.worker.state import Run, State

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


def test_a_run_proves_its_claim_after_half_of_stale_after_or_a_broken_connection() -> None:
    assert not decisions.needs_proof(now=10.0, last_heard=9.0, stale=4.0, broken_at=-1.0)
    assert decisions.needs_proof(now=10.0, last_heard=8.0, stale=4.0, broken_at=-1.0)
    assert decisions.needs_proof(now=10.0, last_heard=9.0, stale=4.0, broken_at=9.5)


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
    from axa_queue.worker.state import Phase, Run, State

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
    runs = [Run(str(n), "Short", 1, 1, None, "{}", 0.0, started=True) for n in range(10)]
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
