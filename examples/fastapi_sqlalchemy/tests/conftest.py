"""The example's tests run on a real PostgreSQL: each test gets a schema of its own
from axa-queue's pytest plugin (`axa_queue_url`, the schema's `postgresql://` URL), and
the app runs on it with its lifespan (so its worker runs too), SQLAlchemy on asyncpg,
served in-process through httpx."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from shop.main import create_app


@pytest.fixture
async def app(axa_queue_url: str) -> AsyncIterator[FastAPI]:
    """The app on the test's schema, its lifespan entered (the worker running), given
    the URL as a FastAPI app's `DATABASE_URL` holds it: SQLAlchemy's, with `+asyncpg`."""
    app = create_app(axa_queue_url.replace("postgresql://", "postgresql+asyncpg://", 1))
    async with LifespanManager(app):
        yield app


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client talking to the app in this process."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://shop") as client:
        yield client
