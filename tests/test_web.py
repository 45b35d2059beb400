"""The dashboard over HTTP (no browser): signing in, sessions, CSRF and origin checks,
read-only mode, escaping, privacy, paging, mounting, and its pure parts (history,
charts). tests/test_browser.py drives it in a real browser."""

from __future__ import annotations

import asyncio
import hashlib
import html
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from axa_queue import Queue
from axa_queue.errors import OptionsError
from axa_queue.jobs.attempts import SHOWN_RUNS
from axa_queue.web import create_app
from axa_queue.web import history as history_module
from axa_queue.web.charts import bars
from axa_queue.web.history import History, Series, Tally
from axa_queue.web.reads import Finished
from conftest import acting_role, status_of

DOCS = Path(__file__).resolve().parent.parent / "docs" / "dashboard.md"

TOKEN = "t0ken-for-the-dashboard-tests"
SECRET = "S3CRET-in-the-args-9f1c"
ORIGIN = {"origin": "http://testserver"}
PAGES = ["/", "/live", "/jobs", "/review", "/failed", "/schedules", "/workers", "/acts"]


@pytest.fixture
def tables(dsn: str) -> str:
    async def setup() -> None:
        queue = Queue(dsn)
        await queue.open()
        await queue.close()

    asyncio.run(setup())
    return dsn


def seed(admin: psycopg.Connection[Any], name: str, status: str, n: int = 1) -> list[uuid.UUID]:
    """`n` jobs named `name` in `status`, each with the secret in its arguments."""
    ids = [uuid.uuid4() for _ in range(n)]
    for one in ids:
        admin.execute(
            "INSERT INTO axa_queue (id, name, args, status, attempts, error) "
            "VALUES (%s, %s, %s::jsonb, %s, %s, %s)",
            (
                one,
                name,
                f'{{"password": "{SECRET}"}}',
                status,
                0 if status == "queued" else 1,
                "boom <script>alert(2)</script>" if status == "failed" else None,
            ),
        )
    return ids


def signed_in(app: Any, name: str = "alice", **client: Any) -> TestClient:
    web = TestClient(app, **client)
    answer = web.post(
        "/signin", data={"token": TOKEN, "name": name}, headers=ORIGIN, follow_redirects=False
    )
    assert answer.status_code == 303, answer.text
    return web


def states_of(admin: psycopg.Connection[Any], name: str) -> dict[str, int]:
    rows = admin.execute(
        "SELECT status, count(*) FROM axa_queue WHERE name = %s GROUP BY status", (name,)
    ).fetchall()
    return dict(rows)


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found is not None
    return found[1]


def acts_of(admin: psycopg.Connection[Any], job: uuid.UUID) -> list[tuple[str, str, str]]:
    return [
        (r[0], r[1], r[2])
        for r in admin.execute(
            "SELECT act, by, reason FROM axa_job_acts WHERE job_id = %s ORDER BY id", (job,)
        )
    ]


@pytest.fixture
def board(tables: str) -> Iterator[TestClient]:
    with signed_in(create_app(tables, token=TOKEN)) as web:
        yield web


def test_every_page_needs_signing_in(tables: str) -> None:
    web = TestClient(create_app(tables, token=TOKEN))
    for page in PAGES:
        answer = web.get(page, follow_redirects=False)
        assert answer.status_code == 303 and answer.headers["location"] == "/signin", page
    assert web.get("/live", headers={"hx-request": "true"}).status_code == 401
    assert web.post("/act", data={"act": "cancel"}, headers=ORIGIN).status_code == 403


def test_a_wrong_token_or_a_blank_name_signs_no_one_in(tables: str) -> None:
    web = TestClient(create_app(tables, token=TOKEN))
    for data in ({"token": TOKEN + "x", "name": "alice"}, {"token": TOKEN, "name": "a\u202eb"}):
        answer = web.post("/signin", data=data, headers=ORIGIN, follow_redirects=False)
        assert answer.status_code == 403 and "set-cookie" not in answer.headers
    assert web.get("/", follow_redirects=False).status_code == 303


def test_the_session_cookie_is_httponly_strict_and_secure_over_https(tables: str) -> None:
    app = create_app(tables, token=TOKEN)
    plain = TestClient(app).post(
        "/signin", data={"token": TOKEN, "name": "alice"}, headers=ORIGIN, follow_redirects=False
    )
    cookie = plain.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Secure" not in cookie
    secure = TestClient(app, base_url="https://testserver").post(
        "/signin",
        data={"token": TOKEN, "name": "alice"},
        headers={"origin": "https://testserver"},
        follow_redirects=False,
    )
    assert "Secure" in secure.headers["set-cookie"]


def test_a_signed_in_person_cancels_a_selection_and_each_act_records_their_name(
    board: TestClient, admin
) -> None:
    first, second = seed(admin, "Mail", "queued", 2)
    [done] = seed(admin, "Mail", "completed")
    page = board.get("/jobs?state=queued")
    assert page.status_code == 200 and str(first) in page.text
    answer = board.post(
        "/act",
        data={
            "act": "cancel",
            "id": [str(first), str(second), str(done)],
            "reason": "INC-7",
            "csrf": csrf_of(page.text),
        },
        headers=ORIGIN,
    )
    assert answer.status_code == 200
    said = re.findall(r'class="said">([^<]*)<', answer.text)
    assert said == ["cancelled", "cancelled", "not applied: the job had already completed"]
    assert acts_of(admin, first) == [("cancelled", "alice", "INC-7")]
    assert acts_of(admin, done) == []
    assert "alice" in board.get(f"/jobs/{first}").text
    assert "INC-7" in board.get("/acts?by=alice").text


def test_cancelling_a_running_job_from_the_dashboard_says_its_worker_was_told(
    board: TestClient, admin
) -> None:
    [job] = seed(admin, "Mail", "queued")
    admin.execute(
        "UPDATE axa_queue SET status = 'running', attempts = 1, started_at = now() WHERE id = %s",
        (job,),
    )
    page = board.get("/jobs?state=running")
    assert 'value="cancel"' in page.text and str(job) in page.text
    assert 'value="cancel"' in board.get(f"/jobs/{job}").text
    answer = board.post(
        "/act",
        data={"act": "cancel", "id": str(job), "reason": "INC-8", "csrf": csrf_of(page.text)},
        headers=ORIGIN,
    )
    said = re.findall(r'class="said">([^<]*)<', answer.text)
    assert said == ["cancelled while it ran; its worker was told to stop it"]
    assert acts_of(admin, job) == [("cancelled", "alice", "INC-8")]


def test_a_running_job_whose_worker_process_is_gone_is_marked_on_its_page_and_the_list(
    board: TestClient, admin
) -> None:
    gone, live = uuid.uuid4(), uuid.uuid4()
    jobs = {}
    for worker, seen in ((gone, "1 hour"), (live, "0 seconds")):
        [jobs[worker]] = seed(admin, "Mail", "queued")
        admin.execute(
            "UPDATE axa_queue SET status = 'running', attempts = 1, started_at = now(), "
            "updated_at = now() - %s::interval, run_worker = %s, run_attempt = 1, "
            "run_host = 'box', run_pid = 7 WHERE id = %s",
            (seen, worker, jobs[worker]),
        )
        admin.execute(
            "INSERT INTO axa_workers (id, host, pid, names, loops, version, seen_at, beat_ms) "
            "VALUES (%s, 'box', 7, '{Mail}', 1, 'test', now() - %s::interval, 100)",
            (worker, seen),
        )
    assert 'id="job-worker-gone"' in board.get(f"/jobs/{jobs[gone]}").text
    assert "worker gone" not in board.get(f"/jobs/{jobs[live]}").text
    listed = board.get("/jobs?state=running").text
    rows = re.findall(r'<tr data-id="([^"]+)">(.*?)</tr>', listed, re.S)
    assert {row: "worker gone" in html for row, html in rows} == {
        str(jobs[gone]): True,
        str(jobs[live]): False,
    }


def test_retry_and_release_record_their_acts(board: TestClient, admin) -> None:
    [failed] = seed(admin, "Pay", "failed")
    [review] = seed(admin, "Pay", "needs_review")
    csrf = csrf_of(board.get("/failed").text)
    for job in (failed, review):
        board.post(
            "/act",
            data={"act": "retry", "id": str(job), "reason": "OPS-1", "csrf": csrf},
            headers=ORIGIN,
        )
    assert acts_of(admin, failed) == [("retried", "alice", "OPS-1")]
    assert acts_of(admin, review) == [("released", "alice", "OPS-1")]


def test_an_act_without_its_csrf_token_or_from_another_origin_is_refused(
    board: TestClient, admin
) -> None:
    [job] = seed(admin, "Mail", "queued")
    csrf = csrf_of(board.get("/jobs").text)
    tries = [
        ({"act": "cancel", "id": str(job), "reason": "X"}, ORIGIN),
        ({"act": "cancel", "id": str(job), "reason": "X", "csrf": "0" * 64}, ORIGIN),
        (
            {"act": "cancel", "id": str(job), "reason": "X", "csrf": csrf},
            {"origin": "https://evil.example"},
        ),
        ({"act": "cancel", "id": str(job), "reason": "X", "csrf": csrf}, {}),
    ]
    for data, headers in tries:
        assert board.post("/act", data=data, headers=headers).status_code == 403
    assert acts_of(admin, job) == []


def test_a_reason_that_is_not_a_code_is_refused_with_nothing_done(board: TestClient, admin) -> None:
    [job] = seed(admin, "Mail", "queued")
    csrf = csrf_of(board.get("/jobs").text)
    for reason in ("", " padded", "two\nlines"):
        answer = board.post(
            "/act",
            data={"act": "cancel", "id": str(job), "reason": reason, "csrf": csrf},
            headers=ORIGIN,
        )
        assert answer.status_code == 400
    assert acts_of(admin, job) == []


def test_a_person_pauses_a_name_from_its_jobs_page_and_resumes_it_from_the_paused_page(
    board: TestClient, admin
) -> None:
    seed(admin, "Mail", "queued", 2)
    page = board.get("/jobs?state=queued&name=Mail")
    assert 'value="pause"' in page.text and "is paused" not in page.text
    answer = board.post(
        "/pause",
        data={"act": "pause", "name": "Mail", "reason": "INC-9", "csrf": csrf_of(page.text)},
        headers=ORIGIN,
    )
    assert answer.status_code == 200 and "its jobs stay queued" in answer.text
    paused = board.get("/paused")
    assert 'data-name="Mail"' in paused.text and "INC-9" in paused.text
    assert "Mail is paused" in board.get("/jobs?state=queued&name=Mail").text
    assert "s-paused" in board.get("/").text  # marked on the overview's names
    again = board.post(
        "/pause",
        data={"act": "pause", "name": "Mail", "reason": "INC-9", "csrf": csrf_of(paused.text)},
        headers=ORIGIN,
    )
    assert "not applied: it was paused already" in again.text
    resumed = board.post(
        "/pause",
        data={
            "act": "resume",
            "name": "Mail",
            "reason": "INC-9-done",
            "csrf": csrf_of(paused.text),
        },
        headers=ORIGIN,
    )
    assert "resumed" in resumed.text
    assert "No name is paused." in board.get("/paused").text
    rows = admin.execute(
        "SELECT act, by, reason, job_id::text FROM axa_job_acts WHERE job_name = 'Mail' ORDER BY id"
    ).fetchall()
    assert rows == [
        ("paused", "alice", "INC-9", "00000000-0000-0000-0000-000000000000"),
        ("resumed", "alice", "INC-9-done", "00000000-0000-0000-0000-000000000000"),
    ]
    log = board.get("/acts").text
    assert "INC-9-done" in log and 'href="/jobs/00000000-0000' not in log  # the name, no job


def test_a_pause_without_a_reason_or_on_a_read_only_dashboard_does_nothing(
    tables: str, board: TestClient, admin
) -> None:
    page = board.get("/paused")
    answer = board.post(
        "/pause",
        data={"act": "pause", "name": "Mail", "reason": "", "csrf": csrf_of(page.text)},
        headers=ORIGIN,
    )
    assert answer.status_code == 400
    with signed_in(create_app(tables, token=TOKEN, read_only=True)) as web:
        paused = web.get("/paused")
        assert 'action="/pause"' not in paused.text
        refused = web.post(
            "/pause",
            data={"act": "pause", "name": "Mail", "reason": "X", "csrf": csrf_of(paused.text)},
            headers=ORIGIN,
        )
        assert refused.status_code == 403
    assert admin.execute("SELECT count(*) FROM axa_paused").fetchone() == (0,)


def test_acting_on_every_job_a_filter_matches_shows_the_count_first_then_acts_on_all(
    board: TestClient, admin
) -> None:
    failed = seed(admin, "Pay", "failed", 7)
    seed(admin, "Mail", "failed", 2)
    page = board.get("/failed?name=Pay")
    assert 'id="act-all"' in page.text
    confirm = board.get("/act/all?state=failed&name=Pay")
    assert confirm.status_code == 200
    assert re.search(r'id="would">7<', confirm.text)
    assert all(status_of(admin, one)[0] == "failed" for one in failed)  # only counted
    done = board.post(
        "/act/all",
        data={
            "state": "failed",
            "name": "Pay",
            "reason": "INC-11",
            "csrf": csrf_of(confirm.text),
            "act": "retry",
        },
        headers=ORIGIN,
    )
    assert done.status_code == 200 and re.search(r'id="changed">7<', done.text)
    assert all(status_of(admin, one)[0] == "queued" for one in failed)
    assert acts_of(admin, failed[0]) == [("retried", "alice", "INC-11")]
    assert states_of(admin, "Mail") == {"failed": 2}
    no_reason = board.post(
        "/act/all",
        data={"state": "failed", "name": "Mail", "reason": "", "csrf": csrf_of(confirm.text)},
        headers=ORIGIN,
    )
    assert no_reason.status_code == 400 and states_of(admin, "Mail") == {"failed": 2}


def test_acting_on_every_matching_job_takes_no_job_queued_after_the_count_confirmed(
    board: TestClient, admin
) -> None:
    counted = seed(admin, "Late", "queued", 5)
    confirm = board.get("/act/all?state=queued&name=Late")
    assert re.search(r'id="would">5<', confirm.text)
    later = seed(admin, "Late", "queued", 2)  # queued while the person reads the count
    match = re.search(r'name="counted_at" value="([^"]+)"', confirm.text)
    assert match is not None
    done = board.post(
        "/act/all",
        data={
            "state": "queued",
            "name": "Late",
            "counted_at": html.unescape(match[1]),
            "reason": "INC-12",
            "csrf": csrf_of(confirm.text),
            "act": "cancel",
        },
        headers=ORIGIN,
    )
    assert done.status_code == 200 and re.search(r'id="changed">5<', done.text)
    assert all(status_of(admin, one)[0] == "cancelled" for one in counted)
    assert all(status_of(admin, one)[0] == "queued" for one in later)


def test_a_time_at_the_edge_of_what_a_date_holds_is_a_bad_parameter_not_an_error(
    board: TestClient,
) -> None:
    for path in (
        "/jobs?state=completed&until=0001-01-01T00:00:00%2B14:00",
        "/jobs?state=completed&until=9999-12-31T23:59:59-14:00",
        "/failed?since=0001-01-01T00:00:00%2B01:00",
    ):
        answer = board.get(path)
        assert answer.status_code == 400 and "between years 1 and 9999" in answer.text, path


def test_a_pages_refresh_without_a_session_is_sent_to_the_sign_in(tables: str) -> None:
    with TestClient(create_app(tables, token=TOKEN)) as web:
        answer = web.get("/live", headers={"hx-request": "true"}, follow_redirects=False)
    assert answer.status_code == 401 and answer.headers["hx-redirect"] == "/signin"


def test_a_job_page_shows_the_start_of_an_error_another_client_made_huge(
    board: TestClient, admin
) -> None:
    [job] = seed(admin, "Mail", "failed")
    admin.execute("UPDATE axa_queue SET error = repeat('x', 2000000) WHERE id = %s", (job,))
    page = board.get(f"/jobs/{job}")
    assert page.status_code == 200 and len(page.text) < 100_000
    assert "(1,995,904 more characters)" in page.text


def test_a_job_page_lists_its_latest_attempts_and_counts_the_earlier_ones(
    board: TestClient, admin
) -> None:
    [job] = seed(admin, "Poll", "queued")
    admin.execute(
        "INSERT INTO axa_queue_attempts (job_id, attempt, started_at, ended_at, outcome) "
        "SELECT %s, g, now(), now(), 'slept' FROM generate_series(1, %s) g",
        (job, SHOWN_RUNS + 10),
    )
    page = board.get(f"/jobs/{job}")
    assert page.status_code == 200
    assert page.text.count('<tr data-attempt="') == SHOWN_RUNS
    assert f'<tr data-attempt="{SHOWN_RUNS + 10}"' in page.text  # the latest
    assert '<tr data-attempt="10"' not in page.text
    assert "10 earlier ones are not shown" in page.text


def test_read_only_offers_no_act_and_refuses_one(tables: str, admin) -> None:
    [job] = seed(admin, "Mail", "queued")
    with signed_in(create_app(tables, token=TOKEN, read_only=True)) as web:
        page = web.get("/jobs")
        assert str(job) in page.text and 'action="/act"' not in page.text
        assert 'value="cancel"' not in web.get(f"/jobs/{job}").text
        csrf = csrf_of(page.text)  # the sign-out form's
        answer = web.post(
            "/act",
            data={"act": "cancel", "id": str(job), "reason": "X", "csrf": csrf},
            headers=ORIGIN,
        )
        assert answer.status_code == 403 and "read-only" in answer.text
    assert acts_of(admin, job) == []


def test_no_page_shows_a_jobs_arguments_and_names_and_errors_are_escaped(
    board: TestClient, admin
) -> None:
    jobs = [
        *seed(admin, "<script>alert(1)</script>", "queued"),
        *seed(admin, "Pay", "failed"),
        *seed(admin, "Pay", "needs_review"),
        *seed(admin, "Pay", "completed"),
    ]
    csrf = csrf_of(board.get("/").text)
    board.post(
        "/act",
        data={"act": "cancel", "id": str(jobs[0]), "reason": "<b>x</b>", "csrf": csrf},
        headers=ORIGIN,
    )
    states = [
        f"/jobs?state={s}" for s in ("queued", "failed", "needs_review", "completed", "cancelled")
    ]
    for page in [*PAGES, *states, *(f"/jobs/{job}" for job in jobs)]:
        html = board.get(page).text
        assert SECRET not in html, page
        assert "<script>alert" not in html and "<b>x</b>" not in html, page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in board.get("/jobs?state=cancelled").text
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in board.get(f"/jobs/{jobs[1]}").text


def test_every_answer_carries_a_strict_content_security_policy(board: TestClient) -> None:
    for page in [*PAGES, "/signin", "/static/style.css"]:
        headers = board.get(page).headers
        assert "script-src 'self'" in headers["content-security-policy"], page
        assert "unsafe-inline" not in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY"


def test_pages_of_jobs_follow_each_other_without_gaps_or_repeats(board: TestClient, admin) -> None:
    made = set(seed(admin, "Bulk", "completed", 120))
    admin.execute("UPDATE axa_queue SET updated_at = now() - (random() * interval '1 hour')")
    for order in ("newest", "oldest"):
        seen: list[str] = []
        url = f"/jobs?state=completed&order={order}"
        while url:
            html = board.get(url).text
            seen += re.findall(r'<tr data-id="([0-9a-f-]+)"', html)
            found = re.search(r'id="next" href="([^"]+)"', html)
            url = "/jobs" + found[1].replace("&amp;", "&") if found else ""
        assert len(seen) == len(set(seen)) == 120
        assert {uuid.UUID(one) for one in seen} == made


def test_past_the_count_cap_the_overview_shows_estimates_and_lower_bounds(
    board: TestClient, admin, monkeypatch
) -> None:
    monkeypatch.setattr("axa_queue.web.overview.COUNT_CAP", 5)
    seed(admin, "Mail", "queued", 8)
    admin.execute("ANALYZE axa_queue")
    html = board.get("/live").text
    assert re.search(r'id="total-ready">≈ \d+</span>', html)
    assert '<td class="num n-ready">5+</td>' in html
    assert "the planner's estimates" in html


def test_the_schedules_page_shows_an_interval_or_a_cron_expression_and_its_zone(
    board: TestClient, admin
) -> None:
    admin.execute(
        "INSERT INTO axa_schedule (name, due_at, interval_ms, cron, timezone) VALUES "
        "('hourly', now(), 3600000, NULL, NULL), "
        "('nightly', now(), NULL, '30 2 * * *', 'Europe/Paris')"
    )
    page = board.get("/schedules").text
    assert "every 60.0 min" in page
    assert "<code>30 2 * * *</code>" in page and "Europe/Paris" in page


def test_searching_by_id_opens_the_job(board: TestClient, admin) -> None:
    [job] = seed(admin, "Mail", "queued")
    answer = board.get(f"/jobs?id={job}", follow_redirects=False)
    assert answer.headers["location"] == f"/jobs/{job}"
    assert board.get("/jobs?id=not-an-id").status_code == 400
    assert board.get(f"/jobs/{uuid.uuid4()}").status_code == 404
    admin.execute(
        "INSERT INTO axa_job_acts (job_id, job_name, act, attempts, by, reason) "
        "VALUES ('00000000-0000-0000-0000-000000000000', 'Mail', 'paused', 0, 'ops', 'X')"
    )  # an act on a name: the nil id is no job's
    assert board.get("/jobs/00000000-0000-0000-0000-000000000000").status_code == 404


def test_a_trusted_header_signs_in_only_from_a_trusted_proxy(tables: str, admin) -> None:
    [job] = seed(admin, "Mail", "queued")
    app = create_app(tables, trust_header="X-Forwarded-User", trusted_proxies=["10.0.0.0/8"])
    user = {"x-forwarded-user": "bob"}
    stranger = TestClient(app, client=("192.0.2.1", 5000))
    assert stranger.get("/", headers=user, follow_redirects=False).status_code == 303
    proxied = TestClient(app, client=("10.1.2.3", 5000))
    page = proxied.get("/jobs", headers=user)
    assert page.status_code == 200 and "bob" in page.text
    proxied.post(
        "/act",
        data={"act": "cancel", "id": str(job), "reason": "SSO", "csrf": csrf_of(page.text)},
        headers={**user, **ORIGIN},
    )
    assert acts_of(admin, job) == [("cancelled", "bob", "SSO")]


def test_the_dashboard_mounts_inside_another_app_under_a_prefix(tables: str, admin) -> None:
    [job] = seed(admin, "Mail", "queued")
    host = Starlette(routes=[Mount("/ops/queue", create_app(tables, token=TOKEN))])
    web = TestClient(host)
    assert web.get("/ops/queue/", follow_redirects=False).headers["location"] == "/ops/queue/signin"
    answer = web.post(
        "/ops/queue/signin",
        data={"token": TOKEN, "name": "carol"},
        headers=ORIGIN,
        follow_redirects=False,
    )
    assert (
        answer.headers["location"] == "/ops/queue/"
        and "Path=/ops/queue/" in answer.headers["set-cookie"]
    )
    page = web.get("/ops/queue/jobs")
    assert (
        'href="/ops/queue/static/style.css"' in page.text and 'action="/ops/queue/act"' in page.text
    )
    web.post(
        "/ops/queue/act",
        data={"act": "cancel", "id": str(job), "reason": "R", "csrf": csrf_of(page.text)},
        headers=ORIGIN,
    )
    assert acts_of(admin, job) == [("cancelled", "carol", "R")]
    assert web.get("/ops/queue/static/htmx.min.js").status_code == 200


def _documented_grants() -> str:
    """The dashboard role's grants, word for word as docs/dashboard.md gives them."""
    text = DOCS.read_text(encoding="utf-8")
    block = text.split("```sql\n", 1)[1].split("```", 1)[0]
    assert "axa_dashboard" in block
    return block


def test_the_documented_grants_are_enough_to_see_every_page_and_act(
    tables: str, admin, schema: str
) -> None:
    [job] = seed(admin, "Mail", "queued")
    with acting_role(admin, tables) as (role, as_role):
        grants = _documented_grants().replace("jobs", f'"{schema}"')
        admin.execute(grants.replace("axa_dashboard", f'"{role}"'))
        with signed_in(create_app(as_role, token=TOKEN)) as web:
            for page in [*PAGES, f"/jobs/{job}", "/jobs?state=completed", "/paused"]:
                assert web.get(page).status_code == 200, page
            csrf = csrf_of(web.get("/").text)
            answer = web.post(
                "/act",
                data={"act": "cancel", "id": str(job), "reason": "R", "csrf": csrf},
                headers=ORIGIN,
            )
            assert answer.status_code == 200
            paused = web.post(
                "/pause",
                data={"act": "pause", "name": "Mail", "reason": "R", "csrf": csrf},
                headers=ORIGIN,
            )
            assert paused.status_code == 200 and "its jobs stay queued" in paused.text
        row = admin.execute("SELECT db_role FROM axa_job_acts WHERE job_id = %s", (job,)).fetchone()
        assert row is not None and row[0] == role
        with psycopg.connect(as_role) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT result FROM axa_queue_steps")  # a step's result: never


def test_there_must_be_a_way_to_sign_in_and_a_long_token(tables: str) -> None:
    with pytest.raises(OptionsError, match="needs a way to sign in"):
        create_app(tables)
    with pytest.raises(OptionsError, match="shorter than 16"):
        create_app(tables, token="short")
    with pytest.raises(OptionsError, match="--trusted-proxy"):
        create_app(tables, trust_header="X-User")


def test_the_vendored_htmx_is_the_one_its_note_names() -> None:
    static = Path(create_app.__code__.co_filename).parent / "static"
    digest = hashlib.sha256((static / "htmx.min.js").read_bytes()).hexdigest()
    note = (static / "VENDORED.md").read_text()
    assert digest in note and "2.0.11" in note and (static / "htmx.LICENSE").exists()


# --- the pure parts ---------------------------------------------------------------------


async def test_history_reads_the_hour_then_the_past_a_step_at_a_time_and_then_the_last_two(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[tuple[int, int | None]] = []
    now = 1_800_000_000.0  # a whole minute
    minute = int(now)
    rows = [Finished(minute - 120, "Mail", 3, 1, 0)]

    async def read(since: int, until: int | None) -> list[Finished]:
        asked.append((since, until))
        return [r for r in rows if since <= r.minute and (until is None or r.minute < until)]

    clock = [1000.0]
    monkeypatch.setattr(history_module.time, "monotonic", lambda: clock[0])
    history = History()
    await history.refresh(read, ready=5, now=now)
    hour = minute - 3600
    assert asked == [(hour, None), (hour - 600, hour)]
    clock[0] += 2
    await history.refresh(read, ready=7, now=now)
    assert asked[2:] == [(minute - 60, None), (hour - 1200, hour - 600)]
    assert history.recent_by_name(now=now) == {"Mail": Tally(completed=3, failed=1, cancelled=0)}
    assert history.series("completed", 60, 1, now=now).values[-3] == 3
    assert history.series("backlog", 60, 1, now=now).values[-1] == 7
    # A job of that minute failed again since, three minutes later: once a minute the
    # hour is read again, and it counts in its new minute only.
    rows[:] = [Finished(minute - 120, "Mail", 3, 0, 0), Finished(minute + 60, "Mail", 0, 1, 0)]
    clock[0] += 60
    await history.refresh(read, ready=7, now=now + 120)
    assert asked[4][0] == minute + 120 - 3600
    assert history.recent_by_name(now=now + 120) == {"Mail": Tally(completed=3, failed=1)}


async def test_history_reads_every_minute_since_its_last_refresh_and_again_after_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[tuple[int, int | None]] = []
    now = 1_800_000_000.0  # a whole minute
    minute = int(now)
    failing = False

    async def read(since: int, until: int | None) -> list[Finished]:
        asked.append((since, until))
        if failing:
            raise OSError("the database is out of reach")
        return [Finished(minute + 120, "Mail", 4, 0, 0)] if until is None else []

    clock = [1000.0]
    monkeypatch.setattr(history_module.time, "monotonic", lambda: clock[0])
    history = History()
    await history.refresh(read, ready=5, now=now)
    hour = minute - 3600
    # Nobody looks for five minutes; the jobs finished meanwhile are read all the same.
    clock[0] += 2
    failing = True
    with pytest.raises(OSError):
        await history.refresh(read, ready=5, now=now + 300)
    assert asked[2:] == [(minute, None)]
    failing = False
    clock[0] += 2
    await history.refresh(read, ready=5, now=now + 300)
    assert asked[3:] == [(minute, None), (hour - 1200, hour - 600)]
    assert history.recent_by_name(now=now + 300) == {"Mail": Tally(completed=4)}


def test_a_chart_is_svg_with_escaped_text() -> None:
    drawn = bars(Series([0, 60], [1, 4]), "<b>", "completed")
    assert drawn.startswith("<svg") and "&lt;b&gt;" in drawn and "<b>" not in drawn
    assert drawn.count("<rect") == 2


def test_a_charts_axis_says_the_date_and_time_of_each_end_in_utc() -> None:
    start = 1_796_530_500  # 2026-12-06 04:15 UTC
    drawn = bars(Series([start - 23 * 3600 - 900, start], [1, 2]), "day", "completed")
    ends = re.findall(r'<text class="time[^"]*"[^>]*>([^<]+)</text>', drawn)
    assert ends == ["Dec 5 05:00", "Dec 6 04:15 UTC"]
    assert "<title>Dec 6 04:15 UTC: 2</title>" in drawn


# --- the commands -----------------------------------------------------------------------


def test_axa_queue_web_serves_the_dashboard_until_ctrl_c(tables: str, tmp_path: Path) -> None:
    import os
    import signal
    import socket
    import subprocess
    import sys
    import urllib.request

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    (tmp_path / "token").write_text(TOKEN + "\n")
    env = {**os.environ, "PYTHONPATH": str(Path(create_app.__code__.co_filename).parents[2])}
    command = [sys.executable, "-m", "axa_queue.cli", "web", "--dsn", tables, "--port", str(port)]
    server = subprocess.Popen(
        [*command, "--token-file", str(tmp_path / "token"), "--base-path", "/queue"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert f"http://127.0.0.1:{port}/queue/" in line and TOKEN not in line
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/queue/signin") as page:
                    assert page.status == 200 and "Sign in" in page.read().decode()
                break
            except OSError:
                assert time.monotonic() < deadline, "the dashboard did not answer"
                time.sleep(0.1)
    finally:
        server.send_signal(signal.SIGINT)
        _, stderr = server.communicate(timeout=30)
    assert server.returncode == 0, stderr
    assert "Traceback" not in stderr


def test_axa_queue_web_refuses_a_short_or_missing_token_file(tables: str, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from axa_queue.cli import main

    (tmp_path / "short").write_text("abc")
    runner = CliRunner(env={"AXA_QUEUE_DSN": tables, "AXA_QUEUE_WEB_TOKEN": None})
    short = runner.invoke(main, ["web", "--token-file", str(tmp_path / "short")])
    assert short.exit_code == 2 and "shorter than 16" in short.output
    missing = runner.invoke(main, ["web", "--token-file", str(tmp_path / "none")])
    assert missing.exit_code == 1 and "cannot read the token file" in missing.output
    header = runner.invoke(main, ["web", "--trust-header", "X-User"])
    assert header.exit_code == 2 and "--trusted-proxy" in header.output


def test_axa_queue_web_on_an_address_in_use_says_so_in_one_line_before_anything_else(
    tables: str,
) -> None:
    import socket

    from click.testing import CliRunner

    from axa_queue.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        runner = CliRunner(env={"AXA_QUEUE_DSN": tables, "AXA_QUEUE_WEB_TOKEN": "t" * 24})
        answer = runner.invoke(main, ["web", "--port", str(port)])
    assert answer.exit_code == 1, answer.output
    assert answer.output.startswith(f"Error: cannot listen on 127.0.0.1:{port}: ")
    assert "the dashboard is at" not in answer.output


def _worker(admin: psycopg.Connection[Any], names: list[str], ago: str, beat_ms: int) -> None:
    admin.execute(
        "INSERT INTO axa_workers (id, host, pid, names, loops, version, seen_at, beat_ms) "
        "VALUES (%s, 'web-1', 4242, %s, 1, 'x', now() - %s::interval, %s)",
        (uuid.uuid4(), names, ago, beat_ms),
    )


def test_the_overview_warns_of_names_no_live_worker_handles_and_the_workers_page_of_gone_ones(
    board: TestClient, admin
) -> None:
    seed(admin, "Known", "queued", 2)
    seed(admin, "Knwon2", "queued", 3)
    seed(admin, "Fresh", "queued")
    admin.execute(
        "UPDATE axa_queue SET run_at = now() - interval '20 minutes' WHERE name <> 'Fresh'"
    )
    _worker(admin, ["Known"], "1 second", 60_000)
    for page in ("/", "/live"):
        html = board.get(page).text
        warning = html[
            html.index('id="unhandled"') : html.index("</section>", html.index('id="unhandled"'))
        ]
        assert 'data-name="Knwon2"' in warning and "3 jobs" in warning, page
        assert "Known<" not in warning and "Fresh" not in warning, page
        assert "10.0 min" in warning
        handled = dict(
            re.findall(r'<tr data-name="(\w+)">.*?<td class="handled">(\w+)</td>', html, re.S)
        )
        assert handled == {"Known": "yes", "Knwon2": "no", "Fresh": "no"}, page
    names = board.get("/names").text
    assert '<td class="handled">yes</td>' in names
    workers = board.get("/workers").text
    assert 'class="state-live"' in workers and "state-gone" not in workers
    # Its worker gone (silent for more than three of its one-second heartbeats), nobody
    # handles Known either; a worker with the name handles Knwon2 again.
    admin.execute("UPDATE axa_workers SET seen_at = now() - interval '5 seconds'")
    _worker(admin, ["Knwon2"], "0 seconds", 60_000)
    admin.execute("UPDATE axa_workers SET beat_ms = 1000 WHERE names = '{Known}'")
    html = board.get("/").text
    warning = html[
        html.index('id="unhandled"') : html.index("</section>", html.index('id="unhandled"'))
    ]
    assert 'data-name="Known"' in warning and 'data-name="Knwon2"' not in warning
    workers = board.get("/workers").text
    assert workers.count('class="state-gone"') == 1 and workers.count('class="state-live"') == 1
    admin.execute("DELETE FROM axa_queue")
    assert 'id="unhandled"' not in board.get("/").text
    # Many such names: the warning lists the first ones and counts the others.
    admin.execute(
        "INSERT INTO axa_queue (id, name, args, run_at) SELECT gen_random_uuid(), "
        "'Typo' || g, '{}', now() - interval '20 minutes' FROM generate_series(1, 45) g"
    )
    live = board.get("/live").text
    assert live.count("<li data-name=") == 20 and "and 25 more names" in live
