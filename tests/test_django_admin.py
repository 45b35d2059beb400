"""The admin: read-only lists of jobs and acts that never show a job's arguments or
result, and cancel and retry actions that ask for a reason and record the user."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.test import Client

from djangotest import django_db, migrated, tasks  # noqa: F401
from moves import move_all

pytestmark = pytest.mark.usefixtures("migrated")

SECRET = "s3cret-card-4242"


@pytest.fixture
def staff() -> Client:
    """A client logged in as `alice`, a superuser."""
    User = get_user_model()
    User.objects.create_superuser("alice", "alice@example.com", "pw")
    client = Client()
    client.force_login(User.objects.get(username="alice"))
    return client


def state(admin: psycopg.Connection[Any], job_id: str) -> str:
    row = admin.execute(
        "SELECT status FROM axa_queue WHERE id = %s", (uuid.UUID(job_id),)
    ).fetchone()
    assert row is not None
    return str(row[0])


def test_the_admin_lists_jobs_and_acts_without_their_arguments(
    staff: Client, admin: psycopg.Connection[Any]
) -> None:
    result = tasks.send_email.enqueue([SECRET], SECRET, SECRET, SECRET)
    listing = staff.get("/admin/axa_queue/job/")
    assert listing.status_code == 200
    page = listing.content.decode()
    assert result.id in page and "send_email" in page and SECRET not in page
    detail = staff.get(f"/admin/axa_queue/job/{result.id}/change/")
    assert detail.status_code == 200 and SECRET not in detail.content.decode()
    assert staff.get("/admin/axa_queue/jobact/").status_code == 200
    assert staff.get("/admin/axa_queue/job/add/").status_code == 403


def test_a_jobs_page_shows_its_attempts_with_their_errors_and_worker(
    staff: Client, admin: psycopg.Connection[Any]
) -> None:
    result = tasks.send_email.enqueue([SECRET], SECRET, SECRET, SECRET)
    job_id = uuid.UUID(result.id)
    admin.execute(
        "INSERT INTO axa_queue_attempts (job_id, attempt, host, pid, started_at, ended_at, "
        "outcome, error_class, error) VALUES "
        "(%s, 1, 'box-1', 4242, now() - interval '2 s', now() - interval '1 s', 'retried', "
        "'ValueError', 'ValueError: the partner answered 502'), "
        "(%s, 2, 'box-2', 77, now() - interval '1 s', now(), 'completed', NULL, NULL)",
        (job_id, job_id),
    )
    admin.execute(
        "UPDATE axa_queue SET status = 'completed', attempts = 2 WHERE id = %s", (job_id,)
    )
    page = staff.get(f"/admin/axa_queue/job/{result.id}/change/").content.decode()
    assert "Attempts kept" in page and "ValueError: the partner answered 502" in page
    assert "box-1:4242" in page and "box-2:77" in page and "retried" in page
    assert SECRET not in page


def test_cancel_asks_for_a_reason_then_records_the_user_and_the_reason(
    staff: Client, admin: psycopg.Connection[Any]
) -> None:
    result = tasks.calculate_meaning_of_life.enqueue()
    action = {"action": "cancel_jobs", "_selected_action": [result.id]}
    asked = staff.post("/admin/axa_queue/job/", action)
    assert asked.status_code == 200 and 'name="reason"' in asked.content.decode()
    assert state(admin, result.id) == "queued"
    refused = staff.post("/admin/axa_queue/job/", {**action, "apply": "1", "reason": " bad\tone"})
    assert refused.status_code == 200 and "visible characters" in refused.content.decode()
    assert state(admin, result.id) == "queued"
    done = staff.post("/admin/axa_queue/job/", {**action, "apply": "1", "reason": "not_needed"})
    assert done.status_code == 302
    assert state(admin, result.id) == "cancelled"
    act = admin.execute(
        "SELECT act, by, reason FROM axa_job_acts WHERE job_id = %s", (uuid.UUID(result.id),)
    ).fetchone()
    assert act == ("cancelled", "alice", "not_needed")
    acts = staff.get("/admin/axa_queue/jobact/").content.decode()
    assert "not_needed" in acts and "alice" in acts


def test_retry_releases_a_job_from_review_as_the_user(
    staff: Client, admin: psycopg.Connection[Any]
) -> None:
    result = tasks.calculate_meaning_of_life.enqueue()
    admin.execute(
        "UPDATE axa_queue SET status = 'needs_review', attempts = 1 WHERE id = %s",
        (uuid.UUID(result.id),),
    )
    action = {"action": "retry_jobs", "_selected_action": [result.id]}
    done = staff.post("/admin/axa_queue/job/", {**action, "apply": "1", "reason": "checked it"})
    assert done.status_code == 302
    assert state(admin, result.id) == "queued"
    act = admin.execute(
        "SELECT act, by, reason FROM axa_job_acts WHERE job_id = %s", (uuid.UUID(result.id),)
    ).fetchone()
    assert act == ("released", "alice", "checked it")


def test_retrying_a_mixed_selection_retries_the_failed_releases_the_reviewed_and_says_the_rest(
    staff: Client, admin: psycopg.Connection[Any]
) -> None:
    ids = [tasks.calculate_meaning_of_life.enqueue().id for _ in range(5)]
    for job_id, status in zip(
        ids, ["failed", "failed", "needs_review", "completed", "queued"], strict=True
    ):
        admin.execute(
            "UPDATE axa_queue SET status = %s, attempts = 1 WHERE id = %s",
            (status, uuid.UUID(job_id)),
        )
    action = {"action": "retry_jobs", "_selected_action": ids, "apply": "1"}
    done = staff.post("/admin/axa_queue/job/", {**action, "reason": "incident_42"}, follow=True)
    page = done.content.decode()
    # By the bulk acts, in one transaction: each job gets what `retry` gives one.
    assert "Queued again 3 of 5 job(s)." in page
    assert "2 job(s) were left as they were: they were completed, queued." in page
    assert [state(admin, i) for i in ids] == ["queued", "queued", "queued", "completed", "queued"]
    acts = admin.execute(
        "SELECT act, count(*) FROM axa_job_acts WHERE by = 'alice' AND reason = 'incident_42' "
        "GROUP BY act ORDER BY act"
    ).fetchall()
    assert acts == [("released", 1), ("retried", 2)]


def test_only_a_user_who_may_act_on_jobs_sees_the_actions() -> None:
    User = get_user_model()
    Permission = apps.get_model("auth", "Permission")
    tasks.calculate_meaning_of_life.enqueue()  # the actions show with a job listed
    bob = User.objects.create_user("bob", password="pw", is_staff=True)
    bob.user_permissions.add(Permission.objects.get(codename="view_job"))
    client = Client()
    client.force_login(bob)
    page = client.get("/admin/axa_queue/job/").content.decode()
    assert "cancel_jobs" not in page
    bob.user_permissions.add(Permission.objects.get(codename="act_on_job"))
    bob = User.objects.get(username="bob")
    client.force_login(bob)
    assert "cancel_jobs" in client.get("/admin/axa_queue/job/").content.decode()


def test_a_failed_job_moved_to_the_history_is_listed_and_retried_back_as_the_user(
    staff: Client, admin: psycopg.Connection[Any]
) -> None:
    result = tasks.calculate_meaning_of_life.enqueue()
    job_id = uuid.UUID(result.id)
    admin.execute(
        "UPDATE axa_queue SET status = 'failed', attempts = 1, updated_at = now() - interval '1 hour'"
        " WHERE id = %s",
        (job_id,),
    )
    move_all(admin)
    assert admin.execute("SELECT count(*) FROM axa_queue WHERE id = %s", (job_id,)).fetchone() == (
        0,
    )
    listing = staff.get("/admin/axa_queue/movedjob/")
    assert listing.status_code == 200 and result.id in listing.content.decode()
    assert staff.get(f"/admin/axa_queue/movedjob/{result.id}/change/").status_code == 200
    action = {"action": "retry_jobs", "_selected_action": [result.id], "apply": "1"}
    done = staff.post("/admin/axa_queue/movedjob/", {**action, "reason": "fixed_upstream"})
    assert done.status_code == 302
    assert state(admin, result.id) == "queued"
    act = admin.execute(
        "SELECT act, by, reason FROM axa_job_acts WHERE job_id = %s", (job_id,)
    ).fetchone()
    assert act == ("retried", "alice", "fixed_upstream")
