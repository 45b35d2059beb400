"""Schema version 18: the release of a job's dependents done once per statement (the
trigger `axa_queue_release` notes each ending, `axa_queue_release_all` releases)."""

from __future__ import annotations

from django.db import migrations

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0017_schema_17"),)

    operations = (operation(18),)
