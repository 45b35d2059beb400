"""The dashboard against inputs that once broke a page (issue 23, items 14 to 17): bad
query and form parameters on every route, rows with infinite or out-of-range times in
every time column, a sign-on header sent twice, and ten thousand job names. Over HTTP
through the ASGI app, against a real PostgreSQL; tests/test_browser.py drives the
capped overview and the names page in a browser."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from starlette.routing import Mount, Route
from starlette.testclient import TestClient

from axa_queue import Queue
from axa_queue.jobs.model import JobState
from axa_queue.web import create_app
from axa_queue.web.params import check_cursor
from test_web import ORIGIN, PAGES, SECRET, TOKEN, acts_of, csrf_of, seed, signed_in

BAD_VALUES = [
    "notatime",
    "2024-02-30T00:00:00.000000",
    "a\x00b",
    "²",
    "9" * 30,
    "-1",
    "0",
    " ",
    "x" * 5000,
    "\u202e",
    "'; DROP TABLE axa_queue; --",
]
"""Values no parameter of the dashboard takes (or takes only as itself, as text)."""

PARAMETERS = ["id", "state", "name", "order", "key", "after", "by", "act", "before", "q", "page"]
"""Every query parameter any page reads."""


def _safe(answer: Any, what: str) -> None:
    """No 500, and the security headers, whatever the answer."""
    assert answer.status_code < 500, (what, answer.status_code)
    assert "script-src 'self'" in answer.headers.get("content-security-policy", ""), what
    assert answer.headers.get("cache-control") == "no-store", what
    assert answer.headers.get("x-frame-options") == "DENY", what


@pytest.fixture
def tables(dsn: str) -> str:
    async def setup() -> None:
        queue = Queue(dsn)
        await queue.open()
        await queue.close()

    asyncio.run(setup())
    return dsn


@pytest.fixture
def board(tables: str) -> Iterator[TestClient]:
    """Signed in; a failure is answered as the server would (a 500), not raised."""
    with signed_in(create_app(tables, token=TOKEN), raise_server_exceptions=False) as web:
        yield web


# --- 14: bad parameters -------------------------------------------------------------------


def test_the_prober_s_bad_parameters_get_a_400_page_with_the_security_headers(
    board: TestClient,
) -> None:
    for url in (
        "/jobs?key=notatime",
        "/jobs?key=2024-02-30T00:00:00.000000",
        "/jobs?state=completed&key=2024-02-30T00:00:00.000000&after=" + str(uuid.uuid4()),
        "/jobs?name=a%00b",
        "/failed?name=a%00b",
        "/acts?by=a%00b",
        "/acts?before=%C2%B2",
        "/acts?before=99999999999999999999",
    ):
        answer = board.get(url)
        _safe(answer, url)
        assert answer.status_code == 400, url
        assert 'id="message"' in answer.text and "should be" in answer.text, url
        assert "\x00" not in answer.text and "²" not in answer.text, url  # never echoed


def test_every_route_answers_every_bad_parameter_without_a_500_and_with_the_headers(
    board: TestClient, admin
) -> None:
    [job] = seed(admin, "Mail", "failed")
    paths: list[str] = []
    for route in board.app.routes:  # type: ignore[attr-defined]
        if isinstance(route, Route) and "GET" in (route.methods or ()):
            paths.append(route.path.replace("{job_id}", str(job)))
        elif isinstance(route, Mount):
            paths.append(route.path + "/style.css")
    assert {"/", "/live", "/names", "/jobs", "/acts", f"/jobs/{job}"} <= set(paths)
    for path in paths:
        for parameter in [*PARAMETERS, "unknown"]:
            for value in BAD_VALUES:
                answer = board.get(path, params={parameter: value})
                _safe(answer, f"{path}?{parameter}={value[:20]!r}")
            twice = board.get(path, params=[(parameter, "a"), (parameter, "b")])
            _safe(twice, f"{path}?{parameter} twice")
        _safe(board.get(path + "?%ff%fe=%ff&key=%ff"), f"{path} with bytes not UTF-8")
    for value in BAD_VALUES:
        for path in (f"/jobs/{value}", f"/static/{value}", f"/{value}"):
            _safe(board.get(path.replace("\x00", "%00")), path[:30])


def test_bad_form_fields_get_a_400_and_do_nothing(board: TestClient, admin) -> None:
    [job] = seed(admin, "Mail", "queued")
    csrf = csrf_of(board.get("/jobs").text)
    good = {"act": "cancel", "id": str(job), "reason": "INC-1", "csrf": csrf}
    not_codes = ["", " ", "a\x00b", "x" * 5000, "\u202e", " padded", "two\nlines"]
    for field, values in (("act", BAD_VALUES), ("id", BAD_VALUES), ("reason", not_codes)):
        for value in [*values, ""]:
            answer = board.post("/act", data={**good, field: value}, headers=ORIGIN)
            _safe(answer, f"/act {field}={value[:20]!r}")
            assert answer.status_code == 400, (field, value[:20])
        answer = board.post("/act", data={**good, field: [good[field]] * 2}, headers=ORIGIN)
        assert answer.status_code == (200 if field == "id" else 400), field
    assert acts_of(admin, job) == [("cancelled", "alice", "INC-1")]  # the one with two ids
    for value in BAD_VALUES:
        for data in ({"token": value, "name": "bob"}, {"token": TOKEN, "name": value}):
            answer = board.post("/signin", data=data, headers=ORIGIN, follow_redirects=False)
            _safe(answer, f"/signin {value[:20]!r}")
        for path in ("/signout", "/act"):
            _safe(board.post(path, data={"csrf": value}, headers=ORIGIN), path)
    _safe(
        board.post(
            "/act",
            content=b"--x\r\nbroken",
            headers={**ORIGIN, "content-type": "multipart/form-data; boundary=x"},
        ),
        "/act with a broken multipart body",
    )


def test_an_answer_that_fails_is_a_500_page_with_the_security_headers(
    board: TestClient, monkeypatch
) -> None:
    def broken(*_args: Any) -> Any:
        raise RuntimeError("a private detail of the failure")

    monkeypatch.setattr("axa_queue.web.system.workers_call", broken)
    answer = board.get("/workers")
    assert answer.status_code == 500
    assert "script-src 'self'" in answer.headers["content-security-policy"]
    assert answer.headers["cache-control"] == "no-store"
    assert "could not answer" in answer.text and "private detail" not in answer.text
    for missing in ("/no-such-page", "/static/no-such-file"):
        answer = board.get(missing)
        _safe(answer, missing)
        assert answer.status_code == 404
    _safe(board.post("/jobs", headers=ORIGIN), "POST /jobs")


def test_a_page_cursor_is_a_time_postgresql_holds_in_the_lists_own_form() -> None:
    for key in (
        "2024-02-29T23:59:59.999999",
        "0044-03-15T12:00:00.000000 BC",
        "0001-02-29T00:00:00.000000 BC",  # 1 BC is a leap year
        "4714-11-24T00:00:00.000000 BC",
        "294276-12-31T23:59:59.999999",
        "infinity",
        "-infinity",
    ):
        assert check_cursor(key), key
    for key in (
        "2023-02-29T00:00:00.000000",
        "2024-02-30T00:00:00.000000",
        "2024-13-01T00:00:00.000000",
        "2024-01-01T24:00:00.000000",
        "2024-01-01T00:60:00.000000",
        "0000-01-01T00:00:00.000000",
        "294277-01-01T00:00:00.000000",
        "4714-11-23T00:00:00.000000 BC",
        "4715-01-01T00:00:00.000000 BC",
        "2024-01-01T00:00:00",
        "2024-01-01 00:00:00.000000",
        "２０２４-01-01T00:00:00.000000",
        "Infinity",
        "",
    ):
        assert not check_cursor(key), key


# --- 15: infinite times ---------------------------------------------------------------------

JOB_TIMES = ("run_at", "started_at", "created_at", "updated_at")


def _job_at(admin: psycopg.Connection[Any], status: str, column: str, at: str) -> uuid.UUID:
    # A job enters `blocked` only when it is inserted: made so; the others moved there.
    [job] = seed(admin, "Odd", "blocked" if status == "blocked" else "queued")
    admin.execute(
        "UPDATE axa_queue SET status = %s, attempts = 1, started_at = now() WHERE id = %s",
        (status, job),
    )
    admin.execute(
        sql.SQL("UPDATE axa_queue SET {} = %s WHERE id = %s").format(sql.Identifier(column)),
        (at, job),
    )
    return job


def test_rows_with_infinite_times_in_every_time_column_break_no_page(
    board: TestClient, admin
) -> None:
    jobs = [
        _job_at(admin, state.value, column, at)
        for state in JobState
        for column in JOB_TIMES
        for at in ("infinity", "-infinity")
    ]
    late = [
        _job_at(admin, state, "updated_at", "3000-01-01 00:00:00+00")
        for state in ("completed", "failed")
    ]
    admin.execute(
        "INSERT INTO axa_schedule (name, due_at, interval_ms, seen_at, archived_at, "
        "created_at, updated_at) VALUES "
        "('odd.later', 'infinity', 60000, 'infinity', 'infinity', 'infinity', 'infinity'), "
        "('odd.earlier', '-infinity', 60000, '-infinity', '-infinity', '-infinity', "
        "'-infinity')"
    )
    admin.execute(
        "INSERT INTO axa_workers (id, host, pid, names, loops, running, version, "
        "started_at, seen_at) VALUES "
        "(gen_random_uuid(), 'later', 1, '{Odd}', 1, 0, 'odd', 'infinity', 'infinity'), "
        "(gen_random_uuid(), 'earlier', 2, '{Odd}', 1, 0, 'odd', '-infinity', '-infinity')"
    )
    for at in ("infinity", "-infinity"):
        admin.execute(
            "INSERT INTO axa_job_acts (job_id, job_name, act, attempts, by, reason, at) "
            "VALUES (%s, 'Odd', 'cancelled', 1, 'alice', 'ODD-1', %s)",
            (jobs[0], at),
        )
    pages = [*PAGES, "/names", "/names?order=name"]
    pages += [f"/jobs?state={s.value}&order={o}" for s in JobState for o in ("newest", "oldest")]
    pages += [f"/jobs/{job}" for job in [*jobs, *late]]
    for page in pages:
        answer = board.get(page)
        assert answer.status_code == 200, page
        assert SECRET not in answer.text, page
    live = board.get("/live").text
    # Of the finished rows in each state, the 6 with a finite, recent updated_at count
    # as finished in the last hour; those at infinity or in year 3000 count nowhere.
    for state in ("completed", "failed"):
        assert re.search(rf'id="total-{state}">6</span>', live), state
    assert '<td class="num n-cancelled">6</td>' in live  # the only name's row
    assert '<span class="n" id="oldest">∞</span>' in live  # a ready job due at -infinity
    workers = board.get("/workers").text
    assert "∞ ago" in workers and "&gt;9999-12-31" in workers and "&lt;0001-01-01" in workers


def test_the_commands_that_share_the_reads_take_rows_at_infinity_too(tables: str, admin) -> None:
    from click.testing import CliRunner

    from axa_queue.cli import main

    for at in ("infinity", "-infinity"):
        _job_at(admin, "queued", "run_at", at)
        admin.execute(
            "INSERT INTO axa_workers (id, host, pid, names, loops, running, version, "
            "started_at, seen_at) VALUES (gen_random_uuid(), 'odd', 1, '{Odd}', 1, 0, 'odd', "
            "%s, %s)",
            (at, at),
        )
    runner = CliRunner(env={"AXA_QUEUE_DSN": tables, "DATABASE_URL": None})
    for command in (["workers"], ["workers", "--json"], ["counts"], ["counts", "--by-name"]):
        result = runner.invoke(main, command)
        assert result.exit_code == 0, (command, result.output)
        if "--json" in command:  # standard JSON: no Infinity, which JSON cannot hold

            def refuse(constant: str) -> None:
                raise AssertionError(f"{constant} is not JSON")

            json.loads(result.output, parse_constant=refuse)


def _seed_times(admin: psycopg.Connection[Any], status: str, times: list[str]) -> set[str]:
    """One job of `status` at each of `times` (its due time if queued, else its last
    change)."""
    column = "run_at" if status == "queued" else "updated_at"
    rows = admin.execute(
        sql.SQL(
            "INSERT INTO axa_queue (id, name, args, status, attempts, started_at, {}) "
            "SELECT gen_random_uuid(), 'Odd', '{{}}', %s, 1, now(), t "
            "FROM unnest(%s::timestamptz[]) AS t RETURNING id"
        ).format(sql.Identifier(column)),
        (status, times),
    ).fetchall()
    return {str(row[0]) for row in rows}


def test_pages_follow_each_other_over_rows_at_infinity_bc_and_past_year_9999(
    board: TestClient, admin
) -> None:
    # Page boundaries (50 a page) fall on rows at infinity, in year 20000, in 44 BC and
    # at -infinity (newest first), and at -infinity, now and year 20000 (oldest first).
    times = (
        ["infinity"] * 50
        + ["20000-06-01 12:00:00+00"] * 50
        + [f"2024-06-01 12:00:{s:02d}+00" for s in range(10)]
        + ["0044-03-15 12:00:00+00 BC"] * 40
        + ["-infinity"] * 50
    )
    for state in JobState:
        made = _seed_times(admin, state.value, times)
        for order in ("newest", "oldest"):
            seen: list[str] = []
            keys: list[str] = []
            url = f"/jobs?state={state.value}&order={order}"
            while url:
                answer = board.get(url)
                assert answer.status_code == 200, url
                seen += re.findall(r'<tr data-id="([0-9a-f-]+)"', answer.text)
                found = re.search(r'id="next" href="\?([^"]+)"', answer.text)
                url = "/jobs?" + found[1].replace("&amp;", "&") if found else ""
                if found:
                    keys += re.findall(r"key=([^&]+)", url)
            assert len(seen) == len(set(seen)) == len(made), (state, order)
            assert set(seen) == made, (state, order)
            assert len(keys) == 3, (state, order, keys)


# --- 16: the sign-on header -----------------------------------------------------------------


def test_a_sign_on_header_sent_twice_or_holding_a_comma_is_refused(tables: str, admin) -> None:
    [job] = seed(admin, "Mail", "queued")
    app = create_app(tables, trust_header="X-Forwarded-User", trusted_proxies=["10.0.0.0/8"])
    proxied = TestClient(app, client=("10.1.2.3", 5000))
    page = proxied.get("/jobs", headers={"x-forwarded-user": "alice"})
    assert page.status_code == 200 and ">alice<" in page.text
    csrf = csrf_of(page.text)
    twice = [("X-Forwarded-User", "mallory"), ("X-Forwarded-User", "alice")]
    for headers in (twice, [("x-forwarded-user", "alice"), ("X-FORWARDED-USER", "alice")]):
        answer = proxied.get("/jobs", headers=headers)
        _safe(answer, "twice")
        assert answer.status_code == 400 and "came 2 times" in answer.text
        assert "mallory" not in answer.text
    joined = proxied.get("/", headers={"x-forwarded-user": "mallory, alice"})
    assert joined.status_code == 400 and "comma" in joined.text
    act = {"act": "cancel", "id": str(job), "reason": "SSO", "csrf": csrf}
    refused = proxied.post("/act", data=act, headers=[*twice, *ORIGIN.items()])
    assert refused.status_code == 400
    assert acts_of(admin, job) == []
    stranger = TestClient(app, client=("192.0.2.1", 5000))  # not the proxy: not read at all
    assert stranger.get("/", headers=twice, follow_redirects=False).status_code == 303


# --- 17: many names -------------------------------------------------------------------------


def test_with_ten_thousand_names_the_overview_shows_the_top_fifty_and_stays_small(
    board: TestClient, admin, monkeypatch
) -> None:
    monkeypatch.setattr("axa_queue.web.overview.COUNT_CAP", 20_000)  # every name counted exactly
    admin.execute(
        "INSERT INTO axa_queue (id, name, args) SELECT gen_random_uuid(), "
        "'report.customer.' || i, '{}' FROM generate_series(1, 10000) AS i"
    )
    seed(admin, "busy.first", "queued", 30)
    seed(admin, "busy.first", "needs_review")
    seed(admin, "busy.second", "queued", 20)
    for page in ("/live", "/"):
        answer = board.get(page)
        assert answer.status_code == 200
        names = re.findall(r'<tr data-name="([^"]+)"', answer.text)
        assert len(names) == 50 and names[:2] == ["busy.first", "busy.second"], page
        assert "of 10,002" in answer.text and 'id="all-names"' in answer.text
        assert len(answer.content) < 100_000, (page, len(answer.content))  # was 3.9 MB


def test_the_names_page_lists_every_name_filtered_ordered_and_paged(
    board: TestClient, admin
) -> None:
    admin.execute(
        "INSERT INTO axa_queue (id, name, args) SELECT gen_random_uuid(), "
        "'name.' || lpad(i::text, 3, '0'), '{}' FROM generate_series(0, 249) AS i, "
        "generate_series(0, i % 3)"
    )

    def names(url: str) -> list[str]:
        answer = board.get(url)
        assert answer.status_code == 200, url
        return re.findall(r'<tr data-name="([^"]+)"', answer.text)

    first = names("/names")
    # 3 jobs for each i % 3 == 2 (83 names), 2 for each i % 3 == 1, then by name.
    assert len(first) == 100 and first[:2] == ["name.002", "name.005"]
    assert first[82] == "name.248" and first[83] == "name.001" and first[99] == "name.049"
    everything = first + names("/names?page=2") + names("/names?page=3")
    assert sorted(everything) == [f"name.{i:03d}" for i in range(250)]
    assert names("/names?page=4") == [] and "Past the last page." in board.get("/names?page=4").text
    assert names("/names?order=name&page=3") == [f"name.{i:03d}" for i in range(200, 250)]
    assert names("/names?q=NAME.01&order=name") == [f"name.{i:03d}" for i in range(10, 20)]
    assert names("/names?q=nothing-holds-this") == []
    page = board.get("/names?page=2").text
    assert 'id="previous"' in page and 'id="next" href="?page=3"' in page
    for bad in ("page=0", "page=%C2%B2", "page=-1", "order=size", "q=a%00b", "page=1&page=2"):
        assert board.get(f"/names?{bad}").status_code == 400, bad
