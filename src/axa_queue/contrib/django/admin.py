"""The admin: read-only lists of jobs, of the finished jobs moved to the history, and
of acts, each job's page with its attempts (never a job's arguments or result:
the models have no field for them), and two actions on jobs, cancel and retry (which
releases a job from review), each asking for a reason on a page of its own and
recording the logged-in user's username as `by`, in the same transaction as Django's
own work on the queue's database, by the bulk acts (`axa_queue.cancel_all`, and
`retry_all` then `release_all`: a statement per batch of jobs, however many are
selected).

The actions need the permission `axa_queue.act_on_job` (a superuser has it).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import ValidationError
from django.db import connections, transaction
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ... import NotACodeError, attempts_on, cancel_all, release_all, retry_all
from ...acts import MAX_REASON_CHARS, check_code
from . import conf
from .models import Job, JobAct, MovedJob

__all__ = ["ActForm", "JobActAdmin", "JobAdmin", "MovedJobAdmin"]


class ActForm(forms.Form):
    """The reason for an act, checked as the acts table checks it (`check_code`)."""

    reason = forms.CharField(
        max_length=MAX_REASON_CHARS,
        strip=False,
        help_text="A short code, like customer_asked or fixed_upstream: kept with the act.",
    )

    def clean_reason(self) -> str:
        reason: str = self.cleaned_data["reason"]
        try:
            return check_code(reason, "reason")
        except NotACodeError as error:
            raise ValidationError(str(error)) from None


class _ReadOnly(admin.ModelAdmin):
    """Nothing added, changed or deleted through the admin."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _act(
    admin_view: JobAdmin | MovedJobAdmin,
    request: HttpRequest,
    queryset: Any,
    act: Literal["cancel", "retry"],
    title: str,
    done: str,
) -> TemplateResponse | None:
    """Ask for the reason; with it, do `act` to the selected jobs as the user, in one
    transaction, by the bulk acts (a statement per batch of jobs, whatever the number
    selected; each job gets what the act on one job gives it): `cancel_all`, or for
    `retry` `retry_all` (the failed ones) then `release_all` (those in review), as
    `retry` does to one of each."""
    form = ActForm(request.POST if "apply" in request.POST else None)
    if "apply" in request.POST and form.is_valid():
        alias = conf.database_alias()
        how = {"by": request.user.get_username(), "reason": form.cleaned_data["reason"]}
        ids = [str(i) for i in queryset.values_list("id", flat=True)]
        with transaction.atomic(using=alias):
            if act == "cancel":
                result = cancel_all(connections[alias], **how, ids=ids)
                changed, left = result.changed, Counter(result.left_alone)
            else:
                result = retry_all(connections[alias], **how, ids=ids)
                released = release_all(connections[alias], **how, ids=ids)
                changed = result.changed + released.changed
                left = Counter(result.left_alone)  # the first left those in review to the second
                left["needs_review"] -= released.changed
        admin_view.message_user(request, f"{done} {changed} of {len(ids)} job(s).")
        left = +left  # the states still counted
        if left:
            admin_view.message_user(
                request,
                f"{sum(left.values())} job(s) were left as they were: they were "
                f"{', '.join(sorted(left))}.",
                messages.WARNING,
            )
        return None
    context = {
        **admin_view.admin_site.each_context(request),
        "title": title,
        "form": form,
        "jobs": list(queryset),
        "action": request.POST.get("action"),
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "opts": admin_view.model._meta,
    }
    return TemplateResponse(request, "admin/axa_queue/act.html", context)


def _runs(obj: Any) -> SafeString | str:
    """A job's attempts as a small table (`axa_queue.attempts_on`, on the queue's
    database): each run's outcome, start, length, worker (host:pid) and error."""
    runs = attempts_on(connections[conf.database_alias()], obj.id)
    if not runs:
        return "-"
    rows = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        (
            (
                one.attempt,
                one.outcome or "running",
                "-" if one.started_at is None else one.started_at.isoformat(" ", "seconds"),
                "-" if one.duration is None else f"{one.duration.total_seconds():.3f} s",
                "-" if one.host is None else f"{one.host}:{one.pid}",
                one.error or "",
            )
            for one in runs
        ),
    )
    return format_html(
        "<table><thead><tr><th>try</th><th>outcome</th><th>started</th><th>took</th>"
        "<th>worker</th><th>error</th></tr></thead><tbody>{}</tbody></table>",
        rows,
    )


@admin.register(Job)
class JobAdmin(_ReadOnly):
    """Jobs, newest first, by state and name; cancel and retry as actions."""

    list_display = ("id", "name", "status", "attempts", "priority", "run_at", "updated_at", "error")
    list_filter = ("status",)
    search_fields = ("name",)
    fields = (
        "id",
        "name",
        "status",
        "attempts",
        "max_attempts",
        "priority",
        "timeout_ms",
        "error",
        "run_at",
        "started_at",
        "created_at",
        "updated_at",
        "runs",
    )
    readonly_fields = fields
    actions = ("cancel_jobs", "retry_jobs")

    @admin.display(description="attempts kept")
    def runs(self, obj: Any) -> SafeString | str:
        """Its attempts (`axa_queue_attempts`), oldest first."""
        return _runs(obj)

    def has_act_permission(self, request: HttpRequest) -> bool:
        """Whether the user may cancel and retry jobs."""
        return bool(request.user.has_perm("axa_queue.act_on_job"))

    @admin.action(description="Cancel the selected jobs (those still queued)", permissions=["act"])
    def cancel_jobs(self, request: HttpRequest, queryset: Any) -> TemplateResponse | None:
        """Cancel each selected job still queued, for the reason asked."""
        return _act(self, request, queryset, "cancel", "Cancel jobs", "Cancelled")

    @admin.action(
        description="Retry the selected jobs (failed, or released from review)",
        permissions=["act"],
    )
    def retry_jobs(self, request: HttpRequest, queryset: Any) -> TemplateResponse | None:
        """Queue again each selected job that failed or waits for review."""
        return _act(self, request, queryset, "retry", "Retry jobs", "Queued again")


@admin.register(MovedJob)
class MovedJobAdmin(_ReadOnly):
    """Finished jobs moved to the history, newest finished first; retry as an action
    (a failed one comes back to the jobs, queued)."""

    list_display = ("id", "name", "status", "attempts", "priority", "updated_at", "error")
    list_filter = ("status",)
    search_fields = ("name",)
    fields = (*JobAdmin.fields, "moved_at")
    readonly_fields = fields
    actions = ("retry_jobs",)

    @admin.display(description="attempts kept")
    def runs(self, obj: Any) -> SafeString | str:
        """Its attempts (`axa_queue_attempts`), oldest first."""
        return _runs(obj)

    def has_act_permission(self, request: HttpRequest) -> bool:
        """Whether the user may retry jobs."""
        return bool(request.user.has_perm("axa_queue.act_on_job"))

    @admin.action(description="Retry the selected jobs (those failed)", permissions=["act"])
    def retry_jobs(self, request: HttpRequest, queryset: Any) -> TemplateResponse | None:
        """Queue again each selected job that failed, back in the jobs table."""
        return _act(self, request, queryset, "retry", "Retry jobs", "Queued again")


@admin.register(JobAct)
class JobActAdmin(_ReadOnly):
    """The acts people did, newest first."""

    list_display = ("at", "act", "job_name", "job_id", "by", "reason", "attempts", "db_role")
    list_filter = ("act",)
    search_fields = ("job_name", "by")
    fields = list_display
    readonly_fields = list_display
