"""The example's tests run on a real PostgreSQL: each test gets a schema of its own
from axa-queue's pytest plugin (`axa_queue_dsn`), the app and the worker's queue both
pointed at it. The jobs run in the test (`queue.drain_sync()`), as the worker would."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from flask import Flask
from flask.testing import FlaskClient

from newsletter.app import create_app
from newsletter.jobs import queue


@pytest.fixture
def app(axa_queue_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Flask]:
    """The app on the test's schema; the queue (and its handler) on it too."""
    monkeypatch.delenv("AXA_QUEUE_DSN", raising=False)
    monkeypatch.setenv("DATABASE_URL", axa_queue_dsn)
    queue.dsn = axa_queue_dsn
    app = create_app()
    yield app
    app.extensions["jobs"].close()
    app.extensions["pool"].close()
    queue.dsn = None


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    """Flask's test client."""
    return app.test_client()
