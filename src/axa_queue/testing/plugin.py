"""The pytest plugin axa-queue installs (entry point `pytest11`, named `axa_queue`):
pytest loads it in any project where the package is installed, with no setting.

Fixtures:

- `axa_queue_dsn`: a DSN to a fresh schema of its own, with the queue's tables set up,
  for one test; dropped afterwards (sessions left on it are ended first). Give it to
  `Queue(...)`, `SyncQueue(...)` or your own connections.
- `axa_queue_url`: the same schema as `axa_queue_dsn` (the same test's), as a
  `postgresql://` URL with the `search_path` in its `options` query parameter, for
  SQLAlchemy and other clients that take only URLs (docs/testing.md shows SQLAlchemy on
  psycopg and on asyncpg, which takes `options` only as a server setting).
- `axa_queue_server` (session): the server those schemas are made on:
  `AXA_TEST_DATABASE_URL`, else a local server, else an embedded server started once
  for the session (the `[embedded]` extra); see `axa_queue.testing.database_server`.

Each test's schema is its own, so tests may run in parallel (pytest-xdist: each worker
process finds its own server the same way). Without pytest this module is never
imported; the helpers are in `axa_queue.testing`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import NoDatabaseError, as_url, database_server, fresh_schema

__all__ = ["axa_queue_dsn", "axa_queue_server", "axa_queue_url"]


@pytest.fixture(scope="session")
def axa_queue_server() -> Iterator[str]:
    """The DSN of the server the test schemas are made on (see the module)."""
    try:
        with database_server() as dsn:
            yield dsn
    except NoDatabaseError as error:
        pytest.fail(str(error), pytrace=False)


@pytest.fixture
def axa_queue_dsn(axa_queue_server: str) -> Iterator[str]:
    """A DSN to a fresh schema with the queue's tables, for this test only."""
    with fresh_schema(axa_queue_server) as dsn:
        yield dsn


@pytest.fixture
def axa_queue_url(axa_queue_dsn: str) -> str:
    """`axa_queue_dsn` as a `postgresql://` URL: the same schema, for clients that take
    only URLs (see the module)."""
    return as_url(axa_queue_dsn)
