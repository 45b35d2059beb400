"""Schema version 13: the attempts table (`axa_queue_attempts`), a row per run of a job;
the admin reads it on each job's page (`axa_queue.attempts_on`)."""

from __future__ import annotations

from django.db import migrations

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0012_schema_12"),)

    operations = (operation(13),)
