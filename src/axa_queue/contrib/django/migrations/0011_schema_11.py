"""Schema version 11: each worker process's heartbeat interval (`axa_workers.beat_ms`)."""

from __future__ import annotations

from django.db import migrations

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0010_schema_10"),)

    operations = (operation(11),)
