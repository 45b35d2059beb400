"""The example's tests run on a real PostgreSQL: each test gets a schema of its own
from axa-queue's pytest plugin (`axa_queue_dsn`), Django pointed at it and migrated."""

from __future__ import annotations

import os
from collections.abc import Iterator

import django
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402


@pytest.fixture
def shop_db(axa_queue_dsn: str) -> Iterator[str]:
    """Django's database is the test's own schema, migrated (the queue's tables by
    `axa_queue.contrib.django`'s migrations, the shop's by its own)."""
    given = conninfo_to_dict(axa_queue_dsn)
    with psycopg.connect(axa_queue_dsn) as probe:  # what libpq made of it, defaults included
        info = probe.info
        resolved = {
            "NAME": info.dbname,
            "USER": info.user,
            "PASSWORD": info.password or "",
            "HOST": info.host,
            "PORT": str(info.port),
        }
    connections.close_all()
    connections["default"].settings_dict.update(
        resolved,
        OPTIONS={"options": given["options"], "application_name": given["application_name"]},
    )
    call_command("migrate", verbosity=0)
    yield axa_queue_dsn
    connections.close_all()
