"""The settings of `axa_queue.contrib.django`: the `AXA_QUEUE` dict in Django's
settings, and the DSN made of the database it names.

::

    AXA_QUEUE = {
        "DATABASE": "default",          # the alias whose database holds the tables
        "QUEUE": "shop.jobs:queue",     # optional: your own Queue, which the tasks join
        "OPTIONS": {"workers": 8},      # QueueOptions fields, for a queue made here
        "TASK_MODULES": ["tasks"],      # modules of each installed app the worker imports
    }

Every key is optional. The DSN is made of the alias's `NAME`, `USER`, `PASSWORD`,
`HOST`, `PORT` and those of its `OPTIONS` libpq knows (`sslmode`, `options`, ...), as the
connection has them (so a test database Django switched to is followed).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import psycopg
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections
from psycopg.conninfo import make_conninfo

from ... import QueueOptions
from ...options import DSN_VARIABLES, POOLER_VARIABLE, SCHEMA_VARIABLE

__all__ = [
    "DEFAULT_TASK_MODULES",
    "KEYS",
    "SETTING",
    "database_alias",
    "dsn",
    "environment",
    "queue_options",
    "queue_target",
    "setting",
    "task_modules",
]

SETTING = "AXA_QUEUE"
"""The name of the Django setting (a dict) this app reads; not an environment variable."""

KEYS = ("DATABASE", "QUEUE", "OPTIONS", "TASK_MODULES")
"""The keys `AXA_QUEUE` may have."""

DEFAULT_TASK_MODULES = ("tasks",)
"""The modules of each installed app the worker imports to find `@task`s."""


def setting(key: str, default: Any = None) -> Any:
    """`AXA_QUEUE[key]`, or `default`. An unknown key is refused, naming it."""
    given = getattr(settings, SETTING, None) or {}
    if not isinstance(given, dict):
        raise ImproperlyConfigured(f"AXA_QUEUE must be a dict, got a {type(given).__name__}")
    unknown = sorted(set(given) - set(KEYS))
    if unknown:
        raise ImproperlyConfigured(
            f"AXA_QUEUE has unknown key(s) {', '.join(map(repr, unknown))}: "
            f"it takes {', '.join(KEYS)}"
        )
    return given.get(key, default)


def database_alias() -> str:
    """The alias of the database that holds the queue's tables (`AXA_QUEUE["DATABASE"]`,
    else `default`)."""
    alias = setting("DATABASE", DEFAULT_DB_ALIAS)
    if alias not in settings.DATABASES:
        raise ImproperlyConfigured(
            f"AXA_QUEUE['DATABASE'] is {alias!r}, which DATABASES does not have: "
            f"name one of {', '.join(map(repr, settings.DATABASES))}"
        )
    return str(alias)


_LIBPQ_KEYWORDS = frozenset(
    d.keyword.decode() for d in psycopg.pq.Conninfo.get_defaults() if d.keyword
)


def dsn(alias: str | None = None) -> str:
    """A libpq connection string to the database of `alias` (default: `database_alias()`),
    as Django's connection to it has its settings. Raises `ImproperlyConfigured` unless
    it is PostgreSQL."""
    alias = alias or database_alias()
    connection = connections[alias]
    if connection.vendor != "postgresql":
        raise ImproperlyConfigured(
            f"the database {alias!r} is {connection.vendor}: axa-queue needs PostgreSQL; "
            "name a PostgreSQL database in AXA_QUEUE['DATABASE']"
        )
    given = connection.settings_dict
    params: dict[str, Any] = {
        "dbname": given.get("NAME"),
        "user": given.get("USER"),
        "password": given.get("PASSWORD"),
        "host": given.get("HOST"),
        "port": given.get("PORT"),
    }
    options = given.get("OPTIONS") or {}
    params.update({k: v for k, v in options.items() if k in _LIBPQ_KEYWORDS})
    return make_conninfo(**{k: str(v) for k, v in params.items() if v not in (None, "")})


def queue_options() -> QueueOptions:
    """The `QueueOptions` of `AXA_QUEUE["OPTIONS"]` (an `OptionsError` names a bad one)."""
    options = setting("OPTIONS") or {}
    if not isinstance(options, dict):
        raise ImproperlyConfigured("AXA_QUEUE['OPTIONS'] must be a dict of QueueOptions fields")
    return QueueOptions(**options)


def queue_target() -> str | None:
    """`AXA_QUEUE["QUEUE"]`: the application's own `Queue`, as `MODULE:ATTR`, if any."""
    target = setting("QUEUE")
    return None if target is None else str(target)


def task_modules() -> tuple[str, ...]:
    """The module names, inside each installed app, the worker imports to find tasks."""
    return tuple(setting("TASK_MODULES", DEFAULT_TASK_MODULES))


@contextlib.contextmanager
def environment() -> Iterator[str]:
    """Within the block, the environment names the queue's database (`AXA_QUEUE_DSN`)
    and the schema and pooler of `AXA_QUEUE["OPTIONS"]`, for the `axa-queue` commands
    and the worker processes they start; restored afterwards. Yields the DSN."""
    found = dsn()
    options = setting("OPTIONS") or {}
    wanted = {DSN_VARIABLES[0]: found}
    if options.get("schema"):
        wanted[SCHEMA_VARIABLE] = str(options["schema"])
    if options.get("pooler"):
        wanted[POOLER_VARIABLE] = str(options["pooler"])
    saved = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    try:
        yield found
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
