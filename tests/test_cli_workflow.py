"""`axa-queue workflow ID`: a workflow's members as a tree, and as JSON; never their
arguments or results."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest

from axa_queue import NewJob, chord, enqueue_on, group
from test_cli import cli, one_line_error


@pytest.fixture
def ready(dsn: str) -> str:
    result = cli("setup", dsn=dsn)
    assert result.exit_code == 0, result.output
    return dsn


def a_chord(dsn: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        flow = enqueue_on(
            conn,
            chord(
                group([NewJob("square", {"n": n, "secret": "hush"}) for n in range(3)]),
                NewJob("total", {"secret": "hush"}),
            ),
        )
        conn.execute(
            "UPDATE axa_queue SET status = 'running', attempts = 1, started_at = now() "
            "WHERE id = %s",
            (flow.jobs[0],),
        )
        conn.execute(
            "UPDATE axa_queue SET status = 'completed', result = '\"hush-result\"', "
            "updated_at = now() WHERE id = %s",
            (flow.jobs[0],),
        )
    return flow


def test_workflow_draws_its_members_under_the_jobs_they_wait_for(ready: str) -> None:
    flow = a_chord(ready)
    result = cli("workflow", str(flow.id), dsn=ready)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"workflow {flow.id}: 4 jobs (1 blocked, 1 completed, 2 queued)" in out
    assert "#1, #2, #3" in out  # the callback waits for the whole group
    assert "└─ total" in out
    for job_id in flow.jobs:
        assert str(job_id) in out
    assert "hush" not in out


def test_workflow_takes_a_members_id_and_prints_json(ready: str) -> None:
    flow = a_chord(ready)
    result = cli("workflow", str(flow.jobs[-1]), "--json", dsn=ready)
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    assert found["id"] == str(flow.id)
    assert found["finished"] is False
    assert found["counts"] == {"completed": 1, "queued": 2, "blocked": 1}
    assert [m["state"] for m in found["members"]] == ["completed", "queued", "queued", "blocked"]
    assert found["members"][-1]["parents"] == [str(j) for j in flow.jobs[:3]]
    assert "hush" not in result.stdout


def test_workflow_says_so_when_no_workflow_has_that_id(ready: str) -> None:
    unknown = uuid.uuid4()
    result = cli("workflow", str(unknown), dsn=ready)
    assert result.exit_code == 1
    assert f"no workflow {unknown}" in one_line_error(result)
