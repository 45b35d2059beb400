"""Read-only models over the queue's tables, for the admin: `Job` (`axa_queue`: live
jobs and those finished in the last `keep_recent`), `MovedJob` (`axa_queue_history`:
finished jobs moved there) and `JobAct` (`axa_job_acts`). Django never manages them (`managed = False`: the schema's
own migrations make the tables), and they have no field for a job's arguments or
result, so nothing built on them can show either."""

from __future__ import annotations

from django.db import models

__all__ = ["Job", "JobAct", "MovedJob"]

STATES = [
    ("queued", "queued"),
    ("running", "running"),
    ("completed", "completed"),
    ("failed", "failed"),
    ("cancelled", "cancelled"),
    ("needs_review", "needs review"),
]


class Job(models.Model):
    """A job's row, without its arguments or result."""

    id = models.UUIDField(primary_key=True)
    name = models.TextField()
    status = models.TextField(choices=STATES)
    error = models.TextField(null=True)
    attempts = models.IntegerField()
    max_attempts = models.IntegerField(null=True)
    priority = models.SmallIntegerField()
    timeout_ms = models.BigIntegerField(null=True)
    run_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        managed = False
        db_table = "axa_queue"
        ordering = ("-created_at",)
        verbose_name = "job"
        permissions = (("act_on_job", "Can cancel and retry jobs"),)

    def __str__(self) -> str:
        return f"{self.name} {self.id}"


class MovedJob(models.Model):
    """A finished job moved to the history table, without its arguments or result. The
    table has no primary key (it is partitioned by day); a job's id is in it once."""

    id = models.UUIDField(primary_key=True)
    name = models.TextField()
    status = models.TextField(choices=STATES)
    error = models.TextField(null=True)
    attempts = models.IntegerField()
    max_attempts = models.IntegerField(null=True)
    priority = models.SmallIntegerField()
    timeout_ms = models.BigIntegerField(null=True)
    run_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    moved_at = models.DateTimeField()

    class Meta:
        managed = False
        db_table = "axa_queue_history"
        ordering = ("-updated_at",)
        verbose_name = "finished job (history)"
        verbose_name_plural = "finished jobs (history)"

    def __str__(self) -> str:
        return f"{self.name} {self.id}"


class JobAct(models.Model):
    """A person's act on a job, as the append-only table keeps it."""

    id = models.BigAutoField(primary_key=True)
    job_id = models.UUIDField()
    job_name = models.TextField()
    act = models.TextField()
    attempts = models.IntegerField()
    by = models.TextField()
    reason = models.TextField()
    at = models.DateTimeField()
    db_role = models.TextField(null=True)

    class Meta:
        managed = False
        db_table = "axa_job_acts"
        ordering = ("-id",)
        verbose_name = "act on a job"
        verbose_name_plural = "acts on jobs"

    def __str__(self) -> str:
        return f"{self.act} {self.job_name} {self.job_id}"
