"""The example's tests run on a real PostgreSQL, with pytest-django or without it.

With pytest-django (what most Django projects test with), the tests are marked
`django_db(transaction=True)`: the jobs a view queues are committed, so the worker's
own connections see them (a plain `django_db` test runs in a transaction that is
rolled back, and never commits). pytest-django makes its test database with `migrate`,
which makes the queue's tables too, and the queue follows Django's connection to it.
The flush after each test empties Django's tables, not the queue's (they are no
model of Django's: `managed = False`), so `shop_db` deletes the test's jobs itself;
and the tasks backend's own connections (its pool, for `enqueue` and `get_result`) are
closed before pytest-django drops the test database (`django_db_setup`), which it
cannot do while they are open.

Without it, each test gets a schema of its own from axa-queue's pytest plugin
(`axa_queue_dsn`), Django pointed at it and migrated.

Either way `shop_db` yields the DSN of the test's database, and the server is the one
axa-queue's plugin finds (`axa_queue_server`: `AXA_TEST_DATABASE_URL`, else a local
or an embedded one), as the example has no database of its own configured: a
project's own settings name theirs, and pytest-django needs nothing more.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import django
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402

from axa_queue.contrib.django import conf  # noqa: E402

try:
    from django.tasks import task_backends  # Django 6
except ImportError:  # Django 5.2, with the django-tasks backport
    from django_tasks import task_backends


def server_settings(dsn: str) -> dict[str, Any]:
    """The `DATABASES` entry's connection keys for `dsn`'s server, as libpq resolves
    them (its defaults included)."""
    with psycopg.connect(dsn) as probe:
        info = probe.info
        return {
            "NAME": info.dbname,
            "USER": info.user,
            "PASSWORD": info.password or "",
            "HOST": info.host,
            "PORT": str(info.port),
        }


@pytest.fixture(scope="session")
def django_db_modify_db_settings(
    axa_queue_server: str, django_db_modify_db_settings_parallel_suffix: None
) -> None:
    """pytest-django: make the test database (`test_shop`) on the server axa-queue's
    plugin found; pytest-django's suffixes (`_gw0` under pytest-xdist) still apply."""
    found = server_settings(axa_queue_server)
    del found["NAME"]  # the settings' own (`shop`), which the test database is named after
    connections["default"].settings_dict.update(found)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None) -> Iterator[None]:
    """pytest-django's own (its test database), then, after the session and before it
    drops that database, the tasks backend's connections to it closed."""
    yield
    task_backends.close_all()


@pytest.fixture
def shop_db(request: pytest.FixtureRequest) -> Iterator[str]:
    """The DSN of the test's database, with the shop's and the queue's tables, Django's
    connection on it (see the module)."""
    if request.config.pluginmanager.hasplugin("django"):  # pytest-django
        yield conf.dsn()  # its test database, which the test's django_db mark opened
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM axa_queue")  # the jobs, which the flush leaves
        return
    dsn: str = request.getfixturevalue("axa_queue_dsn")
    given = conninfo_to_dict(dsn)
    connections.close_all()
    connections["default"].settings_dict.update(
        server_settings(dsn),
        OPTIONS={"options": given["options"], "application_name": given["application_name"]},
    )
    call_command("migrate", verbosity=0)
    yield dsn
    connections.close_all()
