"""`axa-queue recover` decides as the worker's own stale recovery does, given the same
`max_attempts`, and says which default it gave jobs queued without their own.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import psycopg
from click.testing import CliRunner, Result

from axa_queue import Queue, QueueOptions
from axa_queue.cli import main
from conftest import set_up, status_of


def cli(*args: str, dsn: str) -> Result:
    runner = CliRunner(env={"AXA_QUEUE_DSN": dsn, "DATABASE_URL": None})
    return runner.invoke(main, list(args), prog_name="axa-queue", catch_exceptions=False)


def stale(admin: psycopg.Connection[Any], attempts: int, max_attempts: int | None) -> uuid.UUID:
    """A running job whose worker was last heard of two hours ago."""
    job_id = uuid.uuid4()
    admin.execute(
        "INSERT INTO axa_queue (id, name, args, status, attempts, max_attempts, started_at, "
        "updated_at) VALUES (%s, 'Report', '{}', 'running', %s, %s, now(), "
        "now() - interval '2 hours')",
        (job_id, attempts, max_attempts),
    )
    return job_id


def test_recover_with_max_attempts_agrees_with_the_workers_own_recovery(admin, dsn: str) -> None:
    set_up(admin)
    jobs = {
        "no limit, first try": stale(admin, 1, None),
        "no limit, out of tries": stale(admin, 3, None),
        "own limit of one": stale(admin, 1, 1),
        "own limit of five": stale(admin, 4, 5),
    }
    options = QueueOptions(max_attempts=3, stale_after=3600, heartbeat_interval=60)

    async def workers_recovery() -> dict[uuid.UUID, str]:
        async with Queue(dsn, options) as queue:
            return {r.id: r.state.value for r in await queue.recover_stale(dry_run=True)}

    workers = asyncio.run(workers_recovery())
    assert workers[jobs["no limit, first try"]] == "queued"

    dry = cli("recover", "--max-attempts", "3", "--dry-run", "--json", dsn=dsn)
    assert dry.exit_code == 0, dry.output
    assert {uuid.UUID(r["id"]): r["state"] for r in json.loads(dry.stdout)} == workers
    said = " ".join(cli("recover", "--max-attempts", "3", "--dry-run", dsn=dsn).stdout.split())
    assert "jobs queued without their own max_attempts would be given 3" in said

    done = cli("recover", "--max-attempts", "3", dsn=dsn)
    assert done.exit_code == 0, done.output
    assert "recovered 4 stale jobs" in done.stdout
    assert "jobs queued without their own max_attempts were given 3 (--max-attempts)" in (
        " ".join(done.stdout.split())
    )
    assert {job_id: status_of(admin, job_id)[0] for job_id in jobs.values()} == workers


def test_recover_by_default_gives_queue_options_default_and_says_so(admin, dsn: str) -> None:
    set_up(admin)
    job_id = stale(admin, 1, None)
    done = cli("recover", dsn=dsn)
    assert done.exit_code == 0, done.output
    default = QueueOptions().max_attempts
    assert (
        f"jobs queued without their own max_attempts were given {default} "
        "(the default of --max-attempts and of QueueOptions.max_attempts)"
    ) in " ".join(done.stdout.split())
    assert status_of(admin, job_id)[0] == ("queued" if default > 1 else "failed")


def test_recover_refuses_a_max_attempts_below_one(dsn: str) -> None:
    refused = cli("recover", "--max-attempts", "0", dsn=dsn)
    assert refused.exit_code == 2
    assert "--max-attempts" in refused.stderr
