"""Looking at a workflow: `workflow ID`, its members and their states as a tree."""

from __future__ import annotations

from collections import Counter
from typing import Any
from uuid import UUID

import click
from rich.table import Table

from ..db.calls import run_async
from ..queue import Queue
from ..workflows.operate import Member, WorkflowInfo, workflow_call, workflow_of_call
from .conventions import Failed, Printed, answer, dsn_option, json_option
from .text import shown

__all__ = ["workflow", "workflow_json", "workflow_lines"]


@click.command()
@click.argument("some_id", metavar="ID", type=click.UUID)
@json_option
@dsn_option
def workflow(some_id: UUID, as_json: bool, dsn: str | None) -> None:
    """Show a workflow (ID: its own id, or any member's): each member's name and state,
    drawn under the jobs it waits for. Never arguments or results."""

    async def work(queue: Queue) -> WorkflowInfo:
        async with queue.connection() as conn:
            found = await run_async(conn, workflow_of_call(some_id))
            info = None if found is None else await run_async(conn, workflow_call(found))
        if info is None:
            raise Failed(
                f"no workflow {some_id}: no job of that id belongs to one and no workflow "
                "has that id (retention may have deleted it); `axa-queue show ID` shows a job"
            )
        return info

    if as_json:
        answer(dsn, _json_of(work), lambda found: "", as_json=True)
    else:
        answer(dsn, work, workflow_lines)


def _json_of(work: Any) -> Any:
    async def as_dict(queue: Queue) -> dict[str, Any]:
        return workflow_json(await work(queue))

    return as_dict


def workflow_json(info: WorkflowInfo) -> dict[str, Any]:
    """The workflow as `workflow --json` prints it: its id, whether it finished, the
    count of members in each state, and each member (id, name, state, parents' ids)."""
    return {
        "id": str(info.id),
        "finished": info.finished,
        "counts": dict(_counts(info)),
        "members": [
            {
                "id": str(m.id),
                "name": m.name,
                "state": None if m.state is None else m.state.value,
                "parents": [str(p) for p in m.parents],
            }
            for m in info.members
        ],
    }


def _counts(info: WorkflowInfo) -> Counter[str]:
    return Counter(_state(m) for m in info.members)


def _state(member: Member) -> str:
    return "purged" if member.state is None else member.state.value


DEEPEST = 16
"""The deepest level of the tree drawn indented; a member deeper down (a long chain) is
drawn at this level, its `AFTER` naming the job it follows, so the lines stay readable
whatever the depth."""

AFTER_SHOWN = 5
"""The most parents `AFTER` names on a member's line (a chord's callback waits for every
job of its group: the rest are counted, `and N more`)."""


def workflow_lines(info: WorkflowInfo) -> list[Printed]:
    """A line saying where the workflow stands, then its members as a tree: each drawn
    under the first of its parents in the workflow (the others named `also after #N`),
    a job whose parents are outside the workflow at the top. Drawn without recursion, so
    a chain of any length is drawn (its levels below `DEEPEST` at that depth)."""
    counts = ", ".join(f"{n} {state}" for state, n in sorted(_counts(info).items()))
    head = f"workflow {info.id}: {len(info.members)} jobs ({counts})" + (
        ", finished" if info.finished else ""
    )
    number = {m.id: i for i, m in enumerate(info.members, 1)}
    under: dict[UUID | None, list[Member]] = {}
    for m in info.members:
        inside = [p for p in m.parents if p in number]
        under.setdefault(inside[0] if inside else None, []).append(m)
    table = Table(box=None, header_style="bold")
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("JOB", no_wrap=True)
    table.add_column("STATE", no_wrap=True)
    table.add_column("ID", no_wrap=True, min_width=36)
    table.add_column("AFTER")
    # Each entry: a member, the prefix of its line, whether it is the last of its
    # siblings, and its depth; pushed in reverse so each is drawn in order.
    todo: list[tuple[Member, str, bool | None, int]] = [
        (m, "", None, 0) for m in reversed(under.get(None, []))
    ]
    while todo:
        m, prefix, last, depth = todo.pop()
        branch = "" if last is None else ("└─ " if last else "├─ ")
        after = [f"#{number[p]}" if p in number else str(p) for p in m.parents[:AFTER_SHOWN]]
        if len(m.parents) > AFTER_SHOWN:
            after.append(f"and {len(m.parents) - AFTER_SHOWN} more")
        table.add_row(
            str(number[m.id]),
            prefix + branch + shown(m.name or "-"),
            _state(m),
            str(m.id),
            ", ".join(after) or "-",
        )
        children = under.get(m.id, [])
        below = prefix if last is None or depth >= DEEPEST else prefix + ("   " if last else "│  ")
        for i in range(len(children) - 1, -1, -1):
            todo.append((children[i], below, i == len(children) - 1, min(depth + 1, DEEPEST)))
    return [head, table]
