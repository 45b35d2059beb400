"""What the Django tests share: Django set up once per process with the tests' project
(`django_site`), pointed at each test's schema (`django_db`), its queue's tables made
by `migrate` (`migrated`), and a way to run the tasks found, in this process (`drain`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import django
import pytest
from psycopg.conninfo import conninfo_to_dict

from conftest import Schemas
from recycled import DJANGO

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_site.settings")
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402

from axa_queue.contrib.django import worker  # noqa: E402
from axa_queue.contrib.django.backend import tasks_api  # noqa: E402
from django_site.shop import tasks  # noqa: E402

__all__ = [
    "SITE",
    "django_db",
    "drain",
    "migrated",
    "tasks",
    "tasks_api",
    "until",
    "worker_running",
]

SITE = os.path.join(os.path.dirname(__file__), "django_site")
"""The tests' Django project, with its manage.py."""


def _point_at(dsn: str) -> None:
    """Point Django's `default` database, the tasks backend and the worker's queue at
    the database and schema of `dsn`."""
    given = conninfo_to_dict(dsn)
    connections.close_all()
    settings_dict = connections["default"].settings_dict
    settings_dict.update(
        NAME=given.get("dbname", ""),
        USER=given.get("user", ""),
        PASSWORD=given.get("password", ""),
        HOST=given.get("host", ""),
        PORT=str(given.get("port", "")),
        OPTIONS={k: given[k] for k in ("options", "application_name") if k in given},
    )
    for backend in tasks_api.task_backends.all():
        backend.close()
        backend._queue = None
    worker._made.clear()


@pytest.fixture
def django_db(dsn: str) -> Iterator[str]:
    """Django's database is this test's schema; yields the DSN."""
    _point_at(dsn)
    yield dsn
    connections.close_all()
    for backend in tasks_api.task_backends.all():
        backend.close()
    worker._made.clear()


@pytest.fixture
def migrated(django_db: str, schema: str, schemas: Schemas) -> str:
    """This test's schema with every app's tables, the queue's made by `migrate`: by
    `migrate` itself, or as an earlier test's schema that `migrate` made, emptied of what
    that test added (`recycled`, the `DJANGO` kind: the rows `migrate` wrote are kept)."""
    recycler = schemas.recycler
    if recycler is not None and recycler.swap(schema, DJANGO):
        return django_db
    call_command("migrate", verbosity=0)
    if recycler is not None:
        recycler.learn(schema, DJANGO)
    return django_db


def drain(**options: Any) -> Any:
    """Run the ready tasks in this process, as `manage.py axa_queue worker` would."""
    return worker.tasks_queue().drain_sync(**options)


@contextlib.contextmanager
def worker_running() -> Iterator[None]:
    """Run the tasks' queue (as `manage.py axa_queue worker` does) in a thread of its own
    for the block; stopped gracefully after it."""
    queue = worker.tasks_queue()
    started = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        box["loop"] = asyncio.get_running_loop()
        box["stop"] = asyncio.Event()
        async with queue:
            started.set()
            await queue.run(box["stop"])

    thread = threading.Thread(target=lambda: asyncio.run(main()))
    thread.start()
    try:
        assert started.wait(30), "the worker did not start"
        yield
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(30)


def until(check: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait until `check()` is true, polling with a deadline."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        time.sleep(0.05)
