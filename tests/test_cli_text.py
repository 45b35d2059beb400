"""The CLI's text output never hands a terminal a control sequence: names, errors, `by`
and `reason` written by anyone (the crate, hand-written SQL) are shown with their
control, format and bidi characters escaped (`\\x1b`, `\\u202e`); JSON is escaped by
JSON itself.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
from click.testing import CliRunner, Result
from psycopg import sql as pgsql

from axa_queue.cli import main
from conftest import set_up

EVIL_NAME = "Report\x1b[31m\u202eevil\x07"
EVIL_ERROR = "boom\x1b]0;owned\x07 \u202etxt.exe\u200b"
RAW = ("\x1b", "\u202e", "\x07", "\u200b", "\x9b")


def cli(*args: str, dsn: str) -> Result:
    runner = CliRunner(env={"AXA_QUEUE_DSN": dsn, "DATABASE_URL": None})
    return runner.invoke(main, list(args), prog_name="axa-queue", catch_exceptions=False)


def setup(admin: psycopg.Connection[Any]) -> None:
    set_up(admin)


def insert(admin: psycopg.Connection[Any], name: str, status: str, **more: Any) -> uuid.UUID:
    job_id = uuid.uuid4()
    admin.execute(
        "INSERT INTO axa_queue (id, name, args, status, error, attempts, started_at, updated_at)"
        " VALUES (%s, %s, '{}', %s, %s, %s, now(), now() - %s * interval '1 s')",
        (job_id, name, status, more.get("error"), more.get("attempts", 1), more.get("age", 0)),
    )
    return job_id


def squeezed(text: str) -> str:
    """`text` without its whitespace: a table may wrap a long cell over lines."""
    return "".join(text.split())


def assert_clean(result: Result) -> None:
    assert result.exit_code == 0, result.output
    for raw in RAW:
        assert raw not in result.output, f"{raw!r} reached the terminal"


def test_shown_escapes_control_format_and_bidi_characters_and_keeps_the_rest() -> None:
    from axa_queue.cli import shown

    assert shown("plain text, é, 日本, 🙂") == "plain text, é, 日本, 🙂"
    assert shown("a\x1b[31mb") == "a\\x1b[31mb"
    assert shown("\u202e\u2066\u200b\ufeff\u2028\x9b\x00") == (
        "\\u202e\\u2066\\u200b\\ufeff\\u2028\\x9b\\x00"
    )
    assert shown("tab\there\nline") == "tab\\there\\nline"
    assert shown("\U000e0041") == "\\U000e0041"  # a tag character, invisible
    assert shown(None) == "-"


def test_jobs_show_counts_and_recover_escape_names_and_errors(admin, dsn: str) -> None:
    setup(admin)
    failed = insert(admin, EVIL_NAME, "failed", error=EVIL_ERROR)
    stale = insert(admin, EVIL_NAME, "running", age=7200)

    listed = cli("jobs", dsn=dsn)
    assert_clean(listed)
    assert "Report\\x1b[31m\\u202e" in squeezed(listed.stdout)
    assert "boom\\x1b]0;owned\\x07\\u202etxt.exe\\u200b" in squeezed(listed.stdout)
    shown_job = cli("show", str(failed), dsn=dsn)
    assert_clean(shown_job)
    assert "\\u202etxt.exe" in shown_job.stdout
    assert_clean(cli("counts", "--by-name", dsn=dsn))
    assert "\\x1b[31m" in squeezed(cli("counts", "--by-name", dsn=dsn).stdout)
    recovered = cli("recover", "--dry-run", dsn=dsn)
    assert_clean(recovered)
    assert "\\u202eevil" in squeezed(recovered.stdout) and str(stale) in recovered.stdout
    as_json = json.loads(cli("jobs", "--json", dsn=dsn).stdout)
    assert {row["name"] for row in as_json} == {EVIL_NAME}  # JSON keeps the text, escaped


def test_acts_escape_by_and_reason_written_by_others(admin, dsn: str) -> None:
    setup(admin)
    job_id = insert(admin, EVIL_NAME, "queued")
    # A table made before today's checks, or by hand: its acts may hold anything visible
    # to PostgreSQL's checks of the time.
    for constraint in admin.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = 'axa_job_acts'::regclass "
        "AND contype = 'c'"
    ).fetchall():
        admin.execute(
            pgsql.SQL("ALTER TABLE axa_job_acts DROP CONSTRAINT {}").format(
                pgsql.Identifier(constraint[0])
            )
        )
    admin.execute(
        "INSERT INTO axa_job_acts (job_id, job_name, act, attempts, by, reason) "
        "VALUES (%s, %s, 'cancelled', 0, %s, %s)",
        (job_id, EVIL_NAME, "ops:\u202eecila", "INC\x1b[2J-1"),
    )
    acts = cli("acts", str(job_id), dsn=dsn)
    assert_clean(acts)
    assert "ops:\\u202eecila" in squeezed(acts.stdout)
    assert "INC\\x1b[2J-1" in squeezed(acts.stdout)


def test_schedules_escape_their_names_and_last_errors(admin, dsn: str) -> None:
    setup(admin)
    last = insert(admin, "Tick", "failed", error=EVIL_ERROR)
    admin.execute(
        "INSERT INTO axa_schedule (name, due_at, last_job, interval_ms) "
        "VALUES (%s, now(), %s, 60000)",
        ("nightly\x1b[8m", last),
    )
    listed = cli("schedules", dsn=dsn)
    assert_clean(listed)
    assert "nightly\\x1b[8m" in squeezed(listed.stdout)


def test_an_error_line_never_carries_a_control_sequence() -> None:
    evil = "host=127.0.0.1 port=1 connect_timeout=3 dbname='app\x1b[31m\u202e'"
    refused = cli("jobs", dsn=evil)
    assert refused.exit_code == 1
    assert "app\\x1b[31m\\u202e" in refused.stderr
    for raw in RAW:
        assert raw not in refused.output


def test_acts_show_the_database_role_that_wrote_each(admin, dsn: str) -> None:
    setup(admin)
    job_id = insert(admin, "Report", "queued")
    assert (
        cli("cancel", str(job_id), "--by", "ops:alice", "--reason", "INC-1", dsn=dsn).exit_code == 0
    )
    role = admin.execute("SELECT current_user").fetchone()[0]
    listed = cli("acts", str(job_id), dsn=dsn)
    assert_clean(listed)
    header, row = listed.stdout.splitlines()[:2]
    assert "ROLE" in header.split() and role in row.split() and "ops:alice" in row.split()
    [act] = json.loads(cli("acts", str(job_id), "--json", dsn=dsn).stdout)
    assert (act["by"], act["role"]) == ("ops:alice", role)
