"""Schema version 4: a cron expression and time zone on schedules."""

from __future__ import annotations

from django.db import migrations

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0003_schema_3"),)

    operations = (operation(4),)
