"""The database given as an application holds it: a libpq connection string, a
`postgresql://` or `postgres://` URL, or a SQLAlchemy `postgresql+DRIVER://` URL, read
as the `postgresql://` URL everywhere a DSN enters (Queue, SyncQueue, the environment,
every command, the dashboard, the demo); anything else refused naming its scheme or
parameter, never the password."""

from __future__ import annotations

import asyncio
import re

import psycopg
import pytest
from click.testing import CliRunner
from psycopg.conninfo import conninfo_to_dict
from starlette.testclient import TestClient

from axa_queue import OptionsError, Queue, SyncQueue
from axa_queue.cli import main
from axa_queue.db.dsns import as_url, normalized
from conftest import status_of

PASSWORD = "s3cret-never-shown"
TOKEN = "t0ken-for-the-dsn-tests-of-the-dashboard"


def with_scheme(dsn: str, scheme: str) -> str:
    """The test's DSN as a URL of `scheme` (`postgresql+asyncpg`, ...)."""
    return re.sub(r"^postgresql://", f"{scheme}://", as_url(dsn))


async def set_up(url: str) -> None:
    """Set the queue's tables up on `url`."""
    async with Queue(url):
        pass


def cli(*args: str, **env: str | None) -> tuple[int, str, str]:
    """`axa-queue ARGS` in-process, with the environment's DSNs replaced by `env`."""
    runner = CliRunner(env={"AXA_QUEUE_DSN": None, "DATABASE_URL": None, **env})
    result = runner.invoke(main, list(args), prog_name="axa-queue", catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


# --- what is read, and as what ------------------------------------------------------------


def test_a_connection_string_or_a_postgresql_url_is_taken_as_it_is() -> None:
    for given in (
        "host=db dbname=shop user=app",
        "postgresql://app@db/shop?sslmode=require",
        "postgres://app@db:5433/shop",
        "postgresql:///shop?host=/run/postgresql",
        "",
    ):
        assert normalized(given) == given


@pytest.mark.parametrize(
    "scheme",
    ["postgresql+asyncpg", "postgresql+psycopg", "postgresql+psycopg2", "postgres+pg8000"],
)
def test_a_sqlalchemy_url_is_read_as_the_postgresql_url_without_its_driver(scheme: str) -> None:
    given = f"{scheme}://app:{PASSWORD}@db:5433/shop?options=-c%20search_path%3Dshop"
    assert normalized(given) == given.replace(f"{scheme}://", "postgresql://")


def test_a_sqlalchemy_urls_query_is_read_as_sqlalchemy_writes_it() -> None:
    from sqlalchemy.engine import make_url

    given = "postgresql://app@db/shop?options=-c%20search_path%3Dshop&application_name=a%2Bb"
    rendered = make_url(given).set(drivername="postgresql+asyncpg").render_as_string()
    assert "-c+search_path" in rendered  # SQLAlchemy writes a space as `+`
    assert conninfo_to_dict(normalized(rendered)) == conninfo_to_dict(given)
    assert conninfo_to_dict(normalized(rendered))["application_name"] == "a+b"


def test_a_scheme_in_capitals_is_read_as_libpqs_lower_case_one() -> None:
    assert normalized("PostgreSQL+AsyncPG://app@db/shop") == "postgresql://app@db/shop"
    assert normalized("POSTGRES://app@db/shop") == "postgresql://app@db/shop"


def test_asyncpgs_ssl_mode_is_read_as_libpqs_sslmode() -> None:
    assert normalized("postgresql+asyncpg://app@db/shop?ssl=require") == (
        "postgresql://app@db/shop?sslmode=require"
    )
    assert normalized("postgresql+asyncpg://app@db/shop?sslmode=require") == (
        "postgresql://app@db/shop?sslmode=require"
    )
    # Both given: asyncpg's `ssl` is not libpq's and is not read as `sslmode`.
    with pytest.raises(OptionsError, match="libpq does not take: ssl"):
        normalized("postgresql+asyncpg://app@db/shop?ssl=require&sslmode=verify-full")


@pytest.mark.parametrize(
    ("given", "says"),
    [
        (f"mysql://app:{PASSWORD}@db/shop", "is a mysql:// URL: axa-queue runs on PostgreSQL only"),
        ("sqlite:///shop.db", "is a sqlite:// URL: axa-queue runs on PostgreSQL only"),
        (
            f"postgresql+asycnpg://app:{PASSWORD}@db/shop",
            "is a postgresql+asycnpg:// URL, whose driver 'asycnpg' axa-queue does not know",
        ),
        (
            f"postgresql+asyncpg://app:{PASSWORD}@db/shop?prepared_statement_cache_size=0",
            "has URL parameters libpq does not take: prepared_statement_cache_size",
        ),
    ],
)
def test_a_url_no_postgresql_driver_reads_is_refused_naming_its_scheme_never_its_password(
    given: str, says: str
) -> None:
    with pytest.raises(OptionsError) as refused:
        Queue(given)
    message = str(refused.value)
    assert message.startswith("the DSN given ") and says in message, message
    assert PASSWORD not in message and "db/shop" not in message
    assert "postgresql://" in message or "AXA_QUEUE_DSN" in message, "it says what to give"
    with pytest.raises(OptionsError):
        SyncQueue(given)


async def test_a_url_in_the_environment_that_cannot_be_read_is_refused_naming_the_variable(
    monkeypatch,
) -> None:
    monkeypatch.delenv("AXA_QUEUE_DSN", raising=False)
    monkeypatch.setenv("DATABASE_URL", f"mysql://app:{PASSWORD}@db/shop")
    with pytest.raises(OptionsError, match=r"^DATABASE_URL is a mysql:// URL") as refused:
        await Queue().open()
    assert PASSWORD not in str(refused.value)


# --- against the real database -------------------------------------------------------------


@pytest.mark.parametrize(
    "scheme", ["postgresql+asyncpg", "postgresql+psycopg", "postgresql+psycopg2", "postgres"]
)
async def test_a_queue_given_a_sqlalchemy_url_opens_on_its_database_and_queues_there(
    dsn: str, admin, scheme: str
) -> None:
    url = with_scheme(dsn, scheme)
    async with Queue(url) as queue:
        job_id = await queue.enqueue("Report", {"n": 1})
    assert status_of(admin, job_id)[0] == "queued"
    with Queue(url).sync() as jobs:
        assert status_of(admin, jobs.enqueue("Report", {"n": 2}))[0] == "queued"


async def test_database_url_holding_a_sqlalchemy_url_is_read_by_queue_and_sync_queue(
    dsn: str, admin, monkeypatch
) -> None:
    monkeypatch.delenv("AXA_QUEUE_DSN", raising=False)
    monkeypatch.setenv("DATABASE_URL", with_scheme(dsn, "postgresql+asyncpg"))
    queue = Queue()
    async with queue:
        job_id = await queue.enqueue("Report", {})
    assert queue.dsn is not None and queue.dsn.startswith("postgresql://")
    assert status_of(admin, job_id)[0] == "queued"
    with SyncQueue() as jobs:
        assert status_of(admin, jobs.enqueue("Report", {}))[0] == "queued"


def test_every_command_takes_a_sqlalchemy_url_from_dsn_and_from_the_environment(
    dsn: str,
) -> None:
    status, _, stderr = cli("setup", "--dsn", with_scheme(dsn, "postgresql+asyncpg"))
    assert status == 0, stderr
    status, stdout, stderr = cli("counts", DATABASE_URL=with_scheme(dsn, "postgresql+psycopg"))
    assert status == 0 and "ready" in stdout, stderr
    status, _, stderr = cli("check", AXA_QUEUE_DSN=with_scheme(dsn, "postgres"))
    assert status == 0, stderr


def test_a_command_given_a_url_it_cannot_read_says_which_in_one_line_without_the_password() -> None:
    status, stdout, stderr = cli("counts", DATABASE_URL=f"mysql://ops:{PASSWORD}@db/queue")
    assert status == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "Error: the database given (--dsn, AXA_QUEUE_DSN or DATABASE_URL) is a mysql:// URL"
    ), stderr
    assert PASSWORD not in stdout + stderr


def test_the_dashboard_takes_a_sqlalchemy_url(dsn: str) -> None:
    from axa_queue.web import create_app

    url = with_scheme(dsn, "postgresql+asyncpg")
    asyncio.run(set_up(url))
    with TestClient(create_app(url, token=TOKEN)) as web:
        signed = web.post(
            "/signin",
            data={"token": TOKEN, "name": "alice"},
            headers={"origin": "http://testserver"},
            follow_redirects=False,
        )
        assert signed.status_code == 303, signed.text
        assert web.get("/").status_code == 200


def test_the_demo_on_a_given_sqlalchemy_url_runs_in_a_schema_of_its_own(dsn: str, admin) -> None:
    status, stdout, stderr = cli(
        "demo", "--dsn", with_scheme(dsn, "postgresql+psycopg"), "--jobs", "20"
    )
    assert status == 0, stderr
    assert "jobs settled" in stdout
    assert admin.execute("SELECT to_regclass('axa_queue')").fetchone() == (None,)


# --- the other way: a connection string as a URL -------------------------------------------


def test_as_url_reaches_the_same_database_schema_and_session_name(dsn: str, schema: str) -> None:
    url = as_url(dsn)
    assert url.startswith("postgresql://")
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT current_schema(), current_setting('application_name')"
        ).fetchone()
    assert row == (schema, schema)


def test_as_url_keeps_every_parameter_however_it_must_be_encoded() -> None:
    given = (
        "host=db.internal port=6432 dbname='my shop' user=app "
        f"password='p@ss/w:rd {PASSWORD}' options='-c search_path=s1' sslmode=require"
    )
    assert conninfo_to_dict(as_url(given)) == conninfo_to_dict(given)
    socket = "host=/run/postgresql dbname=shop"
    assert conninfo_to_dict(as_url(socket)) == conninfo_to_dict(socket)
    several = "host=a,b port=5432,5433 dbname=shop"
    assert conninfo_to_dict(as_url(several)) == conninfo_to_dict(several)
    assert as_url("host=::1 port=5432 dbname=shop") == "postgresql://[::1]:5432/shop"
