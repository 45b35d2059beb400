"""The dashboard in a real browser: Playwright driving Debian's `chromium`.

These tests skip, saying why, where Playwright or chromium is missing; CI sets
`AXA_TEST_REQUIRE_BROWSER=1` (`.ci/run` installs chromium), which turns the skip into a
failure. One browser page serves the whole session (a context and its page cost some
0.35 s of CPU to make and close, three navigations' worth); each test has its own
server, on its own schema, so its own origin (storage and cache are an origin's), and
the page starts it with no cookie and ends it on a blank page (its timers gone with
the document).

Playwright's sync API keeps an event loop running in the thread that started it, where
`asyncio.run` and async tests could no longer run: so it lives in a thread of its own
(`Browsing`), and each test's body runs there (`in_browser`).

With `AXA_DOCS_SCREENSHOTS=1`, `test_screenshots_of_the_overview_and_a_job_page` writes
docs/images/overview.png and docs/images/job.png (else it writes them to a temporary
folder): `AXA_DOCS_SCREENSHOTS=1 python -m pytest tests/test_browser.py -k screenshots`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from axa_queue import NewJob, Queue, QueueOptions, chord, enqueue_on, group
from axa_queue.web import create_app
from axa_queue.web.pauses import PAUSED_PAGE
from axa_queue.web.system import WORKERS_PAGE
from axa_queue.web.workflows import DRAWN, MEMBERS_PAGE
from conftest import FAST
from tcp_cut import cut_proxy
from test_web_outage import shorter_waits

TOKEN = "browser-test-token-0123456789"
SECRET = "S3CRET-in-the-args-b7e2"
CHROMIUM = next(
    (p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if os.path.exists(p)), None
)
DOCS_IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (pip install playwright, or the [dev] extra)"
    if CHROMIUM is None:
        return "Debian's chromium is not installed (apt-get install chromium)"
    return None


class Browsing:
    """Playwright and its browser, in a thread of their own."""

    def __init__(self) -> None:
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="playwright")
        self.playwright: Any = None
        self.browser: Any = None
        self.page: Any = None

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` in Playwright's thread; return what it returns, raise what it raises."""
        return self.thread.submit(fn).result()

    def start(self) -> None:
        from playwright.sync_api import sync_playwright

        self.playwright = sync_playwright().start()
        self.browser = self.playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox"]
        )

    def fresh_page(self) -> Any:
        """The session's page, without cookies and with no error seen: made anew when
        there is none yet or a test closed or crashed it."""
        if self.page is None or self.page.is_closed():
            context = self.browser.new_context(viewport={"width": 1280, "height": 900})
            one = context.new_page()
            one.errors = []
            one.on("console", lambda m: one.errors.append(m.text) if m.type == "error" else None)
            self.page = one
        self.page.context.clear_cookies()
        self.page.errors.clear()
        return self.page

    def leave(self) -> None:
        """End a test on a blank page (no timer of its document runs on), or drop the
        page when that fails."""
        try:
            self.page.goto("about:blank")
        except Exception:
            self.page.context.close()
            self.page = None

    def stop(self) -> None:
        if self.browser is not None:
            self.browser.close()
        if self.playwright is not None:
            self.playwright.stop()


BROWSING: list[Browsing] = []


def in_browser(test: Callable[..., None]) -> Callable[..., None]:
    """Run the test's body in Playwright's thread (its fixtures are made as usual)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        BROWSING[0].call(lambda: test(*args, **kwargs))

    return run


@pytest.fixture(scope="session")
def browser() -> Iterator[Browsing]:
    why = _missing()
    if why is not None:
        if os.environ.get("AXA_TEST_REQUIRE_BROWSER"):
            pytest.fail(f"AXA_TEST_REQUIRE_BROWSER is set but {why}")
        pytest.skip(why)
    browsing = Browsing()
    browsing.call(browsing.start)
    BROWSING.append(browsing)
    try:
        yield browsing
    finally:
        BROWSING.remove(browsing)
        browsing.call(browsing.stop)
        browsing.thread.shutdown()


class Served:
    """A dashboard served by uvicorn in a thread, on a free port of 127.0.0.1."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})

    def __enter__(self) -> Served:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the dashboard's server did not start")
            threading.Event().wait(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


@pytest.fixture(autouse=True)
def _live_every_half_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """The overview's live part fetched every 0.5 s (`overview.LIVE_EVERY`) and the
    finished counts read as often (`history.REFRESH_EVERY`), both 2 s as shipped: a
    test waiting for the next refresh waits a quarter as long."""
    monkeypatch.setattr("axa_queue.web.overview.LIVE_EVERY", 0.5)
    monkeypatch.setattr("axa_queue.web.history.REFRESH_EVERY", 0.5)


@pytest.fixture
def tables(dsn: str) -> str:
    async def setup() -> None:
        queue = Queue(dsn)
        await queue.open()
        await queue.close()

    asyncio.run(setup())
    return dsn


@pytest.fixture
def served(tables: str) -> Iterator[Served]:
    with Served(create_app(tables, token=TOKEN)) as one:
        yield one


@pytest.fixture
def page(browser: Browsing) -> Iterator[Any]:
    """The session's page (`Browsing.fresh_page`), left on a blank page afterwards."""
    yield browser.call(browser.fresh_page)
    browser.call(browser.leave)


def seed(
    admin: psycopg.Connection[Any],
    name: str,
    status: str,
    n: int = 1,
    ago: str = "0 seconds",
) -> list[uuid.UUID]:
    ids = [uuid.uuid4() for _ in range(n)]
    admin.execute(
        "INSERT INTO axa_queue (id, name, args, status, attempts, max_attempts, error, "
        "updated_at, started_at) "
        "SELECT i, %s, %s::jsonb, %s, %s, 3, %s, now() - %s::interval * random(), "
        "CASE WHEN %s <> 'queued' THEN now() - %s::interval END FROM unnest(%s::uuid[]) AS i",
        (
            name,
            f'{{"card": "{SECRET}"}}',
            status,
            0 if status == "queued" else (3 if status == "failed" else 1),
            "payment gateway timed out" if status == "failed" else None,
            ago,
            status,
            ago,
            ids,
        ),
    )
    admin.execute(  # times that read as a run's: queued, then started, then finished
        "UPDATE axa_queue SET started_at = updated_at - interval '2 seconds', "
        "created_at = updated_at - interval '1 minute', run_at = updated_at - interval '1 minute' "
        "WHERE id = ANY(%s) AND status <> 'queued'",
        (ids,),
    )
    return ids


def sign_in(page: Any, served: Served, name: str = "alice") -> None:
    page.goto(served.url + "/")
    assert page.url.endswith("/signin")
    page.fill("input[name=token]", TOKEN)
    page.fill("input[name=name]", name)
    page.click("button[type=submit]")
    page.wait_for_url(served.url + "/")
    assert page.inner_text("#person") == name


def acts_of(admin: psycopg.Connection[Any], job: uuid.UUID) -> list[tuple[str, str, str]]:
    rows = admin.execute(
        "SELECT act, by, reason FROM axa_job_acts WHERE job_id = %s ORDER BY id", (job,)
    )
    return [(r[0], r[1], r[2]) for r in rows]


def status(admin: psycopg.Connection[Any], job: uuid.UUID) -> str:
    row = admin.execute("SELECT status FROM axa_queue WHERE id = %s", (job,)).fetchone()
    assert row is not None
    return str(row[0])


@in_browser
def test_signing_in_shows_counts_that_match_the_database(page, served, admin) -> None:
    seed(admin, "Mail", "queued", 7)
    seed(admin, "Report", "queued", 3)
    seed(admin, "Report", "needs_review", 2)
    seed(admin, "Pay", "failed", 4, ago="10 minutes")
    seed(admin, "Pay", "cancelled", 1, ago="10 minutes")
    sign_in(page, served)
    ready = admin.execute("SELECT count(*) FROM axa_queue WHERE status = 'queued'").fetchone()
    assert ready is not None and page.inner_text("#total-ready") == str(ready[0]) == "10"
    assert page.inner_text("#total-needs_review") == "2"
    assert page.inner_text("#total-failed") == "4"
    assert page.inner_text("#total-cancelled") == "1"
    assert page.inner_text("tr[data-name=Report] .n-ready") == "3"
    assert page.inner_text("tr[data-name=Pay] .n-failed") == "4"
    assert page.errors == []  # htmx loaded under the CSP, nothing refused


@in_browser
def test_cancel_a_queued_job_with_a_reason_and_find_the_act_by_the_signed_in_person(
    page, served, admin
) -> None:
    [job] = seed(admin, "Mail", "queued")
    sign_in(page, served, "alice.ops")
    page.goto(f"{served.url}/jobs/{job}")
    page.fill("input[name=reason]", "INC-1234")
    page.click("button[value=cancel]")
    assert page.inner_text("#outcomes .said") == "cancelled"
    assert status(admin, job) == "cancelled"
    assert acts_of(admin, job) == [("cancelled", "alice.ops", "INC-1234")]
    page.goto(f"{served.url}/acts?by=alice.ops")
    assert page.inner_text("#acts .by") == "alice.ops"
    assert page.inner_text("#acts .reason") == "INC-1234"


def exchange(admin: psycopg.Connection[Any], name: str, endings: list[dict[str, Any]]) -> None:
    """Send `sql.EXCHANGE` as worker process 4242 on host `box-7` does: the `endings`
    written, then one job of `name` claimed."""
    from axa_queue import sql

    admin.execute(
        sql.EXCHANGE,
        {
            "completed": "{}", "completed_attempts": "{}", "endings": json.dumps(endings),
            "free": 1, "wanted": json.dumps([{"name": name, "cap": 1}]), "losing": "{}",
            "now": None, "idle": 1, "starts": "{}", "started_attempts": "{}",
            "worker": uuid.UUID(int=7), "host": "box-7", "pid": 4242,
            "limits": "{}", "max": None,
        },
    )  # fmt: skip


@in_browser
def test_a_job_page_shows_each_attempt_with_its_error_length_and_worker(
    page, served, admin
) -> None:
    [job] = seed(admin, "Pay", "queued")
    exchange(admin, "Pay", [])  # attempt 1 claimed
    failed = {"id": str(job), "attempts": 1, "status": "queued", "delay": 0}
    exchange(admin, "Pay", [{**failed, "error": "TimeoutError: the gateway took 30 s"}])
    exchange(admin, "Pay", [])  # attempt 2 claimed
    exchange(admin, "Pay", [{"id": str(job), "attempts": 2, "status": "completed"}])
    sign_in(page, served)
    page.goto(f"{served.url}/jobs/{job}")
    assert page.inner_text("#job-state") == "completed"
    first, second = "#attempts tr[data-attempt='1']", "#attempts tr[data-attempt='2']"
    assert page.inner_text(f"{first} .outcome") == "retried"
    assert page.inner_text(f"{first} .error-class") == "TimeoutError"
    assert "the gateway took 30 s" in page.inner_text(f"{first} .error-text")
    assert page.inner_text(f"{first} .worker") == "box-7:4242"
    assert page.inner_text(f"{second} .outcome") == "completed"
    assert page.inner_text(f"{second} .worker") == "box-7:4242"
    assert page.inner_text(f"{second} .took").endswith(("ms", "s"))
    assert SECRET not in page.content()


@in_browser
def test_a_job_page_shows_its_steps_and_a_sleep_but_never_a_steps_result(
    page, served, admin
) -> None:
    from axa_queue import sql

    [job] = seed(admin, "Pay", "queued")
    exchange(admin, "Pay", [])  # attempt 1 claimed
    recorded = {"id": job, "attempt": 1, "name": "charge", "seconds": 0.25, "now": None}
    admin.execute(sql.STEP_RECORD, {**recorded, "result": json.dumps(SECRET)})
    slept = {"id": str(job), "attempts": 1, "status": "queued", "delay": 0, "slept": True}
    exchange(admin, "Pay", [{**slept, "error": "slept for 0.0 s", "max_attempts": 9}])
    exchange(admin, "Pay", [])  # attempt 2 claimed
    exchange(admin, "Pay", [{"id": str(job), "attempts": 2, "status": "completed"}])
    sign_in(page, served)
    page.goto(f"{served.url}/jobs/{job}")
    assert page.inner_text("#attempts tr[data-attempt='1'] .outcome") == "slept"
    step = "#steps tr[data-step='charge']"
    assert page.inner_text(f"{step} .step-name") == "charge"
    assert page.inner_text(f"{step} .took").endswith(("ms", "s"))
    assert SECRET not in page.content()


@in_browser
def test_retry_a_failed_job_from_the_failed_list(page, served, admin) -> None:
    [job] = seed(admin, "Pay", "failed")
    sign_in(page, served)
    page.goto(served.url + "/failed")
    page.check(f"input[name=id][value='{job}']")
    page.fill("input[name=reason]", "OPS-9")
    page.click("button[value=retry]")
    assert "retried" in page.inner_text("#outcomes .said")
    assert status(admin, job) == "queued"
    assert acts_of(admin, job) == [("retried", "alice", "OPS-9")]


@in_browser
def test_pause_a_name_from_its_jobs_page_and_resume_it_from_the_paused_page(
    page, served, admin
) -> None:
    seed(admin, "Mail", "queued")
    sign_in(page, served, "alice.ops")
    page.goto(f"{served.url}/jobs?state=queued&name=Mail")
    page.fill("#pausebar input[name=reason]", "INC-42")
    page.click("#pausebar button[value=pause]")
    assert "its jobs stay queued" in page.inner_text("#outcome .said")
    page.goto(f"{served.url}/")
    assert page.inner_text("tr[data-name=Mail] .s-paused") == "paused"
    page.goto(f"{served.url}/paused")
    assert page.inner_text("#paused tr[data-name=Mail] .by") == "alice.ops"
    page.fill("#paused tr[data-name=Mail] input[name=reason]", "INC-42-fixed")
    page.click("#paused tr[data-name=Mail] button[value=resume]")
    assert "resumed" in page.inner_text("#outcome .said")
    rows = admin.execute(
        "SELECT act, by, reason FROM axa_job_acts WHERE job_name = 'Mail' ORDER BY id"
    ).fetchall()
    assert rows == [("paused", "alice.ops", "INC-42"), ("resumed", "alice.ops", "INC-42-fixed")]


@in_browser
def test_many_paused_names_are_listed_a_page_at_a_time(page, served, admin) -> None:
    admin.execute(
        "INSERT INTO axa_paused (name, by, reason) "
        "SELECT 'Name' || lpad(g::text, 4, '0'), 'ops', 'INC-1' FROM generate_series(1, 1200) g"
    )
    sign_in(page, served)
    page.goto(f"{served.url}/paused")
    assert page.inner_text("#paused-page") == "1,200 names paused. Page 1 of 3."
    assert page.locator("#paused tbody tr").count() == PAUSED_PAGE
    assert len(page.content()) < 1_000_000  # 10,000 paused names made a page of 5.9 MB
    page.click("#next")
    page.wait_for_url("**/paused?page=2")  # else the second click may land on page 1's link
    page.click("#next")
    page.wait_for_url("**/paused?page=3")
    rows = page.locator("#paused tbody tr")
    assert rows.count() == 200 and rows.nth(199).get_attribute("data-name") == "Name1200"
    page.click("#previous")
    page.wait_for_url("**/paused?page=2")
    assert page.inner_text("#paused-page") == "1,200 names paused. Page 2 of 3."
    assert page.locator("#paused tbody tr").first.get_attribute("data-name") == "Name0501"
    assert not page.errors


@in_browser
def test_many_worker_processes_are_listed_a_page_at_a_time(page, served, admin) -> None:
    admin.execute(
        "INSERT INTO axa_workers (id, host, pid, names, loops, version, beat_ms) "
        "SELECT gen_random_uuid(), 'host-' || lpad(g::text, 4, '0'), g, '{Mail}', 10, 'x', "
        "3600000 FROM generate_series(1, 1100) g"
    )
    sign_in(page, served)
    page.goto(f"{served.url}/workers")
    assert page.inner_text("#workers-page") == "1,100 worker processes. Page 1 of 3."
    assert page.locator("#workers tbody tr").count() == WORKERS_PAGE
    page.click("#next")
    page.wait_for_url("**/workers?page=2")
    page.click("#next")
    page.wait_for_url("**/workers?page=3")
    rows = page.locator("#workers tbody tr")
    assert rows.count() == 100 and rows.nth(99).locator("td").first.inner_text() == "host-1100"
    assert not page.errors


@in_browser
def test_retry_every_failed_job_a_filter_matches_after_confirming_the_count(
    page, served, admin
) -> None:
    jobs = [seed(admin, "Pay", "failed")[0] for _ in range(3)]
    seed(admin, "Mail", "failed")
    sign_in(page, served)
    page.goto(f"{served.url}/failed?name=Pay")
    page.click("#act-all")
    assert page.inner_text("#would") == "3"
    assert all(status(admin, job) == "failed" for job in jobs)  # counted, nothing done
    page.fill("#act-all-form input[name=reason]", "INC-77")
    page.click("#act-all-form button[value=retry]")
    assert page.inner_text("#changed") == "3"
    assert all(status(admin, job) == "queued" for job in jobs)
    assert acts_of(admin, jobs[0]) == [("retried", "alice", "INC-77")]


@in_browser
def test_release_a_job_from_review(page, served, admin) -> None:
    [job] = seed(admin, "Report", "needs_review")
    sign_in(page, served)
    page.goto(served.url + "/review")
    page.check(f"input[name=id][value='{job}']")
    page.fill("input[name=reason]", "checked-twice")
    page.click("button[value=retry]")
    assert "released from review" in page.inner_text("#outcomes .said")
    assert acts_of(admin, job) == [("released", "alice", "checked-twice")]


@in_browser
def test_the_overview_updates_live_when_a_job_completes(page, served, tables, admin) -> None:
    release = threading.Event()
    started = threading.Event()
    stop: list[asyncio.Event] = []

    async def work() -> None:
        queue = Queue(tables, QueueOptions(**FAST))
        await queue.open()

        @queue.handler("Slow")
        def slow(args: Any) -> None:  # in a thread
            started.set()
            release.wait(30)

        await queue.enqueue("Slow", {})
        stop.append(asyncio.Event())
        await queue.run(stop[0])
        await queue.close()

    loop = asyncio.new_event_loop()
    worker = threading.Thread(target=loop.run_until_complete, args=(work(),))
    worker.start()
    try:
        assert started.wait(30)
        sign_in(page, served)
        from playwright.sync_api import expect  # polls without eval, which the CSP refuses

        expect(page.locator("#total-running")).to_have_text("1", timeout=20_000)
        page.evaluate("window.sameDocument = true")
        release.set()
        expect(page.locator("#total-completed")).to_have_text("1", timeout=20_000)
        expect(page.locator("#total-running")).to_have_text("0")
        assert page.evaluate("window.sameDocument") is True  # no reload: htmx swapped it
    finally:
        release.set()
        loop.call_soon_threadsafe(lambda: stop and stop[0].set())
        worker.join(30)
        loop.close()


@in_browser
def test_the_overview_warns_of_a_name_no_live_worker_handles_until_one_does(
    page, served, admin
) -> None:
    seed(admin, "Knwon2", "queued", 3)
    seed(admin, "Mail", "queued")
    admin.execute("UPDATE axa_queue SET run_at = now() - interval '20 minutes'")
    admin.execute(
        "INSERT INTO axa_workers (id, host, pid, names, loops, version, beat_ms) "
        "VALUES (gen_random_uuid(), 'web-1', 4242, '{Mail}', 1, 'x', 3600000)"
    )
    sign_in(page, served)
    from playwright.sync_api import expect  # polls without eval, which the CSP refuses

    warning = page.locator("#unhandled")
    expect(warning).to_be_visible()
    assert page.inner_text("#unhandled li[data-name=Knwon2]").startswith("Knwon2: 3 jobs")
    assert page.locator("#unhandled li").count() == 1
    assert page.inner_text("tr[data-name=Knwon2] .handled") == "no"
    assert page.inner_text("tr[data-name=Mail] .handled") == "yes"
    page.evaluate("window.sameDocument = true")
    admin.execute(  # a worker that handles it starts: the warning goes with the next refresh
        "INSERT INTO axa_workers (id, host, pid, names, loops, version, beat_ms) "
        "VALUES (gen_random_uuid(), 'web-2', 4343, '{Knwon2}', 1, 'x', 3600000)"
    )
    expect(warning).to_have_count(0, timeout=20_000)
    expect(page.locator("tr[data-name=Knwon2] .handled")).to_have_text("yes")
    assert page.evaluate("window.sameDocument") is True
    assert page.errors == []


@in_browser
def test_an_overview_whose_session_ended_goes_to_the_sign_in_instead_of_freezing(
    page, served, admin
) -> None:
    sign_in(page, served)
    page.context.clear_cookies()  # the session gone (expired, or the dashboard restarted)
    page.wait_for_url(served.url + "/signin", timeout=20_000)  # at the next refresh


@in_browser
def test_nothing_is_shown_or_done_without_signing_in(page, served, admin) -> None:
    [job] = seed(admin, "Mail", "queued")
    page.goto(f"{served.url}/jobs/{job}")
    assert page.url.endswith("/signin") and "Mail" not in page.content()
    answer = page.request.post(
        served.url + "/act",
        form={"act": "cancel", "id": str(job), "reason": "X"},
        headers={"origin": served.url},
    )
    assert answer.status == 403
    assert acts_of(admin, job) == []


@in_browser
def test_an_act_without_its_csrf_token_is_refused(page, served, admin) -> None:
    [job] = seed(admin, "Mail", "queued")
    sign_in(page, served)
    page.goto(f"{served.url}/jobs/{job}")
    page.evaluate("document.querySelector('form.card input[name=csrf]').remove()")
    page.fill("input[name=reason]", "INC-1")
    page.click("button[value=cancel]")
    assert "CSRF" in page.content()
    assert status(admin, job) == "queued" and acts_of(admin, job) == []


@in_browser
def test_read_only_offers_no_act_and_the_server_refuses_one(page, tables, admin) -> None:
    [job] = seed(admin, "Mail", "queued")
    with Served(create_app(tables, token=TOKEN, read_only=True)) as served:
        sign_in(page, served)
        page.goto(f"{served.url}/jobs/{job}")
        assert page.locator("button[value=cancel]").count() == 0
        page.goto(served.url + "/jobs")
        assert page.locator("input[type=checkbox][name=id]").count() == 0
        csrf = page.get_attribute("input[name=csrf]", "value")
        answer = page.request.post(
            served.url + "/act",
            form={"act": "cancel", "id": str(job), "reason": "X", "csrf": csrf or ""},
            headers={"origin": served.url},
        )
        assert answer.status == 403
    assert acts_of(admin, job) == []


@in_browser
def test_a_secret_in_job_arguments_appears_in_no_page(page, served, admin) -> None:
    jobs = [
        *seed(admin, "Mail", "queued"),
        *seed(admin, "Pay", "failed"),
        *seed(admin, "Report", "needs_review"),
        *seed(admin, "Mail", "completed"),
        *seed(admin, "Mail", "running"),
    ]
    sign_in(page, served)
    pages = ["/", "/jobs", "/review", "/failed", "/schedules", "/workers", "/acts"]
    pages += [f"/jobs?state={s}" for s in ("running", "completed", "cancelled")]
    pages += [f"/jobs/{job}" for job in jobs]
    for path in pages:
        page.goto(served.url + path)
        assert SECRET not in page.content(), path


@in_browser
def test_a_script_in_a_job_name_or_error_is_shown_as_text_and_never_runs(
    page, served, admin
) -> None:
    evil = "<script>window.pwned=1</script><img src=x onerror=window.pwned=2>"
    [job] = seed(admin, evil, "failed")
    admin.execute("UPDATE axa_queue SET error = %s WHERE id = %s", (evil, job))
    sign_in(page, served)
    for path in ("/", "/failed", f"/jobs/{job}"):
        page.goto(served.url + path)
        assert page.evaluate("window.pwned") is None, path
    assert page.inner_text("#job .name") == evil
    assert page.inner_text("#job-error") == evil


@in_browser
def test_the_overview_shows_the_top_fifty_names_and_the_names_page_every_one(
    page, served, admin
) -> None:
    admin.execute(  # name.000 to name.119, with 1 to 3 queued jobs each (i % 3 + 1)
        "INSERT INTO axa_queue (id, name, args) SELECT gen_random_uuid(), "
        "'name.' || lpad(i::text, 3, '0'), '{}' FROM generate_series(0, 119) AS i, "
        "generate_series(0, i % 3)"
    )
    sign_in(page, served)
    assert page.locator("#by-name tbody tr").count() == 50
    assert page.inner_text("#by-name tbody tr:first-child td:first-child") == "name.002"
    assert "of 120" in page.inner_text("#names-shown")
    page.click("#all-names")
    page.wait_for_url(served.url + "/names")
    assert page.locator("#names tbody tr").count() == 100
    assert "120 names: page 1 of 2" in page.inner_text("#names-found")
    page.click("#next")
    page.wait_for_url(served.url + "/names?page=2")
    assert page.locator("#names tbody tr").count() == 20
    page.fill("input[name=q]", "NAME.01")
    page.select_option("select[name=order]", "name")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**/names?q=NAME.01&order=name")
    rows = page.locator("#names tbody tr td:first-child")
    assert rows.all_inner_texts() == [f"name.{i:03d}" for i in range(10, 20)]
    page.click("#names a:text-is('name.010')")
    page.wait_for_url("**/jobs?state=queued&name=name.010")
    assert page.locator("#jobs tbody tr").count() == 2  # 10 % 3 + 1
    assert page.errors == []


@in_browser
def test_the_search_box_opens_a_job_by_its_id_and_refuses_what_is_not_one(
    page, served, admin
) -> None:
    [job] = seed(admin, "Mail", "failed")
    sign_in(page, served)
    page.fill("#find-job", f"  {str(job).upper()} ")
    page.press("#find-job", "Enter")
    page.wait_for_url(f"{served.url}/jobs/{job}")
    assert page.inner_text("#job .name") == "Mail"
    unknown = uuid.uuid4()
    page.fill("#find-job", str(unknown))
    with page.expect_navigation() as went:
        page.press("#find-job", "Enter")
    assert went.value.status == 404 and f"There is no job {unknown}" in page.inner_text("main")
    evil = "<img src=x onerror=window.pwned=1>"
    page.fill("#find-job", evil)
    with page.expect_navigation() as went:
        page.press("#find-job", "Enter")
    assert went.value.status == 400
    assert page.inner_text("h1") == "Not a job id"
    assert "A job id is a UUID" in page.inner_text("#message")
    assert page.evaluate("window.pwned") is None and evil not in page.content()


@in_browser
def test_the_job_list_filters_by_name_state_and_time(page, served, admin) -> None:
    old = seed(admin, "Mail", "completed", 3)
    admin.execute(
        "UPDATE axa_queue SET updated_at = '2026-12-06 10:00+00' WHERE id = ANY(%s)", (old,)
    )
    new = seed(admin, "Mail", "completed", 2)
    admin.execute(
        "UPDATE axa_queue SET updated_at = '2026-12-06 12:30+00' WHERE id = ANY(%s)", (new,)
    )
    seed(admin, "Mail", "failed", 4)
    seed(admin, "Pay", "completed", 5)
    sign_in(page, served)
    page.goto(served.url + "/jobs")
    page.select_option("form.filters select[name=state]", "completed")
    page.fill("form.filters input[name=name]", "Mail")
    page.fill("form.filters input[name=since]", "2026-12-06T12:00:00")
    page.fill("form.filters input[name=until]", "2026-12-06T13:00:00")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**/jobs?state=completed&name=Mail&*")
    rows = page.locator("#jobs tbody tr[data-id]")
    assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.id)")) == sorted(map(str, new))
    assert page.input_value("input[name=since]") == "2026-12-06T12:00"
    page.fill("form.filters input[name=since]", "")
    with page.expect_navigation():
        page.click("form.filters button[type=submit]")
    assert "since=&" in page.url and "until=2026-12-06T13" in page.url
    assert page.locator("#jobs tbody tr[data-id]").count() == 5
    assert page.errors == []


@in_browser
def test_the_charts_axes_say_the_date_and_time_of_each_end(page, served, admin) -> None:
    import re
    from datetime import datetime, timedelta, timezone

    seed(admin, "Mail", "completed", 3)
    sign_in(page, served)
    ends = page.locator("#live svg.chart text.time").all_text_contents()
    assert len(ends) == 12  # two ends of six charts
    now = datetime.now(timezone.utc)
    days = {f"{d:%b} {d.day} " for d in (now - timedelta(days=1), now)}
    for end in ends:
        assert re.fullmatch(r"[A-Z][a-z]{2} [0-9]{1,2} [0-9]{2}:[0-9]{2}( UTC)?", end), end
        assert end[: end.index(" ", 4) + 1] in days, end
    assert ends[1].endswith(" UTC") and ends[1].startswith(f"{now:%b} {now.day} ")


@in_browser
def test_a_database_outage_shows_the_status_page_and_the_pages_come_back_by_themselves(
    page, tables, admin, monkeypatch
) -> None:
    from playwright.sync_api import expect

    seed(admin, "Mail", "queued", 2)
    monkeypatch.setattr("axa_queue.web.app.RETRY_EVERY", 1)  # the status page's reload (5 s)
    with cut_proxy(tables) as proxy, Served(create_app(proxy.dsn(tables), token=TOKEN)) as served:
        sign_in(page, served)
        expect(page.locator("#total-ready")).to_have_text("2")
        page.evaluate("window.sameDocument = true")
        with shorter_waits(monkeypatch):
            proxy.cut()  # the live part, polled every 0.5 s here, shows the outage in its place
            expect(page.locator("#outage")).to_contain_text(
                "The database cannot be reached", timeout=20_000
            )
            assert page.locator("#total-ready").count() == 0  # no stale counts shown
        proxy.restore()  # and the counts come back, on the same page
        expect(page.locator("#total-ready")).to_have_text("2", timeout=20_000)
        assert page.locator("#outage").count() == 0
        assert page.evaluate("window.sameDocument") is True

        with shorter_waits(monkeypatch):
            proxy.cut()  # a page opened during an outage: the status page, loading itself again
            answer = page.goto(served.url + "/jobs?state=queued")
            assert answer is not None and answer.status == 503
            assert page.title().startswith("Database unavailable")
            assert "tries again by itself" in page.inner_text("#outage")
            assert SECRET not in page.content() and "Traceback" not in page.content()
        proxy.restore()
        expect(page.locator("#jobs tbody tr")).to_have_count(2, timeout=20_000)
        assert page.url == served.url + "/jobs?state=queued"


@in_browser
def test_screenshots_of_the_overview_and_a_job_page(
    page, served, admin, tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr("axa_queue.web.history.BACKFILL", 60)  # the hour at the first look
    for name, n in (("mail.send", 40), ("thumbnail.make", 25), ("invoice.charge", 12)):
        seed(admin, name, "queued", n)
        seed(admin, name, "completed", n * 30, ago="59 minutes")
    seed(admin, "invoice.charge", "failed", 9, ago="50 minutes")
    seed(admin, "report.nightly", "needs_review", 2)
    seed(admin, "thumbnail.make", "running", 6)
    [job] = seed(admin, "invoice.charge", "failed", ago="5 minutes")
    admin.execute(
        "INSERT INTO axa_job_acts (job_id, job_name, act, attempts, by, reason) "
        "VALUES (%s, 'invoice.charge', 'retried', 2, 'alice', 'INC-2041')",
        (job,),
    )
    sign_in(page, served)
    shots = {"overview.png": "/", "job.png": f"/jobs/{job}"}
    for file, path in shots.items():
        page.goto(served.url + path)
        page.screenshot(path=str(tmp_path / file), full_page=True)
        assert (tmp_path / file).stat().st_size > 10_000
    if os.environ.get("AXA_DOCS_SCREENSHOTS"):
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        for file in shots:
            shutil.copy(tmp_path / file, DOCS_IMAGES / file)


# --- workflows: the graph page, blocked counts ---------------------------------------------


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
    page, served, admin
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
def test_a_big_workflows_page_draws_its_first_jobs_and_lists_them_all_by_page(
    page, served, admin
) -> None:
    flow = enqueue_on(admin, chord(group([NewJob("Part") for _ in range(1_200)]), NewJob("Gather")))
    sign_in(page, served)
    page.goto(f"{served.url}/workflows/{flow.id}")
    assert page.locator("#workflow-graph a.node").count() == DRAWN
    assert "first 200 of the 1,201 jobs" in page.inner_text("#graph-cut")
    assert page.locator("#workflow-members tbody tr").count() == MEMBERS_PAGE
    assert len(page.content()) < 400_000  # a chord of 30,000 made a page of 25 MB
    page.click("#next")
    page.wait_for_url("**?page=2")
    page.click("#next")
    page.wait_for_url("**?page=3")
    assert page.inner_text("#members-page") == "Page 3 of 3."
    rows = page.locator("#workflow-members tbody tr")
    assert rows.count() == 201
    last = rows.nth(200)
    assert last.get_attribute("data-job") == str(flow.jobs[-1])
    assert last.locator("td").nth(4).inner_text() == "#1, #2, #3, #4, #5, and 1,195 more"
    assert not page.errors


@in_browser
def test_a_workflow_page_for_an_unknown_id_says_so(page, served) -> None:
    sign_in(page, served)
    response = page.goto(f"{served.url}/workflows/00000000-0000-0000-0000-000000000001")
    assert response.status == 404
    assert "No such workflow" in page.content()
