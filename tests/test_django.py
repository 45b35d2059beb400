"""The Django app: `migrate` makes the queue's tables through the schema's own
migrations, the DSN comes from `DATABASES`, `manage.py axa_queue` runs the CLI's
commands (the worker's processes set Django up), and sync handlers run with Django's
connection handling."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connections
from django.test import override_settings
from psycopg.conninfo import conninfo_to_dict

from axa_queue import Queue, SchemaError, SyncQueue
from axa_queue.contrib.django import conf, use_django, worker
from axa_queue.contrib.django.migrations import __path__ as migrations_path
from axa_queue.schema import MIGRATIONS, SETUP_LOCK
from djangotest import (  # noqa: F401
    SITE,
    django_db,
    migrated,
    tasks,
    until,
    worker_running,
)


def axa_queue_check(dsn: str) -> subprocess.CompletedProcess[str]:
    """`axa-queue check` on `dsn`, as an operator would run it."""
    return subprocess.run(
        [sys.executable, "-m", "axa_queue.cli", "check", "--dsn", dsn],
        env=site_env(dsn),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.usefixtures("django_db")
def test_migrate_makes_the_tables_so_that_axa_queue_check_agrees(dsn: str) -> None:
    assert axa_queue_check(dsn).returncode == 1
    call_command("migrate", "axa_queue", verbosity=0)
    checked = axa_queue_check(dsn)
    assert checked.returncode == 0, checked.stderr
    call_command("migrate", "axa_queue", "zero", verbosity=0)  # reversing leaves the tables
    call_command("migrate", "axa_queue", verbosity=0)  # and applying again changes nothing
    assert axa_queue_check(dsn).returncode == 0
    call_command("makemigrations", "axa_queue", "--check", "--dry-run", verbosity=0)


@pytest.mark.usefixtures("django_db")
def test_migrate_leaves_tables_a_queues_setup_made_as_they_are(dsn: str) -> None:
    async def set_up() -> None:
        async with Queue(dsn):
            pass

    asyncio.run(set_up())
    call_command("migrate", "axa_queue", verbosity=0)
    assert axa_queue_check(dsn).returncode == 0


def test_there_is_a_django_migration_for_every_schema_version() -> None:
    names = sorted(p.name for p in Path(migrations_path[0]).glob("0*.py"))
    assert names == [f"{m.version:04d}_schema_{m.version}.py" for m in MIGRATIONS]


@pytest.mark.usefixtures("django_db")
def test_the_dsn_is_that_of_the_database_the_settings_name(dsn: str) -> None:
    given = conninfo_to_dict(dsn)
    made = conninfo_to_dict(conf.dsn())
    assert {k: made.get(k) for k in ("dbname", "host", "port", "options")} == {
        k: given.get(k) for k in ("dbname", "host", "port", "options")
    }
    with (
        override_settings(AXA_QUEUE={"DATABASE": "elsewhere"}),
        pytest.raises(ImproperlyConfigured, match="'elsewhere', which DATABASES does not have"),
    ):
        conf.dsn()
    with (
        override_settings(AXA_QUEUE={"DATABSE": "default"}),
        pytest.raises(ImproperlyConfigured, match="unknown key"),
    ):
        conf.database_alias()


def manage(*args: str, env: dict[str, str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, os.path.join(SITE, "manage.py"), "axa_queue", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        **kwargs,
    )


def site_env(dsn: str, **extra: str) -> dict[str, str]:
    src = str(Path(__file__).parent.parent / "src")
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "AXA_DJANGO_TEST_DSN": dsn,
        "DJANGO_SETTINGS_MODULE": "django_site.settings",
        **extra,
    }


@pytest.mark.usefixtures("migrated")
def test_manage_py_axa_queue_lists_shows_and_cancels_jobs_on_the_settings_database(
    dsn: str,
) -> None:
    result = tasks.calculate_meaning_of_life.enqueue()
    env = site_env(dsn)
    env.pop("AXA_QUEUE_DSN", None)
    listed = manage("jobs", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert result.id in listed.stdout and "calculate_meaning_of_life" in listed.stdout
    shown = manage("show", result.id, env=env)
    assert shown.returncode == 0 and "queued" in shown.stdout
    cancelled = manage("cancel", result.id, "--by", "ops:alice", "--reason", "not_needed", env=env)
    assert cancelled.returncode == 0, cancelled.stderr
    result.refresh()
    assert result.status == "FAILED"
    acts = manage("acts", result.id, "--json", env=env)
    assert "ops:alice" in acts.stdout and "not_needed" in acts.stdout
    unknown = manage("show", str(uuid.uuid4()), env=env)
    assert unknown.returncode == 1 and "Traceback" not in unknown.stderr


@pytest.mark.usefixtures("migrated")
def test_manage_py_axa_queue_worker_runs_tasks_in_worker_processes_that_set_django_up(
    dsn: str, tmp_path: Path
) -> None:
    out = tmp_path / "out.txt"
    results = [
        tasks.send_email.enqueue([f"{n}@example.com"], f"s{n}", "m", "f@example.com")
        for n in range(4)
    ]
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "axa_queue", "worker", "--processes", "2", "--workers", "2"],
        cwd=SITE,
        env=site_env(dsn, AXA_DJANGO_TEST_OUT=str(out)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reading = threading.Thread(target=lambda: lines.extend(iter(worker.stdout.readline, "")))
    reading.start()
    try:

        def all_done() -> bool:
            for one in results:
                one.refresh()
            return all(one.is_finished for one in results)

        until(all_done, timeout=60)
        # both children set Django up and found the tasks (before they are stopped)
        until(lambda: sum("worker started" in line and "handlers=6" in line for line in lines) == 2)
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(timeout=60)
        reading.join(timeout=10)
    output = "".join(lines)
    assert worker.returncode == 0, output
    assert [one.status for one in results] == ["SUCCESSFUL"] * 4, output
    assert [one.return_value for one in results] == [1] * 4
    pids = {line.rsplit("pid=", 1)[1] for line in out.read_text().splitlines()}
    assert str(worker.pid) not in pids  # run by the children, each with Django set up
    assert "started a worker process" in output and "handlers=" in output


def backends(admin: psycopg.Connection[Any], pid: int) -> int:
    row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.usefixtures("migrated")
def test_sync_runs_close_djangos_old_connections_after_each_run(
    admin: psycopg.Connection[Any],
) -> None:
    with worker_running():
        result = tasks.uses_the_database.enqueue()
        until(lambda: result.refresh() or result.is_finished)
        pid = result.return_value["backend_pid"]
        # CONN_MAX_AGE 0: closed after the run, while the worker and its thread go on
        until(lambda: backends(admin, pid) == 0)


@pytest.mark.usefixtures("migrated")
def test_a_job_threads_persistent_connection_is_kept_and_closed_when_the_thread_ends(
    admin: psycopg.Connection[Any],
) -> None:
    connections["default"].settings_dict["CONN_MAX_AGE"] = None  # persistent
    try:
        with worker_running():
            result = tasks.uses_the_database.enqueue()
            until(lambda: result.refresh() or result.is_finished)
            pid = result.return_value["backend_pid"]
            assert backends(admin, pid) == 1  # kept between runs, as Django keeps it
        until(lambda: backends(admin, pid) == 0)  # the worker stopped: its threads closed it
    finally:
        connections["default"].settings_dict["CONN_MAX_AGE"] = 0


@pytest.mark.usefixtures("migrated")
def test_manage_py_axa_queue_worker_closes_djangos_connections_after_each_run_of_its_own_queue(
    dsn: str, admin: psycopg.Connection[Any]
) -> None:
    from django.contrib.auth.models import Group

    Group.objects.bulk_create([Group(name="staff"), Group(name="ops")])
    connections.close_all()
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "axa_queue", "worker", "django_site.shop.jobs:queue"],
        cwd=SITE,
        env=site_env(dsn),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with SyncQueue(dsn) as jobs:
            ran = {
                name: jobs.enqueue(name, {"name": old, "to": new})
                for name, old, new in [
                    ("RenameGroup", "staff", "team"),
                    ("RenameGroupAsync", "ops", "operations"),
                ]
            }
            for name, job_id in ran.items():
                assert jobs.wait(job_id, timeout=60).state == "completed", name
                done = jobs.result(job_id)
                assert done["renamed"] == 1, name
                # CONN_MAX_AGE 0: the session that ran the UPDATE ends after the run,
                # while the worker (and the thread that ran it) go on
                until(lambda pid=done["backend_pid"]: backends(admin, pid) == 0)
        assert worker.poll() is None, "the worker stopped before the test stopped it"
    finally:
        worker.send_signal(signal.SIGINT)
        _, errors = worker.communicate(timeout=60)
    assert worker.returncode == 0, errors
    assert sorted(Group.objects.values_list("name", flat=True)) == ["operations", "team"]


def test_use_django_adds_its_hooks_once() -> None:
    queue = Queue("dbname=unused")
    assert use_django(use_django(queue)) is queue
    assert len(queue.registry.threads.around_run) == 1
    assert len(queue.registry.threads.thread_end) == 1
    assert len(queue.registry.middleware) == 1  # for async handlers' connections


@pytest.mark.usefixtures("migrated")
def test_call_command_runs_an_axa_queue_command_in_this_process(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = os.environ.get("AXA_QUEUE_DSN")
    tasks.calculate_meaning_of_life.enqueue()
    call_command("axa_queue", "counts", "--json")
    assert json.loads(capsys.readouterr().out)["ready"] == 1
    with pytest.raises(SystemExit) as refused:
        call_command("axa_queue", "show", "not-an-id")
    assert refused.value.code == 2 and "not a valid UUID" in capsys.readouterr().err
    assert os.environ.get("AXA_QUEUE_DSN") == before  # the settings' DSN only for the command


@pytest.mark.usefixtures("django_db")
def test_a_migration_held_up_by_a_lock_says_so_within_the_setup_lock_timeout(
    dsn: str, admin: psycopg.Connection[Any]
) -> None:
    call_command("migrate", "axa_queue", "0002", verbosity=0)
    asyncio.run(_set_up(dsn))  # a worker's setup made version 3 meanwhile...
    admin.execute("DELETE FROM axa_schema_version WHERE version >= 3")  # ...but not recorded
    with psycopg.connect(dsn) as holder:
        holder.execute("LOCK TABLE axa_queue IN ACCESS SHARE MODE")  # a transaction reading
        with (
            override_settings(AXA_QUEUE={"OPTIONS": {"setup_lock_timeout": 0.2}}),
            pytest.raises(SchemaError, match=r"within 0\.2 s .* run migrate again"),
        ):
            call_command("migrate", "axa_queue", verbosity=0)
    call_command("migrate", "axa_queue", verbosity=0)
    assert axa_queue_check(dsn).returncode == 0


@pytest.mark.alone  # it holds the setup lock, which every schema's setup takes
@pytest.mark.usefixtures("django_db")
def test_a_migration_held_up_by_the_setup_lock_says_so_within_the_setup_lock_timeout(
    dsn: str,
) -> None:
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (SETUP_LOCK,))  # a setup running
        with (
            override_settings(AXA_QUEUE={"OPTIONS": {"setup_lock_timeout": 0.2}}),
            pytest.raises(SchemaError, match=r"within 0\.2 s .* holds the setup lock"),
        ):
            call_command("migrate", "axa_queue", verbosity=0)
    call_command("migrate", "axa_queue", verbosity=0)
    assert axa_queue_check(dsn).returncode == 0


async def _set_up(dsn: str) -> None:
    async with Queue(dsn):
        pass


@pytest.mark.usefixtures("migrated")
def test_the_tasks_join_the_applications_own_queue_when_the_settings_name_it(dsn: str) -> None:
    from django_site.shop import jobs

    with override_settings(AXA_QUEUE={"QUEUE": "django_site.shop.jobs:queue"}):
        queue = worker.tasks_queue()
    assert queue is jobs.queue
    assert {"Restock", "django_site.shop.tasks.send_email"} <= set(queue.handlers)
    assert queue.registry.threads.around_run  # Django's connection handling, too
