"""The Django app `axa_queue.contrib.django` (label `axa_queue`)."""

from __future__ import annotations

from django.apps import AppConfig


class AxaQueueConfig(AppConfig):
    """The job queue's tables (made by `migrate`), its admin, and `manage.py axa_queue`."""

    name = "axa_queue.contrib.django"
    label = "axa_queue"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"
