"""The dashboard's workflow page in Chromium: the graph drawn as SVG with each member's
state, linked from a member's job page; blocked jobs in the overview's counts; never an
argument or a result on the page."""

from __future__ import annotations

from typing import Any

import psycopg

from axa_queue import NewJob, chord, enqueue_on, group
from test_browser import (  # noqa: F401 - the fixtures, shared
    SECRET,
    browser,
    exchange,
    in_browser,
    page,
    served,
    sign_in,
    tables,
)


def a_chord(admin: psycopg.Connection[Any]) -> Any:
    flow = enqueue_on(
        admin,
        chord(
            group([NewJob("Part", {"card": SECRET, "n": n}) for n in range(3)]),
            NewJob("Gather", {"card": SECRET}),
        ),
    )
    exchange(admin, "Part", [])  # one part claimed
    [claimed] = admin.execute("SELECT id FROM axa_queue WHERE status = 'running'").fetchone()
    exchange(
        admin,
        "Part",
        [{"id": str(claimed), "attempts": 1, "status": "completed", "result": SECRET}],
    )
    return flow


@in_browser
def test_a_members_job_page_links_the_workflow_page_which_draws_its_graph(
    page,  # noqa: F811 - the fixture imported above
    served,  # noqa: F811
    admin,
) -> None:
    flow = a_chord(admin)
    sign_in(page, served)
    assert page.inner_text("#total-blocked") == "1"
    assert page.inner_text("#by-name tr[data-name='Gather'] .n-blocked") == "1"
    page.goto(f"{served.url}/jobs/{flow.jobs[-1]}")
    assert page.inner_text("#job-state") == "blocked"
    page.click("#job-workflow")
    page.wait_for_url(f"{served.url}/workflows/{flow.id}")
    states = page.eval_on_selector_all(
        "#workflow-graph a.node", "nodes => nodes.map(n => n.dataset.state)"
    )
    assert sorted(states) == ["blocked", "completed", "queued", "running"]  # one more claimed
    edges = page.eval_on_selector_all(
        "#workflow-graph line.edge", "lines => lines.map(l => [l.dataset.from, l.dataset.to])"
    )
    assert sorted(edges) == sorted([str(p), str(flow.jobs[-1])] for p in flow.jobs[:3])
    box = page.locator(f"#workflow-graph a.node[data-job='{flow.jobs[-1]}'] rect").bounding_box()
    first = page.locator(f"#workflow-graph a.node[data-job='{flow.jobs[0]}'] rect").bounding_box()
    assert box["x"] > first["x"]  # the callback is drawn right of its group
    assert SECRET not in page.content()
    page.click(f"#workflow-graph a.node[data-job='{flow.jobs[0]}']")
    page.wait_for_url(f"{served.url}/jobs/{flow.jobs[0]}")
    assert page.get_attribute("#job-workflow", "href").endswith(f"/workflows/{flow.id}")
    assert not page.errors


@in_browser
def test_a_workflow_page_for_an_unknown_id_says_so(page, served) -> None:  # noqa: F811
    sign_in(page, served)
    response = page.goto(f"{served.url}/workflows/00000000-0000-0000-0000-000000000001")
    assert response.status == 404
    assert "No such workflow" in page.content()
