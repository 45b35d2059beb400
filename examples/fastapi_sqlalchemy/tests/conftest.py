"""The example's tests run on a real PostgreSQL: each test gets a schema of its own
from axa-queue's pytest plugin (`axa_queue_dsn`), and the app runs on it with its
lifespan (so its worker runs too), served in-process through httpx."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import quote, urlencode

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from psycopg.conninfo import conninfo_to_dict

from shop.main import create_app


def as_url(dsn: str) -> str:
    """The plugin's conninfo DSN as a `postgresql://` URL (what `DATABASE_URL` holds),
    its `options` (the test's schema) in the query, which asyncpg reads too."""
    parts = conninfo_to_dict(dsn)
    user = quote(str(parts.pop("user", "")), safe="")
    password = parts.pop("password", None)
    login = f"{user}:{quote(str(password), safe='')}@" if password else f"{user}@" if user else ""
    host = str(parts.pop("host", ""))
    port = parts.pop("port", None)
    if host.startswith("/"):  # a Unix socket's directory goes in the query
        parts["host"], host = host, ""
    where = f"{host}:{port}" if port and host else host
    if port and not host:
        parts["port"] = port
    dbname = quote(str(parts.pop("dbname", "")), safe="")
    query = urlencode({key: str(value) for key, value in parts.items()}, quote_via=quote)
    return f"postgresql://{login}{where}/{dbname}" + (f"?{query}" if query else "")


@pytest.fixture
async def app(axa_queue_dsn: str) -> AsyncIterator[FastAPI]:
    """The app on the test's schema, its lifespan entered (the worker running)."""
    app = create_app(as_url(axa_queue_dsn))
    async with LifespanManager(app):
        yield app


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client talking to the app in this process."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://shop") as client:
        yield client
