"""What axa-queue's own log records say: each message stands alone (the job's name, id
and attempt, an error by its class), for where nothing prints the fields, such as a
script with no logging set up, whose warnings Python prints bare; the fields stay."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from axa_queue import NewJob, Schedule, Snooze, cancel, current_job, logs
from conftest import eventually, running, status_of

ROOT = Path(__file__).resolve().parent.parent

PRIVATE = "4111-1111-1111-1111"
"""What the handlers below put in their exceptions' messages (and arguments)."""

SCRIPT = f"""
import asyncio

from axa_queue import Queue, QueueOptions, current_job

queue = Queue(options=QueueOptions(poll_interval=0.05, retry_backoff=0.05))
ENDED = ("completed", "failed")


@queue.handler("Flaky", max_attempts=2)
def flaky(args: dict) -> None:
    if current_job().attempt == 1:
        raise ValueError("card {PRIVATE} declined")


@queue.handler("Broken")
async def broken(args: dict) -> None:
    raise KeyError("{PRIVATE}")


async def main() -> None:
    async with queue:
        flaky_id = await queue.enqueue("Flaky", {{"card": "{PRIVATE}"}})
        broken_id = await queue.enqueue("Broken", {{}}, max_attempts=1)
        print(flaky_id, broken_id, flush=True)
        stop = asyncio.Event()
        worker = asyncio.create_task(queue.run(stop))
        for job_id in (flaky_id, broken_id):
            while (job := await queue.job(job_id)) is None or job.state not in ENDED:
                await asyncio.sleep(0.05)
            print(job.state, flush=True)
        stop.set()
        await worker


asyncio.run(main())
"""


def test_without_logging_set_up_a_scripts_stderr_names_the_failed_job_its_id_attempt_and_error_class(
    dsn: str, tmp_path: Path
) -> None:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AXA_QUEUE_")}
    env["AXA_QUEUE_DSN"] = dsn
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    flaky_id, broken_id, flaky_ended, broken_ended = done.stdout.split()
    assert (flaky_ended, broken_ended) == ("completed", "failed"), done.stderr
    lines = done.stderr.splitlines()
    assert (
        f"job failed, will retry: Flaky {flaky_id} (attempt 1): raised ValueError; "
        "next try in 0.05 s"
    ) in lines, done.stderr
    assert f"job failed: Broken {broken_id} (attempt 1): raised KeyError" in lines, done.stderr
    assert PRIVATE not in done.stderr  # the error's text is in the `error` field only
    assert "Traceback" not in done.stderr


COUNTS = ("running", "aborted", "jobs", "endings", "lost", "purged", "archived", "tasks")
"""Fields holding how many of something an event is about: said in the message too."""


def bare(record: logging.LogRecord) -> list[str]:
    """What the message of `record` leaves out of what its fields say it is about."""
    message = record.getMessage()
    fields = logs.fields_of(record)
    missing = [
        key
        for key in ("job_id", "job", "schedule", *COUNTS)
        if key in fields and str(fields[key]) not in message
    ]
    if "attempt" in fields and f"attempt {fields['attempt']}" not in message:
        missing.append("attempt")
    error = fields.get("error")
    if isinstance(error, str):
        kind = error.partition(":")[0]  # "ValueError: ..."; our own texts have no class
        if kind.isidentifier() and not re.search(rf"\b{re.escape(kind)}\b", message):
            missing.append("error")
    return missing


async def test_every_record_of_a_typical_run_says_in_its_message_what_its_fields_name(
    make_queue, admin: psycopg.Connection[Any], caplog
) -> None:
    queue = await make_queue(workers=8, heartbeat_interval=30, stale_after=60)
    released, last_started = asyncio.Event(), asyncio.Event()
    export_started, job_stopped = asyncio.Event(), threading.Event()
    loop = asyncio.get_running_loop()

    @queue.handler("Report")
    async def report(args: Any) -> None:
        logging.getLogger("cardlib").info("a line of the handler's own, not ours")

    @queue.handler("Flaky", max_attempts=2)
    def flaky(args: Any) -> None:
        if current_job().attempt == 1:
            raise ValueError(f"card {PRIVATE} declined")

    @queue.handler("Broken", max_attempts=1)
    async def broken(args: Any) -> None:
        raise KeyError(PRIVATE)

    @queue.handler("Sleepy")
    async def sleepy(args: Any) -> None:
        if current_job().attempt == 1:
            raise Snooze(0.05)

    @queue.handler("Slow", timeout=0.1, max_attempts=1)
    async def slow(args: Any) -> None:
        await asyncio.Event().wait()

    @queue.handler("Export")
    def export(args: Any) -> None:
        job = current_job()
        loop.call_soon_threadsafe(export_started.set)
        while not job.cancelled:  # a long handler polling its flag between steps
            job_stopped.wait(0.01)

    @queue.handler("Last")
    async def last(args: Any) -> None:
        last_started.set()
        await released.wait()

    @queue.observe
    def broken_observer(name: str, outcome: str, seconds: float) -> None:
        raise RuntimeError(f"observer bug {PRIVATE}")

    queue.schedule(Schedule.every("hourly", 3600, NewJob("Report")))
    caplog.set_level(logging.DEBUG)
    ended = {
        await queue.enqueue("Report", {"card": PRIVATE}): "completed",
        await queue.enqueue("Flaky", {}): "completed",
        await queue.enqueue("Broken", {}): "failed",
        await queue.enqueue("Sleepy", {}): "completed",
        await queue.enqueue("Slow", {}): "failed",
    }
    export_id = await queue.enqueue("Export", {})
    stop = asyncio.Event()
    worker = asyncio.create_task(queue.run(stop))
    try:
        await eventually(lambda: all(status_of(admin, i)[0] == s for i, s in ended.items()))
        await asyncio.wait_for(export_started.wait(), 15)
        async with queue.connection() as conn:
            assert await cancel(conn, export_id, "ops:alice", "stop")
        await eventually(lambda: status_of(admin, export_id)[0] == "cancelled")
        await queue.enqueue("Last", {})
        await asyncio.wait_for(last_started.wait(), 15)
        stop.set()
        await eventually(
            lambda: any(r.getMessage().startswith("stopping: waiting") for r in caplog.records)
        )
        released.set()
        await asyncio.wait_for(worker, 30)
    finally:
        released.set()
        job_stopped.set()
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
    ours = [r for r in caplog.records if r.name.startswith("axa_queue")]
    said = [r.getMessage() for r in ours]
    for start in (
        "job started: ",
        "job completed: ",
        "job failed, will retry: ",
        "job failed: ",
        "job snoozed: ",
        "job stopped: ",
        "schedule queued its job: ",
        "a run observer failed ",
        "stopping: waiting for jobs in progress",
    ):
        assert any(message.startswith(start) for message in said), (start, said)
    assert any("timed out after 0.1 s" in message for message in said), said
    assert {r.name for r in caplog.records} >= {"cardlib", "axa_queue.worker"}
    assert [(r.getMessage(), bare(r)) for r in ours if bare(r)] == []
    assert PRIVATE not in "\n".join(said)


async def test_a_listener_and_a_give_back_that_keep_failing_are_logged_once_a_while(
    make_queue, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from axa_queue.db.connector import Connector
    from axa_queue.worker.housekeeping import Housekeeping

    queue = await make_queue()

    @queue.handler("Ok")
    async def ok(args: Any) -> None:
        pass

    tries = {"listener": 0, "give back": 0}
    done = asyncio.Event()
    real_connect = Connector.connect

    async def connect(self: Connector, *, session: bool = True, **extra: Any) -> Any:
        if not session and tries["listener"] < 8:  # the listener's: an outage, for a while
            tries["listener"] += 1
            raise psycopg.OperationalError("the server is down")
        return await real_connect(self, session=session, **extra)

    async def give_back_gone(self: Housekeeping, beat: float) -> psycopg.Error | None:
        tries["give back"] += 1
        if tries["give back"] >= 8:
            done.set()
            return None
        return psycopg.OperationalError("the server is down")

    monkeypatch.setattr(Connector, "connect", connect)
    monkeypatch.setattr(Housekeeping, "give_back_gone", give_back_gone)
    with caplog.at_level(logging.INFO, logger="axa_queue.worker"):
        async with running(queue):
            await asyncio.wait_for(done.wait(), 30)
            await eventually(lambda: "listening for notifications again" in caplog.text)
    said = [r.getMessage() for r in caplog.records if r.name == "axa_queue.worker"]
    lost = [line for line in said if line.startswith("lost the notification connection")]
    given = [line for line in said if line.startswith("could not give back the jobs")]
    assert tries["listener"] == 8 and len(lost) == 1, said
    assert len(given) == 1 and given[0].endswith("processes (OperationalError)"), said
    assert sum(line.startswith("listening for notifications again") for line in said) == 1


def test_a_lasting_failure_says_how_long_after_its_first_line_once_every_30_seconds() -> None:
    from axa_queue.worker.tasks import SAID_EVERY, Streak, lasting

    now = [100.0]
    streak = Streak(clock=lambda: now[0])
    said = []
    for _ in range(70):  # a try every second for 70 s
        lasted = streak.failed()
        if lasted is not None:
            said.append(lasting(lasted))
        now[0] += 1.0
    assert said == ["", "; for 30 s", "; for 60 s"] and SAID_EVERY == 30.0
    assert streak.ended() == 70.0 and streak.ended() is None
    assert streak.failed() == 0.0, "a new streak is said at once"
