"""A workflow's page (`/workflows/{id}`: the workflow's id, or any member's): its graph
drawn on the server as SVG, with no script and no library, and its members in a table,
`MEMBERS_PAGE` to a page. A workflow of more than `DRAWN` jobs has its first `DRAWN`
drawn (the table lists every one): a chord of 30,000 made a page of 25 MB.

The graph puts each member in a column by its depth (the longest chain of members
before it), its jobs in the order they were given, an arrow from each parent to each
dependent. Boxes show each member's name and state, linked to its job page; the names
are escaped (`markupsafe`). Never arguments or results: nothing read here holds them.
"""

from __future__ import annotations

from uuid import UUID

from markupsafe import Markup, escape
from starlette.requests import Request
from starlette.responses import Response

from ..workflows.operate import Member, WorkflowInfo, workflow_call, workflow_of_call
from . import params
from .board import Dashboard, base_of

__all__ = ["DRAWN", "MEMBERS_PAGE", "graph", "layers", "workflow"]

DRAWN = 200
"""The most members the graph draws: the first ones given (a chain's first steps, a
group's first members), with the arrows among them."""

MEMBERS_PAGE = 500
"""Members listed on one page of the table."""

BOX_W = 150
BOX_H = 40
GAP_X = 60
GAP_Y = 16
MARGIN = 10
NAME_CHARS = 20
"""The most characters of a name a box shows (the whole name is its tooltip)."""


def layers(info: WorkflowInfo) -> dict[UUID, int]:
    """Each member's column: 0 for one with no parent in the workflow, else one more
    than its deepest parent's. Members are given after their parents (a workflow is
    queued in order), so one pass in order suffices."""
    depth: dict[UUID, int] = {}
    for m in info.members:
        inside = [depth[p] for p in m.parents if p in depth]
        depth[m.id] = 1 + max(inside) if inside else 0
    return depth


def _state(member: Member) -> str:
    return "purged" if member.state is None else member.state.value


def graph(info: WorkflowInfo, base: str) -> Markup:
    """The workflow's graph as an inline SVG: a box per member (its name and state, a
    link to its job page, the class `s-STATE` for its colour), an arrow per dependency
    between members; the first `DRAWN` members only."""
    depth = layers(info)
    drawn = info.members[:DRAWN]
    rows: dict[int, int] = {}
    at: dict[UUID, tuple[float, float]] = {}
    for m in drawn:
        column = depth[m.id]
        row = rows.get(column, 0)
        rows[column] = row + 1
        at[m.id] = (MARGIN + column * (BOX_W + GAP_X), MARGIN + row * (BOX_H + GAP_Y))
    width = MARGIN * 2 + (max(rows) + 1) * (BOX_W + GAP_X) - GAP_X if rows else 2 * MARGIN
    height = MARGIN * 2 + max(rows.values(), default=0) * (BOX_H + GAP_Y) - GAP_Y
    parts = [
        f'<svg class="workflow-graph" id="workflow-graph" viewBox="0 0 {width} {max(height, 1)}" '
        f'width="{width}" height="{max(height, 1)}" role="img" '
        f'aria-label="The jobs of workflow {escape(str(info.id))} and what each waits for">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" '
        'markerHeight="6" orient="auto"><path d="M0,0 L10,5 L0,10 z"/></marker></defs>',
    ]
    for m in drawn:
        x, y = at[m.id]
        for p in m.parents:
            if p in at:
                px, py = at[p]
                parts.append(
                    f'<line class="edge" data-from="{p}" data-to="{m.id}" '
                    f'x1="{px + BOX_W:.0f}" y1="{py + BOX_H / 2:.0f}" '
                    f'x2="{x:.0f}" y2="{y + BOX_H / 2:.0f}" marker-end="url(#arrow)"/>'
                )
    for m in drawn:
        x, y = at[m.id]
        name = m.name or "-"
        cut = name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 1] + "…"
        state = _state(m)
        parts.append(
            f'<a href="{escape(base)}/jobs/{m.id}" class="node" data-job="{m.id}" '
            f'data-state="{state}"><title>{escape(name)}: {state}</title>'
            f'<rect class="s-{state}" x="{x:.0f}" y="{y:.0f}" width="{BOX_W}" '
            f'height="{BOX_H}" rx="4"/>'
            f'<text x="{x + 8:.0f}" y="{y + 16:.0f}" class="node-name">{escape(cut)}</text>'
            f'<text x="{x + 8:.0f}" y="{y + 32:.0f}" class="node-state">{state}</text></a>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))


async def workflow(board: Dashboard, request: Request) -> Response:
    """A workflow's page: its graph and its members; a 404 page when the id names no
    workflow and no member of one."""
    some_id = params.as_job_id(request.path_params["workflow_id"])
    found = None if some_id is None else await board.read(workflow_of_call(UUID(some_id)))
    info = None if found is None else await board.read(workflow_call(found))
    if info is None:
        return board.page(
            request,
            "message.html",
            status=404,
            title="No such workflow",
            message="No workflow has this id, and no job of one has it (retention may "
            "have deleted it).",
        )
    number = {m.id: i for i, m in enumerate(info.members, 1)}
    counts: dict[str, int] = {}
    for m in info.members:
        counts[_state(m)] = counts.get(_state(m), 0) + 1
    return board.page(
        request,
        "workflow.html",
        info=info,
        svg=graph(info, base_of(request)),
        drawn=min(DRAWN, len(info.members)),
        **params.page_of(request.query_params, info.members, MEMBERS_PAGE),
        per_page=MEMBERS_PAGE,
        number=number,
        counts=sorted(counts.items()),
        state_of=_state,
    )
