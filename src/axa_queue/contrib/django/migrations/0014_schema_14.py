"""Schema version 14: workflows, the `blocked` state, the dependencies between jobs
(`axa_queue_deps`), each workflow's members (`axa_workflows`), and the triggers that
release a job's dependents when it ends."""

from __future__ import annotations

from django.db import migrations

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0013_schema_13"),)

    operations = (operation(14),)
