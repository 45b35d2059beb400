"""A role with only the grants docs/production.md documents may not set the tables up:
asked to, the API and the CLI say what to do instead (`--no-setup`, or `axa-queue
setup` as the tables' owner), never a bare `permission denied` or a traceback.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result

from axa_queue import Queue, SchemaError
from axa_queue.cli import main
from axa_queue.schema import SETUP_STATEMENTS
from conftest import WORKER_GRANTS, acting_role

HINT = ("--no-setup", "axa-queue setup")


def cli(*args: str, dsn: str) -> Result:
    runner = CliRunner(env={"AXA_QUEUE_DSN": dsn, "DATABASE_URL": None})
    return runner.invoke(main, list(args), prog_name="axa-queue", catch_exceptions=False)


@pytest.fixture
def limited(admin: psycopg.Connection[Any], dsn: str, schema: str) -> Iterator[str]:
    """A DSN for a role with only the documented worker grants, on tables set up but for
    one index (so setup has DDL to run); the role is dropped afterwards."""
    for statement in SETUP_STATEMENTS:
        admin.execute(statement)
    admin.execute("DROP INDEX axa_queue_review")
    docs = (Path(__file__).resolve().parent.parent / "docs" / "production.md").read_text()
    assert WORKER_GRANTS.format(schema="jobs", role="axa_worker").strip() in docs
    with acting_role(admin, dsn, worker_of=schema) as (_, as_worker):
        yield as_worker


def test_opening_with_setup_as_a_role_that_may_not_says_what_to_do(limited: str) -> None:
    async def go() -> None:
        queue = Queue(limited)
        try:
            await queue.open(setup=True)
        finally:
            await queue.close()

    with pytest.raises(SchemaError) as refused:
        asyncio.run(go())
    message = str(refused.value)
    assert all(hint in message for hint in HINT), message
    assert "setup=False" in message
    assert isinstance(refused.value.__cause__, psycopg.errors.InsufficientPrivilege)

    async def checked() -> str:  # and what it says to do works
        async with Queue(limited) as queue:
            return queue.schema

    with pytest.raises(SchemaError):  # open() sets up by default: the same error
        asyncio.run(checked())

    async def no_setup() -> bool:
        queue = Queue(limited)
        await queue.open(setup=False)
        await queue.close()
        return True

    assert asyncio.run(no_setup())


def test_setup_as_a_role_that_may_not_exits_2_saying_what_to_do(limited: str) -> None:
    refused = cli("setup", dsn=limited)
    assert refused.exit_code == 2, refused.output
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), refused.stderr
    assert all(hint in lines[0] for hint in HINT), lines[0]
    assert cli("check", dsn=limited).exit_code == 0


def test_a_worker_started_without_no_setup_as_such_a_role_exits_2_saying_what_to_do(
    limited: str, tmp_path: Path
) -> None:
    module = f"jobs_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            """
            from axa_queue import Queue
            queue = Queue()
            queue.handle("Report", lambda args: None)
            """
        )
    )
    env = {
        **os.environ,
        "AXA_QUEUE_DSN": limited,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "axa_queue.cli", "worker", f"{module}:queue"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and all(hint in errors[0] for hint in HINT), done.stderr
