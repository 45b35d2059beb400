"""The app: subscribing writes the subscriber and queues the welcome email in one
transaction on the app's own connection (from its psycopg pool); a `SyncQueue` reads
how the job is doing. The jobs run in `axa-queue worker newsletter.jobs:queue`.

    DATABASE_URL=postgresql://user:password@host/dbname flask --app newsletter.app:create_app run
"""

from __future__ import annotations

import os
from typing import Any
from uuid import UUID

from flask import Flask, abort, request
from psycopg_pool import ConnectionPool

from axa_queue import JobState, NewJob, SyncQueue, enqueue_on

SCHEMA = """
CREATE TABLE IF NOT EXISTS subscribers (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email text NOT NULL,
    welcomed boolean NOT NULL DEFAULT false
)
"""
"""The app's table (in production, a migration makes it)."""

BLOCKED_DOMAIN = "@spam.example"
"""Addresses the newsletter refuses once they are written, after the welcome is queued."""


class Refused(Exception):
    """The subscription is refused: its transaction rolls back."""


def create_app(database_url: str | None = None) -> Flask:
    """The app on the database at `database_url` (default: `DATABASE_URL`)."""
    url = database_url or os.environ["DATABASE_URL"]
    app = Flask(__name__)
    pool = ConnectionPool(url, min_size=1, max_size=4, open=True)  # the app's own
    jobs = SyncQueue(url)  # reads jobs and results, on a small pool of its own
    app.extensions["pool"] = pool
    app.extensions["jobs"] = jobs
    with pool.connection() as conn:
        conn.execute(SCHEMA)

    @app.post("/subscribers")
    def subscribe() -> tuple[dict[str, Any], int]:
        """Write the subscriber and queue the welcome: both commit, or neither."""
        email = request.form["email"]
        try:
            with pool.connection() as conn:  # one transaction: commits at the block's end
                row = conn.execute(
                    "INSERT INTO subscribers (email) VALUES (%s) RETURNING id", (email,)
                ).fetchone()
                assert row is not None
                job_id = enqueue_on(conn, NewJob("SendWelcome", {"subscriber_id": row[0]}))
                if email.endswith(BLOCKED_DOMAIN):
                    raise Refused("this domain is not accepted")  # both roll back
        except Refused as error:
            return {"error": str(error)}, 422
        return {"subscriber": row[0], "welcome": str(job_id)}, 201

    @app.get("/welcomes/<uuid:job_id>")
    def welcome(job_id: UUID) -> dict[str, Any]:
        """How the welcome's job is doing; its result once completed."""
        info = jobs.job(job_id)
        if info is None:
            abort(404)
        body: dict[str, Any] = {"state": info.state.value}
        if info.state is JobState.COMPLETED:
            body.update(jobs.result(job_id))
        return body

    @app.get("/health")
    def health() -> tuple[str, int]:
        """Whether the database answers (the worker's health is its own:
        `axa-queue worker --metrics-port` serves it)."""
        jobs.ping()
        return "ok", 200

    return app
