"""Schema version 8: the columns of runs claimed ahead (prefetch)."""

from __future__ import annotations

from django.db import migrations

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0007_schema_7"),)

    operations = (operation(8),)
