"""The app: placing an order writes the order and queues its receipt in one
transaction of the request's `AsyncSession`; the worker runs in the app's lifespan.

    DATABASE_URL=postgresql+asyncpg://user:password@host/dbname \
        uvicorn --factory shop.main:create_app
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

from fastapi import FastAPI, HTTPException
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from axa_queue import JobState, NewJob, Queue, enqueue_on
from shop.models import Base, Order

DECLINED_CARD = "4000000000000002"
"""The card number the fake payment provider refuses."""


SERVER_SETTINGS = ("options", "application_name")
"""libpq's URL parameters that asyncpg takes only as server settings, sent at login."""


class PlaceOrder(BaseModel):
    """What a customer sends to place an order."""

    email: str
    total_cents: int
    card: str


class PaymentRefused(Exception):
    """The payment provider refused the card."""


def charge(card: str, total_cents: int) -> None:
    """A stand-in for a payment provider's call."""
    if card == DECLINED_CARD:
        raise PaymentRefused("card declined")


def create_app(database_url: str | None = None) -> FastAPI:
    """The app on the database at `database_url` (default: the `DATABASE_URL`
    environment variable), a SQLAlchemy URL: `postgresql+asyncpg://user:password@host/db`
    (a plain `postgresql://` one is run on asyncpg too). The queue takes the same URL:
    axa-queue drops the `+asyncpg` and connects with psycopg."""
    url = make_url(database_url or os.environ["DATABASE_URL"]).set(drivername="postgresql+asyncpg")
    # SQLAlchemy passes the URL's query to asyncpg.connect() as arguments, and asyncpg
    # has none for libpq's `options` (the tests' URL sets the schema with it): send
    # those to the server as settings instead.
    settings = {k: str(v) for k, v in url.query.items() if k in SERVER_SETTINGS}
    engine = create_async_engine(
        url.difference_update_query(settings), connect_args={"server_settings": settings}
    )
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    queue = Queue(url.render_as_string(hide_password=False))

    @queue.handler("SendReceipt")
    async def send_receipt(args: dict[str, Any]) -> dict[str, str]:
        """Send an order's receipt (here: mark it sent) and say to whom."""
        async with sessions.begin() as session:
            order = await session.get_one(Order, args["order_id"])
            order.receipt_sent = True
            return {"sent_to": order.email}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with engine.begin() as conn:  # in production, a migration does
            await conn.run_sync(Base.metadata.create_all)
        async with queue.running():  # opens the queue and runs its worker
            yield
        await engine.dispose()

    app = FastAPI(lifespan=lifespan)
    app.state.queue = queue
    app.state.engine = engine
    app.state.sessions = sessions

    @app.post("/orders", status_code=201)
    async def place_order(order: PlaceOrder) -> dict[str, Any]:
        """Save the order and queue its receipt in one transaction: if the payment is
        refused, neither the order nor the job is left behind."""
        try:
            async with sessions.begin() as session:
                row = Order(email=order.email, total_cents=order.total_cents)
                session.add(row)
                await session.flush()  # gives the order its id
                job_id = await enqueue_on(session, NewJob("SendReceipt", {"order_id": row.id}))
                charge(order.card, order.total_cents)  # raises: both roll back
        except PaymentRefused as error:
            raise HTTPException(status_code=402, detail=str(error)) from error
        return {"order": row.id, "receipt": str(job_id)}

    @app.get("/receipts/{job_id}")
    async def receipt(job_id: UUID, wait: float = 0) -> dict[str, Any]:
        """How the receipt's job is doing; with `?wait=SECONDS`, once it has finished
        (or the time is up)."""
        info = await queue.job(job_id)
        if info is None:
            raise HTTPException(status_code=404, detail="no such receipt")
        if wait > 0:
            with contextlib.suppress(TimeoutError):  # then: as it is now
                info = await queue.wait(job_id, timeout=wait)
        body: dict[str, Any] = {"state": info.state.value}
        if info.state is JobState.COMPLETED:
            body.update(await queue.result(job_id))
        return body

    @app.get("/health")
    async def health() -> PlainTextResponse:
        """The queue's health check, for the orchestrator's probe."""
        ok, reason = await queue.health()
        return PlainTextResponse(reason, status_code=200 if ok else 503)

    return app
