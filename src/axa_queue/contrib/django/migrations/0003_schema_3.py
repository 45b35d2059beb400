"""Schema version 3: trace context and results on jobs, the worker processes table."""

from __future__ import annotations

from django.db import migrations

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0002_schema_2"),)

    operations = (operation(3),)
