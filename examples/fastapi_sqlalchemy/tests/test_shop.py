"""An order and its receipt: written in one transaction of the request's session, the
receipt's job run by the worker of the app's lifespan, its result read back."""

from __future__ import annotations

import httpx
import psycopg
from fastapi import FastAPI
from sqlalchemy import func, select, text

from axa_queue.testing import assert_enqueued, refute_enqueued
from shop.main import DECLINED_CARD
from shop.models import Order

CARD = "4242424242424242"


async def test_an_order_queues_its_receipt_which_the_worker_sends(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    placed = await client.post(
        "/orders", json={"email": "ada@example.com", "total_cents": 1200, "card": CARD}
    )
    assert placed.status_code == 201
    order, receipt = placed.json()["order"], placed.json()["receipt"]
    job = await assert_enqueued(app.state.queue, "SendReceipt", {"order_id": order})
    assert str(job.id) == receipt

    sent = await client.get(f"/receipts/{receipt}", params={"wait": 30})

    assert sent.json() == {"state": "completed", "sent_to": "ada@example.com"}


async def test_a_refused_payment_leaves_neither_the_order_nor_its_job(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    refused = await client.post(
        "/orders", json={"email": "bob@example.com", "total_cents": 5, "card": DECLINED_CARD}
    )

    assert refused.status_code == 402
    await refute_enqueued(app.state.queue, "SendReceipt")
    sessions = app.state.sessions
    async with sessions() as session:
        assert await session.scalar(select(func.count()).select_from(Order)) == 0


async def test_an_unknown_receipt_is_not_found(client: httpx.AsyncClient) -> None:
    missing = await client.get("/receipts/00000000-0000-0000-0000-000000000000")

    assert missing.status_code == 404


async def test_the_health_check_answers_while_the_worker_runs(client: httpx.AsyncClient) -> None:
    health = await client.get("/health")

    assert (health.status_code, health.text) == (200, "ok")


async def test_the_app_runs_sqlalchemy_on_asyncpg_and_its_queue_on_the_same_url(
    app: FastAPI, axa_queue_dsn: str
) -> None:
    engine = app.state.engine
    assert engine.dialect.driver == "asyncpg"
    assert app.state.queue.dsn.startswith("postgresql://")  # axa-queue dropped +asyncpg
    async with engine.connect() as conn:
        schema = (await conn.execute(text("SELECT current_schema()"))).scalar()
    with psycopg.connect(axa_queue_dsn) as conn:  # the test's schema, by the fixtures
        assert conn.execute("SELECT current_schema()").fetchone() == (schema,)
        assert conn.execute("SELECT to_regclass('shop_orders')").fetchone() != (None,)
