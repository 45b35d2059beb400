"""An order and its receipt: queued with the order's transaction, run by the worker.

Each test commits (pytest-django's `django_db(transaction=True)`, which a run without
pytest-django ignores), so the worker's connections see what it queued; `shop_db` is
its database (see conftest.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.test import Client

from axa_queue.contrib.django.worker import tasks_queue

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("shop_db")]

PROJECT = Path(__file__).resolve().parent.parent


def test_an_order_queues_its_receipt_which_the_worker_sends() -> None:
    from shop.models import Order

    client = Client()
    placed = client.post("/orders/", {"email": "ada@example.com", "total_cents": "1200"})
    assert placed.status_code == 201
    receipt = placed.json()["receipt"]
    assert client.get(f"/orders/receipts/{receipt}/").json() == {"status": "READY"}

    ran = tasks_queue().drain_sync()  # what `manage.py axa_queue worker` does, here

    assert ran.completed == 1
    assert Order.objects.get().receipt_sent
    assert client.get(f"/orders/receipts/{receipt}/").json() == {
        "status": "SUCCESSFUL",
        "sent_to": "ada@example.com",
    }


def test_an_order_that_rolls_back_queues_nothing() -> None:
    from django.db import transaction

    from shop.models import Order
    from shop.tasks import send_receipt

    with pytest.raises(RuntimeError), transaction.atomic():
        order = Order.objects.create(email="bob@example.com", total_cents=5)
        send_receipt.enqueue(order.id)
        raise RuntimeError("payment refused")
    assert tasks_queue().drain_sync().completed == 0


def test_manage_py_axa_queue_worker_sends_the_receipt(shop_db: str) -> None:
    client = Client()
    placed = client.post("/orders/", {"email": "cy@example.com", "total_cents": "300"})
    receipt = placed.json()["receipt"]
    env = {**os.environ, "DATABASE_URL": shop_db}
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "axa_queue", "worker"], cwd=PROJECT, env=env
    )
    try:
        deadline = time.monotonic() + 60
        while client.get(f"/orders/receipts/{receipt}/").json()["status"] != "SUCCESSFUL":
            assert time.monotonic() < deadline, "the worker did not send the receipt"
            time.sleep(0.1)
    finally:
        worker.send_signal(signal.SIGINT)
        assert worker.wait(timeout=60) == 0
    shown = subprocess.run(
        [sys.executable, "manage.py", "axa_queue", "show", receipt, "--json"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(shown.stdout)["state"] == "completed"
