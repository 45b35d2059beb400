"""Tasks as Django's tasks documentation declares them; what they did is written to the
file `AXA_DJANGO_TEST_OUT` names (one line each), so a test in another process sees it."""

from __future__ import annotations

import os
import threading
from typing import Any

from django.db import connection

from axa_queue.contrib.django.backend import tasks_api

task = tasks_api.task


def _note(line: str) -> None:
    out = os.environ.get("AXA_DJANGO_TEST_OUT")
    if out:
        with open(out, "a", encoding="utf-8") as f:
            f.write(line + "\n")


@task
def send_email(recipient_list: list[str], subject: str, message: str, from_email: str) -> int:
    """Django's documentation example: returns the number of emails sent."""
    _note(f"sent {subject} to {','.join(recipient_list)} pid={os.getpid()}")
    return len(recipient_list)


@task(priority=2)
def calculate_meaning_of_life() -> int:
    """Django's documentation example."""
    return 42


@task
def fail(kind: str) -> None:
    """Raise a `PaymentDeclined` or a `ValueError`."""
    if kind == "declined":
        raise PaymentDeclined("card declined")
    raise ValueError("bad value")


class PaymentDeclined(Exception):
    """A failure of the task's own."""


@task
def uses_the_database() -> dict[str, Any]:
    """Query through Django's connection, and tell which thread and connection it used."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    return {"thread": threading.get_ident(), "backend_pid": pid}


@task
async def add_async(a: int, b: int) -> int:
    """An async task."""
    return a + b


@task(takes_context=True)
def with_context(context: Any, label: str) -> dict[str, Any]:
    """A task that takes its context."""
    return {"label": label, "attempt": context.attempt, "id": context.task_result.id}
