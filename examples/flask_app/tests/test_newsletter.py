"""A subscriber and their welcome: written in one transaction on the app's own
connection, the welcome's job run by the worker (here `queue.drain_sync()`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from flask import Flask
from flask.testing import FlaskClient

from axa_queue.testing import assert_enqueued, refute_enqueued
from newsletter.jobs import queue

PROJECT = Path(__file__).resolve().parent.parent


def test_subscribing_queues_a_welcome_which_the_worker_sends(
    app: Flask, client: FlaskClient
) -> None:
    subscribed = client.post("/subscribers", data={"email": "ada@example.com"})
    assert subscribed.status_code == 201
    subscriber, welcome = subscribed.json["subscriber"], subscribed.json["welcome"]  # type: ignore[index]
    job = assert_enqueued(app.extensions["jobs"], "SendWelcome", {"subscriber_id": subscriber})
    assert str(job.id) == welcome
    assert client.get(f"/welcomes/{welcome}").json == {"state": "queued"}

    ran = queue.drain_sync()  # what `axa-queue worker newsletter.jobs:queue` does, here

    assert ran.completed == 1
    assert client.get(f"/welcomes/{welcome}").json == {
        "state": "completed",
        "sent_to": "ada@example.com",
    }
    with app.extensions["pool"].connection() as conn:
        assert conn.execute("SELECT welcomed FROM subscribers").fetchall() == [(True,)]


def test_a_refused_subscription_leaves_neither_the_subscriber_nor_the_welcome(
    app: Flask, client: FlaskClient
) -> None:
    refused = client.post("/subscribers", data={"email": "bob@spam.example"})

    assert refused.status_code == 422
    refute_enqueued(app.extensions["jobs"], "SendWelcome")
    with app.extensions["pool"].connection() as conn:
        assert conn.execute("SELECT count(*) FROM subscribers").fetchone() == (0,)
    assert queue.drain_sync().completed == 0


def test_an_unknown_welcome_is_not_found(client: FlaskClient) -> None:
    assert client.get("/welcomes/00000000-0000-0000-0000-000000000000").status_code == 404


def test_the_health_check_answers(client: FlaskClient) -> None:
    health = client.get("/health")

    assert (health.status_code, health.text) == (200, "ok")


def test_axa_queue_worker_sends_the_welcome(axa_queue_dsn: str, client: FlaskClient) -> None:
    welcome = client.post("/subscribers", data={"email": "cy@example.com"}).json["welcome"]  # type: ignore[index]
    env = {**os.environ, "DATABASE_URL": axa_queue_dsn}
    worker = subprocess.Popen(
        [sys.executable, "-m", "axa_queue.cli", "worker", "newsletter.jobs:queue"],
        cwd=PROJECT,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while client.get(f"/welcomes/{welcome}").json["state"] != "completed":  # type: ignore[index]
            assert time.monotonic() < deadline, "the worker did not send the welcome"
            time.sleep(0.1)
    finally:
        worker.send_signal(signal.SIGINT)
        assert worker.wait(timeout=60) == 0
