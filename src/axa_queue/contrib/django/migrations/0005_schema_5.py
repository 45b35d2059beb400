"""Schema version 5: unique keys on jobs."""

from __future__ import annotations

from django.db import migrations

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0004_schema_4"),)

    operations = (operation(5),)
