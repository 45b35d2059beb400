"""Django's tasks framework on axa-queue (`AxaQueueBackend`), run as Django's tasks
documentation runs it: `@task`, `.enqueue()`, `.using(...)`, `get_result()`,
`result.refresh()`, `result.return_value`; on Django 6's `django.tasks`, or the
`django-tasks` backport on Django 5.2."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone

from axa_queue.contrib.django.backend import AxaQueueBackend
from djangotest import django_db, drain, migrated, tasks, tasks_api  # noqa: F401

Status = tasks_api.TaskResultStatus
InvalidTask = getattr(tasks_api.exceptions, "InvalidTask", None) or getattr(
    tasks_api.exceptions, "InvalidTaskError", None
)

pytestmark = pytest.mark.usefixtures("migrated")


def row(admin: psycopg.Connection[Any], job_id: str) -> Any:
    found = admin.execute(
        "SELECT name, args, status, priority, run_at, error FROM axa_queue WHERE id = %s",
        (uuid.UUID(job_id),),
    ).fetchone()
    return found


def test_the_backend_says_it_supports_every_feature_django_defines() -> None:
    backend = tasks_api.task_backends["default"]
    assert isinstance(backend, AxaQueueBackend)
    assert backend.supports_defer and backend.supports_async_task
    assert backend.supports_get_result and backend.supports_priority


def test_the_documentations_example_runs_and_reports_its_return_value(
    admin: psycopg.Connection[Any],
) -> None:
    result = tasks.send_email.enqueue(
        recipient_list=["user@example.com"],
        subject="You have a message",
        message="Hello there!",
        from_email="from@example.com",
    )
    assert result.status == Status.READY
    name, args, status, *_ = row(admin, result.id)
    assert (name, status) == ("django_site.shop.tasks.send_email", "queued")
    assert args == {
        "args": [],
        "kwargs": {
            "recipient_list": ["user@example.com"],
            "subject": "You have a message",
            "message": "Hello there!",
            "from_email": "from@example.com",
        },
    }
    assert drain().completed == 1
    result.refresh()
    assert result.status == Status.SUCCESSFUL and result.is_finished
    assert result.return_value == 1
    assert result.attempts == 1 and result.errors == []
    assert result.enqueued_at <= result.started_at <= result.finished_at
    again = tasks.send_email.get_result(result.id)
    assert again.return_value == 1 and again.kwargs["subject"] == "You have a message"
    assert "Hello there!" not in repr(again) and "user@example.com" not in repr(again)


def test_enqueue_on_commit_queues_the_task_when_the_transaction_commits_and_never_on_rollback(
    admin: psycopg.Connection[Any],
) -> None:
    with transaction.atomic():
        kept = tasks.calculate_meaning_of_life.enqueue()
        assert row(admin, kept.id) is None  # not before the commit
    assert row(admin, kept.id) is not None
    with pytest.raises(RuntimeError), transaction.atomic():
        dropped = tasks.calculate_meaning_of_life.enqueue()
        raise RuntimeError("roll back")
    assert row(admin, dropped.id) is None
    with pytest.raises(tasks_api.exceptions.TaskResultDoesNotExist):
        tasks.calculate_meaning_of_life.get_result(dropped.id)


def test_without_enqueue_on_commit_the_task_is_queued_at_once_on_the_queues_connection(
    admin: psycopg.Connection[Any],
) -> None:
    backend = tasks_api.task_backends["default"]
    backend.enqueue_on_commit = False
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            result = tasks.calculate_meaning_of_life.enqueue()
            assert row(admin, result.id) is not None  # already there
            raise RuntimeError("roll back")
        assert row(admin, result.id) is not None  # outlives the rollback
    finally:
        backend.enqueue_on_commit = True


def test_priority_and_run_after_become_the_jobs_priority_and_run_at(
    admin: psycopg.Connection[Any],
) -> None:
    later = timezone.now() + timedelta(hours=1)
    result = tasks.calculate_meaning_of_life.using(priority=10, run_after=later).enqueue()
    _, _, status, priority, run_at, _ = row(admin, result.id)
    assert (status, priority, run_at) == ("queued", 10, later)
    default = tasks.calculate_meaning_of_life.enqueue()
    assert row(admin, default.id)[3] == 2  # the task's own, from @task(priority=2)
    assert drain().completed == 1  # the one due; the later one waits
    found = tasks.calculate_meaning_of_life.get_result(result.id)
    assert found.status == Status.READY and found.task.priority == 10
    with pytest.raises(
        tasks_api.exceptions.InvalidTask
        if hasattr(tasks_api.exceptions, "InvalidTask")
        else tasks_api.exceptions.InvalidTaskError
    ):
        tasks.calculate_meaning_of_life.using(priority=101)


def test_a_failed_task_reports_its_exceptions_class_path_and_message_but_never_its_arguments() -> (
    None
):
    declined = tasks.fail.enqueue("declined")
    plain = tasks.fail.enqueue(kind="value")
    assert drain().failed == 2
    declined.refresh()
    assert declined.status == Status.FAILED
    (error,) = declined.errors
    assert error.exception_class_path == "django_site.shop.tasks.PaymentDeclined"
    assert error.exception_class is tasks.PaymentDeclined
    assert "card declined" in error.traceback and "'declined'" not in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = declined.return_value
    plain.refresh()
    assert plain.errors[0].exception_class is ValueError


def test_async_tasks_and_tasks_that_take_their_context_run_under_the_worker() -> None:
    added = tasks.add_async.enqueue(2, 3)
    told = tasks.with_context.enqueue("hello")
    assert drain().completed == 2
    added.refresh()
    told.refresh()
    assert added.return_value == 5
    assert told.return_value == {"label": "hello", "attempt": 1, "id": told.id}


def test_aenqueue_and_aget_result_work_from_async_code() -> None:
    async def go() -> Any:
        result = await tasks.calculate_meaning_of_life.aenqueue()
        found = await tasks.calculate_meaning_of_life.aget_result(result.id)
        return result, found

    result, found = asyncio.run(go())
    assert found.id == result.id and found.status == Status.READY


def test_an_unknown_or_malformed_result_id_does_not_exist() -> None:
    missing = tasks_api.exceptions.TaskResultDoesNotExist
    backend = tasks_api.task_backends["default"]
    with pytest.raises(missing):
        backend.get_result(str(uuid.uuid4()))
    with pytest.raises(missing):
        backend.get_result("not-an-id")


def test_a_view_queues_its_task_in_its_own_transaction(admin: psycopg.Connection[Any]) -> None:
    client = Client()
    response = client.get("/orders/1/")
    assert response.status_code == 200
    job_id = response.content.decode()
    assert row(admin, job_id)[2] == "queued"
    response = client.get("/orders/2/?fail=1")
    assert response.status_code == 500
    assert admin.execute("SELECT count(*) FROM axa_queue").fetchone()[0] == 1
    assert admin.execute("SELECT count(*) FROM orders").fetchone()[0] == 1


def test_djangos_task_signals_are_sent_as_a_task_is_queued_starts_and_finishes() -> None:
    signals = __import__(f"{tasks_api.__name__}.signals", fromlist=["signals"])
    seen: list[tuple[str, str, str]] = []

    def note(kind: str) -> Any:
        def receiver(sender: Any, task_result: Any, **_: Any) -> None:
            seen.append((kind, task_result.id, str(task_result.status)))

        return receiver

    receivers = {name: note(name) for name in ("enqueued", "started", "finished")}
    for name, receiver in receivers.items():
        getattr(signals, f"task_{name}").connect(receiver)
    try:
        ok = tasks.calculate_meaning_of_life.enqueue()
        bad = tasks.fail.enqueue("declined")
        drain()
    finally:
        for name, receiver in receivers.items():
            getattr(signals, f"task_{name}").disconnect(receiver)
    assert ("enqueued", ok.id, "READY") in seen
    assert ("started", ok.id, "RUNNING") in seen and ("finished", ok.id, "SUCCESSFUL") in seen
    assert ("started", bad.id, "RUNNING") in seen and ("finished", bad.id, "FAILED") in seen
