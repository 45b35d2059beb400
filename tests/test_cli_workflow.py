"""`axa-queue workflow ID`: a workflow's members as a tree, and as JSON; never their
arguments or results."""

from __future__ import annotations

import io
import json
import sys
import uuid
from typing import Any

import psycopg
import pytest
from rich.console import Console

from axa_queue import JobState, NewJob, chord, enqueue_on, group
from axa_queue.cli.workflows import AFTER_SHOWN, DEEPEST, workflow_lines
from axa_queue.workflows.operate import Member, WorkflowInfo
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


def drawn(info: WorkflowInfo) -> list[str]:
    """`workflow_lines` as a terminal 200 columns wide shows them."""
    console = Console(width=200, record=True, file=io.StringIO())
    for line in workflow_lines(info):
        console.print(line)
    return console.export_text().splitlines()


def test_a_chain_longer_than_pythons_recursion_limit_is_drawn_with_lines_of_bounded_width() -> None:
    ids = [uuid.uuid4() for _ in range(sys.getrecursionlimit() + 500)]
    members = tuple(
        Member(job, "step", JobState.BLOCKED, (ids[i - 1],) if i else ())
        for i, job in enumerate(ids)
    )
    lines = drawn(WorkflowInfo(uuid.uuid4(), members))
    assert len(lines) == 2 + len(ids)  # the head, the columns' names, a line a member
    assert f"#{len(ids) - 1}" in lines[-1] and str(ids[-1]) in lines[-1]
    # From DEEPEST down, every step is drawn at the same indent.
    assert len({line.index("└─ step") for line in lines[DEEPEST + 10 :]}) == 1
    assert max(len(line) for line in lines) <= 200


def test_a_callback_after_a_big_group_names_its_first_parents_and_counts_the_rest() -> None:
    group_ids = [uuid.uuid4() for _ in range(40)]
    members = (
        *(Member(job, "part", JobState.COMPLETED, ()) for job in group_ids),
        Member(uuid.uuid4(), "total", JobState.BLOCKED, tuple(group_ids)),
    )
    (last,) = [line for line in drawn(WorkflowInfo(uuid.uuid4(), members)) if "total" in line]
    shown = ", ".join(f"#{n}" for n in range(1, AFTER_SHOWN + 1))
    assert f"{shown}, and {40 - AFTER_SHOWN} more" in last
